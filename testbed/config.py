"""Experiment files: TOML, one table per section, validated before anything runs.

Every section is a frozen dataclass; its fields are the only keys the section accepts, with their
types and defaults. Loading checks unknown keys, types and ranges and raises :class:`ConfigError`
naming the key; nothing runs on a config that did not validate.

Example::

    >>> cfg = load_config_text('[dp_pasgd]\\nsteps = 20\\ntau = 5\\nsigma = 1.0\\n')
    >>> cfg.dp_pasgd.steps // cfg.dp_pasgd.tau
    4
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Union

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from testbed.errors import ConfigError


@dataclass(frozen=True)
class RunSection:
    name: str = "run"
    algorithm: str = "dp_pasgd"
    seed: int = 0
    mode: str = "sim"


@dataclass(frozen=True)
class DataSection:
    """``dataset``: synthetic, adult-1, adult-2, vehicle-1, vehicle-2. ``path``: the data file or
    its directory (else $TESTBED_DATA, the cache, or a download)."""

    dataset: str = "synthetic"
    path: str | None = None
    num_nodes: int = 16
    samples_per_node: int = 500
    dim: int = 100
    n_classes: int = 2
    heterogeneity: float = 0.0
    include_education: bool = False
    numeric: bool = False


@dataclass(frozen=True)
class ModelSection:
    kind: str = "logistic"
    bias: bool = True
    hidden: int = 32


@dataclass(frozen=True)
class DpPasgdSection:
    """DP-PASGD (eqs. 7a–7b). Give ``sigma`` (noise std; 0 is plain PASGD) or ``epsilon`` (σ
    calibrated for ``steps`` by ``calibration``), not both. ``lipschitz``: the G of the
    sensitivity 2G/X; default: the model's own bound, or the clip norm when ``clip`` is on.
    ``tau = "plan"``: τ, ``steps`` K and σ come from the optimal design of §7 of the paper for
    ``budget.cost_units`` and the ε target (``epsilon`` or ``budget.epsilon``), with the bound
    constants of ``[plan]`` (see testbed.planning.resolve)."""

    steps: int = 100
    tau: int | str = 10
    batch: int = 32
    lr: float = 0.1
    sigma: float | None = None
    epsilon: float | None = None
    calibration: str = "corrected"
    clip: bool = False
    lipschitz: float | None = None
    sampling: str = "uniform"
    c1: float = 100.0
    c2: float = 1.0


@dataclass(frozen=True)
class DwflSection:
    """DWFL (Algorithm 1, eq. 7) and its baselines; see testbed.algorithms.dwfl. Give ``epsilon``
    (per-round target at the worst receiver, σ² calibrated every fading block) or ``sigma2``, not
    both (neither: no artificial noise). Powers in dBm here, W inside. Channel noise σ_m² per real
    entry: ``noise_power_w`` (default 1, the paper's) or thermal k·T·B·NF/2 from
    ``noise_figure_db`` and ``bandwidth_hz``. ``coherence_rounds`` absent: time-invariant fading."""

    scheme: str = "ota_d2d"
    variant: str = "B"
    rounds: int = 100
    batch: int = 32
    lr: float = 0.1
    averaging_rate: float = 0.5
    gmax: float = 1.0
    epsilon: float | None = None
    sigma2: float | None = None
    calibration: str = "with_channel_noise"
    power_dbm: float = 60.0
    noise_power_w: float | None = None
    noise_figure_db: float | None = None
    bandwidth_hz: float = 1e6
    beta: float = 1.0
    c_scale: float = 1.0
    fading: str = "rayleigh"
    k_factor: float = 3.0
    coherence_rounds: int | None = None
    pathloss: str = "none"
    area_m: float = 100.0
    carrier_hz: float = 2.4e9
    orthogonal_link: str = "analog"
    init: str = "common"
    init_std: float = 0.1


@dataclass(frozen=True)
class PrivacySection:
    """``accountant`` enforces the ε budget (the paper's zcdp by default); ``tight_accountant`` is
    reported beside it (rdp or pld through dp-accounting; "none" to skip)."""

    delta: float = 1e-4
    accountant: str = "zcdp"
    tight_accountant: str = "rdp"


@dataclass(frozen=True)
class BudgetSection:
    """Per-node budgets; a missing key is no limit."""

    epsilon: float | None = None
    cost_units: float | None = None
    bytes: float | None = None
    energy_j: float | None = None


@dataclass(frozen=True)
class NodesSection:
    """The boards the nodes run on: ``profile`` (nodes/profiles.toml: pi-zero-2w, pi-3b-plus,
    pi-4b, pi-5, jetson-nano; "host" is this machine as it is) sets the seconds and joules an
    emulated node charges; ``pacing`` makes an emulated board take its board's wall time."""

    profile: str = "host"
    pacing: bool = False


@dataclass(frozen=True)
class MqttSection:
    """How ``run.mode = "mqtt"`` runs. ``broker_url``: a broker to use (mqtt://host:port, or
    mqtts:// with ``tls_ca``); none starts an embedded one on loopback. ``emulated``: start emulated
    boards for every node (over ``hosts`` processes, with device ``profile``); false waits for real
    boards running `testbed node`. ``run_id``: the MQTT scope the nodes serve (`testbed node --run`).
    Emulated boards take their device profile from ``[nodes]``.
    ``quorum``: a round starts once this many nodes are online (or its timeout passed).
    ``credentials``: the JSON file of `testbed acl` (per-node passwords).
    ``protocol``: MQTT version, "auto" (v5 if the broker speaks it, else 3.1.1), "5" or "3.1.1"."""

    broker_url: str | None = None
    run_id: str = "testbed"
    emulated: bool = True
    hosts: int = 1
    round_timeout_s: float = 60.0
    connect_timeout_s: float = 60.0
    quorum: int = 1
    max_chunk_bytes: int = 262144
    credentials: str | None = None
    tls_ca: str | None = None
    protocol: str = "auto"


@dataclass(frozen=True)
class PlanSection:
    """Constants of the DP-PASGD bound (12)–(13) for ``dp_pasgd.tau = "plan"`` and `testbed plan`;
    a missing one is estimated from the data at θ⁰ (testbed.planning.estimate): ``smoothness`` L,
    ``strong_convexity`` λ, ``grad_variance`` ξ², ``initial_gap`` α = L(θ⁰) − L*."""

    smoothness: float | None = None
    strong_convexity: float | None = None
    grad_variance: float | None = None
    initial_gap: float | None = None


@dataclass(frozen=True)
class OutputSection:
    dir: str = "runs"
    figures: bool = True


@dataclass(frozen=True)
class Config:
    run: RunSection = field(default_factory=RunSection)
    data: DataSection = field(default_factory=DataSection)
    model: ModelSection = field(default_factory=ModelSection)
    dp_pasgd: DpPasgdSection = field(default_factory=DpPasgdSection)
    dwfl: DwflSection = field(default_factory=DwflSection)
    privacy: PrivacySection = field(default_factory=PrivacySection)
    budget: BudgetSection = field(default_factory=BudgetSection)
    plan: PlanSection = field(default_factory=PlanSection)
    nodes: NodesSection = field(default_factory=NodesSection)
    mqtt: MqttSection = field(default_factory=MqttSection)
    output: OutputSection = field(default_factory=OutputSection)


CHOICES = {
    "run.algorithm": ("dp_pasgd", "dwfl"),
    "run.mode": ("sim", "mqtt"),
    "data.dataset": ("synthetic", "adult-1", "adult-2", "vehicle-1", "vehicle-2"),
    "model.kind": ("logistic", "svm", "mlp"),
    "dp_pasgd.calibration": ("corrected", "paper_literal"),
    "dp_pasgd.sampling": ("uniform", "poisson"),
    "dwfl.scheme": ("ota_d2d", "orthogonal_d2d", "ota_central"),
    "dwfl.variant": ("A", "B"),
    "dwfl.calibration": ("with_channel_noise", "artificial_only"),
    "dwfl.fading": ("rayleigh", "rician", "none"),
    "dwfl.pathloss": ("none", "free_space", "umi", "uma"),
    "dwfl.orthogonal_link": ("analog", "digital"),
    "dwfl.init": ("common", "zeros", "independent"),
    "privacy.accountant": ("zcdp", "rdp", "pld"),
    "privacy.tight_accountant": ("rdp", "pld", "none"),
}

POSITIVE = {
    "data.num_nodes", "data.samples_per_node", "data.dim", "model.hidden", "dp_pasgd.steps",
    "dp_pasgd.tau", "dp_pasgd.batch", "dp_pasgd.lr", "dp_pasgd.epsilon", "dp_pasgd.lipschitz",
    "budget.epsilon", "budget.cost_units", "budget.bytes", "budget.energy_j",
    "mqtt.hosts", "mqtt.round_timeout_s", "mqtt.connect_timeout_s", "mqtt.max_chunk_bytes", "mqtt.quorum",
    "dwfl.rounds", "dwfl.batch", "dwfl.lr", "dwfl.averaging_rate", "dwfl.gmax", "dwfl.epsilon",
    "dwfl.noise_power_w", "dwfl.bandwidth_hz", "dwfl.c_scale", "dwfl.coherence_rounds", "dwfl.area_m",
    "dwfl.carrier_hz", "dwfl.init_std", "plan.smoothness", "plan.strong_convexity",
}
NON_NEGATIVE = {"run.seed", "data.heterogeneity", "dp_pasgd.sigma", "dp_pasgd.c1", "dp_pasgd.c2",
                "dwfl.sigma2", "dwfl.k_factor", "dwfl.beta", "plan.grad_variance", "plan.initial_gap"}
#: Keys that must also be <= 1 (fractions).
AT_MOST_ONE = {"dwfl.averaging_rate", "dwfl.beta", "dwfl.c_scale"}


def _sections() -> dict[str, type]:
    return {f.name: f.type if isinstance(f.type, type) else _resolve(f.type) for f in dataclasses.fields(Config)}


def _resolve(name: str) -> type:
    return globals()[name]


def _allowed_types(annotation: Any) -> tuple[type, ...]:
    hint = eval(annotation, globals()) if isinstance(annotation, str) else annotation
    if typing.get_origin(hint) in (Union, types.UnionType):
        return typing.get_args(hint)
    return (hint,)


def _check_type(key: str, value: Any, allowed: tuple[type, ...]) -> Any:
    if isinstance(value, bool):
        if bool in allowed:
            return value
    elif isinstance(value, int) and (int in allowed or float in allowed):
        return value if int in allowed else float(value)
    elif isinstance(value, float) and float in allowed:
        if not math.isfinite(value):
            raise ConfigError(key, f"must be a finite number, got {value}")
        return value
    elif isinstance(value, str) and str in allowed:
        return value
    names = " or ".join("a number" if t is float else {int: "an integer", bool: "true/false", str: "a string"}.get(t, t.__name__)
                        for t in allowed if t is not type(None))
    raise ConfigError(key, f"must be {names}, got {type(value).__name__} {value!r}")


def build_config(raw: dict[str, Any]) -> Config:
    """A validated Config from the nested dict of a TOML file (missing keys take their defaults)."""
    sections = _sections()
    built = {}
    for section_name, section_values in raw.items():
        if section_name not in sections:
            raise ConfigError(section_name, f"unknown section; known: {', '.join(sections)}")
        if not isinstance(section_values, dict):
            raise ConfigError(section_name, "must be a table ([" + section_name + "])")
    for section_name, cls in sections.items():
        values = raw.get(section_name, {})
        fields = {f.name: f for f in dataclasses.fields(cls)}
        kwargs = {}
        for key, value in values.items():
            full = f"{section_name}.{key}"
            if key not in fields:
                raise ConfigError(full, f"unknown key; {section_name} takes {', '.join(fields)}")
            kwargs[key] = _check_type(full, value, _allowed_types(fields[key].type))
            _check_range(full, kwargs[key])
        built[section_name] = cls(**kwargs)
    config = Config(**built)
    _check_consistency(config)
    return config


def _check_range(key: str, value: Any) -> None:
    if key == "dp_pasgd.tau" and isinstance(value, str):
        if value != "plan":
            raise ConfigError(key, f'must be a positive integer or "plan", got {value!r}')
        return
    if key in CHOICES and value not in CHOICES[key]:
        raise ConfigError(key, f"must be one of {', '.join(CHOICES[key])}, got {value!r}")
    if key in POSITIVE and not value > 0:
        raise ConfigError(key, f"must be > 0, got {value}")
    if key in NON_NEGATIVE and value < 0:
        raise ConfigError(key, f"must be >= 0, got {value}")
    if key == "privacy.delta" and not 0 < value < 1:
        raise ConfigError(key, f"must be in (0, 1), got {value}")
    if key in AT_MOST_ONE and value > 1:
        raise ConfigError(key, f"must be <= 1, got {value}")


def _check_consistency(config: Config) -> None:
    alg = config.dp_pasgd
    if alg.tau == "plan":
        _check_plan(config)
    elif alg.steps % alg.tau:
        raise ConfigError("dp_pasgd.steps", f"K = {alg.steps} is not a multiple of tau = {alg.tau}")
    if alg.sigma is not None and alg.epsilon is not None:
        raise ConfigError("dp_pasgd.sigma", "give sigma or epsilon, not both")
    if config.model.kind == "svm" and config.data.n_classes != 2 and config.data.dataset == "synthetic":
        raise ConfigError("model.kind", "the linear SVM is binary; set data.n_classes = 2")
    private = alg.epsilon is not None or (alg.sigma or 0) > 0
    if config.model.kind == "mlp" and private and not alg.clip:
        raise ConfigError("dp_pasgd.clip", "the MLP has no per-sample gradient bound; a private run must clip")
    if alg.clip and alg.lipschitz is None:
        raise ConfigError("dp_pasgd.lipschitz", "clipping needs the clip norm G (dp_pasgd.lipschitz)")
    if config.data.n_classes < 2:
        raise ConfigError("data.n_classes", f"must be >= 2, got {config.data.n_classes}")
    dwfl = config.dwfl
    if dwfl.sigma2 is not None and dwfl.epsilon is not None:
        raise ConfigError("dwfl.sigma2", "give sigma2 or epsilon, not both")
    if dwfl.noise_power_w is not None and dwfl.noise_figure_db is not None:
        raise ConfigError("dwfl.noise_figure_db", "give noise_power_w or noise_figure_db (thermal noise), not both")
    if dwfl.scheme == "ota_central" and dwfl.init == "independent":
        raise ConfigError("dwfl.init", "ota_central keeps one model at the server; use common or zeros")


def _check_plan(config: Config) -> None:
    """What ``dp_pasgd.tau = "plan"`` needs: a cost budget, an ε target, and no fixed σ."""
    if config.budget.cost_units is None:
        raise ConfigError("budget.cost_units", 'tau = "plan" needs the resource budget C_th')
    if config.dp_pasgd.epsilon is None and config.budget.epsilon is None:
        raise ConfigError("dp_pasgd.epsilon", 'tau = "plan" needs a privacy target (dp_pasgd.epsilon or budget.epsilon)')
    if config.dp_pasgd.sigma is not None:
        raise ConfigError("dp_pasgd.sigma", 'tau = "plan" chooses sigma; remove it')


def parse_override(text: str) -> tuple[list[str], Any]:
    """``section.key=value`` → (["section", "key"], value); the value is read as TOML, else as a string."""
    if "=" not in text:
        raise ConfigError(text, "an override is section.key=value")
    key, value_text = text.split("=", 1)
    path = key.strip().split(".")
    if len(path) != 2 or not all(path):
        raise ConfigError(key.strip(), "an override key is section.key")
    try:
        value = tomllib.loads(f"v = {value_text.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = value_text.strip()
    return path, value


def load_config(path: str | Path, overrides: list[str] = ()) -> Config:
    """Read, override (``--set section.key=value``) and validate an experiment file."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(str(path), "experiment file not found") from None
    return load_config_text(text, overrides, source=str(path))


def load_config_text(text: str, overrides: list[str] = (), source: str = "<text>") -> Config:
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(source, f"not valid TOML: {exc}") from None
    for item in overrides:
        (section, key), value = parse_override(item)
        table = raw.setdefault(section, {})
        if not isinstance(table, dict):
            raise ConfigError(section, "must be a table")
        table[key] = value
    return build_config(raw)


def replace(config: Config, **sections: dict[str, Any]) -> Config:
    """A copy of ``config`` with some keys changed, e.g. ``replace(c, run={"seed": 3})``; validated."""
    raw = to_dict(config)
    for name, values in sections.items():
        raw[name].update(values)
    return build_config(raw)


def to_dict(config: Config) -> dict[str, dict[str, Any]]:
    """The config as nested dicts, None values left out (TOML has no null)."""
    return {
        name: {k: v for k, v in dataclasses.asdict(getattr(config, name)).items() if v is not None}
        for name in _sections()
    }


def to_toml(config: Config) -> str:
    """The resolved config as a TOML file that :func:`load_config` reads back to an equal Config."""
    lines = []
    for name, values in to_dict(config).items():
        lines.append(f"[{name}]")
        lines.extend(f"{k} = {_toml_value(v)}" for k, v in values.items())
        lines.append("")
    return "\n".join(lines)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return repr(v)
