"""Random streams keyed by (seed, node id, round, purpose).

Every random draw of a run comes from one of these streams, so the same seed gives the same numbers
whether all nodes run in one process (sim) or each on its own board (mqtt): a node needs only its
own id to reproduce its draws, never another node's generator state.

Example::

    >>> g = stream(seed=7, node=3, round_index=0, purpose=Purpose.NOISE)
    >>> g.normal(size=2).shape
    (2,)
"""

from __future__ import annotations

import enum

import numpy as np

#: Node id used for draws that belong to no node (the coordinator, the channel, the data split).
GLOBAL = -1


class Purpose(enum.IntEnum):
    """What a stream is for; part of its key so that two purposes never share draws."""

    DATA = 1  # synthetic data generation and partitioning
    INIT = 2  # model initialisation
    BATCH = 3  # mini-batch sampling
    NOISE = 4  # privacy noise
    CHANNEL = 5  # fading, channel noise
    SPLIT = 6  # train/test/validation split
    STRAGGLER = 7  # emulated failures and delays
    SCORE = 8  # noise on a node-reported quality score (PADPFL's quality_score impact rule)
    FEATURES = 9  # a model's fixed random feature map (the linear model's random Fourier features)


def stream(seed: int, node: int, round_index: int, purpose: Purpose) -> np.random.Generator:
    """The generator for one (seed, node, round, purpose); independent of every other key.

    Args:
        seed: the run's seed (>= 0).
        node: node id (>= 0), or ``GLOBAL``.
        round_index: communication round (>= 0), or -1 for draws made once per run.
        purpose: what the draws are for.
    """
    # SeedSequence needs non-negative words: shift the -1 sentinels up by one.
    key = [int(seed), int(node) + 1, int(round_index) + 1, int(purpose)]
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(key)))
