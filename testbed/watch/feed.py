"""What `testbed watch` shows of a run, read from the files the run writes and nothing else.

A run appends ``metrics.csv`` (a row per round) and ``ledger.csv`` (every node's events) and flushes
both every round; it writes ``summary.json`` when it ends. :class:`RunFeed` tails the two logs from
where it last stopped (whole lines only: a row being written is read next time), keeps a
:class:`~testbed.ledger.NodeLedger` per node as the run does, and hands out a full
:meth:`~RunFeed.snapshot` once and then :meth:`~RunFeed.poll` deltas: the run's state, the new metric
rows and only the node rows that changed. Over MQTT the nodes' online/offline status messages come in
through :meth:`~RunFeed.node_status` (any thread).

Everything here is JSON-ready: numbers, strings, None (NaN and ±inf become None).

Example::

    >>> import tempfile, pathlib
    >>> feed = RunFeed(pathlib.Path(tempfile.mkdtemp()))
    >>> feed.snapshot()["run"]["status"]
    'waiting'
"""

from __future__ import annotations

import csv
import io
import math
import os
import queue
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testbed.errors import UserError
from testbed.ledger import (
    CommunicationEvent,
    ComputeEvent,
    Event,
    NodeLedger,
    StraggleEvent,
    parse_rows,
)
from testbed.results import METRIC_COLUMNS, read_summary

#: Metric columns the page plots.
PLOTTED = ("round", "train_loss", "test_accuracy", "cost_units", "epsilon", "stragglers", "wall_s")
#: A run with no summary whose files stopped growing for longer than this many mean rounds (and at
#: least STALL_MIN_S) is shown as stalled: killed, or waiting for nodes.
STALL_ROUNDS = 5
STALL_MIN_S = 30.0


class TailReader:
    """Whole new lines of an append-only text file since the last call (its header skipped)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._offset = 0
        self._rest = b""
        self._header = True

    def read(self) -> tuple[str, bool]:
        """(the whole lines appended since the last call, whether the file shrank). A file that
        shrank (``--resume`` drops rows past its checkpoint) is read again from its start."""
        try:
            size = os.stat(self.path).st_size
        except FileNotFoundError:
            return "", False
        if size < self._offset:
            self._offset, self._rest, self._header = 0, b"", True
            return "", True
        if size == self._offset:
            return "", False
        with open(self.path, "rb") as f:
            f.seek(self._offset)
            data = f.read(size - self._offset)
        self._offset += len(data)
        data = self._rest + data
        cut = data.rfind(b"\n") + 1
        self._rest, data = data[cut:], data[:cut]
        if self._header and data:
            data = data[data.find(b"\n") + 1:]
            self._header = False
        return data.decode("utf-8"), False


@dataclass
class NodeView:
    """One node as the page shows it: its ledger and what the ledger alone does not say."""

    ledger: NodeLedger
    last_round: int = -1            # last round (0-based) with the node's own events
    straggle_round: int = -1        # last round it straggled, and why
    straggle_reason: str = ""
    measured: bool | None = None    # True once any of its costs came from a meter
    mqtt: str | None = None         # "online"/"offline" from its status topic
    mqtt_at: float | None = None    # unix time of that message
    version: int = 0


@dataclass
class _Channel:
    """DWFL: the radio of the run and the channel of the last block computed."""

    radio: Any
    seed: int
    block: int = -1
    gain: list = field(default_factory=list)
    snr_db: list = field(default_factory=list)


def _num(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else float(x)


def planned_rounds(config: Any) -> int | None:
    """The rounds the run's algorithm plans, from its own section of the (planned) config.toml:
    ``rounds``, ``iterations`` (ACFL) or ``steps // tau`` (DP-PASGD); None if it says none."""
    section = getattr(config, config.run.algorithm, None)
    for key in ("rounds", "iterations"):
        value = getattr(section, key, None)
        if isinstance(value, int):
            return value
    steps, tau = getattr(section, "steps", None), getattr(section, "tau", None)
    if isinstance(steps, int) and isinstance(tau, int) and tau > 0:
        return steps // tau
    return None


class RunFeed:
    """The state of one run directory, read incrementally.

    Args:
        run_dir: the run's directory (it may not exist yet: `testbed run --watch` starts the page
            before the run writes anything).
        clock: unix time, for "last seen" and the stall test.
    """

    def __init__(self, run_dir: Path, clock=time.time):
        self.run_dir = Path(run_dir)
        self.clock = clock
        self._statuses: queue.SimpleQueue = queue.SimpleQueue()
        self._reset()

    def _reset(self) -> None:
        self.version = 0
        self.config = None
        self.config_error: str | None = None
        self.summary: dict | None = None
        self._summary_mtime = None
        self.metrics: list[dict[str, float | None]] = []
        self.nodes: dict[int, NodeView] = {}
        self._metrics_tail = TailReader(self.run_dir / "metrics.csv")
        self._ledger_tail = TailReader(self.run_dir / "ledger.csv")
        self._ledger_line = 2
        self._eps_cache: dict[tuple, float] = {}
        self._channel: _Channel | None = None
        self._last_growth = self.clock()
        self._sent_run: dict | None = None
        self.error: str | None = None
        self.coordinator: str | None = None  # its status topic over MQTT, when followed

    # ------------------------------------------------------------------ inputs

    def node_status(self, node: int, online: bool, at: float | None = None) -> None:
        """A node's status message (thread-safe; applied at the next :meth:`poll`)."""
        self._statuses.put((int(node), "online" if online else "offline", self.clock() if at is None else at))

    def coordinator_status(self, online: bool) -> None:
        """The coordinator's status message (thread-safe): offline without a summary is a killed run."""
        self._statuses.put((None, "online" if online else "offline", self.clock()))

    def poll(self) -> dict | None:
        """Read what the run wrote since the last call. Returns a delta (``run``, ``budgets``, new ``metrics``
        rows, changed ``nodes`` rows, ``version``; ``reset: True`` when a file shrank and the page
        must take the snapshot again), or None when nothing changed."""
        start_version = self.version
        first_metric = len(self.metrics)
        reset = False
        self._read_config()
        text, shrank = self._metrics_tail.read()
        if shrank:
            reset = True
        else:
            self._add_metrics(text)
        text, shrank = self._ledger_tail.read()
        if shrank:
            reset = True
        elif text:
            self._add_events(text)
        if reset:  # --resume dropped rows past its checkpoint: read the files again from the start
            self._reset()
            self.poll()
            return {"reset": True, "version": self.version}
        self._read_summary()
        self._apply_statuses()
        if len(self.metrics) > first_metric or self.version != start_version:
            self._last_growth = self.clock()
        self._update_channel()
        run = self.run_info()
        nodes = [self._row(n, v) for n, v in sorted(self.nodes.items()) if v.version > start_version]
        if not nodes and len(self.metrics) == first_metric and run == self._sent_run:
            return None
        self._sent_run = run
        self.version += 1
        return {"version": self.version, "run": run, "budgets": self.budgets(), "metrics": self.metrics[first_metric:],
                "nodes": nodes}

    def snapshot(self) -> dict:
        """Everything the page shows: ``run``, ``budgets``, all ``metrics`` rows, all ``nodes`` rows."""
        return {"version": self.version, "run": self.run_info(), "budgets": self.budgets(),
                "metrics": list(self.metrics), "nodes": [self._row(n, v) for n, v in sorted(self.nodes.items())]}

    # ------------------------------------------------------------------ reading

    def _read_config(self) -> None:
        if self.config is not None or self.config_error is not None:
            return
        path = self.run_dir / "config.toml"
        if not path.exists():
            return
        from testbed.config import load_config

        try:
            self.config = load_config(path)
        except (UserError, ValueError, OSError) as exc:
            self.config_error = f"{path}: {exc}"
            return
        self.version += 1
        for node in range(self.config.data.num_nodes):
            self._view(node).version = self.version
        if self.config.run.algorithm == "dwfl":
            from testbed.algorithms.dwfl import radio_from_config

            self._channel = _Channel(radio_from_config(self.config, self.config.data.num_nodes), self.config.run.seed)

    def _add_metrics(self, text: str) -> None:
        if not text:
            return
        for cells in csv.reader(io.StringIO(text, newline="")):
            if len(cells) != len(METRIC_COLUMNS):
                self.error = f"{self.run_dir / 'metrics.csv'}: a row of {len(cells)} cells"
                continue
            row = dict(zip(METRIC_COLUMNS, cells))
            try:
                self.metrics.append({k: _num(float(row[k])) if row[k] != "" else None for k in PLOTTED})
            except ValueError:
                self.error = f"{self.run_dir / 'metrics.csv'}: a row that is not numbers"

    def _add_events(self, text: str) -> None:
        try:
            events = parse_rows(text, first_line=self._ledger_line)
        except ValueError as exc:
            self.error = f"{self.run_dir / 'ledger.csv'}: {exc}"
            return
        finally:
            self._ledger_line += text.count("\n")
        self.version += 1
        for event in events:
            self._add_event(event)

    def _add_event(self, event: Event) -> None:
        view = self._view(event.node)
        view.ledger.extend([event])
        view.version = self.version
        if isinstance(event, StraggleEvent):
            if event.round >= view.straggle_round:
                view.straggle_round, view.straggle_reason = event.round, event.reason
            return
        if getattr(event, "issuer", "node") == "node":
            view.last_round = max(view.last_round, event.round)
        if isinstance(event, (ComputeEvent, CommunicationEvent)):
            view.measured = bool(view.measured) or event.measured

    def _read_summary(self) -> None:
        path = self.run_dir / "summary.json"
        try:
            mtime = path.stat().st_mtime_ns
        except FileNotFoundError:
            return
        if mtime == self._summary_mtime:
            return
        self._summary_mtime = mtime
        try:  # checked as every reader of a run checks it (JSON, its keys, its sha256)
            self.summary = read_summary(self.run_dir)
        except UserError as exc:
            self.error = str(exc)

    def _apply_statuses(self) -> None:
        while True:
            try:
                node, status, at = self._statuses.get_nowait()
            except queue.Empty:
                return
            if node is None:
                self.coordinator = status
                continue
            if self.config is not None and not 0 <= node < self.config.data.num_nodes:
                continue
            view = self._view(node)
            if (view.mqtt, view.mqtt_at) != (status, at):
                self.version += 1
                view.mqtt, view.mqtt_at, view.version = status, at, self.version

    def _view(self, node: int) -> NodeView:
        view = self.nodes.get(node)
        if view is None:
            view = self.nodes[node] = NodeView(NodeLedger(node), version=self.version)
        return view

    def _update_channel(self) -> None:
        """DWFL: each node's channel gain and received SNR in the current round's fading block,
        drawn as the run draws them (from its seed; the coordinator sends the same h)."""
        ch = self._channel
        if ch is None:
            return
        from testbed.algorithms.dwfl_channel import round_channel

        r = self.current_round()
        block = ch.radio.schedule.block_index(max(r, 0))
        if block == ch.block:
            return
        rc = round_channel(ch.radio, ch.seed, max(r, 0))
        gain = rc.gains
        # Received SNR of sender k at full power: g_k² P_k / σ_m² (σ_m² per real entry), in dB.
        snr = gain**2 * rc.alignment.power_w / ch.radio.noise_power_w
        ch.block = block
        ch.gain = [_num(float(g)) for g in gain]
        ch.snr_db = [_num(10 * math.log10(s)) if s > 0 else None for s in snr]
        self.version += 1
        for view in self.nodes.values():
            view.version = self.version

    # ------------------------------------------------------------------ views

    def current_round(self) -> int:
        """The last completed round, 0-based (-1 before the first)."""
        return len(self.metrics) - 1

    def budgets(self) -> dict[str, Any]:
        """The per-node budgets (None: unlimited) and how ε is accounted."""
        if self.config is None:
            return {}
        b, p = self.config.budget, self.config.privacy
        return {"epsilon": b.epsilon, "cost_units": b.cost_units, "bytes": b.bytes, "energy_j": b.energy_j,
                "mi_epsilon": b.mi_epsilon, "delta": p.delta, "accountant": p.accountant}

    def run_info(self) -> dict[str, Any]:
        """The run's progress, time left and status (``waiting``, ``running``, ``stalled``,
        ``killed`` (its coordinator's MQTT will came and no summary), or the summary's
        ``completed``/``stopped_budget``/``failed``)."""
        c, s = self.config, self.summary
        done = len(self.metrics)
        planned = planned_rounds(c) if c is not None else None
        wall = self.metrics[-1]["wall_s"] if self.metrics else None
        info: dict[str, Any] = {
            "run_dir": str(self.run_dir), "rounds_done": done, "rounds_planned": planned, "wall_s": wall,
            "error": self.config_error or self.error, "coordinator": self.coordinator,
        }
        if c is not None:
            info.update(name=c.run.name, algorithm=c.run.algorithm, mode=c.run.mode, seed=c.run.seed,
                        num_nodes=c.data.num_nodes, profile=c.nodes.profile, dataset=c.data.dataset)
        if s is not None:
            info.update(status=s.get("status"), stopped=s.get("stopped"), failure=s.get("failure"),
                        rounds_done=s.get("rounds", done), wall_s=_num(s.get("wall_s")), eta_s=0.0)
            return info
        recent = self.metrics[-10:]
        round_s = None
        if len(recent) >= 2 and recent[-1]["wall_s"] is not None and recent[0]["wall_s"] is not None:
            round_s = (recent[-1]["wall_s"] - recent[0]["wall_s"]) / (len(recent) - 1)
        elif recent and recent[0]["wall_s"] is not None:
            round_s = recent[0]["wall_s"]
        info["eta_s"] = None if round_s is None or planned is None else max(planned - done, 0) * round_s
        idle_s = self.clock() - self._last_growth
        stall_s = max(STALL_MIN_S, STALL_ROUNDS * (round_s or 0.0))
        if c is None:
            info["status"] = "waiting"
        elif self.coordinator == "offline":
            info["status"] = "killed"  # its will was published and it wrote no summary
        elif idle_s > stall_s:
            info["status"] = "stalled"  # no summary, no growth: killed, or waiting for its nodes
        else:
            info["status"] = "running"
        info["idle_s"] = round(idle_s, 1)
        return info

    def _epsilon(self, tally) -> float:
        key = tuple(sorted(tally.items()))
        eps = self._eps_cache.get(key)
        if eps is None:
            from testbed.privacy.accountants import epsilon

            p = self.config.privacy
            eps = self._eps_cache[key] = epsilon(p.accountant, tally, p.delta)
        return eps

    def node_state(self, view: NodeView) -> tuple[str, str | None]:
        """(online/offline/straggling/waiting, why) of a node in the last completed round; a
        status message over MQTT that says offline wins (the node is gone now)."""
        r = self.current_round()
        if view.mqtt == "offline":
            return "offline", "status topic"
        if r >= 0 and view.straggle_round == r:
            return ("offline" if view.straggle_reason == "offline" else "straggling"), view.straggle_reason
        if r >= 0 and view.last_round >= r:
            return "online", None
        if view.mqtt == "online":
            return "online", "status topic"
        return ("waiting", None) if r < 0 else ("missing", "no events this round")

    def _board(self, node: int) -> str | None:
        """What the node runs on, as the config says: its kind (sim, emulated board, real board,
        microcontroller) and profile; a real board's profile is its own (`testbed node --profile`)."""
        c = self.config
        if c is None:
            return None
        if node in c.nodes.mcu:
            return f"mcu · {c.nodes.mcu_profile}"
        if c.run.mode == "sim":
            return f"sim · {c.nodes.profile}"
        return f"emulated · {c.nodes.profile}" if c.mqtt.emulated else "board"

    def _row(self, node: int, view: NodeView) -> dict[str, Any]:
        t = view.ledger.totals
        raw = {o: self._epsilon(tally) for o, tally in sorted(view.ledger.by_observer.items())} \
            if self.config is not None else {}
        state, why = self.node_state(view)
        last_seen = None
        if 0 <= view.last_round < len(self.metrics):
            last_seen = self.metrics[view.last_round]["wall_s"]
        board = self._board(node)
        ch = self._channel
        return {
            "id": node, "state": state, "why": why,
            "rounds": t.rounds, "straggled": t.rounds_straggled, "last_round": view.last_round + 1,
            "last_seen_s": last_seen, "status_at": view.mqtt_at,
            "epsilon": _num(max(raw.values(), default=0.0)), "epsilon_by": {o: _num(e) for o, e in raw.items()},
            "energy_j": t.energy_j, "cost_units": t.cost_units, "bytes": t.bytes_total,
            "mi_epsilon": t.mi_epsilon_nats, "board": board, "measured": view.measured,
            "gain": ch.gain[node] if ch is not None and node < len(ch.gain) else None,
            "snr_db": ch.snr_db[node] if ch is not None and node < len(ch.snr_db) else None,
        }
