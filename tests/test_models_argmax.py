"""The evaluation's "argmax is the label" of two classes, a comparison of the two rows, is numpy's
argmax == y on every input: ties, NaN in either row, infinities, labels outside the classes."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from testbed.learning.models import _argmax_is

_VALUES = st.sampled_from([0.0, -0.0, 1.0, -1.0, 1e-300, np.inf, -np.inf, np.nan]) | st.floats(allow_nan=True)


@settings(max_examples=200, deadline=None)
@given(pairs=st.lists(st.tuples(_VALUES, _VALUES, st.integers(-1, 3)), min_size=1, max_size=30),
       classes=st.integers(2, 4))
def test_argmax_is_numpys_argmax_equals_label(pairs, classes):
    rows = np.array([[a, b] + [a] * (classes - 2) for a, b, _ in pairs]).T
    y = np.array([label for _, _, label in pairs], dtype=np.int64)
    assert _argmax_is(rows, y).tolist() == (rows.argmax(axis=0) == y).tolist()
