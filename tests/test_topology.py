"""testbed.topology by example: the graph families, the graph the radio gives, mobility, the run's
topology over its rounds and its refusals (properties on arbitrary graphs: test_topology_properties.py)."""

from __future__ import annotations

import math
import tracemalloc

import numpy as np
import pydantic
import pytest

from testbed.errors import ConfigError
from testbed.topology import Graph, LinkBudget, Topology, TopologySection, mixing_weights, spectral_gap
from testbed.topology import kinds
from testbed.topology import mixing as mixing_module
from testbed.topology import geometric
from testbed.topology.geometric import RandomWaypoint, geometric_graph
from testbed.topology.topology import MAX_ADJACENCY_ENTRIES

#: The speed of light, m/s (Friis written out below, not channel's).
C_MPS = 299_792_458.0
BUDGET = LinkBudget(power_w=0.1, noise_power_w=1e-12, carrier_hz=2.4e9, area_m=400.0)


def _edge_set(graph: Graph) -> set[tuple[int, int]]:
    return {(int(i), int(j)) for i, j in graph.edges()}


# ------------------------------------------------------------------------------------ Graph

def test_from_edges_merges_duplicates_and_orientation():
    g = Graph.from_edges(5, [(0, 1), (1, 0), (3, 1), (1, 3), (0, 1), (4, 2)])
    assert g.edges().tolist() == [[0, 1], [1, 3], [2, 4]]
    assert g.degrees.tolist() == [1, 2, 1, 1, 1] and g.num_edges == 3
    assert g.neighbours(1).tolist() == [0, 3]


@pytest.mark.parametrize("edges, words", [([(0, 5)], "outside 0..4"), ([(-1, 2)], "outside 0..4"),
                                          ([(2, 2)], "itself")])
def test_from_edges_refuses_a_node_out_of_range_or_a_self_loop(edges, words):
    with pytest.raises(ValueError, match=words):
        Graph.from_edges(5, edges)


def test_ring_and_torus_are_regular_with_the_right_edges():
    ring = kinds.ring(7)
    assert set(ring.degrees.tolist()) == {2} and ring.num_edges == 7
    assert _edge_set(ring) == {tuple(sorted((i, (i + 1) % 7))) for i in range(7)}
    torus = kinds.torus(12, rows=3)  # 3 x 4 grid with wrap-around
    assert set(torus.degrees.tolist()) == {4} and torus.num_edges == 24
    expected = set()
    for r in range(3):
        for c in range(4):
            here = r * 4 + c
            for there in (r * 4 + (c + 1) % 4, ((r + 1) % 3) * 4 + c):
                expected.add(tuple(sorted((here, there))))
    assert _edge_set(torus) == expected
    assert kinds.torus_rows(36) == 6 and kinds.torus_rows(30) == 5


@pytest.mark.parametrize("call, words", [(lambda: kinds.ring(2), "at least 3"),
                                         (lambda: kinds.torus(12, rows=5), "does not divide"),
                                         (lambda: kinds.torus(8), "at least 3 rows"),
                                         (lambda: kinds.torus(7), "at least 3 rows")])
def test_ring_and_torus_refuse_what_is_not_one(call, words):
    with pytest.raises(ValueError, match=words):
        call()


@pytest.mark.parametrize("n, d", [(10, 3), (11, 4), (30, 8), (6, 5), (2, 1), (50, 1)])
def test_k_regular_is_exactly_regular_and_simple(n, d):
    for seed in range(5):
        g = kinds.k_regular(n, d, np.random.default_rng(seed))
        assert set(g.degrees.tolist()) == {d}
        rows = [g.neighbours(i).tolist() for i in range(n)]
        assert all(i not in row and len(set(row)) == len(row) for i, row in enumerate(rows))


@pytest.mark.parametrize("n, d", [(9, 3), (5, 5), (5, 0), (4, 7)])
def test_k_regular_refuses_an_impossible_degree(n, d):
    with pytest.raises(ValueError, match="no .*-regular graph"):
        kinds.k_regular(n, d, np.random.default_rng(0))


def test_erdos_renyi_edge_counts_are_binomial():
    """E ~ Binomial(M, p): at 400 fixed seeds the mean count is inside mean ± 4 standard errors
    (deterministic at these seeds, so never flaky), and every pair is equally likely."""
    n, p = 40, 0.1
    pairs = n * (n - 1) // 2
    counts = np.array([kinds.erdos_renyi(n, p, np.random.default_rng(s)).num_edges for s in range(400)])
    mean, sd = pairs * p, math.sqrt(pairs * p * (1 - p))
    assert abs(counts.mean() - mean) <= 4 * sd / math.sqrt(counts.size)
    assert abs(counts.std() - sd) <= 0.2 * sd
    # Each of the 15 pairs of 6 nodes, over 2000 draws: Binomial(2000, 0.3) each, within 5 sd.
    hits = np.zeros((6, 6))
    for s in range(2000):
        e = kinds.erdos_renyi(6, 0.3, np.random.default_rng(s)).edges()
        hits[e[:, 0], e[:, 1]] += 1
    upper = hits[np.triu_indices(6, 1)]
    assert np.all(np.abs(upper - 600) <= 5 * math.sqrt(2000 * 0.3 * 0.7))
    assert kinds.erdos_renyi(8, 1.0, np.random.default_rng(0)) == Graph.complete(8)
    assert kinds.erdos_renyi(8, 0.0, np.random.default_rng(0)).num_edges == 0


def test_erdos_renyi_memory_is_that_of_its_edges_and_chunks_join(monkeypatch):
    """Above p = 2 % numpy's choice without replacement permuted every pair (144 MB here, 1.6 GB at
    N = 20,000, p = 0.03): the draw's peak is now within 2x of building the graph of its edges.
    Drawn in many small chunks, the counts are still Binomial(M, p) and every pair possible."""
    n, p = 6000, 0.025
    tracemalloc.start()
    g = kinds.erdos_renyi(n, p, np.random.default_rng(0))
    drawn = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    edges = g.edges()
    tracemalloc.start()
    Graph.from_edges(n, edges)
    built = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    # 2x: Graph.from_edges builds its keys in place (no (2E, 2) copy), which made `built` smaller
    # (29 MB here) than when this bound was 1.5x; the draw (44 MB) stays far below the 144 MB of
    # permuting every pair.
    assert drawn < 2 * built
    monkeypatch.setattr(kinds, "_MAX_CHUNK", 7)
    pairs = 40 * 39 // 2
    drawn_graphs = [kinds.erdos_renyi(40, 0.2, np.random.default_rng(s)) for s in range(300)]
    counts = np.array([d.num_edges for d in drawn_graphs])
    assert abs(counts.mean() - pairs * 0.2) <= 4 * math.sqrt(pairs * 0.2 * 0.8 / 300)
    union = set().union(*(_edge_set(d) for d in drawn_graphs))
    assert len(union) == pairs  # a pair missed by all 300 draws: probability 0.8³⁰⁰ each


def test_pair_of_is_exact_for_every_index_at_small_n_and_at_row_ends_for_large_n():
    for n in range(2, 70):
        i, j = np.triu_indices(n, 1)
        assert kinds._pair_of(np.arange(n * (n - 1) // 2), n).tolist() == np.column_stack([i, j]).tolist()
    n = 100_003  # float rounding near the row boundaries of a big triangle
    rows = np.array([0, 1, 2, 5000, 70_000, n - 3, n - 2], dtype=np.int64)
    starts = rows * n - rows * (rows + 1) // 2
    lengths = n - 1 - rows
    index = np.concatenate([starts, starts + lengths - 1])
    expected = np.concatenate([np.column_stack([rows, rows + 1]), np.column_stack([rows, np.full_like(rows, n - 1)])])
    assert kinds._pair_of(index, n).tolist() == expected.tolist()


# ------------------------------------------------------------------------- the radio's graph

def test_range_is_the_friis_formula_written_out():
    """SNR(r) = P (c / (4π r f))² / (2σ²) = 10^(threshold/10): r = c/(4π f) · sqrt(P / (2σ² 10^(t/10)))."""
    for threshold_db in (-5.0, 0.0, 10.0, 27.5):
        expected = C_MPS / (4 * math.pi * BUDGET.carrier_hz) * math.sqrt(
            BUDGET.power_w / (2 * BUDGET.noise_power_w * 10 ** (threshold_db / 10)))
        r = BUDGET.range_m(threshold_db)
        assert r == pytest.approx(expected, rel=1e-9)
        assert float(BUDGET.snr_db(np.array(r))) == pytest.approx(threshold_db, abs=1e-9)


def test_geometric_graph_is_the_brute_force_distance_check_and_the_snr_threshold():
    rng = np.random.default_rng(4)
    pos = rng.uniform(0, BUDGET.area_m, size=(150, 2))
    threshold_db = 30.0
    r = BUDGET.range_m(threshold_db)
    assert 20 < r < 200  # a sparse graph, not an empty or complete one
    g = geometric_graph(pos, r)
    brute = {(i, j) for i in range(150) for j in range(i + 1, 150) if math.dist(pos[i], pos[j]) <= r}
    assert _edge_set(g) == brute and 0 < len(brute) < 150 * 149 / 2
    d = np.linalg.norm(pos[:, None, :] - pos[None, :, :], axis=2)
    snr = BUDGET.snr_db(d)
    adj = g.adjacency().toarray() > 0
    off = ~np.eye(150, dtype=bool)
    assert np.all(snr[adj] >= threshold_db - 1e-9)
    assert np.all(snr[off & ~adj] < threshold_db + 1e-9)


def test_geometric_graph_crosses_chunks(monkeypatch):
    """Chunks of a few rows: the same graph as the brute force."""
    monkeypatch.setattr(geometric, "_CHUNK_PAIRS", 7 * 1100)
    rng = np.random.default_rng(1)
    pos = rng.uniform(0, 100, size=(1100, 2))
    g = geometric_graph(pos, 3.0)
    d2 = ((pos[:, None, :] - pos[None, :, :]) ** 2).sum(axis=2)
    i, j = np.nonzero(np.triu(d2 <= 9.0, 1))
    assert g.edges().tolist() == np.column_stack([i, j]).tolist()


def test_geometric_graph_memory_does_not_grow_with_n():
    """4000 nodes: chunks of about 2^20 pairs (rows of all N columns and a 3-d difference were 165 MB)."""
    pos = np.random.default_rng(0).uniform(0, 1, size=(4000, 2))
    tracemalloc.start()
    g = geometric_graph(pos, 0.01)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 40_000_000 and g.num_edges > 0


def test_random_waypoint_moves_at_most_its_speed_and_stays_in_the_area():
    area, speed, block_s = 50.0, 3.0, 2.5
    start = np.random.default_rng(0).uniform(0, area, size=(40, 2))
    walk = RandomWaypoint(start, area, speed, block_s, lambda b: np.random.default_rng(1000 + b))
    previous = walk.positions(0)
    assert np.array_equal(previous, start)
    moved = 0.0
    for block in range(1, 60):
        here = walk.positions(block)
        step = np.linalg.norm(here - previous, axis=1)
        assert np.all(step <= speed * block_s * (1 + 1e-12))
        assert np.all((here >= 0) & (here < area))
        moved += step.sum()
        previous = here
    assert moved > 0.5 * 40 * 59 * speed * block_s  # they do walk (pauses only on arrival)
    assert np.array_equal(walk.positions(7), walk.positions(7))


def test_random_waypoint_keeps_one_block_and_walks_the_same_way_again():
    """A long walk of many nodes holds its current block only (it kept every block: 24 MB here),
    and an earlier block asked after a later one is the same as on the first walk."""
    start = np.random.default_rng(0).uniform(0, 100.0, size=(1000, 2))

    def walk():
        return RandomWaypoint(start, 100.0, 1.0, 5.0, lambda b: np.random.default_rng([7, b]))

    first, again = walk(), walk()
    tracemalloc.start()
    late = first.positions(1500).copy()
    kept = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert kept < 1_000_000
    early = first.positions(30).copy()
    assert np.array_equal(early, again.positions(30)) and np.array_equal(late, again.positions(1500))


# ------------------------------------------------------------------------- mixing, spectral gap

def test_uniform_on_the_complete_graph_is_dwfls_matrix():
    n = 7
    w = mixing_weights(Graph.complete(n), "uniform").matrix()
    assert np.array_equal(w, (np.ones((n, n)) - np.eye(n)) / (n - 1))


def test_the_spectral_gap_of_a_ring_is_its_closed_form():
    """MH on a ring: W = I/3 + (shift + shift⁻¹)/3, eigenvalues 1/3 + 2/3 cos(2πk/N)."""
    for n in (5, 8, 13):
        lam = 1 / 3 + 2 / 3 * np.cos(2 * np.pi * np.arange(n) / n)
        expected = 1 - np.sort(np.abs(lam))[-2]
        assert spectral_gap(mixing_weights(kinds.ring(n), "metropolis_hastings")) == pytest.approx(expected, abs=1e-12)
    # uniform on an even ring is bipartite: eigenvalue −1, gap 0; lazily (η = 1/2) it is not.
    assert spectral_gap(mixing_weights(kinds.ring(8), "uniform")) == pytest.approx(0.0, abs=1e-12)
    assert spectral_gap(mixing_weights(kinds.ring(8), "uniform"), laziness=0.5) == pytest.approx(
        1 - (0.5 + 0.5 * math.cos(2 * math.pi / 8)), abs=1e-12)


def test_the_sparse_spectral_gap_agrees_with_the_dense_one(monkeypatch):
    """Above _DENSE_MAX_NODES the gap comes from scipy's Lanczos (the limit lowered here, so that
    the dense reference stays cheap): the dense eigenvalues agree, on a regular and an irregular graph."""
    monkeypatch.setattr(mixing_module, "_DENSE_MAX_NODES", 50)
    graphs = [kinds.k_regular(300, 4, np.random.default_rng(0)),
              geometric_graph(np.random.default_rng(2).uniform(0, 1, size=(300, 2)), 0.15)]
    assert graphs[1].is_connected and len(set(graphs[1].degrees.tolist())) > 3
    for g in graphs:
        for rule in ("metropolis_hastings", "uniform"):
            w = mixing_weights(g, rule)
            eig = np.sort(np.abs(np.linalg.eigvals(w.matrix())))
            assert spectral_gap(w) == pytest.approx(1 - eig[-2], abs=1e-8)


# ------------------------------------------------------------------------------------ Topology

def test_same_seed_same_graphs_and_another_seed_another():
    section = TopologySection(kind="k_regular", degree=4, coherence_rounds=3)
    a, b, c = (Topology(section, 30, seed) for seed in (5, 5, 6))
    for r in range(0, 12, 2):
        assert a.graph(r) == b.graph(r)
    assert a.graph(0) != c.graph(0)


@pytest.mark.parametrize("section", [TopologySection(kind="k_regular", degree=4, coherence_rounds=3),
                                     TopologySection(kind="erdos_renyi", p=0.3, coherence_rounds=3),
                                     TopologySection(kind="random_geometric", snr_threshold_db=30.0, speed_mps=5.0,
                                                     coherence_rounds=3)])
def test_coherence_redraws_random_kinds_between_blocks_not_within(section):
    topo = Topology(section, 30, seed=2, link_budget=BUDGET)
    for block in range(4):
        first = topo.graph(3 * block)
        assert topo.graph(3 * block + 1) == first and topo.graph(3 * block + 2) == first
        assert topo.graph(3 * block + 3) != first
    if section.kind == "random_geometric":
        assert not np.array_equal(topo.positions_m(0), topo.positions_m(3))
        assert np.array_equal(topo.positions_m(3), topo.positions_m(5))


def test_a_static_random_graph_is_one_graph_for_the_run():
    topo = Topology(TopologySection(kind="erdos_renyi", p=0.3), 20, seed=1)
    assert all(topo.graph(r) == topo.graph(0) for r in (1, 7, 500))
    assert topo.positions_m(0) is None


def test_a_disconnected_graph_is_a_config_error_naming_the_key_unless_allowed():
    section = dict(kind="erdos_renyi", p=0.02)
    topo = Topology(TopologySection(**section), 40, seed=0)
    assert not topo.graph(0).is_connected
    with pytest.raises(ConfigError) as info:
        topo.check(rounds=5)
    assert info.value.key == "topology.allow_disconnected" and "\n" not in str(info.value)
    Topology(TopologySection(**section, allow_disconnected=True), 40, seed=0).check(rounds=5)
    Topology(TopologySection(kind="ring"), 40, seed=0).check(rounds=5)


def test_check_of_the_complete_graph_builds_nothing():
    """The complete graph is connected: checking a run of 20,000 nodes allocates no N² arrays."""
    topo = Topology(TopologySection(), 20_000, seed=0)
    tracemalloc.start()
    topo.check(rounds=10)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1_000_000


def test_a_graph_too_large_is_refused_before_anything_is_allocated():
    tracemalloc.start()
    with pytest.raises(ConfigError) as info:
        Topology(TopologySection(kind="erdos_renyi", p=0.5), 1_000_000, seed=0)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 1_000_000
    assert info.value.key == "topology.p" and "\n" not in str(info.value) and f"{MAX_ADJACENCY_ENTRIES:.0e}" in str(info.value)
    with pytest.raises(ConfigError, match="topology.degree"):
        Topology(TopologySection(kind="k_regular", degree=100), 1_000_000, seed=0)
    with pytest.raises(ConfigError, match="topology.snr_threshold_db"):  # the range covers the whole area
        Topology(TopologySection(kind="random_geometric", snr_threshold_db=-30.0), 20_000, seed=0, link_budget=BUDGET)


def test_random_geometric_without_a_link_budget_names_the_kind():
    with pytest.raises(ConfigError, match="topology.kind.*link budget"):
        Topology(TopologySection(kind="random_geometric"), 10, seed=0).graph(0)


def test_random_geometric_is_the_graph_of_its_positions_at_its_range():
    section = TopologySection(kind="random_geometric", snr_threshold_db=30.0)
    topo = Topology(section, 60, seed=3, link_budget=BUDGET)
    pos = topo.positions_m(0)
    assert pos.shape == (60, 2) and np.all((pos >= 0) & (pos < BUDGET.area_m))
    assert topo.graph(0) == geometric_graph(pos, BUDGET.range_m(30.0))
    assert topo.describe(rounds=4, default_mixing="uniform")["range_m"] == BUDGET.range_m(30.0)


@pytest.mark.parametrize("n", [2, 3, 9])
@pytest.mark.parametrize("rule", ["metropolis_hastings", "uniform"])
def test_describe_of_the_complete_graph_is_its_closed_form(n, rule):
    described = Topology(TopologySection(), n, seed=0).describe(rounds=3, default_mixing=rule)
    assert described["spectral_gap"] == pytest.approx(spectral_gap(mixing_weights(Graph.complete(n), rule)), abs=1e-9)
    assert (described["min_degree"], described["max_degree"], described["mean_degree"]) == (n - 1, n - 1, n - 1)
    assert described["kind"] == "complete" and described["mixing"] == rule and described["blocks"] == 1


def test_describe_resolves_auto_and_counts_blocks():
    topo = Topology(TopologySection(kind="torus", mixing="metropolis_hastings"), 16, seed=0)
    d = topo.describe(rounds=10, default_mixing="uniform")
    assert d["mixing"] == "metropolis_hastings" and d["blocks"] == 1 and d["min_degree"] == d["max_degree"] == 4
    d = Topology(TopologySection(kind="k_regular", coherence_rounds=4), 16, seed=0).describe(10, "uniform")
    assert d["mixing"] == "uniform" and d["blocks"] == 3


# --------------------------------------------------------------------------- [topology] keys

@pytest.mark.parametrize("keys, named", [
    (dict(kind="ring", degree=3), "degree"), (dict(kind="k_regular", p=0.2), "p"),
    (dict(kind="ring", rows=3), "rows"), (dict(kind="ring", path="g.txt"), "path"),
    (dict(kind="k_regular", snr_threshold_db=3.0), "snr_threshold_db"),
    (dict(kind="torus", speed_mps=1.0), "speed_mps"),
    (dict(kind="random_geometric", round_s=2.0), "round_s"),
    (dict(kind="ring", coherence_rounds=2), "coherence_rounds"),
    (dict(kind="file"), "path"), (dict(kind="star"), "kind"), (dict(mixing="max_degree"), "mixing"),
    (dict(kind="erdos_renyi", p=0.0), "p"), (dict(kind="k_regular", degree=0), "degree"),
])
def test_section_refuses_a_key_that_does_not_apply_or_is_out_of_range(keys, named):
    with pytest.raises(pydantic.ValidationError, match=named):
        TopologySection(**keys)


def test_section_takes_each_kinds_own_keys():
    TopologySection(kind="k_regular", degree=3, coherence_rounds=2)
    TopologySection(kind="random_geometric", snr_threshold_db=5.0, speed_mps=1.5, round_s=0.5, coherence_rounds=4)
    TopologySection(kind="file", path="g.txt", mixing="uniform", allow_disconnected=True)


# ------------------------------------------------------------------------------ the file kind

def test_file_kind_reads_an_edge_list(tmp_path):
    path = tmp_path / "g.txt"
    path.write_text("# a square\n0 1\n1,2\n 2 3  # last side\n3 0\n\n")
    topo = Topology(TopologySection(kind="file", path=str(path)), 4, seed=0)
    assert topo.graph(0) == kinds.ring(4)


@pytest.mark.parametrize("text, words", [("0 1\n1 x\n", ":2: expected two node ids"), ("0 9\n", "outside 0..3"),
                                         ("1 1\n", "itself"), ("0 1 2\n", ":1: expected"),
                                         ("0 ²\n", ":1: expected"), ("0 99999999999999999999999\n", "outside 0..3")])
def test_file_kind_refuses_garbage_in_one_line_naming_the_path(tmp_path, text, words):
    path = tmp_path / "g.txt"
    path.write_text(text)
    with pytest.raises(ConfigError, match=words) as info:
        Topology(TopologySection(kind="file", path=str(path)), 4, seed=0).graph(0)
    assert info.value.key == "topology.path" and "\n" not in str(info.value)


def test_file_kind_refuses_a_missing_or_binary_file(tmp_path):
    with pytest.raises(ConfigError, match="topology.path"):
        Topology(TopologySection(kind="file", path=str(tmp_path / "none.txt")), 4, seed=0).graph(0)
    (tmp_path / "bin").write_bytes(b"\xff\xfe0 1\n")
    with pytest.raises(ConfigError, match="topology.path"):
        Topology(TopologySection(kind="file", path=str(tmp_path / "bin")), 4, seed=0).graph(0)
