"""testbed.util.memo.remember_last: one remembered call, keyed on the first argument's identity."""

import pytest

from testbed.util.memo import remember_last


def _counted():
    calls = []

    @remember_last
    def head(items, n):
        calls.append((items, n))
        if n < 0:
            raise ValueError("n must be >= 0")
        return items[:n]

    return head, calls


def test_the_same_object_and_equal_arguments_run_once():
    head, calls = _counted()
    items = [1, 2, 3]
    assert head(items, 2) == [1, 2] and head(items, 2) == [1, 2]
    assert len(calls) == 1


def test_an_equal_but_other_object_or_other_arguments_run_again():
    head, calls = _counted()
    items = [1, 2, 3]
    head(items, 2)
    head([1, 2, 3], 2)  # equal, not the same object: a new message is new work
    head([1, 2, 3], 1)
    assert len(calls) == 3


def test_only_the_last_call_is_remembered():
    head, calls = _counted()
    a, b = [1], [2]
    head(a, 1), head(b, 1), head(a, 1)
    assert len(calls) == 3


def test_a_call_that_raises_is_not_remembered():
    head, calls = _counted()
    items = [1, 2, 3]
    head(items, 1)
    for _ in range(2):
        with pytest.raises(ValueError):
            head(items, -1)
    assert len(calls) == 3  # the failing call ran each time
    assert head(items, 1) == [1] and len(calls) == 3  # the call before it is still the one remembered
