"""Runs an experiment as a short pipeline of named stages:

1. :func:`load` — the data this run holds and the model, once the run is known to fit this machine
   (testbed.resources: memory, sockets), so an impossible one is refused before any allocation;
2. :func:`plan` — the algorithm's planning stage, if it has one (DP-PASGD's ``tau = "plan"``);
3. :func:`open_run` — the run directory (new, or a killed run's to resume);
4. :func:`build_nodes` — the nodes: in this process (``sim``) or over MQTT;
5. :func:`run_rounds` — setup, then each round: budgets first, emulated stragglers, the nodes'
   step, the server step, ledger, checkpoint and metrics;
6. :func:`finish` — summary.json (also when a stage failed), figures, the tight accountant.

The rounds loop is the same whatever moves the messages: a :class:`testbed.nodes_api.Nodes`
answers each round with a :class:`~testbed.nodes_api.RoundOutcome`.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from testbed.algorithms import registry
from testbed.algorithms.contract import SETUP_ROUND, Algorithm, RoundContext, State, WithSetup
from testbed.assemble import load_evaluation_data, load_run_data, model_for
from testbed.budgets import Budgets, Exceeded, budgets_from_config
from testbed.client_sampling import sample_clients
from testbed.config import Config, to_toml
from testbed.data.federated import FederatedData, Split
from testbed.data.lazy import LazyFederatedData
from testbed.errors import ConfigError
from testbed.ledger import Event, LedgerWriter, NodeLedger, StraggleEvent
from testbed.models import Model
from testbed.nodes_api import Nodes, RoundOutcome
from testbed.privacy.accountants import BackgroundEpsilons, epsilon_by_observer, worst_epsilon
from testbed.progress import Progress
from testbed.resources import check_fits
from testbed.results import RunDirectory
from testbed.rng import GLOBAL, Purpose, stream
from testbed.threads import limit_blas_threads

if TYPE_CHECKING:
    from testbed.plots import BackgroundFigures

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RunResult:
    run_dir: Path
    summary: dict[str, Any]


def per_node_mean(values: np.ndarray, split: Split) -> np.ndarray:
    """Mean of per-sample ``values`` over each node's rows; (N_total,) → (M,)."""
    sums = np.add.reduceat(values.astype(np.float64), split.offsets[:-1]) if len(values) else np.zeros(0)
    return sums / np.maximum(split.sizes, 1)


def evaluate(model: Model, params: np.ndarray, data: FederatedData) -> dict[str, float]:
    """Training loss of eq. (4) (mean over nodes of each node's mean loss) and accuracies (mean over
    nodes of each node's accuracy, as the paper reports; pooled over all test samples beside it).
    On float32 features (data.dtype) in float32: a float64 model would copy them all to float64."""
    if data.train.x.dtype == np.float32:
        params = np.asarray(params, dtype=np.float32)
    train_loss, _ = model.loss_and_correct(params, data.train.x, data.train.y)
    _, test_correct = model.loss_and_correct(params, data.test.x, data.test.y)
    _, val_correct = model.loss_and_correct(params, data.validation.x, data.validation.y)
    return {
        "train_loss": float(per_node_mean(train_loss, data.train).mean()),
        "test_accuracy": float(per_node_mean(test_correct, data.test).mean()),
        "test_accuracy_pooled": float(test_correct.mean()),
        "validation_accuracy": float(per_node_mean(val_correct, data.validation).mean()),
    }


def _evaluate(run: "Run") -> None:
    run.metrics = evaluate(run.model, run.algorithm.eval_params(run.state), run.eval_data)
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
    ledgers: list[NodeLedger]
    directory: RunDirectory
    state: State
    plan: dict | None = None
    rounds_done: int = 0
    status: str = "completed"
    stopped: Exceeded | None = None
    failure: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    evaluated_at: int = -1  # rounds done when ``metrics`` were measured
    eval_data: FederatedData | None = None  # the evaluated nodes' rows (output.eval_nodes); set by run_experiment
    wall_start: float = field(default_factory=time.monotonic)


def load(config: Config) -> tuple[FederatedData | LazyFederatedData, Model]:
    """Stage 1: every node's data, or only its layout when the nodes are lazy (client sampling in
    sim, testbed.assemble.holds_lazily), and the model; first, refuse a run this machine cannot hold
    (one line, before anything is allocated)."""
    check_fits(config)
    data = load_run_data(config)
    return data, model_for(config.model, data, config.run.seed)


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


def open_run(config: Config, out_dir: Path | None, resume: bool, algorithm: Algorithm, model: Model,
             ledgers: list[NodeLedger]) -> tuple[RunDirectory, int, State]:
    """Stage 3: a new run directory, or a killed run's, trusted only after it is checked (its
    checkpoint against the algorithm's state, its files against the checkpoint's marks), with its
    ledger read back."""
    if resume:
        directory = RunDirectory.reopen(out_dir, expected=algorithm_state_spec(algorithm), max_rounds=algorithm.rounds,
                                        nodes={led.node for led in ledgers}, sync=config.output.sync)
        for event in directory.ledger_events():
            ledgers[event.node].extend([event])
        return directory, directory.resumed.rounds_done, directory.resumed.state
    directory = RunDirectory(out_dir or default_run_dir(config), sync=config.output.sync)
    directory.write_config(to_toml(config))
    LedgerWriter(directory.ledger_path).close()  # a run that fails before round 1 has an empty ledger
    params0 = model.init(stream(config.run.seed, GLOBAL, -1, Purpose.INIT))
    return directory, 0, algorithm.init_state(params0)


def algorithm_state_spec(algorithm: Algorithm) -> dict:
    """name → (shape, dtype) of the algorithm's whole state, as a checkpoint must hold it."""
    return {name: (spec.shape, np.dtype(spec.dtype)) for name, spec in algorithm.state_spec().items()}


def build_nodes(config: Config, algorithm: Algorithm, data: FederatedData | LazyFederatedData, quiet: bool) -> Nodes:
    """Stage 4: the run's nodes, however they are reached."""
    if config.run.mode == "mqtt":
        from testbed.coordinator import MqttNodes

        return MqttNodes(config.mqtt, config.nodes, to_toml(config), list(data.node_ids), algorithm,
                         seed=config.run.seed, quiet=quiet)
    from testbed.sim_nodes import SimNodes

    return SimNodes(algorithm, data, config.run.seed, config.nodes.profile, mcu_nodes=config.nodes.mcu,
                    mcu_profile=config.nodes.mcu_profile)


def run_experiment(config: Config, out_dir: Path | None = None, quiet: bool = False,
                   resume: bool = False) -> RunResult:
    """Run ``config`` to completion or to the first budget a node would break; write RUN_DIR.

    With ``resume``, ``out_dir`` is a run that was killed: it continues after the last round whose
    state was saved; the ledger keeps everything already spent, and a round re-run after the kill
    (same seed, same streams, the same values released again) is not charged twice.
    """
    wall_start = time.monotonic()
    limit_blas_threads(config.run.blas_threads)
    data, model = load(config)
    eval_data = load_evaluation_data(config, data)
    # Planning estimates constants from rows: the evaluated nodes' when the nodes are lazy.
    config, planned = plan(config, model, eval_data if isinstance(data, LazyFederatedData) else data)
    algorithm = registry.build(config, model, data)
    check_accountants(config, algorithm, list(data.node_ids))
    ledgers = [NodeLedger(node) for node in data.node_ids]
    directory, rounds_done, state = open_run(config, out_dir, resume, algorithm, model, ledgers)
    run = Run(config, data, model, algorithm, budgets_from_config(config.budget, config.privacy), ledgers,
              directory, state, planned, rounds_done, wall_start=wall_start, eval_data=eval_data)
    _evaluate(run)
    tight = config.privacy.tight_accountant
    tight_job = None
    if tight != "none":
        tight_job = BackgroundEpsilons(tight, run.budgets.delta)
        tight_job.guess(_planned_tallies(run))
    figures_job = None
    if config.output.figures:
        from testbed.plots import BackgroundFigures

        figures_job = BackgroundFigures()
    nodes = None
    try:
        nodes = build_nodes(config, algorithm, data, quiet)
        run_rounds(run, nodes, quiet)
    except BaseException as exc:
        run.status, run.failure = "failed", f"{type(exc).__name__}: {exc}"
        for job in (tight_job, figures_job):
            if job is not None:
                job.close()
        tight_job = figures_job = None
        raise
    finally:
        if nodes is not None:
            try:
                nodes.close(run.status)
            except Exception as exc:  # the summary must still be written
                run.status, run.failure = "failed", f"closing the nodes: {type(exc).__name__}: {exc}"
        summary = finish(run, tight_job, figures_job)
    return RunResult(directory.path, summary)


def run_rounds(run: Run, nodes: Nodes, quiet: bool) -> None:
    """Stage 5: setup (once), then the rounds, until done or a budget would break."""
    alg, config = run.algorithm, run.config
    ledger_file = LedgerWriter(run.directory.ledger_path, sync=run.config.output.sync)
    progress = Progress(alg.rounds, enabled=not quiet, budgets=run.budgets)
    try:
        if alg.has_setup and run.rounds_done == 0 and not any(led.has_round(SETUP_ROUND) for led in run.ledgers):
            assert isinstance(alg, WithSetup)
            outcome = nodes.setup(run.state)
            _charge(run, outcome, ledger_file)
            server = alg.server_setup(run.state, outcome.result, outcome.ctx)
            run.state = server.state
            _charge_server(run, server.events, nodes, ledger_file)
            run.directory.save_checkpoint(0, run.state, ledger_file.mark())
        every = [led.node for led in run.ledgers]
        every_ids = np.asarray(every, dtype=np.int64)  # converted once, not every round
        for r in range(run.rounds_done, alg.rounds):
            sampled = sample_clients(config.client_sampling, seed=config.run.seed, round_index=r, node_ids=every_ids)
            participants = every if sampled is None else list(sampled)
            excluded = emulated_stragglers(config, alg, r, participants)
            expected = tuple(n for n in participants if n not in excluded)
            probe = RoundContext(r, config.run.seed, config.data.num_nodes, expected, sampled=sampled)
            run.stopped = _first_exceeded(run.budgets, run.ledgers, alg, probe)
            if run.stopped is not None:
                run.status = "stopped_budget"
                break
            outcome = nodes.round(run.state, r, excluded, sampled)
            if outcome.refused:
                node, budget, would_be, limit = outcome.refused[0]
                run.stopped, run.status = Exceeded(node, budget, would_be, limit), "stopped_budget"
                _charge(run, outcome, ledger_file)
                break
            _charge(run, outcome, ledger_file)
            server = alg.server_step(run.state, outcome.result, outcome.ctx)
            run.state = server.state
            _charge_server(run, server.events, nodes, ledger_file)
            run.rounds_done = r + 1
            evaluated = run.rounds_done % config.output.eval_every == 0 or run.rounds_done == alg.rounds
            if evaluated:
                _evaluate(run)
            eps = max(worst_epsilon(run.budgets.accountant, led.by_observer, run.budgets.delta) for led in run.ledgers)
            measured = run.metrics if evaluated else dict.fromkeys(run.metrics, "")  # output.eval_every: blanks
            row = {
                "round": run.rounds_done, "local_steps": max(led.totals.local_steps for led in run.ledgers),
                **measured, "cost_units": max(led.totals.cost_units for led in run.ledgers), "epsilon": eps,
                "bytes_total": max(led.totals.bytes_total for led in run.ledgers),
                "stragglers": len(outcome.ctx.stragglers), "wall_s": round(time.monotonic() - run.wall_start, 4),
            }
            run.directory.append_metrics(row)
            # After the round's metrics row: the checkpoint marks both files (see save_checkpoint).
            run.directory.save_checkpoint(run.rounds_done, run.state, ledger_file.mark())
            progress.update(run.rounds_done, run.metrics["train_loss"], eps, row, run.ledgers)
    finally:
        progress.close()
        ledger_file.close()


def emulated_stragglers(config: Config, algorithm: Algorithm, round_index: int, node_ids: list[int]) -> frozenset[int]:
    """The nodes the ``[stragglers]`` model takes out of the round (from each node's own stream)."""
    section = config.stragglers
    if section.model == "none":
        return frozenset()
    from testbed.stragglers import draw_stragglers

    round_time_s = None
    if section.model == "deadline":
        from nodes.stragglers import round_times_s

        ctx = RoundContext(round_index, config.run.seed, config.data.num_nodes, tuple(node_ids))
        round_time_s = round_times_s(config.nodes.profile, algorithm, ctx)
    return draw_stragglers(section, seed=config.run.seed, round_index=round_index, node_ids=node_ids,
                           round_time_s=round_time_s)


def _charge(run: Run, outcome: RoundOutcome, ledger_file: LedgerWriter) -> None:
    """Log what each node released (its own events; a round re-run after a kill is not charged
    twice) and who straggled, in one write."""
    r = outcome.ctx.round_index
    fresh: list[Event] = []
    for (node, round_index), events in sorted(outcome.charged.items()):
        if not run.ledgers[node].has_round(round_index):
            run.ledgers[node].extend(events)
            fresh.extend(events)
    for node, reason in sorted(outcome.straggled.items()):
        event = StraggleEvent(node, r, reason)
        run.ledgers[node].extend([event])
        fresh.append(event)
    ledger_file.write(fresh)


def _charge_server(run: Run, events: list[Event], nodes: Nodes, ledger_file: LedgerWriter) -> None:
    """Events the server issued on nodes' behalf: into their ledgers here and, with their next
    round, to the nodes themselves."""
    fresh = [e for e in events if not run.ledgers[e.node].has_server_events(e.round)]
    for event in fresh:
        run.ledgers[event.node].extend([event])
    ledger_file.write(fresh)
    if events:
        nodes.deliver(events)


def _first_exceeded(budgets: Budgets, ledgers: list[NodeLedger], alg: Algorithm, ctx: RoundContext) -> Exceeded | None:
    if not budgets.any:
        return None
    for ledger in ledgers:
        if ledger.node not in ctx.expected:
            continue
        exceeded = budgets.would_exceed(ledger, alg.planned_events(ledger.node, ctx))
        if exceeded is not None:
            return exceeded
    return None


def finish(run: Run, tight_job: BackgroundEpsilons | None, figures_job: "BackgroundFigures | None" = None) -> dict[str, Any]:
    """Stage 6: summary.json at once (a run killed from here on still has it), the final model,
    figures (drawn by a child process, while the tight accountant runs in another), then the tight
    accountant's ε."""
    if run.evaluated_at != run.rounds_done and run.status != "failed":  # a budget stop between evaluations
        _evaluate(run)
    summary = _summary(run)
    run.directory.write_summary(summary)
    run.directory.close()
    if run.status == "failed":
        for job in (tight_job, figures_job):
            if job is not None:
                job.close()
        return summary
    np.save(run.directory.path / "final_params.npy", run.algorithm.eval_params(run.state))
    if figures_job is not None:
        figures_job.draw("progress", run.directory.path)
    if tight_job is not None:
        keys = [(led.node, observer) for led in run.ledgers for observer in sorted(led.by_observer)]
        epsilons = tight_job.result([run.ledgers[node].by_observer[observer] for node, observer in keys])
        tight: dict[str, dict[str, float]] = {}
        for (node, observer), eps in zip(keys, epsilons):
            tight.setdefault(str(node), {})[observer] = eps
        for node, entry in summary["nodes"].items():
            by = tight.get(node, {})
            entry["epsilon_tight"] = max(by.values(), default=0.0)
            entry["epsilon_tight_by_observer"] = by
        run.directory.write_summary(summary)
    if figures_job is not None:
        figures_job.draw("epsilon", run.directory.path)
        problem = figures_job.wait()
        if problem is not None:
            log.warning("%s: figures not drawn: %s (testbed report redraws them)", run.directory.path, problem)
    return summary


def _planned_tallies(run: Run) -> list[Counter]:
    """Each node's per-observer privacy tallies at the end of the run if every remaining round
    charges what the next one plans (and a pending setup its events): the tight accountant's guess."""
    alg, first = run.algorithm, run.rounds_done
    remaining = alg.rounds - first
    ctx = RoundContext(first, run.config.run.seed, len(run.ledgers), tuple(led.node for led in run.ledgers))
    guessed = []
    for led in run.ledgers:
        setup = alg.has_setup and not led.has_round(SETUP_ROUND)
        _, tallies = led.projected(alg.setup_events(led.node) if setup else ())
        if remaining > 0:
            _, one_round = NodeLedger(led.node).projected(alg.planned_events(led.node, ctx))
            for observer, tally in one_round.items():
                tallies.setdefault(observer, Counter()).update({sig: n * remaining for sig, n in tally.items()})
        guessed += tallies.values()
    return guessed


def _summary(run: Run) -> dict[str, Any]:
    config, budgets = run.config, run.budgets
    nodes = {}
    for led in run.ledgers:
        t = led.totals
        by_observer = epsilon_by_observer(budgets.accountant, led.by_observer, budgets.delta)
        nodes[str(led.node)] = {
            "epsilon": max(by_observer.values(), default=0.0),
            "epsilon_by_observer": by_observer,
            "epsilon_tight": None,  # filled in by the tight accountant's background job
            "delta": budgets.delta, "cost_units": t.cost_units, "local_steps": t.local_steps,
            "rounds": t.rounds, "rounds_straggled": t.rounds_straggled, "bytes_up": t.bytes_up,
            "bytes_down": t.bytes_down, "energy_j": t.energy_j, "compute_s": t.compute_s,
            "mi_epsilon_nats": t.mi_epsilon_nats,
        }
    reg = registry.get(config.run.algorithm)
    stopped = run.stopped
    summary = {
        "algorithm": config.run.algorithm,
        "mode": config.run.mode,
        "seed": config.run.seed,
        "status": run.status,
        "rounds": run.rounds_done,
        "final": {k: run.metrics[k] for k in ("test_accuracy", "train_loss", "test_accuracy_pooled",
                                               "validation_accuracy")},
        "nodes": nodes,
        "budgets": {"epsilon": budgets.epsilon, "delta": budgets.delta, "accountant": budgets.accountant,
                    "cost_units": budgets.cost_units, "bytes": budgets.bytes, "energy_j": budgets.energy_j,
                    "mi_epsilon": budgets.mi_epsilon},
        "stopped": None if stopped is None else {"node": stopped.node, "budget": stopped.budget,
                                                  "would_be": stopped.would_be, "limit": stopped.limit},
        "privacy": {"accountant": budgets.accountant, "tight_accountant": config.privacy.tight_accountant,
                    "epsilon_target": reg.epsilon_target(registry.sections_of(config, reg)),
                    "epsilon_headline": max((n["epsilon"] for n in nodes.values()), default=0.0)},
        "stragglers": {"model": config.stragglers.model,
                       "rounds_straggled": sum(led.totals.rounds_straggled for led in run.ledgers)},
        "client_sampling": config.client_sampling.describe(config.data.num_nodes),
        "algorithm_settings": run.algorithm.describe(),
        "profile": config.nodes.profile,
        "name": config.run.name,
        "dataset": config.data.dataset,
        "model": config.model.kind,
        "wall_s": time.monotonic() - run.wall_start,
        "run_dir": str(run.directory.path),
    }
    if run.failure is not None:
        summary["failure"] = run.failure
    if run.plan is not None:
        summary["plan"] = run.plan
    return summary
