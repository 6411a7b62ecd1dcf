"""The vectorised Philox of testbed.streams.counter_rng (uint32 views of the products, words shared
by every counter folded into Python ints, two threads over the blocks) against Philox4x32-10 written
out plainly on Python ints, one counter at a time: the draws a board and the coordinator make from
the same counter must not move when the numpy path is made faster."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from testbed.streams.counter_rng import _PHILOX_BLOCK, philox4x32, uniform_keys, uniform_pairs
from testbed.streams.rng import Purpose

_M0, _M1, _W0, _W1 = 0xD2511F53, 0xCD9E8D57, 0x9E3779B9, 0xBB67AE85


def _philox_plain(counter: tuple[int, int, int, int], key: tuple[int, int]) -> tuple[int, int, int, int]:
    (c0, c1, c2, c3), (k0, k1) = counter, key
    for r in range(10):
        if r:
            k0, k1 = (k0 + _W0) & 0xFFFFFFFF, (k1 + _W1) & 0xFFFFFFFF
        p0, p1 = _M0 * c0, _M1 * c2
        c0, c1, c2, c3 = (p1 >> 32) ^ c1 ^ k0, p1 & 0xFFFFFFFF, (p0 >> 32) ^ c3 ^ k1, p0 & 0xFFFFFFFF
    return c0, c1, c2, c3


def _pair_plain(seed: int, node: int, round_index: int, purpose: Purpose) -> tuple[float, float]:
    w = _philox_plain((0, node & 0xFFFFFFFF, round_index & 0xFFFFFFFF, int(purpose)),
                      (seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF))
    return ((((w[0] >> 5) << 26) + (w[1] >> 6) + 1) * 2.0 ** -53,
            (((w[2] >> 5) << 26) + (w[3] >> 6)) * 2.0 ** -53)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**64 - 1), round_index=st.integers(-1, 2**31), purpose=st.sampled_from(list(Purpose)),
       nodes=st.lists(st.integers(0, 2**40), min_size=1, max_size=40))
def test_uniform_pairs_and_keys_are_plain_philox_bit_for_bit(seed, round_index, purpose, nodes):
    u, v = uniform_pairs(seed, nodes, round_index, purpose)
    keys = uniform_keys(seed, nodes, round_index, purpose)
    plain = [_pair_plain(seed, n, round_index, purpose) for n in nodes]
    assert u.tolist() == [p[0] for p in plain] and v.tolist() == [p[1] for p in plain]
    assert keys.tolist() == u.tolist()


def test_many_blocks_and_rounds_per_node_are_plain_philox():
    # More nodes than two threads' blocks, one round per node (as the straggler draws tile rounds).
    nodes = np.arange(2 * _PHILOX_BLOCK + 77, dtype=np.int64) * 7919
    rounds = nodes % 13
    u, v = uniform_pairs(5, nodes, rounds, Purpose.STRAGGLER)
    keys = uniform_keys(5, nodes, 4, Purpose.CLIENTS)
    for i in (0, 1, _PHILOX_BLOCK - 1, _PHILOX_BLOCK, 2 * _PHILOX_BLOCK + 76):
        assert (u[i], v[i]) == _pair_plain(5, int(nodes[i]), int(rounds[i]), Purpose.STRAGGLER)
        assert keys[i] == _pair_plain(5, int(nodes[i]), 4, Purpose.CLIENTS)[0]


@settings(max_examples=30, deadline=None)
@given(counters=st.lists(st.tuples(*[st.integers(0, 2**32 - 1)] * 4), min_size=1, max_size=20),
       key=st.tuples(st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1)))
def test_philox4x32_is_plain_philox(counters, key):
    out = philox4x32(np.array(counters, dtype=np.uint32), key)
    assert [tuple(row) for row in out.tolist()] == [_philox_plain(c, key) for c in counters]
