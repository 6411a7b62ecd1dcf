"""A federation whose rows exist only while they are asked for (lazy nodes, for client sampling).

With client sampling a round needs only the sampled nodes' data, so a sim run over a million
synthetic nodes holds the layout of every node (how many rows each has in each split) and
regenerates the rows of the nodes a round samples from their own streams when it samples them:
the same rows as generating the whole federation (testbed.data.synthetic draws node m from
``stream(seed, m, -1, DATA)`` alone). Memory follows the sampled count, not N.

:class:`LazyFederatedData` has the attributes of :class:`~testbed.data.federated.FederatedData`
that describe the federation (``num_nodes``, ``dim``, ``n_classes``, ``name``, ``node_ids`` and
each split's ``offsets`` and ``sizes``) but no rows: code that reads rows asks :meth:`nodes` for a
FederatedData of the nodes it needs.

Example::

    >>> lazy = LazyFederatedData.synthetic(num_nodes=1_000_000, samples_per_node=50, dim=3,
    ...                                   n_classes=2, seed=0)
    >>> lazy.num_nodes, lazy.train.sizes[:2].tolist()
    (1000000, [40, 40])
    >>> lazy.nodes([999_999]).train.x.shape
    (40, 3)
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from testbed.data.federated import FederatedData
from testbed.data.split import split_sizes


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
        make: node ids (K,) → FederatedData of those nodes, in that order (the generator).
    """

    train: SplitLayout
    test: SplitLayout
    validation: SplitLayout
    n_classes: int
    name: str
    dim: int
    node_ids: range
    make: Callable[[Sequence[int]], FederatedData]

    @classmethod
    def synthetic(cls, *, num_nodes: int, samples_per_node: int, dim: int, n_classes: int, seed: int,
                  **options) -> "LazyFederatedData":
        """The synthetic task of :func:`testbed.data.synthetic.make_logistic` (``options``: its
        other keywords), every node with ``samples_per_node`` samples."""
        from testbed.data.synthetic import make_logistic

        layouts = [SplitLayout(np.arange(num_nodes + 1, dtype=np.int64) * part)
                   for part in split_sizes(samples_per_node)]
        make = functools.partial(make_logistic, num_nodes, samples_per_node, dim, n_classes, seed, **options)
        return cls(*layouts, n_classes=n_classes, name="synthetic", dim=dim, node_ids=range(num_nodes),
                   make=lambda nodes: make(nodes=nodes))

    @property
    def num_nodes(self) -> int:
        return len(self.node_ids)

    def nodes(self, node_ids: Sequence[int]) -> FederatedData:
        """The rows of ``node_ids`` (global ids, in this order), made now; the caller drops them."""
        return self.make(node_ids)
