"""A run's directory: resolved config, per-round metrics, ledger, summary and figures.

Layout::

    RUN_DIR/config.toml     the resolved experiment (reads back with `testbed run`)
    RUN_DIR/metrics.csv     one row per round, flushed every round
    RUN_DIR/ledger.csv      every node's events, one row per event (columns: kind, node, round, ...)
    RUN_DIR/summary.json    the contract other tools read (see SUMMARY_KEYS)
    RUN_DIR/checkpoint.npz  the algorithm's state after the last completed round (for --resume)
    RUN_DIR/figures/*.png   accuracy and loss against round and cost, ε per node
"""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path
from typing import Any

import numpy as np

from testbed.errors import UserError

METRIC_COLUMNS = [
    "round", "local_steps", "train_loss", "test_accuracy", "test_accuracy_pooled",
    "validation_accuracy", "cost_units", "epsilon", "bytes_total", "stragglers", "wall_s",
]
SUMMARY_KEYS = ("algorithm", "mode", "seed", "status", "rounds", "final", "nodes", "budgets")
STATUSES = ("completed", "stopped_budget", "failed")


class RunDirectory:
    """Creates and writes one run's directory; refuses to overwrite a finished or partial run."""

    def __init__(self, path: Path, *, reopen: bool = False):
        self.path = Path(path)
        metrics = self.path / "metrics.csv"
        if reopen:
            if not (self.path / "config.toml").exists():
                raise UserError(f"{self.path} holds no run to resume (no config.toml)")
            self._truncate_metrics_to_checkpoint()
        elif metrics.exists():
            raise UserError(f"{self.path} already holds a run; choose another --out, or --resume it")
        try:
            self.path.mkdir(parents=True, exist_ok=True)
            self._metrics_file = open(metrics, "a" if reopen else "w", newline="")
        except OSError as exc:  # under /proc, under a regular file, read-only: one line, no traceback
            raise UserError(f"cannot write the run directory {self.path}: {exc.strerror or exc}") from None
        self._metrics = csv.DictWriter(self._metrics_file, METRIC_COLUMNS)
        if not reopen:
            self._metrics.writeheader()
        self._metrics_file.flush()

    @classmethod
    def reopen(cls, path: Path) -> "RunDirectory":
        """An existing run's directory, to append to (``testbed run --resume``)."""
        return cls(path, reopen=True)

    def save_checkpoint(self, rounds_done: int, state: np.ndarray) -> None:
        """The state after ``rounds_done`` rounds, replaced atomically (a kill leaves the old one)."""
        tmp = self.path / "checkpoint.tmp.npz"
        np.savez(tmp, rounds_done=rounds_done, state=state)
        os.replace(tmp, self.path / "checkpoint.npz")

    def load_checkpoint(self) -> tuple[int, np.ndarray]:
        """(rounds done, state) of the last checkpoint; UserError if the run never finished a round."""
        path = self.path / "checkpoint.npz"
        if not path.exists():
            raise UserError(f"{self.path} has no checkpoint: the run finished no round; start it afresh")
        with np.load(path) as saved:
            return int(saved["rounds_done"]), saved["state"]

    def _truncate_metrics_to_checkpoint(self) -> None:
        """Drop metric rows past the checkpoint (a kill between the two writes leaves one extra)."""
        rounds_done, _ = self.load_checkpoint()
        path = self.path / "metrics.csv"
        with open(path, newline="") as f:
            rows = list(csv.reader(f))
        kept = [rows[0]] + [row for row in rows[1:] if row and int(float(row[0])) <= rounds_done]
        with open(path, "w", newline="") as f:
            csv.writer(f).writerows(kept)

    @property
    def ledger_path(self) -> Path:
        return self.path / "ledger.csv"

    def write_config(self, toml_text: str) -> None:
        (self.path / "config.toml").write_text(toml_text)

    def append_metrics(self, row: dict[str, Any]) -> None:
        self._metrics.writerow(row)
        self._metrics_file.flush()

    def write_summary(self, summary: dict[str, Any]) -> None:
        missing = [k for k in SUMMARY_KEYS if k not in summary]
        if missing or summary["status"] not in STATUSES:
            raise ValueError(f"summary lacks {missing} or has a bad status")
        tmp = self.path / "summary.json.tmp"
        tmp.write_text(json.dumps(summary, indent=2, sort_keys=False) + "\n")
        os.replace(tmp, self.path / "summary.json")  # atomic: a reader never sees half a summary

    def close(self) -> None:
        self._metrics_file.close()


def read_metrics(run_dir: Path) -> list[dict[str, float]]:
    """The rows of a run's metrics.csv as floats (a partial file of a killed run reads fine)."""
    with open(Path(run_dir) / "metrics.csv", newline="") as f:
        return [{k: float(v) for k, v in row.items() if v != ""} for row in csv.DictReader(f)]


def read_summary(run_dir: Path) -> dict[str, Any]:
    return json.loads((Path(run_dir) / "summary.json").read_text())
