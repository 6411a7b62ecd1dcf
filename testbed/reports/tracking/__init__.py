"""Experiment tracking: a run's curves sent, as it goes, to TensorBoard and MLflow.

Each tracker is a small module of its own with one interface (:class:`Tracker`: ``start``,
``round``, ``finish``, ``close``), named in :data:`TRACKERS`; ``output.<name> = true`` turns it on.
The runner feeds them through :class:`~testbed.reports.tracking.feed.Tracking`, which calls them in a
thread of their own: a slow or failing tracker (disk full, server down) never holds up a round, and
a failure is one logged line after which that tracker is dropped; the run, its ledger and its files
go on as if tracking had been off.

Example::

    >>> sorted(TRACKERS)
    ['mlflow', 'tensorboard']
    >>> TRACKERS["tensorboard"].module
    'tensorboardX'
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from testbed.errors import ConfigError
from testbed.util.extras import EXTRA_OF_MODULE

if TYPE_CHECKING:
    from testbed.config import Config


@dataclass(frozen=True)
class RoundRecord:
    """One round as the trackers get it: copied from the runner's state, so a tracker working in its
    own thread reads numbers that no longer change.

    Attributes:
        round: rounds done (1 after the first).
        metrics: the metrics row's numbers (metrics.csv's columns but ``round``; cells left blank by
            ``output.eval_every`` left out), and ``energy_j``: the most joules any node spent.
        nodes: per-node totals so far, name → (N,) array: ``epsilon``, ``cost_units``,
            ``bytes_total``, ``energy_j``.
    """

    round: int
    metrics: dict[str, float]
    nodes: dict[str, np.ndarray]


class Tracker(Protocol):
    """What a tracker does; each call is made from the tracking thread, in this order."""

    def start(self, config: "Config", run_dir: Path) -> None:
        """Open the tracker's store for the run (``run_dir`` holds config.toml already)."""

    def round(self, record: RoundRecord) -> None:
        """Record one round."""

    def finish(self, summary: dict[str, Any]) -> None:
        """Record the run's end (its summary.json, written) and close."""

    def close(self) -> None:
        """Release what the tracker holds after a failure (no more writes; errors are ignored)."""


@dataclass(frozen=True)
class TrackerKind:
    """A tracker's registration: ``output.<name>`` turns it on; ``module`` is the package it needs
    (its install extra read from testbed.util.extras); ``factory`` is "module:Class" of the tracker."""

    module: str
    factory: str

    def make(self) -> Tracker:
        module, _, cls = self.factory.partition(":")
        return getattr(importlib.import_module(module), cls)()


#: name (an ``output`` key) → the tracker.
TRACKERS: dict[str, TrackerKind] = {
    "tensorboard": TrackerKind("tensorboardX", "testbed.reports.tracking.tensorboard_tracker:TensorBoardTracker"),
    "mlflow": TrackerKind("mlflow", "testbed.reports.tracking.mlflow_tracker:MlflowTracker"),
}


def enabled(config: "Config") -> list[str]:
    """The trackers ``config`` turns on, in :data:`TRACKERS`' order."""
    return [name for name in TRACKERS if getattr(config.output, name, False)]


def check_installed(config: "Config") -> None:
    """Refuse, before anything runs, a tracker whose package is not installed: a ConfigError naming
    the key and the extra to install (found without importing the package)."""
    for name in enabled(config):
        module = TRACKERS[name].module
        if importlib.util.find_spec(module) is None:
            package, extra = EXTRA_OF_MODULE[module]
            raise ConfigError(f"output.{name}", f"needs {package}, which is not installed: "
                                                f"pip install 'testbed[{extra}]'")
