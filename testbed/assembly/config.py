"""Experiment files: TOML, one table per section, validated before anything runs.

The experiment is assembled from sections declared where they are used: the run-wide ones below
(run, data, model, privacy, budget, stragglers, nodes, mqtt, output) and each algorithm's own
(declared in its module, found through testbed.algorithms.registry). Every section is a strict,
frozen pydantic model (testbed.checked.sections.Section); loading checks unknown keys, types and ranges and
raises :class:`ConfigError` naming the key. ``testbed schema`` writes the JSON Schema of the whole
file, so editors can complete and check it.

Relative paths (``data.path``, ``mqtt.credentials``, ``mqtt.tls_ca``) are resolved against the
experiment file's folder when it is read from a file, so a run resumed from elsewhere finds them.

Example::

    >>> cfg = load_config_text('[dp_pasgd]\\nsteps = 20\\ntau = 5\\nsigma = 1.0\\n')
    >>> cfg.dp_pasgd.steps // cfg.dp_pasgd.tau
    4
    >>> "[dwfl]" in to_toml(cfg), "[dp_pasgd]" in to_toml(cfg)
    (False, True)
"""

from __future__ import annotations

import functools
import typing
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, BeforeValidator, Field, ValidationError, create_model, model_validator

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from testbed.checked.limits import MAX_CHUNK_BYTES, MAX_SEED, MAX_TEXT_FILE_BYTES, MAX_WAIT_S, MIN_CHUNK_BYTES, MIN_POSITIVE
from testbed.checked.sections import Config, Name, NonNegative, OnlyWith, Positive, Section, attribute_docstrings, one_of
from testbed.data.section import DataSection
from testbed.devices import virtual_boards
from testbed.devices.profiles import mcu_profile_names, profile_names
from testbed.errors import ConfigError, UserError
from testbed.learning.models import embedding_kinds, embedding_phrase
from testbed.learning.models import kinds as model_kinds
from testbed.privacy.accountants import registry as accountants
from testbed.rounds.client_sampling import ClientSamplingSection
from testbed.rounds.stragglers import StragglersSection
from testbed.util import jsontext
from testbed.util.userfiles import read_text


class RunSection(Section):
    name: Name = "run"
    """Names the run's directory (output.dir/NAME-TIME-sSEED): letters, digits, '_', '.', '-'."""
    algorithm: str = "dp_pasgd"
    """The algorithm (testbed.algorithms: one module each)."""
    seed: int = Field(0, ge=0, le=MAX_SEED)
    """Keys every random stream: the same seed gives the same numbers in sim and over MQTT."""
    mode: Literal["sim", "mqtt"] = "sim"
    """sim: every node in this process; mqtt: every node its own MQTT client."""
    blas_threads: Positive[int] = 1
    """Threads numpy's BLAS may use in the run's process (testbed.util.threads: one is fastest for the
    many small per-node products; raise it for a large model on an idle machine)."""
    threads: int = Field(0, ge=0, le=256)
    """Threads the run's per-node work is split over (testbed.util.parallel: each node's numbers are
    the same whatever the split): 0, one per core (or ``TESTBED_THREADS``); 1, none."""
    workers: int = Field(0, ge=0, le=256)
    """Processes a sim run's node steps run in (testbed.orchestration.sim_workers: forks of the run,
    each stepping a fixed group of the nodes, as an MQTT run's emulated hosts do; the same numbers):
    0, one per thread (``threads``) for each round whose step is worth it; 1, none; k, k workers."""


#: The models ``model.kind`` may name (testbed.learning.models.kinds).
ModelKindName = one_of(model_kinds)


class ModelSection(Section):
    ONLY_WITH = {"network": (OnlyWith("kind", ("torch",)),),
                 "hidden": (OnlyWith("kind", ("mlp",)), OnlyWith("network", ("mlp",))),
                 "activation": (OnlyWith("kind", ("mlp",)),), "rf_gamma": (OnlyWith("random_features"),)}

    kind: ModelKindName = "logistic"
    """"linear": multi-output least squares (ACFL), on one-hot labels for a classification set;
    "torch": the PyTorch network ``network`` (float32, all nodes stepped at once: testbed.learning.torch_models)."""
    network: Literal["cnn", "mlp", "cifar10_cnn"] = "cnn"
    """"torch" only: "cnn" (8x8 digits, 28x28 MNIST, 32x32 CIFAR-10), "mlp" (one ReLU layer of ``hidden``),
    "cifar10_cnn" (the small CNN of PyTorch's CIFAR-10 tutorial) (testbed.learning.torch_models)."""
    bias: bool = True
    hidden: Positive[int] = 32
    activation: Literal["tanh", "relu"] = "tanh"
    """The MLP's hidden layer (PADPFL's paper: relu)."""
    random_features: NonNegative[int] = 0
    """"linear" only: 0 (off), or D_rf random Fourier features cos(ωᵀx + b) in place of x (an RBF
    kernel's embedding, ACFL's remark on kernels), ω ~ N(0, 2 rf_gamma I), b ~ U[0, 2π) from the
    run's seed (:class:`testbed.learning.models.RandomFeatures`)."""
    rf_gamma: Positive[float] = 1.0
    """γ of the approximated kernel exp(−γ‖x − x′‖²)."""

    @model_validator(mode="after")
    def _features_need_an_embedding_kind(self) -> "ModelSection":
        if self.random_features and self.kind not in embedding_kinds():
            raise ValueError(f"random_features: {embedding_phrase()}, not {self.kind!r}")
        return self


def _open_unit_interval(value: float) -> float:
    if not 0 < value < 1:
        raise ValueError("must be in (0, 1)")
    return value


class PrivacySection(Section):
    delta: Annotated[float, AfterValidator(_open_unit_interval)] = 1e-4
    """δ of every (ε, δ) figure; at or above 1/m (m the smallest node's training records) refused
    before round 1 unless ``reproduction`` (testbed.privacy.delta)."""
    # The choices are the registered accountants (testbed.privacy.accountants), the first listed the default.
    accountant: one_of(accountants.names) = accountants.names()[0]  # type: ignore[valid-type]
    """Enforces the ε budget (the paper's zcdp by default)."""
    tight_accountant: one_of(lambda: (*accountants.tight_names(), accountants.NONE)) = accountants.tight_names()[0]  # type: ignore[valid-type]
    """Reported beside it (through dp-accounting); "none" to skip."""
    reproduction: bool = False
    """The run reproduces a paper and may use that paper's assumptions the mechanism run does not
    make true (PADPFL's sensitivity = "paper_eq7"; a delta at or above 1/m, m the smallest node's
    training records); each one used is a sentence of the summary's ``assumptions``."""


class BudgetSection(Section):
    """Per-node budgets; a missing key is no limit."""

    epsilon: Positive[float] | None = None
    """(ε, δ) per node; also the ε the noise is calibrated to when the algorithm sets none of its own
    and calibrates (DP-PASGD); on a run without noise (not private) a config error."""
    cost_units: Positive[float] | None = None
    bytes: Positive[float] | None = None
    energy_j: Positive[float] | None = None
    """Forecast from the node's costliest round."""
    mi_epsilon: Positive[float] | None = None
    """ε-MI-DP in nats (ACFL's coded data set, Theorem 1); never composed with epsilon."""


class NodesSection(Section):
    ONLY_WITH = {"mcu_profile": (OnlyWith("mcu"),), "mcu_board": (OnlyWith("mcu"),)}

    # The choices are the registries' (testbed.devices): a profile or virtual board added there is one here.
    profile: one_of(profile_names) = "host"  # type: ignore[valid-type]
    """The device profile (nodes/profiles.toml) an emulated node charges seconds and joules by."""
    pacing: bool = False
    """An emulated board takes its board's wall time."""
    mcu: list[NonNegative[int]] = []
    """Nodes that are microcontroller boards behind a serial bridge (`testbed bridge`): their node
    step runs in the firmware's float32 arithmetic, emulated in sim (docs/serial-protocol.md); each
    node once."""
    mcu_profile: one_of(mcu_profile_names) = "rp2040"  # type: ignore[valid-type]
    """The boards' profile (firmware_bridge/boards.toml): their seconds and joules."""
    mcu_board: one_of(virtual_boards.names) = "host"  # type: ignore[valid-type]
    """The virtual board an emulated run (mqtt.emulated) starts for each: the firmware as a host
    process behind a pseudo-terminal, or the Cortex-M3 build under qemu-system-arm."""

    @model_validator(mode="after")
    def _mcu_once(self) -> "NodesSection":
        seen: set[int] = set()
        for node in self.mcu:
            if node in seen:  # a node has one board: a repeat would start two bridges for it
                raise ValueError(f"mcu: names node {node} twice")
            seen.add(node)
        return self


def _version_text(value: Any) -> Any:
    # `--set mqtt.protocol=5` reads as the integer 5 (TOML), `3.1.1` as a string.
    return str(value) if isinstance(value, int) and not isinstance(value, bool) else value


class MqttSection(Section):
    broker_url: str | None = None
    """mqtt://host:port or mqtts:// with tls_ca; none starts the run's own broker on loopback (broker)."""
    broker: Annotated[str, Field(pattern=r"^[a-z][a-z0-9_-]{0,31}$")] = "auto"
    """The broker a run without broker_url starts and stops (testbed.mqtt.brokers: one module
    each): "auto" is Mosquitto where its binary is installed, else the embedded amqtt broker;
    "mosquitto" or "embedded" choose one."""
    run_id: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")] = "testbed"
    """The MQTT scope the nodes serve (`testbed node --run`): letters, digits, _ . - (no /)."""
    emulated: bool = True
    """Start emulated boards for every node; false waits for real boards running `testbed node`."""
    hosts: Positive[int] = 1
    round_timeout_s: float = Field(60.0, gt=0, le=MAX_WAIT_S)
    connect_timeout_s: float = Field(60.0, gt=0, le=MAX_WAIT_S)
    setup_wait_s: float = Field(120.0, gt=0, le=MAX_WAIT_S)
    """How long the first round (or the setup) waits, before its deadline starts, for every node to
    say its experiment is built (data loaded, model built: `ready`); a node not ready by then is
    asked all the same and straggles as a late node does; in seconds."""
    quorum: Positive[int] = 1
    """A round starts once this many nodes are online (or its timeout passed)."""
    outage_limit_s: float = Field(300.0, gt=0, le=MAX_WAIT_S)
    """How long the coordinator waits out a broker outage (its rounds close with stragglers
    meanwhile) before the run stops, failed and resumable; in seconds."""
    max_chunk_bytes: int = Field(262144, ge=MIN_CHUNK_BYTES, le=MAX_CHUNK_BYTES)
    """MQTT payloads longer than this travel in chunks of at most this many bytes: at least enough
    that a 64 MiB message fits in a publish's 16,384 chunks, under MQTT's 256 MiB packet."""
    credentials: str | None = None
    """The JSON file of `testbed acl` (per-node passwords)."""
    authenticate: bool = True
    """Seal every MQTT message with a MAC of a per-node key and drop what does not verify
    (testbed.mqtt.auth), whatever the broker allows; false only for a broker you trust alone
    (summary.json and the terminal summary then say the run was not authenticated)."""
    keys: str | None = None
    """The coordinator's keys file of `testbed provision` (coordinator/keys.json: every board's
    MAC key), for real boards (emulated = false); the run's emulated boards get keys of their own."""
    tls_ca: str | None = None
    """The CA certificate (PEM) that signed the broker's; only with mqtts://."""
    protocol: Annotated[Literal["auto", "5", "3.1.1"], BeforeValidator(_version_text)] = "auto"
    """MQTT version: auto (v5 if the broker speaks it, else 3.1.1), 5 or 3.1.1."""
    broadcast: Literal["auto", "shared", "per-node"] = "auto"
    """How an emulated host reads the broadcast: once for all its nodes (shared: an MQTT shared
    subscription, which Mosquitto and the embedded broker serve), once per node, or auto: shared on
    the embedded broker and where the broker says it serves them (an MQTT 5 CONNACK)."""

    @model_validator(mode="after")
    def _broker_or_url(self) -> "MqttSection":
        if self.broker != "auto" and self.broker_url is not None:
            raise ValueError(f"broker: {self.broker!r} names the broker a run starts itself, but broker_url is "
                             "set: remove one of them")
        return self

    @model_validator(mode="after")
    def _tls_needs_mqtts(self) -> "MqttSection":
        if self.tls_ca is not None and not (self.broker_url or "").startswith("mqtts://"):
            raise ValueError("tls_ca: is set but the broker is not mqtts:// (TLS): the run would go in cleartext; "
                             "use an mqtts:// broker_url or remove tls_ca")
        return self


class LinksSection(Section):
    """Each emulated host behind a network link of its own (testbed.orchestration.links; Linux, as
    root, with iproute2): its own network namespace, joined to the broker's by a veth pair with
    its own address, and shaped with tc's tbf. docs/multi-host.md."""

    ONLY_WITH = {"rate_bps": (OnlyWith("netns", (True,)),)}

    netns: bool = False
    """Start each emulated host (mqtt.hosts) in its own network namespace: its nodes reach the
    broker over a real interface (a veth pair with an address of its own), not loopback."""
    rate_bps: Literal["channel"] | Positive[int] | list[NonNegative[int]] | None = None
    """Each host's link rate in bits per second, both ways (tc's tbf): one rate for every host, a
    list of one per host (0: that host unshaped), or "channel": the run's link model's rate for
    that host's nodes (the algorithm's channel; the slowest of its nodes). Absent: unshaped."""


class OutputSection(Section):
    dir: str = "runs"
    figures: bool = True
    eval_every: Positive[int] = 1
    """Evaluate the model (training loss and accuracies: a pass over every node's data) every this
    many rounds and after the last; the other rounds' metrics rows leave those cells empty."""
    checkpoint_every: Literal["auto"] | Positive[int] = "auto"
    """Write the checkpoint every this many rounds (and after the last, and at a budget stop);
    "auto": every round while writing it costs under 2 % of a round, else as rarely as keeps it
    there (at most every 50 rounds). A killed run resumes from its last checkpoint: the rounds after
    it run again from the same streams, and what they released is charged once."""
    eval_nodes: Positive[int] | None = None
    """Evaluate on this many nodes only, a fixed subset drawn once from the run's seed
    (testbed.assembly.evaluation); unset: every node. With client sampling over many nodes the data of the
    others is never generated, so a large federation needs it (the memory check says so)."""
    sync: bool = False
    """fsync the checkpoint, ledger and metrics every round, so a power cut (not only a killed
    process, which atomic writes already cover) leaves a resumable run; costs milliseconds a round."""
    tensorboard: bool = False
    """Write each round's metrics, ε, costs and per-node histograms as TensorBoard event files in
    RUN_DIR/tensorboard (`pip install 'dpfl-testbed[tracking]'`; view with `tensorboard --logdir runs`)."""
    mlflow: bool = False
    """Log the config as params, each round's metrics and the run directory as artifacts to MLflow,
    at MLFLOW_TRACKING_URI (unset: a file store in ./mlruns); `pip install 'dpfl-testbed[tracking]'`."""


#: The run-wide sections, in file order; the algorithms' own come after ``budget``.
CORE_SECTIONS: dict[str, type[Section]] = {
    "run": RunSection, "data": DataSection, "model": ModelSection, "privacy": PrivacySection,
    "budget": BudgetSection, "stragglers": StragglersSection, "client_sampling": ClientSamplingSection,
    "nodes": NodesSection, "mqtt": MqttSection, "links": LinksSection,
    "output": OutputSection,
}
#: Keys holding paths, resolved against the experiment file's folder.
PATH_KEYS = (("data", "path"), ("mqtt", "credentials"), ("mqtt", "tls_ca"), ("topology", "path"))
#: Keys of a radio's scene sub-table holding paths, resolved the same way.
SCENE_PATH_KEYS = ("path", "positions_path", "cache_dir")
SCENE_TABLES = ("scene", "link_scene")


@functools.cache
def _section_classes() -> dict[str, type[BaseModel]]:
    """Every section an experiment file may hold: the run-wide ones and every algorithm's."""
    from testbed.algorithms import registry

    classes: dict[str, type[BaseModel]] = dict(CORE_SECTIONS)
    for reg in registry.registrations().values():
        for name, cls in reg.sections.items():
            if name in classes and classes[name] is not cls:
                raise RuntimeError(f"config section [{name}] declared twice")
            classes[name] = cls
    return classes


@functools.cache
def _config_model(names: frozenset[str] | None = None) -> type[BaseModel]:
    """The experiment model with the sections ``names`` (None: all of them). A run's model holds
    only the sections it reads or its file has, so validators of the other algorithms' sections
    are never built (pydantic builds a model's validator on first use: see Section)."""
    classes = _section_classes()
    chosen = [n for n in classes if names is None or n in names]
    fields = {name: (classes[name], Field(default_factory=classes[name])) for name in chosen}
    return create_model("Experiment", __base__=_Experiment, **fields)


class _Experiment(Config):
    """The base of the experiment models made here: :meth:`Config.replace` is this module's."""

    def replace(self, **sections: dict[str, Any]) -> Config:
        return replace(self, **sections)


def build_config(raw: dict[str, Any]) -> Config:
    """A validated experiment from the nested dict of a TOML file (missing keys take defaults)."""
    from testbed.algorithms import registry

    classes = _section_classes()
    for section, values in raw.items():
        if section not in classes:
            raise ConfigError(section, f"unknown section; known: {', '.join(classes)}")
        if not isinstance(values, dict):
            raise ConfigError(section, f"must be a table ([{section}])")
    run = raw.get("run", {})
    algorithm = run.get("algorithm", RunSection().algorithm) if isinstance(run, dict) else None
    own = registry.registrations()[algorithm].sections if algorithm in registry.names() else {}
    model = _config_model(frozenset(CORE_SECTIONS) | frozenset(own) | frozenset(raw))
    try:
        config = model.model_validate(raw)
    except ValidationError as exc:
        raise _config_error(exc) from None
    if config.run.algorithm not in registry.names():
        raise ConfigError("run.algorithm", f"must be one of {', '.join(registry.names())}, got "
                                           f"{config.run.algorithm!r}")
    reg = registry.get(config.run.algorithm)
    if config.client_sampling.method != "all" and not reg.client_sampling:
        raise ConfigError("client_sampling.method", f"{reg.name} needs every node every round; client sampling "
                                                    "is for dp_pasgd and fedavg")
    if reg.check is not None:
        reg.check(config)
    _check_epsilon_budget(config, reg)
    return config


def _check_epsilon_budget(config: Config, reg: Any) -> None:
    """An ε budget is a limit on the (ε, δ) a run's noise spends: on a run whose releases carry none
    (after the algorithm's calibration to it, where it has one) it would be "met" by a run that
    spent ε = ∞; refused before round 1, naming the key."""
    if config.budget.epsilon is None:
        return
    sections = reg.sections_for({name: getattr(config, name) for name in reg.sections}, config.budget.epsilon)
    guarantee = reg.guarantee(sections)
    if guarantee == "mi_dp":
        raise ConfigError("budget.epsilon", f"{reg.name}'s privacy is epsilon-MI-DP in nats, not (epsilon, delta); "
                                            "use budget.mi_epsilon")
    if guarantee != "dp":
        raise ConfigError("budget.epsilon", f"this {reg.name} run adds no noise (not private, epsilon is infinite) and "
                                            f"{reg.name} does not calibrate its noise to budget.epsilon; give its own "
                                            "noise or epsilon target, or remove budget.epsilon")


def _config_error(exc: ValidationError) -> ConfigError:
    """One line naming the key, from pydantic's first error (alternatives of a union merged)."""
    errors = exc.errors()
    first = errors[0]
    # A section's sub-table ([dwfl.scene]) is one level deeper: its keys are named in full.
    depth = 3 if len(first["loc"]) > 1 and first["loc"][1] in SCENE_TABLES else 2
    key = ".".join(str(part) for part in first["loc"][:depth])
    same = [e for e in errors if ".".join(str(p) for p in e["loc"][:depth]) == key]
    if first["type"] == "extra_forbidden":
        section = ".".join(str(part) for part in first["loc"][:depth - 1])
        known = ", ".join(_table_class(first["loc"][:depth - 1]).model_fields) if depth == 3 else \
            ", ".join(_section_classes()[section].model_fields) if section in _section_classes() else ""
        return ConfigError(key, f"unknown key; {section} takes {known}")
    if first["type"] in ("value_error", "assertion_error") and len(first["loc"]) < depth:
        # A section's own check says "field: why" (or "section.field: why").
        section = ".".join(str(part) for part in first["loc"]) if first["loc"] else "config"
        message = str(first["msg"]).removeprefix("Value error, ")
        head, _, rest = message.partition(": ")
        if rest and " " not in head:
            return ConfigError(head if "." in head else f"{section}.{head}", rest)
        return ConfigError(section, message)
    messages = list(dict.fromkeys(_plain(e) for e in same))
    got = first.get("input")
    return ConfigError(key, f"{' or '.join(messages)}, got {type(got).__name__} {got!r}")


def _table_class(loc: tuple) -> type[BaseModel]:
    """The model of a section's sub-table at ``loc`` (section, sub-table): its field's model."""
    field = _section_classes()[str(loc[0])].model_fields[str(loc[1])]
    return next(a for a in typing.get_args(field.annotation) if isinstance(a, type) and issubclass(a, BaseModel))


_TYPE_WORDS = {"float_type": "a number", "float_parsing": "a number", "int_type": "an integer",
               "int_parsing": "an integer", "int_from_float": "an integer", "bool_type": "true/false",
               "bool_parsing": "true/false", "string_type": "a string", "model_type": "a table",
               "dict_type": "a table"}
_BOUND_WORDS = {"greater_than": ("gt", ">"), "greater_than_equal": ("ge", ">="), "less_than": ("lt", "<"),
                "less_than_equal": ("le", "<=")}


def _plain(error: dict) -> str:
    """pydantic's message in the words of our errors: "must be a number", "must be > 0"..."""
    kind, ctx = error["type"], error.get("ctx", {})
    if kind in _TYPE_WORDS:
        return "must be " + _TYPE_WORDS[kind]
    if kind in _BOUND_WORDS:
        name, sign = _BOUND_WORDS[kind]
        bound = ctx.get(name)
        if bound == MIN_POSITIVE and name == "ge":  # a positive float (testbed.checked.sections)
            return f"must be > 0 (at least {MIN_POSITIVE:g})"
        return f"must be {sign} {bound:g}" if isinstance(bound, float) else f"must be {sign} {bound}"
    if kind == "literal_error":
        return "must be one of " + str(ctx.get("expected", "")).replace("'", "")
    if kind == "finite_number":
        return "must be a finite number"
    if kind == "string_pattern_mismatch":
        return f"must match {ctx.get('pattern')}"
    text = str(error["msg"])
    for prefix in ("Input should be ", "Value error, "):
        text = text.removeprefix(prefix)
    return text if text.startswith("must") else "must be " + text


def parse_override(text: str) -> tuple[list[str], Any]:
    """``section.key=value`` → (["section", "key"], value); the value is read as TOML, else as a string."""
    if "=" not in text:
        raise ConfigError(text, "an override is section.key=value")
    key, value_text = text.split("=", 1)
    path = override_key(key.strip())
    try:
        value = tomllib.loads(f"v = {value_text.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = value_text.strip()
    return path, value


def override_key(key: object) -> list[str]:
    """``"section.key"`` → ["section", "key"]; ConfigError for anything else."""
    path = key.split(".") if isinstance(key, str) else []
    if len(path) != 2 or not all(path):
        raise ConfigError(str(key), "an override key is section.key")
    return path


def apply_overrides(raw: dict[str, Any], overrides: Iterable[str | tuple[str, Any]]) -> dict[str, Any]:
    """Set each override in the nested dict of an experiment, in order, and return it: a
    ``"section.key=value"`` string (``--set``; the value read as TOML, else as a string) or a
    ``("section.key", value)`` pair (the Python API's; the value as it is)."""
    for item in overrides:
        if isinstance(item, str):
            (section, key), value = parse_override(item)
        else:
            (section, key), value = override_key(item[0]), item[1]
        table = raw.setdefault(section, {})
        if not isinstance(table, dict):
            raise ConfigError(section, "must be a table")
        table[key] = value
    return raw


def load_config(path: str | Path, overrides: Sequence[str | tuple[str, Any]] = ()) -> Config:
    """Read, override (``--set section.key=value``, or pairs: :func:`apply_overrides`) and validate an experiment file; its relative
    paths are resolved against its folder."""
    path = Path(path)
    if not path.exists():
        raise ConfigError(str(path), "experiment file not found")
    if path.is_dir():
        raise ConfigError(str(path), "is a folder, not an experiment file")
    try:
        text = read_text(path, MAX_TEXT_FILE_BYTES, "experiment file")
    except UserError as exc:
        raise ConfigError(str(path), str(exc).removeprefix(f"experiment file {path}: ")) from None
    return load_config_text(text, overrides, source=str(path), base_dir=path.resolve().parent)


def load_config_text(text: str, overrides: Sequence[str | tuple[str, Any]] = (), source: str = "<text>",
                     base_dir: Path | None = None) -> Config:
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(source, f"not valid TOML: {exc}") from None
    except RecursionError:  # arrays nested thousands deep: tomllib recurses per level
        raise ConfigError(source, "not a usable TOML file: nested too deeply") from None
    apply_overrides(raw, overrides)
    if base_dir is not None:
        tables = [(raw.get(section), key) for section, key in PATH_KEYS]
        # A radio's scene sub-table ([ALGORITHM.scene], [padpfl.link_scene]: testbed.topology.scene) names files too.
        tables += [(table[sub], key) for table in raw.values() if isinstance(table, dict)
                   for sub in SCENE_TABLES if isinstance(table.get(sub), dict) for key in SCENE_PATH_KEYS]
        for table, key in tables:
            if isinstance(table, dict) and isinstance(table.get(key), str) and not Path(table[key]).is_absolute():
                table[key] = str(base_dir / table[key])
    return build_config(raw)


def replace(config: Config, **sections: dict[str, Any]) -> Config:
    """A copy of ``config`` with some keys changed, e.g. ``replace(c, run={"seed": 3})``; validated."""
    raw = to_dict(config, used_only=False)
    for name, values in sections.items():
        raw.setdefault(name, {}).update(values)
    return build_config(raw)


def used_sections(config: Config) -> list[str]:
    """The sections a run of ``config`` reads: the run-wide ones and its algorithm's own. (``[mqtt]``
    stays in sim mode too: ``--mode mqtt`` on a saved config.toml needs it.)"""
    from testbed.algorithms import registry

    own = list(registry.get(config.run.algorithm).sections)
    core = list(CORE_SECTIONS)
    at = core.index("budget")
    return core[:at] + own + core[at:]


def to_dict(config: Config, used_only: bool = True) -> dict[str, dict[str, Any]]:
    """The config as nested dicts, None values left out (TOML has no null); by default only the
    sections the run uses."""
    names = used_sections(config) if used_only else list(type(config).model_fields)
    return {name: getattr(config, name).model_dump(exclude_none=True) for name in names}


def to_toml(config: Config) -> str:
    """The resolved config as a TOML file that :func:`load_config` reads back to an equal Config
    (only the sections the run uses), written by tomli-w: nested tables (``padpfl.schedule``'s
    changes) and every string escape come out as TOML, which a hand-written writer got wrong."""
    import tomli_w

    return tomli_w.dumps(to_dict(config))


def _section_subclasses() -> list[type[Section]]:
    found: list[type[Section]] = []
    todo: list[type[Section]] = [Section]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub not in found:
                found.append(sub)
                todo.append(sub)
    return found


def json_schema() -> dict[str, Any]:
    """The JSON Schema of an experiment file (every section of every algorithm)."""
    from testbed.algorithms import registry

    schema = _config_model().model_json_schema()
    for cls in _section_subclasses():  # the nested ones too (padpfl.change's ImpactChange)
        properties = schema["$defs"].get(cls.__name__, {}).get("properties", {})
        for name, doc in attribute_docstrings(cls).items():
            if name in properties:
                properties[name].setdefault("description", doc)
        for prop in properties.values():
            ranges = _ranges(prop)
            if ranges:  # the range the validator holds the field to (testbed.checked.sections), in words
                prop["description"] = f"{prop.get('description', '')} Range: {'; '.join(ranges)}.".strip()
    schema["title"] = "testbed experiment file"
    schema["$defs"]["RunSection"]["properties"]["algorithm"]["enum"] = registry.names()
    schema["$schema"] = "http://json-schema.org/draft-07/schema#"
    return schema


def _ranges(prop: dict[str, Any], each: str = "") -> list[str]:
    """The numeric ranges of a JSON Schema property, e.g. ``["0 < x <= 2147483647"]``: its own, its
    alternatives' (``anyOf``) and its items' (``each ...``)."""
    found = []
    if prop.get("type") in ("integer", "number"):
        def shown(v: float) -> str:
            return f"{v:g}" if isinstance(v, float) else str(v)

        low = (f"{shown(prop['minimum'])} <= " if "minimum" in prop else
               f"{shown(prop['exclusiveMinimum'])} < " if "exclusiveMinimum" in prop else "")
        high = (f" <= {shown(prop['maximum'])}" if "maximum" in prop else
                f" < {shown(prop['exclusiveMaximum'])}" if "exclusiveMaximum" in prop else "")
        found.append(f"{each}{low}x{high}")
    for alternative in prop.get("anyOf", []):
        found += _ranges(alternative, each)
    if isinstance(prop.get("items"), dict):
        found += _ranges(prop["items"], "each ")
    return found


def json_schema_text() -> str:
    return jsontext.dumps(json_schema(), indent=2) + "\n"


def toml_value(v: Any) -> str:
    """A TOML value's text, as :func:`to_toml` writes it (a node file's keys: nodes.board_config)."""
    import tomli_w

    return tomli_w.dumps({"v": v}).removeprefix("v = ").rstrip("\n")
