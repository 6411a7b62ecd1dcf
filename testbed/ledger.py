"""Each node's append-only log of what it spent: compute, communication and privacy events.

Events are small immutable records, kept apart from what reads them (accountants, budgets, reports),
the way dp-accounting keeps its ``DpEvent``s apart from its accountants. A node appends the events
of a step only after :meth:`Budgets.would_exceed <testbed.budgets.Budgets.would_exceed>` said they fit.

Example::

    >>> led = NodeLedger(node=0)
    >>> led.extend([ComputeEvent(node=0, round=0, local_steps=10, cost_units=10.0)])
    >>> led.totals.local_steps
    10
"""

from __future__ import annotations

import bisect
import csv
import dataclasses
import io
import math
import operator
import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping, Sequence, Union

import numpy as np

from testbed.appendlog import AppendLog, Mark as LedgerMark
from testbed.errors import UserError
from testbed.frozen import frozen


@dataclass(frozen=True)
class ComputeEvent:
    """Local computation of one node in one round.

    ``cost_units``: the abstract c2·steps of DP-PASGD eq. (8). ``measured``: True when seconds and
    joules come from a meter, False when from a model (device profile, host share).
    """

    node: int
    round: int
    local_steps: int
    cost_units: float = 0.0
    compute_s: float = 0.0
    energy_j: float = 0.0
    measured: bool = False

    kind = "compute"


@dataclass(frozen=True)
class CommunicationEvent:
    """One exchange of a node with the server or its peers in one round.

    ``bytes_up``/``bytes_down``: tensor payload bytes (transport framing excluded, so sim and mqtt
    ledgers agree). ``cost_units``: the abstract c1 per round of DP-PASGD eq. (8).
    """

    node: int
    round: int
    bytes_up: int
    bytes_down: int
    cost_units: float = 0.0
    airtime_s: float = 0.0
    energy_j: float = 0.0
    measured: bool = False

    kind = "communication"


@dataclass(frozen=True)
class GaussianEvent:
    """``count`` compositions of a Gaussian mechanism run by a node on its own data.

    Attributes:
        sigma: std of the noise added to the released quantity.
        sensitivity: its L2 sensitivity under ``adjacency`` ("replace_one" or "add_remove").
        sampling: how the records entering each composition were chosen: "none" (all of them, or
            no amplification claimed), "without_replacement" (a fixed-size uniform batch), "poisson".
        sampling_rate: batch size over dataset size (expected size for Poisson); 1 for "none".
        observer: whom the noise protects the node's data against, the first party to see the
            release: "server" (an upload), "peers" (a D2D or over-the-air exchange) or "public"
            (a broadcast anyone may hear). What an observer passes on is post-processing.
        issuer: "node" (the node's own step) or "server" (issued on the node's behalf: server-side
            noise, or a correction when what happened was less private than planned).
        clip_norm: the clipping bound the sensitivity derives from (DP-PASGD's per-sample gradient
            clip C, DWFL's g_max, PADPFL's weight bound B); 0 when it is the model's own gradient
            bound (no clipping). A record, not part of the accounting (the sensitivity is).
    """

    node: int
    round: int
    sigma: float
    sensitivity: float
    count: int
    adjacency: str = "replace_one"
    sampling: str = "none"
    sampling_rate: float = 1.0
    observer: str = "server"
    issuer: str = "node"
    clip_norm: float = 0.0

    kind = "privacy"

    @property
    def signature(self) -> tuple:
        """What an accountant needs of one composition; events with equal signatures just add counts."""
        return (self.sigma, self.sensitivity, self.adjacency, self.sampling, self.sampling_rate)


#: Whom a privacy event protects against (GaussianEvent.observer), and who issued it.
OBSERVERS = ("server", "peers", "public")
ISSUERS = ("node", "server")
#: Why a node missed a round (StraggleEvent.reason).
STRAGGLE_REASONS = ("emulated", "deadline", "offline", "refused_update", "no_exchange")


@dataclass(frozen=True)
class StraggleEvent:
    """The node missed the round: ``reason`` is "emulated" (the straggler model), "deadline" (no
    answer in time), "offline", "refused_update" (its answer failed validation) or "no_exchange"
    (too few peers transmitted). It costs nothing; what the node did release is charged apart."""

    node: int
    round: int
    reason: str

    kind = "straggle"


@dataclass(frozen=True)
class MutualInfoEvent:
    """A release whose privacy is ε-MI-DP (Cuff and Yu): sup I(Z_jk; release | Z^-jk) <= ``epsilon_nats``,
    in nats, per entry of the node's data (ACFL's one-time coded data set, Theorem 1). Its own kind
    with its own budget (``budget.mi_epsilon``): never composed with (ε, δ) events; several add up
    (the chain rule of mutual information, conservative)."""

    node: int
    round: int
    epsilon_nats: float

    kind = "mutual_info"


Event = Union[ComputeEvent, CommunicationEvent, GaussianEvent, StraggleEvent, MutualInfoEvent]
EVENT_TYPES = {cls.kind: cls for cls in (ComputeEvent, CommunicationEvent, GaussianEvent, StraggleEvent,
                                         MutualInfoEvent)}
_FIELD_NAMES = {cls: frozenset(f.name for f in dataclasses.fields(cls)) for cls in EVENT_TYPES.values()}


def with_fields(event: Event, **changes: object) -> Event:
    """``dataclasses.replace(event, **changes)`` in a fifth of its time (a node makes three a round,
    a coordinator two a reply): an event is a frozen dataclass whose ``__init__`` only stores its
    fields, so a copy of its fields with ``changes`` over them is the event it would build.

    Example::

        >>> with_fields(ComputeEvent(0, 3, local_steps=10), node=4, compute_s=0.5)
        ComputeEvent(node=4, round=3, local_steps=10, cost_units=0.0, compute_s=0.5, energy_j=0.0, measured=False)
    """
    cls = type(event)
    if not changes.keys() <= _FIELD_NAMES[cls]:
        raise TypeError(f"{cls.__name__} has no field {sorted(changes.keys() - _FIELD_NAMES[cls])[0]!r}")
    return frozen(cls, event.__dict__, changes)


@dataclass(frozen=True)
class EventBatch:
    """One event per node for M nodes that differ only in some fields, as columns: what a round's
    nodes released, charged and logged without M event objects.

    Attributes:
        template: the event every row is built from (its ``node`` is replaced by each node's).
        nodes: (M,) int64 node ids, each at most once.
        columns: field name → (M,) values of the fields that differ by node (e.g. DP-PASGD's
            sampling rate when the nodes hold different amounts of data).

    Example::

        >>> b = EventBatch(ComputeEvent(0, 3, local_steps=10), np.array([4, 7]),
        ...                {"cost_units": np.array([1.0, 2.0])})
        >>> [(e.node, e.cost_units) for e in b.events()]
        [(4, 1.0), (7, 2.0)]
    """

    template: Event
    nodes: np.ndarray
    columns: Mapping[str, np.ndarray] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        return self.template.kind

    @property
    def round(self) -> int:
        return self.template.round

    def __len__(self) -> int:
        return len(self.nodes)

    def value(self, name: str) -> object:
        """The field ``name``: its (M,) column, or the template's value every row shares."""
        return self.columns[name] if name in self.columns else getattr(self.template, name)

    def events(self) -> list[Event]:
        names = list(self.columns)
        cols = [np.asarray(self.columns[n]).tolist() for n in names]
        return [with_fields(self.template, node=node, **dict(zip(names, values)))
                for node, *values in zip(np.asarray(self.nodes).tolist(), *cols)]

    def take(self, positions: np.ndarray) -> "EventBatch":
        """The rows at ``positions`` (indices or a boolean mask)."""
        return EventBatch(self.template, self.nodes[positions], {k: v[positions] for k, v in self.columns.items()})

    def map(self, fn: Callable[[Event], Event]) -> "EventBatch":
        """``fn`` applied to each distinct row (the node aside): e.g. charging a cost model once per
        distinct event, not once per node. ``fn`` must keep the event's kind."""
        groups = list(self.groups())
        if len(groups) == 1:
            return EventBatch(fn(groups[0][0]), self.nodes)
        outs = [fn(event) for event, _ in groups]
        names = [f.name for f in dataclasses.fields(outs[0])
                 if f.name != "node" and len({getattr(o, f.name) for o in outs}) > 1]
        columns = {}
        for name in names:
            col = np.empty(len(self.nodes), dtype=np.asarray(getattr(outs[0], name)).dtype)
            for out, (_, positions) in zip(outs, groups):
                col[positions] = getattr(out, name)
            columns[name] = col
        return EventBatch(outs[0], self.nodes, columns)

    def groups(self) -> Iterator[tuple[Event, np.ndarray]]:
        """(the event of one distinct combination of the columns' values, the positions of its rows),
        its ``node`` left as the template's."""
        if not self.columns:
            yield self.template, np.arange(len(self.nodes))
            return
        code = np.zeros(len(self.nodes), dtype=np.int64)
        uniques = []
        for col in self.columns.values():
            u, inv = np.unique(col, return_inverse=True)
            code = code * len(u) + inv
            uniques.append(u)
        distinct, first, inv = np.unique(code, return_index=True, return_inverse=True)
        order = np.argsort(inv, kind="stable")
        bounds = np.searchsorted(inv[order], np.arange(len(distinct) + 1))
        for g, row in enumerate(first.tolist()):
            values = {name: col[row].item() for name, col in self.columns.items()}
            yield dataclasses.replace(self.template, **values), order[bounds[g]:bounds[g + 1]]


def batches_of(events: Iterable[Event]) -> list[EventBatch]:
    """``events`` (of any nodes, kinds and rounds) as few batches as they allow: one per kind, round
    and occurrence (a node's second event of a kind in a round opens a second batch), with the
    fields that differ as columns. Each event is in exactly one batch.

    Example::

        >>> bs = batches_of([ComputeEvent(1, 0, 5), ComputeEvent(2, 0, 6), StraggleEvent(3, 0, "deadline")])
        >>> [(b.kind, b.nodes.tolist(), list(b.columns)) for b in bs]
        [('compute', [1, 2], ['local_steps']), ('straggle', [3], [])]
    """
    groups: dict[tuple, list[Event]] = {}
    seen: Counter = Counter()
    for event in events:
        key = (type(event), event.round)
        nth = seen[key, event.node]
        seen[key, event.node] += 1
        groups.setdefault((key, nth), []).append(event)
    batches = []
    for group in groups.values():
        first = group[0]
        fields = _FIELDS[first.kind]
        # Each field's values over the group, read and compared in C (a coordinator charges a
        # batch of 80 nodes' replies every round).
        columns = dict(zip(fields, zip(*map(operator.attrgetter(*fields), group))))  # every kind has node, round
        nodes = np.array(columns.pop("node"), dtype=np.int64)
        batches.append(EventBatch(first, nodes, {n: np.array(values) for n, values in columns.items()
                                                 if values.count(values[0]) != len(values)}))
    return batches


class NodeEvents(Sequence):
    """What each of M nodes released in one step, as batches over the same M nodes: it reads as the
    contract's per-node lists (``events[i]`` is node ``nodes[i]``'s), and is charged and logged as
    columns.

    Example::

        >>> ev = NodeEvents.uniform([ComputeEvent(0, 2, local_steps=5)], [3, 8])
        >>> len(ev), ev[1]
        (2, [ComputeEvent(node=8, round=2, local_steps=5, cost_units=0.0, compute_s=0.0, energy_j=0.0, measured=False)])
    """

    def __init__(self, batches: Sequence[EventBatch], nodes: Sequence[int] | np.ndarray):
        self.nodes = np.asarray(nodes, dtype=np.int64)
        self.batches = list(batches)
        if any(len(b.nodes) != len(self.nodes) for b in self.batches):
            raise ValueError("every batch of a NodeEvents holds one row per node")

    @classmethod
    def uniform(cls, templates: Sequence[Event], nodes: Sequence[int] | np.ndarray) -> "NodeEvents":
        """Every node releases ``templates`` but for the node field."""
        ids = np.asarray(nodes, dtype=np.int64)
        return cls([EventBatch(t, ids) for t in templates], ids)

    @classmethod
    def from_lists(cls, lists: Sequence[Sequence[Event]], nodes: Sequence[int] | np.ndarray) -> "NodeEvents | None":
        """The per-node lists of the contract as batches, when every node released the same kinds
        of events in the same order (else None): the fields that differ become columns."""
        ids = np.asarray(nodes, dtype=np.int64)
        if not len(lists) or len({tuple(type(e) for e in events) for events in lists}) != 1:
            return None
        batches = []
        for k, first in enumerate(lists[0]):
            names = [f.name for f in dataclasses.fields(first)
                     if f.name != "node" and any(getattr(events[k], f.name) != getattr(first, f.name) for events in lists)]
            columns = {n: np.array([getattr(events[k], n) for events in lists]) for n in names}
            batches.append(EventBatch(first, ids, columns))
        return cls(batches, ids)

    def __len__(self) -> int:
        return len(self.nodes)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        node = int(self.nodes[i])
        return [with_fields(b.template, node=node, **{k: v[i].item() for k, v in b.columns.items()})
                for b in self.batches]


#: What one event of each kind adds to a node's totals: (total, the event field it adds; None: one).
TOTALS_OF: dict[str, tuple[tuple[str, str | None], ...]] = {
    "compute": (("local_steps", "local_steps"), ("cost_units", "cost_units"), ("compute_s", "compute_s"),
                ("energy_j", "energy_j")),
    "communication": (("rounds", None), ("cost_units", "cost_units"), ("bytes_up", "bytes_up"),
                      ("bytes_down", "bytes_down"), ("airtime_s", "airtime_s"), ("energy_j", "energy_j")),
    "straggle": (("rounds_straggled", None),),
    "mutual_info": (("mi_epsilon_nats", "epsilon_nats"),),
}


@dataclass
class Totals:
    """Running sums over a node's events (derived; the events on disk stay the record)."""

    local_steps: int = 0
    rounds: int = 0
    cost_units: float = 0.0
    bytes_up: int = 0
    bytes_down: int = 0
    compute_s: float = 0.0
    airtime_s: float = 0.0
    energy_j: float = 0.0
    rounds_straggled: int = 0
    mi_epsilon_nats: float = 0.0

    def add(self, event: Event) -> None:
        for total, source in TOTALS_OF.get(event.kind, ()):
            setattr(self, total, getattr(self, total) + (1 if source is None else getattr(event, source)))

    @property
    def bytes_total(self) -> int:
        return self.bytes_up + self.bytes_down


class RoundSet:
    """The round indices a node logged, as sorted disjoint half-open intervals [start, stop).

    A node logs rounds mostly in order, so a run of R rounds costs one interval, not R set entries
    (a set of ints per node grew by ~30 bytes per round for the whole run, for every node).

    Example::

        >>> rs = RoundSet()
        >>> for r in (0, 1, 2, 5): rs.add(r)
        >>> (2 in rs, 3 in rs, len(rs), rs.intervals)
        (True, False, 4, [[0, 3], [5, 6]])
    """

    __slots__ = ("intervals",)

    def __init__(self) -> None:
        self.intervals: list[list[int]] = []

    def add(self, r: int) -> None:
        iv = self.intervals
        if iv and iv[-1][0] <= r <= iv[-1][1]:  # the common case: this round or the next one
            iv[-1][1] = max(iv[-1][1], r + 1)
            return
        i = bisect.bisect_right(iv, [r, float("inf")])  # first interval starting after r
        if i and iv[i - 1][1] >= r:  # r inside or just after the interval before
            iv[i - 1][1] = max(iv[i - 1][1], r + 1)
            i -= 1
        else:
            iv.insert(i, [r, r + 1])
        if i + 1 < len(iv) and iv[i + 1][0] <= iv[i][1]:  # now touches the next one: merge
            iv[i][1] = max(iv[i][1], iv.pop(i + 1)[1])

    def __contains__(self, r: object) -> bool:
        iv = self.intervals
        if not isinstance(r, int) or not iv:
            return False
        i = bisect.bisect_right(iv, [r, float("inf")])
        return i > 0 and iv[i - 1][0] <= r < iv[i - 1][1]

    def __len__(self) -> int:
        return sum(stop - start for start, stop in self.intervals)


# Rounds whose joules are still summed apart; older rounds are folded into one running maximum.
_ENERGY_WINDOW = 4


@dataclass
class NodeLedger:
    """What one node spent: running totals and the privacy compositions tallied by signature:
    all of them (``privacy``) and per observer (``by_observer``).

    The events themselves live on disk (``ledger.csv``, read back with :func:`read_ledger`): keeping
    them here too grew by about a kilobyte per round per node for the whole run.

    Example::

        >>> led = NodeLedger(node=0)
        >>> led.extend([GaussianEvent(node=0, round=0, sigma=1.0, sensitivity=0.1, count=5)])
        >>> (led.has_round(0), led.has_round(1), sum(led.privacy.values()))
        (True, False, 5)
    """

    node: int
    totals: Totals = field(default_factory=Totals)
    privacy: Counter = field(default_factory=Counter)
    by_observer: dict[str, Counter] = field(default_factory=dict)
    rounds_logged: RoundSet = field(default_factory=RoundSet)
    server_rounds: RoundSet = field(default_factory=RoundSet)
    # Joules per round of the last _ENERGY_WINDOW rounds seen; older ones only count through their max.
    round_energy_j: dict = field(default_factory=dict)
    _folded_energy_j: float = 0.0
    _folded_below: int = 0  # rounds < this were folded into _folded_energy_j

    def extend(self, events: Iterable[Event]) -> None:
        for event in events:
            if event.node != self.node:
                raise ValueError(f"event of node {event.node} offered to the ledger of node {self.node}")
            if getattr(event, "issuer", "node") == "server":
                self.server_rounds.add(event.round)
            elif not isinstance(event, StraggleEvent):
                self.rounds_logged.add(event.round)
            if isinstance(event, (ComputeEvent, CommunicationEvent)):
                self._add_energy(event.round, event.energy_j)
            self.totals.add(event)
            if isinstance(event, GaussianEvent):
                self.privacy[event.signature] += event.count
                self.by_observer.setdefault(event.observer, Counter())[event.signature] += event.count

    def _add_energy(self, r: int, energy_j: float) -> None:
        if r < self._folded_below:
            # A late event of a round already folded: its round's sum is gone, so add it to the max
            # (the forecast may only err towards more spend).
            self._folded_energy_j += energy_j
            return
        self.round_energy_j[r] = self.round_energy_j.get(r, 0.0) + energy_j
        if len(self.round_energy_j) > _ENERGY_WINDOW:
            oldest = min(self.round_energy_j)
            self._folded_energy_j = max(self._folded_energy_j, self.round_energy_j.pop(oldest))
            self._folded_below = oldest + 1

    def has_round(self, round_index: int) -> bool:
        """Whether the node's own events of ``round_index`` are already logged (a node that re-runs
        a round after a restart releases the same values again, from the same random streams:
        nothing new to charge)."""
        return round_index in self.rounds_logged

    def has_server_events(self, round_index: int) -> bool:
        """Whether events the server issued on this node's behalf for ``round_index`` are logged."""
        return round_index in self.server_rounds

    @property
    def max_round_energy_j(self) -> float:
        """Joules of the costliest round logged (0 before any): the forecast of the next round's."""
        return max(self._folded_energy_j, max(self.round_energy_j.values(), default=0.0))

    def projected(self, events: Iterable[Event]) -> tuple[Totals, dict[str, Counter]]:
        """Totals and the per-observer privacy tallies as they would be after ``events``, without
        appending them."""
        return projected(self.totals, self.by_observer, events)


def projected(totals: Totals, by_observer: Mapping[str, Counter], events: Iterable[Event]
              ) -> tuple[Totals, dict[str, Counter]]:
    """Copies of a node's ``totals`` and per-observer tallies with ``events`` added (the budget
    check's forecast); the originals are left as they are."""
    totals = dataclasses.replace(totals)
    tallies = {observer: Counter(tally) for observer, tally in by_observer.items()}
    for event in events:
        totals.add(event)
        if isinstance(event, GaussianEvent):
            tallies.setdefault(event.observer, Counter())[event.signature] += event.count
    return totals, tallies


LEDGER_COLUMNS = ["kind"] + list(
    dict.fromkeys(f.name for cls in EVENT_TYPES.values() for f in dataclasses.fields(cls))
)
#: Per event class: its row with the other kinds' columns blank, and (column, field) to fill in.
_ROW_TEMPLATES = {
    cls: (["" if c != "kind" else cls.kind for c in LEDGER_COLUMNS],
          [(LEDGER_COLUMNS.index(f.name), f.name) for f in dataclasses.fields(cls)])
    for cls in EVENT_TYPES.values()
}


def _row(event: Event) -> list:
    """The ledger.csv row of ``event`` (getattr on its own fields only: this runs for every event
    of every node every round)."""
    template, fields = _ROW_TEMPLATES[type(event)]
    row = template.copy()
    for column, name in fields:
        row[column] = getattr(event, name)
    return row


_SLOT = "\x00"  # marks a column's place in a batch's row; never in a formatted value


def _batch_text(batch: EventBatch) -> str:
    """The ledger.csv rows of ``batch``: the template's row through csv once, with a slot for each
    column that differs by node, then the columns' values (Python's str, as csv writes them)."""
    template, fields = _ROW_TEMPLATES[type(batch.template)]
    row = template.copy()
    for column, name in fields:
        row[column] = getattr(batch.template, name)
    varying = ["node", *batch.columns]
    for column, name in fields:
        if name in varying:
            row[column] = f"{_SLOT}{varying.index(name)}{_SLOT}"
    buf = io.StringIO()
    csv.writer(buf).writerow(row)
    pieces = buf.getvalue().split(_SLOT)  # text, slot index, text, slot index, ..., text
    texts, slots = pieces[0::2], [int(k) for k in pieces[1::2]]
    values = [batch.nodes, *batch.columns.values()]
    cols = [list(map(str, np.asarray(values[k]).tolist())) for k in slots]
    if len(cols) == 1:
        head, tail = texts
        return "".join([head + v + tail for v in cols[0]])
    out = []
    for vals in zip(*cols):
        out.append(texts[0])
        for v, text in zip(vals, texts[1:]):
            out.append(v)
            out.append(text)
    return "".join(out)


class LedgerWriter:
    """Appends events to ``ledger.csv`` (one row per event, a ``kind`` column, a ``node`` column),
    flushed after every round so a killed run leaves a readable ledger.

    It keeps a running sha256 and row count, so :meth:`mark` tells a checkpoint what the ledger
    held, at the cost of hashing the bytes written (the file is hashed once when reopened).
    Each :meth:`write` is one write to the file: a killed process leaves whole calls or none.

    Example::

        >>> import tempfile, pathlib
        >>> w = LedgerWriter(pathlib.Path(tempfile.mkdtemp()) / "ledger.csv")
        >>> w.write([ComputeEvent(node=0, round=0, local_steps=5)])
        >>> w.mark().rows
        1
    """

    def __init__(self, path: Path, sync: bool = True):
        buf = io.StringIO()
        csv.writer(buf).writerow(LEDGER_COLUMNS)
        try:
            self._log = AppendLog(Path(path), header=buf.getvalue(), sync=sync)
        except ValueError as exc:
            raise UserError(f"{path}: {exc}") from None

    def write(self, events: Iterable[Event]) -> None:
        rows = [_row(event) for event in events]
        if rows:
            buf = io.StringIO()
            csv.writer(buf).writerows(rows)
            self._log.append(buf.getvalue(), len(rows))

    def write_batches(self, batches: Iterable[EventBatch]) -> None:
        """The rows of ``batches``, in one write: the rows :meth:`write` makes of each batch's
        events, formatted a column at a time."""
        parts, rows = [], 0
        for batch in batches:
            if len(batch):
                parts.append(_batch_text(batch))
                rows += len(batch)
        if rows:
            self._log.append("".join(parts), rows)

    def mark(self) -> LedgerMark:
        """What the ledger holds now (rows, bytes, sha256), synced to disk: for the checkpoint."""
        return self._log.mark()

    def close(self) -> None:
        self._log.close()


def event_to_dict(event: Event) -> dict:
    """A plain dict of an event (``kind`` plus its fields), for JSON on the wire."""
    return {"kind": event.kind, **{name: getattr(event, name) for name in _FIELDS[event.kind]}}


ADJACENCIES = ("replace_one", "add_remove")
SAMPLINGS = ("none", "without_replacement", "poisson")
# Beyond any physical scale of a noise std or a sensitivity; keeps their squares finite in float64.
ABSURD = 1e30
#: The physical bounds of what a node measures or models itself in one event (MEASURED_FIELDS), so
#: that a reported 1.7e308 is refused, not summed into an infinite total. A day of compute or airtime
#: is longer than any round a node takes part in (a node that stalls longer straggles); a kilowatt is
#: two orders of magnitude above any board's draw (profiles.toml: at most ~10 W).
MAX_EVENT_S = 86_400.0
MAX_POWER_W = 1_000.0
MAX_EVENT_J = MAX_EVENT_S * MAX_POWER_W
_INT_LIMIT = 2**63  # ints must fit an int64 (numpy, the wire, the C firmware)


@dataclass(frozen=True)
class FieldRule:
    """The values one event field may take: its type, then a range (closed unless ``*_open``) or
    a set of choices. Floats must be finite; bools are not ints.

    Example::

        >>> FieldRule(float, low=0.0, low_open=True, high=1.0).check("sampling_rate", "0.25")
        0.25
    """

    type: type
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    choices: tuple[str, ...] = ()

    def check(self, name: str, raw: object) -> object:
        """``raw`` (a JSON value or a CSV string) as a value of this field; ValueError naming it."""
        value = _coerce(raw, self.type, name)
        if self.choices and value not in self.choices:
            raise ValueError(f"{name} must be one of {', '.join(self.choices)}, got {_short(raw)}")
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            raise ValueError(f"{name} must be {'>' if self.low_open else '>='} {self.low:g}, got {_short(raw)}")
        if self.high is not None and value > self.high:
            raise ValueError(f"{name} must be <= {self.high:g}, got {_short(raw)}")
        return value


# One rule per field name, whatever the event kind: a new field or event kind is one line here.
FIELD_RULES: dict[str, FieldRule] = {
    "node": FieldRule(int, low=0),
    "round": FieldRule(int, low=-1),  # -1: the algorithm's setup phase (contract.SETUP_ROUND)
    "local_steps": FieldRule(int, low=0),
    "cost_units": FieldRule(float, low=0.0),
    "compute_s": FieldRule(float, low=0.0, high=MAX_EVENT_S),
    "airtime_s": FieldRule(float, low=0.0, high=MAX_EVENT_S),
    "energy_j": FieldRule(float, low=0.0, high=MAX_EVENT_J),
    "bytes_up": FieldRule(int, low=0),
    "bytes_down": FieldRule(int, low=0),
    "measured": FieldRule(bool),
    "sigma": FieldRule(float, low=0.0, high=ABSURD),  # 0: no noise, an infinite privacy loss
    "sensitivity": FieldRule(float, low=0.0, low_open=True, high=ABSURD),
    "count": FieldRule(int, low=1),
    "adjacency": FieldRule(str, choices=ADJACENCIES),
    "sampling": FieldRule(str, choices=SAMPLINGS),
    "sampling_rate": FieldRule(float, low=0.0, low_open=True, high=1.0),
    "observer": FieldRule(str, choices=OBSERVERS),
    "issuer": FieldRule(str, choices=ISSUERS),
    "reason": FieldRule(str, choices=STRAGGLE_REASONS),
    "epsilon_nats": FieldRule(float, low=0.0, high=ABSURD),
    "clip_norm": FieldRule(float, low=0.0, high=ABSURD),
}
_FIELDS = {kind: tuple(f.name for f in dataclasses.fields(cls)) for kind, cls in EVENT_TYPES.items()}
_KEYS = {kind: frozenset(("kind", *names)) for kind, names in _FIELDS.items()}  # of event_to_dict's dict
_COLUMNS = frozenset(LEDGER_COLUMNS)


def event_from_dict(values: Mapping) -> Event:
    """The event a dict of :func:`event_to_dict` (or a ledger.csv row of strings) describes.

    Every field is checked against :data:`FIELD_RULES` (type, range, choices). Fields of other event
    kinds are allowed only empty (a ledger.csv row has every kind's columns).

    Raises:
        ValueError: one line naming the kind and the field: an unknown kind, a missing, unexpected,
            mistyped or out-of-range field.

    Example::

        >>> event_from_dict({"kind": "compute", "node": 0, "round": 2, "local_steps": 5,
        ...                  "cost_units": 5.0, "compute_s": 0.1, "energy_j": 0.2, "measured": False})
        ComputeEvent(node=0, round=2, local_steps=5, cost_units=5.0, compute_s=0.1, energy_j=0.2, measured=False)
    """
    if not isinstance(values, (dict, Mapping)):  # dict first: an ABC check costs a microsecond
        raise ValueError(f"an event must be a mapping, got {type(values).__name__}")
    kind = values.get("kind")
    if not isinstance(kind, str) or kind not in EVENT_TYPES:
        raise ValueError(f"unknown event kind {_short(kind)}")
    own = _FIELDS[kind]
    for key, raw in () if values.keys() == _KEYS[kind] else values.items():  # a dict of event_to_dict: none
        if key == "kind" or key in own:
            continue
        if key is None:  # csv.DictReader: the row has more cells than the header
            raise ValueError(f"{kind} event row has more columns than the header")
        if key in _COLUMNS and (raw is None or raw == ""):
            continue
        raise ValueError(f"{kind} event has an unexpected field {_short(key)}")
    kwargs = {}
    for name in own:
        raw = values.get(name)
        if raw is None or raw == "":
            raise ValueError(f"{kind} event lacks {name!r}")
        try:
            kwargs[name] = FIELD_RULES[name].check(name, raw)
        except ValueError as exc:
            raise ValueError(f"{kind} event: {exc}") from None
    return EVENT_TYPES[kind](**kwargs)


#: The fields of a node's event it measures or models itself (seconds, joules, and whether a meter
#: gave them); every other field is what the round's plan says.
MEASURED_FIELDS = frozenset({"compute_s", "airtime_s", "energy_j", "measured"})


def event_as_planned(values: object, planned: Event) -> Event:
    """The event a dict of :func:`event_to_dict` describes, which must be ``planned`` in every field
    but :data:`MEASURED_FIELDS` (those checked against :data:`FIELD_RULES`).

    Raises:
        ValueError: one line naming the kind and the field: another kind, a missing or unexpected
            field, a field that differs from the plan, a measured one out of its rule.

    Example::

        >>> planned = ComputeEvent(node=0, round=2, local_steps=5, cost_units=5.0)
        >>> event_as_planned({"kind": "compute", "node": 0, "round": 2, "local_steps": 5, "cost_units": 5.0,
        ...                   "compute_s": 0.1, "energy_j": 0.2, "measured": True}, planned)
        ComputeEvent(node=0, round=2, local_steps=5, cost_units=5.0, compute_s=0.1, energy_j=0.2, measured=True)
    """
    kind = planned.kind
    if type(values) is not dict or values.get("kind") != kind:
        got = values.get("kind") if isinstance(values, dict) else type(values).__name__
        raise ValueError(f"a {_short(got)} event where the plan says {kind}")
    if values.keys() != _KEYS[kind]:
        raise ValueError(f"{kind} event with fields {_short(sorted(map(str, values)))}, "
                         f"not {', '.join(_FIELDS[kind])}")
    plan, measured = planned.__dict__, {}  # the fields of a frozen dataclass (see with_fields)
    for name in _FIELDS[kind]:
        raw = values[name]
        if name in MEASURED_FIELDS:
            try:
                measured[name] = FIELD_RULES[name].check(name, raw)
            except ValueError as exc:
                raise ValueError(f"{kind} event: {exc}") from None
        elif raw != plan[name] or (raw.__class__ is bool) is not (plan[name].__class__ is bool):  # True == 1
            raise ValueError(f"{kind} event with {name} = {_short(raw)}, the plan says {plan[name]!r}")
    return with_fields(planned, **measured) if measured else planned


def _short(raw: object) -> str:
    text = repr(raw)
    return text if len(text) <= 40 else text[:37] + "..."


def _coerce(raw: object, kind: type, name: str) -> object:
    # A JSON value of the field's own type (every field of every reply a coordinator checks):
    # nothing to convert; anything else takes the general path, which also words the errors.
    if type(raw) is kind and (kind is not float or math.isfinite(raw)) and (  # type: ignore[arg-type]
            kind is not int or -_INT_LIMIT <= raw < _INT_LIMIT):  # type: ignore[operator]
        return raw
    if kind is bool:
        if isinstance(raw, (bool, np.bool_)):
            return bool(raw)
        if raw in ("True", "False"):
            return raw == "True"
        raise ValueError(f"{name} must be a boolean, got {_short(raw)}")
    if kind is str:
        if not isinstance(raw, str):
            raise ValueError(f"{name} must be a string, got {_short(raw)}")
        return raw
    if isinstance(raw, (bool, np.bool_)):
        raise ValueError(f"{name} must be a number, not a boolean ({_short(raw)})")
    if kind is int:
        if isinstance(raw, (int, np.integer)):
            value = int(raw)
        elif isinstance(raw, str) and re.fullmatch(r"[+-]?[0-9]{1,19}", raw.strip()):
            value = int(raw)
        else:
            raise ValueError(f"{name} must be an integer, got {_short(raw)}")
        if not -_INT_LIMIT <= value < _INT_LIMIT:
            raise ValueError(f"{name} does not fit 64 bits: {_short(raw)}")
        return value
    if isinstance(raw, (int, float, np.integer, np.floating)) or (isinstance(raw, str) and len(raw) <= 64):
        try:
            value = float(raw)
        except (ValueError, OverflowError):
            raise ValueError(f"{name} must be a number, got {_short(raw)}") from None
        if not math.isfinite(value):
            raise ValueError(f"{name} must be finite, got {_short(raw)}")
        return value
    raise ValueError(f"{name} must be a number, got {_short(raw)}")


def read_ledger(path: Path) -> Iterator[Event]:
    """The events of a ``ledger.csv``, in the order written.

    Raises:
        ValueError: a header that is not :data:`LEDGER_COLUMNS` or a bad row (naming its number, the
            header being line 1); a cut last line is a bad row too.
    """
    with open(path, "rb") as raw:
        if raw.seek(0, 2) and (raw.seek(-1, 2), raw.read(1))[1] != b"\n":
            # A cut number still parses ("0.125" cut to "0.1"): a last line without its end is refused.
            raise ValueError("its last line is cut (no line end)")
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        try:
            header = next(reader, None)
            if header != LEDGER_COLUMNS:
                raise ValueError("its header is not the ledger's columns")
            for row in reader:
                if len(row) != len(LEDGER_COLUMNS):
                    raise ValueError(f"line {reader.line_num}: {len(row)} cells, the header has {len(LEDGER_COLUMNS)}")
                try:
                    yield event_from_dict(dict(zip(LEDGER_COLUMNS, row)))
                except ValueError as exc:
                    raise ValueError(f"line {reader.line_num}: {exc}") from None
        except csv.Error as exc:
            raise ValueError(f"line {reader.line_num}: not CSV ({exc})") from None


def parse_rows(text: str, first_line: int = 2) -> list[Event]:
    """The events of whole ledger.csv rows without their header (a tail past a checkpoint's mark).

    Raises:
        ValueError: a bad row, naming its line number counted from ``first_line``.
    """
    events = []
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        for row in reader:
            line = first_line + reader.line_num - 1
            if len(row) != len(LEDGER_COLUMNS):
                raise ValueError(f"line {line}: {len(row)} cells, the header has {len(LEDGER_COLUMNS)}")
            try:
                events.append(event_from_dict(dict(zip(LEDGER_COLUMNS, row))))
            except ValueError as exc:
                raise ValueError(f"line {line}: {exc}") from None
    except csv.Error as exc:
        raise ValueError(f"line {first_line + reader.line_num - 1}: not CSV ({exc})") from None
    return events
