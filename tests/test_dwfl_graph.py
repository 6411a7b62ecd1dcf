"""DWFL on a graph (issue 32): eq. (7)/(8) over each receiver's neighbours, the complete graph on the
graph path equal to today's dense path, silent neighbours, per-receiver privacy in the plan and the
ledger, and the configuration's refusals."""

import numpy as np
import pytest
from hypothesis import given, strategies as st

from testbed.algorithms import RoundContext
from testbed.algorithms.dwfl import Dwfl
from testbed.algorithms.dwfl_channel import Radio
from testbed.assembly import assemble
from testbed.assembly.config import load_config_text
from testbed.data.synthetic import make_logistic
from testbed.errors import ConfigError
from testbed.learning.models import LogisticRegression
from testbed.orchestration.runner import run_experiment
from testbed.privacy import dwfl as dp
from testbed.topology import Topology, TopologySection, mixing_weights

from algo_steps import run_round
from conftest import adult_file

N, DIM, SEED, ROUND = 6, 5, 3, 2
DATA = make_logistic(num_nodes=N, samples_per_node=60, dim=DIM, seed=0)
MODEL = LogisticRegression(DIM, 2)
#: Every pair joined, drawn by the graph code path (erdos_renyi with p = 1 is not kind "complete").
COMPLETE_ON_GRAPH = TopologySection(kind="erdos_renyi", p=1.0)


def _alg(topology=None, noise_power_w=1.0, sigma2=None, epsilon=0.5, eta=0.5, variant="A", scheme="ota_d2d",
         fading="none"):
    r = Radio(num_nodes=N, power_w=100.0, noise_power_w=noise_power_w, fading=fading, c_scale=0.6)
    topo = None if topology is None else Topology(topology, N, SEED)
    return Dwfl(MODEL, r, rounds=5, batch=8, lr=0.2, averaging_rate=eta, gmax=1.0, delta=1e-5,
                epsilon=None if sigma2 is not None else epsilon, sigma2=sigma2, scheme=scheme, variant=variant,
                init="independent", init_std=0.3, seed=SEED, topology=topo)


def _round(alg, excluded=frozenset()):
    state = alg.init_state(MODEL.init(None))
    payload = alg.local_step(state["models"], DATA.train, list(range(N)), ROUND, SEED)
    return payload, run_round(alg, state, DATA, ROUND, SEED, excluded)["models"]


@pytest.mark.parametrize("scheme,variant", [("ota_d2d", "A"), ("ota_d2d", "B"), ("orthogonal_d2d", "A"),
                                            ("orthogonal_d2d", "B")])
@pytest.mark.parametrize("fading", ["none", "rayleigh"])
def test_complete_graph_on_the_graph_path_is_todays_round(scheme, variant, fading):
    """The sparse path on every pair gives the dense path's models up to the order of the sums (the
    dense path forms Σ_k g_k s_k − g_i s_i, the sparse one Σ_{k≠i} g_k s_k): a few ulps of the
    signals, 1e-12 here; plans (σ², ε per receiver, ledger σ) agree to 1e-12 relative."""
    today, graph = _alg(scheme=scheme, variant=variant, fading=fading), \
        _alg(COMPLETE_ON_GRAPH, scheme=scheme, variant=variant, fading=fading)
    assert not today.on_graph and graph.on_graph
    a, b = today.plan(ROUND), graph.plan(ROUND)
    assert b.sigma2 == pytest.approx(a.sigma2, rel=1e-12) and a.sigma2 > 0
    np.testing.assert_allclose(b.epsilon, a.epsilon, rtol=1e-12)
    np.testing.assert_allclose(b.privacy_sigma, a.privacy_sigma, rtol=1e-12)
    _, new_today = _round(today)
    _, new_graph = _round(graph)
    assert np.abs(new_graph - new_today).max() <= 1e-12 * max(1.0, np.abs(new_today).max())


def test_default_topology_keeps_todays_path_bit_for_bit():
    """No [topology] and kind = "complete" build the same dense path: identical bits."""
    _, base = _round(_alg(fading="rayleigh"))
    _, complete = _round(_alg(TopologySection(kind="complete"), fading="rayleigh"))
    np.testing.assert_array_equal(base, complete)


def _psi(mixing, eta):
    return (1 - eta) * np.eye(N) + eta * mixing.matrix()


@pytest.mark.parametrize("scheme,rule", [("ota_d2d", "uniform"), ("orthogonal_d2d", "uniform"),
                                         ("orthogonal_d2d", "metropolis_hastings")])
@pytest.mark.parametrize("kind", [dict(kind="ring"), dict(kind="k_regular", degree=3)])
def test_noiseless_round_on_a_graph_is_psi(scheme, rule, kind):
    """σ = σ_m = 0: X'' = Ψ X' with Ψ = (1 − η) I + η W over the graph (eq. 8; W uniform 1/d_i or
    Metropolis–Hastings)."""
    section = TopologySection(**kind, mixing=rule)
    alg = _alg(section, noise_power_w=0.0, sigma2=0.0, scheme=scheme)
    payload, new = _round(alg)
    w = alg.mixing(ROUND)
    assert w.rule == rule
    np.testing.assert_allclose(new, _psi(w, 0.5) @ payload, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("scheme,rule", [("ota_d2d", "uniform"), ("orthogonal_d2d", "metropolis_hastings")])
def test_silent_neighbours_on_a_ring(scheme, rule):
    """Nodes 1 and 3 silent on the ring 0-1-2-3-4-5-0: node 2 hears no one and keeps x_2'; node 0
    hears only 5 (uniform: all its weight; MH: its weight to 1 stays with node 0)."""
    alg = _alg(TopologySection(kind="ring", mixing=rule), noise_power_w=0.0, sigma2=0.0, scheme=scheme)
    payload, new = _round(alg, excluded=frozenset({1, 3}))
    np.testing.assert_allclose(new[2], payload[2], rtol=0, atol=1e-13)
    if rule == "uniform":
        expect0 = 0.5 * payload[0] + 0.5 * payload[5]
    else:  # MH on a ring: 1/3 per neighbour
        expect0 = payload[0] + 0.5 * (payload[5] - payload[0]) / 3
    np.testing.assert_allclose(new[0], expect0, rtol=1e-12, atol=1e-12)


def test_ring_privacy_per_receiver_and_per_sender():
    """On a ring each receiver hears two senders (eq. 10 over N(i)); each sender is charged at the
    worse of its two receivers; σ² is calibrated at the worst receiver."""
    alg = _alg(TopologySection(kind="ring"), fading="rayleigh", noise_power_w=5.0)
    plan = alg.plan(0)
    al, g = plan.channel.alignment, plan.channel.gains
    b = g**2 * al.beta * al.power_w
    s = np.array([b[(i - 1) % N] + b[(i + 1) % N] for i in range(N)])
    var = s * plan.sigma2 + 5.0
    eps = 2 * al.c * 0.2 * 1.0 * dp.gaussian_factor(1e-5) / np.sqrt(var)
    np.testing.assert_allclose(plan.epsilon, eps, rtol=1e-12)
    assert plan.epsilon.max() == pytest.approx(0.5, rel=1e-12)
    sigma = np.array([min(var[(j - 1) % N], var[(j + 1) % N]) for j in range(N)]) ** 0.5 / al.c
    np.testing.assert_allclose(plan.privacy_sigma, sigma, rtol=1e-12)
    events = alg.releases(4, RoundContext.everyone(0, SEED, N))
    assert events[0].sigma == pytest.approx(sigma[4], rel=1e-12)


def test_silent_sender_is_charged_per_neighbourhood():
    """Node 1 silent on the ring: only its neighbours' receivers (0 and 2) heard less noise, so only
    the senders those receivers hear (5, 1→silent, 3) gain a correction; 4 is untouched."""
    alg = _alg(TopologySection(kind="ring"), fading="rayleigh")
    senders = (0, 2, 3, 4, 5)
    ctx = RoundContext.everyone(ROUND, SEED, N).closed(senders)
    state = alg.init_state(MODEL.init(None))
    from testbed.algorithms.contract import NodeResult

    out = alg.server_step(state, NodeResult((), {}), ctx)
    charged = {e.node for e in out.events}
    planned, heard = alg.privacy_sigma(ROUND, ctx.expected), alg.privacy_sigma(ROUND, senders)
    changed = {j for j in senders if heard[j] < planned[j] * (1 - 1e-12)}
    assert changed and charged == changed and 4 not in charged and changed <= {3, 5}


CONFIG = """
[run]
name = "dwfl-graph"
algorithm = "dwfl"
seed = 4
[data]
dataset = "synthetic"
num_nodes = 8
samples_per_node = 60
dim = 6
[dwfl]
rounds = 4
batch = 8
lr = 0.3
epsilon = 0.5
fading = "none"
c_scale = 0.7
[privacy]
delta = 1e-5
[output]
figures = false
"""


@pytest.mark.parametrize("overrides,key", [
    (["dwfl.scheme='ota_central'", "dwfl.init='common'", "topology.kind='ring'"], "topology.kind"),
    (["topology.kind='ring'", "topology.mixing='metropolis_hastings'"], "topology.mixing"),
    (["topology.kind='erdos_renyi'", "topology.p=0.05"], "topology.allow_disconnected"),
    (["dwfl.area_m=50.0"], "dwfl.area_m"),
])
def test_config_errors_name_the_key(overrides, key):
    data = make_logistic(num_nodes=8, samples_per_node=60, dim=6, seed=0)
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        assemble.build_algorithm(load_config_text(CONFIG, overrides), LogisticRegression(6, 2), data)


def test_run_on_a_ring_reports_its_topology(tmp_path):
    cfg = load_config_text(CONFIG, ["topology.kind='ring'"])
    r = run_experiment(cfg, out_dir=tmp_path, quiet=True)
    assert r.summary["status"] == "completed"
    topo = r.summary["topology"]
    assert topo["kind"] == "ring" and topo["mixing"] == "uniform" and topo["max_degree"] == 2
    w = mixing_weights(Topology(TopologySection(kind="ring"), 8, 4).graph(0), "uniform")
    eig = np.sort(np.abs(np.linalg.eigvalsh(_psi8(w, 0.5))))
    assert topo["effective_spectral_gap"] == pytest.approx(1 - eig[-2], abs=1e-9)


def _psi8(mixing, eta):
    n = mixing.graph.num_nodes
    return (1 - eta) * np.eye(n) + eta * mixing.matrix()


def test_default_run_reproduces_a_committed_data_row(tmp_path, monkeypatch):
    """A default (complete-graph) run regenerated by experiments/dwfl/reproduce.py gives exactly the
    committed row of fig5 (N = 10, ε = 0.1, over the air, seed 0): every field but the wall time."""
    import json
    import sys
    from pathlib import Path

    monkeypatch.setenv("TESTBED_DATA", str(adult_file().parent))
    here = Path(__file__).resolve().parents[1] / "experiments" / "dwfl"
    monkeypatch.syspath_prepend(str(here))
    import reproduce

    committed = json.loads((here / "data" / "adult" / "fig5.json").read_text())
    row = committed["runs"][0]
    got = reproduce.run_one((str(here / "base.toml"), row["overrides"], row["seed"], committed["rounds"],
                             str(tmp_path), row["key"]))
    assert {k: v for k, v in got.items() if k != "wall_s"} == {k: v for k, v in row.items() if k != "wall_s"}
    sys.modules.pop("reproduce", None)


@st.composite
def _graph_round(draw):
    """A graph on 3..7 nodes (at least one edge; possibly disconnected), the senders, the scheme."""
    n = draw(st.integers(3, 7))
    pairs = [(i, j) for i in range(n) for j in range(i + 1, n)]
    edges = draw(st.lists(st.sampled_from(pairs), min_size=1, unique=True))
    senders = draw(st.lists(st.integers(0, n - 1), min_size=1, unique=True).map(sorted))
    scheme, rule = draw(st.sampled_from([("ota_d2d", "uniform"), ("orthogonal_d2d", "uniform"),
                                         ("orthogonal_d2d", "metropolis_hastings")]))
    return n, edges, senders, scheme, rule


@given(_graph_round())
def test_any_graph_and_senders_give_eq7_over_the_heard_neighbours(tmp_path_factory, case):
    """Noise off, any graph and any set of senders: x_i'' = x_i' + η Σ_{k∈N(i)∩S} w_ik (x_k' − x_i'),
    w_ik = 1/|N(i)∩S| (uniform) or 1/(1 + max(d_i, d_k)) (Metropolis–Hastings), written densely
    here; a receiver that heard no one keeps x_i'."""
    n, edges, senders, scheme, rule = case
    path = tmp_path_factory.mktemp("g") / "edges.txt"
    path.write_text("".join(f"{i} {j}\n" for i, j in edges))
    section = TopologySection(kind="file", path=str(path), allow_disconnected=True, mixing=rule)
    # free-space path loss from random positions: unequal gains, so the alignment matters (no Sionna)
    r = Radio(num_nodes=n, power_w=100.0, noise_power_w=0.0, fading="none", pathloss="free_space", c_scale=0.6)
    alg = Dwfl(MODEL, r, rounds=5, batch=8, lr=0.2, averaging_rate=0.5, gmax=1.0, delta=1e-5, sigma2=0.0,
               scheme=scheme, seed=SEED, topology=Topology(section, n, SEED))
    rng = np.random.default_rng(len(edges))
    x = rng.standard_normal((n, MODEL.num_params))
    ctx = RoundContext(ROUND, SEED, n, tuple(range(n))).closed(senders)
    signals, pending = alg.transmit(x[senders].copy(), x[senders], senders, ROUND, SEED)
    full = np.zeros_like(x)
    full[senders] = signals
    heard = alg.channel.superpose(full, alg.channel_tensors(ctx), ctx, out=full)
    new = alg.node_finish({"pending": pending, "signal": signals}, heard[senders], senders, ctx).tensors["model"]
    adj = np.zeros((n, n))
    for i, j in edges:
        adj[i, j] = adj[j, i] = 1.0
    deg = adj.sum(1)
    on = adj * np.isin(np.arange(n), senders)[None, :]
    if rule == "uniform":
        w = np.divide(on, on.sum(1, keepdims=True), out=np.zeros_like(on), where=on.sum(1, keepdims=True) > 0)
    else:
        w = on / (1.0 + np.maximum(deg[:, None], deg[None, :]))
    expect = x + 0.5 * (w @ x - w.sum(1, keepdims=True) * x)
    np.testing.assert_allclose(new, expect[senders], rtol=1e-9, atol=1e-9)


def test_a_node_no_one_hears_releases_nothing(tmp_path):
    """Node 5 has no neighbour: it hears no model (ε_5 = 0 as a receiver), no one hears it (no
    privacy event), and it keeps its own step; σ² is calibrated over the receivers that listen."""
    path = tmp_path / "edges.txt"
    path.write_text("0 1\n1 2\n2 3\n3 4\n4 0\n")
    alg = _alg(TopologySection(kind="file", path=str(path), allow_disconnected=True), fading="rayleigh")
    plan = alg.plan(ROUND)
    assert plan.epsilon[5] == 0.0 and plan.epsilon.max() == pytest.approx(0.5, rel=1e-12)
    assert np.isinf(plan.privacy_sigma[5]) and np.isfinite(plan.privacy_sigma[:5]).all()
    ctx = RoundContext.everyone(ROUND, SEED, N)
    assert alg.releases(5, ctx) == [] and len(alg.releases(0, ctx)) == 1
    payload, new = _round(alg)
    np.testing.assert_allclose(new[5], payload[5], rtol=0, atol=1e-13)


def test_complete_graph_summary_in_closed_form():
    """The complete graph's effective gap is 1 − |1 − ηN/(N − 1)| (eig Ψ, dwfl.md §8 check 2),
    given without building W; it equals the dense eigenvalues of Ψ."""
    alg = _alg(eta=0.3)
    topo = alg.describe_topology()
    w = (np.ones((N, N)) - np.eye(N)) / (N - 1)
    eig = np.sort(np.abs(np.linalg.eigvalsh(0.7 * np.eye(N) + 0.3 * w)))
    assert topo["kind"] == "complete" and topo["mixing"] == "uniform"
    assert topo["effective_spectral_gap"] == pytest.approx(1 - eig[-2], abs=1e-12)


@pytest.mark.parametrize("scheme,variant", [("ota_d2d", "A"), ("ota_d2d", "B"), ("orthogonal_d2d", "A")])
@pytest.mark.parametrize("topology", [None, TopologySection(kind="ring"), TopologySection(kind="k_regular", degree=3)])
def test_a_round_does_not_depend_on_the_threads(monkeypatch, scheme, variant, topology):
    """Transmit, channel and receive split their rows over two threads (testbed.util.parallel), a
    few rows at a time: each row is its node's own stream and sum, so the models are the bits one
    thread gives, with some nodes silent too."""
    import testbed.util.parallel as parallel

    monkeypatch.setattr(parallel.os, "cpu_count", lambda: 2)
    monkeypatch.setattr("testbed.algorithms.dwfl.ROWS_IN_CACHE", 2)  # several blocks per thread at N = 6
    monkeypatch.setattr("testbed.algorithms.dwfl_channel.ROWS_IN_CACHE", 2)
    runs = []
    for min_numbers in (10**18, 0):  # one thread; two, whatever the size
        monkeypatch.setattr(parallel, "MIN_NUMBERS", min_numbers)
        alg = _alg(topology, scheme=scheme, variant=variant, fading="rayleigh")
        runs.append([_round(alg)[1], _round(alg, excluded=frozenset({1}))[1]])
    for one, two in zip(*runs):
        assert np.all(np.isfinite(one)) and np.abs(one).max() > 0
        np.testing.assert_array_equal(one, two)
