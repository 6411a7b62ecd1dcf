"""``RUN_DIR/refusals.csv``: the nodes that refused a round for their own budget, so that a resume
asks a withdrawn node nothing more (it would refuse again) and the summary keeps its ``refusals``.

One line per refusal: ``round,node,budget,would_be,limit`` (the figures as the node gave them,
checked finite before they were kept). Written only by the run's rounds loop, which holds the run
directory's lock; append-only (testbed.util.appendlog), flushed as each refusal is taken and, with
``output.sync``, fsynced too.

Read back at resume (:func:`read_refusals`): a last line cut mid-write is ignored (the refusal
was not yet kept: the node is asked again and refuses again, nothing released); any other line
that is not a refusal of this run's nodes and rounds is refused in one line, as every run file is.
A run directory without the file (a run of an older testbed, or one nobody refused) has none.

Example::

    >>> import tempfile, pathlib
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "refusals.csv"
    >>> log = RefusalLog(path, sync=False)
    >>> log.append(3, Exceeded(2, "epsilon", 1.25, 1.0))
    >>> log.close()
    >>> path.read_text().splitlines()[1]
    '3,2,epsilon,1.25,1.0'
    >>> read_refusals(path, nodes=range(4), last_round=9)
    [Refusal(round=3, node=2, budget='epsilon', would_be=1.25, limit=1.0)]
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Collection

from testbed.accounting.budgets import BUDGET_NAME, Exceeded
from testbed.checked.limits import MAX_RUN_FILE_BYTES
from testbed.errors import UserError
from testbed.util.appendlog import open_past_cut
from testbed.util.userfiles import read_text

log = logging.getLogger(__name__)

HEADER = "round,node,budget,would_be,limit\n"
_NUMBER = r"-?(?:\d{1,400}(?:\.\d{0,400})?|\.\d{1,400})(?:[eE][-+]?\d{1,4})?"
_LINE = re.compile(rf"(?P<round>\d{{1,12}}),(?P<node>\d{{1,12}}),(?P<budget>{BUDGET_NAME.pattern}),"
                   rf"(?P<would_be>{_NUMBER}),(?P<limit>{_NUMBER})")


@dataclass(frozen=True)
class Refusal:
    """``node`` refused round ``round``: its ``budget`` would be ``would_be`` > ``limit``."""

    round: int
    node: int
    budget: str
    would_be: float
    limit: float

    def exceeded(self) -> Exceeded:
        return Exceeded(self.node, self.budget, self.would_be, self.limit)


class RefusalLog:
    """Appends the run's refusals to ``refusals.csv``."""

    def __init__(self, path: Path, sync: bool = False):
        self._log = open_past_cut(Path(path), HEADER, sync)  # a line a kill cut: its reader ignored it

    def append(self, round_index: int, refusal: Exceeded) -> None:
        """Keep that ``refusal.node`` refused ``round_index``: on the OS's side before this returns,
        on disk too with ``sync``."""
        if not BUDGET_NAME.fullmatch(refusal.budget) \
                or not all(math.isfinite(v) for v in (refusal.would_be, refusal.limit)):
            raise ValueError(f"not a refusal to keep: {refusal}")
        self._log.append(f"{round_index},{refusal.node},{refusal.budget},{float(refusal.would_be)!r},"
                         f"{float(refusal.limit)!r}\n", rows=1)
        if self._log.sync:
            self._log.mark()  # fsync

    def close(self) -> None:
        self._log.close()


def read_refusals(path: Path, nodes: Collection[int] | None, last_round: int) -> list[Refusal]:
    """The refusals of ``path``, checked: each a round in 0..``last_round``, a node of the run
    (``nodes``; None: any) that refused no earlier round, a budget name and two finite figures. A
    last line without its line end is ignored (cut before it was kept).

    Raises:
        UserError: one line naming the file and the line that is not such a refusal.
    """
    path = Path(path)
    if not path.exists():
        return []
    try:
        text = read_text(path, MAX_RUN_FILE_BYTES, "")
    except UserError as exc:
        raise UserError(f"{path}: unreadable ({str(exc).removeprefix(f' {path}: ')}); refusing to resume") from None
    lines = text.split("\n")
    if lines[-1]:
        log.warning("%s: its last line was cut mid-write (the refusal was not kept): ignored", path)
    lines = lines[:-1]
    if not lines or lines[0] + "\n" != HEADER:
        raise UserError(f"{path}: line 1 is not the header {HEADER.strip()!r}; refusing to resume")
    refusals: list[Refusal] = []
    allowed = None if nodes is None else set(nodes)
    seen: set[int] = set()
    for number, line in enumerate(lines[1:], start=2):
        match = _LINE.fullmatch(line)
        refusal = None
        if match:
            refusal = Refusal(int(match["round"]), int(match["node"]), match["budget"], float(match["would_be"]),
                              float(match["limit"]))
        if refusal is None or refusal.round > last_round or refusal.node in seen \
                or (allowed is not None and refusal.node not in allowed) \
                or not (math.isfinite(refusal.would_be) and math.isfinite(refusal.limit)):
            raise UserError(f"{path}: line {number} is not a refusal of a node of this run ({line[:60]!r}); "
                            "refusing to resume")
        seen.add(refusal.node)
        refusals.append(refusal)
    return refusals
