"""channel.fading: Sionna Rayleigh block fading through our wrapper, Rician K split, schedules."""

import subprocess
import sys

import numpy as np
import pytest

from conftest import require_module

require_module("sionna.phy.channel", "channel")  # imported once for the module

from channel.fading import FadingSchedule, draw_fading, rayleigh_block_fading, rician_fading  # noqa: E402

N_SAMPLES = 200_000


def test_import_channel_is_light():
    code = "import sys, channel; print('torch' in sys.modules, 'sionna' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_rayleigh_unit_power_and_circular():
    h = rayleigh_block_fading((N_SAMPLES,), np.random.default_rng(11))
    assert h.dtype == np.complex128 and h.shape == (N_SAMPLES,)
    # E|h|² = 1: sampled mean within 5 standard errors (|h|² ~ Exp(1), std 1).
    assert abs(np.mean(np.abs(h) ** 2) - 1.0) < 5.0 / np.sqrt(N_SAMPLES)
    # Zero mean, equal power on I and Q (CN(0, 1)).
    assert abs(np.mean(h)) < 5.0 / np.sqrt(N_SAMPLES)
    assert np.var(h.real) == pytest.approx(0.5, abs=0.01)
    assert np.var(h.imag) == pytest.approx(0.5, abs=0.01)


def test_rayleigh_shapes_and_explicit_generators():
    a = rayleigh_block_fading((4, 5), np.random.default_rng(3))
    b = rayleigh_block_fading((4, 5), np.random.default_rng(3))
    c = rayleigh_block_fading((4, 5), np.random.default_rng(4))
    assert a.shape == (4, 5)
    np.testing.assert_array_equal(a, b)
    assert not np.array_equal(a, c)
    import torch

    g1 = torch.Generator().manual_seed(5)
    g2 = torch.Generator().manual_seed(5)
    np.testing.assert_array_equal(rayleigh_block_fading(6, g1), rayleigh_block_fading(6, g2))
    np.testing.assert_array_equal(rayleigh_block_fading(3, 9), rayleigh_block_fading(3, 9))
    with pytest.raises(TypeError):
        rayleigh_block_fading(3, None)


def test_rician_k_factor_power_split():
    k = 3.0
    h = rician_fading((N_SAMPLES,), k, np.random.default_rng(12), los_phase_rad=0.0)
    # LoS part sqrt(K/(K+1)) = mean, diffuse power 1/(K+1) = variance, total E|h|² = 1.
    assert np.mean(h).real == pytest.approx(np.sqrt(k / (k + 1)), abs=0.01)
    assert abs(np.mean(h).imag) < 0.01
    assert np.var(h) == pytest.approx(1.0 / (k + 1), rel=0.02)
    assert np.mean(np.abs(h) ** 2) == pytest.approx(1.0, rel=0.02)
    # Random LoS phase: still unit power, zero mean.
    hr = rician_fading((N_SAMPLES,), k, np.random.default_rng(13), los_phase_rad=None)
    assert np.mean(np.abs(hr) ** 2) == pytest.approx(1.0, rel=0.02)
    assert abs(np.mean(hr)) < 0.02
    # K = 0 is Rayleigh.
    h0 = rician_fading((50,), 0.0, np.random.default_rng(14))
    np.testing.assert_allclose(h0, rayleigh_block_fading((50,), np.random.default_rng(14)))
    with pytest.raises(ValueError):
        rician_fading(3, -1.0, np.random.default_rng(0))


def test_draw_fading_kinds():
    np.testing.assert_array_equal(draw_fading("none", (2, 3), None), np.ones((2, 3)))
    assert draw_fading("rayleigh", 4, np.random.default_rng(0)).shape == (4,)
    assert draw_fading("rician", 4, np.random.default_rng(0), k_factor=2.0).shape == (4,)
    with pytest.raises(ValueError):
        draw_fading("nakagami", 4, np.random.default_rng(0))


def test_schedule():
    inv = FadingSchedule(None)
    assert [inv.block_index(t) for t in range(5)] == [0] * 5
    assert inv.is_new_block(0) and not inv.is_new_block(3)
    every = FadingSchedule(1)
    assert [every.block_index(t) for t in range(4)] == [0, 1, 2, 3]
    assert all(every.is_new_block(t) for t in range(4))
    blk = FadingSchedule(3)
    assert [blk.block_index(t) for t in range(7)] == [0, 0, 0, 1, 1, 1, 2]
    assert [blk.is_new_block(t) for t in range(7)] == [True, False, False, True, False, False, True]
    with pytest.raises(ValueError):
        FadingSchedule(0)
