"""δ against the smallest node's records: an (ε, δ) guarantee with δ >= 1/m allows the mechanism
that publishes one of a node's m records in the clear with probability δ, every record in turn:
"name-and-shame" (Dwork and Roth, The Algorithmic Foundations of Differential Privacy, §2.3, the
remark after Definition 2.4: δ should be less than the inverse of any polynomial in the database
size). Such a δ is refused unless the run is marked as a paper's reproduction
(``[privacy] reproduction = true``), and then the summary says so (:func:`delta_assumption`).

Example::

    >>> delta_assumption(1e-4, 500, reproduction=False) is None
    True
    >>> delta_assumption(0.01, 400, reproduction=True)[:40]
    'delta = 0.01 is at or above 1/m = 1/400 '
"""

from __future__ import annotations

from fractions import Fraction

from testbed.errors import ConfigError


def delta_too_large(delta: float, smallest_records: int) -> bool:
    """Whether δ >= 1/m, exactly (a float is a dyadic rational: no rounding decides it)."""
    return Fraction(delta) * smallest_records >= 1


def delta_assumption(delta: float, smallest_records: int, *, reproduction: bool) -> str | None:
    """The summary's sentence for a δ at or above 1/m (m: the smallest node's training records) in
    a reproduction; None for a δ below it.

    Raises:
        ConfigError: naming ``privacy.delta``, for such a δ outside a reproduction.
    """
    if smallest_records < 1 or not delta_too_large(delta, smallest_records):
        return None
    if not reproduction:
        raise ConfigError("privacy.delta", f"{delta:g} is at or above 1/m = 1/{smallest_records} (the smallest node's "
                                           f"training records): a mechanism may then publish a record in the clear; "
                                           f"take delta < {1 / smallest_records:.3g}, or mark a paper's reproduction "
                                           f"with [privacy] reproduction = true")
    return (f"delta = {delta:g} is at or above 1/m = 1/{smallest_records} (the smallest node's training records), as "
            f"the reproduced paper sets it: such a delta admits publishing a record in the clear with probability delta")
