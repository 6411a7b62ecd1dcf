"""channel.noise and channel.link: k·T·B·NF, AWGN statistics (NumPy and Sionna), airtime and energy."""

import math

import numpy as np
import pytest

from channel.link import (
    analog_airtime_s,
    analog_channel_uses,
    analog_link,
    analog_signal_energy_j,
    digital_airtime_s,
    digital_link,
    orthogonal_round_airtime_s,
    radio_energy_j,
    shannon_rate_bps,
)
from channel.noise import (
    BOLTZMANN_J_PER_K,
    add_awgn_real,
    awgn_complex,
    awgn_real,
    fill_gaussian_rows,
    real_noise_variance_w,
    thermal_noise_power_w,
)
from channel.units import w_to_dbm

from conftest import require_module


def test_thermal_noise():
    assert float(w_to_dbm(thermal_noise_power_w(1.0))) == pytest.approx(-173.98, abs=0.01)
    n = thermal_noise_power_w(20e6, noise_figure_db=7.0, temperature_k=290.0)
    assert float(n) == pytest.approx(BOLTZMANN_J_PER_K * 290 * 20e6 * 10**0.7, rel=1e-12)
    assert float(w_to_dbm(n)) == pytest.approx(-173.98 + 73.01 + 7.0, abs=0.02)
    assert float(real_noise_variance_w(n)) == pytest.approx(float(n) / 2)


def test_boltzmann_matches_sionna():
    sionna_phy = require_module("sionna.phy", "channel")
    assert BOLTZMANN_J_PER_K == pytest.approx(sionna_phy.BOLTZMANN_CONSTANT, rel=1e-12)


def test_awgn_real_variance_and_streams():
    m = awgn_real((3, 100_000), [0.5, 1.0, 4.0], [np.random.default_rng(i) for i in range(3)])
    np.testing.assert_allclose(m.var(axis=1), [0.5, 1.0, 4.0], rtol=0.03)
    np.testing.assert_allclose(m.mean(axis=1), 0.0, atol=0.03)
    # Row i is exactly receiver i's stream.
    np.testing.assert_array_equal(m[1], np.random.default_rng(1).standard_normal(100_000))
    with pytest.raises(TypeError):
        awgn_real((2, 3), 1.0, None)
    with pytest.raises(ValueError):
        awgn_real((2, 3), 1.0, [np.random.default_rng(0)])


def test_add_awgn_chunked_equals_whole():
    x = np.zeros((2, 1000))
    add_awgn_real(x, 2.0, [np.random.default_rng(5), np.random.default_rng(6)], chunk=128)
    ref = awgn_real((2, 1000), 2.0, [np.random.default_rng(5), np.random.default_rng(6)])
    np.testing.assert_allclose(x, ref, rtol=1e-15)
    buf = np.empty((2, 1000), dtype=np.float32)
    fill_gaussian_rows(buf, 1.0, np.random.default_rng(0))
    assert buf.dtype == np.float32


def test_awgn_complex_via_sionna():
    require_module("sionna.phy.channel", "channel")
    y = awgn_complex(np.zeros(100_000, complex), 3.0, np.random.default_rng(1))
    assert np.mean(np.abs(y) ** 2) == pytest.approx(3.0, rel=0.03)
    assert np.var(y.real) == pytest.approx(1.5, rel=0.03)
    np.testing.assert_array_equal(y, awgn_complex(np.zeros(100_000, complex), 3.0, np.random.default_rng(1)))


def test_analog_link():
    assert analog_channel_uses(1_000_001, 2) == 500_001
    assert analog_airtime_s(10_000, 1e6) == pytest.approx(0.01)
    assert analog_airtime_s(10_000, 1e6, reals_per_channel_use=2) == pytest.approx(0.005)
    cost = analog_link(1_000_000, 1e6, power_w=0.1, circuit_power_w=0.05)
    assert cost.airtime_s == pytest.approx(1.0)
    assert cost.energy_j == pytest.approx(0.15)
    assert cost.rate_bps is None
    s = np.random.default_rng(0).standard_normal((3, 500))
    np.testing.assert_allclose(analog_signal_energy_j(s, 1e3), (s**2).sum(axis=1) / 1e3)


def test_digital_link():
    assert float(shannon_rate_bps(1e6, 3.0)) == pytest.approx(2e6)
    assert float(shannon_rate_bps(1e6, 3.0, efficiency=0.5)) == pytest.approx(1e6)
    assert float(digital_airtime_s(64 * 1e4, 1e6, 15.0)) == pytest.approx(64e4 / 4e6)
    c = digital_link(size_bits=2e6, power_w=0.5, channel_gain=1e-9, noise_power_w=0.5e-9 / 3, bandwidth_hz=1e6)
    assert c.rate_bps == pytest.approx(2e6)
    assert c.airtime_s == pytest.approx(1.0)
    assert c.energy_j == pytest.approx(0.5)  # energy = power × airtime
    dead = digital_link(1e3, 0.0, 1.0, 1.0, 1e6)
    assert dead.airtime_s == math.inf and dead.energy_j == math.inf
    assert orthogonal_round_airtime_s([c.airtime_s] * 4) == pytest.approx(4.0)
    assert float(radio_energy_j(2.0, 3.0)) == 6.0
