"""Mixing weights on a graph, W (row i: how much node i takes of each neighbour), and its spectral gap.

- ``"metropolis_hastings"``: W_ik = 1 / (1 + max(d_i, d_k)) for k ∈ N(i), W_ii = 1 − Σ_k W_ik
  (Xiao & Boyd 2004): symmetric and doubly stochastic on any graph, so the nodes' average is kept
  and gossip converges to it. Needs a separate link per neighbour (orthogonal or digital).
- ``"uniform"``: W_ik = 1 / d_i for k ∈ N(i), W_ii = 0 (an isolated node keeps its own: W_ii = 1):
  the receiver weights the sum of what it hears, which is all an over-the-air receiver can do (it
  hears one superposition). On the complete graph this is DWFL's W = (1 − I)/(N − 1) (eq. 7); on
  an irregular graph it is row- but not column-stochastic.

The spectral gap 1 − max(|λ_2|, |λ_N|) of W (λ sorted descending) governs how fast mixing
forgets the initial disagreement (Boyd et al. 2006); W is similar to a symmetric matrix for both
rules (uniform: D^(−1/2) A D^(−1/2)), so the eigenvalues are real. A bipartite graph (an even ring, a
torus of even sides) has λ_N = −1 under ``uniform``: gap 0 for W itself; an algorithm that mixes
lazily (DWFL's (1 − η)I + ηW) reports its own gap from :func:`spectral_gap` with ``laziness``.

Example::

    >>> from testbed.topology.graph import Graph
    >>> w = mixing_weights(Graph.complete(4), "uniform")
    >>> w.weights.tolist()[:3], w.self_weight.tolist()
    ([0.3333333333333333, 0.3333333333333333, 0.3333333333333333], [0.0, 0.0, 0.0, 0.0])
    >>> round(spectral_gap(mixing_weights(Graph.complete(4), "metropolis_hastings")), 6)
    1.0
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from testbed.topology.graph import Graph

__all__ = ["RULES", "Mixing", "mixing_weights", "spectral_gap", "complete_graph_gap"]

RULES = ("metropolis_hastings", "uniform")
#: Up to this many nodes the gap comes from a dense eigendecomposition (numpy); above, scipy's
#: sparse Lanczos (the coordinator's side).
_DENSE_MAX_NODES = 2000


@dataclass(frozen=True, eq=False)
class Mixing:
    """W on a graph. Attributes: graph; weights (2E,) W_ik aligned with ``graph.indices``;
    self_weight (N,) W_ii; rule."""

    graph: Graph
    weights: np.ndarray
    self_weight: np.ndarray
    rule: str

    def matrix(self) -> np.ndarray:
        """W as a dense (N, N) array (small graphs: tests, the watch page)."""
        n = self.graph.num_nodes
        w = np.zeros((n, n))
        w[self.graph.rows, self.graph.indices] = self.weights
        w[np.arange(n), np.arange(n)] = self.self_weight
        return w


def mixing_weights(graph: Graph, rule: str) -> Mixing:
    """W of ``rule`` (one of RULES) on ``graph``."""
    deg = graph.degrees.astype(np.float64)
    if rule == "metropolis_hastings":
        weights = 1.0 / (1.0 + np.maximum(deg[graph.rows], deg[graph.indices]))
    elif rule == "uniform":
        weights = 1.0 / deg[graph.rows]
    else:
        raise ValueError(f"unknown mixing rule {rule!r}; expected one of {RULES}")
    taken = np.bincount(graph.rows, weights=weights, minlength=graph.num_nodes)
    self_weight = np.where(deg == 0, 1.0, 1.0 - taken) if rule == "metropolis_hastings" else (deg == 0).astype(float)
    return Mixing(graph, weights, self_weight, rule)


def complete_graph_gap(num_nodes: int, rule: str) -> float:
    """The spectral gap of ``rule`` on the complete graph, in closed form (no N² matrix): MH is
    J/N (gap 1); uniform is (J − I)/(N − 1), eigenvalues 1 and −1/(N − 1) (gap 1 − 1/(N − 1), 0 for N = 2)."""
    if num_nodes < 2 or rule == "metropolis_hastings":
        return 1.0
    return 1.0 - 1.0 / (num_nodes - 1) if num_nodes > 2 else 0.0


def spectral_gap(mixing: Mixing, laziness: float = 1.0) -> float:
    """1 − max(|λ_2|, |λ_N|) of (1 − η)I + ηW, η = ``laziness`` (1: W itself)."""
    g = mixing.graph
    n = g.num_nodes
    if n < 2:
        return 1.0
    # The symmetric matrix similar to W: W itself (MH) or D^(1/2) W D^(−1/2) = D^(−1/2) A D^(−1/2).
    if mixing.rule == "uniform":
        deg = np.maximum(g.degrees.astype(np.float64), 1.0)
        sym = 1.0 / np.sqrt(deg[g.rows] * deg[g.indices])
    else:
        sym = mixing.weights
    diag = (1.0 - laziness) + laziness * mixing.self_weight
    sym = laziness * sym
    if n <= _DENSE_MAX_NODES:
        s = np.zeros((n, n))
        s[g.rows, g.indices] = sym
        s[np.arange(n), np.arange(n)] = diag
        eig = np.linalg.eigvalsh(s)  # ascending
        second, last = eig[-2], eig[0]
    else:
        import scipy.sparse
        import scipy.sparse.linalg

        s = scipy.sparse.csr_array((sym, g.indices, g.indptr), shape=(n, n)) + scipy.sparse.diags_array(diag)
        top = scipy.sparse.linalg.eigsh(s, k=2, which="LA", return_eigenvectors=False)
        bottom = scipy.sparse.linalg.eigsh(s, k=1, which="SA", return_eigenvectors=False)
        second, last = float(np.sort(top)[0]), float(bottom[0])
    return float(max(0.0, 1.0 - max(abs(second), abs(last))))
