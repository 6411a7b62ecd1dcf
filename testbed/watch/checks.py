"""What `testbed watch` accepts of a run's files: each metrics row, ledger event and summary field the
page uses, checked against the run's config before it is kept. Each check raises ValueError with one
line naming the column or field; the feed shows it on the page and uses nothing of that row.

Example::

    >>> metric_row(["1", "5", "", "", "", "", "105.0", "2.5", "288", "0", "0.16"], last_round=0, num_nodes=4)["round"]
    1.0
"""

from __future__ import annotations

import math
from typing import Any

from testbed.ledger.events import Event, GaussianEvent
from testbed.ledger.fields import ABSURD
from testbed.ledger.node import NodeLedger
from testbed.reports import headline
from testbed.reports.results import METRIC_COLUMNS
from testbed.util.numbers import finite_real
from testbed.util.oneline import one_line as util_one_line

#: Metric columns the page plots.
PLOTTED = ("round", "train_loss", "test_accuracy", "cost_units", "bytes_total", "epsilon", "stragglers", "wall_s")
#: Ledger fields that are sums of physical or abstract costs; the ledger's own rules bound them
#: below only, the page also above (an event past this is not the run's, and sums stay finite).
_COST_FIELDS = ("cost_units", "compute_s", "airtime_s", "energy_j")
#: Distinct privacy signatures one node may have: a run has a few (one per noise level); each costs
#: the accountant time on every change of the node's tally.
MAX_SIGNATURES = 256
#: Columns that hold NaN when a run has no value for a round (not evaluated; ε of no release).
_ACCURACIES = ("test_accuracy", "test_accuracy_pooled", "validation_accuracy")
_MAY_BE_NAN = (*_ACCURACIES, "epsilon")
_INT_LIMIT = 2**63
_MAX_TEXT = 500


def _number(column: str, cell: str) -> float:
    if len(cell) > 40:
        raise ValueError(f"{column} is not a number ({len(cell)} characters)")
    try:
        return float(cell)
    except ValueError:
        raise ValueError(f"{column} is not a number: {cell[:20]!r}") from None


def _count(column: str, value: float, high: float) -> float:
    if not (value.is_integer() and 0 <= value <= high):
        raise ValueError(f"{column} must be a whole number in 0..{high:g}, got {value:g}")
    return value


def json_number(x: float | None) -> float | None:
    """``x`` as the page's JSON takes it: a float, or None for None, NaN and ±inf."""
    return finite_real(x)


def one_line(exc: BaseException) -> str:
    """An error's message on one line of at most 300 characters (its type's name if it has none),
    for the page's error."""
    return util_one_line(exc, 300) or type(exc).__name__


def metric_row(cells: list[str], last_round: int, num_nodes: int | None,
               rounds_planned: int | None = None) -> dict[str, float | None]:
    """The plotted values of one metrics.csv row, checked: every cell a number or empty; ``round``
    a whole number after ``last_round`` and at most ``rounds_planned``; ``stragglers`` a count of
    at most ``num_nodes``; costs, bytes and seconds in 0..1e30; accuracies in [0, 1]; ε not
    negative. A diverged loss, an infinite ε (no noise) or a round without evaluation is None."""
    if len(cells) != len(METRIC_COLUMNS):
        raise ValueError(f"{len(cells)} cells, the header has {len(METRIC_COLUMNS)}")
    values = {c: (None if cell == "" else _number(c, cell)) for c, cell in zip(METRIC_COLUMNS, cells)}
    for column in ("round", "wall_s", "stragglers"):
        if values[column] is None:
            raise ValueError(f"{column} is empty")
    for column, value in values.items():
        if value is None or column == "train_loss" or (column in _MAY_BE_NAN and math.isnan(value)):
            continue
        high = 1.0 if column in _ACCURACIES else math.inf if column == "epsilon" else ABSURD
        if not 0 <= value <= high:
            raise ValueError(f"{column} must be in 0..{high:g}, got {value:g}")
    round_ = _count("round", values["round"], _INT_LIMIT - 1)
    if round_ <= last_round:
        raise ValueError(f"round {round_:g} does not follow round {last_round}")
    if rounds_planned is not None and round_ > rounds_planned:
        raise ValueError(f"round {round_:g} is past the run's {rounds_planned} rounds")
    _count("stragglers", values["stragglers"], num_nodes if num_nodes is not None else _INT_LIMIT - 1)
    return {c: None if values[c] is None else finite_real(values[c]) for c in PLOTTED}


def check_event(event: Event, num_nodes: int, rounds_planned: int | None, ledger: NodeLedger | None) -> None:
    """Refuse an event (already checked against the ledger's field rules) that is not of this run:
    a node outside its ``num_nodes``, a round outside -1 (setup) .. ``rounds_planned`` - 1, a cost
    above 1e30, or a privacy signature past the node's :data:`MAX_SIGNATURES` (``ledger``: the
    node's ledger so far, None before its first event)."""
    if not 0 <= event.node < num_nodes:
        raise ValueError(f"node {event.node} is not one of the run's {num_nodes} nodes")
    if rounds_planned is not None and event.round >= rounds_planned:
        raise ValueError(f"round {event.round} is past the run's {rounds_planned} rounds (counted from 0)")
    for name in _COST_FIELDS:
        value = getattr(event, name, 0.0)
        if value > ABSURD:
            raise ValueError(f"{event.kind} event: {name} {value:g} is above {ABSURD:g}")
    if (isinstance(event, GaussianEvent) and ledger is not None and event.signature not in ledger.privacy
            and len(ledger.privacy) >= MAX_SIGNATURES):
        raise ValueError(f"node {event.node} has more than {MAX_SIGNATURES} distinct noise settings")


def _number_or_none(summary: dict, key: str, required: bool = False) -> float | None:
    value = summary.get(key)
    if value is None and not required:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{key} must be a number, got {type(value).__name__}")
    return finite_real(value)  # NaN, ±inf or past float64's range: none


def _one_line_text(value: object, key: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise ValueError(f"{key} must be a string, got {type(value).__name__}")
    text = " ".join(value.split())
    return text if len(text) <= _MAX_TEXT else text[:_MAX_TEXT - 3] + "..."


def summary_view(summary: dict[str, Any]) -> dict[str, Any]:
    """What the page shows of a summary (already checked by testbed.reports.results.read_summary:
    JSON, its keys, its sha256, ``status`` and ``rounds``), each other field it uses checked for its
    type: ``wall_s`` (the rounds') and ``setup_s`` (before them) numbers, ``stopped`` None or {node, budget, would_be, limit}, ``failure`` None
    or text, ``secrecy``: per observer, its ε and whether the noise is secret from it (the checked
    entries of ``privacy_guarantees``, in words: testbed.reports.headline.guarantee_lines), and
    ``quote``: the summary's one figure to quote (testbed.reports.headline.quote), {text ("1.618",
    "10.05 nats", "∞"), by, observer}, None when its figures are not numbers."""
    status, rounds = summary["status"], summary["rounds"]
    stopped = summary.get("stopped")
    if stopped is not None:
        if not isinstance(stopped, dict):
            raise ValueError(f"stopped must be an object, got {type(stopped).__name__}")
        node = stopped.get("node")
        if isinstance(node, bool) or not isinstance(node, int) or not 0 <= node < _INT_LIMIT:
            raise ValueError(f"stopped.node must be a node id, got {str(node)[:20]!r}")
        stopped = {"node": node, "budget": _one_line_text(stopped.get("budget"), "stopped.budget"),
                   "would_be": _number_or_none(stopped, "would_be", required=True),
                   "limit": _number_or_none(stopped, "limit", required=True)}
    return {"status": status, "rounds": rounds, "wall_s": _number_or_none(summary, "wall_s"),
            "setup_s": _number_or_none(summary, "setup_s"),
            "stopped": stopped, "failure": _one_line_text(summary.get("failure"), "failure"),
            "secrecy": [" ".join(line.split()) for line in headline.guarantee_lines(summary)],
            "quote": _quote(summary)}


def _quote(summary: dict[str, Any]) -> dict[str, Any] | None:
    """The summary's figure to quote as the page shows it, or None when it is not a number (the file
    is outside input: a value that is not a finite number is not shown)."""
    try:
        q = headline.quote(summary)
        value = q["value"]
        if value is not None and (type(value) not in (int, float) or finite_real(value) is None):
            return None
        return {"text": headline.quote_text(summary), "by": _one_line_text(q.get("by"), "by"),
                "observer": _one_line_text(q.get("observer"), "observer")}
    except (AttributeError, KeyError, TypeError, ValueError):
        return None
