"""The paper's accountant (DP-PASGD §5): zCDP composition, Lemma 3 conversion, no amplification by
sampling, replace-one adjacency. For DP-PASGD it reproduces eq. (9) exactly.

It accounts for every Gaussian composition: claiming no amplification, it needs nothing of the
sampling, and an add/remove sensitivity is doubled to a replace-one one. Its two lemmas (ρ of one
Gaussian mechanism, ρ-zCDP to (ε, δ)) live here, below the papers' calculators
(testbed.privacy.zcdp) that use them too.

Example::

    >>> round(REGISTRATION.epsilon([((1.0, 2 / 32, "replace_one", "none", 1.0), 100)], delta=1e-4), 6)
    2.87777
"""

from __future__ import annotations

import math
from typing import Iterable

from testbed.privacy.accountants.registry import Items, Registration, Signature


def gaussian_rho(sensitivity: float, sigma: float) -> float:
    """ρ of one Gaussian mechanism, Lemma 2: Δ² / (2σ²).

    Never raises: σ = 0 (or NaN) is an infinite loss, a huge σ a loss that underflows to 0.
    Δ² or σ² beyond float64 (from about 1.3e154; OverflowError) or σ² underflowing to 0 are
    computed as (Δ/σ)²/2 instead, which overflows to inf or underflows to 0 quietly.

    Example::

        >>> gaussian_rho(1.0, 2.0), gaussian_rho(1.0, 0.0), gaussian_rho(1.0, 1e300)
        (0.125, inf, 0.0)
    """
    if not sigma > 0:
        return math.inf
    try:
        return sensitivity**2 / (2.0 * sigma**2)  # as printed, so published numbers stay bit-identical
    except (OverflowError, ZeroDivisionError):
        ratio = sensitivity / sigma  # float division and product overflow to inf, never raise
        return 0.5 * ratio * ratio


def rho_to_epsilon(rho: float, delta: float) -> float:
    """Lemma 3: ρ-zCDP implies (ρ + 2·sqrt(ρ·log(1/δ)), δ)-DP. NaN or infinite ρ gives ε = inf."""
    if not math.isfinite(rho):
        return math.inf
    return rho + 2.0 * math.sqrt(rho * math.log(1.0 / delta))


def _replace_one_sensitivity(sensitivity: float, adjacency: str) -> float:
    # Replacing a record = removing one and adding one: at most twice the add/remove sensitivity.
    return sensitivity if adjacency == "replace_one" else 2.0 * sensitivity


def zcdp_rho(items: Iterable[tuple[Signature, int]]) -> float:
    """Total ρ of the (signature, count) Gaussian compositions (Lemmas 1 and 2), replace-one adjacency."""
    return sum(
        count * gaussian_rho(_replace_one_sensitivity(sens, adj), sigma)
        for (sigma, sens, adj, _sampling, _rate), count in items
    )


def _compose(items: Items, delta: float) -> float:
    return rho_to_epsilon(zcdp_rho(items), delta)


REGISTRATION = Registration(name="zcdp", order=0, refuses=lambda pairs: None, compose=_compose)
