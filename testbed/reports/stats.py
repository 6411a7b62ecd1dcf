"""Statistics of repeated runs: intervals, paired tests, multiple-comparison correction, power.

Pure functions on arrays (no files, no config): the sweep's ``sweep_stats.csv``
(testbed.reports.sweep_stats), `testbed compare` (testbed.reports.compare) and the REPORT verdicts
(testbed.reports.verdicts) are built on them. Summaries run along the last axis, so one call summarises
every field (or every round) of a grid point at once. The formulas are in docs/statistics.md.

Example::

    >>> s = t_interval([[1.0, 2.0, 3.0], [2.0, 2.0, 2.0]])
    >>> s.mean.tolist(), s.sd.tolist()
    ([2.0, 2.0], [1.0, 0.0])
    >>> round(float(s.ci_high[0]), 4)  # 2 + t(0.975, 2) · 1/√3
    4.4841
    >>> holm([0.01, 0.04, 0.03]).round(2).tolist()
    [0.03, 0.06, 0.06]
"""

from __future__ import annotations

import warnings
from dataclasses import asdict, dataclass
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

#: The intervals' confidence level (two-sided), and the tests' α = 1 − CONFIDENCE.
CONFIDENCE = 0.95
#: The power at which :func:`min_detectable_effect` states the smallest detectable effect.
POWER = 0.8
#: Fewest values a BCa bootstrap interval is computed from: with two values a resample has only
#: three distinct means and the jackknife's acceleration is undefined.
BCA_MIN_N = 3
#: Bootstrap resamples (scipy's default), drawn from a fixed seed so that a sweep's statistics are
#: as reproducible as its runs.
BOOTSTRAP_RESAMPLES = 9999
BOOTSTRAP_SEED = 0
#: Fewest pairs from which a signed-rank p is shown beside the paired t: 2/2⁸ = 0.0078 leaves room
#: below α/m for a small family; at n = 5 no two-sided p can go below 0.0625 (issue 41).
RANK_TEST_MIN_N = 8
#: Fewest pairs of a Spearman interval: its Fisher z standard error divides by n − 3.
SPEARMAN_MIN_N = 4


@dataclass(frozen=True)
class Summary:
    """Mean, sample standard deviation (ddof 1) and Student t interval of each row: arrays of the
    input's shape without its last axis; sd and the interval are NaN where n < 2."""

    n: int
    mean: np.ndarray
    sd: np.ndarray
    ci_low: np.ndarray
    ci_high: np.ndarray


def t_interval(x: ArrayLike, confidence: float = CONFIDENCE) -> Summary:
    """Mean ± t(1 − α/2, n − 1) · sd/√n along the last axis of ``x`` (n = its length)."""
    from scipy.stats import t as student_t

    values = np.asarray(x, dtype=float)
    n = values.shape[-1]
    # A constant row's mean is its value and its sd 0 exactly (a sum rounds: 3·x/3 may miss x by an ulp).
    constant = np.all(values == values[..., :1], axis=-1)
    mean = np.where(constant, values[..., 0], values.mean(axis=-1))
    if n < 2:
        nan = np.full_like(mean, np.nan)
        return Summary(n, mean, nan, nan, nan)
    with np.errstate(over="ignore", under="ignore"):  # a row whose squares do not fit: below
        sd = np.where(constant, 0.0, values.std(axis=-1, ddof=1))
    # The sd does not change with the values' scale, but their squares can underflow (1e-255² is 0:
    # a zero-width interval around values that differ) or overflow: such rows on x / max|x|.
    lost = ~constant & np.all(np.isfinite(values), axis=-1) & ~(np.isfinite(sd) & (sd > 0))
    if np.any(lost):
        rows = values[lost] if values.ndim > 1 else values[None]
        scale = np.max(np.abs(rows), axis=-1, keepdims=True)
        sd, mean = np.array(sd, dtype=float), np.array(mean, dtype=float)
        sd[lost] = (rows / scale).std(axis=-1, ddof=1) * scale[:, 0]
        mean[lost] = (rows / scale).mean(axis=-1) * scale[:, 0]
    half = student_t.ppf(0.5 + confidence / 2, n - 1) * sd / np.sqrt(n)
    return Summary(n, mean, sd, mean - half, mean + half)


def bca_interval(x: ArrayLike, confidence: float = CONFIDENCE, n_resamples: int = BOOTSTRAP_RESAMPLES,
                 seed: int = BOOTSTRAP_SEED) -> tuple[np.ndarray, np.ndarray]:
    """BCa bootstrap interval of the mean along the last axis (scipy.stats.bootstrap, all rows in
    one vectorised call): (low, high). NaN where n < :data:`BCA_MIN_N` or a row holds a NaN; a
    constant row's interval is its value (every resample's mean is that value; scipy calls the
    distribution degenerate and returns NaN)."""
    from scipy.stats import bootstrap

    values = np.asarray(x, dtype=float)
    low = np.full(values.shape[:-1], np.nan)
    high = low.copy()
    if values.shape[-1] < BCA_MIN_N or values.size == 0:
        return low, high
    constant = np.all(values == values[..., :1], axis=-1)
    low[constant] = high[constant] = values[..., 0][constant]
    varied = ~constant & np.all(np.isfinite(values), axis=-1)
    if varied.any():
        with warnings.catch_warnings():  # a near-degenerate row's NaN is its answer, not a message
            warnings.simplefilter("ignore")
            result = bootstrap((values[varied],), np.mean, axis=-1, vectorized=True, method="BCa",
                               confidence_level=confidence, n_resamples=n_resamples,
                               rng=np.random.default_rng(seed))
        low[varied], high[varied] = result.confidence_interval
    return low, high


def holm(p_values: ArrayLike) -> np.ndarray:
    """Holm's step-down adjusted p-values (same order as given): the i-th smallest of m becomes
    max over j <= i of min(1, (m − j + 1) · p_(j)). Rejecting where the adjusted p < α keeps the
    family-wise error rate at α."""
    p = np.asarray(p_values, dtype=float)
    order = np.argsort(p, kind="stable")
    m = len(p)
    stepped = np.minimum(1.0, (m - np.arange(m)) * p[order])
    adjusted = np.empty(m)
    adjusted[order] = np.maximum.accumulate(stepped)
    return adjusted


def min_detectable_effect(n: int, sd: ArrayLike, confidence: float = CONFIDENCE, power: float = POWER) -> np.ndarray:
    """The smallest mean paired difference a two-sided paired t test of ``n`` pairs detects with
    probability ``power``: δ·sd/√n, where the noncentrality δ solves
    P(|T| > t(1 − α/2, n − 1)) = power for T noncentral t with n − 1 degrees of freedom."""
    from scipy.optimize import brentq
    from scipy.stats import nct
    from scipy.stats import t as student_t

    if n < 2:
        raise ValueError(f"a paired t test needs n >= 2 pairs, got {n}")
    df = n - 1
    critical = student_t.ppf(0.5 + confidence / 2, df)

    def shortfall(delta: float) -> float:
        # The lower tail (a significant result of the wrong sign) is below α/2; scipy's nct returns
        # NaN for it far from the centre, where it is 0 to double precision.
        return nct.sf(critical, df, delta) + np.nan_to_num(nct.cdf(-critical, df, delta)) - power

    high = critical + 3.0  # the normal approximation's δ at 80 % power is critical + 0.84: grow until past it
    while shortfall(high) < 0:
        high *= 2.0
    delta = brentq(shortfall, 0.0, high)
    return delta * np.asarray(sd, dtype=float) / np.sqrt(n)


@dataclass(frozen=True)
class PairedT:
    """The paired t test of d = a − b: n, the mean difference, its sd and Student t interval, and
    the two-sided p (what a REPORT's verdict needs; :func:`paired` adds the rank test and power)."""

    n: int
    mean: float
    sd: float
    ci_low: float
    ci_high: float
    p_t: float


@dataclass(frozen=True)
class Paired(PairedT):
    """:class:`PairedT` with the two-sided p of the Wilcoxon signed-rank test and the smallest
    effect these n pairs detect at :data:`POWER` (what `testbed compare` prints)."""

    p_wilcoxon: float
    min_detectable: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _differences(a: ArrayLike, b: ArrayLike) -> np.ndarray:
    xs, ys = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    if xs.ndim != 1 or xs.shape != ys.shape or len(xs) < 2:  # no broadcasting: a pair is a pair
        raise ValueError(f"a paired comparison needs two equal-length 1-d samples of n >= 2, "
                         f"got shapes {xs.shape} and {ys.shape}")
    d = xs - ys
    if not np.all(np.isfinite(d)):
        raise ValueError("a paired comparison needs finite values")
    return d


def paired_t(a: ArrayLike, b: ArrayLike, confidence: float = CONFIDENCE) -> PairedT:
    """The paired t test of samples ``a`` and ``b`` (equal length n >= 2, finite). Identical pairs
    (every difference zero) have p = 1; a constant non-zero difference p = 0."""
    from scipy.stats import ttest_1samp

    d = _differences(a, b)
    if np.all(d == d[0]):  # scipy returns NaN (0/0) or warns; the answer is known
        return PairedT(len(d), float(d[0]), 0.0, float(d[0]), float(d[0]), 1.0 if d[0] == 0.0 else 0.0)
    s = t_interval(d, confidence)  # its sd on d / max|d| where the squares underflow or overflow
    # p does not change with the differences' scale either; scipy squares them too: the same rescale.
    with np.errstate(over="ignore", under="ignore"):
        squares = float(np.sum(d * d))
    scale = 1.0 if np.isfinite(squares) and squares > 0.0 else float(np.max(np.abs(d)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scipy's precision-loss warning for nearly equal values
        p_t = float(ttest_1samp(d / scale, 0.0).pvalue)
    return PairedT(len(d), float(s.mean), float(s.sd), float(s.ci_low), float(s.ci_high), p_t)


def paired(a: ArrayLike, b: ArrayLike, confidence: float = CONFIDENCE, power: float = POWER) -> Paired:
    """:func:`paired_t`, with the Wilcoxon signed-rank p (1 where every difference is zero, 0 where
    they are one constant non-zero value) and the smallest effect n pairs detect at ``power``."""
    from scipy.stats import wilcoxon

    t = paired_t(a, b, confidence)
    d = _differences(a, b)
    if np.all(d == d[0]):
        p_w = t.p_t
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            p_w = float(wilcoxon(d).pvalue)
    return Paired(t.n, t.mean, t.sd, t.ci_low, t.ci_high, t.p_t, p_w,
                  float(min_detectable_effect(t.n, t.sd, confidence, power)))


@dataclass(frozen=True)
class Correlation:
    """Spearman's rank correlation ρ of n pairs with its Fisher z interval."""

    n: int
    rho: float
    ci_low: float
    ci_high: float


def spearman(x: ArrayLike, y: ArrayLike, confidence: float = CONFIDENCE) -> Correlation:
    """Spearman's ρ of (x, y) (ties get average ranks) and its interval
    tanh(atanh ρ ± z(1 − α/2) · √((1 + ρ²/2)/(n − 3))), the Bonett–Wright standard error. NaN when
    x or y is constant (no ranking to correlate)."""
    from scipy.stats import norm, spearmanr

    xs, ys = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if xs.ndim != 1 or xs.shape != ys.shape or len(xs) < SPEARMAN_MIN_N:
        raise ValueError(f"a rank correlation needs two equal-length 1-d samples of n >= {SPEARMAN_MIN_N}, "
                         f"got shapes {xs.shape} and {ys.shape}")
    if not (np.all(np.isfinite(xs)) and np.all(np.isfinite(ys))):
        raise ValueError("a rank correlation needs finite values")
    n = len(xs)
    if np.all(xs == xs[0]) or np.all(ys == ys[0]):
        return Correlation(n, np.nan, np.nan, np.nan)
    rho = float(spearmanr(xs, ys).statistic)
    # atanh(±1) is infinite: a perfect ranking's interval is taken at the largest finite z.
    z = np.arctanh(np.clip(rho, -1 + 1e-15, 1 - 1e-15))
    half = norm.ppf(0.5 + confidence / 2) * np.sqrt((1 + rho**2 / 2) / (n - 3))
    return Correlation(n, rho, float(np.tanh(z - half)), float(np.tanh(z + half)))


#: Up to this many units a rank correlation's p-value is exact: every one of the k! orderings is
#: enumerated (8! = 40,320 correlations of 8 numbers).
EXACT_PERMUTATION_MAX_K = 8


def spearman_p(x: ArrayLike, y: ArrayLike) -> float:
    """Two-sided p-value of Spearman's ρ of (x, y) being 0: exact for k <= :data:`EXACT_PERMUTATION_MAX_K`
    (the share of the k! pairings whose |ρ| reaches the observed |ρ|, ties kept as average ranks),
    scipy's t approximation above. 1 when x or y is constant (nothing to rank)."""
    from itertools import permutations

    from scipy.stats import rankdata, spearmanr

    xs, ys = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if np.all(xs == xs[0]) or np.all(ys == ys[0]):
        return 1.0
    k = len(xs)
    if k > EXACT_PERMUTATION_MAX_K:
        return float(spearmanr(xs, ys).pvalue)
    rx, ry = rankdata(xs), rankdata(ys)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    observed = abs(float(rx @ ry))
    every = np.array(list(permutations(range(k))))
    stats = np.abs(ry[every] @ rx)
    # the observed ordering is among them; a relative tolerance keeps rounding from dropping ties
    return float(np.mean(stats >= observed * (1 - 1e-12)))


def wilcoxon_min_p(n: int) -> float:
    """The smallest two-sided p-value an exact Wilcoxon signed-rank test of n pairs can give (every
    difference of one sign): 2 / 2ⁿ. Above α (n <= 5) the test cannot confirm anything."""
    if n < 1:
        raise ValueError(f"a signed-rank test needs n >= 1, got {n}")
    return min(1.0, 2.0 / 2.0**n)


def min_detectable_effect_in_family(n: int, sd: ArrayLike, family_size: int, confidence: float = CONFIDENCE,
                                    power: float = POWER) -> np.ndarray:
    """The smallest mean paired difference a two-sided paired t test of ``n`` pairs detects with
    ``power`` after Holm's correction over ``family_size`` comparisons, taken at Holm's first (strictest)
    step α/m: :func:`min_detectable_effect` at confidence 1 − α/m. What a folder whose pilot sd is ``sd``
    can see at its n."""
    if family_size < 1:
        raise ValueError(f"a family has at least one comparison, got {family_size}")
    alpha = (1.0 - confidence) / family_size
    return min_detectable_effect(n, sd, 1.0 - alpha, power)


#: Most seeds :func:`seeds_for_effect` looks at before saying an effect is out of reach.
MOST_SEEDS = 1000


def seeds_for_effect(effect: float, sd: float, family_size: int, confidence: float = CONFIDENCE,
                     power: float = POWER, most: int = MOST_SEEDS) -> int | None:
    """The fewest pairs n (>= 2) at which a paired t test, Holm-corrected over ``family_size``
    comparisons, detects a mean paired difference of ``effect`` with ``power``
    (:func:`min_detectable_effect_in_family` at n is at most |effect|), for differences of sd ``sd``
    (a pilot's); None if more than ``most`` pairs would be needed. Seeds by power, not by floor."""
    if not (np.isfinite(effect) and effect != 0):
        raise ValueError(f"the effect of interest must be a finite non-zero difference, got {effect}")
    if not (np.isfinite(sd) and sd >= 0):
        raise ValueError(f"sd must be finite and >= 0, got {sd}")
    if sd == 0:
        return 2

    def detects(n: int) -> bool:
        return float(min_detectable_effect_in_family(n, sd, family_size, confidence, power)) <= abs(effect)

    if not detects(most):
        return None
    low, high = 1, most  # detects(high) holds; the smallest n that detects lies in (low, high]
    while high - low > 1:  # the MDE falls monotonically with n
        mid = (low + high) // 2
        low, high = (low, mid) if detects(mid) else (mid, high)
    return max(high, 2)


@dataclass(frozen=True)
class ClusteredCorrelation:
    """A trend over runs that repeat their units, judged with the cluster (the seed) as the unit:
    Spearman's ρ within each cluster (its runs over the settings), the mean of those ρ over the
    clusters with its Student t interval (cut to [−1, 1]), and the two-sided p of the stratified
    permutation test (each cluster's settings permuted within it, independently)."""

    n: int
    clusters: int
    rho: float
    ci_low: float
    ci_high: float
    p: float
    per_cluster: tuple[float, ...]


def _rank_pearson_all_orders(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Spearman's ρ of x against every reordering of y (k! values, k <= EXACT_PERMUTATION_MAX_K)."""
    from itertools import permutations

    from scipy.stats import rankdata

    rx, ry = rankdata(x), rankdata(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    every = np.array(list(permutations(range(len(x)))))
    return (ry[every] @ rx) / np.sqrt((rx @ rx) * (ry @ ry))


#: Most distinct sums the exact stratified permutation distribution is built over (memory and time).
STRATIFIED_EXACT_MAX_SUPPORT = 2_000_000


def stratified_permutation_p_normal(strata: Sequence[tuple[np.ndarray, np.ndarray]], observed: float) -> float:
    """The normal approximation of :func:`stratified_permutation_p`: |Σρ| against N(0, Σ 1/(k − 1))."""
    from scipy.stats import norm

    z = observed / np.sqrt(sum(1.0 / (len(x) - 1) for x, _ in strata))
    return float(min(1.0, 2 * norm.sf(z)))


def stratified_permutation_p(xs: Sequence[np.ndarray], ys: Sequence[np.ndarray]) -> float:
    """Two-sided p of Σ_s ρ_s (ρ_s Spearman's within stratum s) under independent permutations of
    each stratum's y: exact (the strata's permutation distributions convolved) when every stratum
    has at most :data:`EXACT_PERMUTATION_MAX_K` values, otherwise the normal approximation with each
    stratum's exact permutation variance 1/(k − 1) (that of any correlation under permutation). A
    stratum with a constant side contributes 0 and no variance. The exact distribution is also left
    for the approximation when its support would pass :data:`STRATIFIED_EXACT_MAX_SUPPORT` sums."""
    from scipy.stats import spearmanr

    live = [(np.asarray(x, float), np.asarray(y, float)) for x, y in zip(xs, ys)
            if not (np.all(x == x[0]) or np.all(y == y[0]))]
    if not live:
        return 1.0
    observed = abs(sum(float(spearmanr(x, y).statistic) for x, y in live))
    if max(len(x) for x, _ in live) > EXACT_PERMUTATION_MAX_K:
        return stratified_permutation_p_normal(live, observed)
    sums, probs = np.zeros(1), np.ones(1)
    for x, y in live:
        values, counts = np.unique(np.round(_rank_pearson_all_orders(x, y), 12), return_counts=True)
        if len(sums) * len(values) > STRATIFIED_EXACT_MAX_SUPPORT:
            return stratified_permutation_p_normal(live, observed)
        merged = np.round((sums[:, None] + values[None, :]).ravel(), 12)
        weights = (probs[:, None] * (counts / counts.sum())[None, :]).ravel()
        sums, inverse = np.unique(merged, return_inverse=True)
        probs = np.bincount(inverse.ravel(), weights=weights)
    return float(min(1.0, probs[np.abs(sums) >= observed - 1e-7].sum()))


def within_cluster_spearman(x: ArrayLike, y: ArrayLike, cluster: Sequence[Any],
                            confidence: float = CONFIDENCE) -> ClusteredCorrelation:
    """Spearman's ρ of (x, y) within each cluster, summarised over the clusters. A cluster whose
    runs leave x or y constant ranks nothing and counts as ρ = 0 (no trend seen in it); a cluster
    of fewer than 2 runs is refused. Why not a bootstrap of whole seeds: with 5 or 10 seeds its
    percentile interval has far less than its nominal coverage (126 distinct resamples of 5)."""
    from scipy.stats import spearmanr

    xs, ys = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    labels = list(cluster)
    if xs.ndim != 1 or xs.shape != ys.shape or len(labels) != len(xs):
        raise ValueError("a clustered rank correlation needs x, y and cluster of one length")
    names = sorted(set(labels), key=str)
    rhos, strata = [], []
    for name in names:
        ix = [i for i, c in enumerate(labels) if c == name]
        if len(ix) < 2:
            raise ValueError(f"cluster {name!r} holds {len(ix)} run; a within-cluster trend needs 2 or more")
        cx, cy = xs[ix], ys[ix]
        strata.append((cx, cy))
        rhos.append(0.0 if np.all(cx == cx[0]) or np.all(cy == cy[0]) else float(spearmanr(cx, cy).statistic))
    if len(rhos) < 2:
        raise ValueError("a clustered rank correlation needs at least 2 clusters")
    s = t_interval(rhos, confidence)
    p = stratified_permutation_p([a for a, _ in strata], [b for _, b in strata])
    # ρ lies in [−1, 1]: the t interval of a mean of them is cut there (its side of zero is unchanged)
    low, high = max(-1.0, float(s.ci_low)), min(1.0, float(s.ci_high))
    return ClusteredCorrelation(len(xs), len(rhos), float(s.mean), low, high, p, tuple(rhos))


def majority_flag(accuracies: ArrayLike, majority_share: float, confidence: float = CONFIDENCE) -> str:
    """A table row's flag from the t interval of its accuracies and the test set's majority share (the
    accuracy of always answering the most common class): "" when the interval lies above the share,
    " ⚑ at majority" when it holds the share, " ⚑ below majority" when it lies below. A flagged row
    shows no learning: chance-level models are compared there, not trained ones."""
    s = t_interval(np.asarray(accuracies, dtype=float), confidence)
    low, high = float(s.ci_low), float(s.ci_high)
    if np.isnan(low):  # one value: its own interval
        low = high = float(s.mean)
    if low > majority_share:
        return ""
    return " ⚑ below majority" if high < majority_share else " ⚑ at majority"
