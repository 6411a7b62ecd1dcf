"""The algorithm contract, held to every registered algorithm (testbed.algorithms.registry).

For each: all nodes stacked equals one node at a time; the events a step emits are the events
planned for it; a budget refuses at the boundary; a checkpoint then ``--resume`` equals an
uninterrupted run; sim equals MQTT on the embedded broker, with and without Bernoulli stragglers.

A new algorithm adds its small experiment to EXPERIMENTS, nothing else.
"""

from __future__ import annotations

import numpy as np
import pytest

from testbed.accounting.budgets import Budgets
from testbed.algorithms import OverTheAir, RoundContext, WithSetup, registry
from testbed.algorithms.contract import SETUP_ROUND, check_metrics, check_tensors, metric_specs
from testbed.assembly import assemble
from testbed.assembly.config import load_config_text, replace
from testbed.ledger.files import read_ledger
from testbed.ledger.node import NodeLedger
from testbed.orchestration.runner import load, run_experiment
from testbed.reports.results import read_checkpoint, read_metrics

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
SYNTHETIC = '[data]\ndataset = "synthetic"\nnum_nodes = 5\nsamples_per_node = 60\ndim = 6\n'
#: The 8x8 digits and the small CNN of testbed.learning.torch_models (float32, all nodes stepped at once).
DIGITS_CNN = ('[data]\ndataset = "digits"\nnum_nodes = 5\nsamples_per_node = 60\n'
              '[model]\nkind = "torch"\nnetwork = "cnn"\n')

#: A few rounds of every registered algorithm, and of the ones that train deep models with a CNN
#: ("name/cnn"). A case is its algorithm's section plus, for the CNN, the data and model above.
EXPERIMENTS = {
    "dp_pasgd": SYNTHETIC + '[dp_pasgd]\nsteps = 12\ntau = 2\nbatch = 8\nlr = 0.5\nsigma = 0.8\n',
    "dwfl": SYNTHETIC + '[dwfl]\nrounds = 6\nbatch = 8\nlr = 0.2\nepsilon = 1.0\nfading = "none"\nc_scale = 0.6\n',
    "dpsgd": SYNTHETIC + '[dpsgd]\nrounds = 6\nbatch = 8\nlr = 0.2\nepsilon = 1.0\nfading = "none"\n'
                         '[topology]\nkind = "ring"\n',
    "gossip": SYNTHETIC + '[gossip]\nrounds = 6\nbatch = 8\nlr = 0.2\nepsilon = 1.0\nfading = "rayleigh"\n'
                          'coherence_rounds = 2\n[topology]\nkind = "k_regular"\ndegree = 2\n',
    # Robust rules at the receivers (issue 40): each node gets its neighbours' payloads apart.
    "gossip/clip": SYNTHETIC + '[gossip]\nrounds = 6\nbatch = 8\nlr = 0.2\nepsilon = 1.0\nfading = "rayleigh"\n'
                               'aggregation = "self_centred_clip"\nclip_multiple = 0.05\n[topology]\nkind = "ring"\n',
    "dpsgd/trimmed_mean": SYNTHETIC + '[dpsgd]\nrounds = 6\nbatch = 8\nlr = 0.2\nepsilon = 1.0\nfading = "none"\n'
                                      'aggregation = "trimmed_mean"\n[topology]\nkind = "complete"\n',
    "dpsgd/median": SYNTHETIC + '[dpsgd]\nrounds = 6\nbatch = 8\nlr = 0.2\nsigma = 0.1\nfading = "none"\n'
                                'aggregation = "median"\n[topology]\nkind = "k_regular"\ndegree = 2\n',
    "fedavg": SYNTHETIC + '[fedavg]\nrounds = 6\nlocal_steps = 3\nbatch = 8\nlr = 0.5\n',
    "acfl": SYNTHETIC + '[model]\nkind = "linear"\n[acfl]\niterations = 6\nlr = 0.01\nsigma1_sq = 0.5\nsigma2_sq = 0.5\n',
    "padpfl": SYNTHETIC + '[padpfl]\nrounds = 6\nuploads = 2\nparticipation = "spread"\nlocal_steps = 3\nbatch = 8\nlr = 0.5\nclip = 2.0\n'
                          'epsilon = 20.0\nimpact = "given"\nweights = [0.1, 0.2, 0.3, 0.2, 0.2]\n',
    "dp_pasgd/cnn": DIGITS_CNN + '[dp_pasgd]\nsteps = 12\ntau = 2\nbatch = 8\nlr = 0.2\nsigma = 0.05\nclip = true\n'
                                 'lipschitz = 1.0\n',
    # DWFL on a ring (issue 32): each node hears its two neighbours, Rayleigh fading, variant A.
    "dwfl/ring": SYNTHETIC + '[dwfl]\nrounds = 6\nbatch = 8\nlr = 0.2\nepsilon = 1.0\nfading = "rayleigh"\n'
                             'variant = "A"\n[topology]\nkind = "ring"\n',
    "dwfl/cnn": DIGITS_CNN + '[dwfl]\nrounds = 6\nbatch = 8\nlr = 0.2\nepsilon = 1.0\nfading = "none"\nc_scale = 0.6\n',
    # PADPFL with DP-SGD local steps (issue 39): per-sample clipped, noised steps, each charged.
    "padpfl/dp_sgd": SYNTHETIC + '[padpfl]\nrounds = 6\nlocal_steps = 3\nbatch = 8\nlr = 0.5\nclip = 2.0\n'
                                 'epsilon = 20.0\nlocal_step = "dp_sgd"\nsample_clip = 1.0\nimpact = "equal"\n',
    "padpfl/cnn": DIGITS_CNN + '[padpfl]\nrounds = 6\nuploads = 2\nparticipation = "spread"\nlocal_steps = 3\nbatch = 8\nlr = 0.2\nclip = 5.0\n'
                               'epsilon = 20.0\nimpact = "given"\nweights = [0.1, 0.2, 0.3, 0.2, 0.2]\n',
}
CASES = list(EXPERIMENTS)
#: How far two runs of one case may differ: float64 models are bit-for-bit up to summation order;
#: a float32 network stepped for M nodes at once rounds differently from M = 1.
ATOL_STACKED = {"float64": 1e-12, "float32": 1e-5}
ATOL_MODES = {"float64": 1e-9, "float32": 1e-6}
ALGORITHMS = registry.names()


def _config(name: str, **sections):
    config = load_config_text(_text(name))
    return replace(config, **sections) if sections else config


def _text(name: str) -> str:
    algorithm = name.split("/")[0]
    return COMMON.replace('name = "contract"', f'name = "contract"\nalgorithm = "{algorithm}"') + EXPERIMENTS[name]


def _dtype(model) -> str:
    return getattr(model, "dtype", "float64")


def _built(name: str):
    config = _config(name)
    data, model = load(config)
    return config, data, model, assemble.build_algorithm(config, model, data)


def test_every_registered_algorithm_has_an_experiment_here():
    assert set(ALGORITHMS) == {name.split("/")[0] for name in CASES}, \
        "add the new algorithm's small experiment to EXPERIMENTS"


@pytest.mark.parametrize("name", CASES)
def test_the_rounds_a_registration_plans_are_the_rounds_it_runs(name):
    """The watch page's progress reads the rounds from the registration's planned_rounds hook."""
    config, _, _, alg = _built(name)
    assert assemble.planned_rounds(config) == alg.rounds


@pytest.mark.parametrize("name", CASES)
def test_all_nodes_stacked_equal_one_node_at_a_time(name):
    config, data, model, alg = _built(name)
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


@pytest.mark.parametrize("name", CASES)
def test_the_metrics_a_step_reports_are_the_declared_ones(name):
    """A reply must carry exactly the declared metrics within their bounds (the coordinator refuses
    anything else): every node step reports what its algorithm declares, and a setup none."""
    config, data, model, alg = _built(name)
    state = alg.init_state(model.init(np.random.default_rng(0)))
    ids = tuple(range(data.num_nodes))
    if isinstance(alg, WithSetup) and alg.has_setup:
        assert alg.setup_step(data.train, list(ids), RoundContext(SETUP_ROUND, config.run.seed, len(ids), ids)).metrics == {}
    ctx = RoundContext.everyone(0, config.run.seed, len(ids))
    out = alg.node_step(alg.downlink(state, ctx, ids), data.train, ids, ctx)
    for i in range(len(ids)):
        assert check_metrics(metric_specs(alg), {k: float(v[i]) for k, v in out.metrics.items()}) is None


@pytest.mark.parametrize("name", CASES)
def test_planned_events_are_the_emitted_events(name):
    config, data, model, alg = _built(name)
    state = alg.init_state(model.init(np.random.default_rng(0)))
    n = data.num_nodes
    if isinstance(alg, WithSetup) and alg.has_setup:
        ctx = RoundContext(SETUP_ROUND, config.run.seed, n, tuple(range(n)))
        out = alg.setup_step(data.train, list(range(n)), ctx)
        assert list(out.events) == [alg.setup_events(m) for m in range(n)]
        assert all(check_tensors(alg.setup_spec(), out.rows(m)) is None for m in range(n))
    for expected in [tuple(range(n)), (0, 2, 3)]:
        ctx = RoundContext(0, config.run.seed, n, expected)
        out = alg.node_step(alg.downlink(state, ctx, expected), data.train.select(list(expected)), expected, ctx)
        assert list(out.events) == [alg.planned_events(m, ctx) for m in expected]
        if not isinstance(alg, OverTheAir):
            assert all(check_tensors(alg.uplink_spec(), out.rows(m)) is None for m in expected)


@pytest.mark.parametrize("name", CASES)
def test_a_budget_refuses_at_the_boundary(name, tmp_path):
    """A byte budget of exactly three rounds: three rounds run, the fourth is refused, nobody spends
    past it."""
    config, data, model, alg = _built(name)
    ctx = RoundContext.everyone(0, config.run.seed, data.num_nodes)
    per_round = max(sum(getattr(e, "bytes_up", 0) + getattr(e, "bytes_down", 0) for e in alg.planned_events(m, ctx))
                    for m in range(data.num_nodes))
    setup = max((sum(getattr(e, "bytes_up", 0) + getattr(e, "bytes_down", 0) for e in alg.setup_events(m))
                 for m in range(data.num_nodes)), default=0) if alg.has_setup else 0
    limit = 3 * per_round + setup
    ledger = NodeLedger(0)
    if alg.has_setup:  # spent before round 1 (ACFL's coded data set outweighs a round)
        ledger.extend(alg.setup_events(0))
    assert Budgets(bytes=limit).would_exceed(ledger, [e for _ in range(4) for e in alg.planned_events(0, ctx)]) is not None
    result = run_experiment(replace(config, budget={"bytes": float(limit)}), out_dir=tmp_path / "r", quiet=True)
    s = result.summary
    assert (s["status"], s["rounds"], s["stopped"]["budget"]) == ("stopped_budget", 3, "bytes")
    assert max(node["bytes_up"] + node["bytes_down"] for node in s["nodes"].values()) == limit


@pytest.mark.parametrize("name", CASES)
def test_checkpoint_then_resume_equals_an_uninterrupted_run(name, tmp_path, monkeypatch):
    import testbed.orchestration.model_evaluation as model_evaluation

    config = _config(name)
    whole = run_experiment(config, out_dir=tmp_path / "whole", quiet=True)
    evaluate, calls = model_evaluation.evaluate, {"n": 0}

    def killed_in_round_4(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 5:  # the first call is before round 1
            raise KeyboardInterrupt
        return evaluate(*args, **kwargs)

    monkeypatch.setattr(model_evaluation, "evaluate", killed_in_round_4)
    with pytest.raises(KeyboardInterrupt):
        run_experiment(config, out_dir=tmp_path / "killed", quiet=True)
    monkeypatch.setattr(model_evaluation, "evaluate", evaluate)
    assert 1 <= read_checkpoint(tmp_path / "killed").rounds_done <= 3  # output.checkpoint_every = "auto"
    resumed = run_experiment(load_config_text((tmp_path / "killed" / "config.toml").read_text()),
                             out_dir=tmp_path / "killed", quiet=True, resume=True)
    assert resumed.summary["status"] == "completed"
    a, b = read_checkpoint(tmp_path / "whole").state, read_checkpoint(tmp_path / "killed").state
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    nodes, whole_nodes = resumed.summary["nodes"].values(), whole.summary["nodes"].values()
    assert [n["epsilon"] for n in nodes] == [n["epsilon"] for n in whole_nodes]  # each release charged once
    for key in ("bytes_up", "local_steps", "rounds"):  # a re-run round computed and sent again: charged again
        assert all(n[key] >= w[key] for n, w in zip(nodes, whole_nodes))
    assert len(read_metrics(tmp_path / "killed")) == len(read_metrics(tmp_path / "whole"))


def _ledger_without_seconds(run_dir):
    """The ledger as comparable across modes: measured seconds and joules of compute left out."""
    rows = []
    for e in read_ledger(run_dir / "ledger.csv"):
        if e.kind == "compute":
            rows.append((e.kind, e.node, e.round, e.local_steps, e.cost_units))
        else:
            rows.append(e)
    return sorted(rows, key=repr)


@pytest.mark.slow
@pytest.mark.parametrize("stragglers", [None, {"model": "bernoulli", "p": 0.3}], ids=["all", "bernoulli"])
@pytest.mark.parametrize("name", CASES)
def test_sim_equals_mqtt_on_the_embedded_broker(name, stragglers, tmp_path):
    config = _config(name, **({"stragglers": stragglers} if stragglers else {}))
    sim = run_experiment(config, out_dir=tmp_path / "sim", quiet=True)
    mqtt = run_experiment(replace(config, run={"mode": "mqtt"}, mqtt={"hosts": 2, "broker": "embedded"}),
                          out_dir=tmp_path / "mqtt", quiet=True)
    assert sim.summary["status"] == mqtt.summary["status"] == "completed"
    # Every message sealed and verified (testbed.mqtt.auth), none of them refused for it
    assert mqtt.summary["authentication"]["enabled"] and mqtt.summary["authentication"]["forged_dropped"] == 0
    a, b = read_checkpoint(tmp_path / "sim").state, read_checkpoint(tmp_path / "mqtt").state
    atol = ATOL_MODES[_dtype(load(config)[1])]
    for key in a:
        np.testing.assert_allclose(b[key], a[key], rtol=0, atol=atol)
    assert _ledger_without_seconds(tmp_path / "sim") == _ledger_without_seconds(tmp_path / "mqtt")
    straggled = [int(row["stragglers"]) for row in read_metrics(tmp_path / "sim")]
    assert straggled == [int(row["stragglers"]) for row in read_metrics(tmp_path / "mqtt")]
    assert (sum(straggled) > 0) == (stragglers is not None)
    # Invariant 1: every node's own ledger reported at the stop, and none above the summary.
    assert {n["ledger_check"] for n in sim.summary["nodes"].values()} == {"local"}
    assert {n["ledger_check"] for n in mqtt.summary["nodes"].values()} <= {"confirmed", "raised"}


@pytest.mark.slow
@pytest.mark.parametrize("name", ALGORITHMS)
def test_every_node_confirms_its_ledger_over_mosquitto(name, mosquitto_broker, tmp_path):
    """Over Mosquitto too (the contract's MQTT runs above use the embedded broker): each node's
    own ledger, reported at the stop, is at most what the summary says of it."""
    config = replace(_config(name), run={"mode": "mqtt"}, mqtt={"hosts": 2, "broker_url": mosquitto_broker.url},
                     stragglers={"model": "bernoulli", "p": 0.3})
    result = run_experiment(config, out_dir=tmp_path / "mqtt", quiet=True)
    assert result.summary["status"] == "completed"
    assert {n["ledger_check"] for n in result.summary["nodes"].values()} <= {"confirmed", "raised"}
