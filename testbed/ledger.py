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

import csv
import dataclasses
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Union


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

    kind = "privacy"

    @property
    def signature(self) -> tuple:
        """What an accountant needs of one composition; events with equal signatures just add counts."""
        return (self.sigma, self.sensitivity, self.adjacency, self.sampling, self.sampling_rate)


#: Whom a privacy event protects against (GaussianEvent.observer).
OBSERVERS = ("server", "peers", "public")


@dataclass(frozen=True)
class StraggleEvent:
    """The node missed the round: ``reason`` is "emulated" (the straggler model), "deadline" (no
    answer in time), "offline", "refused_update" (its answer failed validation) or "no_exchange"
    (too few peers transmitted). It costs nothing; what the node did release is charged apart."""

    node: int
    round: int
    reason: str

    kind = "straggle"


Event = Union[ComputeEvent, CommunicationEvent, GaussianEvent, StraggleEvent]
EVENT_TYPES = {cls.kind: cls for cls in (ComputeEvent, CommunicationEvent, GaussianEvent, StraggleEvent)}


@dataclass
class Totals:
    """Running sums over a node's events (derived; the events stay the record)."""

    local_steps: int = 0
    rounds: int = 0
    cost_units: float = 0.0
    bytes_up: int = 0
    bytes_down: int = 0
    compute_s: float = 0.0
    airtime_s: float = 0.0
    energy_j: float = 0.0
    rounds_straggled: int = 0

    def add(self, event: Event) -> None:
        if isinstance(event, ComputeEvent):
            self.local_steps += event.local_steps
            self.cost_units += event.cost_units
            self.compute_s += event.compute_s
            self.energy_j += event.energy_j
        elif isinstance(event, CommunicationEvent):
            self.rounds += 1
            self.cost_units += event.cost_units
            self.bytes_up += event.bytes_up
            self.bytes_down += event.bytes_down
            self.airtime_s += event.airtime_s
            self.energy_j += event.energy_j
        elif isinstance(event, StraggleEvent):
            self.rounds_straggled += 1

    @property
    def bytes_total(self) -> int:
        return self.bytes_up + self.bytes_down


@dataclass
class NodeLedger:
    """The events of one node, with running totals and the privacy compositions tallied by
    signature: all of them (``privacy``) and per observer (``by_observer``)."""

    node: int
    events: list[Event] = field(default_factory=list)
    totals: Totals = field(default_factory=Totals)
    privacy: Counter = field(default_factory=Counter)
    by_observer: dict[str, Counter] = field(default_factory=dict)
    rounds_logged: set = field(default_factory=set)
    server_rounds: set = field(default_factory=set)
    round_energy_j: dict = field(default_factory=dict)

    def extend(self, events: Iterable[Event]) -> None:
        for event in events:
            if event.node != self.node:
                raise ValueError(f"event of node {event.node} offered to the ledger of node {self.node}")
            self.events.append(event)
            if getattr(event, "issuer", "node") == "server":
                self.server_rounds.add(event.round)
            elif not isinstance(event, StraggleEvent):
                self.rounds_logged.add(event.round)
            if isinstance(event, (ComputeEvent, CommunicationEvent)):
                self.round_energy_j[event.round] = self.round_energy_j.get(event.round, 0.0) + event.energy_j
            self.totals.add(event)
            if isinstance(event, GaussianEvent):
                self.privacy[event.signature] += event.count
                self.by_observer.setdefault(event.observer, Counter())[event.signature] += event.count

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
        return max(self.round_energy_j.values(), default=0.0)

    def projected(self, events: Iterable[Event]) -> tuple[Totals, dict[str, Counter]]:
        """Totals and the per-observer privacy tallies as they would be after ``events``, without
        appending them."""
        totals = dataclasses.replace(self.totals)
        tallies = {observer: Counter(tally) for observer, tally in self.by_observer.items()}
        for event in events:
            totals.add(event)
            if isinstance(event, GaussianEvent):
                tallies.setdefault(event.observer, Counter())[event.signature] += event.count
        return totals, tallies


LEDGER_COLUMNS = ["kind"] + list(
    dict.fromkeys(f.name for cls in EVENT_TYPES.values() for f in dataclasses.fields(cls))
)


class LedgerWriter:
    """Appends events to ``ledger.csv`` (one row per event, a ``kind`` column, a ``node`` column),
    flushed after every round so a killed run leaves a readable ledger."""

    def __init__(self, path: Path):
        new = not path.exists() or path.stat().st_size == 0
        self._file = open(path, "a", newline="")
        self._writer = csv.writer(self._file)
        if new:
            self._writer.writerow(LEDGER_COLUMNS)

    def write(self, events: Iterable[Event]) -> None:
        # getattr, not dataclasses.asdict: asdict deep-copies and dominated a 100-node run's time.
        self._writer.writerows([getattr(event, col, "") for col in LEDGER_COLUMNS] for event in events)
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def event_to_dict(event: Event) -> dict:
    """A plain dict of an event (``kind`` plus its fields), for JSON on the wire."""
    return {"kind": event.kind, **{f.name: getattr(event, f.name) for f in dataclasses.fields(event)}}


def event_from_dict(values: dict) -> Event:
    """The event a dict of :func:`event_to_dict` (or a ledger.csv row of strings) describes.

    Raises ValueError on an unknown kind, a missing field or a value of the wrong type.
    """
    try:
        cls = EVENT_TYPES[values["kind"]]
    except KeyError:
        raise ValueError(f"unknown event kind {values.get('kind')!r}") from None
    kwargs = {}
    for fld in dataclasses.fields(cls):
        if fld.name not in values:
            raise ValueError(f"{cls.kind} event lacks {fld.name!r}")
        kwargs[fld.name] = _coerce(values[fld.name], fld.type, fld.name)
    return cls(**kwargs)


def _coerce(raw: object, type_name: object, name: str) -> object:
    kind = type_name if isinstance(type_name, str) else type_name.__name__
    if kind == "bool":
        if isinstance(raw, bool):
            return raw
        if raw in ("True", "False"):
            return raw == "True"
        raise ValueError(f"{name} must be a boolean, got {raw!r}")
    if isinstance(raw, bool) or (kind != "str" and not isinstance(raw, (int, float, str))):
        raise ValueError(f"{name} must be a number, got {raw!r}")
    value = {"int": int, "float": float, "str": str}[kind](raw)
    if kind == "float" and value != value:
        raise ValueError(f"{name} is NaN")
    return value


def read_ledger(path: Path) -> Iterator[Event]:
    """The events of a ``ledger.csv``, in the order written."""
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            yield event_from_dict(row)
