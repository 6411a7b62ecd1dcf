"""The run's progress on stderr: rich's progress bar on a terminal, plain lines otherwise.

It shows the round, the rate, the time left, the training loss, ε spent and the worst budget spent
so far (the largest fraction of any per-node budget, e.g. ``budget ε 62%``). Silent with --quiet.

On a terminal the bar is redrawn at most every REFRESH_S seconds, from the round loop itself (no
refresh thread competing with the coordinator for the interpreter); in a log it is a line per tenth
of the run, not a line per round.
"""

from __future__ import annotations

import math
import sys
import time
from typing import TYPE_CHECKING, Any, Mapping

if TYPE_CHECKING:
    from rich.progress import Progress as RichProgress

    from testbed.accounting.book import LedgerBook
    from testbed.accounting.budgets import Budgets

REFRESH_S = 0.5  # a redraw costs ~1.4 ms (benchmarks/watch.py): 0.3 % of the time at this rate
#: Budget name in the line → (metrics row key or None, Budgets attribute, ledger book column).
_BUDGETS = {"ε": ("epsilon", "epsilon", None), "cost": ("cost_units", "cost_units", None),
            "bytes": ("bytes_total", "bytes", None), "energy": (None, "energy_j", "energy_j"),
            "MI-ε": (None, "mi_epsilon", "mi_epsilon_nats")}


def worst_budget(budgets: "Budgets | None", row: Mapping[str, Any],
                 book: "LedgerBook | None" = None) -> tuple[str, float] | None:
    """(name, fraction spent) of the budget closest to its limit, or None without budgets.

    Args:
        budgets: the run's per-node budgets.
        row: the round's metrics row (ε, cost units and bytes: the most any node spent).
        book: the nodes' ledgers, read only for a budget the row has no column of (energy, MI-ε).

    Example::

        >>> from testbed.accounting.budgets import Budgets
        >>> worst_budget(Budgets(epsilon=4.0, cost_units=1000.0), {"epsilon": 1.0, "cost_units": 500.0})
        ('cost', 0.5)
    """
    if budgets is None:
        return None
    worst = None
    for name, (column, limit_key, total_key) in _BUDGETS.items():
        limit = getattr(budgets, limit_key)
        if not limit:
            continue
        if column is not None:
            spent = row[column]
        else:
            spent = 0.0 if book is None else float(book.column(total_key).max(initial=0.0))
        if worst is None or spent / limit > worst[1]:
            worst = (name, spent / limit)
    return worst


def _rich_bar(stream) -> "RichProgress":
    """rich's bar: round M/N, bar, rate, time left, then the ``stats`` field. Imported
    here, on a terminal only: a log or --quiet does not pay rich's import."""
    from rich.console import Console
    from rich.table import Column
    from rich.progress import (BarColumn, MofNCompleteColumn, Progress as RichProgress, ProgressColumn, Task,
                               TextColumn, TimeRemainingColumn)
    from rich.text import Text

    class RateColumn(ProgressColumn):
        """Rounds per second (seconds per round when slower than one a second)."""

        def render(self, task: Task) -> Text:
            speed = task.speed
            if not speed:
                return Text("", style="progress.data.speed")
            if speed >= 1:
                text = f"{speed:.0f} rounds/s" if speed >= 100 else f"{speed:.3g} rounds/s"
            else:
                text = f"{1 / speed:.3g} s/round"
            return Text(text, style="progress.data.speed")

    # One line of an 80-column terminal: on a narrower one the stats are cut, never wrapped.
    return RichProgress(TextColumn("round"), MofNCompleteColumn(), BarColumn(bar_width=10),
                        RateColumn(table_column=Column(no_wrap=True)), TimeRemainingColumn(compact=True),
                        TextColumn("left {task.fields[stats]}", table_column=Column(no_wrap=True, overflow="ellipsis")),
                        console=Console(file=stream), auto_refresh=False)


class Progress:
    """The progress of one run's rounds.

    Args:
        total_rounds: the rounds the run plans.
        enabled: False for --quiet.
        stream: where to write (default stderr); a terminal gets the bar, anything else lines.
        budgets: the per-node budgets, for the worst-budget field.
        guarantee: what the run's releases carry (testbed.algorithms.registry.GUARANTEES): the ε
            field is ε for "dp", the most ε-MI-DP in nats of any node for "mi_dp" (read off the
            book), "not private" for "none".
    """

    def __init__(self, total_rounds: int, enabled: bool = True, stream=None, budgets: "Budgets | None" = None,
                 guarantee: str = "dp"):
        self.total = max(1, total_rounds)
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.budgets = budgets
        self.guarantee = guarantee
        self.tty = self.stream.isatty()
        self.start = time.monotonic()
        self._last_decile = -1
        self._last_refresh = 0.0
        self._bar: RichProgress | None = None
        if enabled and self.tty:
            self._bar = _rich_bar(self.stream)
            self._task = self._bar.add_task("rounds", total=self.total, stats="")
            self._bar.start()

    def update(self, round_done: int, loss: float, epsilon: float, row: Mapping[str, Any] | None = None,
               book: "LedgerBook | None" = None) -> None:
        """After round ``round_done`` (1-based): its training loss, ε spent, and its metrics row and
        the ledger book for the worst budget."""
        if not self.enabled:
            return
        now = time.monotonic()
        last = round_done >= self.total
        if self._bar is not None and not last and now - self._last_refresh < REFRESH_S:
            self._bar.update(self._task, completed=round_done)  # the rate needs every round
            return
        if self._bar is None and int(10 * round_done / self.total) <= self._last_decile:
            return
        stats = f"loss {loss:.4f} {self._privacy(epsilon, book)}"
        worst = worst_budget(self.budgets, row, book) if row is not None else None
        if worst is not None:
            stats += f" budget {worst[0]} {100 * worst[1]:.0f}%"
        if self._bar is not None:
            self._last_refresh = now
            self._bar.update(self._task, completed=round_done, stats=stats)
            self._bar.refresh()
            return
        self._last_decile = int(10 * round_done / self.total)
        elapsed = now - self.start
        left = elapsed / round_done * (self.total - round_done) if round_done else 0.0
        self.stream.write(f"round {round_done}/{self.total}  {round_done / max(elapsed, 1e-9):.3g} rounds/s  "
                          f"{elapsed:.1f}s, {left:.1f}s left  {stats}\n")
        self.stream.flush()

    def _privacy(self, epsilon: float, book: "LedgerBook | None") -> str:
        if self.guarantee == "mi_dp":
            nats = 0.0 if book is None else float(book.column("mi_epsilon_nats").max(initial=0.0))
            return f"MI-ε {nats:.4g} nats"
        return f"ε {epsilon:.4g}" if self.guarantee == "dp" and math.isfinite(epsilon) else "not private"

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
