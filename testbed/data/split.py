"""Per-node train/test/validation split (80/10/10 on every device, dp-pasgd.md §5.2) and unit-ball scaling.

Scaling (the DP sensitivity needs every row in the unit ball) comes in three kinds, named by
:data:`SCALINGS`; the loaders take one as their ``scaling`` keyword:

- ``"per_node"`` (default): each node uses statistics of its own rows only (its column means and
  standard deviations where a loader standardises, its own largest row norm):
  :func:`standardise_per_node`, :func:`scale_to_unit_ball_per_node`;
- ``"public_bound"``: no data-dependent statistic at all: a fixed transformation and a public bound
  (each loader documents its own), or :func:`clip_to_unit_ball`;
- ``"pooled"``: statistics over the whole data set (:func:`scale_to_unit_ball`), as the papers
  do. It leaks every node's data into every other node's features (a privacy cost no accountant
  charges), so it is kept only to reproduce the papers.

Per-node statistics are over the node's whole local data set (all its rows, before its 80/10/10
split), just as pooled ones are over the whole file.

Each node's samples are shuffled with its own stream ``stream(seed, node, -1, Purpose.SPLIT)``, so a
board that holds only node m reproduces exactly the split that the simulator makes for node m.

With n samples on a node: ``n_train = floor(0.8 n)``, ``n_test = floor(0.1 n)`` and the validation
split takes the rest, ``n - n_train - n_test`` (so it gets the rounding remainder and is never smaller
than the test split). The first ``n_train`` indices of the node's permutation go to train, the next
``n_test`` to test, the rest to validation; rows keep the permuted order.

Example::

    >>> import numpy as np
    >>> x, y = np.eye(3)[np.arange(20) % 3], np.arange(20) % 2
    >>> data = split_flat(x, y, np.array([0, 12, 20]), seed=0, n_classes=2, name="toy")
    >>> data.train.sizes, data.test.sizes, data.validation.sizes
    (array([9, 6]), array([1, 0]), array([2, 2]))
"""

from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np

from testbed.data.federated import FederatedData, Split
from testbed.errors import DataError
from testbed.streams.rng import Purpose, node_streams, stream

#: The three splits, in the order a node's permutation fills them.
SPLITS = ("train", "test", "validation")
#: How features are put into the unit ball: see the module docstring.
SCALINGS = ("per_node", "public_bound", "pooled")


def check_scaling(scaling: str) -> str:
    """``scaling`` if it is one of :data:`SCALINGS`, else DataError naming the valid ones.

    >>> check_scaling("per_node")
    'per_node'
    """
    if scaling not in SCALINGS:
        raise DataError(f"unknown scaling {scaling!r}; valid: {', '.join(SCALINGS)}")
    return scaling

def split_sizes(n: int) -> tuple[int, int, int]:
    """(n_train, n_test, n_validation) of a node with n samples: floor(0.8 n), floor(0.1 n), the rest."""
    # Exact integer arithmetic: no floating-point rounding decides a sample's split.
    n_train = (8 * n) // 10
    n_test = n // 10
    return n_train, n_test, n - n_train - n_test


class SplitWriter:
    """Fills preallocated train/test/validation arrays node by node.

    The three flat arrays are allocated once, at their final size, so that building a large
    federated set (1,000 nodes x 500 samples x 100 features) never holds a second full-size copy:
    each node's samples are shuffled and copied in, then the caller may drop them.

    Input
    -----
    sizes : sequence of int, length M
        Number of samples of each node, in node order.
    dim : int
        Feature dimension d.
    seed : int
        The run's seed; node ``node_ids[i]`` is shuffled with ``stream(seed, node_ids[i], -1, SPLIT)``.
    node_ids : sequence of int, length M, optional
        Stream key of each position; defaults to 0..M-1. A subset of a larger federation passes the
        global ids, so its split matches the full one.
    keep : sequence of str
        The splits to hold (of :data:`SPLITS`, default all); the others get no rows (every node 0
        samples), e.g. the training rows alone of a run that evaluates on other nodes' copies.
    dtype : numpy float dtype
        Of the features (float64 by default; float32 halves them, ``data.dtype``): rows are
        rounded once, when written.

    Example
    -------
    >>> w = SplitWriter([10], dim=2, seed=0)
    >>> w.write(0, np.zeros((10, 2)), np.zeros(10, dtype=np.int64))
    >>> w.finish(n_classes=2, name="toy").train.x.shape
    (8, 2)
    """

    def __init__(self, sizes: Sequence[int], dim: int, seed: int, node_ids: Sequence[int] | None = None,
                 dtype: np.dtype | str = np.float64, keep: Sequence[str] = SPLITS):
        self._sizes = [int(n) for n in sizes]
        self._node_ids = list(range(len(self._sizes))) if node_ids is None else [int(m) for m in node_ids]
        if len(self._node_ids) != len(self._sizes):
            raise ValueError(f"{len(self._node_ids)} node ids for {len(self._sizes)} nodes")
        self._seed = int(seed)
        unknown = sorted(set(keep) - set(SPLITS))
        if unknown:
            raise ValueError(f"unknown splits {unknown}; valid: {', '.join(SPLITS)}")
        per_node = np.array([split_sizes(n) for n in self._sizes], dtype=np.int64).reshape(-1, 3)
        per_node[:, [k for k, name in enumerate(SPLITS) if name not in keep]] = 0  # a dropped split: no rows
        self._offsets = [np.concatenate([[0], np.cumsum(per_node[:, k])]).astype(np.int64) for k in range(3)]
        self._x = [np.empty((int(o[-1]), dim), dtype=dtype) for o in self._offsets]
        self._y = [np.empty(int(o[-1]), dtype=np.int64) for o in self._offsets]
        self._written = np.zeros(len(self._sizes), dtype=bool)
        self._split_streams: dict[int, Iterator[np.random.Generator]] = {}  # by the node each yields next

    def write(self, index: int, x: np.ndarray, y: np.ndarray) -> None:
        """Shuffle node ``index``'s samples, x of shape (n, d) and y of shape (n,), into the three splits."""
        n = self._sizes[index]
        if x.shape[0] != n or y.shape[0] != n:
            raise ValueError(f"node {index}: expected {n} samples, got x {x.shape}, y {y.shape}")
        perm = stream(self._seed, self._node_ids[index], -1, Purpose.SPLIT).permutation(n)
        start = 0
        for k, part in enumerate(split_sizes(n)):
            lo, hi = self._offsets[k][index], self._offsets[k][index + 1]
            rows = perm[start : start + (hi - lo)]  # hi - lo is part, or 0 for a dropped split
            self._x[k][lo:hi] = x[rows]
            self._y[k][lo:hi] = y[rows]
            start += part
        self._written[index] = True

    def write_many(self, first: int, x: np.ndarray, y: np.ndarray) -> None:
        """Shuffle the samples of C consecutive nodes ``first .. first+C-1``, all of the same size n,
        into the three splits at once: x of shape (C, n, d), y of shape (C, n). The same rows as
        :meth:`write` node by node (each node's permutation is drawn from its own stream). Threads
        may write disjoint runs of nodes at once."""
        count, n = y.shape
        if any(self._sizes[first + c] != n for c in range(count)) or x.shape[:2] != (count, n):
            raise ValueError(f"nodes {first}..{first + count - 1}: expected {n} samples each, got x {x.shape}")
        # Streams are seeded in one batch for consecutive chunks: a call takes the iterator the
        # call before it left for ``first`` (each thread writing its own run of nodes has its own).
        streams = self._split_streams.pop(first, None)
        if streams is None:
            streams = node_streams(self._seed, self._node_ids[first:], -1, Purpose.SPLIT)
        perm = np.empty((count, n), dtype=np.int64)
        for c in range(count):
            perm[c] = next(streams).permutation(n)
        if first + count < len(self._sizes):
            self._split_streams[first + count] = streams
        start = 0
        for k, part in enumerate(split_sizes(n)):
            # Consecutive nodes of equal size own consecutive, equal blocks of every split.
            lo, hi = self._offsets[k][first], self._offsets[k][first + count]
            each = (hi - lo) // count  # part rows each, or none for a dropped split
            xs, ys = self._x[k][lo:hi].reshape(count, each, x.shape[2]), self._y[k][lo:hi].reshape(count, each)
            for c in range(count):  # each node's rows gathered straight into their place: one copy
                rows = perm[c, start:start + each]
                if xs.dtype == x.dtype:
                    np.take(x[c], rows, axis=0, out=xs[c])
                else:  # rounded to the writer's dtype (data.dtype) as they are placed
                    xs[c] = x[c, rows]
                np.take(y[c], rows, out=ys[c])
            start += part
        self._written[first:first + count] = True

    def finish(self, n_classes: int, name: str, node_names: Sequence[str] | None = None) -> FederatedData:
        """The FederatedData once every node has been written; node names default to ``"node-<id>"``."""
        missing = np.flatnonzero(~self._written)
        if missing.size:
            raise ValueError(f"nodes {missing.tolist()} were never written")
        names = tuple(node_names) if node_names is not None else tuple(f"node-{m}" for m in self._node_ids)
        splits = [Split(x=self._x[k], y=self._y[k], offsets=self._offsets[k]) for k in range(3)]
        return FederatedData(
            train=splits[0], test=splits[1], validation=splits[2], n_classes=n_classes, name=name, node_names=names,
            node_ids=tuple(self._node_ids),
        )


def split_flat(
    x: np.ndarray,
    y: np.ndarray,
    offsets: np.ndarray,
    *,
    seed: int,
    n_classes: int,
    name: str,
    node_names: Sequence[str] | None = None,
    node_ids: Sequence[int] | None = None,
) -> FederatedData:
    """Split flat per-node data 80/10/10 on every node.

    Input
    -----
    x : [N, d], float64
        Features of all nodes, node m in rows ``offsets[m]:offsets[m+1]``; already in the unit ball.
    y : [N], int
        Class labels in [0, n_classes).
    offsets : [M + 1], int
        Node boundaries, ``offsets[0] == 0`` and ``offsets[-1] == N``.
    seed : int
        The run's seed (node m is shuffled with ``stream(seed, m, -1, SPLIT)``).
    n_classes, name, node_names :
        Copied into the result.
    node_ids : sequence of int, length M, optional
        Global id of each node (keys its split stream); default 0..M-1. A board holding a subset
        of the federation passes the global ids, so its split matches the full one.

    Output
    ------
    data : FederatedData
        M nodes; node m has split_sizes(offsets[m+1] - offsets[m]) train/test/validation samples.
    """
    offsets = np.asarray(offsets, dtype=np.int64)
    writer = SplitWriter(np.diff(offsets), dim=x.shape[1], seed=seed, node_ids=node_ids)
    for m in range(len(offsets) - 1):
        writer.write(m, x[offsets[m] : offsets[m + 1]], y[offsets[m] : offsets[m + 1]])
    return writer.finish(n_classes=n_classes, name=name, node_names=node_names)


def split_per_node(
    xs: Sequence[np.ndarray],
    ys: Sequence[np.ndarray],
    *,
    seed: int,
    n_classes: int,
    name: str,
    node_names: Sequence[str] | None = None,
) -> FederatedData:
    """Split per-node arrays 80/10/10 on every node: as :func:`split_flat`, node m given as (xs[m], ys[m]).

    Input
    -----
    xs : list of [n_m, d], float64
    ys : list of [n_m], int

    Output
    ------
    data : FederatedData
    """
    if len(xs) != len(ys):
        raise ValueError(f"{len(xs)} feature arrays but {len(ys)} label arrays")
    writer = SplitWriter([len(y) for y in ys], dim=xs[0].shape[1], seed=seed)
    for m, (x_m, y_m) in enumerate(zip(xs, ys)):
        writer.write(m, x_m, y_m)
    return writer.finish(n_classes=n_classes, name=name, node_names=node_names)


def scale_to_unit_ball(x: np.ndarray) -> np.ndarray:
    """Divide every row by the largest row norm of the data set, so that max_n ||x_n||_2 == 1.

    The DP sensitivity of DP-PASGD assumes every sample lies in the unit ball (dp-pasgd.md §7.6:
    G <= 1 needs ||x|| <= 1). One common factor keeps the geometry of the data (angles and relative
    lengths). For one-hot rows with F categorical fields every row has norm sqrt(F), so the factor is
    sqrt(F) and every row ends with norm exactly 1.

    Input
    -----
    x : [N, d], float64
        Modified in place.

    Output
    ------
    x : [N, d], float64
        The same array, every row norm <= 1 (up to one rounding). All-zero data is left unchanged.

    Example
    -------
    >>> scale_to_unit_ball(np.array([[3.0, 4.0], [0.0, 1.0]]))
    array([[0.6, 0.8],
           [0. , 0.2]])
    """
    if x.size:
        max_norm = float(np.sqrt(np.einsum("ij,ij->i", x, x).max()))
        if max_norm > 0:
            x /= max_norm
    return x


def _segment_reduce(ufunc: np.ufunc, values: np.ndarray, offsets: np.ndarray, empty: float) -> np.ndarray:
    """``ufunc.reduce`` of each node's rows: (N, ...) values, (M + 1,) offsets → (M, ...).

    Empty nodes get ``empty`` (np.add.reduceat alone would give them the next node's first row)."""
    sizes = np.diff(offsets)
    out = np.full((len(sizes),) + values.shape[1:], empty, dtype=np.float64)
    nonempty = sizes > 0
    if nonempty.any():
        # Starts of non-empty nodes only: each then runs to the next non-empty start, its own end.
        out[nonempty] = ufunc.reduceat(values, offsets[:-1][nonempty], axis=0)
    return out


def standardise_per_node(x: np.ndarray, offsets: np.ndarray, columns: slice | np.ndarray = slice(None)) -> np.ndarray:
    """Zero mean and unit variance per column over each node's own rows, in place.

    Input
    -----
    x : [N, d], float64
        Node m in rows offsets[m]:offsets[m+1]; modified in place.
    offsets : [M + 1], int
    columns : slice or int array
        The columns to standardise (default all). A column constant on a node becomes 0 there
        (so a node with one row gets zeros in them).

    Output
    ------
    x : the same array.

    Example
    -------
    >>> standardise_per_node(np.array([[1.0], [3.0], [10.0], [20.0]]), np.array([0, 2, 4]))
    array([[-1.],
           [ 1.],
           [-1.],
           [ 1.]])
    """
    offsets = np.asarray(offsets, dtype=np.int64)
    sizes = np.maximum(np.diff(offsets), 1)[:, None]
    rows_of = np.diff(offsets)
    block = x[:, columns]
    mean = _segment_reduce(np.add, block, offsets, 0.0) / sizes  # (M, k)
    block -= np.repeat(mean, rows_of, axis=0)
    std = np.sqrt(_segment_reduce(np.add, block * block, offsets, 0.0) / sizes)
    block /= np.repeat(np.where(std > 0, std, 1.0), rows_of, axis=0)
    x[:, columns] = block
    return x


def scale_to_unit_ball_per_node(x: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Divide each node's rows by that node's own largest row norm, in place (max norm 1 per node).

    As :func:`scale_to_unit_ball`, node by node: no node's scale depends on another node's rows,
    so a board holding one node computes exactly what the simulator computes for it. A node whose
    rows are all zero is left unchanged.

    Input
    -----
    x : [N, d], float64, modified in place; offsets : [M + 1], int.

    Output
    ------
    x : the same array.

    Example
    -------
    >>> scale_to_unit_ball_per_node(np.array([[3.0, 4.0], [0.0, 1.0], [0.0, 2.0]]), np.array([0, 2, 3]))
    array([[0.6, 0.8],
           [0. , 0.2],
           [0. , 1. ]])
    """
    offsets = np.asarray(offsets, dtype=np.int64)
    if x.size:
        max_norm = np.sqrt(_segment_reduce(np.maximum, np.einsum("ij,ij->i", x, x), offsets, 0.0))
        x /= np.repeat(np.where(max_norm > 0, max_norm, 1.0), np.diff(offsets))[:, None]
    return x


def clip_to_unit_ball(x: np.ndarray) -> np.ndarray:
    """Clip every row to norm <= 1, in place: x / max(1, ||x||). Uses no other row's values.

    Rows already in the unit ball are unchanged; longer rows are projected onto the unit sphere
    (their direction is kept, their length is lost), as DP-SGD clips per-example gradients.

    Example
    -------
    >>> clip_to_unit_ball(np.array([[3.0, 4.0], [0.0, 0.5]]))
    array([[0.6, 0.8],
           [0. , 0.5]])
    """
    if x.size:
        x /= np.maximum(1.0, np.sqrt(np.einsum("ij,ij->i", x, x)))[:, None]
    return x


def node_rows(rows: np.ndarray, sizes: np.ndarray, nodes: Sequence[int] | None,
              partition: str) -> tuple[list[int], np.ndarray, np.ndarray]:
    """The rows of ``nodes`` (all when None) of a partition: ``rows`` ordered node by node, node m
    holding ``sizes[m]`` of them. Returns (node ids, their rows, (M+1,) offsets of each node's rows).

    Raises DataError naming ``partition`` for a node outside it.

    Example::

        >>> ids, rows, offsets = node_rows(np.arange(5), np.array([2, 3]), [1], "toy")
        >>> ids, rows.tolist(), offsets.tolist()
        ([1], [2, 3, 4], [0, 3])
    """
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    node_ids = list(range(len(sizes))) if nodes is None else [int(m) for m in nodes]
    outside = [m for m in node_ids if not 0 <= m < len(sizes)]
    if outside:
        raise DataError(f"{partition}: nodes {outside} are not in 0..{len(sizes) - 1}")
    picked = np.concatenate([rows[offsets[m]:offsets[m + 1]] for m in node_ids] or [rows[:0]])
    return node_ids, picked, np.concatenate([[0], np.cumsum(sizes[node_ids])]).astype(np.int64)
