"""A federation whose rows exist only while they are asked for (lazy nodes, for client sampling).

With client sampling a round needs only the sampled nodes' data, so a sim run holds the layout of
every node (how many rows each has in each split) and makes the rows of the nodes a round samples
when it samples them. Memory follows the sampled count, not N:

- the synthetic set (:func:`testbed.data.synthetic.lazy_logistic`): over a million nodes, the sampled nodes'
  rows are regenerated from their own streams, the same rows as generating the whole federation
  (testbed.data.synthetic draws node m from ``stream(seed, m, -1, DATA)`` alone);
- a file-based set (:meth:`LazyFederatedData.memory_mapped`): its federation, written once to the
  cache by its eager loader, is memory-mapped and the sampled nodes' rows are gathered from it
  (testbed.data.mapped): the eager loader's rows, bit for bit.

:class:`LazyFederatedData` has the attributes of :class:`~testbed.data.federated.FederatedData`
that describe the federation (``num_nodes``, ``dim``, ``n_classes``, ``name``, ``node_ids`` and
each split's ``offsets`` and ``sizes``) but no rows: code that reads rows asks :meth:`nodes` for a
FederatedData of the nodes it needs.

Example::

    >>> from testbed.data.synthetic import lazy_logistic
    >>> lazy = lazy_logistic(num_nodes=1_000_000, samples_per_node=50, dim=3, n_classes=2, seed=0)
    >>> lazy.num_nodes, lazy.train.sizes[:2].tolist()
    (1000000, [40, 40])
    >>> lazy.nodes([999_999]).train.x.shape
    (40, 3)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Mapping, Sequence

import numpy as np

from testbed.data.federated import FederatedData, Split
from testbed.data.mapped import open_or_build
from testbed.data.split import SPLITS


@dataclass(frozen=True)
class SplitLayout:
    """Where each node's rows of one split would be, without the rows.

    Attributes:
        offsets: shape (M + 1,), int64; node m owns rows offsets[m]:offsets[m+1].
    """

    offsets: np.ndarray

    @property
    def sizes(self) -> np.ndarray:
        """Samples per node, shape (M,)."""
        return np.diff(self.offsets)


@dataclass(frozen=True)
class LazyFederatedData:
    """Every node's layout, and a way to make the rows of any nodes.

    Attributes:
        train, test, validation: each split's layout, node ids 0..M-1 in order.
        n_classes, name, dim: as in FederatedData.
        node_ids: ``range(M)``.
        make: node ids (K,) and the splits to hold → FederatedData of those nodes, in that
            order (the generator); the other splits have no rows.
    """

    train: SplitLayout
    test: SplitLayout
    validation: SplitLayout
    n_classes: int
    name: str
    dim: int
    node_ids: range
    make: Callable[[Sequence[int], Sequence[str]], FederatedData]

    @classmethod
    def memory_mapped(cls, directory: Path, build: Callable[[], FederatedData]) -> "LazyFederatedData":
        """A file-based set's federation from its cache ``directory`` (testbed.data.mapped:
        written first from ``build()``, the eager loader, when missing): a round's nodes' rows are
        gathered from the memory-mapped arrays."""
        fed = open_or_build(directory, build)
        return cls(*(SplitLayout(offsets) for offsets in fed.offsets), n_classes=fed.n_classes, name=fed.name,
                   dim=fed.dim, node_ids=range(fed.num_nodes), make=fed.nodes)

    @property
    def num_nodes(self) -> int:
        return len(self.node_ids)

    def nodes(self, node_ids: Sequence[int], splits: Sequence[str] = SPLITS) -> FederatedData:
        """The rows of ``node_ids`` (global ids, in this order), made now; the caller drops them.
        Only ``splits`` hold rows (a round trains on the training rows alone); the others none."""
        return self.make(node_ids, splits)

    def only(self, node: int, make: Callable[[Sequence[int], Sequence[str]], FederatedData]) -> "LazyFederatedData":
        """Node ``node``'s layout alone (its ids ``range(node, node + 1)``), its rows made by ``make``
        (global ids): what one emulated node builds its algorithm from (nodes.agent)."""
        def own(layout: SplitLayout) -> SplitLayout:
            return SplitLayout(layout.offsets[node:node + 2] - layout.offsets[node])

        return LazyFederatedData(own(self.train), own(self.test), own(self.validation), n_classes=self.n_classes,
                                 name=self.name, dim=self.dim, node_ids=range(node, node + 1), make=make)


class KeptNodes:
    """Some nodes' training rows, each node's made the first time a step asks for it and kept: an
    emulated host's nodes when they are lazy (testbed.assembly.assemble.holds_lazily). A host of
    1,000 nodes of which a round samples 100 makes those 100 nodes' rows, not 1,000 before its
    first round; a node asked again is not made again, so a long run makes each node once, as a
    host holding its nodes whole does.

    Args:
        make: node ids → FederatedData of those nodes (its training rows are read; the generator's,
            the same rows whichever nodes are made together).
    """

    def __init__(self, make: Callable[[Sequence[int]], FederatedData]):
        self._make = make
        self._kept: dict[int, tuple[np.ndarray, np.ndarray, str]] = {}
        self._like: FederatedData | None = None  # the first rows made: n_classes, name, dtypes

    def __len__(self) -> int:
        """How many nodes' rows are held."""
        return len(self._kept)

    def nodes(self, node_ids: Sequence[int], splits: Sequence[str] = ("train",)) -> FederatedData:
        """The training rows of ``node_ids`` (in this order; no test or validation rows, the only
        ``splits`` held), those not held yet made now, in one call of ``make``."""
        if set(splits) != {"train"}:
            raise ValueError(f"only training rows are kept, not {', '.join(splits)}")
        ids = [int(n) for n in node_ids]
        missing = [n for n in dict.fromkeys(ids) if n not in self._kept]
        if missing:
            made = self._make(missing)
            self._like = self._like or made
            for i, node in enumerate(missing):
                self._kept[node] = (*made.train.node_slice(i), made.node_names[i])
            if missing == ids:  # all new, in this order (a round's sampled nodes, mostly): no copy
                return made
        if self._like is None:
            raise ValueError("no node's rows were asked for yet")
        kept = [self._kept[n] for n in ids]
        like = self._like.train
        offsets = np.zeros(len(ids) + 1, dtype=np.int64)
        np.cumsum([len(y) for _, y, _ in kept], out=offsets[1:])
        train = Split(x=np.concatenate([x for x, _, _ in kept]) if kept else like.x[:0],
                      y=np.concatenate([y for _, y, _ in kept]) if kept else like.y[:0], offsets=offsets)
        none = Split(x=like.x[:0], y=like.y[:0], offsets=np.zeros(len(ids) + 1, dtype=np.int64))
        return FederatedData(train, none, none, n_classes=self._like.n_classes, name=self._like.name,
                             node_names=tuple(name for _, _, name in kept), node_ids=tuple(ids))


def training_rows(data: FederatedData | LazyFederatedData, node_ids: Sequence[int],
                  position: Mapping[int, int]) -> Split:
    """The training rows of ``node_ids`` (ascending, of the nodes ``data`` holds), in order: a lazy
    federation's made now (from the nodes' own streams, or gathered from its memory-mapped file),
    held rows as they are when ``node_ids`` are every node (``position``: each held node's index),
    else selected (a view where the nodes follow each other: testbed.data.federated.Split.select).
    What a sim round's nodes, a sim worker's and an emulated host's step on."""
    if isinstance(data, LazyFederatedData):
        return data.nodes(node_ids, splits=("train",)).train
    if len(node_ids) == len(position) and list(node_ids) == list(position):
        return data.train
    return data.train.select([position[n] for n in node_ids])
