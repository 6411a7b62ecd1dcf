"""The ACFL paper's synthetic multi-output linear regression (Sec. V; acfl.md §5.2, §7 check 7).

- W_true (d × o), entries U[0, 1/30], from ``stream(seed, GLOBAL, -1, DATA)``;
- node m: X (m_i × d) with entries U[−1, 1] and Y = X W_true, no label noise, from
  ``stream(seed, m, -1, DATA)`` only (a board generates exactly its own node's rows);
- W₀ ~ U[0, 1/30] is the model's initialisation (:class:`testbed.learning.models.LinearRegression`).

The paper trains on all m samples of a device, so the training split is those m samples exactly
(not the 80 % of the other loaders); test and validation are ``max(1, m // 10)`` further samples
each from the same node stream, drawn after the training rows (so they never change them).
Entries satisfy Assumption 1 (|x| ≤ 1; |y| ≤ d/30 ≤ 1 for d ≤ 30) by construction, whatever
``scaling`` (a public bound of 1: nothing is rescaled).

Example::

    >>> data = make_regression(num_nodes=100, samples_per_node=100, dim=10, outputs=10, seed=0)
    >>> data.train.x.shape, data.train.y.shape, data.n_classes
    ((10000, 10), (10000, 10), 10)
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from testbed.data.federated import FederatedData, Split
from testbed.data.registry import Registration
from testbed.data.split import check_scaling
from testbed.errors import DataError
from testbed.streams.rng import GLOBAL, Purpose, stream

#: Upper end of the entries of W_true and W₀ (the paper's U[0, 1/30]).
WEIGHT_HIGH = 1.0 / 30.0


def true_weights(dim: int, outputs: int, seed: int) -> np.ndarray:
    """W_true (d × o), entries U[0, 1/30]: Y = X W_true on every node."""
    return stream(seed, GLOBAL, -1, Purpose.DATA).uniform(0.0, WEIGHT_HIGH, (dim, outputs))


def make_regression(num_nodes: int, samples_per_node: int, dim: int, outputs: int, seed: int = 0,
                    nodes: Sequence[int] | None = None, scaling: str = "per_node") -> FederatedData:
    """Generate the Sec. V regression task.

    Input
    -----
    num_nodes : int
        N, the whole federation (node ids 0..N-1).
    samples_per_node : int
        m, the training samples of every node (the paper: 100).
    dim, outputs : int
        d and o (the paper: 10 and 10).
    seed : int
        The run's seed.
    nodes : sequence of int, optional
        Only these node ids (a board's own); identical to selecting them from the whole federation.
    scaling : str
        Checked; nothing to scale (every entry is within the public bound 1).

    Output
    ------
    data : FederatedData
        x float64 (rows, d); y float64 (rows, o); ``n_classes`` = o (the model's output count).
        Train: m rows per node; test and validation: max(1, m // 10) rows per node.
    """
    check_scaling(scaling)
    if min(num_nodes, samples_per_node, dim, outputs) < 1:
        raise DataError(f"regression: num_nodes, samples_per_node, dim and outputs must be >= 1; got "
                        f"{num_nodes}, {samples_per_node}, {dim}, {outputs}")
    ids = list(range(num_nodes)) if nodes is None else [int(m) for m in nodes]
    outside = [m for m in ids if not 0 <= m < num_nodes]
    if outside:
        raise DataError(f"regression: nodes {outside} are not in 0..{num_nodes - 1}")
    w = true_weights(dim, outputs, seed)
    held_out = max(1, samples_per_node // 10)
    sizes = (samples_per_node, held_out, held_out)
    xs = [[], [], []]
    for m in ids:
        rng = stream(seed, m, -1, Purpose.DATA)
        for k, n in enumerate(sizes):
            xs[k].append(rng.uniform(-1.0, 1.0, (n, dim)))
    splits = []
    for k, n in enumerate(sizes):
        x = np.concatenate(xs[k]) if ids else np.zeros((0, dim))
        splits.append(Split(x=x, y=x @ w, offsets=np.arange(len(ids) + 1, dtype=np.int64) * n))
    return FederatedData(train=splits[0], test=splits[1], validation=splits[2], n_classes=outputs,
                         name="regression", node_names=tuple(f"node-{m}" for m in ids), node_ids=tuple(ids))


REGISTRATION = Registration("regression", make_regression, order=30,
                            no_path="dataset is generated and reads no file",
                            options=lambda d: dict(num_nodes=d.num_nodes, samples_per_node=d.samples_per_node,
                                                   dim=d.dim, outputs=d.outputs))
