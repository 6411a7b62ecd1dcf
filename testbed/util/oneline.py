"""What is said in one line of a log or an error message: an error's text with its line breaks
and runs of spaces folded, cut short past a length; ids, the first ten and how many more.

Example::

    >>> one_line(ValueError("a\\n  b"))
    'a b'
    >>> len(one_line("x" * 500))
    200
    >>> shown_ids([3, 1, 2])
    '3, 1, 2'
    >>> shown_ids(range(12))
    '0, 1, 2, 3, 4, 5, 6, 7, 8, 9 and 2 more'
"""

from __future__ import annotations

from typing import Iterable

#: The most ids one line names.
SHOWN = 10


def one_line(exc: BaseException | str, most: int = 200) -> str:
    """``exc``'s text on one line of at most ``most`` characters ("..." where it was cut)."""
    text = " ".join(str(exc).split())
    return text if len(text) <= most else text[:most - 3] + "..."


def shown_ids(ids: Iterable[int]) -> str:
    """The first :data:`SHOWN` of ``ids`` with commas, then how many more there are."""
    ids = list(ids)
    shown = ", ".join(str(n) for n in ids[:SHOWN])
    return shown + (f" and {len(ids) - SHOWN} more" if len(ids) > SHOWN else "")
