"""testbed.privacy.dwfl: Theorem IV.1 / eq. (11), calibration, Remark IV.1, composition (dwfl.md §8)."""

import math

import dp_accounting
import numpy as np
import pytest

from channel.ota import d2d_superpose
from channel.power_control import align_power, transmit_real
from testbed.privacy.dwfl import (
    alignment_constant,
    calibrate_sigma2,
    composed_epsilon,
    dwfl_composed_epsilon,
    epsilon_per_receiver,
    gaussian_factor,
    noise_multipliers,
    orthogonal_epsilon,
    receiver_noise_variance,
    remark_iv1_bound,
    round_dp_event,
    RoundSetting,
    sensitivity,
    sigma_z2,
)

# dwfl.md §4.5: N = 10, |h| = [1, 2 x 9], P = 1, σ² = σ_m² = 1, γ = 0.1, g_max = 1, δ = 1e-5, β = 1 − α.
H = np.array([1.0] + [2.0] * 9)
P = 1.0
BETA = 1.0 - 1.0 / H**2
EX = dict(noise_power_w=1.0, gamma=0.1, g_max=1.0, delta=1e-5)
S = RoundSetting(H, P, BETA, **EX)


def test_worked_example_constants():
    assert gaussian_factor(1e-5) == pytest.approx(4.844805, abs=1e-6)
    assert alignment_constant(H, P) == 1.0
    np.testing.assert_allclose(receiver_noise_variance(H, P, BETA, 1.0, 1.0), [28.0] + [25.0] * 9)


def test_check_6_epsilon_formula():
    eps = epsilon_per_receiver(S, sigma2=1.0)
    assert eps[0] == pytest.approx(0.183116, abs=1e-6)
    np.testing.assert_allclose(eps[1:], 0.193792, atol=1e-6)
    orth = orthogonal_epsilon(S, sigma2=1.0)
    np.testing.assert_allclose(orth, 0.968961, atol=1e-6)
    assert sigma_z2(S, 1.0) == pytest.approx(3.012346, abs=1e-6)
    # The consistent orthogonal numerator (α_j |h_j|² P_j = c²) gives 0.2·4.8448/2 for j >= 2.
    al = align_power(H, P)
    cons = orthogonal_epsilon(S, 1.0, numerator="consistent", alpha=al.alpha)
    assert cons[1] == pytest.approx(0.2 * gaussian_factor(1e-5) / 2.0, rel=1e-12)
    assert cons[0] == pytest.approx(orth[0])  # weakest sender: α = 1, same as the paper


def test_check_7_calibration_round_trip():
    per_rx = []
    for i in range(2):  # receiver 1 and a receiver i >= 2 on their own
        s_i = (3.0 * 9) if i == 0 else (3.0 * 8)
        per_rx.append(((0.2 * gaussian_factor(1e-5) / 0.5) ** 2 - 1.0) / s_i)
    assert per_rx[0] == pytest.approx(0.102057, abs=1e-6)
    assert per_rx[1] == pytest.approx(0.114814, abs=1e-6)
    s2 = calibrate_sigma2(0.5, S)
    assert s2 == pytest.approx(0.114814, abs=1e-6)
    eps = epsilon_per_receiver(S, s2)
    assert eps.max() == pytest.approx(0.5, rel=1e-12)
    for target in (0.1, 0.25, 0.9):  # at 1.0 channel noise alone suffices (σ² = 0)
        s2 = calibrate_sigma2(target, S)
        assert epsilon_per_receiver(S, s2).max() == pytest.approx(target, rel=1e-12)


def test_calibration_options():
    # Channel noise ignored (dwfl.md §4.4 option (i)): σ² larger, ε below target.
    s_all = calibrate_sigma2(0.5, S)
    s_art = calibrate_sigma2(0.5, S, count_channel_noise=False)
    assert s_art == pytest.approx((0.2 * gaussian_factor(1e-5) / 0.5) ** 2 / 24.0)
    assert s_art > s_all
    # Channel noise alone is enough: σ² = 0.
    assert calibrate_sigma2(1.0, RoundSetting(H, P, BETA, **{**EX, "noise_power_w": 100.0})) == 0.0
    # Equal channels: β = 0 everywhere, no artificial noise possible → inf.
    assert calibrate_sigma2(0.5, RoundSetting(np.ones(5), P, np.zeros(5), **EX)) == math.inf


def test_check_8_n_scaling():
    def eps_rx1(n, noise_w):
        h = np.array([1.0] + [2.0] * (n - 1))
        return epsilon_per_receiver(RoundSetting(h, P, 1 - 1 / h**2, **{**EX, "noise_power_w": noise_w}), 1.0)[0]

    assert eps_rx1(10, 0.0) / eps_rx1(30, 0.0) == pytest.approx(math.sqrt(29 / 9), rel=1e-12)
    assert eps_rx1(10, 0.0) / eps_rx1(30, 0.0) == pytest.approx(1.7951, abs=1e-4)
    orth = [orthogonal_epsilon(RoundSetting(np.array([1.0] + [2.0] * (n - 1)), P, 0.75, **EX), 1.0)[1] for n in (10, 30)]
    assert orth[0] == pytest.approx(orth[1], rel=1e-15)


def test_check_9_sensitivity_with_clipping():
    gamma, g_max, n, d = 0.1, 1.0, 6, 40
    rng = np.random.default_rng(0)

    def clip(g):
        return g * min(1.0, g_max / np.linalg.norm(g))

    h = np.abs(rng.standard_normal(n)) + 0.3
    al = align_power(h, 2.0)
    assert sensitivity(gamma, g_max, al.c) == pytest.approx(2 * al.c * gamma * g_max)
    x_half = rng.standard_normal((n, d))
    worst = 0.0
    for _ in range(200):
        g = np.stack([clip(5 * rng.standard_normal(d)) for _ in range(n)])
        g_alt = g.copy()
        g_alt[2] = clip(5 * rng.standard_normal(d))  # replace worker 2's data set
        outs = []
        for grads in (g, g_alt):
            x = x_half - gamma * grads
            outs.append(d2d_superpose(transmit_real(x, None, al), al.effective_gain(), 0.0, None))
        for i in range(n):
            if i != 2:
                worst = max(worst, np.linalg.norm(outs[0][i] - outs[1][i]))
    assert worst <= sensitivity(gamma, g_max, al.c) * (1 + 1e-12)
    assert worst > 0.5 * sensitivity(gamma, g_max, al.c)


def test_remark_iv1_bound_erratum():
    rng = np.random.default_rng(1)
    for _ in range(50):
        n = int(rng.integers(3, 30))
        h = rng.uniform(0.2, 3.0, n)
        beta = 1 - (np.min(h) / h) ** 2
        s2, m = rng.uniform(0, 2), rng.uniform(0, 5)
        setting = RoundSetting(h, P, beta, m, 0.1, 1.0, 1e-5)
        eps = epsilon_per_receiver(setting, s2)
        bound = remark_iv1_bound(setting, s2, erratum="corrected")
        assert np.all(eps <= bound * (1 + 1e-12))
    # As printed (σ_m² not divided by N−1) the bound fails when channel noise dominates.
    eps = epsilon_per_receiver(S, 0.0)
    paper = remark_iv1_bound(S, 0.0, erratum="paper")
    assert np.all(paper < eps)
    with pytest.raises(ValueError):
        remark_iv1_bound(S, 0.0, erratum="other")


def test_noise_multiplier_matches_eq11():
    z = noise_multipliers(S, 1.0)
    eps = epsilon_per_receiver(S, 1.0)
    np.testing.assert_allclose(eps, gaussian_factor(1e-5) / z, rtol=1e-12)
    assert round_dp_event(z[0]) == dp_accounting.GaussianDpEvent(z[0])


def test_composition_with_dp_accounting():
    z, delta = 3.0, 1e-5
    exact = dp_accounting.get_epsilon_gaussian(z, delta)
    assert composed_epsilon(z, delta, rounds=1, accountant="pld") == pytest.approx(exact, rel=2e-3)
    # T Gaussian rounds of multiplier z compose to one Gaussian of multiplier z / sqrt(T).
    t = 100
    exact_t = dp_accounting.get_epsilon_gaussian(z / math.sqrt(t), delta)
    pld_t = composed_epsilon(z, delta, rounds=t, accountant="pld")
    rdp_t = composed_epsilon(z, delta, rounds=t, accountant="rdp")
    assert pld_t == pytest.approx(exact_t, rel=5e-3)
    assert rdp_t >= pld_t * (1 - 1e-3)
    assert composed_epsilon([z] * 5, delta, accountant="rdp") == pytest.approx(
        composed_epsilon(z, delta, rounds=5, accountant="rdp"), rel=1e-9
    )
    assert composed_epsilon(z, delta, rounds=0) == 0.0
    assert composed_epsilon(0.0, delta, rounds=3) == math.inf
    eps_rounds = [composed_epsilon(z, delta, rounds=r) for r in (1, 10, 100)]
    assert eps_rounds == sorted(eps_rounds)


def test_dwfl_composition_worst_receiver():
    one = dwfl_composed_epsilon(S, 1.0, rounds=1, accountant="pld")
    # Tight single-round ε is below the classic eq. (11) value 0.193792 of the worst receiver.
    assert one < 0.193792
    z_worst = noise_multipliers(S, 1.0).min()
    assert one == pytest.approx(dp_accounting.get_epsilon_gaussian(z_worst, 1e-5), rel=2e-3)
    many = dwfl_composed_epsilon(S, 1.0, rounds=50)
    assert many > one


# ---- per receiver on a graph (issue 32) ----------------------------------------------------------
# The ring 0-1-2-3-4-0 with |h| = [1, 2, 2, 2, 2], P = 1, β = 1 − α = [0, 3/4, 3/4, 3/4, 3/4] (eq. 3-4:
# c = 1, α_k = 1/|h_k|²), σ² = σ_m² = 1, γ = 0.1, g_max = 1, δ = 1e-5, worked by hand:
# B_k = |h_k|² β_k P_k = [0, 3, 3, 3, 3]; receiver i hears i − 1 and i + 1, so
# S = [B_4 + B_1, B_0 + B_2, B_1 + B_3, B_2 + B_4, B_3 + B_0] = [6, 3, 6, 6, 3] and eq. (10)
# σ_s,i² = S_i σ² + σ_m² = [7, 4, 7, 7, 4]; eq. (11) ε_i = 2 c γ g_max sqrt(2 ln(1.25/δ)) / σ_s,i
# = 0.968961 / sqrt(7) = 0.366233 (degree-2 receivers beside node 0, which sends no noise: 0.484481).
# A sender is charged at the worse of its two receivers: sender 0 → receivers 1, 4 (4, 4): 0.484481;
# sender 1 → 0, 2 (7, 7): 0.366233; sender 2 → 1, 3: 0.484481; 3 → 2, 4: 0.484481; 4 → 3, 0: 0.366233.
# For a target ε = 0.5: σ² = max_i ((0.968961/0.5)² − 1) / S_i = (3.755542 − 1)/3 = 0.918514.
RING_EPS_RECEIVER = [0.366233, 0.484481, 0.366233, 0.366233, 0.484481]
RING_EPS_SENDER = [0.484481, 0.366233, 0.484481, 0.484481, 0.366233]


def _ring_setting():
    from testbed.topology import Topology, TopologySection

    h = np.array([1.0, 2.0, 2.0, 2.0, 2.0])
    ring = Topology(TopologySection(kind="ring"), 5, seed=0).graph(0)
    return RoundSetting(h, 1.0, 1.0 - 1.0 / h**2, graph=ring, **EX)


def test_ring_epsilon_per_receiver_and_sender_by_hand():
    from testbed.privacy.dwfl import epsilon_per_sender

    s = _ring_setting()
    np.testing.assert_allclose(receiver_noise_variance(s.h_abs, 1.0, s.beta, 1.0, 1.0, s.graph), [7, 4, 7, 7, 4])
    np.testing.assert_allclose(epsilon_per_receiver(s, 1.0), RING_EPS_RECEIVER, atol=1e-6)
    np.testing.assert_allclose(epsilon_per_sender(s, 1.0), RING_EPS_SENDER, atol=1e-6)
    assert calibrate_sigma2(0.5, s) == pytest.approx(0.918514, abs=1e-6)


def test_cli_privacy_on_a_ring(capsys):
    from testbed.cli import main

    args = ["privacy", "dwfl", "--gains", "1,2,2,2,2", "--power-w", "1", "--noise-var", "1", "--lr", "0.1",
            "--gmax", "1", "--delta", "1e-5", "--topology", "ring", "--json"]
    assert main(args + ["--sigma2", "1"]) == 0
    import json

    out = json.loads(capsys.readouterr().out)
    np.testing.assert_allclose(out["epsilon"], RING_EPS_RECEIVER, atol=1e-6)
    np.testing.assert_allclose(out["epsilon_sender"], RING_EPS_SENDER, atol=1e-6)
    assert out["degree"] == [2] * 5
    assert main(args + ["--epsilon", "0.5"]) == 0
    assert json.loads(capsys.readouterr().out)["sigma2"] == pytest.approx(0.918514, abs=1e-6)


def test_cli_privacy_takes_the_experiments_topology(tmp_path, capsys):
    """--experiment reads [topology] (here an edge list beside the file: 0-1, 1-2, 3-4; node 3 and 4
    hear only each other, node 0 hears only node 1)."""
    from testbed.cli import main

    (tmp_path / "edges.txt").write_text("0 1\n1 2\n3 4\n")
    (tmp_path / "e.toml").write_text('[run]\nalgorithm = "dwfl"\n[data]\nnum_nodes = 5\n[topology]\nkind = "file"\n'
                                     'path = "edges.txt"\nallow_disconnected = true\n')
    assert main(["privacy", "dwfl", "--gains", "1,2,2,2,2", "--power-w", "1", "--noise-var", "1", "--lr", "0.1",
                 "--gmax", "1", "--delta", "1e-5", "--sigma2", "1", "--experiment", str(tmp_path / "e.toml"),
                 "--json"]) == 0
    import json

    out = json.loads(capsys.readouterr().out)
    # σ_s,i² = S_i + 1 with S = [B_1, B_0 + B_2, B_1, B_4, B_3] = [3, 3, 3, 3, 3]: all 0.968961 / 2
    np.testing.assert_allclose(out["epsilon"], [0.484481] * 5, atol=1e-6)
    assert out["degree"] == [1, 2, 1, 1, 1]
