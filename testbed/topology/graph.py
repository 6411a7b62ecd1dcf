"""An undirected simple graph over the nodes of a run, as compressed sparse rows (numpy only).

The graph is what every decentralised algorithm, its channel and its ledger agree on: node i hears
exactly ``neighbours(i)``. It is stored once as CSR arrays (``indptr``, ``indices``: the neighbours
of i are ``indices[indptr[i]:indptr[i+1]]``, sorted, never i itself, every edge in both rows), so a
round over it costs O(edges), and it needs numpy only (a board builds the same graph from the
run's seed as the coordinator).

Example::

    >>> g = Graph.from_edges(4, [(0, 1), (1, 2), (2, 3), (3, 0)])
    >>> g.neighbours(0).tolist(), g.degrees.tolist(), g.num_edges, g.is_connected
    ([1, 3], [2, 2, 2, 2], 4, True)
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import scipy.sparse

__all__ = ["Graph"]


@dataclass(frozen=True, eq=False)
class Graph:
    """Attributes:
        num_nodes: N.
        indptr: (N + 1,) int64 row starts.
        indices: (2E,) int64 neighbour ids, sorted within each row, no self loops.
    """

    num_nodes: int
    indptr: np.ndarray
    indices: np.ndarray

    @classmethod
    def from_edges(cls, num_nodes: int, edges: Any) -> "Graph":
        """The graph of an (E, 2) list of node pairs; duplicates and orientation do not matter.

        Raises:
            ValueError: a pair names a node outside [0, N) or the same node twice.
        """
        pairs = np.asarray(edges, dtype=np.int64).reshape(-1, 2)
        if pairs.size and (pairs.min() < 0 or pairs.max() >= num_nodes):
            raise ValueError(f"an edge names a node outside 0..{num_nodes - 1}")
        if np.any(pairs[:, 0] == pairs[:, 1]):
            raise ValueError("an edge joins a node to itself")
        # Each edge in both rows, as one key i·N + j, sorted by row, then neighbour; duplicates
        # dropped by neighbouring compare (numpy 2.4's np.unique hashes: 2.8 s for 2·10⁶ keys, sorting
        # them 0.02 s). Built in place: no (2E, 2) copy of the pairs.
        e = len(pairs)
        keys = np.empty(2 * e, dtype=np.int64)
        np.multiply(pairs[:, 0], num_nodes, out=keys[:e])
        keys[:e] += pairs[:, 1]
        np.multiply(pairs[:, 1], num_nodes, out=keys[e:])
        keys[e:] += pairs[:, 0]
        keys.sort()
        if keys.size:
            keys = keys[np.concatenate([[True], keys[1:] != keys[:-1]])]
        rows, cols = np.divmod(keys, num_nodes)
        indptr = np.zeros(num_nodes + 1, dtype=np.int64)
        np.cumsum(np.bincount(rows, minlength=num_nodes), out=indptr[1:])
        return cls(num_nodes, indptr, cols.astype(np.int64))

    @classmethod
    def complete(cls, num_nodes: int) -> "Graph":
        """Every pair of nodes joined (DWFL's paper: each receiver hears all N − 1 others)."""
        cols = np.tile(np.arange(num_nodes, dtype=np.int64), num_nodes).reshape(num_nodes, num_nodes)
        mask = ~np.eye(num_nodes, dtype=bool)
        indptr = np.arange(num_nodes + 1, dtype=np.int64) * (num_nodes - 1)
        return cls(num_nodes, indptr, cols[mask])

    def neighbours(self, node: int) -> np.ndarray:
        """(d_i,) the sorted neighbours of ``node``."""
        return self.indices[self.indptr[node]:self.indptr[node + 1]]

    @cached_property
    def degrees(self) -> np.ndarray:
        """(N,) int64 d_i."""
        return np.diff(self.indptr)

    @cached_property
    def rows(self) -> np.ndarray:
        """(2E,) int64 the row (receiver) of every entry of ``indices``."""
        return np.repeat(np.arange(self.num_nodes, dtype=np.int64), self.degrees)

    @property
    def num_edges(self) -> int:
        return int(self.indices.size // 2)

    @property
    def is_complete(self) -> bool:
        return bool(np.all(self.degrees == self.num_nodes - 1))

    def edges(self) -> np.ndarray:
        """(E, 2) int64 each edge once, i < j, sorted."""
        keep = self.rows < self.indices
        return np.column_stack([self.rows[keep], self.indices[keep]])

    @cached_property
    def components(self) -> np.ndarray:
        """(N,) int64 each node's connected component, numbered from 0 by its smallest node.
        Breadth-first, one numpy step per hop (the diameter, not N, bounds the Python loop)."""
        label = np.full(self.num_nodes, -1, dtype=np.int64)
        count = 0
        for start in range(self.num_nodes):
            if label[start] >= 0:
                continue
            label[start] = count
            frontier = np.array([start], dtype=np.int64)
            while frontier.size:
                starts, stops = self.indptr[frontier], self.indptr[frontier + 1]
                reach = self.indices[concatenated_ranges(starts, stops)]
                reach = np.unique(reach[label[reach] < 0])
                label[reach] = count
                frontier = reach
            count += 1
        return label

    @property
    def is_connected(self) -> bool:
        return self.num_nodes <= 1 or int(self.components.max()) == 0

    def adjacency(self, weights: np.ndarray | None = None) -> "scipy.sparse.csr_array":
        """The (N, N) sparse adjacency (scipy; the coordinator's side), entries ``weights`` ((2E,),
        aligned with ``indices``) or ones."""
        import scipy.sparse

        data = np.ones(self.indices.size) if weights is None else np.asarray(weights, dtype=np.float64)
        return scipy.sparse.csr_array((data, self.indices, self.indptr), shape=(self.num_nodes, self.num_nodes))

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Graph) and self.num_nodes == other.num_nodes
                and np.array_equal(self.indptr, other.indptr) and np.array_equal(self.indices, other.indices))

    __hash__ = None  # type: ignore[assignment]


def concatenated_ranges(starts: np.ndarray, stops: np.ndarray) -> np.ndarray:
    """The concatenation of arange(start, stop) for every pair, without a Python loop."""
    lengths = stops - starts
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    offsets = np.repeat(starts - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths)
    return np.arange(total, dtype=np.int64) + offsets
