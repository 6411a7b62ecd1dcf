"""What summary.json says of a run: per node its ε (by observer), costs and how its figures stand
against its own ledger (confirmed, raised, charged on ask); the privacy headline, the one figure
to quote; budgets, refusals, assumptions, the broker, the sessions; and the per-observer tallies
the nodes end the run with if every remaining round charges its plan (the tight accountant's guess
while the rounds run)."""

from __future__ import annotations

import time
from collections import Counter
from typing import Any

import numpy as np

from testbed.accounting.book import LedgerBook
from testbed.algorithms import registry
from testbed.algorithms.contract import SETUP_ROUND, RoundContext, planned_batch
from testbed.assembly import assemble
from testbed.ledger.events import NodeEvents
from testbed.ledger.node import Totals
from testbed.orchestration import charging
from testbed.orchestration.run_state import Run
from testbed.privacy.accountants import epsilon_by_observer
from testbed.privacy.secrecy import node_randomness, privacy_guarantees, quote_against


def planned_tallies(run: Run) -> list[Counter]:
    """The per-observer privacy tallies the nodes end the run with if every remaining round charges
    what it plans (and a pending setup its events; the server's, for an algorithm that can say them
    ahead: ``planned_server_events(state, ctx)``): the tight accountant's guess, one per distinct
    outcome."""
    alg, book = run.algorithm, run.book
    if run.config.client_sampling.method != "all":
        return []  # which nodes a round samples is drawn as it comes: no plan to guess the end from
    ids = book.node_ids
    tallies, index = book.distinct_tallies()
    # Per node: what it will add, (observer, signature) → count, over a pending setup and the
    # remaining rounds, each round's own plan (PADPFL's uploads are due in some rounds only).
    adds = [Counter() for _ in ids]
    if alg.has_setup:
        for add, node, pending in zip(adds, ids.tolist(), (~book.logged(ids, SETUP_ROUND)).tolist()):
            for e in alg.setup_events(node) if pending else ():
                if e.kind == "privacy":
                    add[e.observer, e.signature] += e.count
    every = tuple(ids.tolist())
    server_plan = getattr(alg, "planned_server_events", None)
    position = {n: i for i, n in enumerate(every)}
    for r in range(run.rounds_done, alg.rounds):
        ctx = RoundContext(r, run.config.run.seed, len(ids), every)
        for e in (server_plan(run.state, ctx) or []) if server_plan is not None else ():
            if e.kind == "privacy":
                adds[position[e.node]][e.observer, e.signature] += e.count
        planned = planned_batch(alg, ids, ctx)
        if isinstance(planned, NodeEvents):
            for batch in planned.batches:
                if batch.kind == "privacy":
                    for e, positions in batch.groups():
                        for p in positions.tolist():
                            adds[p][e.observer, e.signature] += e.count
        else:
            for add, events in zip(adds, planned):
                for e in events:
                    if e.kind == "privacy":
                        add[e.observer, e.signature] += e.count
    guessed = {}
    for key in {(i, tuple(sorted(add.items()))) for i, add in zip(index.tolist(), adds)}:
        i, added = key
        tally = {obs: Counter(c) for obs, c in tallies[i].items()}
        for (observer, signature), count in added:
            tally.setdefault(observer, Counter())[signature] += count
        guessed[key] = tally
    return [c for tally in guessed.values() for c in tally.values()]


def summary_rows(book: LedgerBook) -> np.ndarray:
    """The rows of the nodes the summary lists one by one: every node, or with client sampling the
    nodes that logged anything (the others, never sampled, are counted as ``idle_nodes``)."""
    active = book.active()
    return np.arange(len(book)) if active.all() else np.flatnonzero(active)


SUMMARY_TOTALS = ("cost_units", "local_steps", "rounds", "rounds_straggled", "bytes_up", "bytes_down", "energy_j",
                   "compute_s", "mi_epsilon_nats")


#: The summary's figures a node's own report can confirm or raise (its ledger has no straggles).
REPORTED_TOTALS = tuple(name for name in SUMMARY_TOTALS if name != "rounds_straggled")


def ledger_check(entry: dict[str, Any], reports: dict[int, Totals] | None, node: int) -> dict[str, Any]:
    """How a node's summary figures stand against its own ledger: ``ledger_check`` "local" (sim:
    the book is the nodes' ledger), "confirmed" (its report is at most every figure), "raised" (its
    report was higher in the figures of ``raised_by_node``, which the summary then shows: a ledger
    never under-counts), or "unconfirmed" (no report came: the node left before the run's end)."""
    if reports is None:
        return {"ledger_check": "local"}
    report = reports.get(node)
    if report is None:
        return {"ledger_check": "unconfirmed"}
    raised = {}
    for name in REPORTED_TOTALS:
        mine = getattr(report, name)
        if mine > entry[name] * (1 + 1e-9) + 1e-12:  # sums of the same floats in another order
            raised[name] = mine
    return {"ledger_check": "raised" if raised else "confirmed", **raised,
            **({"raised_by_node": sorted(raised)} if raised else {})}


def privacy_headline(guarantee: str, nodes: dict[str, dict[str, Any]], delta: float, accountant: str,
                     tight_accountant: str | None = None) -> dict[str, Any]:
    """The summary's privacy figures: ``guarantee``, ``private`` and ``headline``, the one figure to
    quote (every surface reads it: testbed.reports.headline.quote): {measure, value, unit, by} where
    ``by`` names the accountant (the tight one's when it ran, the paper's ``paper_value`` beside it)
    or the mutual-information ledger; ``{"measure": "not private", "value": null}`` (ε = ∞) for a run
    without noise. Its ``observer`` and ``secrecy`` come from the guarantees (secrecy.quote_against)."""
    epsilon = max((n["epsilon"] for n in nodes.values()), default=0.0) if guarantee == "dp" else None
    mi = max((n["mi_epsilon_nats"] for n in nodes.values()), default=0.0) if guarantee == "mi_dp" else None
    if guarantee == "dp":
        tight = [n["epsilon_tight"] for n in nodes.values() if n.get("epsilon_tight") is not None]
        headline = {"measure": "epsilon", "value": epsilon, "unit": f"at delta {delta:g}", "by": accountant}
        if tight and tight_accountant is not None:
            headline.update(value=max(tight), by=tight_accountant, paper_value=epsilon, paper_by=accountant)
    elif guarantee == "mi_dp":
        headline = {"measure": "epsilon-MI-DP", "value": mi, "unit": "nats", "by": "mutual-information ledger"}
    else:
        headline = {"measure": "not private", "value": None, "unit": None, "by": None}
    return {"guarantee": guarantee, "private": guarantee != "none", "headline": headline}


def server_noise(run: Run) -> dict[str, Any]:
    """privacy_guarantees' view of the server's noise: what keyed it, whose figures rest on it."""
    return {"server_randomness": run.server_randomness,
            "server_observers": frozenset(getattr(run.algorithm, "server_noise_observers", frozenset()))}


def cost_source(sources: set[bool]) -> str:
    """Where a run's seconds and joules came from: "measured" (meters), "modelled" (the device
    profile), "measured and modelled" (some nodes metered), or "none charged"."""
    return {frozenset({True}): "measured", frozenset({False}): "modelled",
            frozenset({True, False}): "measured and modelled"}.get(frozenset(sources), "none charged")


def summary(run: Run) -> dict[str, Any]:
    """summary.json of ``run`` as it stands (the tight accountant's ε filled in later by the runner's finish)."""
    config, budgets = run.config, run.budgets
    book = run.book
    tallies, index = book.distinct_tallies()
    by_observer = [epsilon_by_observer(budgets.accountant, tally, budgets.delta) for tally in tallies]
    rows = summary_rows(book)
    columns = {name: book.column(name)[rows].tolist() for name in SUMMARY_TOTALS}
    dp = run.guarantee == "dp"
    nodes = {}
    for row, (node, i) in enumerate(zip(book.node_ids[rows].tolist(), index[rows].tolist())):
        nodes[str(node)] = {
            # Not (ε, δ)-DP: ε is infinite, JSON null (the ledger's other releases, e.g. PADPFL's
            # noised scores beside unnoised models, bound nothing the run released).
            "epsilon": max(by_observer[i].values(), default=0.0) if dp else None,
            "epsilon_by_observer": dict(by_observer[i]) if dp else {},
            "epsilon_tight": None,  # filled in by the tight accountant's background job
            "delta": budgets.delta, **{name: col[row] for name, col in columns.items()},
        }
        nodes[str(node)].update(ledger_check(nodes[str(node)], run.node_reports, node))
        nodes[str(node)]["source"] = charging.source(run.charged_on_ask, run.reported_rounds, node,
                                                     local=run.node_reports is None)
    randomness = node_randomness(book.node_ids[rows].tolist(), run.randomness)
    for node, kind in randomness.items():
        nodes[str(node)]["randomness"] = kind
    reg = registry.get(config.run.algorithm)
    stopped = run.stopped
    settings = run.algorithm.describe()
    summary = {
        "algorithm": config.run.algorithm,
        "mode": config.run.mode,
        "seed": config.run.seed,
        "status": run.status,
        "rounds": run.rounds_done,
        "task": "regression" if run.regression else "classification",
        "final": {k: run.metrics[k] for k in ("test_accuracy", "train_loss", "test_loss", "test_accuracy_pooled",
                                               "validation_accuracy")},
        "nodes": nodes,
        "idle_nodes": len(book) - len(rows),
        "budgets": {"epsilon": budgets.epsilon, "delta": budgets.delta, "accountant": budgets.accountant,
                    "cost_units": budgets.cost_units, "bytes": budgets.bytes, "energy_j": budgets.energy_j,
                    "mi_epsilon": budgets.mi_epsilon},
        "stopped": None if stopped is None else {"node": stopped.node, "budget": stopped.budget,
                                                  "would_be": stopped.would_be, "limit": stopped.limit},
        # Nodes that refused a round for their own budget (the figures they gave, checked as finite):
        # each was taken out of the later rounds, the run went on with the others.
        "refusals": [{"node": e.node, "round": r, "budget": e.budget, "would_be": e.would_be, "limit": e.limit}
                     for r, e in run.refusals],
        # What its ε rests on that the mechanism run does not make true (a paper's reproduction only).
        "assumptions": run.assumptions,
        "privacy": {"accountant": budgets.accountant, "tight_accountant": config.privacy.tight_accountant,
                    "epsilon_target": reg.epsilon_target(assemble.algorithm_sections(config, reg)),
                    **privacy_headline(run.guarantee, nodes, budgets.delta, budgets.accountant)},
        # Against whom each figure holds: per observer, whether its noise is secret from it.
        "privacy_guarantees": privacy_guarantees(run.guarantee, nodes, randomness, budgets.delta, budgets.accountant,
                                                 resumed=len(run.sessions) > 1, **server_noise(run)),
        "costs": {"source": cost_source(run.cost_sources), "profile": config.nodes.profile},
        "stragglers": {"model": config.stragglers.model,
                       "rounds_straggled": int(book.column("rounds_straggled").sum())},
        "client_sampling": config.client_sampling.describe(config.data.num_nodes),
        "algorithm_settings": settings,
        "profile": config.nodes.profile,
        "name": config.run.name,
        "dataset": config.data.dataset,
        "model": config.model.kind,
        "session": run.session,
        # Every session that asked a round of the run (one per `testbed run` and `--resume`), oldest first.
        "sessions": run.sessions,
        "broker": run.broker,
        "links": run.links,
        "authentication": run.authentication,
        "sim_workers": run.sim_workers,
        # The rounds' seconds (none if the run failed before them), and the set-up's before them.
        "wall_s": time.monotonic() - run.wall_start if run.startup.end is not None else 0.0,
        "setup_s": run.startup.seconds(),
        "run_dir": str(run.directory.path),
    }
    summary["privacy"]["headline"] = quote_against(summary["privacy"]["headline"], summary["privacy_guarantees"])
    if "topology" in settings:  # who heard whom, for an algorithm whose settings describe its graph
        summary["topology"] = settings["topology"]
    if run.failure is not None:
        summary["failure"] = run.failure
    if run.plan is not None:
        summary["plan"] = run.plan
    return summary
