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

from testbed.privacy.accountants.zcdp import gaussian_rho, rho_to_epsilon  # Lemmas 2 and 3: the accountant's


class SigmaCalibration(str, enum.Enum):
    """How σ is obtained from a target ε.

    ``corrected``: the root of eq. (9) that meets the target (dp-pasgd.md §2.3).
    ``paper_literal``: eq. (23) as printed, σ² = 2KG²/(X²Z); it spends far more than the target
    (ε ≈ 76.6 instead of 1 at K=100, G=1, X=32, δ=1e-4) and is kept only to reproduce the paper.
    """

    CORRECTED = "corrected"
    PAPER_LITERAL = "paper_literal"


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
