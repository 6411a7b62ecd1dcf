"""Every node's ledger of a run as columns: one row per node, numpy totals, interned privacy tallies.

The runner charges a round's releases as :class:`~testbed.ledger.events.EventBatch` es (one per kind of
event, a row per node), so a round costs a few numpy operations whatever the number of nodes,
where a :class:`~testbed.ledger.node.NodeLedger` per node cost a few microseconds per node and event.
Events one at a time (a resume's ledger, MQTT's late replies, server events) go in too.

What is kept:

- ``totals``: one column per :class:`~testbed.ledger.node.Totals` field, (N,) each;
- privacy: each node's per-observer tally (signature → count, as NodeLedger.by_observer) is
  *interned*: nodes with equal tallies share one entry, so the ε of every node is computed once
  per distinct tally (usually one per round, a few with stragglers), not once per node;
- which rounds each node logged, for the rounds that may still be re-run or answered late
  (:meth:`LedgerBook.forget_rounds_before` drops older ones) and the setup round;
- the joules of the last few rounds, for the energy forecast of
  :meth:`Budgets.would_exceed <testbed.accounting.budgets.Budgets.would_exceed>`.

:meth:`LedgerBook.view` gives one node's ledger with NodeLedger's reading interface (totals,
by_observer, has_round, projected, max_round_energy_j), for budgets and reports.

Example::

    >>> import numpy as np
    >>> from testbed.ledger.events import EventBatch, GaussianEvent, ComputeEvent
    >>> book = LedgerBook([0, 1, 2])
    >>> book.extend_batch(EventBatch(ComputeEvent(0, 0, local_steps=10), np.array([0, 2])))
    >>> book.extend_batch(EventBatch(GaussianEvent(0, 0, sigma=1.0, sensitivity=0.1, count=10), np.array([0, 2])))
    >>> book.column("local_steps").tolist(), book.view(1).has_round(0), book.view(2).has_round(0)
    ([10, 0, 10], False, True)
    >>> eps = book.worst_epsilons("zcdp", 1e-5)
    >>> bool(eps[0] == eps[2] > 0 == eps[1])
    True
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Iterable, Sequence

import numpy as np

from testbed.ledger.events import Event, EventBatch, GaussianEvent, StraggleEvent, WireEvent, batches_of
from testbed.ledger.node import TOTALS_OF, Totals, projected
from testbed.privacy.accountants import worst_epsilon

_INT_TOTALS = {f.name for f in dataclasses.fields(Totals) if f.type in ("int", int)}
# Rounds whose joules are kept apart; older rounds are folded into one running maximum per node.
_ENERGY_WINDOW = 4
# Dead tallies tolerated beyond twice the live ones before the table is compacted.
_SPARE_TALLIES = 64
# Kinds that say nothing of whether the node's own release of their round is logged.
_NOT_RELEASES = (StraggleEvent.kind, WireEvent.kind)

Tally = dict  # observer → Counter(signature → count), as NodeLedger.by_observer


def _tally_key(tally: Tally) -> tuple:
    return tuple(sorted((obs, tuple(sorted(c.items()))) for obs, c in tally.items() if c))


class LedgerBook:
    """The ledgers of the nodes ``node_ids`` (distinct ints).

    Args:
        node_ids: the run's nodes; rows follow their sorted order.
    """

    def __init__(self, node_ids: Sequence[int] | np.ndarray):
        ids = (np.arange(node_ids.start, node_ids.stop, node_ids.step, dtype=np.int64) if isinstance(node_ids, range)
               else np.asarray(node_ids, dtype=np.int64))
        # Already ascending (every run's range of ids): one pass, not a sort or hash of a million.
        self.node_ids = ids if bool((ids[1:] > ids[:-1]).all()) else np.unique(ids)
        if len(self.node_ids) != len(ids):
            raise ValueError("node ids of a ledger book must be distinct")
        n = len(self.node_ids)
        self._dense = n == 0 or (self.node_ids[0] == 0 and self.node_ids[-1] == n - 1)
        self.totals = {f.name: np.zeros(n, dtype=np.int64 if f.name in _INT_TOTALS else np.float64)
                       for f in dataclasses.fields(Totals)}
        self._tallies: list[Tally] = [{}]  # interned; entry 0 is the empty tally
        self._tally_index: dict[tuple, int] = {(): 0}
        self._tally_ids = np.zeros(n, dtype=np.int64)
        self._population = [n]  # nodes holding each interned tally
        self._live = 1  # tallies some node holds
        self._plus: dict[tuple, int] = {}  # (tally id, observer, signature, count) → tally id
        self._epsilons: dict[tuple[str, float], dict[int, float]] = {}  # (accountant, δ) → tally id → ε
        self._logged: dict[int, np.ndarray] = {}  # round → (N,) bool: the rows that logged their own events
        self._server: dict[int, np.ndarray] = {}  # round → (N,) bool: the rows with server-issued events
        self._forgotten_below = -1  # rounds in [0, this) are no longer tracked
        self._round_energy: dict[int, np.ndarray] = {}
        self._folded_energy = np.zeros(n)
        self._folded_below = -(2**62)

    def __len__(self) -> int:
        return len(self.node_ids)

    # --- rows ------------------------------------------------------------------------------

    def rows(self, nodes: Sequence[int] | np.ndarray) -> np.ndarray:
        """The rows of node ids ``nodes``; ValueError for a node not in the book."""
        nodes = np.asarray(nodes, dtype=np.int64)
        if self._dense:
            if len(nodes) and (nodes.min() < 0 or nodes.max() >= len(self.node_ids)):
                raise ValueError(f"node {int(nodes[(nodes < 0) | (nodes >= len(self.node_ids))][0])} is not in the book")
            return nodes
        rows = np.searchsorted(self.node_ids, nodes)
        bad = (rows >= len(self.node_ids)) | (self.node_ids[np.minimum(rows, len(self.node_ids) - 1)] != nodes)
        if bad.any():
            raise ValueError(f"node {int(nodes[bad][0])} is not in the book")
        return rows

    # --- appending ---------------------------------------------------------------------------

    def extend_batch(self, batch: EventBatch) -> None:
        """Append one event per node of ``batch``."""
        if not len(batch):
            return
        rows = self.rows(batch.nodes)
        kind, r = batch.kind, batch.round
        for total, source in TOTALS_OF.get(kind, ()):
            self.totals[total][rows] += 1 if source is None else batch.value(source)
        if kind in ("compute", "communication"):
            self._add_energy(r, rows, batch.value("energy_j"))
        issuer = getattr(batch.template, "issuer", "node")
        if issuer == "server":
            self._mark(self._server, r, rows)
        elif kind not in _NOT_RELEASES:
            self._mark(self._logged, r, rows)
        if kind == GaussianEvent.kind:
            for event, positions in batch.groups():
                self._add_privacy(rows[positions], event.observer, event.signature, event.count)

    def extend(self, events: Iterable[Event]) -> None:
        """Append events of any nodes, kinds and rounds (a resume's ledger, MQTT replies, server
        events), gathered into batches first."""
        for batch in batches_of(events):
            self.extend_batch(batch)

    def _mark(self, where: dict[int, np.ndarray], r: int, rows: np.ndarray) -> None:
        if 0 <= r < self._forgotten_below:
            return
        if r not in where:
            where[r] = np.zeros(len(self.node_ids), dtype=bool)
        where[r][rows] = True

    def _add_energy(self, r: int, rows: np.ndarray, energy_j) -> None:
        if r < self._folded_below:
            # A late event of a round already folded: its round's sum is gone, so add it to the max
            # (the forecast may only err towards more spend).
            self._folded_energy[rows] += energy_j
            return
        if r not in self._round_energy:
            self._round_energy[r] = np.zeros(len(self.node_ids))
        self._round_energy[r][rows] += energy_j
        if len(self._round_energy) > _ENERGY_WINDOW:
            oldest = min(self._round_energy)
            np.maximum(self._folded_energy, self._round_energy.pop(oldest), out=self._folded_energy)
            self._folded_below = oldest + 1

    def _add_privacy(self, rows: np.ndarray, observer: str, signature: tuple, count: int) -> None:
        old = self._tally_ids[rows]
        distinct, inverse, moved = np.unique(old, return_inverse=True, return_counts=True)
        new = np.array([self._plus_one(int(t), observer, signature, count) for t in distinct], dtype=np.int64)
        self._tally_ids[rows] = new[inverse]
        for t, to, k in zip(distinct.tolist(), new.tolist(), moved.tolist()):
            self._live += (self._population[to] == 0) - (self._population[t] == k)
            self._population[t] -= k
            self._population[to] += k
        if len(self._tallies) > 2 * self._live + _SPARE_TALLIES:
            self._compact()

    def _plus_one(self, tally_id: int, observer: str, signature: tuple, count: int) -> int:
        key = (tally_id, observer, signature, count)
        found = self._plus.get(key)
        if found is None:
            tally = {obs: Counter(c) for obs, c in self._tallies[tally_id].items()}
            tally.setdefault(observer, Counter())[signature] += count
            found = self._plus[key] = self._intern(tally)
        return found

    def _intern(self, tally: Tally) -> int:
        key = _tally_key(tally)
        found = self._tally_index.get(key)
        if found is None:
            found = self._tally_index[key] = len(self._tallies)
            self._tallies.append(tally)
            self._population.append(0)
        return found

    def _compact(self) -> None:
        """Drop the tallies no node holds any more: a run leaves one or a few behind every round,
        so the table (and the memory of a long run) would grow by ~1 KB a round."""
        live = [t for t, held in enumerate(self._population) if held or t == 0]  # the empty one stays 0
        remap = np.full(len(self._tallies), -1, dtype=np.int64)
        remap[live] = np.arange(len(live))
        self._tally_ids = remap[self._tally_ids]
        self._tallies = [self._tallies[t] for t in live]
        self._population = [self._population[t] for t in live]
        self._live = sum(1 for held in self._population if held)
        self._tally_index = {_tally_key(t): i for i, t in enumerate(self._tallies)}
        self._plus.clear()
        self._epsilons = {key: {int(remap[t]): eps for t, eps in cache.items() if remap[t] >= 0}
                          for key, cache in self._epsilons.items()}

    def forget_rounds_before(self, round_index: int) -> None:
        """Stop tracking which nodes logged rounds ``0 .. round_index - 1``: they will not be run
        again (a checkpoint is past them) nor answered late. The setup round is kept."""
        if round_index <= self._forgotten_below:
            return
        self._forgotten_below = round_index
        for where in (self._logged, self._server):
            for r in [r for r in where if 0 <= r < round_index]:
                del where[r]

    # --- reading ---------------------------------------------------------------------------

    def column(self, total: str) -> np.ndarray:
        """(N,) the total ``total`` (a :class:`~testbed.ledger.node.Totals` field or ``bytes_total``)."""
        if total == "bytes_total":
            return self.totals["bytes_up"] + self.totals["bytes_down"]
        return self.totals[total]

    def logged(self, nodes: Sequence[int] | np.ndarray, round_index: int) -> np.ndarray:
        """(M,) bool: whether each node's own events of ``round_index`` are logged (a round re-run
        after a restart releases the same values again: nothing new to charge)."""
        rows = self.rows(nodes)
        done = self._logged.get(round_index)
        return np.zeros(len(rows), dtype=bool) if done is None else done[rows]

    def has_server_events(self, node: int, round_index: int) -> bool:
        done = self._server.get(round_index)
        return done is not None and bool(done[self.rows([node])[0]])

    def tally(self, node: int) -> Tally:
        """The node's per-observer privacy tally (observer → Counter(signature → count)); a copy."""
        t = self._tallies[int(self._tally_ids[self.rows([node])[0]])]
        return {obs: Counter(c) for obs, c in t.items()}

    def distinct_tallies(self) -> tuple[list[Tally], np.ndarray]:
        """(the distinct tallies the nodes hold, (N,) each node's index into them)."""
        live, inverse = np.unique(self._tally_ids, return_inverse=True)
        return [self._tallies[t] for t in live.tolist()], inverse.reshape(-1)

    def worst_epsilons(self, accountant: str, delta: float) -> np.ndarray:
        """(N,) each node's headline ε (the worst over observers), once per distinct tally."""
        live, inverse = np.unique(self._tally_ids, return_inverse=True)
        values = np.array([self._tally_epsilon(accountant, delta, t) for t in live.tolist()])
        return values[inverse.reshape(-1)]

    def max_epsilon(self, accountant: str, delta: float) -> float:
        """The largest headline ε of any node (0 before any release): once per tally some node
        holds, however many nodes."""
        return max((self._tally_epsilon(accountant, delta, t) for t, held in enumerate(self._population) if held),
                   default=0.0)

    def _tally_epsilon(self, accountant: str, delta: float, tally_id: int) -> float:
        cache = self._epsilons.setdefault((accountant, float(delta)), {})
        if tally_id not in cache:
            cache[tally_id] = worst_epsilon(accountant, self._tallies[tally_id], delta)
        return cache[tally_id]

    def active(self) -> np.ndarray:
        """(N,) bool: the nodes that logged anything (a run with client sampling leaves some idle)."""
        active = self._tally_ids != 0
        for column in self.totals.values():
            active |= column != 0
        return active

    def max_round_energy_j(self, node: int) -> float:
        """Joules of the node's costliest round logged (0 before any)."""
        return float(self.max_round_energies_j()[self.rows([node])[0]])

    def max_round_energies_j(self) -> np.ndarray:
        """(N,) joules of each node's costliest round logged (0 before any)."""
        return np.maximum.reduce([self._folded_energy, *self._round_energy.values()])

    def projected_epsilons(self, accountant: str, delta: float, rows: np.ndarray,
                           additions: list[list[tuple[str, tuple, int]]]) -> np.ndarray:
        """(M,) the headline ε of the nodes at ``rows`` as it would be after adding, to row i's,
        the (observer, signature, count) of ``additions[i]``; computed once per distinct outcome."""
        cache: dict[tuple, float] = {}
        out = np.empty(len(rows))
        for i, (t, added) in enumerate(zip(self._tally_ids[rows].tolist(), additions)):
            key = (t, tuple(added))
            if key not in cache:
                tally = {obs: Counter(c) for obs, c in self._tallies[t].items()}
                for observer, signature, count in added:
                    tally.setdefault(observer, Counter())[signature] += count
                cache[key] = worst_epsilon(accountant, tally, delta)
            out[i] = cache[key]
        return out

    def view(self, node: int) -> "BookNodeView":
        return BookNodeView(self, int(node))


class BookNodeView:
    """One node of a :class:`LedgerBook`, read as a :class:`~testbed.ledger.node.NodeLedger` is read
    (budgets, progress, reports); appending goes through the book."""

    def __init__(self, book: LedgerBook, node: int):
        self.book, self.node = book, node
        self._row = int(book.rows([node])[0])

    @property
    def totals(self) -> Totals:
        return Totals(**{name: col[self._row].item() for name, col in self.book.totals.items()})

    @property
    def by_observer(self) -> Tally:
        return self.book.tally(self.node)

    @property
    def max_round_energy_j(self) -> float:
        return self.book.max_round_energy_j(self.node)

    def has_round(self, round_index: int) -> bool:
        return bool(self.book.logged([self.node], round_index)[0])

    def has_server_events(self, round_index: int) -> bool:
        return self.book.has_server_events(self.node, round_index)

    def projected(self, events: Iterable[Event]) -> tuple[Totals, Tally]:
        """Totals and per-observer tallies as they would be after ``events``, without appending."""
        return projected(self.totals, self.by_observer, events)
