"""`testbed runs [DIR]`: the runs under a folder, one line each, read from each run's summary.json
(through testbed.reports.results' checked reader): name, algorithm, status, rounds, final accuracy,
ε and date. A folder that holds a run but no readable summary (a run still going, a killed one, a
damaged file, a summary without a valid sha256: "unverified", no figures) is listed too, with what
is wrong in one line; nothing in a run's files can make the
listing fail.

A run directory is a folder holding summary.json or metrics.csv; the listing looks at most
:data:`MAX_DEPTH` folders deep (runs/, a sweep's folder, its points) and not inside runs.

Example::

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> (d / "a").mkdir(); _ = (d / "a" / "summary.json").write_text("{")
    >>> [run] = list_runs(d)
    >>> run.name, run.status, run.problem
    ('a', 'damaged', 'summary.json: damaged: not JSON (Expecting property name enclosed in double quotes at line 1)')
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from testbed.errors import UserError
from testbed.reports import headline
from testbed.reports.results import UnverifiedSummary, read_metrics, read_summary
from testbed.util import jsontext
from testbed.util.dirlock import holder_pid
from testbed.util.numbers import finite_real

#: Folders below DIR looked into for runs (runs/, a sweep's folder, a sweep's points).
MAX_DEPTH = 3
_RUN_FILES = ("summary.json", "metrics.csv")
_COLUMNS = ("name", "algorithm", "status", "rounds", "accuracy", "epsilon", "date")


@dataclass(frozen=True)
class RunListing:
    """One run as listed. ``epsilon``: the summary's figure to quote (testbed.reports.headline.quote),
    "inf" for a run without noise, in ``epsilon_unit`` ("nats" for ε-MI-DP, None for an (ε, δ) ε).
    ``problem``: why its summary could not be read (None when it was)."""

    name: str
    path: str
    algorithm: str | None
    status: str
    rounds: int | None
    final_accuracy: float | None
    epsilon: float | str | None
    date: str | None
    problem: str | None = None
    epsilon_unit: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def run_dirs(root: Path) -> list[Path]:
    """The run directories at or under ``root`` (at most MAX_DEPTH deep), in name order."""
    root = Path(root)
    if not root.is_dir():
        raise UserError(f"{root}: not a folder of runs")
    found = []
    todo = [(root, 0)]
    while todo:
        folder, depth = todo.pop()
        if any((folder / name).is_file() for name in _RUN_FILES):
            found.append(folder)
            continue  # a run's own folders (figures, tensorboard) hold no runs
        if depth == MAX_DEPTH:
            continue
        try:
            children = [p for p in folder.iterdir() if p.is_dir() and not p.is_symlink() and not p.name.startswith(".")]
        except OSError:
            continue  # unreadable: nothing to list there
        todo.extend((child, depth + 1) for child in children)
    return sorted(found)


def list_runs(root: Path) -> list[RunListing]:
    """Every run under ``root`` (see :func:`run_dirs`), each read from its summary.json."""
    root = Path(root)
    return [listing(path, _name(root, path)) for path in run_dirs(root)]


def listing(run_dir: Path, name: str) -> RunListing:
    """One run's line: from its summary, or what stands in for a missing or damaged one."""
    date = _date(run_dir)
    try:
        summary = read_summary(run_dir)
    except UserError as exc:  # an unverified summary's figures are not listed: nothing in it is trusted
        if (run_dir / "summary.json").exists():
            status = "unverified" if isinstance(exc, UnverifiedSummary) else "damaged"
            return RunListing(name, str(run_dir), None, status, None, None, None, date,
                              str(exc).replace(str(run_dir) + os.sep, ""))
        return _without_summary(run_dir, name, date)
    final = summary.get("final")
    status = summary.get("status")
    epsilon, unit = _quoted(summary)
    return RunListing(name, str(run_dir), _text(summary.get("algorithm")), _text(status) or "?",
                      _count(summary.get("rounds")),
                      _number(final.get("test_accuracy")) if isinstance(final, dict) else None,
                      epsilon, date, epsilon_unit=unit)


def _quoted(summary: dict[str, Any]) -> tuple[float | str | None, str | None]:
    """(ε to quote as listed, its unit) of a summary read from disk: (None, None) when its privacy
    figures are not what a summary's are."""
    try:
        q = headline.quote(summary)
    except (AttributeError, KeyError, TypeError, ValueError):
        return None, None
    if q["value"] is None:
        return "inf", None
    return _epsilon(q["value"]), "nats" if q.get("unit") == "nats" else None


def _without_summary(run_dir: Path, name: str, date: str | None) -> RunListing:
    """A run directory with no summary.json: a run going on (its lock held by a live process), or
    one that ended before writing it (killed)."""
    pid = holder_pid(run_dir)
    status = f"running (pid {pid})" if pid is not None and _alive(pid) else "no summary (killed?)"
    try:
        rounds, problem = len(read_metrics(run_dir)), None
    except UserError as exc:
        rounds, problem = None, str(exc).replace(str(run_dir) + os.sep, "")
    return RunListing(name, str(run_dir), None, status, rounds, None, None, date, problem)


def format_runs(runs: list[RunListing]) -> str:
    """The runs as a table, one line each (a problem after the columns)."""
    rows = [list(_COLUMNS)]
    problems = [""]
    for run in runs:
        rows.append([_printable(run.name), run.algorithm or "-", _printable(run.status), "-" if run.rounds is None else str(run.rounds),
                     "-" if run.final_accuracy is None else f"{run.final_accuracy:.4f}",
                     _epsilon_text(run.epsilon, run.epsilon_unit), run.date or "-"])
        problems.append(_printable(run.problem or ""))
    widths = [max(len(row[i]) for row in rows) for i in range(len(_COLUMNS))]
    lines = []
    for row, problem in zip(rows, problems):
        line = "  ".join(cell.ljust(width) for cell, width in zip(row, widths))
        lines.append((line + "  " + problem if problem else line).rstrip())
    return "\n".join(lines)


def runs_json(runs: list[RunListing]) -> str:
    """The runs as a JSON list of objects (RunListing's fields; ε as a number, or "inf" for a run
    that released without noise, or null)."""
    return jsontext.dumps([run.to_json() for run in runs], indent=2)


def _printable(text: str) -> str:
    """``text`` on one line: a folder's name may hold a line break or a terminal's escape."""
    return "".join(c if c.isprintable() else "?" for c in text)


def _name(root: Path, path: Path) -> str:
    return path.name if path == root else str(path.relative_to(root))


def _date(run_dir: Path) -> str | None:
    """When the run started: config.toml's time (written first, never rewritten), UTC to the minute."""
    for name in ("config.toml", "summary.json", "metrics.csv"):
        try:
            stamp = (run_dir / name).stat().st_mtime
        except OSError:
            continue
        return datetime.fromtimestamp(stamp, timezone.utc).strftime("%Y-%m-%d %H:%M")
    return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def _text(value: Any) -> str | None:
    """A summary's text field as one short line (None if it is not text)."""
    return " ".join(value.split())[:60] or None if isinstance(value, str) else None


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _number(value: Any) -> float | None:
    return finite_real(value)


def _epsilon(value: Any) -> float | str | None:
    """ε as listed: a finite number, "inf" (a run without noise: not private), or None."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = finite_real(value)  # past float64 (an int of 400 digits) is as unbounded as inf
        return number if number is not None else ("inf" if value > 0 else None)
    if isinstance(value, str) and value.strip().lower() in ("inf", "infinity", "∞"):
        return "inf"
    return None


def _epsilon_text(value: float | str | None, unit: str | None = None) -> str:
    if value is None:
        return "-"
    return "∞" if value == "inf" else f"{value:.4g}" + (f" {unit}" if unit else "")
