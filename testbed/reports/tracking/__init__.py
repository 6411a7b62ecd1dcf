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
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from testbed.errors import ConfigError
from testbed.util.extras import EXTRA_OF_MODULE, install_hint

if TYPE_CHECKING:
    from testbed.assembly.config import Config


@dataclass(frozen=True)
class RoundRecord:
    """One round as the trackers get it: copied from the runner's state, so a tracker working in its
    own thread reads numbers that no longer change.

    Attributes:
        round: rounds done (1 after the first).
        metrics: the metrics row's numbers (metrics.csv's columns but ``round``; cells left blank by
            ``output.eval_every`` left out), and ``energy_j``: the most joules any node spent.
        nodes: per-node totals so far, name → (N,) array: ``epsilon`` (the run's accountant's
            until the tracking thread puts the figure to quote in its place: feed.Quoting),
            ``cost_units``, ``bytes_total``, ``energy_j``, ``mi_epsilon_nats``.
        node_ids: (N,) the nodes' ids, in the arrays' order.
        tallies: the distinct privacy tallies the nodes hold (the book's, never changed after) and
            ``tally_index`` (N,) each node's index into them: what the figure to quote is computed from.
    """

    round: int
    metrics: dict[str, float]
    nodes: dict[str, np.ndarray]
    node_ids: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    tallies: tuple = ()
    tally_index: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))


#: Per-node series by id (``nodes/<name>/<id>``) for at most this many nodes: past it only the
#: histograms (TensorBoard) and the worst node (the metrics), so a federation of thousands does not
#: send thousands of series a round.
NODE_SERIES_MAX = 256
#: The per-node quantities sent as series by id.
NODE_SERIES = ("epsilon", "cost_units", "bytes_total", "energy_j")


def node_series(record: RoundRecord) -> list[tuple[str, float]]:
    """(``nodes/<name>/<node id>``, value) of each finite per-node figure of :data:`NODE_SERIES`,
    for a federation of at most :data:`NODE_SERIES_MAX` nodes, else none.

    Example::

        >>> r = RoundRecord(1, {}, {"epsilon": np.array([0.5, np.inf])}, node_ids=np.array([3, 7]))
        >>> node_series(r)
        [('nodes/epsilon/3', 0.5)]
    """
    ids = record.node_ids.tolist()
    if not ids or len(ids) > NODE_SERIES_MAX:
        return []
    return [(f"nodes/{name}/{node}", value) for name in NODE_SERIES if name in record.nodes
            for node, value in zip(ids, record.nodes[name].tolist()) if np.isfinite(value)]


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
    and ``also`` others its default store needs (their install extra read from testbed.util.extras);
    ``factory`` is "module:Class" of the tracker."""

    module: str
    factory: str
    also: tuple[str, ...] = ()

    def make(self) -> Tracker:
        module, _, cls = self.factory.partition(":")
        return getattr(importlib.import_module(module), cls)()


#: name (an ``output`` key) → the tracker.
TRACKERS: dict[str, TrackerKind] = {
    "tensorboard": TrackerKind("tensorboardX", "testbed.reports.tracking.tensorboard_tracker:TensorBoardTracker"),
    # SQLAlchemy and Alembic: the SQLite store it writes by default (mlflow-skinny has neither).
    "mlflow": TrackerKind("mlflow", "testbed.reports.tracking.mlflow_tracker:MlflowTracker", ("sqlalchemy", "alembic")),
}


def enabled(config: "Config") -> list[str]:
    """The trackers ``config`` turns on, in :data:`TRACKERS`' order."""
    return [name for name in TRACKERS if getattr(config.output, name, False)]


def worker_environment(config: "Config") -> dict[str, str]:
    """Environment variables a run of ``config`` in another process (a sweep's pool or Ray worker)
    needs to track where this process would: MLflow's store, resolved here, since its default is
    the working folder's, which such a worker need not share."""
    if "mlflow" not in enabled(config):
        return {}
    from testbed.reports.tracking.mlflow_tracker import tracking_uri

    return {"MLFLOW_TRACKING_URI": tracking_uri()}


def check_installed(config: "Config") -> None:
    """Refuse, before anything runs, a tracker whose package is not installed: a ConfigError naming
    the key and the extra to install (found without importing the package)."""
    for name in enabled(config):
        for module in (TRACKERS[name].module, *TRACKERS[name].also):
            if importlib.util.find_spec(module) is None:
                package, extra = EXTRA_OF_MODULE[module]
                raise ConfigError(f"output.{name}", f"needs {package}, which is not installed: {install_hint(extra)}")
