"""``RUN_DIR/asked.csv``: which nodes each session of a run asked in each round, written before the
round is sent (MQTT) or stepped (sim), so that a resume knows who may have released what its ledger
never received.

One line per round asked: ``session,round,nodes``, the nodes as runs of consecutive ids separated by
spaces (``0-4 7``: nodes 0 to 4 and 7; a round of every node of a large run is one short item). The file is
append-only (testbed.util.appendlog), flushed before the round leaves this process (a kill cannot
lose the record of a round sent) and, with ``output.sync``, fsynced too (nor can a power cut).

Read back at resume (:func:`read_asked`): a last line cut mid-write is ignored (it was cut before
its round was sent: nothing was released); any other line that is not a record of this run's
nodes and rounds is refused in one line, as every run file is. A run directory without the file
(written by an older testbed) has no record: a warning says so.

Example::

    >>> import tempfile, pathlib
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "asked.csv"
    >>> log = AskedLog(path, sync=False)
    >>> log.append("0123456789abcdef", 3, (0, 1, 2, 5))
    >>> log.close()
    >>> path.read_text().splitlines()[1]
    '0123456789abcdef,3,0-2 5'
    >>> read_asked(path, nodes=range(6), last_round=9)
    [Asked(session='0123456789abcdef', round=3, nodes=(0, 1, 2, 5))]
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Collection, Sequence

from testbed.algorithms.contract import SETUP_ROUND
from testbed.checked.limits import MAX_RUN_FILE_BYTES
from testbed.errors import UserError
from testbed.util.appendlog import open_past_cut
from testbed.util.userfiles import read_text

log = logging.getLogger(__name__)

HEADER = "session,round,nodes\n"
_SESSION = re.compile(r"[0-9a-f]{16}")
_ITEM = r"\d{1,12}(?:-\d{1,12})?"
_LINE = re.compile(rf"(?P<session>[0-9a-f]{{16}}),(?P<round>-?\d{{1,12}}),(?P<nodes>{_ITEM}(?: {_ITEM})*)?")
_MAX_NODES = 10_000_000  # nodes a record may name (a run's nodes fit far below; a forged range does not)


@dataclass(frozen=True)
class Asked:
    """One round one session asked: ``nodes`` were sent (or stepped in) round ``round``."""

    session: str
    round: int
    nodes: tuple[int, ...]


class AskedLog:
    """Appends the rounds a session asks to ``asked.csv``."""

    def __init__(self, path: Path, sync: bool = False):
        self._log = open_past_cut(Path(path), HEADER, sync)  # a line a kill cut: its reader ignored it

    def append(self, session: str, round_index: int, nodes: Sequence[int]) -> None:
        """Record that ``session`` asks ``nodes`` in ``round_index``: on the OS's side before this
        returns, on disk too with ``sync``."""
        if not _SESSION.fullmatch(session):
            raise ValueError(f"session {session!r} is not 16 hex digits")
        self._log.append(f"{session},{round_index},{_runs(nodes)}\n", rows=1)
        if self._log.sync:
            self._log.mark()  # fsync

    def close(self) -> None:
        self._log.close()


def read_asked(path: Path, nodes: Collection[int] | None, last_round: int, setup: bool = True) -> list[Asked]:
    """The records of ``path``, checked: each a session id, a round in SETUP_ROUND..``last_round``
    (0..``last_round`` for an algorithm without a ``setup``) and distinct nodes of the run
    (``nodes``; None: any). A last line without its line end is ignored (cut before its
    round was sent).

    Raises:
        UserError: one line naming the file and the line that is not such a record.
    """
    path = Path(path)
    if not path.exists():
        log.warning("%s: missing (a run of an older testbed, or deleted): nothing is known of the rounds its "
                    "sessions asked; a node that released a re-run round and does not answer it again is not charged",
                    path)
        return []
    try:
        text = read_text(path, MAX_RUN_FILE_BYTES, "")
    except UserError as exc:
        raise UserError(f"{path}: unreadable ({str(exc).removeprefix(f' {path}: ')}); refusing to resume") from None
    lines = text.split("\n")
    if lines[-1]:
        log.warning("%s: its last line was cut mid-write (its round was never sent): ignored", path)
    lines = lines[:-1]  # the cut line, or "" after the last line end
    if not lines or lines[0] + "\n" != HEADER:
        raise UserError(f"{path}: line 1 is not the header {HEADER.strip()!r}; refusing to resume")
    records, allowed = [], None if nodes is None else set(nodes)
    for number, line in enumerate(lines[1:], start=2):
        match = _LINE.fullmatch(line)
        asked = _ids(match["nodes"] or "") if match else None
        round_index = int(match["round"]) if match else None
        if asked is None or not (SETUP_ROUND if setup else 0) <= round_index <= last_round \
                or len(set(asked)) != len(asked) \
                or (allowed is not None and not allowed.issuperset(asked)):
            raise UserError(f"{path}: line {number} is not a record of a round this run asked "
                            f"({line[:60]!r}); refusing to resume")
        records.append(Asked(match["session"], round_index, asked))
    return records


def _runs(nodes: Sequence[int]) -> str:
    """``nodes`` as runs of consecutive ids: (0, 1, 2, 5) → "0-2 5"."""
    items, ids = [], [int(n) for n in nodes]
    start = 0
    for i in range(1, len(ids) + 1):
        if i == len(ids) or ids[i] != ids[i - 1] + 1:
            items.append(str(ids[start]) if i - 1 == start else f"{ids[start]}-{ids[i - 1]}")
            start = i
    return " ".join(items)


def _ids(text: str) -> tuple[int, ...] | None:
    """The node ids of a record's runs, or None when a run is reversed or they name too many."""
    ids: list[int] = []
    for item in text.split():
        first, _, last = item.partition("-")
        lo, hi = int(first), int(last or first)
        if hi < lo or len(ids) + hi - lo + 1 > _MAX_NODES:
            return None
        ids.extend(range(lo, hi + 1))
    return tuple(ids)
