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
answers each round with a :class:`~testbed.orchestration.nodes_api.RoundOutcome`. What the stages
share is one :class:`testbed.orchestration.run_state.Run`; what a round charges is
testbed.orchestration.charging's to say, the model's figures testbed.orchestration.model_evaluation's,
summary.json testbed.orchestration.run_summary's.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import logging
import math
import time
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from testbed.assembly import assemble, inherited

from testbed.accounting.book import LedgerBook
from testbed.accounting.budgets import Budgets, Exceeded, budgets_from_config
from testbed.algorithms import registry
from testbed.algorithms.contract import SETUP_ROUND, Algorithm, RoundContext, State, WithSetup, planned_batch
from testbed.assembly.assemble import load_evaluation_data, load_run_data, model_for
from testbed.assembly.config import Config, to_toml
from testbed.assembly.resources import check_fits
from testbed.data.federated import FederatedData
from testbed.data.lazy import LazyFederatedData
from testbed.errors import ConfigError
from testbed.learning.models import Model
from testbed.ledger.events import Event
from testbed.ledger.files import LedgerWriter
from testbed.mqtt.brokers import registry as brokers
from testbed.orchestration import charging, run_summary
from testbed.orchestration.model_evaluation import ACCURACIES, evaluate_run, is_regression
from testbed.orchestration.nodes_api import Nodes, RoundOutcome
from testbed.orchestration.run_state import Run
from testbed.privacy.accountants.background import BackgroundEpsilons
from testbed.privacy.secrecy import node_randomness, privacy_guarantees, quote_against
from testbed.reports import tracking
from testbed.reports.asked import AskedLog
from testbed.reports.progress import Progress
from testbed.reports.refusals import RefusalLog
from testbed.reports.results import RunDirectory
from testbed.reports.startup import Startup
from testbed.reports.tracking.feed import Tracking
from testbed.rounds.client_sampling import sample_clients
from testbed.rounds.stragglers import StragglerDraws
from testbed.streams.node_secret import SERVER_KEY_FILE, load_or_make
from testbed.streams.rng import GLOBAL, Purpose, stream
from testbed.util import parallel
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


def default_run_dir(config: Config) -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S-%f")
    return Path(config.output.dir) / f"{config.run.name}-{stamp}-s{config.run.seed}"


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
    that run again) into ``past_mark`` by round, for :func:`testbed.orchestration.charging.charge_round`
    to take when their round runs; into ``asked``, what :func:`testbed.orchestration.charging.earlier_asks`
    finds its earlier sessions asked and the ledger lacks."""
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
                run_dir: Path | None = None, evaluation: tuple[Model, FederatedData] | None = None) -> Nodes:
    """Stage 4: the run's nodes, however they are reached. Over MQTT, the coordinator's secret for
    the server's noise is ``run_dir``'s (made there, mode 0600, if a node has a secret): kept across
    a resume, so a round run again broadcasts the same noise, charged once. ``evaluation``: the
    run's model and evaluated rows, which the sim's node workers score beside their steps."""
    if config.run.mode == "mqtt":
        from testbed.orchestration.coordinator import MqttNodes

        inherited.offer(config, data)  # the rows its forked hosts' nodes take, made once
        return MqttNodes(config.mqtt, config.nodes, to_toml(config), list(data.node_ids), algorithm,
                         seed=config.run.seed, quiet=quiet, links=config.links,
                         server_secret=None if run_dir is None else functools.partial(load_or_make, run_dir,
                                                                                       SERVER_KEY_FILE))
    from testbed.orchestration.sim_nodes import SimNodes

    return SimNodes(algorithm, data, config.run.seed, config.nodes.profile, mcu_nodes=config.nodes.mcu,
                    mcu_profile=config.nodes.mcu_profile, workers=config.run.workers, evaluation=evaluation)


def run_experiment(config: Config, out_dir: Path | None = None, quiet: bool = False,
                   resume: bool = False) -> RunResult:
    """Run ``config`` to completion or to the first budget a node would break; write RUN_DIR.

    With ``resume``, ``out_dir`` is a run that was killed: it continues after the last round whose
    state was saved; the ledger keeps everything already spent, and a round re-run after the kill
    (same seed, same streams, the same values released again) is not charged twice.
    """
    startup = Startup(enabled=not quiet)
    limit_blas_threads(config.run.blas_threads)
    parallel.set_threads(config.run.threads)
    tracking.check_installed(config)
    # The helper processes start first: they import dp-accounting and matplotlib (a second each)
    # on the other core while the data are built and the rounds run.
    tight_job = figures_job = None
    if config.privacy.tight_accountant != "none":
        # An experiment whose planned tallies' ε is all cached starts no helper (epsilon_cache).
        tight_job = BackgroundEpsilons(config.privacy.tight_accountant, config.privacy.delta,
                                       config.model_dump(mode="json"))
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
            evaluate_run(run)
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
            nodes = build_nodes(config, algorithm, data, quiet, directory.path, (model, eval_data))
        run.scorer = nodes if hasattr(nodes, "score_rows") else None  # the sim's node workers, when they run
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
                charging.charge_closing(run, nodes.close(run.status), nodes)
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

    def log_refusal(round_index: int, refusal: Exceeded) -> None:
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
            evaluate_run(run)
        book = run.book
        # No noise: ε is infinite (metrics.csv writes inf), whatever events the ledger holds.
        eps = book.max_epsilon(run.budgets.accountant, run.budgets.delta) if run.guarantee == "dp" else math.inf
        # output.eval_every: blanks between evaluations; a regression's accuracies are always blank.
        measured = {k: "" if not evaluated or run.metrics[k] is None else run.metrics[k]
                    for k in ("train_loss", *ACCURACIES)}
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
                charging.charge_round(run, outcome, ledger_file, nodes)
                server = alg.server_setup(run.state, outcome.result, outcome.ctx)
                run.state = server.state
                charging.charge_server(run, server.events, nodes, ledger_file)
                cadence.save(0, save)
        if tight_job is not None:
            tight_job.guess(run_summary.planned_tallies(run))
        every = run.book.node_ids.tolist()
        every_ids = run.book.node_ids  # as an array once, not every round
        # The run's nodes that refused, kept as refusals come: a round's work over the nodes is
        # O(sampled) in Python, never a set of all N nodes (a million nodes: 60 ms a round).
        refused = _Refused(every_ids, run.refusals)
        straggler_draws = StragglerDraws(config.stragglers, config.run.seed)
        run.startup.done()
        run.wall_start = time.monotonic()  # the rounds' own clock from here
        progress = Progress(alg.rounds, enabled=not quiet, budgets=run.budgets, guarantee=run.guarantee)
        for r in range(run.rounds_done, alg.rounds):
            sampled = sample_clients(config.client_sampling, seed=config.run.seed, round_index=r, node_ids=every_ids)
            participants = every if sampled is None else list(sampled)
            withdrawn = refused.among(sampled)
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
            outcome = _withdraw(run, outcome, withdrawn, log_refusal)
            charging.charge_round(run, outcome, ledger_file, nodes)
            if refused.everyone():  # nobody left: the last refusal stops it
                run.stopped, run.status = run.refusals[-1][1], "stopped_budget"
                break
            server = alg.server_step(run.state, outcome.result, outcome.ctx)
            run.state = server.state
            charging.charge_server(run, server.events, nodes, ledger_file)
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


class _Refused:
    """The run's nodes that refused a round, from ``refusals`` (``run.refusals``, read again as it
    grows): a node counted once however many refusals name it, a node outside the run not at all.
    Kept as refusals come, so a round costs O(its sampled nodes), never a set of all N.

    Example::

        >>> refusals = []
        >>> r = _Refused(np.arange(3), refusals)
        >>> refusals += [(0, Exceeded(1, "epsilon", 2.0, 1.0)), (1, Exceeded(1, "epsilon", 2.0, 1.0))]
        >>> sorted(r.among((0, 1))), sorted(r.among(None)), r.everyone()
        ([1], [1], False)
    """

    def __init__(self, node_ids: np.ndarray, refusals: list[tuple[int, Exceeded]]):
        self._ids, self._refusals = node_ids, refusals
        self._nodes: set[int] = set()
        self._seen = 0

    def _take(self) -> set[int]:
        for _, refusal in self._refusals[self._seen:]:
            at = int(np.searchsorted(self._ids, refusal.node))
            if at < len(self._ids) and self._ids[at] == refusal.node:
                self._nodes.add(refusal.node)
        self._seen = len(self._refusals)
        return self._nodes

    def among(self, sampled: tuple[int, ...] | None) -> frozenset[int]:
        """Those of ``sampled`` (None: every node) that refused before: asked nothing more."""
        nodes = self._take()
        if sampled is None or not nodes:
            return frozenset(nodes)
        return frozenset(n for n in sampled if n in nodes)

    def everyone(self) -> bool:
        """Whether every node of the run refused."""
        return len(self._take()) == len(self._ids)


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
        evaluate_run(run)
    summary = run_summary.summary(run)
    run.directory.write_summary(summary)
    if run.status == "failed":
        for job in (tight_job, figures_job):
            if job is not None:
                job.close()
        return summary
    np.save(run.directory.path / "final_params.npy", run.algorithm.eval_params(run.state))
    if figures_job is not None:
        figures_job.draw("progress", run.directory.path)
        figures_job.draw("cost", run.directory.path)
    if tight_job is not None:
        tallies, index = run.book.distinct_tallies()
        keys = [(i, observer) for i, tally in enumerate(tallies) for observer in sorted(tally)]
        epsilons = tight_job.result([tallies[i][observer] for i, observer in keys])
        tight: list[dict[str, float]] = [{} for _ in tallies]
        for (i, observer), eps in zip(keys, epsilons):
            tight[i][observer] = eps
        if run.guarantee == "dp":  # not private: the tight ε of the other releases would mislead
            for entry, i in zip(summary["nodes"].values(), index[run_summary.summary_rows(run.book)].tolist()):
                entry["epsilon_tight"] = max(tight[i].values(), default=0.0)
                entry["epsilon_tight_by_observer"] = tight[i]
            summary["privacy"].update(run_summary.privacy_headline(run.guarantee, summary["nodes"], run.budgets.delta,
                                                       run.budgets.accountant, run.config.privacy.tight_accountant))
            summary["privacy_guarantees"] = privacy_guarantees(
                run.guarantee, summary["nodes"], node_randomness(map(int, summary["nodes"]), run.randomness),
                run.budgets.delta, run.budgets.accountant, run.config.privacy.tight_accountant,
                resumed=len(run.sessions) > 1, **run_summary.server_noise(run))
            summary["privacy"]["headline"] = quote_against(summary["privacy"]["headline"], summary["privacy_guarantees"])
        run.directory.write_summary(summary)
    if figures_job is not None:
        figures_job.draw("epsilon", run.directory.path)
        problem = figures_job.wait()
        if problem is not None:
            log.warning("%s: figures not drawn: %s (testbed report redraws them)", run.directory.path, problem)
    return summary


