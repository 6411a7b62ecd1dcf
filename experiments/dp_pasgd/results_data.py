"""The compact result data both DP-PASGD REPORTs are generated from: experiments/dp_pasgd/data/.

One JSON file per scenario (``e1.json``, ``cnn-e2.json``, ...): the measured wall time of its runs,
a table of one row per run (its seed, settings and final metrics; ``columns`` names the fields of
each row, so the file stays small), and whatever else the scenario's figures need (curves subsampled
per round). A scenario's run rewrites its own file only, so running a subset of the scenarios never
touches the others' data, and ``--report-only`` regenerates every REPORT from these files alone.

Numbers are stored to 6 significant digits: far below the seed noise of any metric here (the finest
is an accuracy on ~1,000 test rows, a step of 1e-3), and what keeps the folder small and the REPORTs
byte for byte reproducible.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed.reports.stats import t_interval

DATA = Path(__file__).resolve().parent / "data"
#: Significant digits of every stored float.
DIGITS = 6


@dataclass(frozen=True)
class Table:
    """One scenario's data: its rows as dicts, the summed wall time of its runs, and extras."""

    rows: list[dict[str, Any]]
    wall_s: float
    extra: dict[str, Any]


def compact(value: Any) -> Any:
    """``value`` with every float rounded to DIGITS significant digits (recursively)."""
    if isinstance(value, float):
        return value if not math.isfinite(value) else float(f"{value:.{DIGITS}g}")
    if isinstance(value, dict):
        return {str(k): compact(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [compact(v) for v in value]
    return value


def write(name: str, columns: Sequence[str], rows: Iterable[dict[str, Any]], wall_s: float, **extra: Any) -> Path:
    """Write scenario ``name``'s data to DATA/<name>.json: one line per run row."""
    DATA.mkdir(exist_ok=True)
    head = json.dumps(compact({"scenario": name, "wall_s": wall_s, "columns": list(columns), **extra}),
                      ensure_ascii=False, sort_keys=True, allow_nan=False)
    lines = [json.dumps(compact([r[c] for c in columns]), ensure_ascii=False, allow_nan=False) for r in rows]
    path = DATA / f"{name}.json"
    path.write_text(head[:-1] + ', "rows": [\n' + ",\n".join(lines) + "\n]}\n")
    return path


def read(name: str) -> Table:
    """The data of scenario ``name`` (FileNotFoundError if it was never run)."""
    raw = json.loads((DATA / f"{name}.json").read_text())
    columns = raw.pop("columns")
    rows = [dict(zip(columns, r)) for r in raw.pop("rows")]
    wall_s = raw.pop("wall_s")
    raw.pop("scenario")
    return Table(rows, wall_s, raw)


def runs_wall_s(out_dir: Path, sweep_rows: Iterable[dict[str, Any]]) -> float:
    """The summed measured wall time (``wall_s`` of each run's summary.json) of a sweep's runs: the
    scenario's compute on one worker, also when its runs were finished by an earlier invocation."""
    return sum(json.loads((out_dir / r["run"] / "summary.json").read_text())["wall_s"] for r in sweep_rows)


def mean_ci(values: Sequence[float], digits: int = 4) -> str:
    """``mean [low, high]``: the mean and its 95 % Student t interval, for a REPORT cell."""
    s = t_interval(list(values))
    if s.n < 2:
        return f"{float(s.mean):.{digits}f}"
    return f"{float(s.mean):.{digits}f} [{float(s.ci_low):.{digits}f}, {float(s.ci_high):.{digits}f}]"


def by_seed(rows: Iterable[dict[str, Any]], metric: str, **setting: Any) -> dict[int, float]:
    """seed → ``metric`` of the rows that have ``setting``'s values (one row per seed)."""
    out: dict[int, float] = {}
    for r in rows:
        if all(r[k] == v for k, v in setting.items()):
            if r["seed"] in out:
                raise ValueError(f"two rows of seed {r['seed']} match {setting}")
            out[r["seed"]] = r[metric]
    return out
