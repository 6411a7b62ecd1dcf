"""A sim run's node steps in forked worker processes (testbed.orchestration.sim_workers): the same
numbers as in one process (every algorithm: the contract suite's check_sim_workers_equal_one_process),
lazy nodes made in the workers, the workers' CPU charged, a failing or dying worker one line, and
when the run keeps its steps at home (an audit, small rounds)."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest

from testbed.algorithms.contract import NodeResult
from testbed.assembly import assemble
from testbed.assembly.config import load_config_text
from testbed.ledger.events import ComputeEvent, GaussianEvent, NodeEvents
from testbed.orchestration import sim_workers
from testbed.orchestration.runner import load, run_experiment
from testbed.orchestration.sim_nodes import SimNodes
from testbed.orchestration.sim_workers import SimWorkers, WorkerFailed, concatenate
from testbed.reports.results import read_checkpoint, read_metrics
from testbed.util import parallel



@pytest.fixture(autouse=True)
def forking(monkeypatch):
    """The runs here never touch torch, so their workers may fork even after another test of this
    process loaded it (the run itself keeps a torch run's steps at home: testbed.util.forked.can_fork)."""
    monkeypatch.setattr("testbed.orchestration.sim_nodes.can_fork", lambda: True)

SAMPLED = "[client_sampling]\nmethod = \"uniform\"\ncount = 5\n"


def built(text, *overrides):
    config = load_config_text(text, list(overrides))
    data, model = load(config)
    alg = assemble.build_algorithm(config, model, data)
    return config, data, alg, alg.init_state(model.init(None))


def test_a_sampled_lazy_run_in_workers_is_the_run_in_one_process(small_config_text, tmp_path):
    """Lazy nodes' rows are made in the workers, ahead of the step, from each node's own stream."""
    text = small_config_text + SAMPLED
    summaries = {}
    for w in (1, 3):
        config = load_config_text(text, ["data.num_nodes=40", f"run.workers={w}"])
        summaries[w] = run_experiment(config, out_dir=tmp_path / f"w{w}", quiet=True).summary
    assert summaries[1]["sim_workers"] == 0 and summaries[3]["sim_workers"] == 3
    a, b = read_checkpoint(tmp_path / "w1").state, read_checkpoint(tmp_path / "w3").state
    assert all(np.array_equal(a[k], b[k]) for k in a)
    strip = [[{k: v for k, v in r.items() if k != "wall_s"} for r in read_metrics(tmp_path / f"w{w}")] for w in (1, 3)]
    assert strip[0] == strip[1]


@pytest.mark.parametrize("overrides", [[], ["output.eval_nodes=5"], ['data.dtype="float32"']],
                         ids=["every node", "eval nodes", "float32"])
def test_the_evaluation_scored_in_the_workers_is_the_evaluation_in_one_process(small_config_text, tmp_path,
                                                                              monkeypatch, overrides):
    """The report's evaluation, scored in the workers in the fixed halves of the rows (the
    evaluated nodes' rows held at the fork; float32 rows in float32), gives the metrics of one
    process bit for bit, and the workers did score it."""
    monkeypatch.setattr(parallel, "MIN_NUMBERS", 0)  # halves even of these few rows
    scored = []
    real = SimWorkers.score
    monkeypatch.setattr(SimWorkers, "score", lambda self, params, blocks: scored.append(blocks) or real(self, params, blocks))
    rows = {}
    for w in (1, 2):
        config = load_config_text(small_config_text, ["data.num_nodes=9", f"run.workers={w}", *overrides])
        run_experiment(config, out_dir=tmp_path / f"w{w}", quiet=True)
        rows[w] = [{k: v for k, v in r.items() if k != "wall_s"} for r in read_metrics(tmp_path / f"w{w}")]
    assert rows[1] == rows[2]
    assert len(scored) == len(rows[2])  # each round's (round 0's, before the workers start, has no row)
    assert all(blocks[0][0] == "train" and blocks[1][1] > 0 for blocks in scored)  # the second half of train


def test_a_worker_that_dies_before_scoring_fails_the_evaluation_in_one_line(small_config_text):
    config, data, alg, state = built(small_config_text, "data.num_nodes=6")
    model = assemble.model_for(config.model, data, config.run.seed)
    nodes = SimNodes(alg, data, seed=1, profile="host", workers=2, evaluation=(model, data))
    try:
        nodes.round(state, 0, frozenset())
        params = alg.eval_params(state)
        assert nodes.score_rows(model, params, data, [("train", 0, 10)]) is not None
        assert nodes.score_rows(model, params, load(config)[0], [("train", 0, 10)]) is None  # not the rows held
        victim = nodes._workers._procs[0]
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait(timeout=5)
        with pytest.raises(WorkerFailed, match=r"^the sim worker of nodes 0-2 exited \(status -9\)$"):
            nodes.score_rows(model, params, data, [("train", 0, 10)])
    finally:
        nodes.close("failed")


def test_the_workers_cpu_is_charged_to_the_nodes(small_config_text, monkeypatch):
    """A step in the workers costs the run's process next to nothing: the nodes' share of CPU
    seconds is the workers' (the ledger never under-counts a node's compute)."""
    _, data, alg, state = built(small_config_text, "data.num_nodes=6")
    shares = []
    real = SimNodes._outcome

    def spy(self, result, ctx, began, start, straggled, elsewhere_s=0.0):
        shares.append(elsewhere_s)
        return real(self, result, ctx, began, start, straggled, elsewhere_s)

    monkeypatch.setattr(SimNodes, "_outcome", spy)
    nodes = SimNodes(alg, data, seed=1, profile="host", workers=2)
    try:
        outcome = nodes.round(state, 0, frozenset())
    finally:
        nodes.close("completed")
    assert shares[0] > 0.0
    assert outcome.result.node_ids == tuple(range(6))


def test_a_step_that_fails_in_a_worker_fails_the_round_with_its_own_error(small_config_text, monkeypatch):
    _, data, alg, state = built(small_config_text, "data.num_nodes=6")

    def broken(received, train, node_ids, ctx):
        raise ValueError(f"no step for nodes {list(node_ids)}")

    monkeypatch.setattr(alg, "node_step", broken)  # before the fork: the workers inherit it
    nodes = SimNodes(alg, data, seed=1, profile="host", workers=2)
    try:
        with pytest.raises(ValueError, match=r"no step for nodes \[0, 1, 2\]"):
            nodes.round(state, 0, frozenset())
        with pytest.raises(ValueError):  # the workers are still there, each pipe read to its end
            nodes.round(state, 1, frozenset())
    finally:
        nodes.close("failed")


def test_a_worker_that_dies_fails_the_round_in_one_line(small_config_text):
    _, data, alg, state = built(small_config_text, "data.num_nodes=6")
    nodes = SimNodes(alg, data, seed=1, profile="host", workers=2)
    try:
        nodes.round(state, 0, frozenset())
        victim = nodes._workers._procs[1]
        os.kill(victim.pid, signal.SIGKILL)
        victim.wait(timeout=5)
        with pytest.raises(WorkerFailed, match=r"^the sim worker of nodes 3-5 exited \(status -9\)$"):
            nodes.round(state, 1, frozenset())
    finally:
        nodes.close("failed")


def test_a_run_whose_worker_dies_ends_failed_with_its_summary(small_config_text, tmp_path, monkeypatch):
    real = SimWorkers.start_step
    calls = []

    def kill_then_step(self, received, expected, ctx):
        calls.append(ctx.round_index)
        if len(calls) == 2:
            os.kill(self._procs[0].pid, signal.SIGKILL)
            self._procs[0].wait(timeout=5)
        return real(self, received, expected, ctx)

    monkeypatch.setattr(SimWorkers, "start_step", kill_then_step)
    config = load_config_text(small_config_text, ["run.workers=2"])
    with pytest.raises(WorkerFailed):
        run_experiment(config, out_dir=tmp_path / "run", quiet=True)
    from testbed.reports.summary_file import read_summary

    summary = read_summary(tmp_path / "run")
    assert summary["status"] == "failed" and summary["failure"].startswith("WorkerFailed: the sim worker of nodes 0-1")


def test_small_rounds_and_audits_step_in_the_runs_own_process(small_config_text, monkeypatch):
    _, data, alg, state = built(small_config_text, "data.num_nodes=6")
    nodes = SimNodes(alg, data, seed=1, profile="host", workers=0)  # auto: 6 small nodes are not worth it
    assert nodes._workers_for(tuple(range(6))) is None
    monkeypatch.setattr(sim_workers, "MIN_FLOPS", 1)
    monkeypatch.setattr("testbed.orchestration.sim_nodes.MIN_FLOPS", 1)
    monkeypatch.setattr("testbed.privacy.canaries.auditing", lambda: True)
    forced = SimNodes(alg, data, seed=1, profile="host", workers=2)
    assert nodes._workers_for(tuple(range(6))) is None and forced._workers_for(tuple(range(6))) is None


def test_parts_follow_the_fixed_groups_of_ids(small_config_text):
    """Each worker steps the round's nodes of its group, in the order of the round's nodes."""
    _, data, alg, _ = built(small_config_text, "data.num_nodes=7")
    workers = SimWorkers(alg, data, 3)
    try:
        assert workers.groups == [(0, 2), (3, 4), (5, 6)]  # first and last id, as np.array_split cuts
        assert workers.parts((1, 2, 5, 6)) == [(0, [0, 1]), (2, [2, 3])]
    finally:
        workers.close()


def test_parts_concatenate_to_the_whole_step():
    """Events of parts as batches (columns where any part or template differs), else as lists."""
    def part(ids, sigmas):
        events = NodeEvents.from_lists([[ComputeEvent(n, 0, 5), GaussianEvent(n, 0, sigma=s, sensitivity=1.0, count=1)]
                                        for n, s in zip(ids, sigmas)], ids)
        return NodeResult(tuple(ids), {"u": np.full((len(ids), 2), ids[0], float)}, {"samples": np.ones(len(ids))},
                          events)

    whole = concatenate([part([0, 1], [1.0, 1.0]), part([2], [2.0]), part([3, 4], [1.0, 3.0])])
    assert whole.node_ids == (0, 1, 2, 3, 4)
    assert whole.tensors["u"][:, 0].tolist() == [0, 0, 2, 3, 3]
    assert isinstance(whole.events, NodeEvents)
    assert [e[1].sigma for e in whole.events] == [1.0, 1.0, 2.0, 1.0, 3.0]
    assert [e[0] for e in whole.events] == [[ComputeEvent(n, 0, 5)][0] for n in range(5)]
    lists = concatenate([part([0], [1.0]), NodeResult((1,), {"u": np.zeros((1, 2))}, {"samples": np.ones(1)},
                                                      [[ComputeEvent(1, 0, 5)]])])
    assert lists.events == [[ComputeEvent(0, 0, 5), GaussianEvent(0, 0, sigma=1.0, sensitivity=1.0, count=1)],
                            [ComputeEvent(1, 0, 5)]]
