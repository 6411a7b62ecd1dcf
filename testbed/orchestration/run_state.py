"""What the stages of a run share (testbed.orchestration.runner): the pieces built so far and the
run's progress, one :class:`Run`, which the rounds loop, charging, evaluation and the summary read
and write."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

from testbed.accounting.book import LedgerBook
from testbed.accounting.budgets import Budgets, Exceeded
from testbed.algorithms.contract import Algorithm, RoundContext, State
from testbed.assembly.config import Config
from testbed.data.federated import FederatedData
from testbed.data.lazy import LazyFederatedData
from testbed.learning.models import Model
from testbed.ledger.events import Event
from testbed.ledger.node import Totals
from testbed.reports.results import RunDirectory
from testbed.reports.startup import Startup
from testbed.reports.tracking.feed import Tracking
from testbed.streams.node_secret import RUN_SEED


@dataclass
class Run:
    """What the stages share: the pieces built so far and the run's progress."""

    config: Config
    data: FederatedData | LazyFederatedData
    model: Model
    algorithm: Algorithm
    budgets: Budgets
    book: LedgerBook
    directory: RunDirectory
    state: State
    plan: dict | None = None
    rounds_done: int = 0
    status: str = "completed"
    stopped: Exceeded | None = None
    # The nodes that refused a round for their own budget, in order: (round, what they said). Each
    # is taken out of the later rounds (asked nothing, charged nothing more); the others go on.
    refusals: list[tuple[int, Exceeded]] = field(default_factory=list)
    failure: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    evaluated_at: int = -1  # rounds done when ``metrics`` were measured
    # A resumed run's ledger rows written after its checkpoint, by round: already charged, taken
    # into the book when their round runs again (so each round's metrics row counts what it did).
    past_mark: dict[int, list[Event]] = field(default_factory=dict)
    # A resumed run's rounds an earlier session asked (asked.csv) that may hold a release the ledger
    # lacks: round → node → how many earlier sessions asked it. Each such node that ends the round
    # here uncharged (it straggles, left, is withdrawn) may have released: it is charged the plan;
    # and each asking session's compute and communication are charged beside this session's
    # (testbed.orchestration.charging).
    asked_before: dict[int, Counter[int]] = field(default_factory=dict)
    # What was charged at the plan on ask (its seconds and joules the costliest the node had
    # reported by then): (the round as asked, the events), topped up at the session's end, when the
    # costliest is known over the whole session (testbed.orchestration.charging).
    estimated: list[tuple[RoundContext, list[Event]]] = field(default_factory=list)
    sessions: list[str] = field(default_factory=list)  # the sessions that asked a round, oldest first
    # The round this session asked and has not closed yet (charged on ask at the end if it never closes).
    open_ask: RoundContext | None = None
    # node → the rounds it was charged the plan of without its own events (testbed.orchestration.charging).
    charged_on_ask: dict[int, set[int]] = field(default_factory=dict)
    eval_data: FederatedData | None = None  # the evaluated nodes' rows (output.eval_nodes); set by run_experiment
    # Where the evaluated rows may be scored instead of this process: the sim's node workers, which
    # hold them (SimNodes): a model_evaluation.RowScorer, which imports this module; None: here.
    scorer: Callable[..., Any] | None = None
    # node → the totals of its own ledger, as it reported them when the run closed (None: sim, whose
    # nodes' ledgers are the book itself); see run_summary.ledger_check.
    node_reports: dict[int, Totals] | None = None
    reported_rounds: dict[int, frozenset[int]] = field(default_factory=dict)  # node → rounds its report logged
    # node → the randomness its ready said keys its private draws (None: sim, all the run seed).
    randomness: dict[int, str] | None = None
    server_randomness: str = RUN_SEED  # what keyed the server's private draws (Closing.server_randomness)
    session: str | None = None  # the coordinator's session (over MQTT): the nodes' ledgers are kept under it
    broker: dict[str, str] | None = None  # the broker's kind and URL (over MQTT)
    links: list[dict] | None = None  # each emulated host's link, timed round by round (links.netns)
    sim_workers: int | None = None  # the worker processes sim's node steps ran in (None: over MQTT)
    authentication: dict | None = None  # whether the messages were authenticated (over MQTT)
    # The rounds' clock (metrics.csv wall_s, summary wall_s): restarted when the set-up is done, so
    # the set-up (startup.setup_s) is never counted as round 1's.
    wall_start: float = field(default_factory=time.monotonic)
    startup: Startup = field(default_factory=lambda: Startup(enabled=False))
    tracking: Tracking = field(default_factory=Tracking.off)  # output.tensorboard, output.mlflow
    # What the releases carry (testbed.algorithms.registry.GUARANTEES): only "dp" has a finite ε.
    guarantee: str = "none"
    regression: bool = False
    # Whether the seconds and joules charged came from a meter (True), a device profile (False): both
    # seen in a run of boards with and without meters. Filled as events are charged.
    cost_sources: set[bool] = field(default_factory=set)
    # Sentences of the assumptions its ε rests on (run_assumptions): empty unless a reproduction's.
    assumptions: list[str] = field(default_factory=list)
