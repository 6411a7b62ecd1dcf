"""Which rows of a labelled pool each node holds: i.i.d., or label-skewed by a Dirichlet prior, as
FL benchmarks partition image sets.

- ``"iid"``: one shuffle of the pool, node m takes the next ``sizes[m]`` rows.
- ``"dirichlet"`` (Hsu, Qi and Brown 2019, "Measuring the effects of non-identical data
  distribution"): node m draws class proportions q_m ~ Dir(α·1_C), then its ``sizes[m]`` class
  counts ~ Multinomial(sizes[m], q_m), rows taken without replacement from each class's shuffled
  rows. Small α: a few classes per node; α → ∞: i.i.d. When a class runs out, the node's remaining
  count is drawn again over the classes that still have rows, in proportion to q_m (never a row twice).

Both draw from ``stream(seed, GLOBAL, -1, DATA)`` over the whole pool, so a board that loads only
its own node gets the rows the simulation gives it.

Example::

    >>> labels = np.repeat(np.arange(4), 25)
    >>> rows = partition_rows(labels, [10, 10], "dirichlet", alpha=0.1, seed=0)
    >>> [len(r) for r in rows], len(np.intersect1d(rows[0], rows[1]))
    ([10, 10], 0)
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from testbed.errors import DataError
from testbed.streams.rng import GLOBAL, Purpose, stream

PARTITIONS = ("iid", "dirichlet")


def partition_rows(labels: np.ndarray, sizes: Sequence[int], partition: str = "iid", *, alpha: float = 0.5,
                   seed: int) -> list[np.ndarray]:
    """Row indices of the pool for each node.

    Args:
        labels: (n,) int class labels of the pool, in [0, C).
        sizes: (M,) rows of each node; Σ <= n.
        partition: "iid" or "dirichlet". alpha: the Dirichlet concentration α > 0.
        seed: the run's seed.
    Returns:
        M arrays of distinct row indices (no row in two nodes), node m's of length ``sizes[m]``.
    """
    sizes = [int(s) for s in sizes]
    if sum(sizes) > len(labels):
        raise DataError(f"the nodes need {sum(sizes)} rows, the data set has {len(labels)}; "
                        "give fewer samples per node")
    rng = stream(seed, GLOBAL, -1, Purpose.DATA)
    order = rng.permutation(len(labels))
    if partition == "iid":
        ends = np.cumsum([0] + sizes)
        return [order[ends[m]: ends[m + 1]] for m in range(len(sizes))]
    if partition != "dirichlet":
        raise DataError(f"unknown partition {partition!r}; choose one of {', '.join(PARTITIONS)}")
    if not alpha > 0:
        raise DataError(f"data.alpha: the Dirichlet concentration must be > 0, got {alpha}")
    classes = int(labels.max()) + 1 if len(labels) else 0
    by_class = [order[labels[order] == c] for c in range(classes)]  # each class's rows, shuffled
    taken = np.zeros(classes, dtype=np.int64)
    rows = []
    for size in sizes:
        q = rng.dirichlet(np.full(classes, alpha))
        counts = np.zeros(classes, dtype=np.int64)
        need = size
        while need > 0:  # at most C passes: each one exhausts a class or satisfies the node
            left = np.array([len(r) for r in by_class]) - taken - counts
            weights = np.where(left > 0, q, 0.0)
            if weights.sum() <= 0:  # q puts no mass on what is left: spread evenly over it
                weights = (left > 0).astype(np.float64)
            extra = np.minimum(rng.multinomial(need, weights / weights.sum()), left)
            counts += extra
            need -= int(extra.sum())
        rows.append(np.concatenate([by_class[c][taken[c]: taken[c] + counts[c]] for c in range(classes)]))
        taken += counts
    return rows
