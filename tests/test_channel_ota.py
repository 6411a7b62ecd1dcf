"""channel.ota: O(N·d) D2D superposition vs the naive sum, eq. (10) noise variance, chunking."""

import numpy as np
import pytest
import scipy.sparse
from hypothesis import given, settings, strategies as st

from channel.ota import d2d_noise_variance, d2d_superpose, d2d_superpose_per_link, sparse_superpose, uplink_superpose
from channel.power_control import align_power, transmit_real


def gens(seed, n):
    return [np.random.default_rng([seed, i]) for i in range(n)]


def naive_d2d(signals, gains, noise_power_w, rngs):
    """O(N²·d) reference: for each receiver, sum over all other senders, then its own noise."""
    n, d = signals.shape
    out = np.zeros_like(signals)
    for i in range(n):
        for k in range(n):
            if k != i:
                out[i] += gains[k] * signals[k]
        if noise_power_w > 0:
            out[i] += np.sqrt(noise_power_w) * rngs[i].standard_normal(d)
    return out


def test_d2d_equals_naive_sum():
    rng = np.random.default_rng(0)
    n, d = 7, 13
    s = rng.standard_normal((n, d))
    g = rng.uniform(0.1, 3.0, n)
    np.testing.assert_allclose(d2d_superpose(s, g, 0.0, None), naive_d2d(s, g, 0.0, None), rtol=1e-12, atol=1e-12)
    fast = d2d_superpose(s, g, 0.3, gens(1, n))
    np.testing.assert_allclose(fast, naive_d2d(s, g, 0.3, gens(1, n)), rtol=1e-12, atol=1e-12)
    # In place on the signals gives the same.
    s2 = s.copy()
    assert d2d_superpose(s2, g, 0.3, gens(1, n), out=s2) is s2
    np.testing.assert_allclose(s2, fast, rtol=1e-12, atol=1e-12)
    # Per-link version with rows equal to the per-sender gains.
    per_link = d2d_superpose_per_link(s, np.tile(g, (n, 1)), 0.3, gens(1, n))
    np.testing.assert_allclose(per_link, fast, rtol=1e-12, atol=1e-12)


def test_per_link_equals_naive():
    rng = np.random.default_rng(2)
    n, d = 5, 9
    s = rng.standard_normal((n, d))
    gm = rng.uniform(0.0, 1.0, (n, n))
    ref = np.array([sum(gm[i, k] * s[k] for k in range(n) if k != i) for i in range(n)])
    np.testing.assert_allclose(d2d_superpose_per_link(s, gm, 0.0, None, chunk=4), ref, rtol=1e-12)


def test_chunked_calls_equal_one_call():
    rng = np.random.default_rng(3)
    n, d = 6, 1000
    s = rng.standard_normal((n, d))
    g = rng.uniform(0.5, 2.0, n)
    whole = d2d_superpose(s, g, [0.1 * (i + 1) for i in range(n)], gens(9, n))
    streams = gens(9, n)
    parts = [d2d_superpose(s[:, a : a + 300], g, [0.1 * (i + 1) for i in range(n)], streams) for a in range(0, d, 300)]
    np.testing.assert_array_equal(np.concatenate(parts, axis=1), whole)


def test_noiseless_consensus_channel_part():
    # dwfl.md §8 check 2 (channel part): σ = σ_m = 0 → v_i / c == Σ_{k≠i} x_k.
    rng = np.random.default_rng(4)
    n, d = 10, 50
    h = (rng.standard_normal(n) + 1j * rng.standard_normal(n)) / np.sqrt(2)
    al = align_power(h, 1000.0)
    x = rng.standard_normal((n, d))
    payload = transmit_real(x, np.zeros((n, d)), al)
    v = d2d_superpose(payload, al.effective_gain(h), 0.0, None)
    expected = x.sum(axis=0)[None, :] - x
    np.testing.assert_allclose(v / al.c, expected, rtol=1e-12, atol=1e-12)


def test_receiver_noise_variance_eq10():
    # dwfl.md §8 check 5 on the §4.5 example: empirical per-entry variance of v_i − c Σ_{k≠i} x_k
    # equals σ_s,i² = Σ_{k≠i} |h_k|² β_k P_k σ² + σ_m² (28 for receiver 1, 25 for the others).
    n, d = 10, 200_000
    h = np.array([1.0] + [2.0] * 9)
    sigma2, noise_w = 1.0, 1.0
    al = align_power(h, 1.0)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((n, d))
    art = np.sqrt(sigma2) * np.random.default_rng(6).standard_normal((n, d))
    payload = transmit_real(x, art, al)
    v = d2d_superpose(payload, al.effective_gain(), noise_w, gens(7, n))
    resid = v - al.c * (x.sum(axis=0)[None, :] - x)
    expected = d2d_noise_variance(al.effective_gain(), al.noise_amplitude, sigma2, noise_w)
    np.testing.assert_allclose(expected, [28.0] + [25.0] * 9)
    tol = 5 * np.sqrt(2.0 / d)  # 5 standard errors of a variance estimate
    np.testing.assert_allclose(resid.var(axis=1), expected, rtol=tol)
    # Φ_k^(t,i) = a_k G_k + m_i/(c(N−1)): per-entry variance <= σ_z² = 3 + 1/81.
    m0 = v[0] - al.c * (x.sum(axis=0) - x[0]) - sum(al.effective_gain()[k] * al.noise_amplitude[k] * art[k] for k in range(1, n))
    phi = al.noise_scale()[:, None] * art + m0[None, :] / (al.c * (n - 1))
    assert np.max(phi.var(axis=1)) <= (3.0 + 1.0 / 81.0) * (1 + tol)


def test_uplink():
    rng = np.random.default_rng(8)
    s = rng.standard_normal((4, 30))
    g = np.array([1.0, 0.5, 0.0, 2.0])
    np.testing.assert_allclose(uplink_superpose(s, g, 0.0, None), (g[:, None] * s).sum(axis=0))
    y = uplink_superpose(np.zeros((3, 100_000)), np.ones(3), 2.0, np.random.default_rng(9))
    assert y.var() == pytest.approx(2.0, rel=0.03)


def test_shapes_validated():
    with pytest.raises(ValueError):
        d2d_superpose(np.ones((3, 2)), np.ones(2), 0.0, None)
    with pytest.raises(ValueError):
        d2d_superpose(np.ones((3, 2)), np.ones(3), 1.0, None)
    with pytest.raises(ValueError):
        d2d_superpose(np.ones((3, 2)), np.ones(3), 1.0, gens(0, 2))


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 9), d=st.integers(1, 6), cuts=st.lists(st.integers(0, 9), max_size=4),
       zero_rows=st.lists(st.booleans(), min_size=9, max_size=9), seed=st.integers(0, 2**32 - 1))
def test_sparse_superpose_in_blocks_of_receivers_is_the_whole_call(n, d, cuts, zero_rows, seed):
    """Receivers computed in any blocks (rows a..b of the links, into ``out``) give the bits of one
    call for all: each receiver's sum is its own row, and with generators every receiver takes one
    and draws its row, σ_m² = 0 or not."""
    rng = np.random.default_rng(seed)
    dense = rng.standard_normal((n, n)) * (rng.random((n, n)) < 0.5)
    links = scipy.sparse.csr_array(dense)
    signals = rng.standard_normal((n, d))
    noise = np.where(np.array(zero_rows[:n]), 0.0, rng.random(n) + 0.1)
    whole = sparse_superpose(signals, links, noise, gens(seed, n))
    out = np.full((n, d), np.nan)
    bounds = sorted({0, n, *(c for c in cuts if c < n)})
    streams = iter(gens(seed, n))
    for a, b in zip(bounds, bounds[1:]):
        sparse_superpose(signals, links[a:b], noise[a:b], streams, out=out[a:b])
    np.testing.assert_array_equal(out, whole)
    expected = dense @ signals + np.sqrt(noise)[:, None] * np.stack([g.standard_normal(d) for g in gens(seed, n)])
    np.testing.assert_allclose(whole, expected, rtol=1e-12, atol=1e-12)


def test_sparse_superpose_refuses_an_out_over_its_input_and_noise_without_generators():
    links = scipy.sparse.csr_array(np.ones((3, 3)))
    s = np.ones((3, 2))
    with pytest.raises(ValueError, match="overlap"):
        sparse_superpose(s, links, 0.0, None, out=s)
    with pytest.raises(ValueError, match=r"out must be a \(3, 2\) float64"):
        sparse_superpose(s, links, 0.0, None, out=np.empty((2, 2)))
    with pytest.raises(ValueError, match="rng is required"):
        sparse_superpose(s, links, 1.0, None)
    assert sparse_superpose(s, links[1:], 0.0, None).tolist() == [[3.0, 3.0], [3.0, 3.0]]
