"""Runs an experiment: the rounds loop, budgets before every round, metrics and ledger after it.

The loop is the same whatever moves the messages; in ``sim`` every node's step runs at once on
stacked arrays in this process.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np

from nodes.costs import NodeCosts
from testbed.algorithms import Algorithm, NodeOutput, RoundResult, from_config
from testbed.assemble import load_data, model_for
from testbed.budgets import Budgets, Exceeded, budgets_from_config
from testbed.config import Config, to_toml
from testbed.data.federated import FederatedData, Split
from testbed.ledger import LedgerWriter, NodeLedger
from testbed.models import Model
from testbed.planning.resolve import resolve_plan
from testbed.privacy.accountants import BackgroundEpsilons, epsilon as account
from testbed.progress import Progress
from testbed.results import RunDirectory, state_spec
from testbed.rng import GLOBAL, Purpose, stream


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
    nodes of each node's accuracy, as the paper reports; pooled over all test samples beside it)."""
    train_loss, _ = model.loss_and_correct(params, data.train.x, data.train.y)
    _, test_correct = model.loss_and_correct(params, data.test.x, data.test.y)
    _, val_correct = model.loss_and_correct(params, data.validation.x, data.validation.y)
    return {
        "train_loss": float(per_node_mean(train_loss, data.train).mean()),
        "test_accuracy": float(per_node_mean(test_correct, data.test).mean()),
        "test_accuracy_pooled": float(test_correct.mean()),
        "validation_accuracy": float(per_node_mean(val_correct, data.validation).mean()),
    }


def default_run_dir(config: Config) -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S-%f")
    return Path(config.output.dir) / f"{config.run.name}-{stamp}-s{config.run.seed}"


class SimNodes:
    """Every node in this process, stepped at once on stacked arrays (``run.mode = "sim"``); each
    node is charged an equal share of the step's CPU time, through its device profile's model."""

    def __init__(self, alg: Algorithm, data: FederatedData, seed: int, costs: NodeCosts):
        self.alg, self.data, self.seed, self.costs = alg, data, seed, costs
        self.node_ids = list(data.node_ids)

    def step(self, state: Any, round_index: int) -> RoundResult:
        start = time.process_time()
        out = self.alg.node_step(state, self.data.train, self.node_ids, round_index, self.seed)
        share = (time.process_time() - start) / len(self.node_ids)
        events = [self.costs.charge_modelled(e, share) for e in out.events]
        return RoundResult(NodeOutput(out.node_ids, out.params, events))

    def close(self, status: str) -> None:
        self.costs.close()


def run_experiment(config: Config, out_dir: Path | None = None, quiet: bool = False,
                   resume: bool = False) -> RunResult:
    """Run ``config`` to completion or to the first budget a node would break; write RUN_DIR.

    With ``resume``, ``out_dir`` is a run that was killed: it continues after the last round whose
    state was saved; the ledger keeps everything already spent, and a round re-run after the kill
    (same seed, same streams, the same values released again) is not charged twice.
    """
    wall_start = time.monotonic()
    data = load_data(config)
    model = model_for(config, data)
    config, plan = resolve_plan(config, model, data)  # dp_pasgd.tau = "plan" → the planned τ, K, σ
    alg = from_config(config, model, data)
    budgets = budgets_from_config(config)
    ledgers = [NodeLedger(node) for node in data.node_ids]

    if resume:
        # Checked against what the algorithm's state looks like; refused in one line if damaged.
        init = alg.init_state(model.init(stream(config.run.seed, GLOBAL, -1, Purpose.INIT)))
        run = RunDirectory.reopen(out_dir, expected=state_spec({"state": init}), max_rounds=alg.rounds,
                                  nodes=set(data.node_ids))
        for event in run.ledger_events():
            ledgers[event.node].extend([event])
        rounds_done, state = run.resumed.rounds_done, run.resumed.state["state"]
    else:
        run = RunDirectory(out_dir or default_run_dir(config))
        run.write_config(to_toml(config))
        rounds_done, state = 0, alg.init_state(model.init(stream(config.run.seed, GLOBAL, -1, Purpose.INIT)))
    ledger_file = LedgerWriter(run.ledger_path)
    progress = Progress(alg.rounds, enabled=not quiet)
    status, stopped, metrics = "completed", None, evaluate(model, alg.eval_params(state), data)
    nodes = None
    tight = config.privacy.tight_accountant
    tight_job = None if tight == "none" else BackgroundEpsilons(tight)
    try:
        if config.run.mode == "mqtt":
            from testbed.mqtt.coordinator import MqttNodes

            nodes = MqttNodes(config, to_toml(config), data.node_ids, quiet=quiet, algorithm=alg)
        else:
            nodes = SimNodes(alg, data, config.run.seed, NodeCosts(config.nodes.profile, "model"))
        for r in range(rounds_done, alg.rounds):
            stopped = _first_exceeded(budgets, ledgers, alg, r)
            if stopped is not None:
                status = "stopped_budget"
                break
            result = nodes.step(state, r)
            if result.refused:
                node, budget, would_be, limit = result.refused[0]
                stopped, status = Exceeded(node, budget, would_be, limit), "stopped_budget"
                break
            for node, events in zip(result.output.node_ids, result.output.events):
                if not ledgers[node].has_round(r):
                    ledgers[node].extend(events)
                    ledger_file.write(events)
            if result.state is not None:  # the nodes finished the round themselves
                state = result.state
            elif result.output.node_ids:  # nobody answered: the model stays as it was
                state = alg.combine(result.output, state)
            rounds_done = r + 1
            metrics = evaluate(model, alg.eval_params(state), data)
            eps = max(account(budgets.accountant, led.privacy, budgets.delta) for led in ledgers)
            run.append_metrics({
                "round": rounds_done, "local_steps": max(led.totals.local_steps for led in ledgers), **metrics,
                "cost_units": max(led.totals.cost_units for led in ledgers), "epsilon": eps,
                "bytes_total": max(led.totals.bytes_total for led in ledgers),
                "stragglers": len(result.stragglers), "wall_s": round(time.monotonic() - wall_start, 4),
            })
            # After the round's metrics row: the checkpoint marks both files (see save_checkpoint).
            run.save_checkpoint(rounds_done, {"state": state}, ledger_file.mark())
            progress.update(rounds_done, metrics["train_loss"], eps)
    except BaseException:
        status = "failed"
        if tight_job is not None:
            tight_job.close()
            tight_job = None
        raise
    finally:
        if nodes is not None:
            nodes.close(status)
        progress.close()
        ledger_file.close()
        if tight_job is not None:
            tight_job.submit([led.privacy for led in ledgers], budgets.delta)
        summary = _summary(config, alg, budgets, ledgers, status, stopped, rounds_done, metrics,
                           time.monotonic() - wall_start, run.path)
        if plan is not None:
            summary["plan"] = plan
        run.write_summary(summary)  # at once: a run killed from here on still has its summary
        run.close()
    np.save(run.path / "final_params.npy", alg.eval_params(state))
    if config.output.figures:
        from testbed.plots import draw_epsilon, draw_progress

        draw_progress(run.path)  # while the tight accountant runs in its own process
    if tight_job is not None:
        for led, eps in zip(ledgers, tight_job.result()):
            summary["nodes"][str(led.node)]["epsilon_tight"] = eps
        run.write_summary(summary)
    if config.output.figures:
        draw_epsilon(run.path)
    return RunResult(run.path, summary)


def _first_exceeded(budgets: Budgets, ledgers: list[NodeLedger], alg: Algorithm, r: int) -> Exceeded | None:
    for ledger in ledgers:
        exceeded = budgets.would_exceed(ledger, alg.planned_events(ledger.node, r))
        if exceeded is not None:
            return exceeded
    return None


def _summary(config: Config, alg: Algorithm, budgets: Budgets, ledgers: list[NodeLedger], status: str,
             stopped: Exceeded | None, rounds_done: int, metrics: dict[str, float], wall_s: float,
             run_dir: Path) -> dict[str, Any]:
    nodes = {}
    for led in ledgers:
        t = led.totals
        nodes[str(led.node)] = {
            "epsilon": account(budgets.accountant, led.privacy, budgets.delta),
            "epsilon_tight": None,  # filled in by the tight accountant's background job
            "delta": budgets.delta, "cost_units": t.cost_units, "local_steps": t.local_steps,
            "rounds": t.rounds, "bytes_up": t.bytes_up, "bytes_down": t.bytes_down,
            "energy_j": t.energy_j, "compute_s": t.compute_s,
        }
    return {
        "algorithm": config.run.algorithm,
        "mode": config.run.mode,
        "seed": config.run.seed,
        "status": status,
        "rounds": rounds_done,
        "final": {k: metrics[k] for k in ("test_accuracy", "train_loss", "test_accuracy_pooled", "validation_accuracy")},
        "nodes": nodes,
        "budgets": {"epsilon": budgets.epsilon, "delta": budgets.delta, "accountant": budgets.accountant,
                    "cost_units": budgets.cost_units, "bytes": budgets.bytes, "energy_j": budgets.energy_j},
        "stopped": None if stopped is None else {"node": stopped.node, "budget": stopped.budget,
                                                  "would_be": stopped.would_be, "limit": stopped.limit},
        "privacy": {"accountant": budgets.accountant, "tight_accountant": config.privacy.tight_accountant,
                    "epsilon_target": getattr(config, config.run.algorithm).epsilon},
        "algorithm_settings": alg.describe(),
        "profile": config.nodes.profile,
        "name": config.run.name,
        "dataset": config.data.dataset,
        "model": config.model.kind,
        "wall_s": wall_s,
        "run_dir": str(run_dir),
    }
