"""The runner's side of tracking: :class:`Tracking` takes each round from the rounds loop and hands
it to the run's trackers in a thread of their own.

Why a thread: a tracker writes files or talks to a server; a slow disk or an MLflow server that
retries must not hold up a round. Why failures end tracking only: the run's own files (metrics.csv,
ledger.csv, summary.json) are the record; a tracker mirrors them. So a tracker that raises is
logged in one line and dropped, and the run goes on.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

from testbed.reports.tracking import TRACKERS, RoundRecord, Tracker, enabled
from testbed.util.oneline import one_line

if TYPE_CHECKING:
    from testbed.accounting.book import LedgerBook
    from testbed.accounting.budgets import Budgets
    from testbed.assembly.config import Config

log = logging.getLogger(__name__)

#: Per-node totals the trackers get each round (LedgerBook columns).
NODE_COLUMNS = ("cost_units", "bytes_total", "energy_j", "mi_epsilon_nats")


def round_record(row: Mapping[str, Any], book: "LedgerBook", budgets: "Budgets") -> RoundRecord:
    """The round's :class:`RoundRecord`: the metrics row's numbers and the nodes' totals, copied.

    Example::

        >>> from testbed.accounting.budgets import Budgets
        >>> from testbed.accounting.book import LedgerBook
        >>> r = round_record({"round": 3, "train_loss": 0.5, "test_accuracy": ""}, LedgerBook([0, 1]), Budgets())
        >>> r.round, r.metrics, sorted(r.nodes)
        (3, {'train_loss': 0.5, 'energy_j': 0.0}, ['bytes_total', 'cost_units', 'energy_j', 'epsilon', 'mi_epsilon_nats'])
    """
    metrics = {k: float(v) for k, v in row.items() if k != "round" and isinstance(v, (int, float))}
    nodes = {name: np.array(book.column(name), dtype=np.float64) for name in NODE_COLUMNS}
    nodes["epsilon"] = np.asarray(book.worst_epsilons(budgets.accountant, budgets.delta), dtype=np.float64)
    metrics["energy_j"] = float(nodes["energy_j"].max(initial=0.0))
    tallies, index = book.distinct_tallies()
    return RoundRecord(int(row["round"]), metrics, nodes, node_ids=book.node_ids.copy(), tallies=tuple(tallies),
                       tally_index=index.copy())


class Quoting:
    """Puts the run's figure to quote in a round's record, in the tracking thread: ``epsilon`` per
    node and in the metrics is the figure summary.json's ``privacy.headline`` will hold at the end
    (run_summary.privacy_headline): the tight accountant's ε when one is configured (each distinct tally
    once, then cached: a tally never changes), the run's accountant's otherwise, ε-MI-DP in nats,
    and none for a run without noise (ε = ∞, in the trackers' tags). The run's accountant's ε stays
    beside it as ``epsilon_<accountant>`` when the two differ.

    Example::

        >>> r = RoundRecord(1, {"epsilon": float("inf"), "train_loss": 0.5}, {"epsilon": np.array([np.inf])})
        >>> Quoting("none", "rdp", None, 1e-5).quoted(r).metrics
        {'train_loss': 0.5}
    """

    def __init__(self, guarantee: str, accountant: str, tight_accountant: str | None, delta: float):
        self.guarantee, self.accountant, self.delta = guarantee, accountant, delta
        self.quoted_by = tight_accountant if tight_accountant not in (None, "none") else accountant
        self._cache: dict[tuple, float] = {}

    @classmethod
    def of(cls, config: "Config") -> "Quoting":
        from testbed.assembly import assemble

        p = config.privacy
        return cls(assemble.privacy_guarantee(config), p.accountant, p.tight_accountant, p.delta)

    def quoted(self, record: RoundRecord) -> RoundRecord:
        metrics, nodes = dict(record.metrics), dict(record.nodes)
        paper = metrics.pop("epsilon", None)
        if self.guarantee == "mi_dp":
            nodes["epsilon"] = nodes["mi_epsilon_nats"]
        elif self.guarantee == "dp" and self.quoted_by != self.accountant:
            nodes["epsilon"] = np.array([self._epsilon(t) for t in record.tallies], dtype=np.float64)[record.tally_index] \
                if record.tallies else np.zeros(len(record.node_ids))
            if paper is not None:
                metrics[f"epsilon_{self.accountant}"] = paper
        elif self.guarantee != "dp":
            del nodes["epsilon"]  # ε = ∞: no series; the trackers' tags say it
        if "epsilon" in nodes:
            metrics["epsilon"] = float(nodes["epsilon"].max(initial=0.0))
        return RoundRecord(record.round, metrics, nodes, record.node_ids, record.tallies, record.tally_index)

    def _epsilon(self, tally) -> float:
        from testbed.accounting.book import _tally_key
        from testbed.privacy.accountants import worst_epsilon

        key = _tally_key(tally)
        if key not in self._cache:
            self._cache[key] = worst_epsilon(self.quoted_by, tally, self.delta)
        return self._cache[key]


class Tracking:
    """The run's trackers, called in order from one daemon thread.

    ``round`` and ``finish`` return at once (``finish`` waits at most :attr:`FINISH_WAIT_S` for the
    trackers to end). At most :attr:`QUEUE_ROUNDS` rounds wait for a tracker that falls behind;
    rounds past that are left out of tracking (said once).
    """

    QUEUE_ROUNDS = 256
    FINISH_WAIT_S = 60.0

    def __init__(self, trackers: list[tuple[str, Tracker]], quoting: Quoting | None = None):
        self._trackers = list(trackers)
        self._quoting = quoting
        self._queue: queue.Queue = queue.Queue(self.QUEUE_ROUNDS)
        self._thread = threading.Thread(target=self._serve, name="tracking", daemon=True)
        self._dropping = False

    @classmethod
    def off(cls) -> "Tracking":
        """No trackers: every call does nothing."""
        return cls([])

    @classmethod
    def start(cls, config: "Config", run_dir: Path) -> "Tracking":
        """The trackers ``config`` turns on, started (in their thread) on ``run_dir``."""
        tracking = cls([(name, TRACKERS[name].make()) for name in enabled(config)], Quoting.of(config))
        if tracking._trackers:
            tracking._thread.start()
            tracking._queue.put(("start", (config, Path(run_dir))))
        return tracking

    @property
    def live(self) -> bool:
        """Whether any tracker is still running."""
        return bool(self._trackers)

    def round(self, row: Mapping[str, Any], book: "LedgerBook", budgets: "Budgets") -> None:
        """Hand the round just reported (its metrics row and the book after it) to the trackers."""
        if not self._trackers:
            return
        try:
            self._queue.put_nowait(("round", (round_record(row, book, budgets),)))
        except queue.Full:
            if not self._dropping:  # said once: a tracker this far behind stays behind
                log.warning("tracking: the trackers fall behind the run; round %s and others are left out of "
                            "tracking (metrics.csv has every round)", row.get("round"))
            self._dropping = True

    def finish(self, summary: dict[str, Any]) -> None:
        """The run's end: its summary to the trackers, then wait (bounded) for them to close."""
        if not self._thread.is_alive():
            return
        deadline = time.monotonic() + self.FINISH_WAIT_S
        try:
            self._queue.put(("finish", (summary,)), timeout=self.FINISH_WAIT_S)
            self._queue.put(None, timeout=max(0.0, deadline - time.monotonic()))
        except queue.Full:
            pass
        self._thread.join(max(0.0, deadline - time.monotonic()))
        if self._thread.is_alive():
            log.warning("tracking: %s still busy after %g s; left unfinished (the run's files are complete)",
                        ", ".join(name for name, _ in self._trackers), self.FINISH_WAIT_S)

    def _serve(self) -> None:
        while (item := self._queue.get()) is not None:
            stage, args = item
            if stage == "round" and self._quoting is not None:
                try:
                    args = (self._quoting.quoted(*args),)
                except Exception as exc:  # noqa: BLE001  an accountant that fails ends tracking, not the run
                    for name, tracker in list(self._trackers):
                        self._drop(name, tracker, f"the figure to quote: {type(exc).__name__}: {one_line(exc)}")
                    continue
            for name, tracker in list(self._trackers):
                try:
                    getattr(tracker, stage)(*args)
                except Exception as exc:  # noqa: BLE001  any failure of a tracker ends that tracker only
                    self._drop(name, tracker, f"{stage}: {type(exc).__name__}: {one_line(exc)}")

    def _drop(self, name: str, tracker: Tracker, why: str) -> None:
        self._trackers = [(n, t) for n, t in self._trackers if t is not tracker]
        log.warning("tracking: %s stopped (%s); the run goes on without it", name, why)
        try:
            tracker.close()
        except Exception:  # noqa: BLE001  already failed once: nothing more to say about it
            pass
