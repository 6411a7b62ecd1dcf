"""The algorithm registry: every module of this package that defines ``REGISTRATION`` is an
algorithm; adding one is adding a
module, here or in an installed plugin (docs/extending.md).

A :class:`Registration` says the algorithm's name (``run.algorithm``), its config sections (typed
models declared in its module), how to build it from them, and optionally its channel half (an
over-the-air algorithm) and a planning stage. Config validation, ``to_toml``, the runner, the
transports and the CLI read this registry and never name an algorithm.

It also carries the hooks the command line and the live view need of an algorithm, so they name
none either: its privacy calculator (``testbed privacy NAME``) and planner (``testbed plan NAME``)
as :class:`Command` objects, the local step ``testbed calibrate`` times, and the view of its
channel the watch page draws.

Example::

    >>> {"dp_pasgd", "dwfl"} <= set(names())
    True
    >>> get("dp_pasgd").primary
    'dp_pasgd'
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence
from testbed.util.registrations import GROUPS, lookup, plugin_of, registered_in

if TYPE_CHECKING:
    import argparse

    from pydantic import BaseModel

    from testbed.algorithms.contract import Algorithm, ChannelHalf, ChannelView, GraphView
    from testbed.checked.sections import Config
    from testbed.data.federated import FederatedData
    from testbed.learning.models import Model
    from testbed.privacy.statements import PrivacyStatement


@dataclass(frozen=True)
class BuildContext:
    """What every algorithm is built with besides its own sections.

    Attributes:
        model: the model.
        data: the data this process holds (all nodes in sim, one node on a board).
        num_nodes: N of the whole run (a board's data holds only its own node).
        seed: the run's seed.
        delta: the privacy δ of ``[privacy]``.
        mcu_nodes: the nodes that are microcontroller boards (``[nodes] mcu``): an algorithm that
            can run on one emulates its arithmetic for them, so sim gives the boards' numbers.
        straggler_p: the ``[stragglers]`` Bernoulli p (0 for the other straggler models), for
            algorithms that correct for stragglers (ACFL's 1/(1−p)).
    """

    model: "Model"
    data: "FederatedData"
    num_nodes: int
    seed: int
    delta: float
    mcu_nodes: frozenset[int] = frozenset()
    straggler_p: float = 0.0


@dataclass(frozen=True)
class Command:
    """A sub-command an algorithm adds to the command line, named after it (``testbed privacy
    dp-pasgd``: the name with ``-`` for ``_``).

    Attributes:
        help: its line in the parent command's ``--help``.
        arguments: adds its arguments to its (empty) parser.
        run: its handler: the parsed arguments → the exit status. An experiment file it reads
            goes through ``args.experiments`` (:class:`Experiments`).
        examples: invocations shown in its ``--help``, as the arguments after its name
            (tests/test_cli.py parses each).
    """

    help: str
    arguments: Callable[["argparse.ArgumentParser"], None]
    run: Callable[["argparse.Namespace"], int]
    examples: tuple[str, ...] = ()


class Experiments(Protocol):
    """What a :class:`Command` may do with an experiment file, handed to it by the command line as
    ``args.experiments``: reading one and building its data and model take the config and the
    assembly, which read this registry, so an algorithm's module cannot import them."""

    def load(self, text: str, overrides: Sequence[str] = (), source: str = "<text>") -> "Config":
        """The validated experiment of a TOML text, with ``--set``-style overrides (ConfigError naming
        the key)."""
        ...

    def load_file(self, path: str) -> "Config":
        """The validated experiment of the file at ``path`` (ConfigError naming the key)."""
        ...

    def data_and_model(self, config: "Config") -> tuple["FederatedData", "Model"]:
        """The data the experiment's nodes hold and its model, as a run builds them."""
        ...


@dataclass(frozen=True)
class RobustChoice:
    """The robust aggregation rule an averaging algorithm recommends against hostile nodes: the
    cheapest rule that held at 10 % hostile in benchmarks/robust_aggregation.py (no attack of its
    grid lowered the mean accuracy by more than 0.05; docs/robust-aggregation.md), and its cost.
    ``testbed run --help`` prints it; tests/test_robust_aggregation.py holds it to the docs' table."""

    rule: str
    cost: str


@dataclass(frozen=True)
class Registration:
    """One algorithm.

    Attributes:
        name: its ``run.algorithm``.
        sections: config section name → pydantic model, the first one its own (``[name]``).
        build: (its sections by name, BuildContext) → the algorithm.
        channel: (its sections, N, seed) → its ChannelHalf, for over-the-air algorithms.
        check: (the whole config, a testbed.checked.sections.Config: the base of the experiment
            model testbed.assembly.config makes, a layer above) → raises ConfigError for
            cross-section constraints.
        plan: (config, model, data) → (config with planned values, from ``config.replace``; the plan
            for the summary or None): a stage run once before the algorithm is built (DP-PASGD's
            ``tau = "plan"``).
        epsilon_target: (its sections) → the ε target it was configured with, or None.
        planned_rounds: (its sections, as planned) → the rounds it will run, or None when they
            are not known before it runs; by default its own section's ``rounds``.
        guarantee: (its sections) → the privacy its releases carry, one of GUARANTEES: "dp" (each
            release noised and charged to the (ε, δ) ledger), "mi_dp" (ε-MI-DP in nats, ACFL's) or
            "none" (releases without noise: ε is infinite, reported as "not private"). The default,
            "none", never claims a privacy an algorithm did not declare.
        calibrate: (its sections, the run's ε budget ``budget.epsilon``) → its sections with the
            noise calibrated to that ε when they set no noise (σ) and no ε target of their own,
            else unchanged; None: the algorithm cannot calibrate to a run-wide ε, and an ε budget
            on a configuration without noise is a config error.
        client_sampling: whether it runs on a sample of the nodes each round
            (``[client_sampling]``): its server step uses whoever answered, and nothing it plans
            assumes every node takes part.
        privacy_cli: its privacy calculator, ``testbed privacy NAME``.
        plan_cli: its planner, ``testbed plan NAME``.
        calibration_step: (a model, the data of one node, the batch size) → a function running n
            of its local steps from given parameters: the step ``testbed calibrate`` times (c2 of
            the cost model its planner reads).
        channel_view: (its sections, N, seed) → the view of its channel the watch page draws
            (over-the-air algorithms); ValueError if the sections give no channel.
        graph_view: (its sections, N, seed) → the view of its graph the watch page draws
            (decentralised algorithms; testbed.topology.view offers one for ``[topology]``).
        assumptions: (its sections) → sentences a run's summary carries under ``assumptions``: a
            paper's assumption its ε rests on that the mechanism run does not make true (allowed
            only with ``[privacy] reproduction = true``, its ``check`` refusing it otherwise).
        privacy_statements: what it guarantees, to whom and under which assumptions
            (testbed.privacy.statements), its own first, then any variant's run under another name
            (DP-PASGD's microcontroller step): the source of `testbed privacy NAME` and of
            docs/privacy.md.
        robust_choice: the robust rule it recommends (``ALGORITHM.aggregation``), for an algorithm
            that averages what nodes send; None for one that cannot drop a sender (ACFL's coded
            sum, DWFL's superposition over the air).
    """

    name: str
    sections: dict[str, type["BaseModel"]]
    build: Callable[[dict[str, Any], BuildContext], "Algorithm"]
    channel: Callable[[dict[str, Any], int, int], "ChannelHalf"] | None = None
    check: Callable[["Config"], None] | None = None
    plan: Callable[["Config", "Model", "FederatedData"], tuple["Config", dict | None]] | None = None
    epsilon_target: Callable[[dict[str, Any]], float | None] = field(default=lambda sections: None)
    planned_rounds: Callable[[dict[str, Any]], int | None] = field(default=lambda sections: _rounds_key(sections))
    client_sampling: bool = False
    privacy_cli: Command | None = None
    plan_cli: Command | None = None
    calibration_step: Callable[["Model", "FederatedData", int], Callable[[Any, int], None]] | None = None
    channel_view: Callable[[dict[str, Any], int, int], "ChannelView"] | None = None
    graph_view: Callable[[dict[str, Any], int, int], "GraphView"] | None = None
    guarantee: Callable[[dict[str, Any]], str] = field(default=lambda sections: "none")
    calibrate: Callable[[dict[str, Any], float], dict[str, Any]] | None = None
    assumptions: Callable[[dict[str, Any]], list[str]] = field(default=lambda sections: [])
    privacy_statements: tuple["PrivacyStatement", ...] = ()
    robust_choice: RobustChoice | None = None

    def sections_for(self, sections: dict[str, Any], budget_epsilon: float | None) -> dict[str, Any]:
        """Its ``sections`` as the run builds it: calibrated to ``budget_epsilon`` (``budget.epsilon``)
        where it calibrates (:attr:`calibrate`), as given otherwise."""
        if budget_epsilon is None or self.calibrate is None:
            return sections
        return self.calibrate(sections, budget_epsilon)

    @property
    def primary(self) -> str:
        return next(iter(self.sections))


def _rounds_key(sections: dict[str, Any]) -> int | None:
    rounds = getattr(next(iter(sections.values())), "rounds", None)
    return rounds if isinstance(rounds, int) else None


#: What an algorithm's releases may carry (:attr:`Registration.guarantee`).
GUARANTEES = ("dp", "mi_dp", "none")


@functools.cache
def registrations() -> dict[str, Registration]:
    """Every algorithm of this package and of the installed plugins (testbed.algorithms), by name (modules imported once, on first use)."""
    import testbed.algorithms as package

    return registered_in(package, Registration, "algorithm", group=GROUPS["algorithm"])


def names() -> list[str]:
    return list(registrations())


def get(name: str) -> Registration:
    return lookup(registrations(), name, "algorithm")


def privacy_statements(plugins: bool = True) -> list["PrivacyStatement"]:
    """Every registered algorithm's privacy statements, in the registry's (name) order; without
    ``plugins``, the built-in ones only (what docs/privacy.md documents)."""
    return [s for reg in registrations().values() if plugins or not plugin_of("algorithm", reg.name)
            for s in reg.privacy_statements]


def offering(hook: str) -> list[Registration]:
    """The algorithms whose hook ``hook`` (a field of :class:`Registration`) is set, by name."""
    return [reg for reg in registrations().values() if getattr(reg, hook) is not None]
