"""Invariant 1, as a check any test can run on a finished run: no node's own ledger shows more than
the coordinator's summary says of it (ε per observer, energy, bytes, steps, rounds, cost units,
mutual information). A release is charged when made, whatever arrives late or never."""

from __future__ import annotations

from typing import Any, Iterable

from testbed.ledger.node import NodeLedger
from testbed.privacy.accountants import epsilon_by_observer

#: The summary's per-node figures a node's own ledger must not exceed.
FIGURES = ("energy_j", "bytes_up", "bytes_down", "local_steps", "rounds", "cost_units", "compute_s",
           "mi_epsilon_nats")
_REL = 1e-9  # the same floats summed in another order


#: The figures the plan fixes (a release whose own events are lost is charged exactly these).
PLANNED = ("bytes_up", "bytes_down", "local_steps", "rounds", "cost_units", "mi_epsilon_nats")


def under_counts(summary: dict[str, Any], ledgers: Iterable[NodeLedger], figures: Iterable[str] = FIGURES) -> list[str]:
    """Where ``summary`` (a run's summary.json) shows less of a node than its own ledger, in ε and
    ``figures``: one line each (empty: the invariant holds)."""
    accountant, delta = summary["privacy"]["accountant"], summary["budgets"]["delta"]
    problems = []
    for ledger in ledgers:
        entry = summary["nodes"].get(str(ledger.node))
        if entry is None:
            if ledger.totals.rounds or ledger.privacy:
                problems.append(f"node {ledger.node}: spent, but not in the summary")
            continue
        for name in figures:
            mine = getattr(ledger.totals, name)
            if mine > entry[name] * (1 + _REL) + 1e-12:
                problems.append(f"node {ledger.node}: its ledger has {name} = {mine!r}, the summary {entry[name]!r}")
        for observer, eps in epsilon_by_observer(accountant, ledger.by_observer, delta).items():
            charged = entry["epsilon_by_observer"].get(observer, 0.0)
            if eps > charged * (1 + 1e-6) + 1e-12:
                problems.append(f"node {ledger.node}: its ledger has ε = {eps!r} against {observer}, "
                                f"the summary {charged!r}")
    return problems
