"""What the run-directory tests share: a run killed while it saves a checkpoint, and views of a run
directory's files to compare (test_faults_run_dir, test_trust_run_dir, test_run_dir_lock)."""

from __future__ import annotations

import csv
import hashlib
from collections import Counter
from pathlib import Path

import pytest

from testbed.assembly.config import Config
from testbed.ledger.files import read_ledger
from testbed.ledger.node import SPENT_AGAIN
from testbed.orchestration.runner import run_experiment
from testbed.reports.results import RunDirectory

# Ledger fields that do not depend on measured CPU time.
DETERMINISTIC = ("kind", "node", "round", "local_steps", "cost_units", "bytes_up", "bytes_down",
                 "sigma", "sensitivity", "count", "adjacency", "sampling", "sampling_rate")


def run_killed(config: Config, out_dir: Path, killed_at: int) -> None:
    """Run ``config`` into ``out_dir``, killed (KeyboardInterrupt) while it saves its
    ``killed_at``-th checkpoint: ledger.csv then holds that round's rows past the checkpoint's
    mark and metrics.csv its row, as a kill leaves them."""
    real = RunDirectory.save_checkpoint
    calls = {"n": 0}

    def dying(self, *args, **kwargs):
        calls["n"] += 1
        if calls["n"] == killed_at:
            raise KeyboardInterrupt("killed while saving the checkpoint")
        return real(self, *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(RunDirectory, "save_checkpoint", dying)
        with pytest.raises(KeyboardInterrupt):
            run_experiment(config, out_dir=out_dir, quiet=True)


def ledger_rows(run_dir: Path) -> list[tuple]:
    """The deterministic fields of every ledger.csv row, in order."""
    return [tuple(getattr(e, f, None) for f in DETERMINISTIC) for e in read_ledger(run_dir / "ledger.csv")]


def spent_once(rows: list[tuple]) -> list[tuple]:
    """``rows`` (:func:`ledger_rows`) without the compute and communication rows that repeat an
    earlier one: what a round run again after a resume spends again (each session that asked it
    computed and sent it; testbed.reports.results.SPENT_AGAIN), to compare with a run never
    killed, nor the compute rows of no steps that top such a spend charged at an estimate up at the
    session's end (:func:`is_top_up`). Privacy and straggle rows are kept as they are: a release is
    charged once."""
    seen: set[tuple] = set()
    kept = []
    for row in rows:
        if row[0] in SPENT_AGAIN and row in seen or is_top_up(row):
            continue
        seen.add(row)
        kept.append(row)
    return kept


def is_top_up(row: tuple) -> bool:
    """Whether a :func:`ledger_rows` row is a compute row of no steps and no cost units: seconds and
    joules a resumed session's end adds to an earlier session's spend it charged at an estimate."""
    fields = dict(zip(DETERMINISTIC, row))
    return fields["kind"] == "compute" and fields["local_steps"] == 0 and fields["cost_units"] == 0.0


def is_top_up_event(event) -> bool:
    """:func:`is_top_up` of a ledger event."""
    return is_top_up(tuple(getattr(event, f, None) for f in DETERMINISTIC))


def under_counted(run_dir: Path, reference: list[tuple]) -> Counter:
    """The rows of ``reference`` (:func:`ledger_rows`) that ``run_dir``'s ledger lacks (a multiset:
    a row charged once where the reference has it twice counts once)."""
    return Counter(reference) - Counter(ledger_rows(run_dir))


def missed_twice(run_dir: Path) -> Counter:
    """The (node, round) pairs with more than one straggle row in ``run_dir``'s ledger: a node
    misses a round once, and ``rounds_straggled`` counts the rows."""
    missed = Counter((e.node, e.round) for e in read_ledger(run_dir / "ledger.csv") if e.kind == "straggle")
    return Counter({key: n for key, n in missed.items() if n > 1})


#: metrics.csv's columns of what the nodes spent: a round run again after a resume spends again.
SPENT_COLUMNS = ("local_steps", "cost_units", "bytes_total")


def metric_rows(run_dir: Path, spent: bool = True) -> list[dict]:
    """metrics.csv's rows without the wall time (and without :data:`SPENT_COLUMNS` unless ``spent``)."""
    dropped = {"wall_s"} | (set() if spent else set(SPENT_COLUMNS))
    with open(run_dir / "metrics.csv", newline="") as f:
        return [{k: v for k, v in row.items() if k not in dropped} for row in csv.DictReader(f)]


def assert_resumed_metrics(run_dir: Path, full: Path) -> None:
    """metrics.csv of a resumed run is the uninterrupted run's, but for the spend a round run again
    added: at least as much in every row, more from the first round run again on."""
    assert metric_rows(run_dir, spent=False) == metric_rows(full, spent=False)
    for resumed, never_killed in zip(metric_rows(run_dir), metric_rows(full)):
        for column in SPENT_COLUMNS:
            assert float(resumed[column]) >= float(never_killed[column]), (column, resumed, never_killed)


def snapshot(run_dir: Path) -> dict[str, str]:
    """sha256 of every file of ``run_dir`` (the lock file included: released, it is empty)."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(run_dir.iterdir()) if p.is_file()}
