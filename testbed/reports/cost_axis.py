"""What "accuracy against cost" is plotted against: the run's cost units where its algorithm has a
cost model (DP-PASGD's c1/c2), else the bytes it sent, else nothing (the panel is left out, saying
why). One rule for the run's figures (testbed.reports.plots) and the watch page (testbed.watch.feed):
an x that stays 0 would draw every point on one vertical line.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

#: (metrics.csv column, axis label, panel caption), in the order tried.
AXES = (("cost_units", "resource cost spent per node (c1/c2 units)",
         "accuracy and loss against cost spent (c1/c2 units, the most any node spent)"),
        ("bytes_total", "bytes sent per node",
         "accuracy and loss against bytes sent (the most any node sent; this algorithm has no cost units)"))
#: The caption when neither grows.
NONE = "no accuracy against cost: this run spends no cost units and sends no bytes"


def cost_axis(rows: Iterable[Mapping[str, Any]]) -> dict[str, str] | None:
    """``{"key", "label", "caption"}`` of the first of :data:`AXES` some row spent (> 0), or None.

    Example::

        >>> cost_axis([{"cost_units": 0.0, "bytes_total": 0}, {"cost_units": 0.0, "bytes_total": 640}])["key"]
        'bytes_total'
        >>> cost_axis([{"cost_units": 0.0, "bytes_total": 0}]) is None
        True
    """
    rows = list(rows)
    for key, label, caption in AXES:
        if any((r.get(key) or 0) > 0 for r in rows):
            return {"key": key, "label": label, "caption": caption}
    return None
