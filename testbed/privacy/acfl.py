"""ACFL (Li, Xiao, Skoglund, arXiv 2403.14905): the MI-DP of the coded data set (Theorem 1), its
inverse, and the convergence bound and optimal weight of Theorems 2–3 (Lemma 2's u, α*, ũ).

Every function takes plain floats (or numpy arrays of them, broadcast) and returns the same; ε is
in nats unless ``unit="bits"`` (the paper does not state the log base; its proof uses differential
entropies ½ log(2πeσ²), so nats is the natural reading: acfl.md §3.2).

Symbols: d features, o outputs, N devices, p the straggler probability, β² a bound on a device's
squared gradient norm (Assumption 2), C² on ‖W‖²_F (Assumption 3), λ the strong convexity of
Σ XᵀX, T iterations, σ₁², σ₂² the noise variances of H_X and H_Y.

SCFL (Sun et al., [24] of the paper): its own MI-DP theorem is not in the seeds. For the encoding
this testbed implements (``testbed.algorithms.acfl``: a d × m projection with unit-norm columns,
then N(0, σ₁²) noise) :func:`scfl_epsilon` is a bound **derived here**, not the paper's.

Example::

    >>> round(mi_epsilon(10, 10, 1.0, 1.0), 4)          # acfl.md §3.3: σ² = 1 → ε ≈ 10.05
    10.0506
    >>> s1, s2 = sigma_sq_for_epsilon(10, 10, 14.5 * math.log(2.0))
    >>> round(s1, 4), round(s2, 4)
    (1.0, 1.0)
"""

from __future__ import annotations

import math

import numpy as np

#: The unit ε is given in: nats (natural log, the default) or bits (log base 2).
UNITS = ("nats", "bits")


def _scale(unit: str) -> float:
    """Nats per ``unit``."""
    if unit not in UNITS:
        raise ValueError(f"unit must be one of {', '.join(UNITS)}, got {unit!r}")
    return math.log(2.0) if unit == "bits" else 1.0


def _in_unit(eps_nats, unit: str):
    return eps_nats / _scale(unit)


def mi_epsilon(dim: int, outputs: int, sigma1_sq, sigma2_sq, unit: str = "nats"):
    """ε of Theorem 1, eq. (17): ε = (d − ½) log(1 + 1/σ₁²) + (o/2) log(1 + 1/σ₂²), per device,
    per entry of its features X (|x| ≤ 1, Assumption 1); not dependent on m, N or p.

    Args:
        dim: d. outputs: o. sigma1_sq, sigma2_sq: σ₁², σ₂² > 0 (floats or arrays).
        unit: "nats" or "bits".
    Returns:
        ε in ``unit`` (shape of the broadcast inputs).

    Example::

        >>> round(mi_epsilon(100, 10, 1.0, 1.0), 2)     # Fig. 1's d = 100, o = 10
        72.43
    """
    s1, s2 = np.asarray(sigma1_sq, dtype=float), np.asarray(sigma2_sq, dtype=float)
    eps = (dim - 0.5) * np.log1p(1.0 / s1) + 0.5 * outputs * np.log1p(1.0 / s2)  # eq. (17)
    return _in_unit(eps if eps.ndim else float(eps), unit)


def sigma_sq_for_epsilon(dim: int, outputs: int, epsilon: float, ratio: float = 1.0,
                         unit: str = "nats") -> tuple[float, float]:
    """The inverse of Theorem 1: (σ₁², σ₂²) with σ₂² = ``ratio`` · σ₁² whose ε (eq. 17) is ``epsilon``.

    With ratio 1, closed form (acfl.md §3.3): σ² = 1 / (exp(ε / (d − ½ + o/2)) − 1); otherwise ε
    is decreasing in σ₁² and the root is found by bisection on log σ₁² (relative error < 1e-12).

    Example::

        >>> s1, s2 = sigma_sq_for_epsilon(10, 10, 5.0, ratio=4.0)
        >>> round(float(mi_epsilon(10, 10, s1, s2)), 9), s2 / s1
        (5.0, 4.0)
    """
    if not epsilon > 0 or not ratio > 0:
        raise ValueError(f"epsilon and ratio must be > 0, got {epsilon}, {ratio}")
    eps_nats = epsilon * _scale(unit)
    if ratio == 1.0:
        s = 1.0 / math.expm1(eps_nats / (dim - 0.5 + 0.5 * outputs))
        return s, s
    lo, hi = -200.0, 200.0  # log σ₁²
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mi_epsilon(dim, outputs, math.exp(mid), ratio * math.exp(mid)) > eps_nats:
            lo = mid
        else:
            hi = mid
    s1 = math.exp(0.5 * (lo + hi))
    return s1, ratio * s1


def scfl_epsilon(sigma1_sq, unit: str = "nats"):
    """ε-MI-DP of the SCFL encoding implemented here (**derived**, not in the seeds): the coded
    features G X + N₁ with G ∈ R^{d×m} of unit-norm columns, N₁ i.i.d. N(0, σ₁²), G known to the
    observer. An entry X_jk enters only column k, as g_j X_jk + N₁[:, k]; projecting on g_j
    (a sufficient statistic) leaves the scalar channel X_jk + N(0, σ₁²), so with |X_jk| ≤ 1
    (Assumption 1) I(X_jk; G X + N₁ | X^{−jk}, Y, G) ≤ ½ ln(1 + 1/σ₁²). The coded labels G Y + N₂
    do not depend on X_jk given Y and G (the conditioning of the paper's Theorem 1 proof).

    Example::

        >>> round(scfl_epsilon(1.0), 6)
        0.346574
    """
    s1 = np.asarray(sigma1_sq, dtype=float)
    eps = 0.5 * np.log1p(1.0 / s1)
    return _in_unit(eps if eps.ndim else float(eps), unit)


def scfl_sigma_sq_for_epsilon(epsilon: float, unit: str = "nats") -> float:
    """The inverse of :func:`scfl_epsilon` (derived): σ₁² = 1 / (exp(2ε) − 1)."""
    if not epsilon > 0:
        raise ValueError(f"epsilon must be > 0, got {epsilon}")
    eps_nats = epsilon * _scale(unit)
    return 1.0 / math.expm1(2.0 * eps_nats)


def u_bound(alpha, *, nodes: int, p: float, beta_sq: float, model_bound_sq: float, dim: int, outputs: int,
            sigma1_sq: float, sigma2_sq: float):
    """u(σ₁², σ₂², α) of Lemma 2 / Theorem 2, eqs. (27) and (34): the bound on E‖G_All‖²_F,

        u = [α²p + (1−p)(α + (1−α)/(1−p))² + N − 1] N β² + α² N d σ₁² C² + α² N σ₂² o d.

    Args:
        alpha: α (float or array). nodes: N. p: straggler probability in [0, 1).
        beta_sq: β². model_bound_sq: C². dim: d. outputs: o. sigma1_sq, sigma2_sq: σ₁², σ₂².
    """
    a = np.asarray(alpha, dtype=float)
    n = nodes
    u = ((a**2 * p + (1 - p) * (a + (1 - a) / (1 - p)) ** 2 + n - 1) * n * beta_sq
         + a**2 * n * dim * sigma1_sq * model_bound_sq + a**2 * n * sigma2_sq * outputs * dim)  # eq. (34)
    return u if u.ndim else float(u)


def optimal_alpha(*, nodes: int, p: float, beta_sq: float, model_bound_sq: float, dim: int, outputs: int,
                  sigma1_sq: float, sigma2_sq: float):
    """α* of Theorem 3, eq. (36), the minimiser of u over [0, 1]:

        α* = [pNβ²/(1−p)] / [pNβ²/(1−p) + N d σ₁² C² + N σ₂² o d].

    The adaptive policy of eq. (43) is this with β² → β̂², C² → Ĉ² (after multiplying through by
    (1−p)/N). Arrays broadcast.
    """
    s = p * nodes * np.asarray(beta_sq, dtype=float) / (1 - p)
    noise = nodes * dim * np.asarray(sigma1_sq, dtype=float) * model_bound_sq + nodes * np.asarray(sigma2_sq) * outputs * dim
    a = np.divide(s, s + noise, out=np.zeros(np.broadcast(s, noise).shape), where=(s + noise) > 0)  # eq. (36)
    return a if a.ndim else float(a)


def u_tilde(*, nodes: int, p: float, beta_sq: float, model_bound_sq: float, dim: int, outputs: int,
            sigma1_sq, sigma2_sq):
    """ũ(σ₁², σ₂²) of eq. (38), u at α*:

        ũ = −(pNβ²/(1−p))² / (Nβ²p/(1−p) + N d σ₁² C² + N σ₂² o d) + Nβ²/(1−p) + Nβ²(N−1).
    """
    s = p * nodes * beta_sq / (1 - p)
    denom = s + nodes * dim * np.asarray(sigma1_sq, dtype=float) * model_bound_sq \
        + nodes * np.asarray(sigma2_sq, dtype=float) * outputs * dim
    ut = -(s**2) / denom + nodes * beta_sq / (1 - p) + nodes * beta_sq * (nodes - 1)  # eq. (38)
    return ut if np.ndim(ut) else float(ut)


def convergence_bound(u: float, strong_convexity: float, iterations: int):
    """The bound on E‖W_T − W*‖²_F of eqs. (33) and (37): 4u / (λ² T), with u = u(α) of eq. (34)
    for a fixed α or ũ of eq. (38) for α*."""
    bound = 4.0 * np.asarray(u, dtype=float) / (strong_convexity**2 * iterations)  # eqs. (33), (37)
    return bound if bound.ndim else float(bound)
