"""A number as a file or a message gives it, taken as a float64 only where it is one.

JSON and TOML give integers of any size: ``10**400`` is an ``int`` that ``float()`` refuses with
an OverflowError, and numpy's ``isfinite`` with a TypeError (past 2**63 already). A check that
says "finite" must say it of the float the value will be used as, without raising.

Example::

    >>> finite_real(3), finite_real(0.5), finite_real(10**400), finite_real(True), finite_real("1")
    (3.0, 0.5, None, None, None)
"""

from __future__ import annotations

import math
from numbers import Real
from typing import Any


def finite_real(value: Any) -> float | None:
    """``value`` as a finite float64 when it is a real number (an int of any size, a float,
    numpy's scalars; not a bool); None for NaN, ±inf, an int past float64's range, or anything
    else. Never raises."""
    if value.__class__ is float:  # the common case, without the checks below
        return value if math.isfinite(value) else None
    if isinstance(value, bool) or not isinstance(value, Real):
        return None
    try:
        as_float = float(value)
    except (OverflowError, ValueError, TypeError):
        return None
    return as_float if math.isfinite(as_float) else None
