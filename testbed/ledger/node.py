"""One node's ledger: running totals, the privacy compositions tallied by signature (all, and
per observer), and the rounds it logged.

Example::

    >>> from testbed.ledger.events import ComputeEvent
    >>> led = NodeLedger(node=0)
    >>> led.extend([ComputeEvent(node=0, round=0, local_steps=10, cost_units=10.0)])
    >>> led.totals.local_steps
    10
"""

from __future__ import annotations

import bisect
import dataclasses
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Mapping, Sequence

from testbed.ledger.events import CommunicationEvent, ComputeEvent, Event, GaussianEvent, StraggleEvent, WireEvent


#: What one event of each kind adds to a node's totals: (total, the event field it adds; None: one).
TOTALS_OF: dict[str, tuple[tuple[str, str | None], ...]] = {
    "compute": (("local_steps", "local_steps"), ("cost_units", "cost_units"), ("compute_s", "compute_s"),
                ("energy_j", "energy_j")),
    "communication": (("rounds", None), ("cost_units", "cost_units"), ("bytes_up", "bytes_up"),
                      ("bytes_down", "bytes_down"), ("airtime_s", "airtime_s"), ("energy_j", "energy_j")),
    "straggle": (("rounds_straggled", None),),
    "mutual_info": (("mi_epsilon_nats", "epsilon_nats"),),
}


#: The event kinds a round run again after a resume spends again (seconds, joules, bytes: the
#: nodes compute and send it twice); a release (privacy, mutual information) is the same values
#: again from the same noise stream, and a straggle row the same record: charged once.
SPENT_AGAIN = ("compute", "communication")


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
        mine, its = self.__dict__, event.__dict__  # not getattr and setattr: every event of every node
        for total, source in TOTALS_OF.get(event.kind, ()):
            mine[total] += 1 if source is None else its[source]

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

    def missing(self, intervals: Iterable[Sequence[int]]) -> Iterator[int]:
        """The rounds of ``intervals`` (sorted, disjoint ``[start, stop)``, as a node's ledger
        report gives them) that this set does not hold, in order: one walk over both interval
        lists, not a lookup per round (a run's end checks every node's rounds).

        Example::

            >>> rs = RoundSet()
            >>> for r in (0, 1, 2, 5): rs.add(r)
            >>> list(rs.missing([(-1, 4), (5, 7)]))
            [-1, 3, 6]
        """
        held, i = self.intervals, 0
        for start, stop in intervals:
            at = start
            while at < stop:
                while i < len(held) and held[i][1] <= at:  # held intervals wholly before ``at``
                    i += 1
                if i == len(held) or held[i][0] >= stop:
                    yield from range(at, stop)
                    break
                yield from range(at, held[i][0])  # empty when ``at`` is inside held[i]
                at = held[i][1]


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
            elif not isinstance(event, (StraggleEvent, WireEvent)):  # neither is the node's release
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


def merge_sessions(node: int, sessions: Iterable[Iterable[Event]]) -> NodeLedger:
    """One ledger of ``node`` over the ledgers of a run's sessions (the first run and each
    ``--resume``): every session's :data:`SPENT_AGAIN` events (a round re-run is computed and sent
    again), each round's other events from the first session that logged it (a re-run releases
    the same values again). What the coordinator charges a resumed run by the same rule.

    Example::

        >>> from testbed.ledger.events import ComputeEvent
        >>> first = [ComputeEvent(node=0, round=0, local_steps=1, energy_j=1.0),
        ...          GaussianEvent(node=0, round=0, sigma=1.0, sensitivity=0.1, count=1)]
        >>> merged = merge_sessions(0, [first, first])
        >>> merged.totals.energy_j, sum(merged.privacy.values())
        (2.0, 1)
    """
    released: dict[int, list[Event]] = {}
    spent: list[Event] = []
    for events_of_session in sessions:
        by_round: dict[int, list[Event]] = {}
        for event in events_of_session:
            if event.kind in SPENT_AGAIN:
                spent.append(event)
            else:
                by_round.setdefault(event.round, []).append(event)
        for round_index, events in by_round.items():
            released.setdefault(round_index, events)
    merged = NodeLedger(node)
    merged.extend(spent + [e for _, events in sorted(released.items()) for e in events])
    return merged
