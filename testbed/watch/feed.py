"""What `testbed watch` shows of a run, read from the files the run writes and nothing else.

A run appends ``metrics.csv`` (a row per round) and ``ledger.csv`` (every node's events) and flushes
both every round; it writes ``summary.json`` when it ends. :class:`RunFeed` tails the two logs from
where it last stopped (whole lines only: a row being written is read next time), keeps a
:class:`~testbed.ledger.node.NodeLedger` per node as the run does, and hands out a full
:meth:`~RunFeed.snapshot` once and then :meth:`~RunFeed.poll` deltas: the run's state, the new metric
rows and only the node rows that changed. Over MQTT the nodes' online/offline status messages come in
through :meth:`~RunFeed.node_status` (any thread).

Nothing in the files is trusted (:mod:`testbed.watch.lines` reads the logs in bounded pieces,
:mod:`testbed.watch.checks` checks each row and field against the run's config): what fails is used
for nothing and shown as the page's error, one line per file naming the line and why; a file
deleted while watched is said, one shrunk or replaced (a new run in the folder, ``--resume``) makes
the page start again from a snapshot.

Everything here is JSON-ready: numbers, strings, None (NaN and ±inf become None). A node's row is
testbed.watch.node_rows', the channel and graph drawn beside the table testbed.watch.channel_and_graph's.

Example::

    >>> import tempfile, pathlib
    >>> feed = RunFeed(pathlib.Path(tempfile.mkdtemp()))
    >>> feed.snapshot()["run"]["status"]
    'waiting'
"""

from __future__ import annotations

import csv
import threading
import time
import tomllib
from pathlib import Path
from typing import Any

from testbed.assembly import assemble
from testbed.errors import UserError
from testbed.ledger.events import CommunicationEvent, ComputeEvent, Event, StraggleEvent
from testbed.ledger.fields import event_from_dict
from testbed.ledger.files import LEDGER_COLUMNS
from testbed.ledger.node import NodeLedger
from testbed.privacy.secrecy import REPRODUCIBLE
from testbed.reports.cost_axis import NONE as NO_COST_AXIS, cost_axis
from testbed.reports.refusals import read_refusals
from testbed.reports.results import METRIC_COLUMNS, read_summary
from testbed.util.dirlock import holder_gone
from testbed.util.userfiles import read_bytes
from testbed.watch.channel_and_graph import ChannelAndGraph, ChannelShown, GraphShown
from testbed.watch.checks import check_event, json_number, metric_row, one_line, summary_view
from testbed.watch.lines import DELETED, LineTail
from testbed.watch.node_rows import NodeRows, NodeView

#: A run with no summary whose files stopped growing for longer than this many mean rounds (and at
#: least STALL_MIN_S) is shown as stalled: killed, or waiting for nodes.
STALL_ROUNDS = 5
STALL_MIN_S = 30.0
#: Nodes the page follows: a config with more is refused (each node's view costs a few kB).
MAX_NODES = 100_000
#: Metric rows kept (one per round): a file with more shows the first ones and says so.
MAX_METRIC_ROWS = 200_000
#: Pieces of a log read per poll (of testbed.watch.lines.PIECE_BYTES each): a poll's time is
#: bounded too, a huge file is read over several polls.
MAX_PIECES_PER_POLL = 64
#: config.toml and summary.json larger than these are not read (a run's are a few kB, and its
#: summary about 1 kB a node).
MAX_CONFIG_BYTES = 1024 * 1024
MAX_SUMMARY_BYTES_PER_NODE = 16 * 1024
#: refusals.csv holds a line of at most ~200 bytes per node (each refuses once): more is not read.
MAX_REFUSAL_BYTES_PER_NODE = 256


#: Keys the page relies on, which a run writes explicitly (its config.toml has every key resolved):
#: a file without them is not a run's, though the defaults would fill them in.
_RUN_KEYS = (("run", "algorithm"), ("run", "seed"), ("data", "num_nodes"))


def _run_written(text: str) -> str:
    """``text`` if it names every key of :data:`_RUN_KEYS`; ValueError naming the first it lacks."""
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"not valid TOML: {exc}") from None
    for section, key in _RUN_KEYS:
        if not isinstance(raw.get(section), dict) or key not in raw[section]:
            raise ValueError(f"lacks {section}.{key}: not the config.toml a run writes")
    return text


def _cells(line: str) -> list[str]:
    """The cells of one CSV line on its own (a quote left open does not swallow the next line)."""
    try:
        return next(csv.reader([line]), [])
    except csv.Error as exc:
        raise ValueError(f"not CSV ({exc})") from None


class RunFeed(ChannelAndGraph, NodeRows):
    """The state of one run directory, read incrementally.

    Every row and field is checked before it is used (:mod:`testbed.watch.checks`); what fails is
    used for nothing and named in ``run["error"]`` (the file, the line and why, with a count), while
    the rest keeps being shown. Memory is bounded whatever the files hold: logs are read in pieces,
    long lines skipped, nodes, metric rows and privacy signatures capped.

    Args:
        run_dir: the run's directory (it may not exist yet: `testbed run --watch` starts the page
            before the run writes anything).
        clock: unix time, for "last seen" and the stall test.
    """

    def __init__(self, run_dir: Path, clock=time.time):
        self.run_dir = Path(run_dir)
        self.clock = clock
        self._status_lock = threading.Lock()
        self._pending_status: dict[int | None, tuple[str, float]] = {}
        self.status_dropped = 0  # status payloads or node ids that were not the run's (see status.py)
        self.status_dropped_last: str | None = None
        self._reset()

    def _reset(self) -> None:
        self.version = 0
        self.config = None
        self.guarantee = "none"  # what the run's releases carry (testbed.assembly.assemble.privacy_guarantee)
        self._config_id: tuple | None = None     # (device, inode, size, mtime) of config.toml as read
        self._config_text: bytes | None = None
        self.summary: dict | None = None         # what the page shows of summary.json, checked
        self._summary_id: tuple | None = None
        self.refused: dict[int, int] = {}        # node → the round it refused for its budget (refusals.csv)
        self._refusals_id: tuple | None = None
        self.metrics: list[dict[str, float | None]] = []
        self.nodes: dict[int, NodeView] = {}
        self._planned: int | None = None
        self._metrics_tail = LineTail(self.run_dir / "metrics.csv", ",".join(METRIC_COLUMNS))
        self._ledger_tail = LineTail(self.run_dir / "ledger.csv", ",".join(LEDGER_COLUMNS))
        self._eps_cache: dict[tuple, float | None] = {}
        self._channel: ChannelShown | None = None
        self._graph: GraphShown | None = None
        self._graph_sent = -1  # the graph's ``drawn`` version last sent in a delta
        self._last_growth = self.clock()
        self._sent_run: dict | None = None
        self.problems: dict[str, tuple[str, int]] = {}  # file name → (its last problem, how many)
        self._reading_failed: str | None = None
        self.coordinator: str | None = None  # its status topic over MQTT, when followed
        self.killed = False  # no summary and the coordinator gone (:meth:`_update_killed`)

    # ------------------------------------------------------------------ inputs

    def node_status(self, node: int, online: bool, at: float | None = None) -> None:
        """A node's status message (thread-safe; applied at the next :meth:`poll`). Only the last
        one of each node counts, so a flood between two polls holds at most one per node."""
        entry = ("online" if online else "offline", self.clock() if at is None else at)
        with self._status_lock:
            if node not in self._pending_status and len(self._pending_status) > MAX_NODES:
                self._count_dropped(f"node {node}: more nodes than the page follows")
                return
            self._pending_status[int(node)] = entry

    def coordinator_status(self, online: bool) -> None:
        """The coordinator's status message (thread-safe): offline without a summary is a killed run."""
        with self._status_lock:
            self._pending_status[None] = ("online" if online else "offline", self.clock())

    def status_malformed(self, what: str) -> None:
        """A status message that is not the run's (a payload other than online/offline; thread-safe):
        dropped, counted and shown, never read as a state."""
        with self._status_lock:
            self._count_dropped(what)

    def _count_dropped(self, what: str) -> None:
        self.status_dropped += 1
        self.status_dropped_last = what[:200]

    def poll(self) -> dict | None:
        """Read what the run wrote since the last call. Returns a delta (``run``, ``budgets``, new ``metrics``
        rows, changed ``nodes`` rows, ``version``; ``reset: True`` when a file shrank or was replaced
        and the page must take the snapshot again), or None when nothing changed."""
        start_version = self.version
        first_metric = len(self.metrics)
        self._reading_failed = None  # said again by the server if this poll fails too
        if self._read_files():  # a new run in the folder, or --resume dropped rows: read it all again
            self._reset()
            self._read_files()
            self.version += 1
            return {"reset": True, "version": self.version}
        self._apply_statuses()
        if len(self.metrics) > first_metric or self.version != start_version:
            self._last_growth = self.clock()
        self._update_killed()
        self._update_channel()
        self._update_graph()
        run = self.run_info()
        nodes = [self._row(n, v) for n, v in sorted(self.nodes.items()) if v.version > start_version]
        graph = self._graph if self._graph is not None and self._graph.drawn > self._graph_sent else None
        if not nodes and len(self.metrics) == first_metric and run == self._sent_run and graph is None:
            return None
        self._sent_run = run
        self.version += 1
        delta = {"version": self.version, "run": run, "budgets": self.budgets(),
                 "metrics": self.metrics[first_metric:], "nodes": nodes}
        if graph is not None:  # only when it changed: a graph is up to MAX_GRAPH_EDGES pairs
            delta["graph"], self._graph_sent = graph.shown, graph.drawn
        return delta

    def snapshot(self) -> dict:
        """Everything the page shows: ``run``, ``budgets``, all ``metrics`` rows, all ``nodes`` rows."""
        """Everything the page shows: ``run``, ``budgets``, all ``metrics`` rows, all ``nodes`` rows
        and, for a decentralised run, the current ``graph`` (else None)."""
        return {"version": self.version, "run": self.run_info(), "budgets": self.budgets(),
                "metrics": list(self.metrics), "nodes": [self._row(n, v) for n, v in sorted(self.nodes.items())],
                "graph": self._graph.shown if self._graph is not None else None}

    # ------------------------------------------------------------------ reading

    def reading_failed(self, message: str) -> dict:
        """Show that :meth:`poll` failed (the server's word for it): on the page as ``watch``'s
        error until a poll succeeds, so what is shown is not taken for current. Returns the delta
        that says so."""
        self._reading_failed = message
        self.version += 1
        self._sent_run = run = self.run_info()
        return {"version": self.version, "run": run, "budgets": self.budgets(), "metrics": [], "nodes": []}

    def _problem(self, name: str, message: str) -> None:
        """Note what is wrong with a file; the same thing said again (an unreadable file, every
        poll) is not another problem."""
        last, count = self.problems.get(name, ("", 0))
        self.problems[name] = (message, count + (message != last))

    def _read_files(self) -> bool:
        """Read what is new in every file; True if one is not the file read so far."""
        if self._read_config():
            return True
        if self._read_log(self._metrics_tail, self._take_metric):
            return True
        # Events are checked against the run's nodes and rounds: without its config they wait.
        if self.config is not None and self._read_log(self._ledger_tail, self._take_event):
            return True
        self._read_summary()
        if self.config is not None:  # refusals are checked against the run's nodes and rounds
            self._read_refusals()
        return False

    def _read_log(self, tail: LineTail, take) -> bool:
        """Every whole line new in ``tail`` (up to :data:`MAX_PIECES_PER_POLL` pieces; the rest at
        the next poll), each given to ``take`` (ValueError: the line is used for nothing and
        named); True if the file is not the one read so far."""
        for _ in range(MAX_PIECES_PER_POLL):
            piece = tail.read()
            for problem in piece.problems:
                self._problem(tail.path.name, problem)
            if piece.restarted:
                return True
            if piece.lines:
                self.version += 1
            for line, text in piece.lines:
                try:
                    take(text)
                except ValueError as exc:
                    self._problem(tail.path.name, f"line {line}: {exc}")
            if not piece.more:
                break
        return False

    def _file_id(self, name: str) -> tuple | None:
        """(device, inode, size, mtime) of a run file; None if it is absent or unreadable (said)."""
        try:
            st = (self.run_dir / name).stat()
        except FileNotFoundError:
            return None
        except OSError as exc:
            self._problem(name, f"unreadable ({exc.strerror or type(exc).__name__})")
            return None
        return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns

    def _read_config(self) -> bool:
        """Read config.toml once it is there, and again when it changes; True if it changed after
        being read (another run in the folder)."""
        name = "config.toml"
        ident = self._file_id(name)
        if ident is None:
            if self._config_id is not None:  # said once: the same problem again is not counted
                self._problem(name, DELETED)
            return False
        if ident == self._config_id:
            return False
        self._config_id = ident
        if ident[2] > MAX_CONFIG_BYTES:
            self._problem(name, f"{ident[2]} bytes, more than an experiment file holds ({MAX_CONFIG_BYTES}); not read")
            return self._config_text is not None
        try:
            text = read_bytes(self.run_dir / name, MAX_CONFIG_BYTES, "")
        except UserError as exc:
            self._problem(name, f"unreadable ({str(exc).removeprefix(f' {self.run_dir / name}: ')})")
            return False
        if self._config_text is not None:
            return text != self._config_text
        self._config_text = text
        from testbed.assembly.config import load_config_text

        try:
            config = load_config_text(_run_written(text.decode("utf-8")), source=name, base_dir=self.run_dir)
        except UnicodeDecodeError as exc:
            self._problem(name, f"not UTF-8 text (byte {exc.start})")
            return False
        except RecursionError:
            self._problem(name, "not valid TOML: nested too deep")
            return False
        except (UserError, ValueError) as exc:
            self._problem(name, one_line(exc))
            return False
        if config.data.num_nodes > MAX_NODES:
            self._problem(name, f"data.num_nodes = {config.data.num_nodes}: more than the page follows ({MAX_NODES})")
            return False
        self.config, self._planned = config, assemble.planned_rounds(config)
        self.guarantee = assemble.privacy_guarantee(config)
        self.version += 1
        for node in range(config.data.num_nodes):
            self._view(node).version = self.version
        try:
            view = assemble.channel_view(config)
        except ValueError as exc:  # the page shows the rest of the run without its channel
            self._problem(name, f"the radio: {one_line(exc)}")
        else:
            if view is not None:
                self._channel = ChannelShown(view)
        self._read_graph(config)
        return False

    def _take_metric(self, text: str) -> None:
        if len(self.metrics) >= MAX_METRIC_ROWS:
            raise ValueError(f"more than {MAX_METRIC_ROWS} rounds: the page shows the first {MAX_METRIC_ROWS}")
        last_round = int(self.metrics[-1]["round"]) if self.metrics else 0
        num_nodes = self.config.data.num_nodes if self.config is not None else None
        self.metrics.append(metric_row(_cells(text), last_round, num_nodes, self._planned))

    def _take_event(self, text: str) -> None:
        cells = _cells(text)
        if len(cells) != len(LEDGER_COLUMNS):
            raise ValueError(f"{len(cells)} cells, the header has {len(LEDGER_COLUMNS)}")
        event = event_from_dict(dict(zip(LEDGER_COLUMNS, cells)))
        view = self.nodes.get(event.node)
        check_event(event, self.config.data.num_nodes, self._planned, view.ledger if view else None)
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
        """summary.json, checked as every reader of a run checks it (JSON, its keys, its sha256),
        then each field the page uses for its type; read again whenever it changes. Until a
        summary passes, none is shown: an old one is not presented as the run's."""
        name = "summary.json"
        ident = self._file_id(name)
        if ident is None:
            if self._summary_id is not None:
                self._summary_id, self.summary = None, None
                self._problem(name, "deleted while watched; the run is shown without it")
            return
        if ident == self._summary_id:
            return
        self._summary_id, self.summary = ident, None
        self.problems.pop(name, None)  # another summary: the last one's problem is not this one's
        num_nodes = self.config.data.num_nodes if self.config is not None else 1
        limit = 64 * 1024 + MAX_SUMMARY_BYTES_PER_NODE * num_nodes
        if ident[2] > limit:
            self._problem(name, f"{ident[2]} bytes, more than a summary of {num_nodes} nodes holds ({limit}); not read")
            return
        try:
            self.summary = summary_view(read_summary(self.run_dir))
        except UserError as exc:  # read_summary's one line (a summary nested too deeply included)
            self._problem(name, str(exc).removeprefix(f"{self.run_dir / name}: "))
        except ValueError as exc:
            self._problem(name, f"damaged: {one_line(exc)}")

    def _apply_statuses(self) -> None:
        with self._status_lock:
            pending, self._pending_status = self._pending_status, {}
        for node, (status, at) in pending.items():
            if node is None:
                self.coordinator = status
                continue
            if self.config is None:  # not known yet whether it is one of the run's nodes
                with self._status_lock:
                    self._pending_status.setdefault(node, (status, at))
                continue
            if not 0 <= node < self.config.data.num_nodes:
                with self._status_lock:
                    self._count_dropped(f"node {node}: not one of the run's {self.config.data.num_nodes} nodes")
                continue
            view = self._view(node)
            if (view.mqtt, view.mqtt_at) != (status, at):
                self.version += 1
                view.mqtt, view.mqtt_at, view.version = status, at, self.version

    def _update_killed(self) -> None:
        """Whether the run ended without a summary, its coordinator gone: its MQTT will came
        (status offline), or the process that holds the run directory's lock ended without
        releasing it (a kill; seen at the next poll, in sim and over MQTT, where an embedded
        broker dies with the coordinator and no will gets out). A change sends every node row
        again: what a node is shown as depends on it (:meth:`node_state`)."""
        killed = self.summary is None and self.config is not None and (
            self.coordinator == "offline" or holder_gone(self.run_dir))
        if killed != self.killed:
            self.killed = killed
            self.version += 1
            for view in self.nodes.values():
                view.version = self.version

    def _view(self, node: int) -> NodeView:
        view = self.nodes.get(node)
        if view is None:
            view = self.nodes[node] = NodeView(NodeLedger(node), version=self.version)
        return view

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
                "mi_epsilon": b.mi_epsilon, "delta": p.delta, "accountant": p.accountant, "guarantee": self.guarantee}

    def _read_refusals(self) -> None:
        """refusals.csv, checked as a resume checks it (testbed.reports.refusals); read again
        whenever it changes. A file that fails the checks shows no refusals and says why."""
        name = "refusals.csv"
        ident = self._file_id(name)
        if ident is None:
            if self._refusals_id is not None:
                self._problem(name, "deleted while watched; no refusals are shown")
            self._refusals_id = None
            self._set_refused({})
            return
        if ident == self._refusals_id:
            return
        self._refusals_id = ident
        self.problems.pop(name, None)
        num_nodes = self.config.data.num_nodes
        limit = 64 + MAX_REFUSAL_BYTES_PER_NODE * num_nodes
        refused: dict[int, int] = {}
        try:
            if ident[2] > limit:
                raise UserError(f"{ident[2]} bytes, more than the refusals of {num_nodes} nodes take ({limit}); not read")
            refused = {r.node: r.round for r in read_refusals(self.run_dir / name, range(num_nodes),
                                                               (self._planned or 2**62) - 1)}
        except UserError as exc:
            self._problem(name, str(exc).removeprefix(f"{self.run_dir / name}: "))
        self._set_refused(refused)

    def _set_refused(self, refused: dict[int, int]) -> None:
        """Take ``refused`` (node → round) as the run's refusals; the rows of the nodes it changes are sent again."""
        changed = {n for n in {*refused, *self.refused} if refused.get(n) != self.refused.get(n)}
        self.refused = refused
        if changed:
            self.version += 1
            for node in changed:
                self._view(node).version = self.version

    def run_info(self) -> dict[str, Any]:
        """The run's progress, time left and status (``waiting``, ``running``, ``stalled``,
        ``killed`` (its coordinator's MQTT will came and no summary), or the summary's
        ``completed``/``stopped_budget``/``failed``)."""
        c, s = self.config, self.summary
        done = len(self.metrics)
        planned = self._planned
        wall = self.metrics[-1]["wall_s"] if self.metrics else None
        errors = self.errors()
        info: dict[str, Any] = {
            "run_dir": str(self.run_dir), "rounds_done": done, "rounds_planned": planned, "wall_s": wall,
            "error": " · ".join(f"{name}: {text}" for name, text in errors.items()) or None, "errors": errors,
            "coordinator": self.coordinator, "status_dropped": self.status_dropped, "refusals": len(self.refused),
            "status_dropped_last": self.status_dropped_last,
            "cost_axis": cost_axis(self.metrics),
            "cost_axis_none": NO_COST_AXIS if self.metrics else "accuracy and loss against cost: drawn from round 1",
        }
        if c is not None:
            info.update(name=c.run.name, algorithm=c.run.algorithm, mode=c.run.mode, seed=c.run.seed,
                        num_nodes=c.data.num_nodes, profile=c.nodes.profile, dataset=c.data.dataset)
        if s is not None:
            info.update(status=s["status"], stopped=s["stopped"], failure=s["failure"], rounds_done=s["rounds"],
                        wall_s=s["wall_s"], setup_s=s["setup_s"], eta_s=0.0, secrecy=s["secrecy"],
                        quote=s["quote"])
            return info
        info["secrecy"] = self._secrecy_so_far()
        recent = self.metrics[-10:]
        round_s = None
        if len(recent) >= 2 and recent[-1]["wall_s"] is not None and recent[0]["wall_s"] is not None:
            round_s = (recent[-1]["wall_s"] - recent[0]["wall_s"]) / (len(recent) - 1)
        elif recent and recent[0]["wall_s"] is not None:
            round_s = recent[0]["wall_s"]
        info["eta_s"] = None if round_s is None or planned is None else json_number(max(planned - done, 0) * max(round_s, 0.0))
        idle_s = self.clock() - self._last_growth
        stall_s = max(STALL_MIN_S, STALL_ROUNDS * (round_s or 0.0))
        if c is None:
            info["status"] = "waiting"
        elif self.killed:
            info["status"] = "killed"  # its will was published, or its process ended, and no summary
        elif idle_s > stall_s:
            info["status"] = "stalled"  # no summary, no growth: killed, or waiting for its nodes
        else:
            info["status"] = "running"
        info["idle_s"] = round(idle_s, 1)
        return info

    def _secrecy_so_far(self) -> list[str]:
        """Whose randomness a run without a summary yet uses: a sim run's is the run seed; over
        MQTT each node's ready said it to the coordinator, and the summary will say it."""
        if self.config is None or self.guarantee == "none":
            return []
        if self.config.run.mode == "sim":
            return [REPRODUCIBLE]
        return ["whose randomness: each node told the coordinator; shown here when the run ends"]

    def errors(self) -> dict[str, str]:
        """File name → what is wrong with it, one line (with how many problems it had), and a line
        cut short at the end of a log once the run is over or stalled."""
        errors = {name: text if count == 1 else f"{text} (the last of {count} problems)"
                  for name, (text, count) in self.problems.items()}
        if self._reading_failed is not None:
            errors["watch"] = self._reading_failed
        for tail in (self._metrics_tail, self._ledger_tail):
            if tail.pending_bytes and tail.path.name not in errors and self._stopped_growing():
                errors[tail.path.name] = f"its last line is cut short ({tail.pending_bytes} bytes), not used"
        return errors

    def _stopped_growing(self) -> bool:
        return self.summary is not None or self.clock() - self._last_growth > STALL_MIN_S


