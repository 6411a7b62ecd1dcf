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
from typing import Callable, Sequence

import numpy as np

from testbed.data.federated import FederatedData
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
