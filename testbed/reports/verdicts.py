"""The verdict of a paper's claim in a REPORT, from repeated runs (docs/statistics.md).

The rule: a claim is ``shown`` only when its interval excludes zero in the claimed direction,
``opposite`` when it excludes zero the other way, ``inconclusive`` otherwise. A claim that one
setting beats another is judged on the paired differences (runs paired by seed: common random
numbers); a trend over several settings on Spearman's rank correlation of the metric with the
setting, never by counting steps. Every verdict carries n, the effect and its interval.

From a sweep's rows (testbed.orchestration.sweep.run_sweep's, or sweep.csv's), testbed.reports.compare.values_by_seed
gives the mappings seed → value that :func:`paired_verdict` pairs.

Example::

    >>> v = paired_verdict({0: 0.81, 1: 0.79, 2: 0.84}, {0: 0.75, 1: 0.74, 2: 0.80}, "a>b")
    >>> v.word, v.n
    ('shown', 3)
    >>> str(trend_verdict([1, 2, 3, 4, 5, 6], [0.9, 0.8, 0.7, 0.6, 0.5, 0.4], "increasing"))
    'opposite (n=6, Spearman ρ -1, 95% CI [-1, -1])'
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from testbed.reports.stats import CONFIDENCE, paired, spearman

SHOWN, OPPOSITE, INCONCLUSIVE = "shown", "opposite", "inconclusive"
#: A paired claim: mean(a) > mean(b) or mean(a) < mean(b).
PairedClaim = Literal["a>b", "a<b"]
#: A trend claim: the metric rises or falls with the setting.
TrendClaim = Literal["increasing", "decreasing"]


@dataclass(frozen=True)
class Verdict:
    """A claim's verdict: its word, the number of pairs (or runs) n, the effect (mean paired
    difference a − b, or Spearman's ρ) and its interval."""

    word: str
    n: int
    effect: float
    ci_low: float
    ci_high: float
    effect_name: str
    confidence: float = CONFIDENCE

    def __str__(self) -> str:
        return (f"{self.word} (n={self.n}, {self.effect_name} {_signed(self.effect)}, "
                f"{self.confidence:.0%} CI [{_signed(self.ci_low)}, {_signed(self.ci_high)}])")

    def markdown(self) -> str:
        """The verdict for a REPORT line: the word in bold, then n, the effect and its interval."""
        return f"**{self.word}**{str(self)[len(self.word):]}"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _signed(value: float) -> str:
    return f"{value:.4g}" if math.isnan(value) or value <= 0 else f"+{value:.4g}"


def judge(ci_low: float, ci_high: float, claimed_sign: int) -> str:
    """The rule: ``shown`` when the interval lies wholly on the claimed side of zero (``claimed_sign``
    +1: above, −1: below), ``opposite`` when wholly on the other, ``inconclusive`` when it holds
    zero or is undefined (NaN)."""
    if claimed_sign not in (1, -1):
        raise ValueError(f"claimed_sign must be +1 or -1, got {claimed_sign}")
    if ci_low > 0 or ci_high < 0:
        return SHOWN if (ci_low > 0) == (claimed_sign > 0) else OPPOSITE
    return INCONCLUSIVE


def paired_verdict(a: Sequence[float] | Mapping[Any, float], b: Sequence[float] | Mapping[Any, float],
                   claimed: PairedClaim, confidence: float = CONFIDENCE) -> Verdict:
    """The verdict of "a > b" (or "a < b") from paired runs: sequences in pair order, or mappings
    seed → value, paired by seed (their seeds must be the same). The effect is mean(a − b)."""
    xs, ys = _pairs(a, b)
    if claimed not in ("a>b", "a<b"):
        raise ValueError(f"claimed must be 'a>b' or 'a<b', got {claimed!r}")
    result = paired(xs, ys, confidence)
    word = judge(result.ci_low, result.ci_high, 1 if claimed == "a>b" else -1)
    return Verdict(word, result.n, result.mean, result.ci_low, result.ci_high, "mean difference a−b", confidence)


def trend_verdict(settings: Sequence[float], values: Sequence[float], claimed: TrendClaim,
                  confidence: float = CONFIDENCE) -> Verdict:
    """The verdict of "the metric rises (falls) with the setting" from every run: ``settings[i]`` is
    run i's setting, ``values[i]`` its metric (repeats of a setting are separate runs). The effect is
    Spearman's ρ with its Fisher z interval (testbed.reports.stats.spearman); n is the number of runs."""
    if claimed not in ("increasing", "decreasing"):
        raise ValueError(f"claimed must be 'increasing' or 'decreasing', got {claimed!r}")
    c = spearman(settings, values, confidence)
    word = judge(c.ci_low, c.ci_high, 1 if claimed == "increasing" else -1)
    return Verdict(word, c.n, c.rho, c.ci_low, c.ci_high, "Spearman ρ", confidence)


def _pairs(a: Sequence[float] | Mapping[Any, float], b: Sequence[float] | Mapping[Any, float]) -> tuple[list, list]:
    """(a, b) as two lists in pair order; mappings are paired by key and must share their keys."""
    if isinstance(a, Mapping) != isinstance(b, Mapping):
        raise ValueError("a and b must both be sequences or both mappings seed → value")
    if isinstance(a, Mapping):
        if set(a) != set(b):
            raise ValueError(f"unpaired seeds: {sorted(set(a) ^ set(b), key=str)} are in one sample only")
        keys = sorted(a, key=str)
        return [a[k] for k in keys], [b[k] for k in keys]
    if len(a) != len(b):
        raise ValueError(f"paired samples of different lengths: {len(a)} and {len(b)}")
    return list(a), list(b)
