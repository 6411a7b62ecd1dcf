"""The verdict of a paper's claim in a REPORT, from repeated runs (docs/statistics.md).

The rule (:func:`decide`, the one `testbed compare` uses too): a claim is ``shown`` only when its
p-value, Holm-adjusted over the claim's family (the comparisons one figure or table makes), is below
α = 0.05 AND its 95 % interval excludes zero on the claimed side; ``opposite`` when the adjusted p is
below α and the interval excludes zero on the other side; ``inconclusive`` otherwise. A claim that
one setting beats another is judged on the paired differences (runs paired by seed: common random
numbers; paired t test); a trend over a property of its units (a graph, a design, a configuration)
on Spearman's rank correlation over those units, never over pooled runs that repeat a unit unless
the clusters the runs share their luck with (the seeds) are named. Every verdict carries n, the
effect, its interval, the raw and adjusted p and the family's size.

A REPORT section opens a :class:`Family`, adds its claims, closes it and fills the verdicts into
its text (a verdict's text is a placeholder until its family is closed: Holm needs every p first).

Example::

    >>> v = paired_verdict({0: 0.81, 1: 0.79, 2: 0.84}, {0: 0.75, 1: 0.74, 2: 0.80}, "a>b")
    >>> v.word, v.n
    ('shown', 3)
    >>> f = Family("Fig. 1")
    >>> x = f.paired([0.81, 0.79, 0.84], [0.75, 0.74, 0.80], "a>b")
    >>> y = f.paired([0.81, 0.79, 0.84], [0.80, 0.80, 0.80], "a>b")
    >>> _ = f.close(); x.word, y.word
    ('shown', 'inconclusive')
    >>> str(trend_verdict([1, 2, 3, 4, 5, 6], [0.9, 0.8, 0.7, 0.6, 0.5, 0.4], "increasing", units=range(6)))
    'opposite (n=6, Spearman ρ -1, 95% CI [-1, -1], p 0.0028)'
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Hashable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any, Literal

import numpy as np

from testbed.util import jsontext
from testbed.util.appendlog import write_atomic

from testbed.reports.stats import (CONFIDENCE, MOST_SEEDS, holm, min_detectable_effect_in_family, paired_t,
                                   seeds_for_effect, spearman, spearman_p, within_cluster_spearman)

SHOWN, OPPOSITE, INCONCLUSIVE = "shown", "opposite", "inconclusive"
#: A paired claim: mean(a) > mean(b) or mean(a) < mean(b).
PairedClaim = Literal["a>b", "a<b"]
#: A trend claim: the metric rises or falls with the setting.
TrendClaim = Literal["increasing", "decreasing"]


@dataclass(frozen=True)
class _Measured:
    """What the test of a claim measured: n pairs (or units, or seeds), the effect (mean paired
    difference a − b, or Spearman's ρ), its interval (unadjusted, at ``confidence``) and the test's
    two-sided p."""

    n: int
    effect: float
    ci_low: float
    ci_high: float
    effect_name: str
    p: float
    confidence: float


@dataclass(frozen=True)
class Verdict(_Measured):
    """A claim's verdict: what was measured (n, effect, interval, p), its word and its Holm-adjusted
    p within a family of ``family_size`` claims."""

    word: str
    p_adjusted: float
    family_size: int = 1

    def __str__(self) -> str:
        holm_note = f", Holm p {_p(self.p_adjusted)} of {self.family_size}" if self.family_size > 1 else ""
        return (f"{self.word} (n={self.n}, {self.effect_name} {_signed(self.effect)}, "
                f"{self.confidence:.0%} CI [{_signed(self.ci_low)}, {_signed(self.ci_high)}], p {_p(self.p)}{holm_note})")

    def markdown(self) -> str:
        """The verdict for a REPORT line: the word in bold, then n, the effect, its interval and p."""
        return f"**{self.word}**{str(self)[len(self.word):]}"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _signed(value: float) -> str:
    return f"{value:.4g}" if math.isnan(value) or value <= 0 else f"+{value:.4g}"


def _p(value: float) -> str:
    return f"{value:.2g}"


def judge(ci_low: float, ci_high: float, claimed_sign: int) -> str:
    """Where the interval lies: ``shown`` wholly on the claimed side of zero (``claimed_sign`` +1:
    above, −1: below), ``opposite`` wholly on the other, ``inconclusive`` when it holds zero or is
    undefined (NaN). Half of :func:`decide`."""
    if claimed_sign not in (1, -1):
        raise ValueError(f"claimed_sign must be +1 or -1, got {claimed_sign}")
    if ci_low > 0 or ci_high < 0:
        return SHOWN if (ci_low > 0) == (claimed_sign > 0) else OPPOSITE
    return INCONCLUSIVE


def decide(p_adjusted: float, ci_low: float, ci_high: float, claimed_sign: int,
           confidence: float = CONFIDENCE) -> str:
    """The rule of every verdict (REPORTs and `testbed compare`): the interval's side
    (:func:`judge`) counts only when the Holm-adjusted p is below α = 1 − confidence; otherwise
    ``inconclusive`` (a NaN p too)."""
    side = judge(ci_low, ci_high, claimed_sign)
    return side if p_adjusted < round(1.0 - confidence, 12) else INCONCLUSIVE  # 1 − 0.95 is 0.05 + 4e-17


# ------------------------------------------------------------------------------------ single claims


def paired_verdict(a: Sequence[float] | Mapping[Any, float], b: Sequence[float] | Mapping[Any, float],
                   claimed: PairedClaim, confidence: float = CONFIDENCE) -> Verdict:
    """The verdict of "a > b" (or "a < b") from paired runs as a family of one: sequences in pair
    order, or mappings seed → value, paired by seed (their seeds must be the same). The effect is
    mean(a − b), the test the paired t."""
    return _single(_paired_raw(a, b, claimed, confidence))


def trend_verdict(settings: Sequence[float], values: Sequence[float], claimed: TrendClaim, *,
                  units: Sequence[Hashable], cluster: Sequence[Hashable] | None = None,
                  confidence: float = CONFIDENCE) -> Verdict:
    """The verdict of "the metric rises (falls) with the setting" as a family of one.
    ``settings[i]`` is observation i's setting (a property of its unit ``units[i]``), ``values[i]``
    its metric. When every unit appears once the effect is Spearman's ρ over the units with its
    Fisher z interval and an exact permutation p (k <= 8 units). When units repeat (runs of one
    configuration over several seeds) the trend is refused unless ``cluster`` names what each run
    shares its luck with (its seed): then ρ within each seed, n and the interval over the seeds, and
    p from permuting the settings within each seed (testbed.reports.stats.within_cluster_spearman). Aggregate to the units (their means) for a unit-level trend."""
    return _single(_trend_raw(settings, values, claimed, units, cluster, confidence))


# ------------------------------------------------------------------------------------------ families


@dataclass(frozen=True)
class _Raw(_Measured):
    """A claim before its family is closed: what was measured and the claimed sign."""

    sign: int
    sd: float = math.nan  # of the paired differences (a paired claim)


def _paired_raw(a: Sequence[float] | Mapping[Any, float], b: Sequence[float] | Mapping[Any, float],
                claimed: str, confidence: float) -> _Raw:
    xs, ys = _pairs(a, b)
    if claimed not in ("a>b", "a<b"):
        raise ValueError(f"claimed must be 'a>b' or 'a<b', got {claimed!r}")
    r = paired_t(xs, ys, confidence)
    return _Raw(r.n, r.mean, r.ci_low, r.ci_high, "mean difference a−b", r.p_t, confidence,
                1 if claimed == "a>b" else -1, r.sd)


def _trend_raw(settings: Sequence[float], values: Sequence[float], claimed: str, units: Sequence[Hashable],
               cluster: Sequence[Hashable] | None, confidence: float) -> _Raw:
    if claimed not in ("increasing", "decreasing"):
        raise ValueError(f"claimed must be 'increasing' or 'decreasing', got {claimed!r}")
    xs, ys, unit_ids = list(settings), list(values), list(units)
    if not (len(xs) == len(ys) == len(unit_ids)):
        raise ValueError(f"a trend needs one setting, value and unit per observation, got {len(xs)}, {len(ys)}, "
                         f"{len(unit_ids)}")
    sign = 1 if claimed == "increasing" else -1
    repeated = len(set(unit_ids)) < len(unit_ids)
    if repeated and cluster is None:
        raise ValueError(f"a trend over {len(set(unit_ids))} units counts {len(unit_ids)} observations: the units "
                         "repeat; aggregate to one value per unit, or name each run's cluster (its seed)")
    if repeated:
        c = within_cluster_spearman(xs, ys, list(cluster), confidence)  # type: ignore[arg-type]
        return _Raw(c.clusters, c.rho, c.ci_low, c.ci_high, f"mean within-seed Spearman ρ over {c.n} runs", c.p,
                    confidence, sign)
    c = spearman(xs, ys, confidence)
    p = 1.0 if math.isnan(c.rho) else spearman_p(xs, ys)
    return _Raw(c.n, c.rho, c.ci_low, c.ci_high, "Spearman ρ", p, confidence, sign)


def _single(raw: _Raw) -> Verdict:
    return _adjusted(raw, raw.p, 1)


def _adjusted(raw: _Raw, p_adjusted: float, family_size: int) -> Verdict:
    word = decide(p_adjusted, raw.ci_low, raw.ci_high, raw.sign, raw.confidence)
    measured = {f.name: getattr(raw, f.name) for f in fields(_Measured)}
    return Verdict(**measured, word=word, p_adjusted=p_adjusted, family_size=family_size)


_FAMILY_IDS = itertools.count()


class Pending:
    """A claim of an open family: its text is a placeholder (``Family.fill`` replaces it) until the
    family is closed; its word and verdict exist only then."""

    def __init__(self, family: Family, index: int) -> None:
        self._family, self._index = family, index

    @property
    def verdict(self) -> Verdict:
        if self._family.verdicts is None:
            raise RuntimeError(f"family {self._family.name!r} is still open: close it before reading a verdict")
        return self._family.verdicts[self._index]

    @property
    def word(self) -> str:
        return self.verdict.word

    def markdown(self) -> str:
        if self._family.verdicts is None:
            return f"\x00{self._family.token}:{self._index}:md\x00"
        return self.verdict.markdown()

    def __str__(self) -> str:
        if self._family.verdicts is None:
            return f"\x00{self._family.token}:{self._index}:str\x00"
        return str(self.verdict)


class Family:
    """The claims one figure or table makes: their p-values are Holm-adjusted together when the
    family is closed, and each verdict then follows :func:`decide` on its adjusted p."""

    def __init__(self, name: str, confidence: float = CONFIDENCE, *, effect_of_interest: float | None = None) -> None:
        """``effect_of_interest``: the smallest mean paired difference (in the claims' unit) the family's
        claims are about; its description then says how many seeds detect it with 80 % power after Holm,
        from the sd of this run's differences (the pilot's, for the next run), and flags a run with fewer."""
        self.name, self.confidence = name, confidence
        self.effect_of_interest = effect_of_interest
        self.token = f"family{next(_FAMILY_IDS)}"
        self._raw: list[_Raw] = []
        self._inputs: list[dict[str, Any]] = []  # what a referee needs to recompute each claim
        self.verdicts: list[Verdict] | None = None
        for families in _RECORDINGS:
            families.append(self)

    def _add(self, raw: _Raw) -> Pending:
        if self.verdicts is not None:
            raise RuntimeError(f"family {self.name!r} is closed: its Holm correction is already done")
        self._raw.append(raw)
        return Pending(self, len(self._raw) - 1)

    def paired(self, a: Sequence[float] | Mapping[Any, float], b: Sequence[float] | Mapping[Any, float],
               claimed: PairedClaim) -> Pending:
        """Add the claim "a > b" (or "a < b") of paired runs (as :func:`paired_verdict`)."""
        xs, ys = _pairs(a, b)
        self._inputs.append({"kind": "paired", "claimed": claimed, "a": [float(x) for x in xs],
                             "b": [float(y) for y in ys]})
        return self._add(_paired_raw(a, b, claimed, self.confidence))

    def trend(self, settings: Sequence[float], values: Sequence[float], claimed: TrendClaim, *,
              units: Sequence[Hashable], cluster: Sequence[Hashable] | None = None) -> Pending:
        """Add a trend claim (as :func:`trend_verdict`, which says when it refuses repeated units)."""
        raw = _trend_raw(settings, values, claimed, units, cluster, self.confidence)
        self._inputs.append({"kind": "trend", "claimed": claimed, "x": [float(x) for x in settings],
                             "y": [float(y) for y in values], "units": [str(u) for u in units],
                             "cluster": None if cluster is None else [str(c) for c in cluster]})
        return self._add(raw)

    def __len__(self) -> int:
        return len(self._raw)

    def close(self) -> list[Verdict]:
        """Holm-adjust the family's p-values and judge every claim; the verdicts in order added."""
        if self.verdicts is None:
            ps = np.array([r.p for r in self._raw], dtype=float)
            adjusted = holm(np.nan_to_num(ps, nan=1.0)) if len(ps) else ps
            self.verdicts = [_adjusted(r, float(q), len(ps)) for r, q in zip(self._raw, adjusted)]
        return self.verdicts

    def fill(self, text: str) -> str:
        """``text`` with this family's placeholders replaced by its verdicts (closes the family)."""
        verdicts = self.close()
        for i, v in enumerate(verdicts):
            text = text.replace(f"\x00{self.token}:{i}:md\x00", v.markdown())
            text = text.replace(f"\x00{self.token}:{i}:str\x00", str(v))
        return text.replace(f"\x00{self.token}:desc\x00", self.description())

    def description(self) -> str:
        """What a REPORT prints of the family: its name and size (a placeholder until it is closed,
        so that it may be printed before the claims are added)."""
        if self.verdicts is None:
            return f"\x00{self.token}:desc\x00"
        m = len(self.verdicts)
        return f"Family \"{self.name}\": {m} claim{'s' if m != 1 else ''}, Holm-adjusted together.{self._power()}"

    def power(self) -> dict[str, Any] | None:
        """The family's power, from its paired claims (None without one whose differences vary): the
        smallest n among them, the median sd of their differences, the smallest mean paired difference
        detectable at that n with 80 % power after Holm (at its first, strictest step α/m) and, given an
        effect of interest, the seeds needed to detect it (None: more than stats.MOST_SEEDS)."""
        sds = [r.sd for r in self._raw if math.isfinite(r.sd) and r.sd > 0]
        if not sds:
            return None
        n = min(r.n for r in self._raw if math.isfinite(r.sd) and r.sd > 0)
        sd, m = float(np.median(sds)), len(self._raw)
        record: dict[str, Any] = {"n": n, "sd": sd, "family_size": m,
                                  "min_detectable": float(min_detectable_effect_in_family(n, sd, m, self.confidence))}
        if self.effect_of_interest is not None:
            record["effect_of_interest"] = float(self.effect_of_interest)
            record["seeds_needed"] = seeds_for_effect(self.effect_of_interest, sd, m, self.confidence)
        return record

    def _power(self) -> str:
        power = self.power()
        if power is None:
            return ""
        text = (f" Smallest mean paired difference detectable with 80 % power after Holm at n = {power['n']}: "
                f"{power['min_detectable']:.3g} (median sd of the differences {power['sd']:.3g}).")
        if "effect_of_interest" in power:
            effect, needed = power["effect_of_interest"], power["seeds_needed"]
            text += (f" Seeds to detect {effect:.3g} (the effect of interest) at 80 % power: "
                     f"{'more than ' + str(MOST_SEEDS) if needed is None else needed}")
            if needed is None or needed > power["n"]:
                text += (f"; **underpowered** at n = {power['n']}: an inconclusive verdict here is no evidence "
                         f"against an effect of {effect:.3g}.")
            else:
                text += "."
        return text


_RECORDINGS: list[list[Family]] = []


@contextmanager
def recording() -> Iterator[list[Family]]:
    """Collect every Family made inside the block (a REPORT's), for :func:`write_report`. Blocks nest:
    a family is recorded by every block open when it is made."""
    families: list[Family] = []
    _RECORDINGS.append(families)
    try:
        yield families
    finally:
        # by identity: a nested block's list may equal an outer one's (both empty, or the same families)
        _RECORDINGS[:] = [r for r in _RECORDINGS if r is not families]


def write_report(path: Path, text: str, families: Sequence[Family]) -> None:
    """Write a REPORT and, beside it (REPORT.md → REPORT.verdicts.json), every claim of its families with
    its inputs and verdict: what tests/test_referee.py recomputes with plain scipy. Each file is
    replaced whole (a reader sees the old one or the new, never half of one)."""
    record = []
    for f in families:
        verdicts = f.close()
        record.append({"family": f.name, "size": len(verdicts), "power": f.power(), "claims": [
            {**inputs, "word": v.word, "n": v.n, "effect": v.effect, "ci_low": v.ci_low, "ci_high": v.ci_high,
             "p": v.p, "p_adjusted": v.p_adjusted, "text": v.markdown()}
            for inputs, v in zip(f._inputs, verdicts)]})
    write_atomic(Path(path), text.encode(), sync=False)
    write_atomic(Path(path).with_suffix(".verdicts.json"), (
        jsontext.dumps(jsontext.finite(record), ensure_ascii=False, indent=None, separators=(",", ":")) + "\n").encode(),
        sync=False)


def fill_all(text: str, families: Sequence[Family]) -> str:
    """``text`` with every family's placeholders replaced; ValueError if one is left (a verdict of a
    family not in ``families``)."""
    for f in families:
        text = f.fill(text)
    if "\x00" in text:
        raise ValueError("a verdict's placeholder is left: its family was not filled")
    return text


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


#: The paragraph every REPORT prints about its verdicts (the rule, the families, the intervals).
RULE = ("**Verdicts** (testbed.reports.verdicts, docs/statistics.md). Each section declares its family: the claims "
        "its figure or table makes. A claim that one setting beats another is the paired t test over runs paired by "
        "seed (effect: mean paired difference a−b); a trend over a property of its units (a graph, a design, a "
        "configuration) is Spearman's ρ over the units (exact permutation p up to 8 units) or, where runs repeat a "
        "unit over the seeds, Spearman's ρ within each seed averaged over the seeds (n = seeds; t interval over them, p "
        "of the permutation test that permutes the settings within each seed, exact up to 8 settings). The p-values of a family are Holm-adjusted "
        "together. **shown**: the adjusted p is below 0.05 and the printed 95 % interval (unadjusted) excludes zero "
        "on the claimed side; **opposite**: the same on the other side; **inconclusive**: otherwise (no effect "
        "detected at this n, which is not an effect of zero). Each verdict prints n, the effect, its interval, the "
        "raw p and, in a family of more than one, the Holm-adjusted p and the family's size.")
