"""Runs an experiment as a short pipeline of named stages:

1. :func:`load` — the data this run holds and the model, once the run is known to fit this machine
   (testbed.assembly.resources: memory, sockets), so an impossible one is refused before any allocation;
2. :func:`plan` — the algorithm's planning stage, if it has one (DP-PASGD's ``tau = "plan"``);
3. :func:`open_run` — the run directory (new, or a killed run's to resume);
4. :func:`build_nodes` — the nodes: in this process (``sim``) or over MQTT;
5. :func:`run_rounds` — setup, then each round: budgets first, emulated stragglers, the nodes'
   step, the server step, ledger, checkpoint and metrics;
6. :func:`finish` — summary.json (also when a stage failed), figures, the tight accountant.

The rounds loop is the same whatever moves the messages: a :class:`testbed.orchestration.nodes_api.Nodes`
answers each round with a :class:`~testbed.orchestration.nodes_api.RoundOutcome`.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import logging
import math
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from testbed.assembly import assemble

from testbed.accounting.book import LedgerBook
from testbed.accounting.budgets import Budgets, Exceeded, budgets_from_config
from testbed.algorithms import registry
from testbed.algorithms.contract import SETUP_ROUND, Algorithm, RoundContext, State, WithSetup, planned_batch
from testbed.assembly.assemble import load_evaluation_data, load_run_data, model_for
from testbed.assembly.config import Config, to_toml
from testbed.assembly.resources import check_fits
from testbed.data.federated import FederatedData, Split
from testbed.data.lazy import LazyFederatedData
from testbed.errors import ConfigError
from testbed.learning.models import Model
from testbed.ledger.events import Event, EventBatch, NodeEvents, StraggleEvent, batches_of
from testbed.ledger.files import LedgerWriter
from testbed.ledger.node import Totals
from testbed.mqtt.brokers import registry as brokers
from testbed.orchestration import charging
from testbed.orchestration.nodes_api import Closing, Nodes, RoundOutcome
from testbed.privacy.accountants import epsilon_by_observer
from testbed.privacy.accountants.background import BackgroundEpsilons
from testbed.privacy.secrecy import node_randomness, privacy_guarantees, quote_against
from testbed.reports import tracking
from testbed.reports.asked import AskedLog
from testbed.reports.progress import Progress
from testbed.reports.refusals import RefusalLog
from testbed.reports.results import RunDirectory, not_yet_charged, split_by_issuer
from testbed.reports.startup import Startup
from testbed.reports.tracking.feed import Tracking
from testbed.rounds.client_sampling import sample_clients
from testbed.rounds.stragglers import StragglerDraws
from testbed.streams.node_secret import RUN_SEED, SERVER_KEY_FILE, load_or_make
from testbed.streams.rng import GLOBAL, Purpose, stream
from testbed.util.parallel import split_work
from testbed.util.threads import limit_blas_threads

if TYPE_CHECKING:
    from testbed.reports.plots import BackgroundFigures

log = logging.getLogger(__name__)
# Rounds before the last checkpoint's for which the book still knows who logged them (a round re-run
# after a resume is not charged twice). Late replies of older rounds are charged once all the same:
# the coordinator remembers which rounds of its session it handed over as charged.
_ROUNDS_KEPT = 16


@dataclass(frozen=True)
class RunResult:
    run_dir: Path
    summary: dict[str, Any]


def per_node_mean(values: np.ndarray, split: Split) -> np.ndarray:
    """Mean of per-sample ``values`` over each node's rows; (N_total,) → (M,)."""
    sums = np.add.reduceat(values.astype(np.float64), split.offsets[:-1]) if len(values) else np.zeros(0)
    return sums / np.maximum(split.sizes, 1)


def per_sample(model: Model, params: np.ndarray, split: Split) -> tuple[np.ndarray, np.ndarray]:
    """(loss (N,), correct (N,) bool) of one model on every sample of ``split``: two halves of the
    rows at once (testbed.util.parallel; each row's numbers are its own)."""
    n = len(split.y)
    loss, correct = np.empty(n), np.empty(n, dtype=bool)

    def work(lo: int, hi: int) -> None:
        loss[lo:hi], correct[lo:hi] = model.loss_and_correct(params, split.x[lo:hi], split.y[lo:hi])

    split_work(n, work, numbers=split.x.size)
    return loss, correct


def evaluate(model: Model, params: np.ndarray, data: FederatedData) -> dict[str, float]:
    """Training loss of eq. (4) (mean over nodes of each node's mean loss) and accuracies (mean over
    nodes of each node's accuracy, as the paper reports; pooled over all test samples beside it).
    On float32 features (data.dtype) in float32: a float64 model would copy them all to float64."""
    if data.train.x.dtype == np.float32:
        params = np.asarray(params, dtype=np.float32)
    train_loss, _ = per_sample(model, params, data.train)
    test_loss, test_correct = per_sample(model, params, data.test)
    _, val_correct = per_sample(model, params, data.validation)
    return {
        "train_loss": float(per_node_mean(train_loss, data.train).mean()),
        "test_loss": float(per_node_mean(test_loss, data.test).mean()),
        "test_accuracy": float(per_node_mean(test_correct, data.test).mean()),
        "test_accuracy_pooled": float(test_correct.mean()),
        "validation_accuracy": float(per_node_mean(val_correct, data.validation).mean()),
    }


#: The accuracies of :func:`evaluate`: meaningless for a regression (its targets are not labels).
_ACCURACIES = ("test_accuracy", "test_accuracy_pooled", "validation_accuracy")


def is_regression(data: FederatedData) -> bool:
    """Whether the task is a regression: its targets are real vectors, not class labels."""
    return not np.issubdtype(data.test.y.dtype, np.integer)


def _evaluate(run: "Run") -> None:
    run.metrics = evaluate(run.model, run.algorithm.eval_params(run.state), run.eval_data)
    if run.regression:  # a regression reports its loss (squared error) only: no accuracy to show
        run.metrics.update(dict.fromkeys(_ACCURACIES, None))
    run.evaluated_at = run.rounds_done


def default_run_dir(config: Config) -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S-%f")
    return Path(config.output.dir) / f"{config.run.name}-{stamp}-s{config.run.seed}"


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
    # node → the totals of its own ledger, as it reported them when the run closed (None: sim, whose
    # nodes' ledgers are the book itself); see _ledger_check.
    node_reports: dict[int, Totals] | None = None
    reported_rounds: dict[int, frozenset[int]] = field(default_factory=dict)  # node → rounds its report logged
    # node → the randomness its ready said keys its private draws (None: sim, all the run seed).
    randomness: dict[int, str] | None = None
    server_randomness: str = RUN_SEED  # what keyed the server's private draws (Closing.server_randomness)
    session: str | None = None  # the coordinator's session (over MQTT): the nodes' ledgers are kept under it
    broker: dict[str, str] | None = None  # the broker's kind and URL (over MQTT)
    links: list[dict] | None = None  # each emulated host's link, timed round by round (links.netns)
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


def load(config: Config) -> tuple[FederatedData | LazyFederatedData, Model]:
    """Stage 1: every node's data, or only its layout when the nodes are lazy (client sampling in
    sim, testbed.assembly.assemble.holds_lazily), and the model; first, refuse a run this machine cannot hold
    (one line, before anything is allocated), or whose own broker it cannot start (mqtt.broker)."""
    check_fits(config)
    if config.run.mode == "mqtt" and config.mqtt.broker_url is None:
        brokers.choose(config.mqtt.broker)
    if config.links.netns:
        _check_links(config)
    data = load_run_data(config)
    return data, model_for(config.model, data, config.run.seed)


def _check_links(config: Config) -> None:
    """Refuse links.netns (one line, before anything is allocated) where it cannot work: a run in
    sim (no hosts to put behind links), or a machine that cannot make them."""
    from testbed.orchestration import links

    if config.run.mode != "mqtt":
        raise ConfigError("links.netns", f"puts the emulated hosts of an MQTT run behind links; run.mode is "
                          f"{config.run.mode!r}")
    if (why := links.missing()) is not None:
        raise ConfigError("links.netns", why)


def plan(config: Config, model: Model, data: FederatedData) -> tuple[Config, dict | None]:
    """Stage 2: the algorithm's planning stage (values the config left to it), if any."""
    reg = registry.get(config.run.algorithm)
    return reg.plan(config, model, data) if reg.plan is not None else (config, None)


def check_accountants(config: Config, algorithm: Algorithm, node_ids: list[int]) -> None:
    """Refuse before round 1, naming the key, an accountant that cannot account the algorithm's
    releases (asked of the accountant, as dp-accounting's ``supports()`` does)."""
    from testbed.privacy.accountants import unsupported_reason

    ctx = RoundContext(0, config.run.seed, config.data.num_nodes, tuple(node_ids))
    events = [e for e in algorithm.planned_events(node_ids[0], ctx) if e.kind == "privacy"]
    for key, name in (("privacy.accountant", config.privacy.accountant),
                      ("privacy.tight_accountant", config.privacy.tight_accountant)):
        if name != "none" and events and (reason := unsupported_reason(name, events)) is not None:
            raise ConfigError(key, reason)


def run_assumptions(config: Config, data: FederatedData | LazyFederatedData) -> list[str]:
    """The assumptions the run's ε rests on beyond the mechanism it runs, as sentences for the
    summary: a δ at or above 1/m (m the smallest node's training records; refused, naming
    ``privacy.delta``, unless ``[privacy] reproduction = true``) and the algorithm's own
    (``Registration.assumptions``: PADPFL's eq. 7, DWFL's fixed x_j^(t−1/2), ...). Only an (ε, δ)
    run has a δ to check; a run that is not private assumes nothing."""
    from testbed.privacy.delta import delta_assumption

    reg = registry.get(config.run.algorithm)
    guarantee = assemble.privacy_guarantee(config)
    if guarantee == "none":
        return []
    sizes = data.train.sizes
    out = [delta_assumption(config.privacy.delta, int(sizes.min()) if len(sizes) else 0,
                            reproduction=config.privacy.reproduction)] if guarantee == "dp" else []
    return [s for s in out if s] + list(reg.assumptions(assemble.algorithm_sections(config, reg)))


def open_run(config: Config, out_dir: Path | None, resume: bool, algorithm: Algorithm, model: Model,
             book: LedgerBook, past_mark: dict[int, list[Event]],
             asked: dict[int, Counter[int]] | None = None) -> tuple[RunDirectory, int, State]:
    """Stage 3: a new run directory, or a killed run's, trusted only after it is checked (its
    checkpoint against the algorithm's state, its files against the checkpoint's marks), with its
    ledger read back: into ``book`` up to the checkpoint's mark, the rows after it (of the rounds
    that run again) into ``past_mark`` by round, for :func:`_charge` to take when their round runs;
    into ``asked``, what :func:`testbed.orchestration.charging.earlier_asks` finds its earlier sessions asked and the ledger lacks."""
    def initial_state() -> State:
        return algorithm.init_state(model.init(stream(config.run.seed, GLOBAL, -1, Purpose.INIT)))

    if resume:
        every = config.output.checkpoint_every
        first = lambda: (initial_state(), 1 if every == "auto" else int(every))  # noqa: E731  (see reopen)
        directory = RunDirectory.reopen(out_dir, expected=algorithm_state_spec(algorithm), max_rounds=algorithm.rounds,
                                        nodes=set(book.node_ids.tolist()), sync=config.output.sync,
                                        setup=algorithm.has_setup, first=first,
                                        unset=[name for name, a in initial_state().items()
                                               if a.dtype.kind in "fc" and np.isnan(a).any()])
        events = list(directory.ledger_events())
        marked = directory.resumed.ledger_mark.rows
        book.extend(events[:marked])
        for event in events[marked:]:
            past_mark.setdefault(event.round, []).append(event)
        book.forget_rounds_before(directory.resumed.rounds_done - _ROUNDS_KEPT)
        if asked is not None:
            refused = {(r.node, r.round) for r in directory.refusals}
            asked.update(charging.earlier_asks(directory.asked, directory.resumed.rounds_done, refused))
        return directory, directory.resumed.rounds_done, directory.resumed.state
    directory = RunDirectory(out_dir or default_run_dir(config), sync=config.output.sync)
    directory.write_config(to_toml(config))
    LedgerWriter(directory.ledger_path).close()  # a run that fails before round 1 has an empty ledger
    return directory, 0, initial_state()


def algorithm_state_spec(algorithm: Algorithm) -> dict:
    """name → (shape, dtype) of the algorithm's whole state, as a checkpoint must hold it."""
    return {name: (spec.shape, np.dtype(spec.dtype)) for name, spec in algorithm.state_spec().items()}


def build_nodes(config: Config, algorithm: Algorithm, data: FederatedData | LazyFederatedData, quiet: bool,
                run_dir: Path | None = None) -> Nodes:
    """Stage 4: the run's nodes, however they are reached. Over MQTT, the coordinator's secret for
    the server's noise is ``run_dir``'s (made there, mode 0600, if a node has a secret): kept across
    a resume, so a round run again broadcasts the same noise, charged once."""
    if config.run.mode == "mqtt":
        from testbed.orchestration.coordinator import MqttNodes

        return MqttNodes(config.mqtt, config.nodes, to_toml(config), list(data.node_ids), algorithm,
                         seed=config.run.seed, quiet=quiet, links=config.links,
                         server_secret=None if run_dir is None else functools.partial(load_or_make, run_dir,
                                                                                       SERVER_KEY_FILE))
    from testbed.orchestration.sim_nodes import SimNodes

    return SimNodes(algorithm, data, config.run.seed, config.nodes.profile, mcu_nodes=config.nodes.mcu,
                    mcu_profile=config.nodes.mcu_profile)


def run_experiment(config: Config, out_dir: Path | None = None, quiet: bool = False,
                   resume: bool = False) -> RunResult:
    """Run ``config`` to completion or to the first budget a node would break; write RUN_DIR.

    With ``resume``, ``out_dir`` is a run that was killed: it continues after the last round whose
    state was saved; the ledger keeps everything already spent, and a round re-run after the kill
    (same seed, same streams, the same values released again) is not charged twice.
    """
    startup = Startup(enabled=not quiet)
    limit_blas_threads(config.run.blas_threads)
    tracking.check_installed(config)
    # The helper processes start first: they import dp-accounting and matplotlib (a second each)
    # on the other core while the data are built and the rounds run.
    tight_job = figures_job = None
    if config.privacy.tight_accountant != "none":
        tight_job = BackgroundEpsilons(config.privacy.tight_accountant, config.privacy.delta)
    if config.output.figures:
        from testbed.reports.plots import BackgroundFigures

        figures_job = BackgroundFigures()
    directory = None
    try:
        with startup.stage(f"loading the data ({config.data.dataset}, {config.data.num_nodes} nodes) and the model",
                           may_import=("torch",) if config.model.kind == "torch" else ()):
            data, model = load(config)
            eval_data = load_evaluation_data(config, data)
        with startup.stage(f"planning {config.run.algorithm}"):
            # Planning estimates constants from rows: the evaluated nodes' when the nodes are lazy.
            config, planned = plan(config, model, eval_data if isinstance(data, LazyFederatedData) else data)
        with startup.stage(f"building {config.run.algorithm} and checking its accountants",
                           may_import=("torch", "sionna")):
            algorithm = assemble.build_algorithm(config, model, data)
            check_accountants(config, algorithm, list(data.node_ids))
            assumptions = run_assumptions(config, data)
        book = LedgerBook(data.node_ids)
        past_mark: dict[int, list[Event]] = {}
        asked: dict[int, Counter[int]] = {}
        with startup.stage("reopening the run directory" if resume else "opening the run directory and evaluating round 0"):
            directory, rounds_done, state = open_run(config, out_dir, resume, algorithm, model, book, past_mark, asked)
            run = Run(config, data, model, algorithm, budgets_from_config(config.budget, config.privacy), book,
                      directory, state, planned, rounds_done, past_mark=past_mark, startup=startup,
                      eval_data=eval_data, guarantee=assemble.privacy_guarantee(config),
                      regression=is_regression(eval_data), asked_before=asked, assumptions=assumptions)
            run.sessions = list(dict.fromkeys(a.session for a in directory.asked))
            run.refusals = [(r.round, r.exceeded()) for r in directory.refusals]  # withdrawn: asked nothing more
            _evaluate(run)
    except BaseException:
        for job in (tight_job, figures_job):
            if job is not None:
                job.close()
        if directory is not None:
            directory.close()  # its lock
        raise
    nodes = None
    try:
        # What the run was built from lives to its end: the collector's full passes, each round's
        # for the messages' garbage, skip it (unfrozen below: cyclic garbage frozen is never freed).
        # Before the nodes: a full pass over it took 40-80 ms of an MQTT run's start, and emulated
        # hosts forked from this process inherit it frozen.
        gc.freeze()
        # Not announced by a timer: the emulated hosts are forked here, with no other thread alive.
        with startup.stage(f"starting the nodes ({config.run.mode})", announce=False):
            nodes = build_nodes(config, algorithm, data, quiet, directory.path)
        nodes.earlier_sessions = tuple(run.sessions)  # a node reports its spend in them too
        run.sessions.append(nodes.session)
        run.tracking = Tracking.start(config, directory.path)  # its thread after the hosts' forks
        run_rounds(run, nodes, quiet, tight_job)
    except BaseException as exc:
        run.status, run.failure = "failed", f"{type(exc).__name__}: {exc}"
        for job in (tight_job, figures_job):
            if job is not None:
                job.close()
        tight_job = figures_job = None
        raise
    finally:
        gc.unfreeze()
        if nodes is not None:
            try:
                _charge_closing(run, nodes.close(run.status), nodes)
            except Exception as exc:  # the summary must still be written
                run.status, run.failure = "failed", f"closing the nodes: {type(exc).__name__}: {exc}"
        try:
            summary = finish(run, tight_job, figures_job)
            run.tracking.finish(summary)
        finally:
            directory.close()  # the directory's lock is held until the last file is written
    return RunResult(directory.path, summary)


def run_rounds(run: Run, nodes: Nodes, quiet: bool, tight_job: BackgroundEpsilons | None = None) -> None:
    """Stage 5: setup (once), then the rounds, until done or a budget would break. Once the setup is
    done (what it brings may set a release's sensitivity), ``tight_job`` gets the planned tallies."""
    alg, config = run.algorithm, run.config
    ledger_file = LedgerWriter(run.directory.ledger_path, sync=run.config.output.sync)
    asked_log = AskedLog(run.directory.asked_path, sync=run.config.output.sync)
    refusal_log = None

    def refused(round_index: int, refusal: Exceeded) -> None:
        nonlocal refusal_log
        if refusal_log is None:  # a run nobody refuses has no refusals.csv
            refusal_log = RefusalLog(run.directory.refusals_path, sync=run.config.output.sync)
        refusal_log.append(round_index, refusal)

    def asking(ctx: RoundContext) -> None:
        asked_log.append(nodes.session, ctx.round_index, ctx.expected)  # written ahead: charging's record
        run.open_ask = ctx

    progress: Progress | None = None  # after the set-up: its bar is the rounds'
    cadence = CheckpointCadence(config.output.checkpoint_every, run.rounds_done)

    def save(ahead: int) -> None:
        run.directory.save_checkpoint(run.rounds_done, run.state, ledger_file.mark(), ahead)

    def report(outcome: RoundOutcome) -> None:
        """The round just done, from the state and the book as it left them: its evaluation,
        metrics row, checkpoint (when due) and progress. Done while the nodes compute the
        next round (``Nodes.round``'s ``meanwhile``), else after the last."""
        nonlocal reported
        reported = True
        done = run.rounds_done
        evaluated = done % config.output.eval_every == 0 or done == alg.rounds
        if evaluated:
            _evaluate(run)
        book = run.book
        # No noise: ε is infinite (metrics.csv writes inf), whatever events the ledger holds.
        eps = book.max_epsilon(run.budgets.accountant, run.budgets.delta) if run.guarantee == "dp" else math.inf
        # output.eval_every: blanks between evaluations; a regression's accuracies are always blank.
        measured = {k: "" if not evaluated or run.metrics[k] is None else run.metrics[k]
                    for k in ("train_loss", *_ACCURACIES)}
        row = {
            "round": done, "local_steps": int(book.column("local_steps").max(initial=0)),
            **measured, "cost_units": float(book.column("cost_units").max(initial=0.0)), "epsilon": eps,
            "bytes_total": int(book.column("bytes_total").max(initial=0)),
            "stragglers": len(outcome.ctx.stragglers), "wall_s": round(time.monotonic() - run.wall_start, 4),
        }
        run.directory.append_metrics(row)
        # After the round's metrics row: the checkpoint marks both files (see save_checkpoint).
        if cadence.due(done) or done == alg.rounds:
            cadence.save(done, save)
            book.forget_rounds_before(done - _ROUNDS_KEPT)
        progress.update(done, run.metrics["train_loss"], eps, row, run.book)
        run.tracking.round(row, book, run.budgets)

    reported, last = True, None  # the rounds done are all reported; the outcome of the last

    try:
        if alg.has_setup and run.rounds_done == 0 and not run.book.logged(run.book.node_ids, SETUP_ROUND).any():
            assert isinstance(alg, WithSetup)
            with run.startup.stage(f"{config.run.algorithm}'s setup round"):
                outcome = nodes.setup(run.state, asking=asking)
                _charge(run, outcome, ledger_file, nodes)
                server = alg.server_setup(run.state, outcome.result, outcome.ctx)
                run.state = server.state
                _charge_server(run, server.events, nodes, ledger_file)
                cadence.save(0, save)
        if tight_job is not None:
            tight_job.guess(_planned_tallies(run))
        every = run.book.node_ids.tolist()
        every_ids = run.book.node_ids  # as an array once, not every round
        straggler_draws = StragglerDraws(config.stragglers, config.run.seed)
        run.startup.done()
        run.wall_start = time.monotonic()  # the rounds' own clock from here
        progress = Progress(alg.rounds, enabled=not quiet, budgets=run.budgets, guarantee=run.guarantee)
        for r in range(run.rounds_done, alg.rounds):
            sampled = sample_clients(config.client_sampling, seed=config.run.seed, round_index=r, node_ids=every_ids)
            participants = every if sampled is None else list(sampled)
            withdrawn = frozenset(refusal.node for _, refusal in run.refusals) & set(participants)
            excluded = emulated_stragglers(config, alg, r, participants, straggler_draws) | withdrawn
            expected = tuple(n for n in participants if n not in excluded)
            probe = RoundContext(r, config.run.seed, config.data.num_nodes, expected, sampled=sampled)
            run.stopped = _first_exceeded(run.budgets, run.book, alg, probe)
            if run.stopped is not None:
                run.status = "stopped_budget"
                break
            before = last
            outcome = nodes.round(run.state, r, excluded, sampled,
                                  meanwhile=None if reported else lambda: report(before), asking=asking)
            outcome = _withdraw(run, outcome, withdrawn, refused)
            _charge(run, outcome, ledger_file, nodes)
            if set(every) <= {refusal.node for _, refusal in run.refusals}:  # nobody left: the last refusal stops it
                run.stopped, run.status = run.refusals[-1][1], "stopped_budget"
                break
            server = alg.server_step(run.state, outcome.result, outcome.ctx)
            run.state = server.state
            _charge_server(run, server.events, nodes, ledger_file)
            run.rounds_done = r + 1
            reported, last = False, outcome
        if not reported:
            report(last)
        if cadence.saved_at != run.rounds_done:  # a budget stop between checkpoints
            cadence.save(run.rounds_done, save)
    finally:
        if not reported:  # a failure in the round after it: the round done is still reported
            try:
                report(last)
            except Exception:  # noqa: BLE001  the failure on its way out is the one to tell
                log.exception("could not report round %d", run.rounds_done)
        if progress is not None:
            progress.close()
        ledger_file.close()
        asked_log.close()
        if refusal_log is not None:
            refusal_log.close()


class CheckpointCadence:
    """When the rounds loop writes the checkpoint (``output.checkpoint_every``): every ``every``
    rounds, or ("auto") every round while writing it costs under :attr:`SHARE` of a round, else as
    rarely as keeps it there (at most every :attr:`MAX_EVERY` rounds). Each checkpoint records how
    many rounds may run before the next, which bounds what a resume accepts past its mark.

    Example::

        >>> c = CheckpointCadence(3, rounds_done=0)
        >>> [r for r in range(1, 8) if c.due(r) and c.save(r, lambda ahead: None) is None]
        [3, 6]
    """

    SHARE = 0.02
    MAX_EVERY = 50

    def __init__(self, every: int | str, rounds_done: int):
        self.auto = every == "auto"
        self.every = 1 if self.auto else int(every)
        self.saved_at = rounds_done
        self._since = time.monotonic()
        self._write_s = 0.0

    def due(self, rounds_done: int) -> bool:
        return rounds_done - self.saved_at >= self.every

    def save(self, rounds_done: int, write: Callable[[int], None]) -> None:
        """``write(rounds_ahead)`` the checkpoint after ``rounds_done`` rounds."""
        start = time.monotonic()
        if self.auto and rounds_done > self.saved_at and self._write_s > 0:
            round_s = (start - self._since) / (rounds_done - self.saved_at)
            self.every = min(self.MAX_EVERY, max(1, math.ceil(self._write_s / (self.SHARE * max(round_s, 1e-9)))))
        write(self.every)
        self._since = time.monotonic()
        self._write_s = self._since - start
        self.saved_at = rounds_done


def emulated_stragglers(config: Config, algorithm: Algorithm, round_index: int, node_ids: list[int],
                        draws: StragglerDraws | None = None) -> frozenset[int]:
    """The nodes the ``[stragglers]`` model takes out of the round (from each node's own stream);
    ``draws``: the run's, which draws blocks of rounds at once."""
    section = config.stragglers
    if section.model == "none":
        return frozenset()
    round_time_s = None
    if section.model == "deadline":
        from nodes.stragglers import round_times_s

        ctx = RoundContext(round_index, config.run.seed, config.data.num_nodes, tuple(node_ids))
        round_time_s = round_times_s(config.nodes.profile, algorithm, ctx)
    draws = draws or StragglerDraws(section, config.run.seed)
    return draws.draw(round_index, node_ids, round_time_s)


def _charge(run: Run, outcome: RoundOutcome, ledger_file: LedgerWriter, nodes: Nodes) -> None:
    """Log what each node released (its own events; a round re-run after a kill is not charged
    twice; a node an earlier session asked this round that is charged nothing here, the plan) and
    who straggled, in one write."""
    book = run.book
    # This round's rows logged before a kill: charged; the round charges only what they lack. Those
    # the server issued wait for its step (_charge_server).
    before_kill, by_server = split_by_issuer(run.past_mark.pop(outcome.ctx.round_index, []))
    if by_server:
        run.past_mark[outcome.ctx.round_index] = by_server
    batches = []
    for batch in outcome.batches:
        fresh = ~book.logged(batch.nodes, batch.round)
        batches.append(batch if fresh.all() else batch.take(fresh))
    by_round: dict[int, list[int]] = {}
    for node, round_index in sorted(outcome.charged):
        by_round.setdefault(round_index, []).append(node)
    fresh_events = []
    for round_index, answered in by_round.items():
        for node, done in zip(answered, book.logged(answered, round_index).tolist()):
            if not done:
                fresh_events.extend(outcome.charged[node, round_index])
    straggled = outcome.straggled
    charged_here = {n for b in batches if b.kind != StraggleEvent.kind for n in b.nodes.tolist()}
    charged_here |= {e.node for e in [*fresh_events, *before_kill] if e.kind != StraggleEvent.kind}
    asked_events, asked_straggled = charging.charge_asked(run, outcome, nodes, charged_here, before_kill)
    fresh_events += asked_events
    straggled = {**straggled, **asked_straggled}
    r = outcome.ctx.round_index
    batches += batches_of(fresh_events)
    by_reason: dict[str, list[int]] = {}
    for node, reason in sorted(straggled.items()):
        by_reason.setdefault(reason, []).append(node)
    batches += [EventBatch(StraggleEvent(0, r, reason), np.array(nodes, dtype=np.int64))
                for reason, nodes in by_reason.items()]
    if before_kill:
        batches = not_yet_charged(batches, before_kill)
        book.extend(before_kill)
    for batch in batches:
        book.extend_batch(batch)
        _note_cost_source(run, batch)
    ledger_file.write_batches(batches)


def _cost_source(sources: set[bool]) -> str:
    """Where a run's seconds and joules came from: "measured" (meters), "modelled" (the device
    profile), "measured and modelled" (some nodes metered), or "none charged"."""
    return {frozenset({True}): "measured", frozenset({False}): "modelled",
            frozenset({True, False}): "measured and modelled"}.get(frozenset(sources), "none charged")


def _note_cost_source(run: Run, batch: EventBatch) -> None:
    """Note whether ``batch``'s seconds and joules were measured or modelled (see Run.cost_sources)."""
    if batch.kind in ("compute", "communication"):
        run.cost_sources.update(np.unique(np.asarray(batch.value("measured"), dtype=bool)).tolist())


def _charge_closing(run: Run, closing: Closing, nodes: Nodes) -> None:
    """What the run's end adds (late replies, rounds only the nodes' own ledgers logged, rounds an
    earlier session asked that this one did not run again): into the book and ledger.csv, and the
    checkpoint again so that it covers them; the nodes' reports kept for the summary."""
    run.node_reports, run.session, run.broker = closing.reports, closing.session, closing.broker
    run.reported_rounds, run.links = closing.reported_rounds, closing.links
    run.authentication = closing.authentication
    run.randomness, run.server_randomness = closing.randomness, closing.server_randomness
    fresh = [event for (node, round_index), events in sorted(closing.charged.items())
             if not run.book.logged([node], round_index)[0] for event in events]
    fresh += charging.charge_at_end(run, nodes, fresh)
    if not fresh:
        return
    run.book.extend(fresh)
    for batch in batches_of(fresh):
        _note_cost_source(run, batch)
    ledger_file = LedgerWriter(run.directory.ledger_path, sync=run.config.output.sync)
    try:
        ledger_file.write(fresh)
        run.directory.save_checkpoint(run.rounds_done, run.state, ledger_file.mark(), 1)
    finally:
        ledger_file.close()


def _charge_server(run: Run, events: list[Event], nodes: Nodes, ledger_file: LedgerWriter) -> None:
    """Events the server issued on nodes' behalf: into their ledgers here and, with their next
    round, to the nodes themselves."""
    fresh = [e for e in events if not run.book.has_server_events(e.node, e.round)]
    before_kill = [e for r in sorted({e.round for e in events}) for e in run.past_mark.pop(r, [])]
    if before_kill:  # logged before a kill (see _charge)
        fresh = [e for batch in not_yet_charged(batches_of(fresh), before_kill) for e in batch.events()]
        run.book.extend(before_kill)
    run.book.extend(fresh)
    ledger_file.write(fresh)
    if events:
        nodes.deliver(events)


def _withdraw(run: Run, outcome: RoundOutcome, withdrawn: frozenset[int],
              keep: Callable[[int, Exceeded], None]) -> RoundOutcome:
    """Take the round's budget refusals into ``run.refusals`` and ``keep`` each (refusals.csv: a
    resume asks the node nothing either; each refusing node is asked nothing more: one node's word
    ends its own part, not everyone's run), and mark the ``withdrawn`` nodes (refused before, not
    asked) as such among the round's straggles."""
    for node, budget, would_be, limit in outcome.refused:
        refusal = Exceeded(node, budget, would_be, limit)
        keep(outcome.ctx.round_index, refusal)
        run.refusals.append((outcome.ctx.round_index, refusal))
        log.warning("node %d refused round %d: its %s budget would be %.6g > %.6g; it is asked nothing more, "
                    "the run goes on with the others", node, outcome.ctx.round_index, budget, would_be, limit)
    if not withdrawn:
        return outcome
    return dataclasses.replace(outcome, straggled={**outcome.straggled, **dict.fromkeys(withdrawn, "withdrawn")})


def _first_exceeded(budgets: Budgets, book: LedgerBook, alg: Algorithm, ctx: RoundContext) -> Exceeded | None:
    if not budgets.any:
        return None
    return budgets.first_exceeded(book, ctx.expected, planned_batch(alg, ctx.expected, ctx))


def finish(run: Run, tight_job: BackgroundEpsilons | None, figures_job: "BackgroundFigures | None" = None) -> dict[str, Any]:
    """Stage 6: summary.json at once (a run killed from here on still has it), the final model,
    figures (drawn by a child process, while the tight accountant runs in another), then the tight
    accountant's ε."""
    for events in run.past_mark.values():  # rounds not run again (a budget stop): charged all the same
        run.book.extend(events)
    run.past_mark.clear()
    if run.evaluated_at != run.rounds_done and run.status != "failed":  # a budget stop between evaluations
        _evaluate(run)
    summary = _summary(run)
    run.directory.write_summary(summary)
    if run.status == "failed":
        for job in (tight_job, figures_job):
            if job is not None:
                job.close()
        return summary
    np.save(run.directory.path / "final_params.npy", run.algorithm.eval_params(run.state))
    if figures_job is not None:
        figures_job.draw("progress", run.directory.path)
    if tight_job is not None:
        tallies, index = run.book.distinct_tallies()
        keys = [(i, observer) for i, tally in enumerate(tallies) for observer in sorted(tally)]
        epsilons = tight_job.result([tallies[i][observer] for i, observer in keys])
        tight: list[dict[str, float]] = [{} for _ in tallies]
        for (i, observer), eps in zip(keys, epsilons):
            tight[i][observer] = eps
        if run.guarantee == "dp":  # not private: the tight ε of the other releases would mislead
            for entry, i in zip(summary["nodes"].values(), index[_summary_rows(run.book)].tolist()):
                entry["epsilon_tight"] = max(tight[i].values(), default=0.0)
                entry["epsilon_tight_by_observer"] = tight[i]
            summary["privacy"].update(privacy_headline(run.guarantee, summary["nodes"], run.budgets.delta,
                                                       run.budgets.accountant, run.config.privacy.tight_accountant))
            summary["privacy_guarantees"] = privacy_guarantees(
                run.guarantee, summary["nodes"], node_randomness(map(int, summary["nodes"]), run.randomness),
                run.budgets.delta, run.budgets.accountant, run.config.privacy.tight_accountant,
                resumed=len(run.sessions) > 1, **_server_noise(run))
            summary["privacy"]["headline"] = quote_against(summary["privacy"]["headline"], summary["privacy_guarantees"])
        run.directory.write_summary(summary)
    if figures_job is not None:
        figures_job.draw("epsilon", run.directory.path)
        problem = figures_job.wait()
        if problem is not None:
            log.warning("%s: figures not drawn: %s (testbed report redraws them)", run.directory.path, problem)
    return summary


def _planned_tallies(run: Run) -> list[Counter]:
    """The per-observer privacy tallies the nodes end the run with if every remaining round charges
    what it plans (and a pending setup its events; the server's, for an algorithm that can say them
    ahead: ``planned_server_events(state, ctx)``): the tight accountant's guess, one per distinct
    outcome."""
    alg, book = run.algorithm, run.book
    if run.config.client_sampling.method != "all":
        return []  # which nodes a round samples is drawn as it comes: no plan to guess the end from
    ids = book.node_ids
    tallies, index = book.distinct_tallies()
    # Per node: what it will add, (observer, signature) → count, over a pending setup and the
    # remaining rounds, each round's own plan (PADPFL's uploads are due in some rounds only).
    adds = [Counter() for _ in ids]
    if alg.has_setup:
        for add, node, pending in zip(adds, ids.tolist(), (~book.logged(ids, SETUP_ROUND)).tolist()):
            for e in alg.setup_events(node) if pending else ():
                if e.kind == "privacy":
                    add[e.observer, e.signature] += e.count
    every = tuple(ids.tolist())
    server_plan = getattr(alg, "planned_server_events", None)
    position = {n: i for i, n in enumerate(every)}
    for r in range(run.rounds_done, alg.rounds):
        ctx = RoundContext(r, run.config.run.seed, len(ids), every)
        for e in (server_plan(run.state, ctx) or []) if server_plan is not None else ():
            if e.kind == "privacy":
                adds[position[e.node]][e.observer, e.signature] += e.count
        planned = planned_batch(alg, ids, ctx)
        if isinstance(planned, NodeEvents):
            for batch in planned.batches:
                if batch.kind == "privacy":
                    for e, positions in batch.groups():
                        for p in positions.tolist():
                            adds[p][e.observer, e.signature] += e.count
        else:
            for add, events in zip(adds, planned):
                for e in events:
                    if e.kind == "privacy":
                        add[e.observer, e.signature] += e.count
    guessed = {}
    for key in {(i, tuple(sorted(add.items()))) for i, add in zip(index.tolist(), adds)}:
        i, added = key
        tally = {obs: Counter(c) for obs, c in tallies[i].items()}
        for (observer, signature), count in added:
            tally.setdefault(observer, Counter())[signature] += count
        guessed[key] = tally
    return [c for tally in guessed.values() for c in tally.values()]


def _summary_rows(book: LedgerBook) -> np.ndarray:
    """The rows of the nodes the summary lists one by one: every node, or with client sampling the
    nodes that logged anything (the others, never sampled, are counted as ``idle_nodes``)."""
    active = book.active()
    return np.arange(len(book)) if active.all() else np.flatnonzero(active)


_SUMMARY_TOTALS = ("cost_units", "local_steps", "rounds", "rounds_straggled", "bytes_up", "bytes_down", "energy_j",
                   "compute_s", "mi_epsilon_nats")


#: The summary's figures a node's own report can confirm or raise (its ledger has no straggles).
_REPORTED_TOTALS = tuple(name for name in _SUMMARY_TOTALS if name != "rounds_straggled")


def _ledger_check(entry: dict[str, Any], reports: dict[int, Totals] | None, node: int) -> dict[str, Any]:
    """How a node's summary figures stand against its own ledger: ``ledger_check`` "local" (sim:
    the book is the nodes' ledger), "confirmed" (its report is at most every figure), "raised" (its
    report was higher in the figures of ``raised_by_node``, which the summary then shows: a ledger
    never under-counts), or "unconfirmed" (no report came: the node left before the run's end)."""
    if reports is None:
        return {"ledger_check": "local"}
    report = reports.get(node)
    if report is None:
        return {"ledger_check": "unconfirmed"}
    raised = {}
    for name in _REPORTED_TOTALS:
        mine = getattr(report, name)
        if mine > entry[name] * (1 + 1e-9) + 1e-12:  # sums of the same floats in another order
            raised[name] = mine
    return {"ledger_check": "raised" if raised else "confirmed", **raised,
            **({"raised_by_node": sorted(raised)} if raised else {})}


def privacy_headline(guarantee: str, nodes: dict[str, dict[str, Any]], delta: float, accountant: str,
                     tight_accountant: str | None = None) -> dict[str, Any]:
    """The summary's privacy figures: ``guarantee``, ``private`` and ``headline``, the one figure to
    quote (every surface reads it: testbed.reports.headline.quote): {measure, value, unit, by} where
    ``by`` names the accountant (the tight one's when it ran, the paper's ``paper_value`` beside it)
    or the mutual-information ledger; ``{"measure": "not private", "value": null}`` (ε = ∞) for a run
    without noise. Its ``observer`` and ``secrecy`` come from the guarantees (secrecy.quote_against)."""
    epsilon = max((n["epsilon"] for n in nodes.values()), default=0.0) if guarantee == "dp" else None
    mi = max((n["mi_epsilon_nats"] for n in nodes.values()), default=0.0) if guarantee == "mi_dp" else None
    if guarantee == "dp":
        tight = [n["epsilon_tight"] for n in nodes.values() if n.get("epsilon_tight") is not None]
        headline = {"measure": "epsilon", "value": epsilon, "unit": f"at delta {delta:g}", "by": accountant}
        if tight and tight_accountant is not None:
            headline.update(value=max(tight), by=tight_accountant, paper_value=epsilon, paper_by=accountant)
    elif guarantee == "mi_dp":
        headline = {"measure": "epsilon-MI-DP", "value": mi, "unit": "nats", "by": "mutual-information ledger"}
    else:
        headline = {"measure": "not private", "value": None, "unit": None, "by": None}
    return {"guarantee": guarantee, "private": guarantee != "none", "headline": headline}


def _server_noise(run: Run) -> dict[str, Any]:
    """privacy_guarantees' view of the server's noise: what keyed it, whose figures rest on it."""
    return {"server_randomness": run.server_randomness,
            "server_observers": frozenset(getattr(run.algorithm, "server_noise_observers", frozenset()))}


def _summary(run: Run) -> dict[str, Any]:
    config, budgets = run.config, run.budgets
    book = run.book
    tallies, index = book.distinct_tallies()
    by_observer = [epsilon_by_observer(budgets.accountant, tally, budgets.delta) for tally in tallies]
    rows = _summary_rows(book)
    columns = {name: book.column(name)[rows].tolist() for name in _SUMMARY_TOTALS}
    dp = run.guarantee == "dp"
    nodes = {}
    for row, (node, i) in enumerate(zip(book.node_ids[rows].tolist(), index[rows].tolist())):
        nodes[str(node)] = {
            # Not (ε, δ)-DP: ε is infinite, JSON null (the ledger's other releases, e.g. PADPFL's
            # noised scores beside unnoised models, bound nothing the run released).
            "epsilon": max(by_observer[i].values(), default=0.0) if dp else None,
            "epsilon_by_observer": dict(by_observer[i]) if dp else {},
            "epsilon_tight": None,  # filled in by the tight accountant's background job
            "delta": budgets.delta, **{name: col[row] for name, col in columns.items()},
        }
        nodes[str(node)].update(_ledger_check(nodes[str(node)], run.node_reports, node))
        nodes[str(node)]["source"] = charging.source(run.charged_on_ask, run.reported_rounds, node,
                                                     local=run.node_reports is None)
    randomness = node_randomness(book.node_ids[rows].tolist(), run.randomness)
    for node, kind in randomness.items():
        nodes[str(node)]["randomness"] = kind
    reg = registry.get(config.run.algorithm)
    stopped = run.stopped
    settings = run.algorithm.describe()
    summary = {
        "algorithm": config.run.algorithm,
        "mode": config.run.mode,
        "seed": config.run.seed,
        "status": run.status,
        "rounds": run.rounds_done,
        "task": "regression" if run.regression else "classification",
        "final": {k: run.metrics[k] for k in ("test_accuracy", "train_loss", "test_loss", "test_accuracy_pooled",
                                               "validation_accuracy")},
        "nodes": nodes,
        "idle_nodes": len(book) - len(rows),
        "budgets": {"epsilon": budgets.epsilon, "delta": budgets.delta, "accountant": budgets.accountant,
                    "cost_units": budgets.cost_units, "bytes": budgets.bytes, "energy_j": budgets.energy_j,
                    "mi_epsilon": budgets.mi_epsilon},
        "stopped": None if stopped is None else {"node": stopped.node, "budget": stopped.budget,
                                                  "would_be": stopped.would_be, "limit": stopped.limit},
        # Nodes that refused a round for their own budget (the figures they gave, checked as finite):
        # each was taken out of the later rounds, the run went on with the others.
        "refusals": [{"node": e.node, "round": r, "budget": e.budget, "would_be": e.would_be, "limit": e.limit}
                     for r, e in run.refusals],
        # What its ε rests on that the mechanism run does not make true (a paper's reproduction only).
        "assumptions": run.assumptions,
        "privacy": {"accountant": budgets.accountant, "tight_accountant": config.privacy.tight_accountant,
                    "epsilon_target": reg.epsilon_target(assemble.algorithm_sections(config, reg)),
                    **privacy_headline(run.guarantee, nodes, budgets.delta, budgets.accountant)},
        # Against whom each figure holds: per observer, whether its noise is secret from it.
        "privacy_guarantees": privacy_guarantees(run.guarantee, nodes, randomness, budgets.delta, budgets.accountant,
                                                 resumed=len(run.sessions) > 1, **_server_noise(run)),
        "costs": {"source": _cost_source(run.cost_sources), "profile": config.nodes.profile},
        "stragglers": {"model": config.stragglers.model,
                       "rounds_straggled": int(book.column("rounds_straggled").sum())},
        "client_sampling": config.client_sampling.describe(config.data.num_nodes),
        "algorithm_settings": settings,
        "profile": config.nodes.profile,
        "name": config.run.name,
        "dataset": config.data.dataset,
        "model": config.model.kind,
        "session": run.session,
        # Every session that asked a round of the run (one per `testbed run` and `--resume`), oldest first.
        "sessions": run.sessions,
        "broker": run.broker,
        "links": run.links,
        "authentication": run.authentication,
        # The rounds' seconds (none if the run failed before them), and the set-up's before them.
        "wall_s": time.monotonic() - run.wall_start if run.startup.end is not None else 0.0,
        "setup_s": run.startup.seconds(),
        "run_dir": str(run.directory.path),
    }
    summary["privacy"]["headline"] = quote_against(summary["privacy"]["headline"], summary["privacy_guarantees"])
    if "topology" in settings:  # who heard whom, for an algorithm whose settings describe its graph
        summary["topology"] = settings["topology"]
    if run.failure is not None:
        summary["failure"] = run.failure
    if run.plan is not None:
        summary["plan"] = run.plan
    return summary
