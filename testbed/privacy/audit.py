"""An empirical lower bound on ε from one training run (Steinke, Nasr and Jagielski 2023, "Privacy
auditing with one (1) training run", NeurIPS 2023; arXiv 2305.08846): pure arithmetic on canary
scores, no training here (testbed.privacy.canaries inserts the canaries and scores them).

The game (their Algorithm 1): m canaries, each "in" (S_i = +1) or "out" (S_i = −1) by a fair coin
the mechanism keeps secret; the auditor sees the run's releases and guesses T_i ∈ {+1, −1, 0}
(0: abstain), here "in" for the k₊ highest scores and "out" for the k₋ lowest. Theorem 3.1: if the
mechanism is (ε, δ)-DP in each S_i, the number W of correct guesses among r = k₊ + k₋ satisfies,
for every v,

    P[W ≥ v] ≤ f(v) + 2 m δ · max_{i = 1..m} (f(v − i) − f(v)) / i,
    f(v) = P[Binomial(r, e^ε / (1 + e^ε)) ≥ v],

so W correct guesses refute (ε, δ)-DP at level β when that bound is below β. The lower bound is the
largest ε so refuted at β = 1 − confidence (their Appendix D searches it by bisection; so does
:func:`epsilon_lower_bound`, on the bound written out here). f(v − i) − f(v) = P[v − i ≤ W' < v]
stops growing at i = v, so the max runs over i ≤ v.

Where one run is too weak (a δ with 2mδ near 1: δ = 0.01 leaves nothing to refute past a few dozen
canaries), :func:`membership_lower_bound` is the membership test of Jagielski, Ullman and Oprea 2020
("Auditing differentially private machine learning: how private is private SGD?", NeurIPS 2020,
§4): over independent trials, each a canary in or out and a guess by a rule fixed beforehand, an
(ε, δ)-DP mechanism has 1 − FNR ≤ e^ε FPR + δ and 1 − FPR ≤ e^ε FNR + δ, so with Clopper–Pearson
upper bounds on FPR and FNR (each at β/2),
ε ≥ max(ln((1 − δ − FNR⁺) / FPR⁺), ln((1 − δ − FPR⁺) / FNR⁺)).

How many guesses to make is the auditor's choice; choosing it after seeing the scores is a multiple
test. :func:`audit` tries a fixed list of guess counts (halving from all m) at β divided by their
number (Bonferroni), so the bound it reports holds at the stated confidence whichever count wins.

Example::

    >>> round(epsilon_lower_bound(canaries=1000, guesses=100, correct=100, delta=0.0, confidence=0.95), 4)
    3.493
    >>> p_value(canaries=1000, guesses=100, correct=100, epsilon=3.0, delta=0.0) < 0.05
    True
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from scipy import stats

#: Bisection stops when the bracket of ε is this narrow; the lower end is returned (conservative).
EPSILON_TOLERANCE = 1e-6
#: The search's ceiling: past it e^ε/(1 + e^ε) is 1 in float64 and no count of guesses refutes more.
EPSILON_CEILING = 36.0


def _checked_counts(canaries: int, guesses: int, correct: int) -> None:
    if not (0 <= correct <= guesses <= canaries):
        raise ValueError(f"need 0 <= correct <= guesses <= canaries, got {correct}, {guesses}, {canaries}")


def p_value(*, canaries: int, guesses: int, correct: int, epsilon: float, delta: float) -> float:
    """Theorem 3.1's bound on P[W ≥ ``correct``] for an (ε, δ)-DP mechanism with ``canaries`` (m)
    coins and ``guesses`` (r) non-abstaining guesses; capped at 1.

    Raises:
        ValueError: counts out of order, ε < 0 or δ outside [0, 1].
    """
    _checked_counts(canaries, guesses, correct)
    if not (epsilon >= 0 and 0.0 <= delta <= 1.0):
        raise ValueError(f"need epsilon >= 0 and 0 <= delta <= 1, got {epsilon}, {delta}")
    q = 1.0 / (1.0 + math.exp(-epsilon))  # e^ε / (1 + e^ε): ε-DP randomised response's accuracy
    tail = float(stats.binom.sf(correct - 1, guesses, q))  # f(v) = P[W' ≥ v]
    if delta == 0.0 or correct == 0:
        return min(tail, 1.0)
    # (f(v − i) − f(v)) / i for i = 1..v: the pmf of W' at v − 1, v − 2, ..., 0, summed in turn.
    below = np.cumsum(stats.binom.pmf(np.arange(correct - 1, -1, -1), guesses, q))
    slope = float(np.max(below / np.arange(1, correct + 1)))
    return min(tail + 2.0 * canaries * delta * slope, 1.0)


def epsilon_lower_bound(*, canaries: int, guesses: int, correct: int, delta: float, confidence: float) -> float:
    """The largest ε whose Theorem 3.1 bound on ``correct`` of ``guesses`` correct is below
    1 − ``confidence``, within :data:`EPSILON_TOLERANCE` from below; 0 when not even ε = 0 is refuted.

    The bound grows with ε (a larger ε allows more correct guesses), so bisection finds the edge.

    Raises:
        ValueError: counts out of order, δ outside [0, 1], confidence outside (0, 1).
    """
    _checked_counts(canaries, guesses, correct)
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    beta = 1.0 - confidence

    def refuted(eps: float) -> bool:
        return p_value(canaries=canaries, guesses=guesses, correct=correct, epsilon=eps, delta=delta) < beta

    if not refuted(0.0):
        return 0.0
    lo, hi = 0.0, EPSILON_CEILING
    if refuted(hi):
        return hi
    while hi - lo > EPSILON_TOLERANCE:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if refuted(mid) else (lo, mid)
    return lo


@dataclass(frozen=True)
class AuditResult:
    """One audit's figures.

    Attributes:
        epsilon: the lower bound ε̂ at ``confidence`` (the mechanism is not (ε̂, δ)-DP).
        confidence: its level, after the Bonferroni correction over ``guess_counts_tried``.
        delta: the δ of the null hypothesis (the run's).
        canaries: m, the coins drawn.
        guesses: r = k₊ + k₋ of the winning guess count.
        guessed_in, guessed_out: k₊ and k₋.
        correct: W of the winning guess count.
        guess_counts_tried: the guess counts tried.
    """

    epsilon: float
    confidence: float
    delta: float
    canaries: int
    guesses: int
    guessed_in: int
    guessed_out: int
    correct: int
    guess_counts_tried: tuple[int, ...]


def guess_counts(canaries: int) -> tuple[int, ...]:
    """The guess counts :func:`audit` tries, fixed before any score is seen: m, m/2, m/4, ... down to
    2 (each split evenly between "in" and "out")."""
    counts, r = [], canaries
    while r >= 2:
        counts.append(r)
        r //= 2
    return tuple(counts) or (canaries,)


def correct_guesses(scores: np.ndarray, members: np.ndarray, guessed_in: int, guessed_out: int) -> int:
    """How many of the guesses "in" for the ``guessed_in`` highest scores and "out" for the
    ``guessed_out`` lowest are right (``members``: True for a canary that was in). Ties are broken by
    position (a stable sort), never by membership."""
    order = np.argsort(scores, kind="stable")
    low, high = order[:guessed_out], order[len(order) - guessed_in:] if guessed_in else order[:0]
    return int(np.count_nonzero(members[high]) + np.count_nonzero(~members[low]))


def audit(scores: Sequence[float] | np.ndarray, members: Sequence[bool] | np.ndarray, *, delta: float,
          confidence: float = 0.95, counts: Sequence[int] | None = None) -> AuditResult:
    """The lower bound on ε from canary ``scores`` (higher: more likely in) and the secret
    ``members``: the best over guess ``counts`` (default :func:`guess_counts`), each at
    β = (1 − confidence) / len(counts).

    Raises:
        ValueError: scores and members of different lengths, a non-finite score, no canary, a count
            outside [1, m], δ or confidence out of range.
    """
    s = np.asarray(scores, dtype=np.float64).ravel()
    b = np.asarray(members, dtype=bool).ravel()
    if s.shape != b.shape:
        raise ValueError(f"{s.size} scores for {b.size} canaries")
    if not s.size:
        raise ValueError("no canary to audit")
    if not np.isfinite(s).all():
        raise ValueError("a canary's score is not finite")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    m = s.size
    tried = tuple(int(c) for c in (counts if counts is not None else guess_counts(m)))
    if not tried or any(not 1 <= c <= m for c in tried):
        raise ValueError(f"guess counts must be in [1, {m}], got {tried}")
    corrected = 1.0 - (1.0 - confidence) / len(tried)
    best: AuditResult | None = None
    for r in tried:
        k_in = r // 2 + r % 2
        k_out = r - k_in
        v = correct_guesses(s, b, k_in, k_out)
        eps = epsilon_lower_bound(canaries=m, guesses=r, correct=v, delta=delta, confidence=corrected)
        if best is None or eps > best.epsilon:
            best = AuditResult(eps, confidence, delta, m, r, k_in, k_out, v, tried)
    assert best is not None
    return best


def clopper_pearson_upper(successes: int, trials: int, beta: float) -> float:
    """The one-sided Clopper–Pearson upper bound on a binomial rate at level ``beta`` (P[rate > it] <= beta)."""
    if not 0 <= successes <= trials or trials < 1:
        raise ValueError(f"need 0 <= successes <= trials, trials >= 1, got {successes}, {trials}")
    if successes == trials:
        return 1.0
    return float(stats.beta.ppf(1.0 - beta, successes + 1, trials - successes))


@dataclass(frozen=True)
class MembershipResult:
    """The membership test's figures (:func:`membership_lower_bound`).

    Attributes:
        epsilon: the lower bound at ``confidence``.
        confidence, delta: its level and the null hypothesis's δ.
        trials_in, flagged_in: trials with the canary in, and how many the rule flagged "in".
        trials_out, flagged_out: trials with it out, and how many were flagged "in" (false positives).
    """

    epsilon: float
    confidence: float
    delta: float
    trials_in: int
    flagged_in: int
    trials_out: int
    flagged_out: int


def membership_lower_bound(*, trials_in: int, flagged_in: int, trials_out: int, flagged_out: int, delta: float,
                           confidence: float) -> MembershipResult:
    """Jagielski et al. 2020's lower bound from independent trials: the false negative rate
    FNR = 1 − flagged_in/trials_in and the false positive rate FPR = flagged_out/trials_out, each
    bounded above by Clopper–Pearson at β/2 (β = 1 − confidence; a union bound over the two), and
    ε ≥ max(ln((1 − δ − FNR⁺)/FPR⁺), ln((1 − δ − FPR⁺)/FNR⁺)), 0 when neither is positive.

    Raises:
        ValueError: counts out of range, δ outside [0, 1), confidence outside (0, 1).
    """
    if not (0 <= flagged_in <= trials_in and 0 <= flagged_out <= trials_out and trials_in >= 1 and trials_out >= 1):
        raise ValueError(f"need 0 <= flagged <= trials and trials >= 1 in and out, got {flagged_in}/{trials_in}, "
                         f"{flagged_out}/{trials_out}")
    if not (0.0 <= delta < 1.0 and 0.0 < confidence < 1.0):
        raise ValueError(f"need 0 <= delta < 1 and 0 < confidence < 1, got {delta}, {confidence}")
    half = (1.0 - confidence) / 2.0
    fnr = clopper_pearson_upper(trials_in - flagged_in, trials_in, half)
    fpr = clopper_pearson_upper(flagged_out, trials_out, half)
    best = 0.0
    for gain, cost in ((1.0 - delta - fnr, fpr), (1.0 - delta - fpr, fnr)):
        if gain > 0 and cost > 0:
            best = max(best, math.log(gain / cost))
    return MembershipResult(best, confidence, delta, trials_in, flagged_in, trials_out, flagged_out)
