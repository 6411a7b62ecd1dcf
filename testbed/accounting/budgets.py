"""Budgets a node may not exceed, read off its ledger before it acts.

Example::

    >>> from testbed.ledger.node import NodeLedger
    >>> from testbed.ledger.events import ComputeEvent
    >>> b = Budgets(cost_units=100.0)
    >>> led = NodeLedger(node=0)
    >>> b.would_exceed(led, [ComputeEvent(node=0, round=0, local_steps=5, cost_units=120.0)]).budget
    'cost_units'
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable, Sequence

import numpy as np

from testbed.ledger.events import Event
from testbed.ledger.node import TOTALS_OF, NodeLedger
from testbed.privacy.accountants import registry as accountants, worst_epsilon

if TYPE_CHECKING:
    from testbed.accounting.book import BookNodeView, LedgerBook
    from testbed.assembly.config import BudgetSection, PrivacySection
    from testbed.ledger.events import NodeEvents


#: What a budget's name may be ("epsilon", "energy_j"...), as a node's refusal names it: a short
#: identifier (a refusal naming anything else is malformed; refusals.csv keeps only these).
BUDGET_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")


@dataclass(frozen=True)
class Exceeded:
    """Which budget the next events would break, by how much."""

    node: int
    budget: str
    would_be: float
    limit: float

    def __str__(self) -> str:
        return f"node {self.node} would exceed its {self.budget} budget ({self.would_be:.6g} > {self.limit:.6g})"


@dataclass(frozen=True)
class Budgets:
    """Per-node limits; None means unlimited.

    Attributes:
        epsilon: privacy budget ε at ``delta``, per ``accountant`` (a registered one: the first
            listed, the paper's zcdp, by default), against every observer (the worst of them counts).
        cost_units: DP-PASGD's abstract resource budget C_th (c1 per round + c2 per step, eq. 10c).
        bytes: payload bytes up plus down.
        energy_j: compute plus radio energy.
        mi_epsilon: ε-MI-DP in nats (MutualInfoEvent, e.g. ACFL's coded data set), summed over the
            node's MI events; apart from ``epsilon``, never composed with (ε, δ).
    """

    epsilon: float | None = None
    delta: float = 1e-5
    accountant: str = field(default_factory=lambda: accountants.names()[0])
    cost_units: float | None = None
    bytes: float | None = None
    energy_j: float | None = None
    mi_epsilon: float | None = None

    # A budget met exactly is not exceeded; the tolerance absorbs float sums like 9 × 110.0.
    _slack = 1e-9

    @property
    def any(self) -> bool:
        """Whether any budget is set (none: nothing to check before a round)."""
        return any(v is not None for v in (self.epsilon, self.cost_units, self.bytes, self.energy_j,
                                                  self.mi_epsilon))

    def would_exceed(self, ledger: "NodeLedger | BookNodeView", events: Iterable[Event]) -> Exceeded | None:
        """The first budget that ``events`` would break if appended to ``ledger``, else None.

        Joules are known only once a step ran; planned events without them are forecast to cost
        what the node's costliest round so far cost (nothing is known before its first round).
        """
        events = list(events)
        totals, tallies = ledger.projected(events)
        planned_energy_j = sum(getattr(e, "energy_j", 0.0) for e in events)
        energy_j = totals.energy_j + max(0.0, ledger.max_round_energy_j - planned_energy_j)
        checks = (
            ("cost_units", totals.cost_units, self.cost_units),
            ("bytes", totals.bytes_total, self.bytes),
            ("energy_j", energy_j, self.energy_j),
            ("mi_epsilon", totals.mi_epsilon_nats, self.mi_epsilon),
        )
        for name, value, limit in checks:
            if limit is not None and value > limit * (1 + self._slack):
                return Exceeded(ledger.node, name, value, limit)
        if self.epsilon is not None:
            spent = worst_epsilon(self.accountant, tallies, self.delta)
            if spent > self.epsilon * (1 + self._slack):
                return Exceeded(ledger.node, "epsilon", spent, self.epsilon)
        return None


    def first_exceeded(self, book: "LedgerBook", node_ids: Sequence[int], planned: "NodeEvents | list[list[Event]]"
                       ) -> Exceeded | None:
        """:meth:`would_exceed` of each of ``node_ids`` (in order) with its ``planned`` events,
        the first that breaks a budget, else None: screened for every node at once with the same
        arithmetic, then said by :meth:`would_exceed` for the first node the screen flags."""
        if not self.any or not len(node_ids):
            return None
        from testbed.ledger.events import NodeEvents, batches_of

        ids = np.asarray(node_ids, dtype=np.int64)
        rows = book.rows(ids)
        batches = planned.batches if isinstance(planned, NodeEvents) else batches_of(e for es in planned for e in es)
        position = {n: i for i, n in enumerate(ids.tolist())}
        totals = {name: col[rows].astype(np.float64) for name, col in book.totals.items()}
        planned_energy_j = np.zeros(len(ids))
        privacy: list[list[tuple[str, tuple, int]]] = [[] for _ in ids]
        for batch in batches:
            at = np.array([position[n] for n in batch.nodes.tolist()], dtype=np.int64)
            for total, source in TOTALS_OF.get(batch.kind, ()):
                totals[total][at] += 1 if source is None else batch.value(source)
            if batch.kind in ("compute", "communication"):
                planned_energy_j[at] += batch.value("energy_j")
            if batch.kind == "privacy":
                for event, positions in batch.groups():
                    for p in at[positions].tolist():
                        privacy[p].append((event.observer, event.signature, event.count))
        energy_j = totals["energy_j"] + np.maximum(0.0, book.max_round_energies_j()[rows] - planned_energy_j)
        flagged = np.zeros(len(ids), dtype=bool)
        for value, limit in ((totals["cost_units"], self.cost_units), (totals["bytes_up"] + totals["bytes_down"], self.bytes),
                             (energy_j, self.energy_j), (totals["mi_epsilon_nats"], self.mi_epsilon)):
            if limit is not None:
                flagged |= value > limit * (1 + self._slack)
        if self.epsilon is not None:
            flagged |= book.projected_epsilons(self.accountant, self.delta, rows, privacy) > self.epsilon * (1 + self._slack)
        for i in np.flatnonzero(flagged).tolist():
            node = int(ids[i])
            exceeded = self.would_exceed(book.view(node), planned[i])
            if exceeded is not None:
                return exceeded
        return None


def budgets_from_config(budget: "BudgetSection", privacy: "PrivacySection") -> Budgets:
    """The per-node budgets of an experiment's ``[budget]`` and ``[privacy]`` sections."""
    return Budgets(epsilon=budget.epsilon, delta=privacy.delta, accountant=privacy.accountant,
                   cost_units=budget.cost_units, bytes=budget.bytes, energy_j=budget.energy_j,
                   mi_epsilon=budget.mi_epsilon)
