"""The decentralised baselines D-PSGD and gossip with local DP (testbed.algorithms.graph_exchange)
and their orthogonal digital exchange (testbed.algorithms.gossip_channel): one round of each on a
ring of four written out by hand, the exchange keeps the senders' average under Metropolis–Hastings
weights on any graph, each release is charged as what it is, each slot's airtime and energy are the
Shannon rate's of the weakest neighbour link, a run from an experiment file, and a disconnected
graph is a config error."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, strategies as st

from channel import FadingSchedule
from testbed.algorithms.batches import clipped_gradients
from testbed.algorithms.contract import RoundContext
from testbed.algorithms.gossip_channel import GraphChannel, Links
from testbed.algorithms.graph_exchange import ExchangeSection, GraphExchange
from testbed.assembly.config import load_config
from testbed.cli import main
from testbed.data.synthetic import make_logistic
from testbed.errors import ConfigError
from testbed.learning.models import LogisticRegression
from testbed.ledger.events import GaussianEvent
from testbed.ledger.files import read_ledger
from testbed.reports.results import read_summary
from testbed.streams.rng import Purpose, stream
from testbed.topology import Graph, Topology, TopologySection, mixing_weights

SEED, DELTA = 7, 1e-5
#: The Metropolis–Hastings weights of a ring of four, by hand: every degree is 2, so
#: W_ik = 1/(1 + max(2, 2)) = 1/3 for the two neighbours and W_ii = 1 − 2/3.
RING4 = np.array([[1, 1, 0, 1], [1, 1, 1, 0], [0, 1, 1, 1], [1, 0, 1, 1]]) / 3.0


def _ring4(kind: str, *, epsilon: float | None = None, power_dbm: float = 30.0, noise_power_w: float = 0.5):
    data = make_logistic(num_nodes=4, samples_per_node=40, dim=5, seed=1)
    model = LogisticRegression(5, 2)
    radio = ExchangeSection(fading="none", power_dbm=power_dbm, noise_power_w=noise_power_w).radio(4)
    links = Links(Topology(TopologySection(kind="ring"), 4, SEED), radio, SEED, 64 * model.num_params)
    alg = GraphExchange(model, links, kind=kind, rounds=3, batch=8, lr=0.2, gmax=0.5, delta=DELTA, epsilon=epsilon,
                        seed=SEED)
    state = {"models": np.random.default_rng(0).normal(size=(4, model.num_params))}  # four different models
    return data, model, alg, state


def _round(alg, data, state, round_index: int = 0, senders=(0, 1, 2, 3)):
    ctx = RoundContext(round_index, SEED, 4, tuple(senders))
    out = alg.node_step(alg.downlink(state, ctx, ctx.expected), data.train.select(list(senders)), ctx.expected, ctx)
    full = np.zeros((4, alg.model.num_params))
    full[list(senders)] = out.tensors["signal"]
    closed = ctx.closed(senders)
    heard = alg.channel.superpose(full, alg.channel_tensors(closed), closed)[list(senders)]
    return out, alg.node_finish(out.carry, heard, ctx.expected, closed).tensors["model"]


def _noise(node: int, round_index: int, size: int) -> np.ndarray:
    return stream(SEED, node, round_index, Purpose.NOISE).standard_normal(size)


# ----------------------------------------------------------------------------- one round by hand


@pytest.mark.parametrize("epsilon", [None, 0.8], ids=["noiseless", "private"])
def test_one_dpsgd_round_on_a_ring_of_four_by_hand(epsilon):
    """Lian et al., Algorithm 1: x_i ← Σ_k W_ik x̂_k − γ g_i(x_i), the gradient at the node's own
    model before mixing, x̂_k = x_k + n_k for a neighbour, x_i itself for the node."""
    data, model, alg, state = _ring4("dpsgd", epsilon=epsilon)
    x = state["models"]
    _, new = _round(alg, data, state)
    grad = clipped_gradients(model, x, data.train, range(4), 0, SEED, batch=8, gmax=0.5)
    sigma = 0.0 if epsilon is None else 2 * 0.2 * 0.5 * math.sqrt(2 * math.log(1.25 / DELTA)) / epsilon
    sent = x + sigma * np.array([_noise(k, 0, x.shape[1]) for k in range(4)])
    for i, (left, right) in enumerate([(3, 1), (0, 2), (1, 3), (2, 0)]):
        want = (x[i] + sent[left] + sent[right]) / 3 - 0.2 * grad[i]
        np.testing.assert_allclose(new[i], want, rtol=0, atol=1e-12)


@pytest.mark.parametrize("epsilon", [None, 0.8], ids=["noiseless", "private"])
def test_one_gossip_round_on_a_ring_of_four_by_hand(epsilon):
    """x_i' = x_i − γ g_i; x_i'' = (x_i' + (x_l' + n_l) + (x_r' + n_r)) / 3 on the ring."""
    data, model, alg, state = _ring4("gossip", epsilon=epsilon)
    x = state["models"]
    out, new = _round(alg, data, state)
    local = x - 0.2 * clipped_gradients(model, x, data.train, range(4), 0, SEED, batch=8, gmax=0.5)
    sigma = 0.0 if epsilon is None else 2 * 0.2 * 0.5 * math.sqrt(2 * math.log(1.25 / DELTA)) / epsilon
    sent = local + sigma * np.array([_noise(k, 0, x.shape[1]) for k in range(4)])
    np.testing.assert_allclose(out.tensors["signal"], sent, rtol=0, atol=1e-12)
    for i, (left, right) in enumerate([(3, 1), (0, 2), (1, 3), (2, 0)]):
        np.testing.assert_allclose(new[i], (local[i] + sent[left] + sent[right]) / 3, rtol=0, atol=1e-12)


def test_a_silent_neighbours_weight_goes_to_the_receiver():
    """Node 3 does not send: node 0 keeps 2/3 of its own model, node 2 too; node 1 hears both."""
    data, model, alg, state = _ring4("gossip")
    x = state["models"]
    _, new = _round(alg, data, state, senders=(0, 1, 2))
    local = x - 0.2 * clipped_gradients(model, x, data.train, range(4), 0, SEED, batch=8, gmax=0.5)
    np.testing.assert_allclose(new[0], (2 * local[0] + local[1]) / 3, atol=1e-12)
    np.testing.assert_allclose(new[1], (local[0] + local[1] + local[2]) / 3, atol=1e-12)
    np.testing.assert_allclose(new[2], (local[1] + 2 * local[2]) / 3, atol=1e-12)


def test_uniform_mixing_averages_the_neighbours_alone():
    """mixing = "uniform": W_ik = 1/d_i, W_ii = 0, so on the ring x_i ← (x_l + x_r)/2 − γ g_i."""
    data, model, _, state = _ring4("dpsgd")
    radio = ExchangeSection(fading="none").radio(4)
    topo = Topology(TopologySection(kind="ring", mixing="uniform"), 4, SEED)
    alg = GraphExchange(model, Links(topo, radio, SEED, 64 * model.num_params), kind="dpsgd", rounds=1, batch=8,
                        lr=0.2, gmax=0.5, delta=DELTA, seed=SEED)
    x = state["models"]
    _, new = _round(alg, data, state)
    grad = clipped_gradients(model, x, data.train, range(4), 0, SEED, batch=8, gmax=0.5)
    for i, (left, right) in enumerate([(3, 1), (0, 2), (1, 3), (2, 0)]):
        np.testing.assert_allclose(new[i], (x[left] + x[right]) / 2 - 0.2 * grad[i], rtol=0, atol=1e-12)


def test_the_ring_weights_are_metropolis_hastings_by_default():
    _, _, alg, _ = _ring4("dpsgd")
    np.testing.assert_allclose(alg.links.mixing(0).matrix(), RING4, atol=1e-15)


# ----------------------------------------------------------------------------- the exchange keeps the average


class _FixedGraph:
    """A topology of one given graph (what Links reads of a Topology)."""

    kind = "file"
    schedule = FadingSchedule(None)

    def __init__(self, graph: Graph, rule: str):
        self.graph, self.rule, self.num_nodes = graph, rule, graph.num_nodes

    def mixing(self, round_index: int, default: str):
        return mixing_weights(self.graph, self.rule)

    def positions_m(self, round_index: int):
        return None


@st.composite
def _exchanges(draw):
    n = draw(st.integers(2, 12))
    pairs = draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)).filter(lambda p: p[0] != p[1]),
                          max_size=3 * n))
    senders = draw(st.lists(st.integers(0, n - 1), min_size=1, unique=True))
    models = draw(st.lists(st.lists(st.floats(-1e3, 1e3), min_size=3, max_size=3), min_size=n, max_size=n))
    return Graph.from_edges(n, pairs), sorted(senders), np.array(models)


@given(_exchanges())
def test_metropolis_hastings_exchange_keeps_the_senders_average(case):
    """On any graph, with any set of senders and no noise: the senders' new models average to their
    old average (the weights among them stay symmetric, each row summing to one)."""
    graph, senders, models = case
    radio = ExchangeSection(fading="none").radio(graph.num_nodes)
    links = Links(_FixedGraph(graph, "metropolis_hastings"), radio, SEED, payload_bits=64 * 3)
    alg = GraphExchange(LogisticRegression(1, 2), links, kind="gossip", rounds=1, batch=1, lr=0.1, gmax=1.0,
                        delta=DELTA, seed=SEED)
    signals = np.zeros_like(models)
    signals[senders] = models[senders]
    ctx = RoundContext(0, SEED, graph.num_nodes, tuple(senders)).closed(senders)
    heard = GraphChannel(links).superpose(signals, {}, ctx)
    new = alg.node_finish({"own": models[senders].copy()}, heard[senders], senders, ctx).tensors["model"]
    scale = max(1.0, float(np.abs(models).max()))
    np.testing.assert_allclose(new.mean(axis=0), models[senders].mean(axis=0), rtol=0, atol=1e-12 * scale)


# ----------------------------------------------------------------------------- privacy in the ledger


@pytest.mark.parametrize("kind", ["dpsgd", "gossip"])
def test_every_release_is_one_gaussian_event_the_peers_observe(kind):
    data, _, alg, state = _ring4(kind, epsilon=0.5)
    out, _ = _round(alg, data, state, round_index=2)
    sigma = 2 * 0.2 * 0.5 * math.sqrt(2 * math.log(1.25 / DELTA)) / 0.5  # Δ sqrt(2 ln(1.25/δ)) / ε
    for node, events in zip(range(4), out.events):
        privacy = [e for e in events if e.kind == "privacy"]
        assert privacy == [GaussianEvent(node, 2, pytest.approx(sigma, rel=1e-12), pytest.approx(0.2), 1,
                                         observer="peers", issuer="node", clip_norm=0.5)]
    noiseless, _, silent, state = _ring4(kind)
    out, _ = _round(silent, noiseless, state)
    assert not [e for events in out.events for e in events if e.kind == "privacy"]


# ----------------------------------------------------------------------------- airtime and energy


def test_each_slot_is_the_payload_at_the_shannon_rate_and_each_node_listens_to_its_neighbours():
    """Ring of four, no fading: every link has SNR P/(2σ_m²) = 1 W / 1 W; 64·P bits at
    B log2(2) = 1 Mbit/s; a node is on the air for its slot and its two neighbours'."""
    data, model, alg, state = _ring4("gossip", power_dbm=30.0, noise_power_w=0.5)
    slot = 64 * model.num_params / 1e6
    events, _ = _round(alg, data, state)
    for node, node_events in enumerate(events.events):
        comm = next(e for e in node_events if e.kind == "communication")
        assert comm.airtime_s == pytest.approx(3 * slot, rel=1e-12)
        assert comm.energy_j == pytest.approx(1.0 * slot, rel=1e-12)  # P = 1 W, its own slot only
        assert (comm.bytes_up, comm.bytes_down) == (8 * model.num_params, 2 * 8 * model.num_params)


def test_a_geometric_links_slot_is_set_by_its_farthest_neighbour():
    """random_geometric: the free-space gain (λ / 4πd)² of each pair from the positions; a sender's
    rate is that of its weakest (farthest) neighbour, so every neighbour decodes."""
    section = ExchangeSection(fading="none", power_dbm=20.0, noise_figure_db=7.0, area_m=200.0)
    topo = Topology(TopologySection(kind="random_geometric", snr_threshold_db=40.0, allow_disconnected=True), 12,
                    SEED, section.link_budget())
    links = Links(topo, section.radio(12), SEED, payload_bits=6400)
    cost, graph, pos = links.round_links(0), topo.graph(0), topo.positions_m(0)
    assert graph.num_edges > 0
    wavelength = 299_792_458.0 / section.carrier_hz
    noise = 2 * section.noise_power_w_resolved  # complex noise power
    slots = np.zeros(12)
    for k in range(12):
        if not len(graph.neighbours(k)):
            continue
        farthest = max(np.linalg.norm(pos[k] - pos[i]) for i in graph.neighbours(k))
        gain = (wavelength / (4 * math.pi * farthest)) ** 2
        slots[k] = 6400 / (section.bandwidth_hz * math.log2(1 + section.power_w * gain / noise))
    np.testing.assert_allclose(cost.slot_s, slots, rtol=1e-9)
    np.testing.assert_allclose(cost.energy_j, section.power_w * slots, rtol=1e-9)
    for k in range(12):
        assert cost.airtime_s[k] == pytest.approx(slots[k] + sum(slots[i] for i in graph.neighbours(k)), rel=1e-12)
    assert cost.round_s == pytest.approx(slots.sum())
    # An edge exists where the SNR at full power clears the threshold: every slot's rate is above it.
    assert (cost.rate_bps[graph.degrees > 0] >= section.bandwidth_hz * math.log2(1 + 10 ** 4) * (1 - 1e-9)).all()


# ----------------------------------------------------------------------------- runs and config errors

EXPERIMENT = """
[run]
name = "baseline"
algorithm = "{kind}"
seed = 3
[data]
dataset = "synthetic"
num_nodes = 8
samples_per_node = 80
dim = 6
[{kind}]
rounds = 12
batch = 16
lr = 0.5
epsilon = 2.0
fading = "rayleigh"
coherence_rounds = 4
[topology]
kind = "{topology}"
[output]
figures = false
"""


@pytest.mark.parametrize("kind", ["dpsgd", "gossip"])
def test_a_run_from_an_experiment_file(kind, tmp_path, capsys):
    path = tmp_path / "experiment.toml"
    path.write_text(EXPERIMENT.format(kind=kind, topology="ring"))
    assert main(["run", str(path), "--out", str(tmp_path / "run"), "--quiet"]) == 0
    summary = read_summary(tmp_path / "run")
    assert summary["status"] == "completed" and summary["rounds"] == 12
    settings = summary["algorithm_settings"]
    assert settings["topology"]["kind"] == "ring" and settings["topology"]["mixing"] == "metropolis_hastings"
    events = list(read_ledger(tmp_path / "run" / "ledger.csv"))
    comm = [e for e in events if e.kind == "communication"]
    assert len(comm) == 8 * 12 and all(e.airtime_s > 0 and e.energy_j > 0 for e in comm)
    # Rayleigh fading redrawn every 4 rounds: a node's slot changes between blocks, not within.
    of_0 = [e.energy_j for e in sorted(comm, key=lambda e: e.round) if e.node == 0]
    assert of_0[0] == of_0[3] != of_0[4]
    assert {e.observer for e in events if e.kind == "privacy"} == {"peers"}
    assert summary["privacy"]["guarantee"] == "dp"


def test_a_disconnected_graph_is_a_config_error(tmp_path):
    edges = tmp_path / "edges.txt"
    edges.write_text("0 1\n1 2\n2 3\n4 5\n5 6\n6 7\n")
    path = tmp_path / "experiment.toml"
    text = EXPERIMENT.format(kind="gossip", topology="file").replace('kind = "file"', f'kind = "file"\npath = "{edges.name}"')
    path.write_text(text)
    with pytest.raises(ConfigError, match="topology.allow_disconnected.*2 parts"):
        load_config(path)
    path.write_text(text.replace('kind = "file"', 'kind = "file"\nallow_disconnected = true'))
    assert load_config(path).topology.allow_disconnected



def test_a_geometric_graph_takes_its_path_loss_from_the_positions_only(tmp_path):
    path = tmp_path / "experiment.toml"
    path.write_text(EXPERIMENT.format(kind="dpsgd", topology="random_geometric")
                    .replace('fading = "rayleigh"', 'fading = "rayleigh"\npathloss = "free_space"'))
    with pytest.raises(ConfigError, match="dpsgd.pathloss"):
        load_config(path)
