"""The ledger's events: small immutable records of what a node spent in a round (compute,
communication, a Gaussian release, a mutual-information release, a missed round, the seconds a
link measured), and
:class:`EventBatch` / :class:`NodeEvents`, the releases of many nodes as columns.

Example::

    >>> ComputeEvent(node=0, round=3, local_steps=10).kind
    'compute'
"""

from __future__ import annotations

import dataclasses
import operator
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Mapping, Sequence, Union

import numpy as np

from testbed.util.frozen import frozen


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
STRAGGLE_REASONS = ("emulated", "deadline", "offline", "refused_update", "no_exchange", "withdrawn",
                    "asked_before_resume")
#: The Gaussian mechanism's adjacency notions and ways of sampling (GaussianEvent's fields).
ADJACENCIES = ("replace_one", "add_remove")
SAMPLINGS = ("none", "without_replacement", "poisson")


@dataclass(frozen=True)
class StraggleEvent:
    """The node missed the round: ``reason`` is "emulated" (the straggler model), "deadline" (no
    answer in time), "offline", "refused_update" (its answer failed validation), "no_exchange"
    (too few peers transmitted), "withdrawn" (it refused an earlier round for its budget and is
    asked nothing more), "asked_before_resume" (an earlier session of a resumed run asked it this
    round and nothing of it reached the ledger: its plan is charged beside this row). It costs
    nothing; what the node did release is charged apart (a node that straggled in a round before a
    resumed run's checkpoint and whose late reply never reached the ledger is charged the round's
    plan beside its first straggle row: a kill of the coordinator may have lost that reply)."""

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


@dataclass(frozen=True)
class WireEvent:
    """The seconds a node's round took on its host's network link, measured by the coordinator
    (links.netns; testbed.orchestration.links.split_wire_s), beside the airtime its communication
    event models. Never in a node's reply nor its own ledger; it charges no budget and marks no
    round as logged (the node's own events of the round do). ``measured`` is always True: the
    figure comes from the coordinator's clock, never from a model."""

    node: int
    round: int
    wire_s: float
    measured: bool = True

    kind = "wire"


Event = Union[ComputeEvent, CommunicationEvent, GaussianEvent, StraggleEvent, MutualInfoEvent, WireEvent]
EVENT_TYPES = {cls.kind: cls for cls in (ComputeEvent, CommunicationEvent, GaussianEvent, StraggleEvent,
                                         MutualInfoEvent, WireEvent)}
_FIELD_NAMES = {cls: frozenset(f.name for f in dataclasses.fields(cls)) for cls in EVENT_TYPES.values()}
#: Each event kind's field names, in order; and every kind's fields, in order of first appearance.
FIELDS = {kind: tuple(f.name for f in dataclasses.fields(cls)) for kind, cls in EVENT_TYPES.items()}
ALL_FIELDS = tuple(dict.fromkeys(name for names in FIELDS.values() for name in names))


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
    events = list(events)
    by_kind_and_round: dict[tuple, list[Event]] = {}
    for event in events:
        key = (event.__class__, event.round)
        group = by_kind_and_round.get(key)
        if group is None:
            by_kind_and_round[key] = [event]
        else:
            group.append(event)
    # Each node once per kind and round (a round's replies): those groups are the batches, in the
    # order the loop below would give them, found without its count per node and kind.
    if all(len(group) == len(set(map(_NODE, group))) for group in by_kind_and_round.values()):
        return [_batch_of(group) for group in by_kind_and_round.values()]
    groups: dict[tuple, list[Event]] = {}
    seen: dict[tuple, int] = {}  # not a Counter: its __missing__ is a Python call for every new node
    for event in events:
        key = (event.__class__, event.round)
        mine = (key, event.node)
        nth = seen.get(mine, 0)
        seen[mine] = nth + 1
        group = groups.get((key, nth))
        if group is None:
            groups[(key, nth)] = [event]
        else:
            group.append(event)
    return [_batch_of(group) for group in groups.values()]


_NODE = operator.attrgetter("node")


def _batch_of(group: list[Event]) -> EventBatch:
    """Events of one kind and round, each of another node, as one batch."""
    first = group[0]
    fields = FIELDS[first.kind]
    # Each field's values over the group, read and compared in C (a coordinator charges a batch of
    # 80 nodes' replies every round).
    columns = dict(zip(fields, zip(*map(operator.attrgetter(*fields), group))))  # every kind has node, round
    nodes = np.array(columns.pop("node"), dtype=np.int64)
    return EventBatch(first, nodes, {n: np.array(values) for n, values in columns.items()
                                     if values.count(values[0]) != len(values)})


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

    @classmethod
    def concatenate(cls, parts: Sequence["NodeEvents | Sequence[Sequence[Event]]"]
                    ) -> "NodeEvents | list[list[Event]]":
        """The events of consecutive parts of a step's nodes as one: batches when every part's are
        batches of the same kinds in the same order (a field some part holds as a column, or whose
        template differs between the parts, a column of the whole), else the per-node lists."""
        if not all(isinstance(p, NodeEvents) for p in parts) or \
                len({tuple(type(b.template) for b in p.batches) for p in parts}) != 1:
            return [list(events) for part in parts for events in part]
        nodes = np.concatenate([p.nodes for p in parts])
        batches = []
        for k, first in enumerate(parts[0].batches):
            group = [p.batches[k] for p in parts]
            names = [f.name for f in dataclasses.fields(first.template) if f.name != "node" and (
                any(f.name in b.columns for b in group) or len({getattr(b.template, f.name) for b in group}) > 1)]
            columns = {name: np.concatenate([b.columns[name] if name in b.columns
                                             else np.full(len(b.nodes), getattr(b.template, name)) for b in group])
                       for name in names}
            batches.append(EventBatch(first.template, nodes, columns))
        return cls(batches, nodes)

    def __len__(self) -> int:
        return len(self.nodes)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        node = int(self.nodes[i])
        return [with_fields(b.template, node=node, **{k: v[i].item() for k, v in b.columns.items()})
                for b in self.batches]
