"""Paired comparisons of a sweep's grid points: `testbed compare SWEEP_DIR --a K=V... --b K=V...`.

Runs of two settings with the same seed share their data, partition, initial model and random
streams wherever the settings allow (common random numbers, docs/statistics.md), so they are
compared pair by pair: the mean of the per-seed differences a − b, its Student t interval, the
paired t and Wilcoxon signed-rank p-values, and the smallest effect these n pairs could detect at
80 % power. Several comparisons in one call (several ``b``, several metrics) are one family:
their p-values are Holm-corrected, and the verdict (``a better``, ``b better`` or ``no difference
detected (n=..)``) is taken from the paired t test's corrected p-value.

Example (``folder`` holds a sweep over dp_pasgd.tau with --repeats 5)::

    >>> [c.verdict for c in compare(folder, {"dp_pasgd.tau": 1}, [{"dp_pasgd.tau": 5}])]  # doctest: +SKIP
    ['a better']
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed.checked.limits import MAX_FLOAT
from testbed.errors import UserError
from testbed.reports.results import FINISHED
from testbed.reports.stats import CONFIDENCE, RANK_TEST_MIN_N, Paired, holm, paired, wilcoxon_min_p
from testbed.reports.sweep_stats import grid_keys, number, numeric_fields, read_sweep, value
from testbed.reports.verdicts import OPPOSITE, SHOWN, decide
from testbed.util import jsontext

#: Which way is better, per metric of sweep.csv: True when higher is better. A metric not here
#: (rounds, tau, sigma...) needs --higher-is-better or --lower-is-better.
HIGHER_IS_BETTER = {
    "test_accuracy": True,
    "validation_accuracy": True,
    "train_loss": False,
    "epsilon_max": False,
    "cost_max": False,
    "energy_j_max": False,
}
DEFAULT_METRIC = "test_accuracy"
#: The values a metric of sweep.csv can take (a value outside is no result of a run: a damaged or
#: forged table): shares in [0, 1], the other known figures non-negative. Any metric is also finite
#: and within ±MAX_FLOAT.
RANGES = {"test_accuracy": (0.0, 1.0), "validation_accuracy": (0.0, 1.0), "train_loss": (0.0, MAX_FLOAT),
          "epsilon_max": (0.0, MAX_FLOAT), "cost_max": (0.0, MAX_FLOAT), "energy_j_max": (0.0, MAX_FLOAT),
          "rounds": (0.0, MAX_FLOAT), "tau": (0.0, MAX_FLOAT), "steps": (0.0, MAX_FLOAT), "sigma": (0.0, MAX_FLOAT)}


@dataclass(frozen=True)
class Comparison:
    """One comparison: the metric, the two settings, the seeds paired, the paired statistics of
    a − b, the Holm-corrected p-values of its family and the verdict."""

    metric: str
    higher_is_better: bool
    a: dict[str, Any]
    b: dict[str, Any]
    seeds: tuple[int, ...]
    result: Paired
    p_t_holm: float
    p_wilcoxon_holm: float
    verdict: str

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (what `testbed compare --json` prints, one per comparison)."""
        return {"metric": self.metric, "higher_is_better": self.higher_is_better, "a": self.a, "b": self.b,
                "seeds": list(self.seeds), **{k: _json_number(v) for k, v in self.result.as_dict().items()},
                "p_t_holm": self.p_t_holm, "p_wilcoxon_holm": self.p_wilcoxon_holm, "verdict": self.verdict}


def parse_setting(items: Sequence[str], option: str) -> dict[str, Any]:
    """``["dp_pasgd.tau=5", "lr=0.1"]`` → {"dp_pasgd.tau": 5, "lr": 0.1} (values as sweep_stats.value
    reads a cell). UserError naming ``option`` for an item without "=" or a key given twice."""
    setting: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key.strip():
            raise UserError(f"{option} {item!r}: expected KEY=VALUE")
        if key.strip() in setting:
            raise UserError(f"{option} {key.strip()}: given twice")
        setting[key.strip()] = value(text.strip())
    return setting


def compare(sweep_dir: Path, a: Mapping[str, Any], b: Mapping[str, Any] | Sequence[Mapping[str, Any]],
            metrics: Sequence[str] = (DEFAULT_METRIC,), higher_is_better: bool | None = None,
            confidence: float = CONFIDENCE) -> list[Comparison]:
    """Compare setting ``a`` with each setting of ``b`` on each metric, over the runs of the sweep
    folder ``sweep_dir`` paired by seed; one Holm family for all of them.

    Args:
        sweep_dir: a folder of `testbed sweep` (its sweep.csv).
        a, b: grid key → value (a key may be written without its section when that is unambiguous);
            together they must pick one run per seed.
        metrics: numeric columns of sweep.csv.
        higher_is_better: which way is better for every metric; None: HIGHER_IS_BETTER's.
        confidence: of the intervals; the tests' α is 1 − confidence.

    Raises:
        UserError: in one line: no sweep table, an unknown key or metric, no run matching a setting,
        a setting matching several runs of one seed, seeds that do not pair, fewer than 2 pairs, or
        a metric's cell that is empty or not a number.
    """
    rows = read_sweep(Path(sweep_dir))
    columns = list(rows[0])
    keys = grid_keys(columns)
    settings = [b] if isinstance(b, Mapping) else list(b)
    if not settings:
        raise UserError("compare: no --b setting")
    if not metrics:
        raise UserError("compare: no --metric")
    directions = {m: _direction(m, columns, higher_is_better) for m in metrics}
    a_full = _resolve(a, keys, "--a")
    a_runs = _runs_by_seed(rows, a_full, "--a")
    pairs = []
    for setting in settings:
        b_full = _resolve(setting, keys, "--b")
        b_runs = _runs_by_seed(rows, b_full, "--b")
        seeds = _paired_seeds(a_runs, b_runs, a_full, b_full)
        for metric in metrics:
            xs = [_metric(a_runs[s], metric) for s in seeds]
            ys = [_metric(b_runs[s], metric) for s in seeds]
            pairs.append((metric, a_full, b_full, seeds, paired(xs, ys, confidence)))
    p_t = holm([p.p_t for *_, p in pairs])
    p_w = holm([p.p_wilcoxon for *_, p in pairs])
    return [Comparison(metric, directions[metric], a_s, b_s, seeds, result, float(pt), float(pw),
                       _verdict(result, float(pt), directions[metric], confidence))
            for (metric, a_s, b_s, seeds, result), pt, pw in zip(pairs, p_t, p_w)]


def values_by_seed(rows: Sequence[Mapping[str, Any]], setting: Mapping[str, Any], metric: str) -> dict[int, float]:
    """seed → ``metric`` of the run of each seed that has ``setting``'s values (full grid keys), from
    sweep rows as testbed.orchestration.sweep.run_sweep returns them or as sweep.csv holds them: what
    testbed.reports.verdicts.paired_verdict takes. UserError as :func:`compare`'s."""
    return {seed: _metric(row, metric) for seed, row in _runs_by_seed(rows, setting, "setting").items()}


def format_comparisons(comparisons: Sequence[Comparison], confidence: float = CONFIDENCE) -> str:
    """The comparisons as text, a block each (what `testbed compare` prints)."""
    family = len(comparisons)
    blocks = []
    for c in comparisons:
        r = c.result
        holm_note = f" (Holm over {family}: {c.p_t_holm:.3g})" if family > 1 else ""
        w_note = f" (Holm: {c.p_wilcoxon_holm:.3g})" if family > 1 else ""
        blocks.append("\n".join([
            f"{c.metric} ({'higher' if c.higher_is_better else 'lower'} is better), {r.n} pairs by seed",
            f"  a: {_setting_text(c.a)}",
            f"  b: {_setting_text(c.b)}",
            f"  mean a−b {r.mean:+.4g}, {confidence:.0%} CI [{r.ci_low:+.4g}, {r.ci_high:+.4g}], sd {r.sd:.4g}",
            f"  p paired t {r.p_t:.3g}{holm_note}, {_wilcoxon_text(r, w_note, confidence)}",
            f"  smallest effect detectable at 80% power: {r.min_detectable:.4g}",
            f"  verdict: {c.verdict}"]))
    return "\n\n".join(blocks)


def comparisons_json(comparisons: Sequence[Comparison]) -> str:
    """The comparisons as a JSON list (what `testbed compare --json` prints)."""
    return jsontext.dumps([c.as_dict() for c in comparisons], indent=2)


# ------------------------------------------------------------------------------------------ pieces


def _direction(metric: str, columns: Sequence[str], higher_is_better: bool | None) -> bool:
    if metric not in numeric_fields(columns):
        raise UserError(f"compare: --metric {metric!r} is not a column of this sweep; choose one of "
                        f"{', '.join(numeric_fields(columns))}")
    if higher_is_better is not None:
        return higher_is_better
    if metric not in HIGHER_IS_BETTER:
        raise UserError(f"compare: which way is better for {metric} is not known; add --higher-is-better "
                        "or --lower-is-better")
    return HIGHER_IS_BETTER[metric]


def _resolve(setting: Mapping[str, Any], keys: Sequence[str], option: str) -> dict[str, Any]:
    """``setting`` with every key written in full (a key's last part names it when unambiguous)."""
    if not setting:
        raise UserError(f"compare: {option} needs at least one KEY=VALUE")
    full = {}
    for key, wanted in setting.items():
        matches = [k for k in keys if k == key] or [k for k in keys if k.split(".")[-1] == key]
        if len(matches) != 1:
            why = "is not a grid key" if not matches else f"is ambiguous ({', '.join(matches)})"
            raise UserError(f"compare: {option} {key} {why}; the sweep's grid keys: {', '.join(keys) or 'none'}")
        full[matches[0]] = wanted
    return full


def _runs_by_seed(rows: Sequence[Mapping[str, Any]], setting: Mapping[str, Any], option: str) -> dict[int, Mapping[str, Any]]:
    """The run of each seed that has ``setting``'s values. UserError if none has, or if a seed has
    several (the setting leaves a varying grid key open)."""
    runs: dict[int, Mapping[str, Any]] = {}
    for row in rows:
        if all(value(row.get(k)) == v for k, v in setting.items()):
            seed = int(row["seed"])
            if seed in runs:
                open_keys = [k for k in grid_keys(row) if k not in setting and row.get(k) != runs[seed].get(k)]
                raise UserError(f"compare: {option} {_setting_text(setting)} matches several runs of seed {seed}; "
                                f"give {', '.join(open_keys) or 'the grid keys'} as well")
            runs[seed] = row
    if not runs:
        raise UserError(f"compare: no run of this sweep has {option} {_setting_text(setting)}")
    return runs


def _paired_seeds(a_runs: Mapping[int, Any], b_runs: Mapping[int, Any], a: Mapping[str, Any],
                  b: Mapping[str, Any]) -> tuple[int, ...]:
    if a == b:
        raise UserError(f"compare: --a and --b are the same setting ({_setting_text(a)})")
    if set(a_runs) != set(b_runs):
        only_a, only_b = sorted(set(a_runs) - set(b_runs)), sorted(set(b_runs) - set(a_runs))
        raise UserError(f"compare: the runs do not pair by seed: seeds {only_a or only_b} only in "
                        f"{'--a' if only_a else '--b'} {_setting_text(a if only_a else b)}")
    if len(a_runs) < 2:
        raise UserError(f"compare: {len(a_runs)} pair; a paired comparison needs n >= 2 (sweep --repeats 2 or more)")
    return tuple(sorted(a_runs))


def _metric(row: Mapping[str, Any], metric: str) -> float:
    """A run's metric: of a finished run (a failed run's figures are not a result), a finite
    number within the metric's :data:`RANGES` (else ±MAX_FLOAT: differences and squares of it stay
    finite). UserError, one line naming the run, otherwise."""
    status = row.get("status")
    if status not in FINISHED:
        raise UserError(f"compare: run {row['run']} did not finish (status {str(status)[:40]!r}); only "
                        f"{' or '.join(FINISHED)} runs are compared")
    x = number(row[metric])
    if x is None or not math.isfinite(x):
        raise UserError(f"compare: run {row['run']} has no finite {metric} ({str(row[metric])[:40]!r})")
    low, high = RANGES.get(metric, (-MAX_FLOAT, MAX_FLOAT))
    if not low <= x <= high:
        raise UserError(f"compare: run {row['run']}: {metric} {x:g} is outside [{low:g}, {high:g}], which no run "
                        "gives (a damaged or edited sweep.csv)")
    return x


def _verdict(result: Paired, p_t_holm: float, higher_is_better: bool, confidence: float) -> str:
    """The verdicts' rule (testbed.reports.verdicts.decide) on the claim "a is better"."""
    word = decide(p_t_holm, result.ci_low, result.ci_high, 1 if higher_is_better else -1, confidence)
    return {SHOWN: "a better", OPPOSITE: "b better"}.get(word, f"no difference detected (n={result.n})")


def _wilcoxon_text(r: Paired, holm_note: str, confidence: float) -> str:
    """The rank test's p from RANK_TEST_MIN_N pairs on, or why it is not shown: below that its few
    attainable p-values (none below α at n <= 5) make it too coarse to stand beside the t test."""
    if r.n < RANK_TEST_MIN_N:
        return (f"Wilcoxon not shown below n={RANK_TEST_MIN_N} (at n={r.n} its smallest two-sided p is "
                f"{wilcoxon_min_p(r.n):.3g})")
    return f"Wilcoxon {r.p_wilcoxon:.3g}{holm_note}"


def _setting_text(setting: Mapping[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in setting.items())


def _json_number(x: Any) -> Any:
    return None if isinstance(x, float) and not math.isfinite(x) else x
