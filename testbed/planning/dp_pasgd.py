"""Optimal design of DP-PASGD (Hu et al., §6–§7; dp-pasgd.md §4): τ, K and σ_m from the budgets.

The paper replaces the unknown loss L(θ*) of problem (10) by the convergence bound F of Theorem 1
(eqs. 12–13) and solves the relaxed problem (21) in steps:

1. τ* makes the resource constraint (21d) tight, eq. (22);
2. σ_m* makes the privacy constraint (21c) tight: eq. (23) as printed (``paper_literal``, an erratum
   that overspends ε) or the correct root of eq. (9) (``corrected``, dp-pasgd.md §2.3);
3. what is left is a 1-D problem in real K, eq. (24), solved here by a bounded 1-D search;
4. K* and τ* are rounded to integers (Step 6), here with a feasibility repair.

Units: c1, c2 and C_th share one cost unit (the paper's abstract units by default: c1 = 100 per
round, c2 = 1 per local step); ε is per device at δ; σ_m is the standard deviation of the Gaussian
noise added to each coordinate of the mini-batch gradient, in gradient units.

Example::

    >>> p = plan(BoundConstants(), cost_budget=1000.0, epsilon=4.0)
    >>> (p.tau, p.steps, p.rounds, p.cost)
    (6, 54, 9, 954.0)
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import NamedTuple

import numpy as np

from testbed.planning.cost import max_steps, resource_cost
from testbed.privacy.zcdp import SigmaCalibration, dp_pasgd_epsilon, dp_pasgd_sigma, z_constant

__all__ = [
    "BoundConstants",
    "BruteForceResult",
    "Plan",
    "bound_B",
    "bound_F",
    "brute_force",
    "k_objective",
    "lr_condition",
    "lr_tau_cap",
    "noise_dimension",
    "plan",
    "solve_k",
    "steps_domain",
    "tau_star",
]

# Points of the geometric K grid that brackets the global minimum of (24) before Brent refinement.
_GRID_POINTS = 2001
# Relative slack when comparing floating-point costs and the lr condition against their limits, so
# that exact ties (e.g. 9 rounds of 10 steps at C_th = 990) are not lost to rounding.
_REL_TOL = 1e-12


@dataclasses.dataclass(frozen=True)
class BoundConstants:
    """Constants of the convergence bound (12)–(13) and of the privacy constraint (21c).

    The defaults are **illustrative only**: the paper reports none of them (dp-pasgd.md §7 item 5).
    They were picked so that the optimum of (24) is interior (τ* > 1) for C_th in 500..5000 and
    ε_th in 1..10 with c1 = 100, c2 = 1, under both σ calibrations; real runs should estimate them
    from data.

    Attributes:
        learning_rate: η, the constant step size.
        smoothness: L, the smoothness constant (Assumption 1).
        strong_convexity: λ, the PL constant of Assumption 2; 0 < ηλ < 1 and λ <= L are required.
        grad_variance: ξ², the bound on the mini-batch gradient variance (Assumption 4).
        initial_gap: α = L(θ⁰) − L*, the initial loss gap.
        dimension: d, the number of model parameters.
        num_devices: M.
        lipschitz: G, the per-sample Lipschitz constant that sets the sensitivity 2G/X_m.
        batch_sizes: X_m, one per device; a single int is broadcast to all M devices.
        delta: δ of the (ε, δ)-DP guarantee of each device.
        noise_dimension: the dimension the privacy noise is charged with in B (13) and (24); None
            (default) is the paper's d. A smaller d_eff comes from a matrix bound on the Hessian
            (testbed.planning.estimate.noise_dimension); 0 < d_eff <= d.
    """

    learning_rate: float = 0.015
    smoothness: float = 1.0
    strong_convexity: float = 0.025
    grad_variance: float = 3.0
    initial_gap: float = 5.0
    dimension: int = 10
    num_devices: int = 16
    lipschitz: float = 1.0
    batch_sizes: int | tuple[int, ...] = 128
    delta: float = 1e-4
    noise_dimension: float | None = None

    def __post_init__(self) -> None:
        for name in ("learning_rate", "smoothness", "strong_convexity", "lipschitz"):
            _require(getattr(self, name) > 0, name, "must be positive", getattr(self, name))
        for name in ("grad_variance", "initial_gap"):
            _require(getattr(self, name) >= 0, name, "must be non-negative", getattr(self, name))
        for name in ("dimension", "num_devices"):
            value = getattr(self, name)
            _require(_is_positive_int(value), name, "must be a positive integer", value)
        _require(0 < self.delta < 1, "delta", "must lie in (0, 1)", self.delta)
        if self.noise_dimension is not None:
            _require(0 < self.noise_dimension <= self.dimension, "noise_dimension",
                     f"must lie in (0, dimension = {self.dimension}]", self.noise_dimension)
        # Step 0 of §4.4: the contraction factor 1 − ηλ of (12) must lie in (0, 1).
        _require(
            self.learning_rate * self.strong_convexity < 1,
            "learning_rate",
            "times strong_convexity must be below 1 (0 < 1 − ηλ < 1)",
            self.learning_rate,
        )
        # A PL constant larger than the smoothness constant is impossible (||∇L||² <= 2L(L − L*)).
        _require(
            self.strong_convexity <= self.smoothness,
            "strong_convexity",
            f"must not exceed smoothness ({self.smoothness})",
            self.strong_convexity,
        )
        batches = self.batch_sizes
        if _is_positive_int(batches):
            batches = (int(batches),) * self.num_devices
        else:
            _require(
                isinstance(batches, Sequence) and all(_is_positive_int(x) for x in batches),
                "batch_sizes",
                "must be a positive integer or a sequence of them",
                batches,
            )
            _require(
                len(batches) == self.num_devices,
                "batch_sizes",
                f"must have one entry per device (num_devices={self.num_devices})",
                batches,
            )
            batches = tuple(int(x) for x in batches)
        object.__setattr__(self, "batch_sizes", batches)


class BruteForceResult(NamedTuple):
    """The best integer design of a scan: period τ, steps K (a multiple of τ) and its bound F (21a)."""

    tau: int
    steps: int
    bound: float


@dataclasses.dataclass(frozen=True)
class Plan:
    """A DP-PASGD configuration chosen by :func:`plan`.

    Attributes:
        tau: aggregation period τ (local steps per round).
        steps: total local steps K per device; a multiple of τ when the plan was repaired.
        sigma: noise standard deviation σ_m per device, from eq. (9) at ``steps`` (or eq. 23).
        epsilon_target: ε_th asked for.
        epsilon_spent: ε that the plan really spends by eq. (9) with its σ, max over devices. For
            ``paper_literal`` this is far above the target (76.6 for a target of 1 at K = 100,
            X = 32, δ = 1e-4, dp-pasgd.md §2.3).
        cost: resource cost of eq. (8) at (τ, K), in the unit of c1, c2.
        cost_budget: C_th.
        rounds: complete communication rounds, K // τ.
        steps_real: K*, the continuous minimiser of (24) (see :func:`solve_k`).
        tau_real: τ*(K*) of eq. (22), or 1 when K* is below C_th/(c1+c2) (see :func:`steps_domain`).
        bound: F of (21a) at the integer plan.
        variant: the σ calibration used both inside (24) and for ``sigma``.
    """

    tau: int
    steps: int
    sigma: tuple[float, ...]
    epsilon_target: float
    epsilon_spent: float
    cost: float
    cost_budget: float
    rounds: int
    steps_real: float
    tau_real: float
    bound: float
    variant: SigmaCalibration

    @property
    def feasible(self) -> bool:
        """Whether the plan meets (21d), cost <= C_th, and the K mod τ = 0 of Theorem 1."""
        return self.cost <= self.cost_budget * (1 + _REL_TOL) and self.steps % self.tau == 0

    @property
    def meets_privacy_target(self) -> bool:
        """Whether eq. (9) at the plan's σ stays within ε_th; False for ``paper_literal`` (erratum)."""
        return self.epsilon_spent <= self.epsilon_target * (1 + 1e-9)


def noise_dimension(constants: BoundConstants) -> float:
    """The dimension the noise term d·σ² of B (13) is charged with: d, or the given d_eff."""
    return constants.dimension if constants.noise_dimension is None else constants.noise_dimension


def lr_condition(constants: BoundConstants, tau: float) -> float:
    """Left side of the learning-rate condition (21e): ηL + η²L²τ(τ−1); Theorem 1 needs it <= 1."""
    eta_l = constants.learning_rate * constants.smoothness
    return eta_l + eta_l**2 * tau * (tau - 1)


def lr_tau_cap(constants: BoundConstants) -> float:
    """The largest real τ >= 1 meeting (21e), the positive root of η²L²τ² − η²L²τ + ηL − 1 = 0.

    Raises:
        ValueError: if ηL > 1, when (21e) fails even at τ = 1.
    """
    eta_l = constants.learning_rate * constants.smoothness
    if eta_l > 1:
        raise ValueError(f"learning-rate condition (21e) fails at tau=1: eta*L = {eta_l} > 1")
    return 0.5 * (1.0 + math.sqrt(1.0 + 4.0 * (1.0 - eta_l) / eta_l**2))


def bound_B(constants: BoundConstants, tau: float, sigmas: float | Sequence[float]) -> float:
    """B of eq. (13)/(20): (ηL + η²L²(τ−1)M)/(2λM) · (ξ² + (d/M)·Σ_m σ_m²).

    Args:
        constants: the bound constants.
        tau: aggregation period τ (real values allowed, as in the relaxation of §4.4).
        sigmas: σ_m per device, or one σ for all devices.

    Returns:
        B, the limit of the bound (12) as K grows, in loss units.
    """
    c = constants
    sigma = _per_device(sigmas, c.num_devices)
    eta_l = c.learning_rate * c.smoothness
    period_factor = (eta_l + eta_l**2 * (tau - 1) * c.num_devices) / (2 * c.strong_convexity * c.num_devices)
    noise = c.grad_variance + noise_dimension(c) / c.num_devices * float(np.sum(sigma**2))
    return period_factor * noise


def bound_F(constants: BoundConstants, tau: float, steps: float, sigmas: float | Sequence[float]) -> float:
    """F of eq. (12)/(21a): (1−ηλ)^K·(α − B)/K + B, the bound on E[L(θ*) − L*] after K steps.

    Args:
        constants: the bound constants.
        tau: aggregation period τ.
        steps: total local steps K (>= 1; real values allowed).
        sigmas: σ_m per device, or one σ for all devices.

    Returns:
        F in loss units. Theorem 1 holds only when (21e) holds and τ divides K; this function does
        not check either, so that the relaxation can evaluate it at real (τ, K).
    """
    b = bound_B(constants, tau, sigmas)
    decay = (1.0 - constants.learning_rate * constants.strong_convexity) ** steps / steps
    return decay * (constants.initial_gap - b) + b


def tau_star(steps: float | np.ndarray, cost_budget: float, c1: float, c2: float) -> float | np.ndarray:
    """τ* of eq. (22): c1·K/(C_th − c2·K), the smallest real τ meeting (21d) at K steps.

    Args:
        steps: K (scalar or array), with c2·K < C_th.
        cost_budget: C_th; c1: cost per round; c2: cost per local step (one shared unit).

    Returns:
        τ* (real), same shape as ``steps``.
    """
    k = np.asarray(steps, dtype=float)
    slack = cost_budget - c2 * k
    if np.any(slack <= 0):
        raise ValueError(f"tau_star needs K < C_th/c2 = {cost_budget / c2}; got K = {steps}")
    tau = c1 * k / slack
    return float(tau) if tau.ndim == 0 else tau


def k_objective(
    steps: float | np.ndarray,
    constants: BoundConstants,
    cost_budget: float,
    epsilon: float,
    c1: float,
    c2: float,
    variant: SigmaCalibration | str = SigmaCalibration.CORRECTED,
) -> float | np.ndarray:
    """The objective of eq. (24): F after substituting τ*(K) of (22) and σ_m*(K), as a function of K.

        α(1−ηλ)^K/K + (1 − (1−ηλ)^K/K) · (ηL/(2λM) + η²L²(τ*(K) − 1)/(2λ)) · (ξ² + ν·K)

    with the noise slope ν = (2dG²/(M·Z))·Σ_m 1/X_m² for ``paper_literal`` (as printed in (24), Z of
    eq. 25) and ν = (2dG²·Z/(M·ε²))·Σ_m 1/X_m² for ``corrected`` (the erratum fix of §4.4).
    For K below C_th/(c1+c2), where (22) gives τ* < 1, τ is held at 1 (see :func:`steps_domain`);
    on the paper's domain this is (24) as printed.

    Args:
        steps: K (scalar or array) in the domain of :func:`steps_domain`.
        constants: the bound constants.
        cost_budget: C_th; epsilon: ε_th per device; c1, c2: costs of eq. (8).
        variant: σ calibration, see :class:`testbed.privacy.zcdp.SigmaCalibration`.

    Returns:
        The bound F (loss units), same shape as ``steps``.
    """
    c = constants
    k = np.asarray(steps, dtype=float)
    decay = (1.0 - c.learning_rate * c.strong_convexity) ** k / k
    eta_l = c.learning_rate * c.smoothness
    # Below C_th/(c1+c2), (22) gives τ* < 1; τ stays at its lower bound 1 and (21d) is slack.
    tau = np.maximum(1.0, tau_star(k, cost_budget, c1, c2))
    period_factor = eta_l / (2 * c.strong_convexity * c.num_devices) + eta_l**2 * (tau - 1) / (2 * c.strong_convexity)
    noise = c.grad_variance + _noise_slope(c, epsilon, variant) * k
    value = c.initial_gap * decay + (1.0 - decay) * period_factor * noise
    return float(value) if value.ndim == 0 else value


def steps_domain(constants: BoundConstants, cost_budget: float, c1: float, c2: float) -> tuple[float, float]:
    """The interval of real K searched for (24): [1, K_max(τ_cap)], in steps.

    The paper's natural domain is [C_th/(c1+c2), C_th/c2): at its lower end τ*(K) of (22) is 1, at
    its upper end τ* diverges. The learning-rate condition (21e) caps τ at :func:`lr_tau_cap`, so K
    at K_max(τ_cap) = C_th·τ_cap/(c1 + c2·τ_cap) < C_th/c2. Below C_th/(c1+c2) the constraint τ >= 1
    of (21) binds instead of (21d): τ = 1 with slack cost, which (24) as printed leaves out but which
    can beat every K of the printed domain, because σ_m*² grows with K (see :func:`k_objective`).
    """
    _check_budgets(cost_budget, c1, c2)
    # max_steps is increasing in τ and below C_th/c2 for every finite τ, so it is the binding end.
    return 1.0, max_steps(lr_tau_cap(constants), cost_budget, c1, c2)


def solve_k(
    constants: BoundConstants,
    cost_budget: float,
    epsilon: float,
    c1: float = 100.0,
    c2: float = 1.0,
    variant: SigmaCalibration | str = SigmaCalibration.CORRECTED,
) -> float:
    """K*, the minimiser of (24) over real K in :func:`steps_domain` (Step 4 of §4.4).

    The paper solves (24) "by using the standard gradient descent algorithm" without settings. On a
    bounded interval a 1-D bounded search finds the same minimiser and does not depend on a step
    size or a starting point: a geometric grid of K locates the global minimum (robust should (24)
    be non-convex), then Brent's bounded method refines it between the neighbouring grid points.
    If the minimum is at an end of the domain or at the kink K = C_th/(c1+c2) where τ*(K) = 1 (a
    common outcome, dp-pasgd.md §4.4), that point is returned exactly.

    Returns:
        K* in steps (real).
    """
    _check_budgets(cost_budget, c1, c2, epsilon)
    low, high = steps_domain(constants, cost_budget, c1, c2)
    # The kink of (24) at τ*(K) = 1, where the minimum often sits, is a grid point of its own.
    kink = min(max(cost_budget / (c1 + c2), low), high)
    grid = np.unique(np.concatenate([np.geomspace(low, high, _GRID_POINTS), [low, kink, high]]))

    def objective(k: float) -> float:
        return k_objective(k, constants, cost_budget, epsilon, c1, c2, variant)

    values = k_objective(grid, constants, cost_budget, epsilon, c1, c2, variant)
    best = int(np.argmin(values))
    left, right = grid[max(best - 1, 0)], grid[min(best + 1, len(grid) - 1)]
    from scipy import optimize  # here, not at the top: a run imports this module without planning

    refined = optimize.minimize_scalar(
        objective, bounds=(left, right), method="bounded", options={"xatol": 1e-10 * right}
    )
    # Brent never evaluates the bracket ends, so keep the grid point (possibly a domain end) if better.
    if refined.success and refined.fun < values[best]:
        return float(refined.x)
    return float(grid[best])


def plan(
    constants: BoundConstants,
    cost_budget: float,
    epsilon: float,
    c1: float = 100.0,
    c2: float = 1.0,
    variant: SigmaCalibration | str = SigmaCalibration.CORRECTED,
    repair: bool = True,
) -> Plan:
    """The DP-PASGD design of §4.4: K* from (24), τ* from (22), rounded, then σ_m from eq. (9).

    Rounding (Step 6). The paper rounds K* and τ* to the nearest integers, which can break (21d)
    and leave τ not dividing K (dp-pasgd.md §7 item 10). With ``repair=True`` (default):

    1. τ = the nearest integer to τ*, at least 1 and at most the largest τ meeting (21e);
    2. K = the largest multiple of τ with c1·K/τ + c2·K <= C_th, i.e. τ·⌊C_th/(c1 + c2·τ)⌋. This
       keeps (21d) tight, as τ* of (22) does, rather than snapping to the multiple of τ nearest K*
       (which, when τ rounded up, wastes budget and was worse against the brute-force scan). If no
       full round fits at that τ (only when τ rounded up), τ is lowered until one does. If (21d)
       was slack at the optimum (K* < C_th/(c1+c2), τ = 1, see :func:`steps_domain`), K = K*
       rounded to the nearest integer instead, still within the budget;
    3. σ_m is recomputed for that K from eq. (9) with ``variant`` (eq. 23 for ``paper_literal``).

    With ``repair=False`` both are rounded to the nearest integer as printed; the plan may then be
    infeasible (see :attr:`Plan.feasible`).

    Args:
        constants: the bound constants.
        cost_budget: C_th per device, in the unit of c1 and c2.
        epsilon: ε_th per device (at ``constants.delta``).
        c1: cost of one communication round per device (paper default 100).
        c2: cost of one local step per device (paper default 1).
        variant: σ calibration used in (24) and for the plan's σ.
        repair: apply the feasibility repair above.

    Raises:
        ValueError: if the budget cannot pay one round of one step (C_th < c1 + c2), or if a
            constant or budget is out of range.
    """
    variant = SigmaCalibration(variant)
    steps_real = solve_k(constants, cost_budget, epsilon, c1, c2, variant)
    # τ of the relaxation: (22), or its lower bound 1 when K* is below C_th/(c1+c2) (see steps_domain).
    tau_real = max(1.0, tau_star(steps_real, cost_budget, c1, c2))
    if repair:
        tau = min(max(1, _round_half_up(tau_real)), _lr_tau_cap_int(constants))
        rounds = _max_rounds(tau, cost_budget, c1, c2)
        while rounds == 0:  # terminates: C_th >= c1 + c2 guarantees one round at τ = 1
            tau -= 1
            rounds = _max_rounds(tau, cost_budget, c1, c2)
        if steps_real < cost_budget / (c1 + c2):
            # (21d) was slack at the optimum (τ held at 1): keep K* rather than spend the budget.
            rounds = min(rounds, max(1, _round_half_up(steps_real)))
        steps = rounds * tau
    else:
        tau = max(1, _round_half_up(tau_real))
        steps = max(1, _round_half_up(steps_real))
        rounds = steps // tau
    sigma = tuple(
        dp_pasgd_sigma(steps, constants.lipschitz, x, epsilon, constants.delta, variant) for x in constants.batch_sizes
    )
    spent = max(
        dp_pasgd_epsilon(steps, constants.lipschitz, x, s, constants.delta)
        for x, s in zip(constants.batch_sizes, sigma)
    )
    return Plan(
        tau=tau,
        steps=steps,
        sigma=sigma,
        epsilon_target=float(epsilon),
        epsilon_spent=spent,
        cost=resource_cost(steps, tau, c1, c2),
        cost_budget=float(cost_budget),
        rounds=rounds,
        steps_real=steps_real,
        tau_real=tau_real,
        bound=bound_F(constants, tau, steps, sigma),
        variant=variant,
    )


def brute_force(
    constants: BoundConstants,
    cost_budget: float,
    epsilon: float,
    c1: float = 100.0,
    c2: float = 1.0,
    variant: SigmaCalibration | str = SigmaCalibration.CORRECTED,
    taus: Sequence[int] = range(1, 21),
) -> BruteForceResult:
    """The bound-level grid search of §8 check 10: the best integer (τ, K) by F of (21a).

    Scans every τ in ``taus`` that meets (21e) and every K that is a multiple of τ with
    c1·K/τ + c2·K <= C_th (the paper's "K from 200" is empty at its budgets, dp-pasgd.md §5.4, so
    K starts at τ). σ_m is calibrated for each K from eq. (9) with ``variant``.

    Returns:
        The (τ, K, F) with the smallest F.

    Raises:
        ValueError: if no τ in ``taus`` admits a feasible K.
    """
    _check_budgets(cost_budget, c1, c2, epsilon)
    variant = SigmaCalibration(variant)
    best: BruteForceResult | None = None
    for tau in taus:
        if not _meets_lr_condition(constants, tau):
            continue
        for rounds in range(1, _max_rounds(tau, cost_budget, c1, c2) + 1):
            steps = rounds * tau
            per_batch = {
                x: dp_pasgd_sigma(steps, constants.lipschitz, x, epsilon, constants.delta, variant)
                for x in set(constants.batch_sizes)
            }
            value = bound_F(constants, tau, steps, [per_batch[x] for x in constants.batch_sizes])
            if best is None or value < best.bound:
                best = BruteForceResult(int(tau), steps, value)
    if best is None:
        raise ValueError(f"no feasible (tau, K) for C_th={cost_budget}, c1={c1}, c2={c2}, taus={list(taus)}")
    return best


def _noise_slope(constants: BoundConstants, epsilon: float, variant: SigmaCalibration | str) -> float:
    """ν with (d/M)·Σ_m σ_m*(K)² = ν·K, the last factor of (24) (printed, or with the erratum fix)."""
    c = constants
    z = z_constant(epsilon, c.delta)  # eq. (25)
    inverse_rho = 1.0 / z if SigmaCalibration(variant) is SigmaCalibration.PAPER_LITERAL else z / epsilon**2
    sum_inv_batch_sq = sum(1.0 / x**2 for x in c.batch_sizes)
    return 2.0 * noise_dimension(c) * c.lipschitz**2 * inverse_rho / c.num_devices * sum_inv_batch_sq


def _meets_lr_condition(constants: BoundConstants, tau: int) -> bool:
    """(21e) with float slack, so that a τ exactly on the boundary (e.g. ηL = 0.05, τ = 20) passes."""
    return lr_condition(constants, tau) <= 1 + _REL_TOL


def _lr_tau_cap_int(constants: BoundConstants) -> int:
    """The largest integer τ meeting (21e) (at least 1: BoundConstants cannot have ηL > 1 here)."""
    tau = max(1, math.floor(lr_tau_cap(constants)))
    while tau > 1 and not _meets_lr_condition(constants, tau):
        tau -= 1
    while _meets_lr_condition(constants, tau + 1):
        tau += 1
    return tau


def _max_rounds(tau: int, cost_budget: float, c1: float, c2: float) -> int:
    """The most whole rounds of τ steps with cost (8) within C_th: ⌊C_th/(c1 + c2·τ)⌋, float-safe."""
    rounds = math.floor(cost_budget / (c1 + c2 * tau))
    # The quotient can land a hair on either side of an integer; settle it with the cost itself.
    while rounds > 0 and resource_cost(rounds * tau, tau, c1, c2) > cost_budget * (1 + _REL_TOL):
        rounds -= 1
    while resource_cost((rounds + 1) * tau, tau, c1, c2) <= cost_budget * (1 + _REL_TOL):
        rounds += 1
    return rounds


def _check_budgets(cost_budget: float, c1: float, c2: float, epsilon: float | None = None) -> None:
    if not (c1 > 0 and c2 > 0):
        raise ValueError(f"costs must be positive: c1={c1}, c2={c2}")
    if not cost_budget >= c1 + c2:
        raise ValueError(
            f"cost budget C_th={cost_budget} is below c1 + c2 = {c1 + c2}, the cost of one round of "
            "one step: no feasible plan"
        )
    if epsilon is not None and not epsilon > 0:
        raise ValueError(f"privacy budget epsilon must be positive, got {epsilon}")


def _per_device(sigmas: float | Sequence[float], num_devices: int) -> np.ndarray:
    sigma = np.asarray(sigmas, dtype=float)
    if sigma.ndim == 0:
        return np.full(num_devices, float(sigma))
    if sigma.shape != (num_devices,):
        raise ValueError(f"sigmas must be one value or one per device ({num_devices}), got shape {sigma.shape}")
    return sigma


def _round_half_up(x: float) -> int:
    """Nearest integer, halves up (Python's round() goes to even)."""
    return math.floor(x + 0.5)


def _is_positive_int(value: object) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value > 0


def _require(ok: bool, field: str, problem: str, value: object) -> None:
    if not ok:
        raise ValueError(f"BoundConstants.{field} {problem}, got {value!r}")
