"""Random streams keyed by (seed, node id, round, purpose), and a node's secret for its private ones.

Every random draw of a run comes from one of these streams, so the same seed gives the same numbers
whether all nodes run in one process (sim) or each on its own board (mqtt): a node needs only its
own id to reproduce its draws, never another node's generator state.

A node with a secret (a real board, testbed.streams.node_secret) keys its private streams
(:data:`PRIVATE_PURPOSES`) with it instead, so that whoever holds the seed cannot regenerate them;
a node without one (``secret=None``: sim, emulated boards) keeps the key above, bit for bit.

Example::

    >>> g = stream(seed=7, node=3, round_index=0, purpose=Purpose.NOISE)
    >>> g.normal(size=2).shape
    (2,)
    >>> fast = [g.random() for g in node_streams(7, [3, 4], 0, Purpose.NOISE)]
    >>> fast == [stream(7, n, 0, Purpose.NOISE).random() for n in (3, 4)]
    True
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Iterator, Optional, Sequence

import numpy as np

if TYPE_CHECKING:
    from testbed.streams.node_secret import NodeSecret, Secrets

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
    CLIENTS = 10  # which nodes a round samples (testbed.rounds.client_sampling)
    EVAL = 11  # which nodes the model is evaluated on (output.eval_nodes, testbed.assembly.evaluation)
    TOPOLOGY = 12  # which nodes hear each other (testbed.topology: random graphs, positions, mobility)
    BUCKETS = 13  # which rows a robust server rule averages together (testbed.algorithms.aggregate.buckets)
    AUDIT = 14  # an empirical audit's canaries: which are in, their directions, when sampled (testbed.privacy.canaries)
    SCENE = 15  # where nodes stand in a ray-traced scene and how they walk (testbed.topology.scene)


#: The draws a privacy guarantee rests on: keyed by the node's secret when it has one. DWFL's
#: artificial noise is a NOISE draw. Every other purpose is public (the same for a board and sim).
PRIVATE_PURPOSES = frozenset({Purpose.NOISE, Purpose.BATCH, Purpose.SCORE})


def stream(seed: int, node: int, round_index: int, purpose: Purpose,
           secret: Optional["NodeSecret"] = None) -> np.random.Generator:
    """The generator for one (seed, node, round, purpose); independent of every other key.

    Args:
        seed: the run's seed (>= 0).
        node: node id (>= 0), or ``GLOBAL``.
        round_index: communication round (>= 0), or -1 for draws made once per run.
        purpose: what the draws are for.
        secret: the node's secret, which keys a private purpose's stream (HMAC of the key above);
            None (an emulated node), or a public purpose: the key above alone.
    """
    if secret is not None and purpose in PRIVATE_PURPOSES:
        return np.random.Generator(np.random.PCG64(np.random.SeedSequence(
            secret.stream_words(seed, node, round_index, int(purpose)))))
    # SeedSequence needs non-negative words: shift the -1 sentinels up by one.
    key = [int(seed), int(node) + 1, int(round_index) + 1, int(purpose)]
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(key)))


def node_streams(seed: int, nodes: Sequence[int], round_index: int, purpose: Purpose,
                 secrets: Optional["Secrets"] = None) -> Iterator[np.random.Generator]:
    """``stream(seed, node, round_index, purpose, secrets.get(node))`` for each of ``nodes`` in
    turn. Without secrets (or for a public purpose), three times faster: the SeedSequences of all
    nodes are hashed at once in numpy, and one generator is re-seeded for each node. A yielded
    generator is valid only until the next one is yielded.

    Per stream, numpy's SeedSequence + PCG64 + Generator take ~11 µs; at J1's 20,000 streams per
    run that was 0.2 s of a 4.5 s run. A node with a secret is a board stepping itself alone.
    """
    if secrets and purpose in PRIVATE_PURPOSES:
        for n in nodes:
            yield stream(seed, n, round_index, purpose, secrets.get(int(n)))
        return
    ids = np.asarray(nodes)
    if ids.size == 0:
        return
    fixed = (int(seed), int(round_index) + 1, int(purpose))
    if (ids.dtype.kind not in "iu" or ids.ndim != 1 or not all(0 <= w < 1 << 32 for w in fixed)
            or not (-1 <= int(ids.min()) and int(ids.max()) < (1 << 32) - 1)):  # several words per value: numpy's path
        for n in nodes:
            yield stream(seed, n, round_index, purpose)
        return
    words = np.empty((len(ids), 4), dtype=np.uint32)  # the key of stream(), one row per node
    words[:, 0], words[:, 2], words[:, 3] = fixed
    words[:, 1] = ids.astype(np.int64) + 1
    states = _pcg64_seeds(words)
    bits = np.random.PCG64(0)
    generator = np.random.Generator(bits)
    for state0, state1, inc0, inc1 in states.tolist():
        # PCG64's seeding (pcg64_set_seed): inc = 2·initseq + 1; state = (initstate + inc)·A + inc.
        inc = (((inc0 << 64) | inc1) << 1 | 1) & _MASK128
        state = (((((state0 << 64) | state1) + inc) & _MASK128) * _PCG_MULT + inc) & _MASK128
        bits.state = {"bit_generator": "PCG64", "state": {"state": state, "inc": inc}, "has_uint32": 0, "uinteger": 0}
        yield generator


# numpy's SeedSequence (bit_generator.pyx) constants, and PCG64's 128-bit LCG multiplier.
_INIT_A, _MULT_A = np.uint32(0x43B0D7E5), np.uint32(0x931E8875)
_INIT_B, _MULT_B = np.uint32(0x8B51F9DD), np.uint32(0x58F38DED)
_MIX_MULT_L, _MIX_MULT_R, _XSHIFT = np.uint32(0xCA01F9DD), np.uint32(0x4973F715), np.uint32(16)
_PCG_MULT = (2549297995355413924 << 64) + 4865540595714422341
_MASK128 = (1 << 128) - 1


def _pcg64_seeds(keys: np.ndarray) -> np.ndarray:
    """``SeedSequence(key).generate_state(4, uint64)`` of each row of ``keys`` (M, 4) uint32, the
    four-word entropy filling the pool exactly: (M, 4) uint64."""

    def hashmix(value: np.ndarray, hash_const: np.uint32) -> tuple[np.ndarray, np.uint32]:
        value = value ^ hash_const
        hash_const = hash_const * _MULT_A
        value = value * hash_const
        return value ^ (value >> _XSHIFT), hash_const

    with np.errstate(over="ignore"):
        hash_const = _INIT_A
        pool = []
        for i in range(4):
            mixed, hash_const = hashmix(keys[:, i], hash_const)
            pool.append(mixed)
        for src in range(4):
            for dst in range(4):
                if src != dst:
                    mixed, hash_const = hashmix(pool[src], hash_const)
                    result = _MIX_MULT_L * pool[dst] - _MIX_MULT_R * mixed
                    pool[dst] = result ^ (result >> _XSHIFT)
        out = np.empty((keys.shape[0], 8), dtype=np.uint32)
        hash_const = _INIT_B
        for i in range(8):
            value = pool[i % 4] ^ hash_const
            hash_const = hash_const * _MULT_B
            value = value * hash_const
            out[:, i] = value ^ (value >> _XSHIFT)
    return out.view(np.uint64)
