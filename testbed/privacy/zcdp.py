"""Zero-concentrated DP (Bun & Steinke), the accountant of DP-PASGD (Hu et al., §5 of the paper).

All logs are natural. Sensitivities are L2. The paper's per-device guarantee composes K Gaussian
mechanisms on a mini-batch of X samples under replace-one adjacency, with no subsampling
amplification (dp-pasgd.md §2.2).

Example::

    >>> round(dp_pasgd_epsilon(steps=100, lipschitz=1.0, batch=32, sigma=1.0, delta=1e-4), 6)
    2.87777
"""

from __future__ import annotations

import enum
import math


class SigmaCalibration(str, enum.Enum):
    """How σ is obtained from a target ε.

    ``corrected``: the root of eq. (9) that meets the target (dp-pasgd.md §2.3).
    ``paper_literal``: eq. (23) as printed, σ² = 2KG²/(X²Z); it spends far more than the target
    (ε ≈ 76.6 instead of 1 at K=100, G=1, X=32, δ=1e-4) and is kept only to reproduce the paper.
    """

    CORRECTED = "corrected"
    PAPER_LITERAL = "paper_literal"


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


def epsilon_to_rho(epsilon: float, delta: float) -> float:
    """The largest ρ whose Lemma-3 conversion stays within ε: (sqrt(l + ε) − sqrt(l))², l = log(1/δ).

    Equals ε²/Z with Z of eq. (25) (dp-pasgd.md §2.3).
    """
    log_inv_delta = math.log(1.0 / delta)
    return (math.sqrt(log_inv_delta + epsilon) - math.sqrt(log_inv_delta)) ** 2


def z_constant(epsilon: float, delta: float) -> float:
    """Z of eq. (25): ε + 2·log(1/δ) + 2·sqrt(log(1/δ)² + ε·log(1/δ))."""
    log_inv_delta = math.log(1.0 / delta)
    return epsilon + 2.0 * log_inv_delta + 2.0 * math.sqrt(log_inv_delta**2 + epsilon * log_inv_delta)


def dp_pasgd_sensitivity(lipschitz: float, batch: int) -> float:
    """L2 sensitivity of the mini-batch gradient under replace-one adjacency: 2G/X (§2.2)."""
    return 2.0 * lipschitz / batch


def dp_pasgd_rho(steps: int, lipschitz: float, batch: int, sigma: float) -> float:
    """ρ_m after K noisy steps: 2KG²/(X²σ²) (composition of Lemma 2, dp-pasgd.md §2.2)."""
    return steps * gaussian_rho(dp_pasgd_sensitivity(lipschitz, batch), sigma)


def dp_pasgd_epsilon(steps: int, lipschitz: float, batch: int, sigma: float, delta: float) -> float:
    """ε_m of eq. (9): 2KG²/(X²σ²) + (2G/(Xσ))·sqrt(2K·log(1/δ))."""
    return rho_to_epsilon(dp_pasgd_rho(steps, lipschitz, batch, sigma), delta)


def dp_pasgd_sigma(
    steps: int,
    lipschitz: float,
    batch: int,
    epsilon: float,
    delta: float,
    calibration: SigmaCalibration | str = SigmaCalibration.CORRECTED,
) -> float:
    """σ_m meeting ε_th after K steps.

    ``corrected``: σ = sqrt(2K)·G / (X·(sqrt(l + ε) − sqrt(l))), the root of eq. (9) (§2.3).
    ``paper_literal``: eq. (23), σ² = 2KG²/(X²Z) with Z of eq. (25) (an erratum: not private at ε).
    """
    calibration = SigmaCalibration(calibration)
    if calibration is SigmaCalibration.PAPER_LITERAL:
        return math.sqrt(2.0 * steps * lipschitz**2 / (batch**2 * z_constant(epsilon, delta)))
    rho_allowed = epsilon_to_rho(epsilon, delta)
    return math.sqrt(2.0 * steps * lipschitz**2 / (batch**2 * rho_allowed))
