"""Random streams: node_streams draws exactly what stream draws, key by key."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from testbed.streams.rng import GLOBAL, Purpose, node_streams, stream


@pytest.mark.parametrize("seed,round_index,purpose", [
    (0, 0, Purpose.NOISE), (7, -1, Purpose.DATA), (2**32 - 1, 12345, Purpose.BATCH), (123456789, 99, Purpose.SPLIT),
])
def test_node_streams_draw_what_stream_draws(seed, round_index, purpose):
    nodes = [GLOBAL, 0, 1, 2, 17, 1000, 2**31, 2**32 - 2]
    fast = [g.standard_normal(3).tolist() + [g.random(), int(g.integers(1 << 62))]
            for g in node_streams(seed, nodes, round_index, purpose)]
    slow = [g.standard_normal(3).tolist() + [g.random(), int(g.integers(1 << 62))]
            for g in (stream(seed, n, round_index, purpose) for n in nodes)]
    assert fast == slow


def test_keys_of_several_words_take_numpys_own_path():
    big = 2**40 + 3  # a seed past 32 bits is two SeedSequence words
    assert [g.random() for g in node_streams(big, [0, 5], 3, Purpose.NOISE)] == \
        [stream(big, n, 3, Purpose.NOISE).random() for n in (0, 5)]


def test_no_nodes_no_streams():
    assert list(node_streams(0, [], 0, Purpose.NOISE)) == []


@settings(max_examples=60, deadline=None)
@given(seed=st.one_of(st.integers(0, 2**32 + 1), st.integers(0, 2**63 - 1)),
       nodes=st.lists(st.one_of(st.integers(-1, 40), st.integers(2**32 - 3, 2**32 + 1), st.integers(0, 2**62)),
                      max_size=5),
       round_index=st.one_of(st.integers(-1, 5), st.integers(2**32 - 2, 2**32)),
       purpose=st.sampled_from(list(Purpose)), as_array=st.booleans())
def test_node_streams_are_stream_at_every_key_size(seed, nodes, round_index, purpose, as_array):
    """Keys that fit one 32-bit word each are hashed at once; a key past 32 bits (node + 1, round
    + 1 or the seed) takes numpy's own path: either way each generator is stream()'s."""
    given_nodes = np.array(nodes, dtype=np.int64) if as_array else nodes
    fast = [g.random() for g in node_streams(seed, given_nodes, round_index, purpose)]
    assert fast == [stream(seed, n, round_index, purpose).random() for n in nodes]
