"""Optimal design of DP-PASGD (testbed.planning.dp_pasgd) against the checks of dp-pasgd.md §8."""

from __future__ import annotations

import math

import dataclasses

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from testbed.planning.cost import max_steps, resource_cost
from testbed.planning.dp_pasgd import (
    BoundConstants,
    bound_B,
    bound_F,
    brute_force,
    k_objective,
    lr_condition,
    lr_tau_cap,
    noise_dimension,
    plan,
    solve_k,
    steps_domain,
    tau_star,
)
from testbed.privacy.zcdp import dp_pasgd_epsilon, dp_pasgd_sigma

C1, C2 = 100.0, 1.0
BUDGETS = (500.0, 1000.0, 2000.0, 5000.0)
EPSILONS = (1.0, 2.0, 4.0, 10.0)
VARIANTS = ("corrected", "paper_literal")

# Interior constants (= the documented defaults): η=0.015, L=1, λ=0.025, ξ²=3, α=5, d=10, M=16,
# G=1, X=128, δ=1e-4. Found by a random search over (η, λ, ξ², α, d, X) for sets whose τ* of (22)
# is > 1 on every budget of check 10 under both calibrations (τ* in 1.18..8.5).
INTERIOR = BoundConstants(
    learning_rate=0.015,
    smoothness=1.0,
    strong_convexity=0.025,
    grad_variance=3.0,
    initial_gap=5.0,
    dimension=10,
    num_devices=16,
    lipschitz=1.0,
    batch_sizes=128,
    delta=1e-4,
)
# The constants of check 6 (σ_m is passed separately).
CHECK6 = BoundConstants(
    learning_rate=0.1,
    smoothness=1.0,
    strong_convexity=0.1,
    grad_variance=1.0,
    initial_gap=0.7,
    dimension=10,
    num_devices=16,
    lipschitz=1.0,
    batch_sizes=32,
)
# The constants the extraction tried (§4.4 observation): the optimum sits at τ* = 1.
BOUNDARY = BoundConstants(
    learning_rate=0.05,
    smoothness=1.0,
    strong_convexity=0.01,
    grad_variance=1.0,
    initial_gap=0.69,
    dimension=100,
    num_devices=16,
    lipschitz=1.0,
    batch_sizes=32,
)


def _calibrated_bound(constants: BoundConstants, tau: float, steps: float, epsilon: float, variant: str) -> float:
    sigmas = [
        dp_pasgd_sigma(steps, constants.lipschitz, x, epsilon, constants.delta, variant) for x in constants.batch_sizes
    ]
    return bound_F(constants, tau, steps, sigmas)


# --- check 4: cost model (8) -------------------------------------------------------------------


def test_check4_cost_model():
    assert resource_cost(90, 10, C1, C2) == pytest.approx(990.0, abs=1e-6)
    assert resource_cost(100, 10, C1, C2) == pytest.approx(1100.0, abs=1e-6)
    assert max_steps(10, 1000.0, C1, C2) == pytest.approx(90.909090909, abs=1e-6)
    assert max_steps(20, 1000.0, C1, C2) == pytest.approx(166.666666667, abs=1e-6)
    # DP-SGD (τ = 1) at C_th = 1000: at most K = 9.
    assert math.floor(max_steps(1, 1000.0, C1, C2)) == 9
    dp_sgd = brute_force(INTERIOR, 1000.0, 10.0, C1, C2, taus=[1])
    assert dp_sgd.tau == 1 and dp_sgd.steps <= 9


# --- check 5: τ* of (22) ---------------------------------------------------------------------------


def test_check5_tau_star():
    assert tau_star(1000.0 / 11.0, 1000.0, C1, C2) == pytest.approx(10.0, abs=1e-6)
    assert tau_star(500.0, 1000.0, C1, C2) == pytest.approx(100.0, abs=1e-6)
    k_lo = 1000.0 / (C1 + C2)
    assert k_lo == pytest.approx(9.900990099, abs=1e-6)
    assert tau_star(k_lo, 1000.0, C1, C2) == pytest.approx(1.0, abs=1e-12)
    assert tau_star(9.90, 1000.0, C1, C2) < 1.0 < tau_star(9.91, 1000.0, C1, C2)
    np.testing.assert_allclose(tau_star(np.array([1000.0 / 11.0, 500.0]), 1000.0, C1, C2), [10.0, 100.0])
    with pytest.raises(ValueError, match="C_th/c2"):
        tau_star(1000.0, 1000.0, C1, C2)


# --- check 6: the bound (12)/(13) --------------------------------------------------------------


def test_check6_bound_values():
    assert bound_B(CHECK6, 5, 0.5) == pytest.approx(0.809375, abs=1e-6)
    assert bound_B(CHECK6, 5, [0.5] * 16) == pytest.approx(0.809375, abs=1e-6)
    assert lr_condition(CHECK6, 5) == pytest.approx(0.3, abs=1e-12)
    assert bound_F(CHECK6, 5, 100, 0.5) == pytest.approx(0.808975, abs=1e-6)


def test_check6_bound_increases_with_tau_and_noise():
    tau, steps, var, h = 5.0, 100, 0.25, 1e-6
    decay_factor = 1 - 0.99**steps / steps
    d_tau = (bound_F(CHECK6, tau + h, steps, 0.5) - bound_F(CHECK6, tau - h, steps, 0.5)) / (2 * h)
    # ∂F/∂τ of §4.4 Step 1: (1 − (1−ηλ)^K/K)·η²L²/(2λ)·(ξ² + dσ̄²).
    assert d_tau > 0
    assert d_tau == pytest.approx(decay_factor * 0.01 / 0.2 * (1 + 10 * var), rel=1e-6)
    # ∂F/∂σ_m² for one device, the corrected form of §4.4 Step 2:
    # (1 − (1−ηλ)^K/K)·(ηL + η²L²(τ−1)M)·d/(2λM²).
    sig = np.full(16, 0.5)
    up, down = sig.copy(), sig.copy()
    up[0], down[0] = math.sqrt(var + h), math.sqrt(var - h)
    d_var = (bound_F(CHECK6, tau, steps, up) - bound_F(CHECK6, tau, steps, down)) / (2 * h)
    assert d_var > 0
    assert d_var == pytest.approx(decay_factor * (0.1 + 0.01 * 4 * 16) * 10 / (2 * 0.1 * 16**2), rel=1e-6)


# --- (24) is F at τ*(K), σ*(K) --------------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("cost_budget", [500.0, 1000.0, 5000.0])
def test_k_objective_is_bound_at_tau_star_and_sigma_star(variant, cost_budget):
    mixed = BoundConstants(batch_sizes=(16, 32, 64, 128) * 4)
    for constants in (INTERIOR, mixed):
        k_lo = cost_budget / (C1 + C2)
        for k in (k_lo, 1.3 * k_lo, 2.0 * k_lo, 0.45 * cost_budget):
            expected = _calibrated_bound(constants, tau_star(k, cost_budget, C1, C2), k, 3.0, variant)
            assert k_objective(k, constants, cost_budget, 3.0, C1, C2, variant) == pytest.approx(expected, rel=1e-10)
        # Below the printed domain, τ is held at 1 (the cost constraint is slack).
        k = 0.5 * k_lo
        expected = _calibrated_bound(constants, 1.0, k, 3.0, variant)
        assert k_objective(k, constants, cost_budget, 3.0, C1, C2, variant) == pytest.approx(expected, rel=1e-10)


def test_k_objective_vectorised():
    ks = np.linspace(5.0, 400.0, 7)
    values = k_objective(ks, INTERIOR, 1000.0, 2.0, C1, C2, "corrected")
    assert values.shape == ks.shape
    for k, v in zip(ks, values):
        assert v == pytest.approx(k_objective(float(k), INTERIOR, 1000.0, 2.0, C1, C2, "corrected"), rel=1e-14)


# --- the 1-D solver ---------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
def test_solve_k_is_the_minimum_of_24_on_its_domain(variant):
    for cost_budget in BUDGETS:
        low, high = steps_domain(INTERIOR, cost_budget, C1, C2)
        assert low == 1.0
        # The lr condition (21e) caps τ*, hence K.
        assert tau_star(high, cost_budget, C1, C2) == pytest.approx(lr_tau_cap(INTERIOR), rel=1e-9)
        assert lr_condition(INTERIOR, lr_tau_cap(INTERIOR)) == pytest.approx(1.0, abs=1e-12)
        for epsilon in EPSILONS:
            k_star = solve_k(INTERIOR, cost_budget, epsilon, C1, C2, variant)
            assert low <= k_star <= high
            dense = k_objective(np.linspace(low, high, 200_001), INTERIOR, cost_budget, epsilon, C1, C2, variant)
            best = k_objective(k_star, INTERIOR, cost_budget, epsilon, C1, C2, variant)
            assert best <= dense.min() + 1e-12


def test_boundary_optimum_at_tau_one():
    # The extraction's constants: the minimum of (24) over the printed domain is its lower end.
    k_star = solve_k(BOUNDARY, 1000.0, 1.0, C1, C2, "paper_literal")
    assert k_star == 1000.0 / (C1 + C2)
    p = plan(BOUNDARY, 1000.0, 1.0, variant="paper_literal")
    assert (p.tau, p.steps, p.tau_real) == (1, 9, 1.0)
    # With the corrected σ*, noise grows so fast with K that the optimum leaves (21d) slack at τ = 1.
    p = plan(BOUNDARY, 1000.0, 10.0, variant="corrected")
    assert p.tau == 1 and p.steps_real < 1000.0 / (C1 + C2) and p.tau_real == 1.0
    assert p.steps == round(p.steps_real) and p.cost < 1000.0
    bf = brute_force(BOUNDARY, 1000.0, 10.0, C1, C2, "corrected")
    assert (bf.tau, bf.steps) == (p.tau, p.steps)


# --- check 10: planned design vs brute-force scan ----------------------------------------------------

# Worst relative gap of F achieved with INTERIOR: 1.44 % (corrected), 0.09 % (paper_literal).
F_GAP = {"corrected": 0.015, "paper_literal": 0.002}


@pytest.mark.parametrize("variant", VARIANTS)
def test_check10_plan_matches_brute_force(variant):
    for cost_budget in BUDGETS:
        for epsilon in EPSILONS:
            p = plan(INTERIOR, cost_budget, epsilon, C1, C2, variant)
            bf = brute_force(INTERIOR, cost_budget, epsilon, C1, C2, variant)
            assert p.tau_real > 1.0  # interior optimum, the point of these constants
            assert abs(p.tau - bf.tau) <= 1, (cost_budget, epsilon, p, bf)
            # The plan is one of the scanned designs, so the scan can only be better.
            assert bf.bound <= p.bound + 1e-15
            assert (p.bound - bf.bound) / bf.bound <= F_GAP[variant], (cost_budget, epsilon)
            assert p.bound == pytest.approx(_calibrated_bound(INTERIOR, p.tau, p.steps, epsilon, variant), rel=1e-12)


def test_trend_tau_star_with_budgets():
    # Not a theorem (§8 check 10); holds for INTERIOR on this grid, strictly for `corrected`.
    for variant in VARIANTS:
        taus = {
            (c, e): plan(INTERIOR, c, e, C1, C2, variant).tau_real for c in BUDGETS for e in EPSILONS
        }
        strict = variant == "corrected"
        for c in BUDGETS:
            row = [taus[c, e] for e in EPSILONS]
            assert all((b > a) if strict else (b >= a - 1e-9) for a, b in zip(row, row[1:])), (variant, c, row)
        for e in EPSILONS:
            col = [taus[c, e] for c in BUDGETS]
            assert all(b < a for a, b in zip(col, col[1:])), (variant, e, col)


# --- feasibility of the repaired rounding; privacy of the plan ---------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
def test_repaired_plan_is_always_feasible(variant):
    for constants in (INTERIOR, BOUNDARY, BoundConstants(learning_rate=0.05, initial_gap=50.0)):
        cap = math.floor(lr_tau_cap(constants) + 1e-9)
        for cost_budget in (101.0, 150.0, 200.0, 333.0, 500.0, 777.7, 1000.0, 2000.0, 5000.0, 12345.0):
            for epsilon in (0.5, 1.0, 4.0, 10.0):
                p = plan(constants, cost_budget, epsilon, C1, C2, variant)
                assert p.feasible
                assert p.cost <= cost_budget
                assert p.steps % p.tau == 0 and p.rounds == p.steps // p.tau >= 1
                assert 1 <= p.tau <= cap
                assert lr_condition(constants, p.tau) <= 1 + 1e-12
                assert p.cost == pytest.approx(resource_cost(p.steps, p.tau, C1, C2))


def test_nearest_rounding_without_repair_can_break_the_budget():
    # The paper's heuristic as printed (dp-pasgd.md §7 item 10).
    p = plan(INTERIOR, 500.0, 2.0, repair=False)
    assert (p.tau, p.steps) == (round(p.tau_real), round(p.steps_real)) == (7, 35)
    assert p.cost == pytest.approx(535.0) and not p.feasible
    assert plan(INTERIOR, 500.0, 2.0).feasible


def test_plan_privacy_spent():
    for cost_budget in BUDGETS:
        for epsilon in EPSILONS:
            corrected = plan(INTERIOR, cost_budget, epsilon, variant="corrected")
            assert corrected.epsilon_spent <= epsilon + 1e-9
            assert corrected.epsilon_spent == pytest.approx(epsilon, rel=1e-9)
            assert corrected.meets_privacy_target
            literal = plan(INTERIOR, cost_budget, epsilon, variant="paper_literal")
            # Eq. (23) as printed overspends by roughly 10–77× (dp-pasgd.md §2.3): flagged.
            assert literal.epsilon_spent > 9 * epsilon
            assert not literal.meets_privacy_target
    # §2.3's worked number: K = 100, X = 32, ε_th = 1 → the literal σ spends 76.63.
    sigma = dp_pasgd_sigma(100, 1.0, 32, 1.0, 1e-4, "paper_literal")
    assert dp_pasgd_epsilon(100, 1.0, 32, sigma, 1e-4) == pytest.approx(76.63, abs=5e-3)


def test_plan_per_device_sigma():
    constants = BoundConstants(batch_sizes=(16, 32, 64, 128) * 4)
    p = plan(constants, 1000.0, 2.0)
    assert len(p.sigma) == 16
    for x, s in zip(constants.batch_sizes, p.sigma):
        assert s == pytest.approx(dp_pasgd_sigma(p.steps, 1.0, x, 2.0, 1e-4))
        assert dp_pasgd_epsilon(p.steps, 1.0, x, s, 1e-4) == pytest.approx(2.0, rel=1e-9)
    assert p.sigma[0] > p.sigma[1] > p.sigma[2] > p.sigma[3]  # smaller batch, larger sensitivity 2G/X


# --- validation --------------------------------------------------------------------------------------


def test_infeasible_budget_raises():
    with pytest.raises(ValueError, match="below c1 \\+ c2"):
        plan(INTERIOR, 100.0, 1.0)
    with pytest.raises(ValueError, match="below c1 \\+ c2"):
        brute_force(INTERIOR, 50.0, 1.0)
    with pytest.raises(ValueError, match="epsilon"):
        plan(INTERIOR, 1000.0, 0.0)


@pytest.mark.parametrize(
    "field, value",
    [
        ("learning_rate", 0.0),
        ("smoothness", -1.0),
        ("strong_convexity", 0.0),
        ("lipschitz", 0.0),
        ("grad_variance", -0.1),
        ("initial_gap", -1.0),
        ("dimension", 0),
        ("num_devices", 2.5),
        ("delta", 1.0),
        ("batch_sizes", 0),
        ("batch_sizes", (32, 32)),
        ("strong_convexity", 2.0),
        ("noise_dimension", 0.0),
        ("noise_dimension", 11.0),
    ],
)
def test_bound_constants_validation_names_the_field(field, value):
    with pytest.raises(ValueError, match=f"BoundConstants.{field}"):
        BoundConstants(**{field: value})


def test_bound_constants_broadcast_and_contraction():
    assert BoundConstants(num_devices=3, batch_sizes=8).batch_sizes == (8, 8, 8)
    assert BoundConstants(num_devices=2, batch_sizes=[8, 16]).batch_sizes == (8, 16)
    with pytest.raises(ValueError, match="1 − ηλ"):
        BoundConstants(learning_rate=1.0, strong_convexity=1.0)
    with pytest.raises(ValueError, match="21e"):
        lr_tau_cap(BoundConstants(learning_rate=2.0, strong_convexity=0.1))


@given(d_eff=st.floats(0.01, 10.0), sigma=st.floats(0.0, 5.0), tau=st.integers(1, 20))
def test_noise_dimension_scales_only_the_noise_term(d_eff, sigma, tau):
    """d_eff replaces d in the noise term of B (13) alone: B is affine in it with slope the noise
    term's per-dimension share, B at d_eff = d is the paper's B, and a smaller d_eff never raises B."""
    lowered = dataclasses.replace(CHECK6, noise_dimension=d_eff)
    assert noise_dimension(CHECK6) == CHECK6.dimension and noise_dimension(lowered) == d_eff
    paper = bound_B(CHECK6, tau, sigma)
    assert bound_B(dataclasses.replace(CHECK6, noise_dimension=float(CHECK6.dimension)), tau, sigma) == pytest.approx(paper)
    no_noise = bound_B(CHECK6, tau, 0.0)
    per_dimension = (paper - no_noise) / CHECK6.dimension
    assert bound_B(lowered, tau, sigma) == pytest.approx(no_noise + d_eff * per_dimension, rel=1e-9, abs=1e-12)
    assert bound_B(lowered, tau, sigma) <= paper * (1 + 1e-12)


def test_smaller_noise_dimension_plans_longer_runs():
    """The noise slope of (24) is proportional to d: with d_eff < d the planned K and τ can only grow
    (BOUNDARY's optimum sits at τ = 1 with the paper's d = 100)."""
    paper = plan(BOUNDARY, 1000.0, 4.0)
    lowered = plan(dataclasses.replace(BOUNDARY, noise_dimension=2.0), 1000.0, 4.0)
    assert (lowered.steps, lowered.tau) >= (paper.steps, paper.tau) and lowered.steps > paper.steps
    assert lowered.feasible and lowered.meets_privacy_target
