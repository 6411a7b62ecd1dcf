"""The contract every algorithm, data set and accountant is held to, importable from outside: the
checks tests/test_algorithm_contract.py runs on every registered algorithm, and a plugin's own
conformance test (the one `testbed new` writes) runs on its newcomer, the same code.

Each check takes a small experiment (its TOML text) and a scratch folder, and raises
AssertionError saying what broke. :data:`ALGORITHM_CHECKS` are an algorithm's (all nodes stacked
equal one node at a time; the declared metrics; the events planned are the events emitted; a budget
refuses at its boundary; a checkpoint then resume equals an uninterrupted run; the rounds planned
are the rounds run); :func:`check_sim_equals_mqtt` runs it in sim and over MQTT (the embedded
broker, or ``broker_url``'s) and compares the models and ledgers bit for bit.
:data:`DATASET_CHECKS` and :data:`ACCOUNTANT_CHECKS` are a data set's and an accountant's.

Example (a plugin's test)::

    import pytest
    from testbed.orchestration import contract_suite as suite

    EXPERIMENT = '[run]\\nalgorithm = "my_alg"\\n[my_alg]\\nrounds = 4\\n'

    @pytest.mark.parametrize("check", suite.ALGORITHM_CHECKS, ids=suite.check_name)
    def test_the_contract(check, tmp_path):
        check(EXPERIMENT, tmp_path)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable
from unittest import mock

import numpy as np

#: What every experiment of the suite shares: a named run, no figures, no tight accountant (slow),
#: generous MQTT timeouts (a loaded machine).
COMMON = """
[run]
name = "contract"
seed = 4
[output]
figures = false
[privacy]
tight_accountant = "none"
[mqtt]
round_timeout_s = 20.0
connect_timeout_s = 30.0
"""
#: How far two runs may differ: float64 models are bit-for-bit up to summation order; a float32
#: network stepped for M nodes at once rounds differently from M = 1.
ATOL_STACKED = {"float64": 1e-12, "float32": 1e-5}
ATOL_MODES = {"float64": 1e-9, "float32": 1e-6}

#: A check: (an experiment's TOML, merged over COMMON; a scratch folder) → None, AssertionError if broken.
Check = Callable[[str, Path], None]


def config_of(text: str):
    """The experiment of the suite: ``text``'s sections over :data:`COMMON`'s (``text`` wins)."""
    import tomllib

    from testbed.assembly.config import build_config

    raw = tomllib.loads(COMMON)
    for section, values in tomllib.loads(text).items():
        raw.setdefault(section, {}).update(values)
    return build_config(raw)


def check_name(check: Check) -> str:
    """A check's id in a test report: its name without ``check_``."""
    return check.__name__.removeprefix("check_")


def _dtype(model) -> str:
    return getattr(model, "dtype", "float64")


def _built(text: str):
    from testbed.assembly import assemble
    from testbed.orchestration.runner import load

    config = config_of(text)
    data, model = load(config)
    return config, data, model, assemble.build_algorithm(config, model, data)


# --------------------------------------------------------------------------------------- algorithms

def check_planned_rounds_are_run(text: str, tmp: Path) -> None:
    """The rounds the registration plans (the watch page's progress) are the rounds it runs."""
    from testbed.assembly import assemble

    config, _, _, alg = _built(text)
    assert assemble.planned_rounds(config) == alg.rounds, "planned_rounds disagrees with the algorithm's rounds"


def check_stacked_equals_one_at_a_time(text: str, tmp: Path) -> None:
    """All nodes stepped at once equal each node stepped alone (a board steps one)."""
    from testbed.algorithms import OverTheAir, RoundContext
    from testbed.algorithms.contract import check_tensors

    config, data, model, alg = _built(text)
    state = alg.init_state(model.init(np.random.default_rng(1)))
    n = data.num_nodes
    ctx = RoundContext.everyone(1, config.run.seed, n)
    ids = tuple(range(n))
    stacked = alg.node_step(alg.downlink(state, ctx, ids), data.train, ids, ctx)
    atol = ATOL_STACKED[_dtype(model)]
    for m in ids:
        alone = alg.node_step(alg.downlink(state, ctx, [m]), data.train.select([m]), [m], ctx)
        for key, value in stacked.tensors.items():
            np.testing.assert_allclose(alone.tensors[key][0], value[m], rtol=0, atol=atol)
        for key, value in stacked.carry.items():
            np.testing.assert_allclose(alone.carry[key][0], value[m], rtol=0, atol=atol)
        assert alone.events[0] == stacked.events[m]
    if isinstance(alg, OverTheAir):  # the finish, too: node by node from the same received rows
        closed = ctx.closed(ids)
        heard = alg.channel.superpose(stacked.tensors["signal"].copy(), alg.channel_tensors(ctx), closed)
        together = alg.node_finish({k: v.copy() for k, v in stacked.carry.items()}, heard, ids, closed)
        for m in ids:
            alone = alg.node_finish({k: v[[m]].copy() for k, v in stacked.carry.items()}, heard[[m]], [m], closed)
            np.testing.assert_allclose(alone.tensors["model"][0], together.tensors["model"][m], rtol=0, atol=atol)
            assert check_tensors(alg.uplink_spec(), alone.rows(m)) is None


def check_metrics_are_the_declared_ones(text: str, tmp: Path) -> None:
    """A reply carries exactly the declared metrics within their bounds (the coordinator refuses
    anything else), and a setup none."""
    from testbed.algorithms import RoundContext, WithSetup
    from testbed.algorithms.contract import SETUP_ROUND, check_metrics, metric_specs

    config, data, model, alg = _built(text)
    state = alg.init_state(model.init(np.random.default_rng(0)))
    ids = tuple(range(data.num_nodes))
    if isinstance(alg, WithSetup) and alg.has_setup:
        ctx = RoundContext(SETUP_ROUND, config.run.seed, len(ids), ids)
        assert alg.setup_step(data.train, list(ids), ctx).metrics == {}
    ctx = RoundContext.everyone(0, config.run.seed, len(ids))
    out = alg.node_step(alg.downlink(state, ctx, ids), data.train, ids, ctx)
    for i in range(len(ids)):
        problem = check_metrics(metric_specs(alg), {k: float(v[i]) for k, v in out.metrics.items()})
        assert problem is None, problem


def check_planned_events_are_emitted(text: str, tmp: Path) -> None:
    """The events a step emits are the events planned for it (what a budget is checked against
    before the round), for every node and for a subset of them."""
    from testbed.algorithms import OverTheAir, RoundContext, WithSetup
    from testbed.algorithms.contract import SETUP_ROUND, check_tensors

    config, data, model, alg = _built(text)
    state = alg.init_state(model.init(np.random.default_rng(0)))
    n = data.num_nodes
    if isinstance(alg, WithSetup) and alg.has_setup:
        ctx = RoundContext(SETUP_ROUND, config.run.seed, n, tuple(range(n)))
        out = alg.setup_step(data.train, list(range(n)), ctx)
        assert list(out.events) == [alg.setup_events(m) for m in range(n)]
        assert all(check_tensors(alg.setup_spec(), out.rows(m)) is None for m in range(n))
    for expected in [tuple(range(n)), tuple(sorted({0, min(2, n - 1), n - 1}))]:
        ctx = RoundContext(0, config.run.seed, n, expected)
        out = alg.node_step(alg.downlink(state, ctx, expected), data.train.select(list(expected)), expected, ctx)
        assert list(out.events) == [alg.planned_events(m, ctx) for m in expected]
        if not isinstance(alg, OverTheAir):
            assert all(check_tensors(alg.uplink_spec(), out.rows(m)) is None for m in expected)


def _bytes(events) -> int:
    return sum(getattr(e, "bytes_up", 0) + getattr(e, "bytes_down", 0) for e in events)


def check_budget_refuses_at_the_boundary(text: str, tmp: Path) -> None:
    """A byte budget of exactly three rounds: three rounds run, the fourth is refused, nobody spends
    past it."""
    from testbed.algorithms import RoundContext
    from testbed.accounting.budgets import Budgets
    from testbed.assembly.config import replace
    from testbed.ledger.node import NodeLedger
    from testbed.orchestration.runner import run_experiment

    config, data, model, alg = _built(text)
    ctx = RoundContext.everyone(0, config.run.seed, data.num_nodes)
    per_round = max(_bytes(alg.planned_events(m, ctx)) for m in range(data.num_nodes))
    setup = max((_bytes(alg.setup_events(m)) for m in range(data.num_nodes)), default=0) if alg.has_setup else 0
    limit = 3 * per_round + setup
    ledger = NodeLedger(0)
    if alg.has_setup:  # spent before round 1 (ACFL's coded data set outweighs a round)
        ledger.extend(alg.setup_events(0))
    assert Budgets(bytes=limit).would_exceed(ledger, [e for _ in range(4) for e in alg.planned_events(0, ctx)]) is not None
    result = run_experiment(replace(config, budget={"bytes": float(limit)}), out_dir=tmp / "budget", quiet=True)
    s = result.summary
    assert (s["status"], s["rounds"], s["stopped"]["budget"]) == ("stopped_budget", 3, "bytes")
    assert max(node["bytes_up"] + node["bytes_down"] for node in s["nodes"].values()) == limit


def check_resume_equals_an_uninterrupted_run(text: str, tmp: Path) -> None:
    """Killed in round 4 and resumed from its checkpoint, a run ends as an uninterrupted one, each
    release charged once (a round run again is computed and sent again: charged again)."""
    import testbed.orchestration.model_evaluation as model_evaluation
    import testbed.orchestration.runner as runner
    from testbed.assembly.config import load_config_text
    from testbed.reports.results import read_checkpoint, read_metrics

    config = config_of(text)
    whole = runner.run_experiment(config, out_dir=tmp / "whole", quiet=True)
    evaluate, calls = model_evaluation.evaluate, {"n": 0}

    def killed_in_round_4(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 5:  # the first call is before round 1
            raise KeyboardInterrupt
        return evaluate(*args, **kwargs)

    with mock.patch.object(model_evaluation, "evaluate", killed_in_round_4):
        try:
            runner.run_experiment(config, out_dir=tmp / "killed", quiet=True)
        except KeyboardInterrupt:
            pass
        else:
            raise AssertionError("the run was not interrupted in round 4 (fewer than 4 rounds?)")
    assert 1 <= read_checkpoint(tmp / "killed").rounds_done <= 3  # output.checkpoint_every = "auto"
    resumed = runner.run_experiment(load_config_text((tmp / "killed" / "config.toml").read_text()),
                                    out_dir=tmp / "killed", quiet=True, resume=True)
    assert resumed.summary["status"] == "completed"
    a, b = read_checkpoint(tmp / "whole").state, read_checkpoint(tmp / "killed").state
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    nodes, whole_nodes = resumed.summary["nodes"].values(), whole.summary["nodes"].values()
    assert [n["epsilon"] for n in nodes] == [n["epsilon"] for n in whole_nodes]  # each release charged once
    for key in ("bytes_up", "local_steps", "rounds"):
        assert all(n[key] >= w[key] for n, w in zip(nodes, whole_nodes))
    assert len(read_metrics(tmp / "killed")) == len(read_metrics(tmp / "whole"))


def ledger_without_seconds(run_dir: Path) -> list:
    """A run's ledger as comparable across modes: measured seconds and joules of compute left out."""
    from testbed.ledger.files import read_ledger

    rows = []
    for e in read_ledger(run_dir / "ledger.csv"):
        rows.append((e.kind, e.node, e.round, e.local_steps, e.cost_units) if e.kind == "compute" else e)
    return sorted(rows, key=repr)


def check_sim_equals_mqtt(text: str, tmp: Path, stragglers: dict | None = None, broker_url: str | None = None) -> None:
    """The run in sim and over MQTT (every node its own client, on two hosts; the embedded broker,
    or the one at ``broker_url``) ends with the same model, the same ledger and the same stragglers;
    every message authenticated, every node's own ledger confirmed."""
    from testbed.assembly.config import replace
    from testbed.orchestration.runner import load, run_experiment
    from testbed.reports.results import read_checkpoint, read_metrics

    config = config_of(text)
    if stragglers is not None:
        config = replace(config, stragglers=stragglers)
    sim = run_experiment(config, out_dir=tmp / "sim", quiet=True)
    broker = {"broker_url": broker_url} if broker_url else {"broker": "embedded"}
    mqtt = run_experiment(replace(config, run={"mode": "mqtt"}, mqtt={"hosts": 2, **broker}),
                          out_dir=tmp / "mqtt", quiet=True)
    assert sim.summary["status"] == mqtt.summary["status"] == "completed"
    assert mqtt.summary["authentication"]["enabled"] and mqtt.summary["authentication"]["forged_dropped"] == 0
    a, b = read_checkpoint(tmp / "sim").state, read_checkpoint(tmp / "mqtt").state
    atol = ATOL_MODES[_dtype(load(config)[1])]
    for key in a:
        np.testing.assert_allclose(b[key], a[key], rtol=0, atol=atol)
    assert ledger_without_seconds(tmp / "sim") == ledger_without_seconds(tmp / "mqtt")
    straggled = [int(row["stragglers"]) for row in read_metrics(tmp / "sim")]
    assert straggled == [int(row["stragglers"]) for row in read_metrics(tmp / "mqtt")]
    assert (sum(straggled) > 0) == (stragglers is not None)
    # Invariant 1: every node's own ledger reported at the stop, and none above the summary.
    assert {n["ledger_check"] for n in sim.summary["nodes"].values()} == {"local"}
    assert {n["ledger_check"] for n in mqtt.summary["nodes"].values()} <= {"confirmed", "raised"}


def check_sim_workers_equal_one_process(text: str, tmp: Path) -> None:
    """The run with its node steps in two forked workers (``run.workers = 2``,
    testbed.orchestration.sim_workers) equals it in one process bit for bit: the model, every
    metric but the wall clock, the ledger but measured seconds and joules; with Bernoulli
    stragglers, so that a worker steps some of its nodes some rounds. Where this process cannot
    fork its workers (torch is loaded here), the workers' run is a `testbed run` of its own."""
    import subprocess
    import sys

    from testbed.assembly.config import replace, to_toml
    from testbed.orchestration.runner import run_experiment
    from testbed.reports.results import read_checkpoint, read_metrics
    from testbed.reports.summary_file import read_summary
    from testbed.util.forked import can_fork

    config = replace(config_of(text), stragglers={"model": "bernoulli", "p": 0.3})
    one = run_experiment(replace(config, run={"workers": 1}), out_dir=tmp / "w1", quiet=True).summary
    two = replace(config, run={"workers": 2})
    if can_fork():
        run_experiment(two, out_dir=tmp / "w2", quiet=True)
    else:
        (tmp / "w2.toml").write_text(to_toml(two))
        subprocess.run([sys.executable, "-m", "testbed", "run", str(tmp / "w2.toml"), "--quiet", "--out", str(tmp / "w2")],
                       check=True, stdout=subprocess.DEVNULL)
    summary = read_summary(tmp / "w2")
    assert one["status"] == summary["status"] == "completed"
    # A torch model's run steps in its own process: a fork would lose torch's thread pools.
    assert one["sim_workers"] == 0 and summary["sim_workers"] == (0 if config.model.kind == "torch" else 2)
    a, b = read_checkpoint(tmp / "w1").state, read_checkpoint(tmp / "w2").state
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    rows = [[{k: v for k, v in row.items() if k != "wall_s"} for row in read_metrics(tmp / f"w{w}")] for w in (1, 2)]
    assert rows[0] == rows[1]
    assert ledger_without_seconds(tmp / "w1") == ledger_without_seconds(tmp / "w2")


ALGORITHM_CHECKS: tuple[Check, ...] = (check_planned_rounds_are_run, check_stacked_equals_one_at_a_time,
                                       check_metrics_are_the_declared_ones, check_planned_events_are_emitted,
                                       check_budget_refuses_at_the_boundary, check_resume_equals_an_uninterrupted_run,
                                       check_sim_workers_equal_one_process)


# ---------------------------------------------------------------------------------------- data sets

def check_data_loads_the_same_in_the_unit_ball(text: str, tmp: Path) -> None:
    """The data set loads the same twice from one seed, its nodes' rows finite and in the unit ball,
    its labels classes of the set, every node with training rows."""
    from testbed.orchestration.runner import load

    config = config_of(text)
    first, again = load(config)[0], load(config)[0]
    for split in ("train", "test", "validation"):
        a, b = getattr(first, split), getattr(again, split)
        assert np.array_equal(a.x, b.x) and np.array_equal(a.y, b.y), f"{split}: another draw from the same seed"
        assert np.isfinite(a.x).all(), f"{split}: a row that is not finite"
        assert np.linalg.norm(a.x, axis=1).max(initial=0.0) <= 1.0 + 1e-9, f"{split}: a row outside the unit ball"
        if np.issubdtype(a.y.dtype, np.integer):
            assert a.y.min(initial=0) >= 0 and a.y.max(initial=0) < first.n_classes, f"{split}: a label outside the classes"
    assert first.num_nodes == config.data.num_nodes and (first.train.sizes > 0).all(), "a node without training rows"


def check_data_runs_in_sim_and_over_mqtt(text: str, tmp: Path) -> None:
    """A few rounds of FedAvg on it: the same in sim and over MQTT."""
    check_sim_equals_mqtt('[run]\nalgorithm = "fedavg"\n[fedavg]\nrounds = 3\nlocal_steps = 2\nbatch = 8\n' + text, tmp)


DATASET_CHECKS: tuple[Check, ...] = (check_data_loads_the_same_in_the_unit_ball, check_data_runs_in_sim_and_over_mqtt)


# -------------------------------------------------------------------------------------- accountants

#: An unsampled replace-one Gaussian release (σ, sensitivity, adjacency, sampling, rate): every
#: accountant supports it (DP-PASGD's, DWFL's).
PLAIN_RELEASE = (4.0, 0.5, "replace_one", "none", 1.0)


def _accountant(text: str):
    from testbed.privacy.accountants import registry

    return registry.get(config_of(text).privacy.accountant)


def check_accountant_composes_a_plain_release(text: str, tmp: Path) -> None:
    """It supports an unsampled replace-one release; nothing composed is ε 0; more compositions
    never spend less; a smaller δ never gives a smaller ε; every ε finite and positive."""
    acc = _accountant(text)
    assert acc.supports(PLAIN_RELEASE), f"{acc.name} refuses an unsampled replace-one release"
    assert acc.epsilon([], 1e-5) == 0.0
    spent = [acc.epsilon([(PLAIN_RELEASE, count)], 1e-5) for count in (1, 2, 5, 20)]
    assert all(np.isfinite(spent)) and spent[0] > 0, f"ε {spent}"
    assert spent == sorted(spent), f"ε falls with more compositions: {spent}"
    assert acc.epsilon([(PLAIN_RELEASE, 5)], 1e-7) >= spent[2]


def check_accountant_refuses_in_one_line(text: str, tmp: Path) -> None:
    """A release the ledger does not know (an unknown sampling) is refused by it in one line."""
    acc = _accountant(text)
    reason = acc.unsupported_reason([(4.0, 0.5, "replace_one", "zz-unknown-sampling", 1.0)])
    assert reason is not None and "\n" not in reason


def check_accountant_runs_a_private_experiment(text: str, tmp: Path) -> None:
    """A DP-PASGD run it enforces completes, and every node's ε is its ε of that node's ledger (the
    worst over the observers that saw a release)."""
    from testbed.ledger.files import read_ledger
    from testbed.ledger.node import NodeLedger
    from testbed.orchestration.runner import run_experiment
    from testbed.privacy.accountants import worst_epsilon

    acc = _accountant(text)
    config = config_of('[dp_pasgd]\nsteps = 8\ntau = 2\nbatch = 8\nlr = 0.5\nsigma = 1.0\n' + text)
    result = run_experiment(config, out_dir=tmp / "run", quiet=True)
    assert result.summary["status"] == "completed" and result.summary["budgets"]["accountant"] == acc.name
    events = list(read_ledger(tmp / "run" / "ledger.csv"))
    for node, entry in result.summary["nodes"].items():
        tallies = NodeLedger(int(node)).projected([e for e in events if e.node == int(node)])[1]
        expected = worst_epsilon(acc.name, tallies, result.summary["budgets"]["delta"])
        assert np.isclose(entry["epsilon"], expected, rtol=1e-9), f"node {node}: ε {entry['epsilon']} vs {expected}"


ACCOUNTANT_CHECKS: tuple[Check, ...] = (check_accountant_composes_a_plain_release, check_accountant_refuses_in_one_line,
                                        check_accountant_runs_a_private_experiment)
