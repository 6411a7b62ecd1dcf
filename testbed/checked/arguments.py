"""Numbers typed on the command line: every numeric argument's ``type=`` is a :class:`Number` or a
:class:`NumberList`, so it is finite and within a range its help text states, or argparse refuses
it in one line before any command runs.

The ranges are those of experiment files (testbed.checked.limits): an argument that declares no bound of
its own is held to ±MAX_INT (integers) or ±MAX_FLOAT (floats), so ``2**70`` or ``1e308`` never
reaches numpy. Lists (``--gains 1,2,2``, ``--ids 3,5``) hold each item to the same range, and to a
length and uniqueness where they name nodes.

A module of a low layer (it needs only testbed.errors and testbed.checked.limits), not of testbed.cli: the
sub-commands an algorithm adds to the command line (testbed.algorithms.registry.Command) live
next to their algorithm and type their numbers with it too.

Example::

    >>> Number(int, ge=1)("16")
    16
    >>> Number(float, gt=0).describe()
    '1e-30 <= x <= 1e+15'
    >>> NumberList(int, ge=0, unique=True)("3, 5,7")
    [3, 5, 7]
"""

from __future__ import annotations

import argparse
import functools
import math
from typing import Callable, Hashable, Iterable

from testbed.checked.limits import MAX_CHUNK_BYTES, MAX_FLOAT, MAX_INT, MAX_PID, MIN_CHUNK_BYTES, MIN_POSITIVE
from testbed.errors import UserError

class Number:
    """An argparse ``type``: the text of an int or a float, finite, within [ge or gt, le or lt].

    A side left open is closed at ±MAX_INT or ±MAX_FLOAT; a float's ``gt=0`` is ``ge=MIN_POSITIVE``
    (as in experiment files: 1e-308 is never inverted). A float argument takes integers too
    ("3"); an int argument takes only integers ("3", not "3.0" nor "1e3").
    """

    def __init__(self, kind: type = int, *, gt: float | None = None, ge: float | None = None,
                 lt: float | None = None, le: float | None = None):
        if kind not in (int, float):
            raise TypeError(f"Number takes int or float, not {kind!r}")
        limit = MAX_INT if kind is int else MAX_FLOAT
        if kind is float and gt == 0:
            gt, ge = None, MIN_POSITIVE
        self.kind = kind
        self.low, self.low_open = (gt, True) if gt is not None else (-limit if ge is None else ge, False)
        self.high, self.high_open = (lt, True) if lt is not None else (limit if le is None else le, False)
        self.__name__ = kind.__name__  # argparse names the type in some messages

    def __call__(self, text: str) -> int | float:
        value = self.parse(text)
        if not self.contains(value):
            raise argparse.ArgumentTypeError(f"must be {self._violated(value)}, got {text.strip()}")
        return value

    def _violated(self, value: float) -> str:
        """The bound ``value`` is on the wrong side of, e.g. ``>= 1``."""
        if value < self.low or (self.low_open and value == self.low):
            if self.low == MIN_POSITIVE and not self.low_open:  # a positive float, as config errors say it
                return f"> 0 (at least {MIN_POSITIVE:g})"
            return f"{'>' if self.low_open else '>='} {_show(self.low)}"
        return f"{'<' if self.high_open else '<='} {_show(self.high)}"

    def parse(self, text: str) -> int | float:
        """``text`` as this kind of number, finite; ArgumentTypeError otherwise."""
        word = "an integer" if self.kind is int else "a number"
        try:
            value = self.kind(text.strip())
        except (ValueError, OverflowError):
            raise argparse.ArgumentTypeError(f"must be {word} ({self.describe()}), got {text.strip()!r}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number ({self.describe()}), got {text.strip()}")
        return value

    def contains(self, value: float) -> bool:
        """Whether ``value`` is within the range."""
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below

    def describe(self) -> str:
        """The range as help texts and refusals state it, e.g. ``0 < x <= 1e+15``."""
        return (f"{_show(self.low)} {'<' if self.low_open else '<='} x "
                f"{'<' if self.high_open else '<='} {_show(self.high)}")


class NumberList:
    """An argparse ``type``: comma-separated numbers, each a :class:`Number` of the same range;
    ``min_len`` items at least, none twice if ``unique`` (node ids)."""

    def __init__(self, kind: type = int, *, min_len: int = 1, unique: bool = False, **bounds: float):
        self.item = Number(kind, **bounds)
        self.min_len, self.unique = min_len, unique
        self.__name__ = f"list of {kind.__name__}"

    def __call__(self, text: str) -> list[int | float]:
        values = [self.item(part) for part in text.split(",") if part.strip()]
        if len(values) < self.min_len:
            raise argparse.ArgumentTypeError(f"takes at least {self.min_len} comma-separated values, got {text!r}")
        twice = first_repeat(values) if self.unique else None
        if twice is not None:
            raise argparse.ArgumentTypeError(f"names {twice} twice")
        return values

    def describe(self) -> str:
        """The range of each item and the list's length, for help texts."""
        return (f"comma separated, at least {self.min_len}, each {self.item.describe()}"
                + (", no repeats" if self.unique else ""))


#: The common ranges: a count (1, 2, ...), a positive quantity, a probability in (0, 1), a node id,
#: a process id, a TCP port, an MQTT chunk size.
COUNT = Number(int, ge=1)
POSITIVE = Number(float, gt=0)
PROBABILITY = Number(float, gt=0, lt=1)
NODE_ID = Number(int, ge=0)
PID = Number(int, ge=1, le=MAX_PID)
PORT = Number(int, ge=1, le=65535)
CHUNK_BYTES = Number(int, ge=MIN_CHUNK_BYTES, le=MAX_CHUNK_BYTES)


def calculator(handler: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    """A calculator's handler, whose arithmetic beyond float64 on inputs within their ranges (an
    overflow, a division by a product that underflowed to 0) is a one-line refusal, not a traceback."""

    @functools.wraps(handler)
    def checked(args: argparse.Namespace) -> int:
        try:
            return handler(args)
        except ArithmeticError as exc:
            raise UserError(f"these inputs take the calculation beyond float64 ({exc}): use less extreme "
                            "values") from None

    return checked


def finite_result(result: dict) -> dict:
    """``result`` (a calculator's figures by name) if every number in it is finite; else UserError
    naming the figure: inputs within their ranges can still overflow float64 together (a tiny σ
    and many steps), and an ``inf`` is no answer."""
    for name, value in result.items():
        values = value if isinstance(value, (list, tuple)) else [value]
        for v in values:
            if isinstance(v, float) and not math.isfinite(v):
                raise UserError(f"{name} is {v} for these inputs (beyond float64): use less extreme values")
    return result


def first_repeat(values: Iterable[Hashable]) -> Hashable | None:
    """The first value of ``values`` that an earlier one equals, else None."""
    seen: set = set()
    for value in values:
        if value in seen:
            return value
        seen.add(value)
    return None


def _show(bound: float) -> str:
    return str(bound) if isinstance(bound, int) else f"{bound:g}"


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """States each numeric argument's range in its help text, from its type: a range cannot be
    documented differently from the one checked. Descriptions and epilogs keep their lines (a
    command's examples: testbed.cli.examples)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        describe: Callable[[], str] | None = getattr(action.type, "describe", None)
        if describe is not None:
            text = f"{text} [{describe()}]".strip()
        return text
