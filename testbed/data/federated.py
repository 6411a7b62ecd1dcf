"""The container every dataset loader returns: each node's train/test/validation samples.

Samples of all nodes are stored flat (one array per split) with per-node offsets, so nodes of very
different sizes (Adult-1: 51 to 10,501 samples) cost no padding, and a mini-batch for every node is
one fancy-indexing gather: ``x[offsets[m] + local_index]``.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Sequence

import numpy as np


def rows_of(offsets: np.ndarray, nodes: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """Where the rows of ``nodes`` (positions, in this order) are in a split with ``offsets``
    (M + 1,): their row indices (R,), node by node, and their own offsets (K + 1,) int64: the
    index of one gather of every node's rows at once."""
    nodes = np.asarray(nodes, dtype=np.int64)
    lo = offsets[nodes]
    sizes = offsets[nodes + 1] - lo
    own = np.zeros(len(nodes) + 1, dtype=np.int64)
    np.cumsum(sizes, out=own[1:])
    return np.arange(own[-1]) + np.repeat(lo - own[:-1], sizes), own


@dataclass(frozen=True)
class Split:
    """One split (train, test or validation) of every node.

    Attributes:
        x: features, shape (N_total, d), float64; every row in the unit ball (||x||_2 <= 1).
        y: integer class labels, shape (N_total,), int64, in [0, n_classes).
        offsets: shape (M + 1,), int64; node m owns rows offsets[m]:offsets[m+1].
    """

    x: np.ndarray
    y: np.ndarray
    offsets: np.ndarray

    @property
    def sizes(self) -> np.ndarray:
        """Samples per node, shape (M,)."""
        return np.diff(self.offsets)

    def node_slice(self, m: int) -> tuple[np.ndarray, np.ndarray]:
        """(x, y) of node m (views, no copy)."""
        lo, hi = self.offsets[m], self.offsets[m + 1]
        return self.x[lo:hi], self.y[lo:hi]

    def select(self, nodes: Sequence[int]) -> "Split":
        """The split restricted to ``nodes`` (in that order): one gather of their rows, made when
        ``x`` or ``y`` is first read (ACFL, which keeps each node's Gram matrices, never reads them)."""
        return _Selection(self, *rows_of(self.offsets, nodes))

    def astype(self, dtype: np.dtype | str) -> "Split":
        """The split with features of ``dtype`` (itself if they already are)."""
        return self if self.x.dtype == dtype else Split(x=self.x.astype(dtype), y=self.y, offsets=self.offsets)


class _Selection(Split):
    """The rows ``rows`` of ``parent`` (:meth:`Split.select`), gathered on first read; rows that
    follow each other (one node's, or consecutive nodes' in order) are a read-only view instead
    (an emulated host's nodes each hold their own rows of the host's data so, not a copy)."""

    def __init__(self, parent: Split, rows: np.ndarray, offsets: np.ndarray):
        object.__setattr__(self, "_parent", parent)
        object.__setattr__(self, "_rows", rows)
        object.__setattr__(self, "offsets", offsets)

    @functools.cached_property
    def x(self) -> np.ndarray:  # type: ignore[override]
        return self._read(self._parent.x)

    @functools.cached_property
    def y(self) -> np.ndarray:  # type: ignore[override]
        return self._read(self._parent.y)

    @functools.cached_property
    def _span(self) -> slice | None:
        """The rows as one slice, when they follow each other."""
        rows = self._rows
        return slice(rows[0], rows[-1] + 1) if len(rows) and np.all(np.diff(rows) == 1) else None

    def _read(self, whole: np.ndarray) -> np.ndarray:
        if self._span is None:
            return whole[self._rows]
        view = whole[self._span]
        view.flags.writeable = False  # the parent's rows: writing them would change every holder's
        return view


@dataclass(frozen=True)
class FederatedData:
    """Train, test and validation splits of M nodes, plus what a model needs to know.

    Attributes:
        train, test, validation: the three splits, with the same node order.
        n_classes: number of classes (2 for Adult and Vehicle).
        name: short name of the dataset and partition, e.g. ``"adult-1"``.
        node_names: one label per node (e.g. the education level of Adult-1).
        node_ids: the global id of each node held here (0..M-1 for a whole federation; a board
            holds one), which keys its random streams.
    """

    train: Split
    test: Split
    validation: Split
    n_classes: int
    name: str
    node_names: tuple[str, ...]
    node_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not self.node_ids:
            object.__setattr__(self, "node_ids", tuple(range(len(self.train.offsets) - 1)))

    @property
    def num_nodes(self) -> int:
        return len(self.train.offsets) - 1

    @property
    def dim(self) -> int:
        """Feature dimension d."""
        return int(self.train.x.shape[1])

    def astype(self, dtype: np.dtype | str) -> "FederatedData":
        """The same nodes with features of ``dtype`` (``data.dtype``), rounded once."""
        return dataclasses.replace(self, train=self.train.astype(dtype), test=self.test.astype(dtype),
                                   validation=self.validation.astype(dtype))

    def select(self, nodes: Sequence[int]) -> "FederatedData":
        """Only the given nodes' data (positions in this set), e.g. what one board holds in mqtt mode."""
        return FederatedData(
            train=self.train.select(nodes),
            test=self.test.select(nodes),
            validation=self.validation.select(nodes),
            n_classes=self.n_classes,
            name=self.name,
            node_names=tuple(self.node_names[m] for m in nodes),
            node_ids=tuple(self.node_ids[m] for m in nodes),
        )
