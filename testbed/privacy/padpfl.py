"""Privacy of PADPFL (Talaei and Izadi, "Enhancing Federated Learning with Adaptive Differential
Privacy and Priority-Based Aggregation", arXiv 2406.18491; extraction ``adaptive-dp.md``): the
client noise of eq. (8), the server noise of eq. (13) (Theorem 1), the paper's linear accounting,
and the convergence-bound constants of Theorems 2 and 3.

Symbols (adaptive-dp.md §1.1): B the clipping bound on the whole weight vector, m_i a client's
training samples (only min_i m_i enters the noise), ε and δ the paper's target, c the Gaussian
mechanism's constant, T the rounds (broadcasts), R the most uploads of one client, p the impact
factors (Σ p_i = 1). Standard deviations are per coordinate of the weight vector, in the units of
the weights.

Compact form (adaptive-dp.md §2.3): with κ = 2Bc/(min m · ε), σ_C = κR, σ_AC = κR sqrt(Σp²),
σ_A = κT max p, σ_S = κ sqrt(T² max p² − R² Σp²) when T > R sqrt(Σp²)/max p, else 0.

Example (adaptive-dp.md §2.5, scenario 1, B = 1, ε = 5, δ = 0.01, R = 1)::

    >>> import numpy as np
    >>> p = np.repeat([0.0, 1 / 60, 1 / 30], 20)
    >>> round(gaussian_c(0.01), 5)
    3.10751
    >>> kappa = client_sigma(1.0, 1, 150, 5.0, 0.01)
    >>> round(kappa, 7), round(server_sigma(p, 1.0, 30, 1, 150, 5.0, 0.01) / kappa, 5)
    (0.0082867, 0.98601)
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

__all__ = [
    "gaussian_c", "client_sigma", "condition_threshold", "server_noise_needed", "server_sigma",
    "aggregated_client_sigma", "target_sigma", "broadcast_sigma", "paper_epsilon_uplink",
    "paper_epsilon_downlink", "gaussian_condition_holds", "BoundConstants", "bound_constants",
]


def gaussian_c(delta: float) -> float:
    """c = sqrt(2 ln(1.25/δ)) of the Gaussian mechanism (adaptive-dp.md §2.1, Dwork and Roth),
    the equality the paper's numbers use: 3.10751 at δ = 0.01."""
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    return math.sqrt(2.0 * math.log(1.25 / delta))


def client_sigma(clip: float, uploads: int, min_samples: int, epsilon: float, delta: float) -> float:
    """Eq. (8): σ_C = 2BRc/(min_i m_i ε), the same for every client.

    Args:
        clip: B, the clipping bound on a client's whole weight vector (weight units).
        uploads: R, the most uploads of one client over the run.
        min_samples: min_i m_i, the smallest client's training samples.
        epsilon, delta: the paper's target.
    Returns:
        σ_C, per coordinate (weight units).
    """
    return 2.0 * clip * uploads * gaussian_c(delta) / (min_samples * epsilon)


def condition_threshold(weights: np.ndarray) -> float:
    """sqrt(Σp²)/max p of eq. (13): the server adds noise iff T > R × this (>= 1; sqrt(N) for
    equal weights, NbAFL's condition T > L sqrt(N))."""
    p = np.asarray(weights, dtype=np.float64)
    return float(math.sqrt(float(p @ p)) / float(p.max()))


def server_noise_needed(weights: np.ndarray, rounds: int, uploads: int) -> bool:
    """Eq. (13)'s condition T > R sqrt(Σp²)/max p: whether the server must add noise."""
    return rounds > uploads * condition_threshold(weights)


def server_sigma(weights: np.ndarray, clip: float, rounds: int, uploads: int, min_samples: int,
                 epsilon: float, delta: float) -> float:
    """Eq. (13) (Theorem 1): σ_S = 2Bc sqrt(T² (max p)² − R² Σp²)/(min m ε) if
    T > R sqrt(Σp²)/max p, else 0. With p_i = 1/N it is NbAFL's 2Bc sqrt(T² − R²N)/(N min m ε).

    Args:
        weights: (N,) impact factors p of the round (Σ = 1, >= 0).
        clip, min_samples, epsilon, delta: as :func:`client_sigma`.
        rounds: T, broadcasts over the run.
        uploads: R.
    Returns:
        σ_S per coordinate (weight units); 0 on the zero branch.
    """
    p = np.asarray(weights, dtype=np.float64)
    if not server_noise_needed(p, rounds, uploads):
        return 0.0
    pmax, q = float(p.max()), float(p @ p)
    under = rounds**2 * pmax**2 - uploads**2 * q
    return 2.0 * clip * gaussian_c(delta) * math.sqrt(under) / (min_samples * epsilon)


def aggregated_client_sigma(weights: np.ndarray, sigma_client: float) -> float:
    """Eq. (12): σ_AC = sqrt(Σ p_i² σ_C²), the client noise left in the p-weighted sum."""
    p = np.asarray(weights, dtype=np.float64)
    return float(sigma_client * math.sqrt(float(p @ p)))


def target_sigma(weights: np.ndarray, clip: float, rounds: int, min_samples: int, epsilon: float,
                 delta: float) -> float:
    """σ_A = 2BTc max p/(min m ε) (proof of Theorem 1): the total noise the broadcast needs, from
    the sensitivity Δf = 2B max p/min m of eq. (10) and T broadcasts."""
    pmax = float(np.max(weights))
    return 2.0 * clip * rounds * gaussian_c(delta) * pmax / (min_samples * epsilon)


def broadcast_sigma(weights: np.ndarray, sigma_client: float, sigma_server: float) -> float:
    """The noise that really reached a broadcast, sqrt(Σ p_i² σ_C² + σ_S²) per coordinate (eq. 25:
    n = Σ p_i n_i + n_s), over the clients that contributed with their (redistributed) p_i."""
    return math.hypot(aggregated_client_sigma(weights, sigma_client), sigma_server)


def paper_epsilon_uplink(sigma_client: float, clip: float, min_samples: int, uploads_made: int,
                         delta: float) -> float:
    """The paper's accounting of the uploads (adaptive-dp.md §2.4: linear composition): each upload
    is a Gaussian mechanism of sensitivity 2B/min m (eq. 7) at ε_1 = c Δ/σ_C; R of them cost R ε_1.
    Equals the target ε when ``uploads_made`` = R and σ_C is eq. (8). δ is not composed (as printed)."""
    if sigma_client <= 0:
        return math.inf
    return uploads_made * gaussian_c(delta) * 2.0 * clip / (min_samples * sigma_client)


def paper_epsilon_downlink(pmax: float, sigma_broadcast: float, clip: float, min_samples: int,
                           broadcasts: int, delta: float) -> float:
    """The paper's accounting of the broadcasts: T of them, each of sensitivity 2B max p/min m
    (eq. 10) under noise σ (:func:`broadcast_sigma`), at c Δf/σ each (adaptive-dp.md §2.4). Equals
    the target ε when σ = σ_A of Theorem 1 (the condition holds); smaller on the zero branch."""
    if sigma_broadcast <= 0:
        return math.inf if pmax > 0 else 0.0
    return broadcasts * gaussian_c(delta) * 2.0 * clip * pmax / (min_samples * sigma_broadcast)


def gaussian_condition_holds(epsilon: float) -> bool:
    """Whether ε < 1, the Gaussian mechanism's condition the paper quotes (§2.1) and its own
    experiments (ε = 5, 20) violate: callers warn, they do not refuse."""
    return epsilon < 1.0


@dataclass(frozen=True)
class BoundConstants:
    """λ and k of Theorems 2 (eq. 46/50) and 3 (eq. 69), as printed.

    Attributes:
        lambda2, lambda1, lambda0: Lemma 2 (eq. 23/45), or Lemma 3 (eq. 52/68) with A'.
        k2, k1, k0: the bound E{L(x~^T) − L*} <= Θ + k2 T + k1 T²/ε + k0 T³/ε².
    """

    lambda2: float
    lambda1: float
    lambda0: float
    k2: float
    k1: float
    k0: float

    def bound(self, theta: float, rounds: int, epsilon: float) -> float:
        """Θ + k2 T + k1 T²/ε + k0 T³/ε² (eq. 46 / 69)."""
        return theta + self.k2 * rounds + self.k1 * rounds**2 / epsilon + self.k0 * rounds**3 / epsilon**2


def bound_constants(*, mu: float, rho: float, rho_minus: float, gamma: float, dissimilarity: float,
                    beta: float, clip: float, delta: float, pmax: float, max_samples: int, num_clients: int,
                    max_local_loss: float | None = None) -> BoundConstants:
    """The constants of Theorem 2 (``max_local_loss`` None) or Theorem 3 (given: adaptive factors,
    ``dissimilarity`` is A' of eq. 56, and k2 gains max{l_i}/2), exactly as printed, with the
    paper's max{m_i} in k1 and k0 (eq. 10 has min{m_i}; adaptive-dp.md §4.4).

    λ2 = −1/μ + (A/μ)(γ + ρ(1+γ)/μ̄) + ρA²(1+γ)²/(2μ̄²), λ1 = 1 + ρA(1+γ)/μ̄, λ0 = ρ/2, μ̄ = μ − ρ_−;
    k2 = λ2 β² (+ max l_i/2), k1 = 2λ1 β B c max p/max m · sqrt(2N/π), k0 = 4λ0 B² c² max p²/max m².

    Args:
        mu: FedProx μ. rho: smoothness ρ. rho_minus: ρ_− (μ̄ = μ − ρ_− > 0). gamma: inexactness γ.
        dissimilarity: A (Lemma 1) or A'. beta: the bound on ||∇L||. clip: B. delta: δ (for c).
        pmax: max p_i. max_samples: max m_i. num_clients: N. max_local_loss: max l_i (Theorem 3).
    """
    mu_bar = mu - rho_minus
    if mu_bar <= 0:
        raise ValueError(f"mu - rho_minus must be > 0 (Lemma 2's strong convexity), got {mu_bar}")
    a, g = dissimilarity, gamma
    lambda2 = -1.0 / mu + (a / mu) * (g + rho * (1 + g) / mu_bar) + rho * a**2 * (1 + g) ** 2 / (2 * mu_bar**2)
    lambda1 = 1.0 + rho * a * (1 + g) / mu_bar
    lambda0 = rho / 2.0
    c = gaussian_c(delta)
    k2 = lambda2 * beta**2 + (0.0 if max_local_loss is None else max_local_loss / 2.0)
    k1 = 2.0 * lambda1 * beta * clip * c * pmax / max_samples * math.sqrt(2.0 * num_clients / math.pi)
    k0 = 4.0 * lambda0 * clip**2 * c**2 * pmax**2 / max_samples**2
    return BoundConstants(lambda2, lambda1, lambda0, k2, k1, k0)
