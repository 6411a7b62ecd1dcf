"""testbed.reports.stats and testbed.reports.verdicts against scipy and numpy recomputations, and their invariants
(Hypothesis over sample arrays)."""

import numpy as np
import pytest
import scipy.stats
from hypothesis import assume, given, settings, strategies as st

from testbed.reports.stats import (BCA_MIN_N, bca_interval, holm, min_detectable_effect, min_detectable_effect_in_family, seeds_for_effect,
                                   paired, spearman, spearman_p, stratified_permutation_p, t_interval,
                                   wilcoxon_min_p, within_cluster_spearman)
from testbed.reports.verdicts import (INCONCLUSIVE, OPPOSITE, SHOWN, Family, decide, fill_all, judge, paired_verdict,
                                      trend_verdict)

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
    assert text.startswith("**shown** (n=4, mean difference a−b +0.0475, 95% CI [+0.0") and text.endswith(
        f"], p {ref.p_t:.2g})")  # a family of one: no Holm note
    assert v.p == v.p_adjusted == ref.p_t and v.family_size == 1
    noisy = paired_verdict([0.8, 0.7, 0.9], [0.75, 0.8, 0.8], "a>b")
    assert noisy.word == INCONCLUSIVE and noisy.ci_low < 0 < noisy.ci_high
    with pytest.raises(ValueError, match="unpaired seeds"):
        paired_verdict({1: 0.1, 2: 0.2}, {1: 0.1, 3: 0.2}, "a>b")
    with pytest.raises(ValueError, match="claimed"):
        paired_verdict([1, 2], [0, 1], "a>=b")


def test_trend_verdict_by_rank_correlation_not_by_counting_steps():
    settings = [1, 2, 4, 8, 16, 32]
    rising = [0.60, 0.62, 0.64, 0.66, 0.68, 0.70]
    v = trend_verdict(settings, rising, "increasing", units=settings)
    assert v.word == SHOWN and v.n == 6 and v.effect_name == "Spearman ρ" and v.ci_low > 0
    assert v.p == pytest.approx(2 / 720)  # exact: only the two perfect orderings reach |ρ| = 1
    assert trend_verdict(settings, rising, "decreasing", units=settings).word == OPPOSITE
    # Every step of the means rises, but by a tenth of the seed spread (±0.05) and each seed's luck is its
    # own: within a seed the ranking is noise, and the trend is not shown (a count of steps would say so).
    flat = [m + e for e in (-0.05, 0.0, 0.05) for m in (0.600, 0.605, 0.610, 0.615)]
    seeds = [s for s in range(3) for _ in range(4)]
    steps = [1, 2, 4, 8] * 3
    scrambled = [flat[i] for i in (3, 0, 2, 1, 5, 7, 4, 6, 8, 11, 9, 10)]
    v = trend_verdict(steps, scrambled, "increasing", units=steps, cluster=seeds)
    assert v.word == INCONCLUSIVE and v.n == 3


def test_a_trend_refuses_units_that_repeat_unless_told_the_cluster():
    """5 graphs × 5 seeds are 5 units, not 25: pooled, the runs would be counted as independent."""
    gaps = [0.1, 0.2, 0.3, 0.4, 0.5] * 5
    acc = [g + 0.01 * s for s in range(5) for g in (0.1, 0.2, 0.3, 0.4, 0.5)]
    graphs = ["a", "b", "c", "d", "e"] * 5
    with pytest.raises(ValueError, match="units repeat"):
        trend_verdict(gaps, acc, "increasing", units=graphs)
    with pytest.raises(ValueError, match="units repeat"):
        Family("f").trend(gaps, acc, "increasing", units=graphs)
    seeds = [s for s in range(5) for _ in range(5)]
    v = trend_verdict(gaps, acc, "increasing", units=graphs, cluster=seeds)
    assert v.n == 5 and v.effect == pytest.approx(1.0) and v.p == pytest.approx(2 / 120**5)


@settings(max_examples=30)
@given(st.integers(4, 6), st.data())
def test_spearman_p_is_the_exact_permutation_p_by_brute_force(k, data):
    from itertools import permutations

    x = np.array(data.draw(st.lists(st.integers(0, 5), min_size=k, max_size=k)), float)
    y = np.array(data.draw(st.lists(st.integers(0, 5), min_size=k, max_size=k)), float)
    assume(np.ptp(x) > 0 and np.ptp(y) > 0)
    rho = scipy.stats.spearmanr(x, y).statistic
    every = [scipy.stats.spearmanr(x, y[list(p)]).statistic for p in permutations(range(k))]
    assert spearman_p(x, y) == pytest.approx(np.mean(np.abs(every) >= abs(rho) - 1e-9))


def test_stratified_permutation_p_by_brute_force_and_its_normal_limit():
    from itertools import permutations, product

    xs = [np.array([1.0, 2, 3]), np.array([1.0, 2, 3, 4])]
    ys = [np.array([0.3, 0.1, 0.2]), np.array([0.5, 0.5, 0.7, 0.9])]
    observed = sum(scipy.stats.spearmanr(x, y).statistic for x, y in zip(xs, ys))
    sums = [scipy.stats.spearmanr(xs[0], ys[0][list(p)]).statistic + scipy.stats.spearmanr(xs[1], ys[1][list(q)]).statistic
            for p, q in product(permutations(range(3)), permutations(range(4)))]
    assert stratified_permutation_p(xs, ys) == pytest.approx(np.mean(np.abs(sums) >= abs(observed) - 1e-9))
    # above 8 values per stratum: the normal approximation with variance 1/(k − 1) per stratum
    x = np.arange(10.0)
    p = stratified_permutation_p([x, x], [x, x])
    assert p == pytest.approx(2 * scipy.stats.norm.sf(2 / np.sqrt(2 / 9)))


def test_within_cluster_spearman_counts_the_seeds_and_a_flat_seed_as_no_trend():
    c = within_cluster_spearman([1, 2, 3, 1, 2, 3, 1, 2, 3], [1, 2, 3, 3, 2, 1, 5, 5, 5], [0, 0, 0, 1, 1, 1, 2, 2, 2])
    assert c.clusters == 3 and c.per_cluster == (1.0, -1.0, 0.0) and c.rho == 0.0 and c.p == 1.0
    with pytest.raises(ValueError, match="2 or more"):
        within_cluster_spearman([1, 2, 3], [1, 2, 3], [0, 0, 1])


def test_wilcoxon_cannot_confirm_at_five_pairs_or_fewer():
    assert wilcoxon_min_p(5) == 0.0625 and wilcoxon_min_p(6) == 0.03125
    for n in (5, 6):  # the floor is attained by scipy's exact test (every difference of one sign)
        assert scipy.stats.wilcoxon(np.arange(1.0, n + 1)).pvalue == pytest.approx(wilcoxon_min_p(n))


def test_min_detectable_effect_in_a_family_is_at_holms_first_step():
    assert min_detectable_effect_in_family(5, 1.0, 1) == pytest.approx(min_detectable_effect(5, 1.0))
    assert min_detectable_effect_in_family(5, 1.0, 10) == pytest.approx(min_detectable_effect(5, 1.0, 1 - 0.005))
    assert min_detectable_effect_in_family(5, 1.0, 10) > min_detectable_effect(5, 1.0)


# ------------------------------------------------------------------------------- families and Holm


def _holm_by_hand(ps):
    """Holm's step-down, written out (not testbed.reports.stats.holm)."""
    m, order = len(ps), sorted(range(len(ps)), key=lambda i: ps[i])
    out, running = [0.0] * m, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * ps[i]))
        out[i] = running
    return out


@pytest.mark.parametrize("low, high, p, sign, word", [
    (0.1, 0.3, 0.01, 1, SHOWN), (0.1, 0.3, 0.06, 1, INCONCLUSIVE), (0.1, 0.3, 0.01, -1, OPPOSITE),
    (-0.1, 0.3, 0.01, 1, INCONCLUSIVE), (0.1, 0.3, np.nan, 1, INCONCLUSIVE), (0.1, 0.3, 0.05, 1, INCONCLUSIVE)])
def test_decide_needs_the_adjusted_p_and_the_interval(low, high, p, sign, word):
    assert decide(p, low, high, sign) == word


pair_sets = st.lists(st.tuples(st.lists(st.floats(-1, 1, allow_nan=False), min_size=3, max_size=8),
                               st.floats(-0.5, 0.5, allow_nan=False), st.sampled_from(["a>b", "a<b"])),
                     min_size=1, max_size=8)


@given(pair_sets)
def test_a_report_never_says_shown_where_the_adjusted_rule_would_not(claims):
    """What a REPORT prints (a family filled into text) against Holm by hand on scipy's paired t: a claim is
    printed **shown** only if its Holm-adjusted p is below 0.05 and its interval is on the claimed side, and
    `testbed compare`'s verdict follows the same function."""
    from testbed.reports.compare import _verdict

    fam = Family("property")
    rows = []
    for b, shift, claimed in claims:
        a = [x + shift for x in b[::-1]]
        rows.append((a, b, claimed, fam.paired(a, b, claimed)))
    text = fill_all("\n".join(p.markdown() for *_, p in rows), [fam])
    raw = []
    for a, b, _, _ in rows:
        d = np.subtract(a, b)
        raw.append(1.0 if np.all(d == 0) else 0.0 if np.ptp(d) == 0 else scipy.stats.ttest_rel(a, b).pvalue)
    adjusted = _holm_by_hand(raw)
    for line, (a, b, claimed, p), q in zip(text.split("\n"), rows, adjusted):
        v = p.verdict
        assert v.p_adjusted == pytest.approx(q, rel=1e-9, abs=1e-12) and v.family_size == len(rows)
        sign = 1 if claimed == "a>b" else -1
        if line.startswith("**shown**"):
            assert q < 0.05 and (v.ci_low > 0 if sign > 0 else v.ci_high < 0)
        if q < 0.05 and (v.ci_low > 0 if sign > 0 else v.ci_high < 0):
            assert line.startswith("**shown**")
        result = paired(a, b)
        word = _verdict(result, v.p_adjusted, sign > 0, 0.95)
        assert (word == "a better") == (v.word == SHOWN)


def test_a_family_is_read_only_when_closed_and_a_stray_placeholder_is_refused():
    fam = Family("f")
    x = fam.paired([1.0, 2, 3], [0.0, 1.1, 1.9], "a>b")
    with pytest.raises(RuntimeError, match="still open"):
        _ = x.word
    with pytest.raises(ValueError, match="placeholder"):
        fill_all(x.markdown(), [])
    fam.close()
    with pytest.raises(RuntimeError, match="closed"):
        fam.paired([1.0, 2], [0.0, 1], "a>b")


def test_a_family_states_the_effect_it_can_detect_after_holm():
    fam = Family("power")
    fam.paired([1.0, 2, 3, 4, 5], [0.9, 2.1, 2.8, 4.2, 4.9], "a>b")
    fam.paired([1.0, 2, 3, 4, 5], [0.8, 1.7, 3.1, 3.9, 5.2], "a>b")
    fam.close()
    sds = [np.std([0.1, -0.1, 0.2, -0.2, 0.1], ddof=1), np.std([0.2, 0.3, -0.1, 0.1, -0.2], ddof=1)]
    expected = min_detectable_effect_in_family(5, float(np.median(sds)), 2)
    assert f"at n = 5: {expected:.3g} (median sd of the differences {np.median(sds):.3g})" in fam.description()


def test_seeds_for_an_effect_are_the_fewest_that_detect_it_after_holm():
    # sd 0.01, a family of 8: 0.01 needs the MDE at α/8 to reach one sd; n − 1 misses it.
    needed = seeds_for_effect(0.01, 0.01, 8)
    assert float(min_detectable_effect_in_family(needed, 0.01, 8)) <= 0.01
    assert float(min_detectable_effect_in_family(needed - 1, 0.01, 8)) > 0.01
    assert seeds_for_effect(-0.01, 0.01, 8) == needed  # a difference of either sign
    assert seeds_for_effect(0.01, 0.0, 8) == 2
    assert seeds_for_effect(1e-9, 1.0, 8) is None  # beyond stats.MOST_SEEDS
    with pytest.raises(ValueError, match="non-zero"):
        seeds_for_effect(0.0, 0.01, 8)


@given(sd=st.floats(1e-3, 1.0), ratio=st.floats(0.2, 5.0), m=st.integers(1, 30))
@settings(max_examples=30, deadline=None)
def test_seeds_for_an_effect_grow_as_the_effect_shrinks(sd: float, ratio: float, m: int):
    big, small = seeds_for_effect(ratio * sd, sd, m), seeds_for_effect(ratio * sd / 2, sd, m)
    assert big is not None and (small is None or small >= big)  # None: beyond stats.MOST_SEEDS


def test_a_family_with_an_effect_of_interest_says_when_it_is_underpowered():
    a = [1.0, 2, 3, 4, 5]
    fam = Family("underpowered", effect_of_interest=0.1)
    fam.paired(a, [0.9, 2.1, 2.8, 4.2, 4.9], "a>b")
    fam.close()
    power = fam.power()
    assert power is not None and power["seeds_needed"] > 5
    assert f"Seeds to detect 0.1 (the effect of interest) at 80 % power: {power['seeds_needed']}" in fam.description()
    assert "**underpowered** at n = 5" in fam.description()
    ample = Family("ample", effect_of_interest=1.0)
    ample.paired(a, [0.9, 2.1, 2.8, 4.2, 4.9], "a>b")
    ample.close()
    assert "underpowered" not in ample.description() and ample.power()["seeds_needed"] <= 5


def test_differences_whose_squares_underflow_are_not_a_constant_difference():
    """[1.6e-255, 0, 0] has a variance that underflows to 0 in double precision; it is not a constant
    difference (p 0, "shown") but the same t test as [1, 0, 0] (t is scale-free). Found by Hypothesis."""
    tiny, unit = paired([1.6e-255, 0.0, 0.0], [0.0, 0.0, 0.0]), paired([1.0, 0.0, 0.0], [0.0, 0.0, 0.0])
    assert tiny.p_t == pytest.approx(unit.p_t) and tiny.p_t > 0.05
    assert tiny.sd > 0 and tiny.ci_low < 0 < tiny.ci_high
    assert paired_verdict([1.6e-255, 0.0, 0.0], [0.0, 0.0, 0.0], "a>b").word == INCONCLUSIVE


@settings(max_examples=200, deadline=None)
@given(x=samples(min_size=2, max_size=12), power=st.integers(-1000, 1000))
def test_an_interval_scales_with_its_values_whatever_the_scale(x, power):
    """t_interval is scale-free: the values times 2^k (exact while they stay normal floats) give the
    interval times 2^k, where their squares underflow (a sweep's repeats 1e-200 apart) or overflow
    alike; a row that varies never gets a zero-width interval (found where sweep_stats.csv used it)."""
    assume(varied(x))
    scaled = np.ldexp(x, power)
    tiny = np.finfo(float).tiny
    assume(np.all(np.isfinite(scaled)) and np.all((scaled == 0) | (np.abs(scaled) >= tiny)))
    assume(np.array_equal(np.ldexp(scaled, -power), x))  # exact both ways
    base, s = t_interval(x), t_interval(scaled)
    assert float(s.sd) > 0 and float(s.ci_low) < float(s.ci_high)
    for got, want in ((s.mean, base.mean), (s.sd, base.sd), (s.ci_low, base.ci_low), (s.ci_high, base.ci_high)):
        assert float(np.ldexp(float(got), -power)) == pytest.approx(float(want), rel=1e-9, abs=1e-12 * float(base.sd))


def test_a_sweeps_intervals_keep_each_rows_own_scale():
    """Rows of one call are rescaled on their own: a row of tiny values beside an ordinary one."""
    s = t_interval([[1e-200, 2e-200, 3e-200], [1.0, 2.0, 3.0], [2.0, 2.0, 2.0]])
    assert s.sd.tolist() == pytest.approx([1e-200, 1.0, 0.0], rel=1e-12)
    assert s.ci_low[0] < 2e-200 < s.ci_high[0] and s.ci_low[2] == s.ci_high[2] == 2.0
