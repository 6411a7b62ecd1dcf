"""JSON as the testbed prints and writes it: always valid JSON (RFC 8259), which has no NaN or
infinity. Python's json module writes ``NaN`` and ``Infinity`` unless told not to, and every
strict reader (jq, JavaScript's JSON.parse, Go, serde) refuses them; so every JSON the testbed
prints or writes goes through :func:`dumps` (``allow_nan=False``: a non-finite number is a bug
that raises), and data that may hold one (a diverged loss) is first made :func:`finite`.
A test greps the sources for any other ``json.dump``.

Example::

    >>> dumps(finite({"loss": float("nan"), "epsilon": float("inf"), "rounds": 3}))
    '{"loss": null, "epsilon": null, "rounds": 3}'
"""

from __future__ import annotations

import json
import math
from typing import Any


def dumps(value: Any, **options: Any) -> str:
    """``json.dumps(value, **options)`` refusing NaN and infinities (ValueError)."""
    return json.dumps(value, allow_nan=False, **options)


def finite(value: Any) -> Any:
    """``value`` with every non-finite float (NaN, ±inf; numpy's too) replaced by None, the JSON
    null: what a summary says of a number it does not have (a diverged loss, an unbounded ε)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    if hasattr(value, "dtype") and getattr(value, "ndim", None) == 0 and value.dtype.kind == "f":
        return finite(float(value))
    return value
