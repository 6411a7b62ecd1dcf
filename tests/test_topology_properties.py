"""Properties of testbed.topology on arbitrary graphs (Hypothesis): the CSR graph, its components,
both mixing rules and the spectral gap against plain references; an edge list file of any text is
a graph or a one-line refusal naming topology.path."""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest
from hypothesis import given, strategies as st

from testbed.errors import ConfigError
from testbed.topology import Graph, Topology, TopologySection, mixing_weights, spectral_gap


@st.composite
def graphs(draw, max_nodes: int = 24) -> tuple[int, list[tuple[int, int]]]:
    """(N, a list of pairs, duplicates and both orientations included, no self loops)."""
    n = draw(st.integers(1, max_nodes))
    if n == 1:
        return n, []
    pair = st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)).filter(lambda p: p[0] != p[1])
    return n, draw(st.lists(pair, max_size=3 * n))


def _bfs_components(n: int, pairs) -> list[int]:
    """Each node's component, numbered from 0 by its smallest node: a plain breadth-first search."""
    adjacent = [set() for _ in range(n)]
    for i, j in pairs:
        adjacent[i].add(j)
        adjacent[j].add(i)
    label = [-1] * n
    count = 0
    for start in range(n):
        if label[start] >= 0:
            continue
        label[start] = count
        queue = deque([start])
        while queue:
            for k in adjacent[queue.popleft()]:
                if label[k] < 0:
                    label[k] = count
                    queue.append(k)
        count += 1
    return label


@given(graphs())
def test_from_edges_is_symmetric_sorted_simple_and_merges_duplicates(case):
    n, pairs = case
    g = Graph.from_edges(n, pairs)
    a = g.adjacency().toarray() if g.indices.size else np.zeros((n, n))
    assert np.array_equal(a, a.T) and np.all(np.diag(a) == 0) and set(np.unique(a).tolist()) <= {0.0, 1.0}
    for i in range(n):
        row = g.neighbours(i)
        assert np.all(np.diff(row) > 0) and i not in row
    assert {tuple(e) for e in g.edges().tolist()} == {(min(p), max(p)) for p in pairs}
    assert g.num_edges == len({frozenset(p) for p in pairs}) and g.degrees.sum() == 2 * g.num_edges


@given(graphs())
def test_components_are_a_plain_breadth_first_search(case):
    n, pairs = case
    g = Graph.from_edges(n, pairs)
    expected = _bfs_components(n, pairs)
    assert g.components.tolist() == expected
    assert g.is_connected == (max(expected) == 0)


@given(graphs())
def test_metropolis_hastings_is_symmetric_doubly_stochastic_and_nonnegative(case):
    g = Graph.from_edges(*case)
    w = mixing_weights(g, "metropolis_hastings").matrix()
    assert np.all(w >= 0) and np.allclose(w, w.T, rtol=0, atol=1e-15)
    assert np.allclose(w.sum(axis=0), 1, rtol=0, atol=1e-12) and np.allclose(w.sum(axis=1), 1, rtol=0, atol=1e-12)
    assert np.all((w > 0) <= ((g.adjacency().toarray() > 0) | np.eye(g.num_nodes, dtype=bool)))


@given(graphs())
def test_uniform_is_row_stochastic_one_over_the_degree(case):
    g = Graph.from_edges(*case)
    w = mixing_weights(g, "uniform").matrix()
    deg = g.degrees
    assert np.all(w >= 0) and np.allclose(w.sum(axis=1), 1, rtol=0, atol=1e-12)
    for i in range(g.num_nodes):
        expected = np.zeros(g.num_nodes)
        if deg[i]:
            expected[g.neighbours(i)] = 1 / deg[i]
        else:
            expected[i] = 1.0  # an isolated node keeps its own
        assert np.array_equal(w[i], expected)


@given(graphs(max_nodes=16), st.sampled_from(["metropolis_hastings", "uniform"]),
       st.sampled_from([1.0, 0.5, 0.25]))
def test_spectral_gap_is_one_minus_the_second_largest_eigenvalue_modulus(case, rule, laziness):
    """Against numpy's eigenvalues of the dense lazy matrix (1 − η)I + ηW (not the symmetric form
    spectral_gap uses): λ_1 = 1 is the largest modulus of a stochastic matrix."""
    m = mixing_weights(Graph.from_edges(*case), rule)
    n = m.graph.num_nodes
    lazy = (1 - laziness) * np.eye(n) + laziness * m.matrix()
    moduli = np.sort(np.abs(np.linalg.eigvals(lazy)))
    expected = 1.0 if n < 2 else max(0.0, 1 - moduli[-2])
    assert spectral_gap(m, laziness) == pytest.approx(expected, abs=1e-9)


#: Lines of an edge list: well-formed pairs (some naming nodes beyond N = 6), comments, anything.
_LINES = st.lists(st.one_of(st.tuples(st.integers(0, 9), st.integers(0, 9)).map(lambda p: f"{p[0]} {p[1]}"),
                            st.just("# comment"), st.text(max_size=20)), max_size=8).map("\n".join)


@given(_LINES | st.text(max_size=200) | st.binary(max_size=200))
def test_an_edge_list_of_any_text_is_a_graph_or_a_one_line_refusal(tmp_path_factory, content):
    path = tmp_path_factory.getbasetemp() / "edges.txt"  # one file rewritten: a folder per example is slow
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8", errors="surrogatepass")
    topo = Topology(TopologySection(kind="file", path=str(path)), 6, seed=0)
    try:
        g = topo.graph(0)
    except ConfigError as exc:
        assert exc.key == "topology.path" and "\n" not in str(exc)
    else:
        assert g.num_nodes == 6 and np.all(g.indices < 6)
