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
    sensitivity 2G/X; default: the model's own bound, or the clip norm when ``clip`` is on."""

    steps: int = 100
    tau: int = 10
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
class OutputSection:
    dir: str = "runs"
    figures: bool = True


@dataclass(frozen=True)
class Config:
    run: RunSection = field(default_factory=RunSection)
    data: DataSection = field(default_factory=DataSection)
    model: ModelSection = field(default_factory=ModelSection)
    dp_pasgd: DpPasgdSection = field(default_factory=DpPasgdSection)
    privacy: PrivacySection = field(default_factory=PrivacySection)
    budget: BudgetSection = field(default_factory=BudgetSection)
    output: OutputSection = field(default_factory=OutputSection)


CHOICES = {
    "run.algorithm": ("dp_pasgd",),
    "run.mode": ("sim",),
    "data.dataset": ("synthetic", "adult-1", "adult-2", "vehicle-1", "vehicle-2"),
    "model.kind": ("logistic", "svm", "mlp"),
    "dp_pasgd.calibration": ("corrected", "paper_literal"),
    "dp_pasgd.sampling": ("uniform", "poisson"),
    "privacy.accountant": ("zcdp", "rdp", "pld"),
    "privacy.tight_accountant": ("rdp", "pld", "none"),
}

POSITIVE = {
    "data.num_nodes", "data.samples_per_node", "data.dim", "model.hidden", "dp_pasgd.steps",
    "dp_pasgd.tau", "dp_pasgd.batch", "dp_pasgd.lr", "dp_pasgd.epsilon", "dp_pasgd.lipschitz",
    "budget.epsilon", "budget.cost_units", "budget.bytes", "budget.energy_j",
}
NON_NEGATIVE = {"run.seed", "data.heterogeneity", "dp_pasgd.sigma", "dp_pasgd.c1", "dp_pasgd.c2"}


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
    if key in CHOICES and value not in CHOICES[key]:
        raise ConfigError(key, f"must be one of {', '.join(CHOICES[key])}, got {value!r}")
    if key in POSITIVE and not value > 0:
        raise ConfigError(key, f"must be > 0, got {value}")
    if key in NON_NEGATIVE and value < 0:
        raise ConfigError(key, f"must be >= 0, got {value}")
    if key == "privacy.delta" and not 0 < value < 1:
        raise ConfigError(key, f"must be in (0, 1), got {value}")


def _check_consistency(config: Config) -> None:
    alg = config.dp_pasgd
    if alg.steps % alg.tau:
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
