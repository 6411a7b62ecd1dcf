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

import sys
from typing import Iterator, Sequence, Union

import numpy as np

from testbed.streams.rng import Purpose

__all__ = ["Purpose", "philox4x32", "words", "gaussians", "WordStream", "uniform_below", "floyd_sample", "uniform_pairs",
           "uniform_keys"]

_M0, _M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
_W0, _W1 = 0x9E3779B9, 0xBB67AE85
_TWO_PI = np.float32(6.2831855)  # 2π rounded to float32, the constant the firmware uses
_U24 = np.float32(2.0 ** -24)


#: Counters per pass of :func:`philox4x32`: a block's few temporaries stay in cache (three times
#: faster than one pass over a million counters, as client sampling makes every round).
_PHILOX_BLOCK = 16384
_LO, _HI = (0, 1) if sys.byteorder == "little" else (1, 0)  # the 32-bit halves of a uint64 in memory

#: A counter word: one value for every counter (a Python int) or one per counter ((n,) uint32).
Word = Union[int, np.ndarray]


def philox4x32(counters: np.ndarray, key: tuple[int, int]) -> np.ndarray:
    """Philox4x32-10 (Salmon et al., SC'11) of each counter: (n, 4) uint32 → (n, 4) uint32."""
    out = np.empty((len(counters), 4), np.uint32)
    for start in range(0, len(counters), _PHILOX_BLOCK):
        part = counters[start:start + _PHILOX_BLOCK]
        for i, word in enumerate(_philox_words(*(np.ascontiguousarray(part[:, i]) for i in range(4)), key)):
            out[start:start + _PHILOX_BLOCK, i] = word
    return out


def _philox_words(c0: Word, c1: Word, c2: Word, c3: Word, key: tuple[int, int],
                  words: int = 4) -> tuple[Word, ...]:
    """Philox4x32-10 of the counters (c0, c1, c2, c3), each word an int shared by every counter or
    an (n,) uint32 array: the first ``words`` output words, each an int or an (n,) uint32 array.

    A word shared by every counter is computed once as a Python int (client sampling's counters
    differ in their node word only: its first two rounds are mostly such words). A round's
    products are uint64; their 32-bit halves are read as uint32 views of them, not shifted and
    masked out: six numpy operations a round over the counters, not ten.
    """
    n = max((np.size(c) for c in (c0, c1, c2, c3) if isinstance(c, np.ndarray)), default=0)
    products = [np.empty((2, n), np.uint64), np.empty((2, n), np.uint64)]  # a round's, the last round's
    halves = [b.view(np.uint32).reshape(2, n, 2) for b in products]
    x0, x2 = np.empty(n, np.uint32), np.empty(n, np.uint32)
    k0, k1 = key[0] & 0xFFFFFFFF, key[1] & 0xFFFFFFFF
    for r in range(10):
        if r:  # the key is bumped before every round but the first
            k0, k1 = (k0 + _W0) & 0xFFFFFFFF, (k1 + _W1) & 0xFFFFFFFF
        last = r == 9 and words <= 2  # words 2 and 3 of the last round unused
        lo0, hi0 = (0, 0) if last else _times(c0, _M0, products[r & 1][0], halves[r & 1][0])
        lo1, hi1 = _times(c2, _M1, products[r & 1][1], halves[r & 1][1])
        c0, c2 = _xor3(hi1, c1, k0, x0), (0 if last else _xor3(hi0, c3, k1, x2))
        c1, c3 = lo1, lo0
    return (c0, c1, c2, c3)[:words]


def _times(c: Word, m: int, out: np.ndarray, halves: np.ndarray) -> tuple[Word, Word]:
    """(low, high) 32-bit halves of c·m: ints for an int c, else uint32 views of ``out``."""
    if not isinstance(c, np.ndarray):
        product = int(c) * int(m)
        return product & 0xFFFFFFFF, product >> 32
    np.multiply(c, m, out=out)
    return halves[:, _LO], halves[:, _HI]


def _xor3(a: Word, b: Word, k: int, out: np.ndarray) -> Word:
    """a ^ b ^ k: an int when a and b are, else written into ``out`` (which neither may be)."""
    if not isinstance(a, np.ndarray) and not isinstance(b, np.ndarray):
        return int(a) ^ int(b) ^ k
    if not isinstance(a, np.ndarray) or not isinstance(b, np.ndarray):
        array, scalar = (a, b) if isinstance(a, np.ndarray) else (b, a)
        return np.bitwise_xor(array, np.uint32(int(scalar) ^ k), out=out)
    np.bitwise_xor(a, b, out=out)
    out ^= np.uint32(k)
    return out


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

    u = ((w0 >> 5)·2²⁶ + (w1 >> 6) + 1)·2⁻⁵³ and v = ((w2 >> 5)·2²⁶ + (w3 >> 6))·2⁻⁵³, each sum
    exact in float64 (at most 2⁵³).

    Input: node_ids (M,); round_index, or (M,) one round per entry (many rounds in one call).
    Output: u (M,), v (M,).
    """
    return _uniforms(seed, node_ids, round_index, purpose, pairs=True)


def uniform_keys(seed: int, node_ids: Sequence[int], round_index: int, purpose: Purpose) -> np.ndarray:
    """The u of :func:`uniform_pairs` alone (client sampling's keys), bit for bit, in half the work:
    the last round's other two words are not computed, and the blocks of nodes are shared with a
    second thread (testbed.util.parallel)."""
    return _uniforms(seed, node_ids, round_index, purpose, pairs=False)[0]


def _uniforms(seed: int, node_ids: Sequence[int], round_index: int | np.ndarray, purpose: Purpose,
              pairs: bool) -> tuple[np.ndarray, ...]:
    from testbed.util.parallel import split_work

    ids = np.asarray(node_ids, dtype=np.int64)
    rounds = np.asarray(round_index, dtype=np.int64)
    out = [np.empty(len(ids)) for _ in range(2 if pairs else 1)]
    key = _key(seed)

    def blocks(lo: int, hi: int) -> None:  # blocks lo..hi-1 of the nodes, each from its own counters
        for start in range(lo * _PHILOX_BLOCK, min(hi * _PHILOX_BLOCK, len(ids)), _PHILOX_BLOCK):
            stop = min(start + _PHILOX_BLOCK, len(ids))
            node = (ids[start:stop] & 0xFFFFFFFF).astype(np.uint32)
            r = int(rounds) & 0xFFFFFFFF if rounds.ndim == 0 else (rounds[start:stop] & 0xFFFFFFFF).astype(np.uint32)
            w = _philox_words(0, node, r, int(purpose), key, words=4 if pairs else 2)
            for i, target in enumerate(out):
                _to_unit(w[2 * i], w[2 * i + 1], 1.0 - i, target[start:stop])

    count = -(-len(ids) // _PHILOX_BLOCK)
    split_work(count, blocks, numbers=len(ids) * 40)  # ~40 operations a counter
    return tuple(out)


def _to_unit(high: np.ndarray, low: np.ndarray, plus: float, out: np.ndarray) -> None:
    """out = ((high >> 5)·2²⁶ + (low >> 6) + plus)·2⁻⁵³, exact in float64; ``high`` is overwritten."""
    np.right_shift(high, 5, out=high)
    np.multiply(high, 2.0 ** 26, out=out)
    out += low >> 6
    if plus:
        out += plus
    out *= 2.0 ** -53
