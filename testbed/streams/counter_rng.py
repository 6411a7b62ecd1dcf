"""The portable counter-based generator a microcontroller node draws from (docs/serial-protocol.md
§ "The generator"): Philox4x32-10, a uniform float32, a Box–Muller Gaussian in float32 and an
exact uniform integer, so a board in C and this numpy code give the same draws.

A stream is keyed by (seed, node, round, purpose), like :func:`testbed.streams.rng.stream`: the Philox
key is the seed's two 32-bit halves, the counter is (block, node, round, purpose). Block ``i``
gives four 32-bit words, so word ``k`` of a stream is word ``k % 4`` of block ``k // 4``. Nothing
depends on state but the counter: a board recomputes any draw from its key alone (a retried round
releases the same noise, so a retry costs no privacy).

Example::

    >>> [hex(int(w)) for w in philox4x32(np.zeros((1, 4), np.uint32), (0, 0))[0]]
    ['0x6627e8d5', '0xe169c58d', '0xbc57ac4c', '0x9b00dbd8']
    >>> gaussians(7, 1, 0, Purpose.NOISE, 6).dtype
    dtype('float32')
"""

from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np

from testbed.streams.rng import Purpose

__all__ = ["Purpose", "philox4x32", "words", "gaussians", "WordStream", "uniform_below", "floyd_sample", "uniform_pairs"]

_M0, _M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
_W0, _W1 = 0x9E3779B9, 0xBB67AE85
_MASK = np.uint64(0xFFFFFFFF)
_TWO_PI = np.float32(6.2831855)  # 2π rounded to float32, the constant the firmware uses
_U24 = np.float32(2.0 ** -24)


#: Counters per pass of :func:`philox4x32`: its ~60 temporaries of a block stay in cache (three
#: times faster than one pass over a million counters, as client sampling makes every round).
_PHILOX_BLOCK = 16384


def philox4x32(counters: np.ndarray, key: tuple[int, int]) -> np.ndarray:
    """Philox4x32-10 (Salmon et al., SC'11) of each counter: (n, 4) uint32 → (n, 4) uint32."""
    if len(counters) <= _PHILOX_BLOCK:
        return _philox4x32_block(counters, key)
    out = np.empty((len(counters), 4), np.uint32)
    for start in range(0, len(counters), _PHILOX_BLOCK):
        out[start:start + _PHILOX_BLOCK] = _philox4x32_block(counters[start:start + _PHILOX_BLOCK], key)
    return out


def _philox4x32_block(counters: np.ndarray, key: tuple[int, int]) -> np.ndarray:
    c = [counters[:, i].astype(np.uint64) for i in range(4)]
    k0, k1 = key[0] & 0xFFFFFFFF, key[1] & 0xFFFFFFFF
    for r in range(10):
        if r:  # the key is bumped before every round but the first
            k0, k1 = (k0 + _W0) & 0xFFFFFFFF, (k1 + _W1) & 0xFFFFFFFF
        p0, p1 = _M0 * c[0], _M1 * c[2]
        c = [(p1 >> np.uint64(32)) ^ c[1] ^ np.uint64(k0), p1 & _MASK,
             (p0 >> np.uint64(32)) ^ c[3] ^ np.uint64(k1), p0 & _MASK]
    return np.stack(c, axis=1).astype(np.uint32)


def _key(seed: int) -> tuple[int, int]:
    return int(seed) & 0xFFFFFFFF, (int(seed) >> 32) & 0xFFFFFFFF


def words(seed: int, node: int, round_index: int, purpose: Purpose, first_block: int, blocks: int) -> np.ndarray:
    """Words of blocks ``first_block .. first_block+blocks-1`` of one stream, (4·blocks,) uint32."""
    ctr = np.empty((blocks, 4), np.uint32)
    ctr[:, 0] = np.arange(first_block, first_block + blocks, dtype=np.uint64).astype(np.uint32)
    ctr[:, 1], ctr[:, 2], ctr[:, 3] = int(node) & 0xFFFFFFFF, int(round_index) & 0xFFFFFFFF, int(purpose)
    return philox4x32(ctr, _key(seed)).reshape(-1)


def gaussians(seed: int, node: int, round_index: int, purpose: Purpose, count: int) -> np.ndarray:
    """The first ``count`` standard normals of a stream, (count,) float32.

    Words (w0, w1) give u = ((w0 >> 8) + 1)·2⁻²⁴ ∈ (0, 1], v = (w1 >> 8)·2⁻²⁴ ∈ [0, 1) and
    r = sqrt(−2 log u), a = 2π·v; the normals are r·cos a, r·sin a (every operation in float32);
    words (w2, w3) give the next two.
    """
    blocks = (count + 3) // 4
    w = words(seed, node, round_index, purpose, 0, blocks).reshape(-1, 2)
    u = ((w[:, 0] >> 8) + np.uint32(1)).astype(np.float32) * _U24
    v = (w[:, 1] >> 8).astype(np.float32) * _U24
    r = np.sqrt(np.float32(-2.0) * np.log(u))
    a = _TWO_PI * v
    return np.stack([r * np.cos(a), r * np.sin(a)], axis=1).reshape(-1)[:count]


class WordStream:
    """The words of one stream in order, drawn as needed (what a board's sampler consumes)."""

    def __init__(self, seed: int, node: int, round_index: int, purpose: Purpose, chunk_blocks: int = 64):
        self._key = (seed, node, round_index, purpose)
        self._chunk, self._block = chunk_blocks, 0
        self._words: Iterator[int] = iter(())

    def next(self) -> int:
        """The next 32-bit word."""
        try:
            return next(self._words)
        except StopIteration:
            self._words = iter(words(*self._key, self._block, self._chunk).tolist())
            self._block += self._chunk
            return next(self._words)


def uniform_below(stream: WordStream, m: int) -> int:
    """A uniform integer in [0, m), exactly (Lemire's multiply-shift with rejection), 1 <= m < 2³²."""
    prod = stream.next() * m
    low = prod & 0xFFFFFFFF
    if low < m:
        threshold = (1 << 32) % m  # = (2³² − m) mod m
        while low < threshold:
            prod = stream.next() * m
            low = prod & 0xFFFFFFFF
    return prod >> 32


def floyd_sample(stream: WordStream, n: int, b: int) -> list[int]:
    """B distinct indices of [0, n) uniformly (Floyd's algorithm), in insertion order: for j = n−B
    .. n−1, t = uniform_below(j+1); add j if t was chosen already, else t."""
    if not 0 < b <= n:
        raise ValueError(f"a sample of {b} from {n}")
    chosen: list[int] = []
    seen: set[int] = set()
    for j in range(n - b, n):
        t = uniform_below(stream, j + 1)
        pick = j if t in seen else t
        chosen.append(pick)
        seen.add(pick)
    return chosen


def uniform_pairs(seed: int, node_ids: Sequence[int], round_index: int | np.ndarray,
                  purpose: Purpose) -> tuple[np.ndarray, np.ndarray]:
    """Two float64 uniforms per node, u ∈ (0, 1] and v ∈ [0, 1) with 53 bits each, from the first
    Philox block of the node's (seed, node, round, purpose) counter: all nodes in one vectorised
    call, and a board (or its C firmware) computes its own from the same counter.

    Input: node_ids (M,); round_index, or (M,) one round per entry (many rounds in one call).
    Output: u (M,), v (M,).
    """
    ids = np.asarray(node_ids, dtype=np.int64)
    rounds = np.broadcast_to(np.asarray(round_index, dtype=np.int64), ids.shape)
    u, v = np.empty(len(ids)), np.empty(len(ids))
    scale = 2.0 ** -53
    for start in range(0, len(ids), _PHILOX_BLOCK):  # a block at a time, in cache, as philox4x32
        part = ids[start:start + _PHILOX_BLOCK]
        counters = np.zeros((len(part), 4), np.uint32)
        counters[:, 1] = part & 0xFFFFFFFF
        counters[:, 2], counters[:, 3] = rounds[start:start + _PHILOX_BLOCK] & 0xFFFFFFFF, int(purpose)
        w = _philox4x32_block(counters, (int(seed) & 0xFFFFFFFF, (int(seed) >> 32) & 0xFFFFFFFF)).astype(np.uint64)
        u[start:start + len(part)] = (((w[:, 0] >> np.uint64(5)) << np.uint64(26)) + (w[:, 1] >> np.uint64(6))
                                      + np.uint64(1)) * scale
        v[start:start + len(part)] = (((w[:, 2] >> np.uint64(5)) << np.uint64(26)) + (w[:, 3] >> np.uint64(6))) * scale
    return u, v
