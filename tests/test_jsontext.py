"""JSON as the testbed writes it (testbed.util.jsontext): dumps_outline, the summary's layout, is
the JSON dumps writes, laid out a key a line down its levels; a non-finite number is refused."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from testbed.util.jsontext import dumps, dumps_outline

finite_json = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.text(max_size=6) | st.integers(-5, 5) | st.booleans() | st.none() | st.floats(-1, 1), inner, max_size=4),
    max_leaves=20)


@settings(max_examples=200, deadline=None)
@given(value=finite_json, levels=st.integers(0, 4))
def test_the_outline_reads_back_as_dumps_writes_it(value, levels):
    text = dumps_outline(value, levels)
    assert json.loads(text) == json.loads(dumps(value))
    # Down ``levels`` levels of objects, a key a line: no line holds two of the top object's keys.
    if isinstance(value, dict) and len(value) > 1 and levels >= 1:
        assert text.count("\n") >= len(value) + 1


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_the_outline_refuses_a_non_finite_number_at_any_depth(bad):
    with pytest.raises(ValueError):
        dumps_outline({"nodes": {"0": {"epsilon": bad}}})
