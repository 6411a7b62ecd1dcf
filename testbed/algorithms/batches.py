"""Mini-batch sampling of every node at once, each node from its own random stream.

Example::

    >>> from testbed.data.synthetic import make_logistic
    >>> train = make_logistic(num_nodes=3, samples_per_node=50, dim=2, seed=0).train
    >>> uniform_batches(train, [0, 1, 2], round_index=0, seed=1, steps=4, batch=8).shape
    (3, 4, 8)
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import TYPE_CHECKING, Sequence

import numpy as np

from testbed.data.federated import Split
from testbed.streams.rng import Purpose, node_streams
from testbed.util.parallel import split_work

if TYPE_CHECKING:
    from testbed.learning.models import Model
    from testbed.streams.node_secret import Secrets


#: Bytes of batch keys drawn at once (see :func:`uniform_batches`).
_KEY_BLOCK_BYTES = 8 << 20


def check_batches(section: str, train: Split, node_ids: Sequence[int], steps: int, batch: int,
                  steps_key: str) -> None:
    """Refuse, in one line naming the key, a round's mini-batches that cannot be drawn: a batch
    larger than a node's training set (``{section}.batch``), or more memory than this machine has
    for the round's batch indices, (nodes, steps, batch), and one node's keys, (steps, its samples)
    (``{section}.{steps_key}``). Called by an algorithm's build, before anything is drawn.

    Raises:
        ConfigError: naming ``{section}.batch`` or ``{section}.{steps_key}``.
    """
    from testbed.errors import ConfigError  # noqa: PLC0415  (errors imports nothing of ours)
    from testbed.util import memory

    sizes = np.diff(train.offsets)
    if len(sizes) and batch > sizes.min():
        smallest = int(sizes.argmin())
        raise ConfigError(f"{section}.batch", f"{batch} is larger than node {node_ids[smallest]}'s {int(sizes[smallest])} "
                                              f"training samples")
    need = 8.0 * steps * (len(sizes) * batch + int(sizes.max(initial=0)))
    have = memory.available_bytes()
    if have is not None and need > have:
        raise ConfigError(f"{section}.{steps_key}", f"{steps:,} steps a round need about {need / 2**30:,.1f} GiB for "
                                                    f"the round's mini-batches, this machine has {have / 2**30:,.1f} GiB")


def node_keys(train: Split, node_ids: Sequence[int], round_index: int, seed: int, steps: int,
              secrets: "Secrets | None" = None) -> list[np.ndarray]:
    """Per node i, a (steps, N_i) array of uniform keys from ``stream(seed, node, r, BATCH)`` (its
    secret's stream when ``secrets`` holds one): one key per sample and step, so any sampling rule
    is a function of a node's own keys only."""
    sizes = np.diff(train.offsets)
    return [rng.random((steps, int(sizes[i])))
            for i, rng in enumerate(node_streams(seed, node_ids, round_index, Purpose.BATCH, secrets))]


def uniform_batches(train: Split, node_ids: Sequence[int], round_index: int, seed: int, steps: int,
                    batch: int, secrets: "Secrets | None" = None) -> np.ndarray:
    """Global row indices (M, steps, B): per node and step, B distinct samples drawn uniformly (the
    rows of the B smallest keys, the keys of :func:`node_keys`, from a node's secret when
    ``secrets`` holds one: amplification by subsampling needs batches the observer cannot know). A node with exactly B samples uses
    all of them every step."""
    sizes = np.diff(train.offsets)
    idx = np.empty((len(node_ids), steps, batch), dtype=np.int64)
    by_size: dict[int, list[int]] = defaultdict(list)
    for i, n in enumerate(sizes.tolist()):
        by_size[n].append(i)
    for n, members in by_size.items():  # one key array and one argpartition per distinct node size
        if batch > n:
            raise ValueError(f"a batch of {batch} from a node of {n} samples")
        if batch == n:
            idx[members] = np.arange(n)
            continue
        # Keys and their argpartition for a block of nodes at a time: (nodes, steps, n) of them for
        # 10,000 nodes would be 640 MB, of which only the (nodes, steps, B) indices are kept.
        block = max(1, _KEY_BLOCK_BYTES // (8 * steps * n))
        keys = np.empty((min(block, len(members)), steps, n))
        for first in range(0, len(members), block):
            part = members[first:first + block]

            def draw(a: int, b: int) -> None:  # nodes part[a:b], each from its own stream, then their batches
                for j, rng in enumerate(node_streams(seed, [node_ids[i] for i in part[a:b]], round_index,
                                                     Purpose.BATCH, secrets), a):
                    rng.random(out=keys[j])
                idx[part[a:b]] = np.argpartition(keys[a:b], batch - 1, axis=-1)[..., :batch]

            split_work(len(part), draw, numbers=len(part) * steps * n)
    idx += train.offsets[:-1, None, None]
    return idx


def clipped_gradients(model: "Model", params: np.ndarray, train: Split, node_ids: Sequence[int], round_index: int,
                      seed: int, batch: int, gmax: float, secrets: "Secrets | None" = None) -> np.ndarray:
    """(M, P) each node's stochastic gradient at its own ``params`` row on one uniform mini-batch
    (``stream(seed, node, r, BATCH)``, its secret's with ``secrets``), clipped to ``gmax`` in L2 norm: ‖g_i‖ <= g_max, so one
    record's influence on a step of rate γ is at most 2γ g_max. A model without a gradient bound
    (a deep network) also clips each sample's gradient at ``gmax``, bounding a record's influence
    by construction; the batch clip holds either way."""
    idx = uniform_batches(train, node_ids, round_index, seed, steps=1, batch=batch, secrets=secrets)[:, 0]
    weights = np.full(idx.shape, 1.0 / batch)
    per_sample = gmax if math.isinf(model.lipschitz_bound) else None
    _, grad = model.loss_and_grad(params, train.x[idx], train.y[idx], weights, per_sample)
    norms = np.linalg.norm(grad, axis=1, keepdims=True)
    grad *= np.minimum(1.0, gmax / np.maximum(norms, 1e-300))
    return grad
