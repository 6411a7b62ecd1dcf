"""A referee's check of every REPORT's verdicts, written without the project's statistics module.

Each REPORT*.md under experiments/ is written together with REPORT*.verdicts.json (testbed.reports.
verdicts.write_report): every claim of every family with the numbers it was judged on (the paired
samples, or the trend's settings, values, units and clusters) and its verdict. Here each claim is
recomputed from those numbers with plain scipy (ttest_rel, spearmanr, the t and normal quantiles),
itertools' permutations and a hand-written Holm, the rule applied (shown only when the Holm-adjusted p
is below 0.05 and the 95 % interval lies on the claimed side), and compared with the record and with
the REPORT's text: a verdict printed in a REPORT that the referee would not give fails the test, and
so does a verdict in a REPORT that the record does not hold. (A family may hold claims the REPORT uses
in a sentence rather than prints, e.g. which runs learn: they count in its Holm correction.)

What this does not check: that the numbers recorded are the right ones taken from data/ (that each
generator read its data as it says); tests/test_reproductions.py checks that the REPORT and the record
regenerate byte for byte from the committed data.
"""

from __future__ import annotations

import json
import math
import re
from itertools import permutations
from pathlib import Path

import numpy as np
import pytest
import scipy.stats

ROOT = Path(__file__).resolve().parents[1]
REPORTS = sorted(ROOT.glob("experiments/*/REPORT*.md"))
ALPHA = 0.05
VERDICT_TEXT = re.compile(r"\*\*(?:shown|opposite|inconclusive)\*\* \(n=[^)]*\)")


def holm_by_hand(ps: list[float]) -> list[float]:
    m = len(ps)
    order = sorted(range(m), key=lambda i: ps[i])
    adjusted, running = [0.0] * m, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * ps[i]))
        adjusted[i] = running
    return adjusted


def paired_claim(a: list[float], b: list[float]) -> tuple[float, float, float, float]:
    """(mean difference, t interval low, high, two-sided p) with scipy's paired t."""
    a_, b_ = np.array(a), np.array(b)
    d = a_ - b_
    n = len(d)
    if np.all(d == d[0]):  # scipy's t is 0/0 here; the answer is known
        return float(d[0]), float(d[0]), float(d[0]), 1.0 if d[0] == 0 else 0.0
    mean, sd = d.mean(), d.std(ddof=1)
    half = scipy.stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n)
    return float(mean), float(mean - half), float(mean + half), float(scipy.stats.ttest_rel(a_, b_).pvalue)


def exact_spearman_p(x: np.ndarray, y: np.ndarray) -> float:
    rho = scipy.stats.spearmanr(x, y).statistic
    ry = scipy.stats.rankdata(y)
    rx = scipy.stats.rankdata(x)
    every = np.array(list(permutations(range(len(x)))))
    r = [np.corrcoef(rx, ry[order])[0, 1] for order in every]
    return float(np.mean(np.abs(r) >= abs(rho) - 1e-9))


def unit_trend(x: list[float], y: list[float]) -> tuple[float, float, float, float]:
    xs, ys = np.array(x), np.array(y)
    if np.all(xs == xs[0]) or np.all(ys == ys[0]):
        return math.nan, math.nan, math.nan, 1.0
    rho = float(scipy.stats.spearmanr(xs, ys).statistic)
    n = len(xs)
    z = math.atanh(min(max(rho, -1 + 1e-15), 1 - 1e-15))
    half = scipy.stats.norm.ppf(0.975) * math.sqrt((1 + rho**2 / 2) / (n - 3))
    p = exact_spearman_p(xs, ys) if n <= 8 else float(scipy.stats.spearmanr(xs, ys).pvalue)
    return rho, math.tanh(z - half), math.tanh(z + half), p


def within_seed_trend(x: list[float], y: list[float], cluster: list[str]) -> tuple[float, float, float, float]:
    """ρ within each seed, their mean and t interval over the seeds, and the p of permuting the settings
    within each seed: exact by enumerating each seed's orderings and convolving, or the normal limit."""
    rhos, strata = [], []
    for seed in sorted(set(cluster)):
        ix = [i for i, c in enumerate(cluster) if c == seed]
        cx, cy = np.array(x)[ix], np.array(y)[ix]
        if np.all(cx == cx[0]) or np.all(cy == cy[0]):
            rhos.append(0.0)
        else:
            rhos.append(float(scipy.stats.spearmanr(cx, cy).statistic))
            strata.append((cx, cy))
    r = np.array(rhos)
    mean = float(r.mean())
    if np.all(r == r[0]):
        low = high = float(r[0])
    else:
        half = scipy.stats.t.ppf(0.975, len(r) - 1) * r.std(ddof=1) / math.sqrt(len(r))
        low, high = max(-1.0, mean - half), min(1.0, mean + half)
    if not strata:
        return mean, low, high, 1.0
    observed = abs(sum(float(scipy.stats.spearmanr(a, b).statistic) for a, b in strata))
    exact = max(len(a) for a, _ in strata) <= 8
    distribution = {0.0: 1.0}
    for a, b in strata if exact else []:
        ra, rb = scipy.stats.rankdata(a), scipy.stats.rankdata(b)
        orders = np.array(list(permutations(range(len(a)))))
        shuffled = rb[orders] - rb.mean()  # every ordering's ranks at once: Pearson's r of ranks, by hand
        values = np.round(shuffled @ (ra - ra.mean()) / np.sqrt(((ra - ra.mean()) ** 2).sum() * (shuffled[0] ** 2).sum()), 10)
        step: dict[float, float] = {}
        for v in values.tolist():
            step[v] = step.get(v, 0.0) + 1 / len(values)
        # The method's cap (testbed.reports.stats.STRATIFIED_EXACT_MAX_SUPPORT): the normal limit
        # once the convolution's support could pass 2,000,000 sums, bounded by the product of the
        # supports, decided before the merge. (Checked after the merge, on the sums that came out,
        # the referee once spent a minute merging 4 million sums it then left for the limit too.)
        if len(distribution) * len(step) > 2_000_000:
            exact = False
            break
        merged: dict[float, float] = {}
        for s, ps in distribution.items():
            for v, pv in step.items():
                key = round(s + v, 10)
                merged[key] = merged.get(key, 0.0) + ps * pv
        distribution = merged
    if exact:
        p = sum(q for s, q in distribution.items() if abs(s) >= observed - 1e-7)
    else:
        p = 2 * scipy.stats.norm.sf(observed / math.sqrt(sum(1 / (len(a) - 1) for a, _ in strata)))
    return mean, low, high, min(1.0, p)


PRINTED_P = re.compile(r", p (?P<p>[0-9.e+-]+)(?:, Holm p (?P<holm>[0-9.e+-]+) of (?P<m>\d+))?\)$")


def two_digits_of(printed: float, value: float) -> bool:
    """Whether ``printed`` is ``value`` to two significant digits (either rounding of a tie)."""
    if value == 0:
        return printed == 0
    unit = 10 ** (math.floor(math.log10(abs(value))) - 1)
    return abs(printed - value) <= 0.5 * unit * (1 + 1e-6)


def rule(p_adjusted: float, low: float, high: float, claimed: str) -> str:
    if not p_adjusted < ALPHA or not (low > 0 or high < 0):
        return "inconclusive"
    up = claimed in ("a>b", "increasing")
    return "shown" if (low > 0) == up else "opposite"


def power_of_t(n: int, effect: float, sd: float, family_size: int) -> float:
    """The chance a two-sided paired t test of n pairs at α/m rejects when the mean difference is
    ``effect``: noncentral t with n − 1 degrees of freedom and noncentrality √n·effect/sd."""
    critical = scipy.stats.t.ppf(1 - ALPHA / family_size / 2, n - 1)
    shift = math.sqrt(n) * effect / sd
    return float(scipy.stats.nct.sf(critical, n - 1, shift) + np.nan_to_num(scipy.stats.nct.cdf(-critical, n - 1, shift)))


#: The most seeds the engine's power record looks at (testbed.reports.stats.MOST_SEEDS): a record's
#: "seeds needed" of None says more than this many.
MOST_SEEDS = 1000


def power_disagreements(family: dict) -> list[str]:
    """Where the family's power record (its n, the median sd of its paired differences, the smallest
    detectable difference and the seeds its effect of interest needs) is not what plain scipy gives."""
    varying = [c for c in family["claims"] if c["kind"] == "paired" and np.std(np.subtract(c["a"], c["b"])) > 0]
    power, name = family.get("power"), family["family"]
    if not varying:
        return [] if power is None else [f"{name}: a power record without a paired claim that varies"]
    if power is None:
        return [f"{name}: paired claims but no power record"]
    n = min(c["n"] for c in varying)
    sd = float(np.median([np.std(np.subtract(c["a"], c["b"]), ddof=1) for c in varying]))
    m = family["size"]
    wrong = []
    if power["n"] != n or not close(power["sd"], sd) or power["family_size"] != m:
        wrong.append(f"{name}: power record n {power['n']}, sd {power['sd']:.6g}; the referee's n {n}, sd {sd:.6g}")
    if not math.isclose(power_of_t(n, power["min_detectable"], sd, m), 0.8, abs_tol=1e-6):
        wrong.append(f"{name}: {power['min_detectable']:.6g} is not detected with 80 % power at n = {n}")
    if "effect_of_interest" in power:
        needed, effect = power["seeds_needed"], power["effect_of_interest"]
        if needed is None:  # "more than MOST_SEEDS": true only if that many seeds do not detect it
            if power_of_t(MOST_SEEDS, effect, sd, m) >= 0.8:
                wrong.append(f"{name}: {effect} is detected with 80 % power at {MOST_SEEDS} seeds, yet recorded as "
                             "needing more")
        elif needed < 2:
            wrong.append(f"{name}: seeds needed {needed} for {effect}")
        elif power_of_t(needed, effect, sd, m) < 0.8 or (needed > 2 and power_of_t(needed - 1, effect, sd, m) >= 0.8):
            wrong.append(f"{name}: {needed} is not the fewest seeds detecting {effect} with 80 % power")
    return wrong


def close(x: float, y: float | None, rel: float = 1e-6, abs_: float = 1e-12) -> bool:
    if y is None:
        return math.isnan(x)
    return math.isclose(x, y, rel_tol=rel, abs_tol=abs_)


@pytest.mark.parametrize("report", REPORTS, ids=lambda p: str(p.relative_to(ROOT / "experiments")))
def test_every_verdict_of_the_report_is_the_referees(report: Path) -> None:
    record_path = report.with_suffix(".verdicts.json")
    assert record_path.exists(), f"{report.name} has no {record_path.name}: regenerate it with its reproduce script"
    mismatches = referee(report.name, json.loads(record_path.read_text()), report.read_text())
    assert not mismatches, "\n".join(mismatches[:20])


def test_the_referee_catches_a_verdict_it_would_not_give_and_one_the_record_lacks() -> None:
    report = ROOT / "experiments" / "topologies" / "REPORT.md"
    families = json.loads(report.with_suffix(".verdicts.json").read_text())
    text = report.read_text()
    claim = next(c for f in families for c in f["claims"] if c["word"] == "inconclusive" and c["kind"] == "trend")
    tampered = claim["text"].replace("**inconclusive**", "**shown**")
    claim["word"], claim["text"] = "shown", tampered
    found = referee(report.name, families, text.replace(claim["text"].replace("**shown**", "**inconclusive**"),
                                                        tampered))
    assert any("the referee says inconclusive" in m for m in found)
    assert referee(report.name, [], text)  # every printed verdict unrecorded


def referee(name: str, families: list[dict], text: str) -> list[str]:
    """What the referee disagrees with in a REPORT's text and its record, one line each."""
    recorded_texts = set()
    mismatches = []
    for family in families:
        claims = family["claims"]
        if family["size"] != len(claims):
            mismatches.append(f"{family['family']}: size {family['size']} but {len(claims)} claims")
        computed = []
        for c in claims:
            if c["kind"] == "paired":
                computed.append(paired_claim(c["a"], c["b"]))
            elif c["cluster"] is None:
                if len(set(c["units"])) != len(c["units"]):
                    mismatches.append(f"{family['family']}: a pooled trend repeats its units")
                computed.append(unit_trend(c["x"], c["y"]))
            else:
                computed.append(within_seed_trend(c["x"], c["y"], c["cluster"]))
        adjusted = holm_by_hand([p for *_, p in computed])
        for c, (effect, low, high, p), q in zip(claims, computed, adjusted):
            word = rule(q, low, high, c["claimed"])
            where = f"{family['family']}: {c['text']}"
            if word != c["word"]:
                mismatches.append(f"{where}: the referee says {word}")
            if not (close(p, c["p"], 1e-6, 1e-15) and close(q, c["p_adjusted"], 1e-6, 1e-15)
                    and close(effect, c["effect"]) and close(low, c["ci_low"], 1e-6, 1e-9)
                    and close(high, c["ci_high"], 1e-6, 1e-9)):
                mismatches.append(f"{where}: the referee computes effect {effect:.6g} [{low:.6g}, {high:.6g}], "
                                  f"p {p:.6g}, Holm p {q:.6g}")
            printed = PRINTED_P.search(c["text"])
            if (printed is None or not two_digits_of(float(printed["p"]), p)
                    or (len(claims) > 1) != (printed["holm"] is not None)
                    or (printed["holm"] is not None and (not two_digits_of(float(printed["holm"]), q)
                                                         or int(printed["m"]) != len(claims)))):
                mismatches.append(f"{where}: prints other p-values than the referee's p {p:.3g}, Holm p {q:.3g} of "
                                  f"{len(claims)}")
            recorded_texts.add(c["text"])
        mismatches += power_disagreements(family)
    unrecorded = [v for v in VERDICT_TEXT.findall(text) if v not in recorded_texts]
    return mismatches + [f"{name} prints a verdict no record holds: {v}" for v in unrecorded]
