"""A sweep folder's table read back, and its statistics over repeats: ``sweep_stats.csv``.

``sweep.csv`` has one row per run: the grid's keys first, then testbed.orchestration.sweep.COLUMNS from ``seed``
on. The runs of one grid point differ only in their seed; ``sweep_stats.csv`` (written by the
sweep from :func:`stats_rows`) has one row per grid point: its grid values, ``n`` (its runs) and,
for every numeric field F of the summary, ``F_mean``, ``F_sd``, ``F_ci_low``, ``F_ci_high``
(Student t, 95 %) and ``F_bca_low``, ``F_bca_high`` (BCa bootstrap; empty below
testbed.reports.stats.BCA_MIN_N runs). A field that some run of the point lacks (an empty cell) has empty
statistics at that point; a field no run has gets no columns.

Nothing in a sweep folder is trusted: :func:`read_sweep` checks the table's header, that every
row has every cell and an integer seed, and says what is wrong in one line.

Example::

    >>> rows = [{"dp_pasgd.tau": 1, "seed": s, "test_accuracy": a} for s, a in enumerate([0.5, 0.7])]
    >>> stats = stats_rows(rows, ["dp_pasgd.tau"])
    >>> stats[0]["n"], stats[0]["test_accuracy_mean"], stats[0]["test_accuracy_bca_low"]
    (2, 0.6, None)
"""

from __future__ import annotations

import csv
import io
import math
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from testbed.errors import UserError
from testbed.reports.stats import bca_interval, t_interval
from testbed.util.userfiles import read_text

#: sweep.csv columns that are not numeric fields of a run's summary.
NOT_FIELDS = ("seed", "status", "stopped_by", "run")
#: The statistics of each field F, as column suffixes: F_mean, F_sd, ...
SUFFIXES = ("mean", "sd", "ci_low", "ci_high", "bca_low", "bca_high")
STATS_FILE = "sweep_stats.csv"
#: A seed or a count in a sweep's table: ASCII digits ("²".isdigit() is true), as many as a seed has.
_INTEGER = re.compile(r"[0-9]{1,20}")
#: A run's folder in a sweep's table: a name of one path component (testbed.orchestration.sweep.Point.name's
#: characters), never a path.
_RUN = re.compile(r"[A-Za-z0-9._=-]{1,255}")
#: Bytes of sweep.csv read at most (a million runs' rows); past it the file is refused, not read.
MAX_TABLE_BYTES = 256 * 2**20


def grid_keys(columns: Iterable[str]) -> list[str]:
    """The grid's keys among a sweep.csv header: the columns before ``seed``."""
    columns = list(columns)
    return columns[:columns.index("seed")] if "seed" in columns else columns


def numeric_fields(columns: Iterable[str]) -> list[str]:
    """The summary fields of a sweep.csv header that statistics are computed for: the columns from
    ``seed`` on, but for the seed, the status and the run's name."""
    columns = list(columns)
    return [c for c in columns[columns.index("seed"):] if c not in NOT_FIELDS] if "seed" in columns else []


def number(cell: Any) -> float | None:
    """A cell as a float: None for an empty cell or one that is not a number (a status, a name)."""
    if cell is None or cell == "" or isinstance(cell, bool):
        return None
    try:
        return float(cell)
    except (TypeError, ValueError, OverflowError):  # an int past float64's range (a JSON field) too
        return None


def value(cell: Any) -> Any:
    """A grid cell as the value it stands for: an int, a float, a bool, else the text; the same
    for a cell read from sweep.csv ("0.1") and the value the sweep wrote (0.1)."""
    if isinstance(cell, (bool, int, float)) or cell is None:
        return cell
    text = str(cell)
    if text in ("True", "true", "False", "false"):
        return text.lower() == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def read_sweep(folder: Path) -> list[dict[str, str]]:
    """The rows of ``folder``/sweep.csv, checked. UserError in one line if the folder has none, it
    is damaged (a row with a missing or extra cell, a seed that is not an integer) or it is not a
    sweep table (no seed or run column), or a run is not a folder of its own in ``folder`` (its
    name is a path: ``../x``, ``/etc``)."""
    path = Path(folder) / "sweep.csv"
    rows = _read_table(Path(folder), "sweep.csv", ("seed", "run"), "seed", "runs")
    for row in rows:
        if not _RUN.fullmatch(row["run"]) or row["run"] in (".", ".."):
            raise UserError(f"{path}: damaged: run {row['run'][:60]!r} is not the name of a folder in the sweep")
    return rows


def read_stats(folder: Path) -> list[dict[str, str]]:
    """The rows of ``folder``/sweep_stats.csv, checked as :func:`read_sweep` checks sweep.csv (an
    ``n`` column of integers, one row per grid point)."""
    return _read_table(Path(folder), STATS_FILE, ("n",), "n", "grid points")


def _read_table(folder: Path, name: str, required: tuple[str, ...], integer: str, what: str) -> list[dict[str, str]]:
    """The rows of a sweep folder's table ``name``: its ``required`` columns there, every row with
    every cell, its ``integer`` column's cells integers, at least one row (``what`` it holds)."""
    path = folder / name
    if not path.exists():
        raise UserError(f"{folder} has no {name}; not a sweep folder (testbed sweep --out)")
    try:
        text = read_text(path, MAX_TABLE_BYTES, "")
    except UserError as exc:
        raise UserError(f"{path}: unreadable ({str(exc).removeprefix(f' {path}: ')})") from None
    reader = csv.DictReader(io.StringIO(text, newline=""))
    try:
        header = reader.fieldnames or []
        missing = [c for c in required if c not in header]
        if missing:
            raise ValueError(f"no {missing[0]} column")
        rows = []
        for row in reader:
            if None in row or None in row.values():
                raise ValueError(f"line {reader.line_num}: wrong number of cells")
            if not _INTEGER.fullmatch(row[integer]):
                raise ValueError(f"line {reader.line_num}: {integer} {row[integer]!r} is not an integer")
            rows.append(row)
    except (ValueError, csv.Error) as exc:
        raise UserError(f"{path}: damaged: {exc}") from None
    if not rows:
        raise UserError(f"{path} holds no {what}")
    return rows


def group_by_point(rows: Sequence[dict[str, Any]], keys: Sequence[str]) -> dict[tuple, list[dict[str, Any]]]:
    """The rows of each grid point (their values of ``keys``), in first-seen order."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(tuple(value(row.get(k)) for k in keys), []).append(row)
    return groups


def stats_rows(rows: Sequence[dict[str, Any]], keys: Sequence[str]) -> list[dict[str, Any]]:
    """One row per grid point: its values of ``keys``, ``n`` and each field's statistics (None where
    undefined). Every field of a point is summarised in one vectorised call."""
    fields = [f for f in numeric_fields(dict.fromkeys(k for r in rows for k in r))
              if any(number(r.get(f)) is not None for r in rows)]
    out = []
    for point, group in group_by_point(rows, keys).items():
        table = [[number(r.get(f)) for r in group] for f in fields]
        complete = [i for i, column in enumerate(table) if all(v is not None for v in column)]
        stats: dict[str, Any] = {f"{f}_{s}": None for f in fields for s in SUFFIXES}
        if complete:
            values = np.array([table[i] for i in complete], dtype=float)
            summary = t_interval(values)
            bca_low, bca_high = bca_interval(values)
            columns = (summary.mean, summary.sd, summary.ci_low, summary.ci_high, bca_low, bca_high)
            for j, i in enumerate(complete):
                for suffix, column in zip(SUFFIXES, columns):
                    stats[f"{fields[i]}_{suffix}"] = _finite(column[j])
        out.append({**dict(zip(keys, point)), "n": len(group), **stats})
    return out


def _finite(x: float) -> float | None:
    return float(x) if math.isfinite(x) else None
