"""testbed.reports.stats and testbed.reports.verdicts against scipy and numpy recomputations, and their invariants
(Hypothesis over sample arrays)."""

import numpy as np
import pytest
import scipy.stats
from hypothesis import assume, given, strategies as st

from testbed.reports.stats import BCA_MIN_N, bca_interval, holm, min_detectable_effect, paired, spearman, t_interval
from testbed.reports.verdicts import INCONCLUSIVE, OPPOSITE, SHOWN, judge, paired_verdict, trend_verdict

finite = st.floats(-1e3, 1e3, allow_nan=False, allow_infinity=False)


def samples(min_size=2, max_size=30):
    return st.lists(finite, min_size=min_size, max_size=max_size).map(np.array)


def varied(x):
    """Whether ``x`` has a spread that double precision resolves (scipy's own precision guard)."""
    return np.ptp(x) > 1e-6 * max(1.0, np.abs(x).max())


# ------------------------------------------------------------------------------------ t interval


@given(samples())
def test_t_interval_is_scipys_and_holds_the_mean(x):
    s = t_interval(x)
    assert s.n == len(x) and s.ci_low <= s.mean <= s.ci_high
    if varied(x):
        low, high = scipy.stats.t.interval(0.95, len(x) - 1, loc=x.mean(), scale=scipy.stats.sem(x))
        assert np.allclose([s.ci_low, s.ci_high], [low, high], rtol=1e-9, atol=1e-9)
        assert np.isclose(s.sd, np.std(x, ddof=1))


@given(samples(min_size=2, max_size=20), samples(min_size=2, max_size=20))
def test_t_interval_narrows_with_n_at_the_same_spread(x, y):
    assume(varied(x) and varied(y) and len(x) != len(y))
    # Both rescaled to sd 1: the interval's width depends on n alone, and shrinks as n grows.
    small, large = sorted(((v - v.mean()) / np.std(v, ddof=1) for v in (x, y)), key=len)
    width = lambda v: float(t_interval(v).ci_high - t_interval(v).ci_low)  # noqa: E731
    assert width(large) < width(small)


@given(st.lists(samples(min_size=3, max_size=3), min_size=1, max_size=5))
def test_t_interval_is_vectorised_row_by_row(rows):
    matrix = np.stack(rows)
    whole = t_interval(matrix)
    for i, row in enumerate(rows):
        one = t_interval(row)
        assert np.allclose([whole.mean[i], whole.sd[i], whole.ci_low[i], whole.ci_high[i]],
                           [one.mean, one.sd, one.ci_low, one.ci_high], equal_nan=True)


def test_t_interval_of_one_value_and_of_a_constant():
    one = t_interval([0.3])
    assert one.mean == 0.3 and np.isnan(one.sd) and np.isnan(one.ci_low) and np.isnan(one.ci_high)
    const = t_interval([[5.423525912188081] * 3, [0.1] * 3])
    # Exactly the value, sd 0: a sum over three copies would miss it by an ulp.
    assert const.mean.tolist() == [5.423525912188081, 0.1] and const.sd.tolist() == [0.0, 0.0]
    assert const.ci_low.tolist() == const.ci_high.tolist() == [5.423525912188081, 0.1]


# ---------------------------------------------------------------------------------------- BCa


def test_bca_matches_scipy_row_by_row_and_is_empty_below_its_minimum():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(3, 6))
    low, high = bca_interval(x, n_resamples=2000, seed=7)
    for i in range(3):
        ref = scipy.stats.bootstrap((x[i],), np.mean, method="BCa", n_resamples=2000,
                                    rng=np.random.default_rng(7)).confidence_interval
        assert low[i] <= x[i].mean() <= high[i]
        assert abs(low[i] - ref.low) < 0.1 and abs(high[i] - ref.high) < 0.1  # different resamples, same law
    short_low, short_high = bca_interval(x[:, :BCA_MIN_N - 1])
    assert np.isnan(short_low).all() and np.isnan(short_high).all()


def test_bca_of_a_constant_row_is_its_value_and_a_nan_row_is_nan():
    low, high = bca_interval([[2.0, 2.0, 2.0], [1.0, np.nan, 3.0], [1.0, 2.0, 4.0]], n_resamples=500)
    assert (low[0], high[0]) == (2.0, 2.0)
    assert np.isnan(low[1]) and np.isnan(high[1])
    assert low[2] < 7 / 3 < high[2]


def test_bca_is_reproducible():
    x = np.arange(12.0).reshape(2, 6) ** 1.5
    assert np.array_equal(np.stack(bca_interval(x)), np.stack(bca_interval(x)))


# --------------------------------------------------------------------------------------- Holm


@given(st.lists(st.floats(0, 1), min_size=1, max_size=20))
def test_holm_is_at_least_raw_at_most_one_and_keeps_the_order(p):
    p = np.array(p)
    adjusted = holm(p)
    assert np.all(adjusted >= p) and np.all(adjusted <= 1.0)
    order = np.argsort(p, kind="stable")
    assert np.all(np.diff(adjusted[order]) >= 0)  # a smaller raw p never gets a larger adjusted one


@given(st.lists(st.floats(0, 1), min_size=1, max_size=8))
def test_holm_is_the_step_down_definition(p):
    m = len(p)
    ranked = sorted(p)
    expected = {i: max(min(1.0, (m - j) * ranked[j]) for j in range(i + 1)) for i in range(m)}
    assert sorted(holm(p).tolist()) == pytest.approx([expected[i] for i in range(m)])


def test_holm_worked_example():
    assert holm([0.01, 0.04, 0.03, 0.005]).tolist() == pytest.approx([0.03, 0.06, 0.06, 0.02])


# --------------------------------------------------------------------------------------- paired


@given(samples(min_size=2, max_size=8), st.data())
def test_paired_is_scipys_and_symmetric_under_swapping(a, data):
    b = np.array(data.draw(st.lists(finite, min_size=len(a), max_size=len(a))))
    d = a - b
    assume(varied(d))
    ab, ba = paired(a, b), paired(b, a)
    assert ab.mean == pytest.approx(-ba.mean, abs=1e-12) and ab.sd == pytest.approx(ba.sd)
    assert (ab.ci_low, ab.ci_high) == pytest.approx((-ba.ci_high, -ba.ci_low), abs=1e-9)
    assert ab.p_t == pytest.approx(ba.p_t) and ab.p_wilcoxon == pytest.approx(ba.p_wilcoxon)
    assert ab.ci_low <= ab.mean <= ab.ci_high
    assert ab.p_t == pytest.approx(scipy.stats.ttest_rel(a, b).pvalue, rel=1e-6, abs=1e-12)
    assert ab.p_wilcoxon == pytest.approx(scipy.stats.wilcoxon(a, b).pvalue, rel=1e-6)
    assert ab.min_detectable == pytest.approx(float(min_detectable_effect(len(a), ab.sd)))


def test_paired_identical_and_constant_shift():
    same = paired([1.0, 2.0, 3.0], [1.0, 2.0, 3.0])
    assert (same.mean, same.sd, same.p_t, same.p_wilcoxon, same.min_detectable) == (0.0, 0.0, 1.0, 1.0, 0.0)
    shifted = paired([1.5, 2.5, 3.5], [1.0, 2.0, 3.0])
    assert (shifted.mean, shifted.ci_low, shifted.ci_high, shifted.p_t) == (0.5, 0.5, 0.5, 0.0)


@pytest.mark.parametrize("a, b", [([1.0], [2.0]), ([1.0, 2.0], [1.0]), ([1.0, np.inf], [0.0, 0.0])])
def test_paired_refuses_what_it_cannot_compare(a, b):
    with pytest.raises(ValueError):
        paired(a, b)


# ---------------------------------------------------------------------------------------- power


@pytest.mark.parametrize("n", [3, 5, 12])
def test_min_detectable_effect_has_80_percent_power_by_simulation(n):
    """At the stated effect, a paired t test rejects in 80 % of simulated experiments."""
    effect = float(min_detectable_effect(n, 1.0))
    d = np.random.default_rng(n).normal(effect, 1.0, size=(40_000, n))
    t = d.mean(axis=1) / (d.std(axis=1, ddof=1) / np.sqrt(n))
    rejected = np.mean(np.abs(t) > scipy.stats.t.ppf(0.975, n - 1))
    assert rejected == pytest.approx(0.80, abs=0.012)


def test_min_detectable_effect_shrinks_with_n_and_scales_with_sd():
    effects = [float(min_detectable_effect(n, 1.0)) for n in (2, 3, 5, 10, 100, 10_000)]
    assert all(x > y for x, y in zip(effects, effects[1:]))
    assert effects[-1] * np.sqrt(10_000) == pytest.approx(1.96 + 0.8416, abs=0.01)  # the normal limit
    assert float(min_detectable_effect(10, 3.0)) == pytest.approx(3 * effects[3])
    with pytest.raises(ValueError):
        min_detectable_effect(1, 1.0)


# ------------------------------------------------------------------------------------- Spearman


@given(st.lists(st.tuples(finite, finite), min_size=4, max_size=30))
def test_spearman_is_scipys_and_its_interval_holds_it(pairs):
    x, y = map(np.array, zip(*pairs))
    assume(len(set(x)) > 1 and len(set(y)) > 1)
    c = spearman(x, y)
    assert c.rho == pytest.approx(scipy.stats.spearmanr(x, y).statistic)
    assert -1 <= c.ci_low <= c.rho + 1e-12 and c.rho - 1e-12 <= c.ci_high <= 1


def test_spearman_interval_is_fisher_z_with_bonett_wright_error():
    x = np.arange(10.0)
    y = np.array([0.1, 0.3, 0.2, 0.5, 0.4, 0.7, 0.9, 0.6, 1.0, 0.8])
    c = spearman(x, y)
    half = 1.959964 * np.sqrt((1 + c.rho**2 / 2) / 7)
    assert (c.ci_low, c.ci_high) == pytest.approx((np.tanh(np.arctanh(c.rho) - half),
                                                  np.tanh(np.arctanh(c.rho) + half)), rel=1e-5)
    assert np.isnan(spearman(x, np.ones(10)).rho)
    with pytest.raises(ValueError):
        spearman([1, 2, 3], [1, 2, 3])


# -------------------------------------------------------------------------------------- verdicts


@pytest.mark.parametrize("low, high, sign, word", [
    (0.1, 0.3, 1, SHOWN), (0.1, 0.3, -1, OPPOSITE), (-0.3, -0.1, -1, SHOWN), (-0.3, -0.1, 1, OPPOSITE),
    (-0.1, 0.3, 1, INCONCLUSIVE), (0.0, 0.3, 1, INCONCLUSIVE), (np.nan, np.nan, 1, INCONCLUSIVE)])
def test_judge_is_the_rule(low, high, sign, word):
    assert judge(low, high, sign) == word


def test_paired_verdict_pairs_mappings_by_seed_and_states_n_effect_interval():
    a = {3: 0.80, 1: 0.79, 2: 0.84, 4: 0.83}
    b = {1: 0.74, 2: 0.80, 3: 0.75, 4: 0.78}  # another order: paired by seed, not by position
    v = paired_verdict(a, b, "a>b")
    ref = paired([0.79, 0.84, 0.80, 0.83], [0.74, 0.80, 0.75, 0.78])
    assert (v.word, v.n, v.effect, v.ci_low, v.ci_high) == (SHOWN, 4, ref.mean, ref.ci_low, ref.ci_high)
    assert paired_verdict(a, b, "a<b").word == OPPOSITE
    text = v.markdown()
    assert text.startswith("**shown** (n=4, mean difference a−b +0.0475, 95% CI [+0.0") and text.endswith("])")
    noisy = paired_verdict([0.8, 0.7, 0.9], [0.75, 0.8, 0.8], "a>b")
    assert noisy.word == INCONCLUSIVE and noisy.ci_low < 0 < noisy.ci_high
    with pytest.raises(ValueError, match="unpaired seeds"):
        paired_verdict({1: 0.1, 2: 0.2}, {1: 0.1, 3: 0.2}, "a>b")
    with pytest.raises(ValueError, match="claimed"):
        paired_verdict([1, 2], [0, 1], "a>=b")


def test_trend_verdict_by_rank_correlation_not_by_counting_steps():
    settings = [1, 1, 1, 2, 2, 2, 4, 4, 4, 8, 8, 8]
    rising = [0.60, 0.62, 0.61, 0.64, 0.63, 0.65, 0.66, 0.68, 0.67, 0.70, 0.69, 0.71]
    v = trend_verdict(settings, rising, "increasing")
    assert v.word == SHOWN and v.n == 12 and v.effect_name == "Spearman ρ" and v.ci_low > 0
    assert trend_verdict(settings, rising, "decreasing").word == OPPOSITE
    # Every step of the means rises (0.600, 0.605, 0.610, 0.615), but by a tenth of the seed spread
    # (±0.05): a count of steps would say "shown", the rank correlation's interval holds zero.
    flat = [m + e for m in (0.600, 0.605, 0.610, 0.615) for e in (-0.05, 0.0, 0.05)]
    v = trend_verdict(settings, flat, "increasing")
    assert v.word == INCONCLUSIVE and v.ci_low < 0 < v.effect < v.ci_high
