"""channel.power_control: DWFL alignment (eqs. 2–4, dwfl.md §8 check 1), truncation, imperfect CSI."""

import numpy as np
import pytest

from channel.power_control import align_power, estimate_csi, to_complex_baseband, transmit_real


def random_channel(n, seed):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(n) + 1j * rng.standard_normal(n)) / np.sqrt(2), rng.uniform(0.5, 2.0, n)


def test_alignment_check_1():
    # dwfl.md §8 check 1: |h_k| sqrt(α_k P_k) == c == min_j |h_j| sqrt(P_j) (1e-12 rel), 0 < α <= 1,
    # α = 1 exactly for argmin, α + β <= 1, β >= 0.
    h, p = random_channel(50, 0)
    al = align_power(h, p)
    c = np.min(np.abs(h) * np.sqrt(p))
    assert al.c == pytest.approx(c, rel=1e-15)
    np.testing.assert_allclose(np.abs(h) * np.sqrt(al.alpha * p), c, rtol=1e-12)
    np.testing.assert_allclose(al.received_model_amplitude(h), c, rtol=1e-12)
    assert np.all(al.alpha > 0) and np.all(al.alpha <= 1)
    assert al.alpha[np.argmin(np.abs(h) ** 2 * p)] == 1.0
    assert np.all(al.beta >= 0) and np.all(al.alpha + al.beta <= 1 + 1e-15)
    np.testing.assert_allclose(al.alpha + al.beta, 1.0)  # default β = 1 − α
    # Phase pre-compensation makes the effective gain real and equal to |h|.
    np.testing.assert_allclose(al.effective_gain(h), np.abs(h), rtol=1e-12)
    np.testing.assert_allclose(al.effective_gain(), np.abs(h), rtol=1e-12)
    sym = to_complex_baseband(np.ones((50, 1)), al)[:, 0]
    np.testing.assert_allclose((h * sym).imag, 0.0, atol=1e-12)


def test_worked_example_coefficients():
    # dwfl.md §4.5: |h| = [1, 2 x 9], P = 1 → c = 1, α = [1, 0.25 x 9], β = [0, 0.75 x 9], a_k² = 3.
    h = np.array([1.0] + [2.0] * 9)
    al = align_power(h, 1.0)
    assert al.c == 1.0
    np.testing.assert_allclose(al.alpha, [1.0] + [0.25] * 9)
    np.testing.assert_allclose(al.beta, [0.0] + [0.75] * 9)
    np.testing.assert_allclose(al.noise_scale() ** 2, [0.0] + [3.0] * 9)


def test_beta_options_and_c_scale():
    h = np.array([1.0, 2.0, 4.0])
    half = align_power(h, 1.0, beta=0.5)
    np.testing.assert_allclose(half.beta, 0.5 * (1 - half.alpha))
    explicit = align_power(h, 1.0, beta=[0.0, 0.1, 0.2])
    np.testing.assert_allclose(explicit.beta, [0.0, 0.1, 0.2])
    with pytest.raises(ValueError):
        align_power(h, 1.0, beta=[0.5, 0.1, 0.2])  # weakest sender has no power left
    scaled = align_power(h, 1.0, c_scale=0.5)
    assert scaled.c == 0.5 and scaled.beta[0] == pytest.approx(0.75)  # weakest sender gets noise power
    with pytest.raises(ValueError):
        align_power(h, 1.0, c=1.5)


def test_truncated_inversion_silences_weak_nodes():
    h = np.array([0.05, 0.3, 1.0, 2.0j, 0.2])
    al = align_power(h, 1.0, gain_threshold=0.08)  # |h|² >= 0.08 → nodes 1, 2, 3
    assert al.active.tolist() == [False, True, True, True, False]
    assert al.c == pytest.approx(0.3)  # min over the active senders only
    assert np.all(al.alpha[~al.active] == 0) and np.all(al.beta[~al.active] == 0)
    np.testing.assert_array_equal(al.effective_gain(h)[~al.active], 0.0)
    np.testing.assert_allclose(al.received_model_amplitude(h)[al.active], 0.3, rtol=1e-12)
    x = np.ones((5, 4))
    payload = transmit_real(x, np.ones((5, 4)), al)
    np.testing.assert_array_equal(payload[~al.active], 0.0)
    with pytest.raises(ValueError):
        align_power(h, 1.0, gain_threshold=10.0)


def test_imperfect_csi_error_variance():
    n = 200_000
    h = np.full(n, 0.7 - 0.2j)
    var_e = 0.05
    est = estimate_csi(h, var_e, np.random.default_rng(8))
    err = est - h
    assert np.mean(np.abs(err) ** 2) == pytest.approx(var_e, rel=0.02)
    assert np.var(err.real) == pytest.approx(var_e / 2, rel=0.03)
    assert np.var(err.imag) == pytest.approx(var_e / 2, rel=0.03)
    assert abs(np.mean(err)) < 5 * np.sqrt(var_e / n)
    np.testing.assert_array_equal(estimate_csi(h[:3], 0.0, np.random.default_rng(0)), h[:3])


def test_imperfect_csi_alignment_uses_estimate():
    h, p = random_channel(20, 4)
    est = estimate_csi(h, 0.01, np.random.default_rng(5))
    al = align_power(est, p)
    # Aligned on the estimate: |ĥ_k| sqrt(α_k P_k) = c; true effective gain Re(h e^{−j∠ĥ}) differs.
    np.testing.assert_allclose(np.abs(est) * al.signal_amplitude, al.c, rtol=1e-12)
    g_true = al.effective_gain(h)
    np.testing.assert_allclose(g_true, np.real(h * np.exp(-1j * np.angle(est))), rtol=1e-12)
    assert not np.allclose(g_true * al.signal_amplitude, al.c)


def test_transmit_real_in_place():
    h = np.array([1.0, 2.0, 3.0])
    al = align_power(h, 2.0)
    rng = np.random.default_rng(0)
    x, g = rng.standard_normal((3, 6)), rng.standard_normal((3, 6))
    ref = al.signal_amplitude[:, None] * x + al.noise_amplitude[:, None] * g
    np.testing.assert_allclose(transmit_real(x, g, al), ref)
    g2 = g.copy()
    assert transmit_real(x, g2, al, out=g2) is g2
    np.testing.assert_allclose(g2, ref)
    x2 = x.copy()
    transmit_real(x2, g, al, out=x2)
    np.testing.assert_allclose(x2, ref)
    np.testing.assert_allclose(transmit_real(x, None, al), al.signal_amplitude[:, None] * x)
