"""A function that remembers its last call, for work a host repeats per node on one shared object.

An emulated host's nodes all read one decoded broadcast: what depends on that message alone (its
expected nodes, the hash of its experiment file, whether its tensors are the declared downlink)
is worked out for the first node and reused by the others. One entry, keyed on the identity of
the first argument, is all that takes: the next round brings a new message and replaces it.
"""

from __future__ import annotations

import functools
from typing import Callable, TypeVar

R = TypeVar("R")


def remember_last(fn: Callable[..., R]) -> Callable[..., R]:
    """``fn`` remembering its last result: called again with the same first argument (the same
    object: ``is``) and equal other arguments, it returns that result without running ``fn``.

    A call that raises is not remembered. Safe across threads: the remembered call is one tuple,
    read and replaced whole (a race costs a second run of ``fn``, never a wrong result). The
    entry keeps its arguments alive until the next call with other ones.

    Example::

        >>> calls = []
        >>> @remember_last
        ... def size(text, unit):
        ...     calls.append(text)
        ...     return len(text) // unit
        >>> text = "x" * 10
        >>> size(text, 2), size(text, 2), size(text, 5), len(calls)
        (5, 5, 2, 2)
    """
    last: tuple[object, tuple, R] | None = None

    @functools.wraps(fn)
    def remembering(first: object, *rest: object) -> R:
        nonlocal last
        seen = last  # one read: another thread may replace it meanwhile
        if seen is not None and seen[0] is first and seen[1] == rest:
            return seen[2]
        result = fn(first, *rest)
        last = (first, rest, result)
        return result

    return remembering
