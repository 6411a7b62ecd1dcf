"""The figures of a run's summary to quote, in words: its privacy (the ε to quote, ε-MI-DP in nats, or
"not private"), its task's score (accuracy, or the loss of a regression) and where its costs came
from. Shared by the terminal's summary table, the HTML report and the sweep table, so none of them
can show a non-private run with a finite ε.

The privacy figure is one field of the summary, ``privacy.headline`` (:func:`quote`): the table,
``testbed runs``, the watch page, the HTML report, the trackers and the API all read it, so no two
of them can quote different figures.

A summary written before these figures existed (no ``privacy.guarantee``) reads as (ε, δ)-DP when
its nodes carry an ε, as it was then reported.

Example::

    >>> s = {"privacy": {"guarantee": "none", "headline": {"measure": "not private", "value": None}},
    ...      "nodes": {"0": {"epsilon": None}}, "budgets": {"delta": 1e-4, "accountant": "zcdp"}}
    >>> privacy_text(s)
    'not private (no noise on its releases: epsilon is infinite)'
    >>> epsilon_to_quote(s) is None
    True
    >>> quote_text(s), quote_text({"privacy": {"guarantee": "mi_dp", "headline": {"value": 10.05, "unit": "nats"}}})
    ('∞', '10.05 nats')
"""

from __future__ import annotations

from typing import Any

from testbed.accounting.budgets import BUDGET_NAME
from testbed.util.numbers import finite_real

NOT_PRIVATE = "not private (no noise on its releases: epsilon is infinite)"


def guarantee(summary: dict[str, Any]) -> str:
    """"dp", "mi_dp" or "none" (testbed.algorithms.registry.GUARANTEES) of a run's summary."""
    said = summary.get("privacy", {}).get("guarantee")
    if said is not None:
        return said
    return "dp" if any(n.get("epsilon") is not None for n in summary["nodes"].values()) else "none"


def epsilon_to_quote(summary: dict[str, Any]) -> float | None:
    """The (ε, δ) ε to quote: the tight accountant's when it ran, else the run's accountant's; None
    (ε = ∞) for a run that is not (ε, δ)-DP."""
    if guarantee(summary) != "dp":
        return None
    headline = summary.get("privacy", {}).get("headline")
    if headline is not None:
        return headline["value"]
    nodes = summary["nodes"].values()
    tight = [n["epsilon_tight"] for n in nodes if n.get("epsilon_tight") is not None]
    return max(tight) if tight else max((n["epsilon"] for n in nodes), default=0.0)


def quote(summary: dict[str, Any]) -> dict[str, Any]:
    """The privacy figure to quote, the summary's ``privacy.headline``: {measure, value, unit, by
    (the accountant), observer, secrecy}, and ``paper_value``/``paper_by`` when the tight accountant's
    figure is quoted. ``value`` is None exactly when the run is not private (ε = ∞). A summary of an
    older testbed without the field gets the one its figures give (observer and secrecy None)."""
    kind = guarantee(summary)
    said = summary.get("privacy", {}).get("headline")
    if kind == "none":
        return {"measure": "not private", "value": None, "unit": None, "by": None, "observer": None, "secrecy": None}
    if isinstance(said, dict) and said.get("value") is not None:
        return {"observer": None, "secrecy": None, **said}
    nodes = summary.get("nodes", {}).values()
    if kind == "mi_dp":
        nats = max((n.get("mi_epsilon_nats", 0.0) for n in nodes), default=0.0)
        return {"measure": "epsilon-MI-DP", "value": nats, "unit": "nats", "by": "mutual-information ledger",
                "observer": None, "secrecy": None}
    budgets = summary.get("budgets", {})
    return {"measure": "epsilon", "value": epsilon_to_quote(summary), "unit": f"at delta {budgets.get('delta', 0):g}",
            "by": budgets.get("accountant"), "observer": None, "secrecy": None}


def quote_text(summary: dict[str, Any]) -> str:
    """The quoted figure in a table's cell: "1.618" (ε at the run's δ), "10.05 nats" (ε-MI-DP), "∞"
    (not private)."""
    q = quote(summary)
    if q["value"] is None:
        return "∞"
    return f"{q['value']:.4g}" + (" nats" if q["unit"] == "nats" else "")


def privacy_text(summary: dict[str, Any]) -> str:
    """One line: the privacy figure to quote, with its unit, who computed it and against whom."""
    q = quote(summary)
    if q["value"] is None:
        return NOT_PRIVATE
    against = f", against the {q['observer']}" if q.get("observer") else ""
    if q["unit"] == "nats":
        return (f"epsilon-MI-DP {q['value']:.4g} nats (the mutual-information ledger{against}; "
                "not an (epsilon, delta) guarantee)")
    if q.get("paper_value") is not None:
        return (f"epsilon {q['value']:.4g} {q['unit']} (quote this: the tight {q['by']} accountant's{against}; "
                f"the paper's {q['paper_by']} {q['paper_value']:.4g})")
    return f"epsilon {q['value']:.4g} {q['unit']} ({q['by']}{against})"


#: What a report says of a summary without ``privacy_guarantees`` (written before they existed).
UNKNOWN_SECRECY = "against whom: not recorded (a summary of an older testbed; its noise came from the run seed)"


def guarantees(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The summary's ``privacy_guarantees`` (testbed.privacy.secrecy), each entry an observer of
    GaussianEvent.OBSERVERS, an ε (finite number or null) and a statement; an entry that is not
    one is left out (the file is outside input)."""
    from testbed.ledger.events import OBSERVERS

    raw = summary.get("privacy_guarantees")
    kept = []
    for g in raw if isinstance(raw, list) else ():
        eps = g.get("epsilon") if isinstance(g, dict) else None
        if isinstance(g, dict) and g.get("observer") in OBSERVERS and isinstance(g.get("statement"), str) \
                and (eps is None or (type(eps) in (int, float) and finite_real(eps) is not None)):
            kept.append(g)
    return kept


def guarantee_lines(summary: dict[str, Any]) -> list[str]:
    """Per observer, its ε and whether its noise is secret from it: "the server: epsilon 1.618
    (rdp): holds (noise from node secrets)"; a line saying it is not recorded for an older summary,
    none for a run without privacy figures."""
    if guarantee(summary) == "none":
        return []
    kept = guarantees(summary)
    if not kept:
        return [UNKNOWN_SECRECY]
    lines = []
    for g in kept:
        eps, unit = g.get("epsilon"), g.get("unit")
        if eps is None:
            figure = "epsilon ?"
        elif isinstance(unit, str):  # ε-MI-DP in nats: never read as an (ε, δ) figure
            figure = f"epsilon-MI-DP {eps:.4g} {unit}"
        else:
            figure = f"epsilon {eps:.4g}"
        lines.append(f"the {g['observer']}: {figure} ({g.get('accountant')}): {g['statement']}")
    return lines


def score_text(summary: dict[str, Any]) -> str:
    """The model's score: test accuracy and training loss, or for a regression its losses."""
    final = summary["final"]
    if summary.get("task") == "regression":
        test = final.get("test_loss")
        return (f"test loss {test:.4g}   " if test is not None else "") + \
            f"train loss {final['train_loss']:.4g} (squared error, ½‖xW − y‖² per sample; a regression)"
    return f"test acc {final['test_accuracy']:.4f}   train loss {final['train_loss']:.4g}"


def cost_source(summary: dict[str, Any]) -> str:
    """Where the seconds and joules came from: "measured" (meters), "modelled by the PROFILE profile",
    or both."""
    source = summary.get("costs", {}).get("source", "modelled")
    profile = summary.get("profile", "host")
    if source == "modelled":
        return f"modelled by the {profile} profile"
    if source == "measured and modelled":
        return f"measured on metered nodes, modelled by the {profile} profile on the others"
    return source


def refusals(summary: dict[str, Any]) -> list[dict[str, Any]]:
    """The summary's ``refusals`` (nodes that refused a round for their own budget and were asked
    nothing more), each a node, a round, a budget's name and two finite figures; an entry that is
    not one is left out (a summary of an older testbed has none).

    Example::

        >>> refusals({"refusals": [{"node": 2, "round": 3, "budget": "epsilon", "would_be": 9.0, "limit": 1.0},
        ...                        {"node": "x"}]})
        [{'node': 2, 'round': 3, 'budget': 'epsilon', 'would_be': 9.0, 'limit': 1.0}]
    """
    raw = summary.get("refusals")
    kept = []
    for entry in raw if isinstance(raw, list) else ():
        if isinstance(entry, dict) and all(type(entry.get(k)) is int for k in ("node", "round")) \
                and isinstance(entry.get("budget"), str) and BUDGET_NAME.fullmatch(entry["budget"]) \
                and all(type(entry.get(k)) in (int, float) and finite_real(entry[k]) is not None
                        for k in ("would_be", "limit")):
            kept.append(entry)
    return kept


def refusals_text(kept: list[dict[str, Any]], shown: int = 5) -> str:
    """:func:`refusals` in words, rounds from 1 (as the progress shows them): "node 2 in round 4
    (epsilon 9 > 1)", the first ``shown`` and how many more."""
    words = [f"node {r['node']} in round {r['round'] + 1} ({r['budget']} {r['would_be']:.6g} > {r['limit']:.6g})"
             for r in kept[:shown]]
    return ", ".join(words) + (f" and {len(kept) - shown} more" if len(kept) > shown else "")
