"""channel.pathloss: 3GPP TR 38.901 path loss through Sionna against the formulas of Table 7.4.1-1."""

import math

import numpy as np
import pytest

from conftest import require_module

require_module("sionna.phy.channel.tr38901", "channel")

from channel.pathloss import (  # noqa: E402
    SPEED_OF_LIGHT_M_PER_S,
    d2d_pathloss_3gpp,
    free_space_pathloss_db,
    pathloss_3gpp,
)

FC = 3.5e9
C = SPEED_OF_LIGHT_M_PER_S


def umi_los_db(d2d, h_bs, h_ut, fc):
    d3d = math.hypot(d2d, h_bs - h_ut)
    d_bp = 4 * (h_bs - 1.0) * (h_ut - 1.0) * fc / C
    f_ghz = fc / 1e9
    if d2d <= d_bp:
        return 32.4 + 21 * math.log10(d3d) + 20 * math.log10(f_ghz)
    return 32.4 + 40 * math.log10(d3d) + 20 * math.log10(f_ghz) - 9.5 * math.log10(d_bp**2 + (h_bs - h_ut) ** 2)


def umi_nlos_db(d2d, h_bs, h_ut, fc):
    d3d = math.hypot(d2d, h_bs - h_ut)
    pl = 35.3 * math.log10(d3d) + 22.4 + 21.3 * math.log10(fc / 1e9) - 0.3 * (h_ut - 1.5)
    return max(umi_los_db(d2d, h_bs, h_ut, fc), pl)


def uma_los_db(d2d, h_bs, h_ut, fc):
    d3d = math.hypot(d2d, h_bs - h_ut)
    d_bp = 4 * (h_bs - 1.0) * (h_ut - 1.0) * fc / C  # h_E = 1 m for h_UT < 13 m
    f_ghz = fc / 1e9
    if d2d <= d_bp:
        return 28.0 + 22 * math.log10(d3d) + 20 * math.log10(f_ghz)
    return 28.0 + 40 * math.log10(d3d) + 20 * math.log10(f_ghz) - 9 * math.log10(d_bp**2 + (h_bs - h_ut) ** 2)


def uma_nlos_db(d2d, h_bs, h_ut, fc):
    d3d = math.hypot(d2d, h_bs - h_ut)
    pl = 13.54 + 39.08 * math.log10(d3d) + 20 * math.log10(fc / 1e9) - 0.6 * (h_ut - 1.5)
    return max(uma_los_db(d2d, h_bs, h_ut, fc), pl)


DISTANCES = [35.0, 100.0, 400.0, 1500.0]  # both sides of the breakpoint


@pytest.mark.parametrize(
    "scenario,h_bs,los,formula",
    [
        ("umi", 10.0, True, umi_los_db),
        ("umi", 10.0, False, umi_nlos_db),
        ("uma", 25.0, True, uma_los_db),
        ("uma", 25.0, False, uma_nlos_db),
    ],
)
def test_pathloss_matches_3gpp_formula(scenario, h_bs, los, formula):
    h_ut = 1.5
    tx = np.array([[d, 0.0, h_ut] for d in DISTANCES])
    rx = np.array([[0.0, 0.0, h_bs]])
    ls = pathloss_3gpp(tx, rx, FC, scenario, los=los, shadow_fading=False)
    assert ls.pathloss_db.shape == (1, len(DISTANCES))
    expected = [formula(d, h_bs, h_ut, FC) for d in DISTANCES]
    np.testing.assert_allclose(ls.pathloss_db[0], expected, atol=1e-9)
    np.testing.assert_array_equal(ls.shadow_fading_db, 0.0)
    assert ls.los.all() == los
    np.testing.assert_allclose(ls.gain, 10 ** (-np.asarray(ls.pathloss_db) / 10))


def test_known_value_umi_los_100m():
    ls = pathloss_3gpp([[100.0, 0.0, 1.5]], [[0.0, 0.0, 10.0]], 3.5e9, "umi", los=True, shadow_fading=False)
    d3d = math.hypot(100.0, 8.5)
    assert ls.pathloss_db[0, 0] == pytest.approx(32.4 + 21 * math.log10(d3d) + 20 * math.log10(3.5), abs=1e-9)


def test_shadow_fading_std_umi_los():
    # TR 38.901 Table 7.5-6: UMi street canyon LoS σ_SF = 4 dB. Nodes 500 m apart so their shadowing
    # (correlation distance 10 m) is independent; 20 receivers x 20 senders.
    xs = np.arange(20) * 500.0
    tx = np.stack([xs, np.full(20, 60.0), np.full(20, 1.5)], axis=1)
    rx = np.stack([xs + 30.0, np.zeros(20), np.full(20, 10.0)], axis=1)
    ls = pathloss_3gpp(tx, rx, FC, "umi", los=True, shadow_fading=True, rng=np.random.default_rng(5))
    sf = ls.shadow_fading_db.ravel()
    assert abs(np.mean(sf)) < 5 * 4.0 / np.sqrt(sf.size)
    assert np.std(sf) == pytest.approx(4.0, rel=0.12)
    # Same generator seed, same draw; the gain includes the shadowing.
    again = pathloss_3gpp(tx, rx, FC, "umi", los=True, shadow_fading=True, rng=np.random.default_rng(5))
    np.testing.assert_array_equal(again.shadow_fading_db, ls.shadow_fading_db)
    np.testing.assert_allclose(ls.gain, 10 ** ((ls.shadow_fading_db - ls.pathloss_db) / 10))


def test_random_los_needs_rng_and_is_reproducible():
    tx = np.array([[30.0, 0, 1.5], [200.0, 0, 1.5], [600.0, 0, 1.5]])
    rx = np.array([[0.0, 0, 10.0]])
    with pytest.raises(ValueError):
        pathloss_3gpp(tx, rx, FC, "umi", los=None, shadow_fading=False)
    a = pathloss_3gpp(tx, rx, FC, "umi", los=None, shadow_fading=False, rng=np.random.default_rng(1))
    b = pathloss_3gpp(tx, rx, FC, "umi", los=None, shadow_fading=False, rng=np.random.default_rng(1))
    np.testing.assert_array_equal(a.los, b.los)
    np.testing.assert_array_equal(a.pathloss_db, b.pathloss_db)


def test_d2d_matrix():
    pos = np.array([[0.0, 0, 1.5], [40.0, 0, 1.5], [0.0, 80, 1.5], [30.0, 30, 1.5]])
    ls = d2d_pathloss_3gpp(pos, FC, "umi", los=True, shadow_fading=False)
    assert ls.pathloss_db.shape == (4, 4)
    assert np.all(np.isinf(np.diag(ls.pathloss_db)))
    np.testing.assert_array_equal(np.diag(ls.gain), 0.0)
    # Off-diagonal: symmetric, and the formula with both ends at 1.5 m (breakpoint 4·0.5·0.5·fc/c).
    off = ~np.eye(4, dtype=bool)
    np.testing.assert_allclose(ls.pathloss_db[off], ls.pathloss_db.T[off])
    assert ls.pathloss_db[0, 1] == pytest.approx(umi_los_db(40.0, 1.5, 1.5, FC), abs=1e-9)


def test_free_space():
    d = np.array([1.0, 10.0, 100.0])
    fspl = free_space_pathloss_db(d, 2.4e9)
    np.testing.assert_allclose(np.diff(fspl), [20.0, 20.0])
    assert fspl[0] == pytest.approx(20 * math.log10(4 * math.pi * 2.4e9 / C))


def test_random_los_follows_los_probability():
    # UMi LoS probability at d2D = 60 m: 18/d + exp(−d/36)(1 − 18/d) = 0.4631...
    d = 60.0
    p_expected = 18 / d + math.exp(-d / 36) * (1 - 18 / d)
    angles = np.arange(400) * (2 * math.pi / 400)
    rx = np.array([[0.0, 0.0, 10.0]])
    tx = np.stack([d * np.cos(angles), d * np.sin(angles), np.full(400, 1.5)], axis=1)
    ls = pathloss_3gpp(tx, rx, FC, "umi", los=None, shadow_fading=False, rng=np.random.default_rng(2))
    assert ls.los.mean() == pytest.approx(p_expected, abs=4 * math.sqrt(p_expected * (1 - p_expected) / 400))
    for j in range(400):
        f = umi_los_db if ls.los[0, j] else umi_nlos_db
        assert ls.pathloss_db[0, j] == pytest.approx(f(d, 10.0, 1.5, FC), abs=1e-9)
