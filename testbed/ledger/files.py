"""``ledger.csv``: one row per event (a ``kind`` column, a ``node`` column, every kind's fields as
columns), written append-only and flushed every round, read back with every row checked.
"""

from __future__ import annotations

import csv
import dataclasses
import io
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from testbed.errors import UserError
from testbed.ledger.events import ALL_FIELDS, EVENT_TYPES, Event, EventBatch
from testbed.ledger.fields import event_from_dict
from testbed.util.appendlog import AppendLog, Mark as LedgerMark
from testbed.util.userfiles import regular_file


LEDGER_COLUMNS = ["kind", *ALL_FIELDS]
#: Per event class: its row with the other kinds' columns blank, and (column, field) to fill in.
_ROW_TEMPLATES = {
    cls: (["" if c != "kind" else cls.kind for c in LEDGER_COLUMNS],
          [(LEDGER_COLUMNS.index(f.name), f.name) for f in dataclasses.fields(cls)])
    for cls in EVENT_TYPES.values()
}


def _row(event: Event) -> list:
    """The ledger.csv row of ``event`` (getattr on its own fields only: this runs for every event
    of every node every round)."""
    template, fields = _ROW_TEMPLATES[type(event)]
    row = template.copy()
    for column, name in fields:
        row[column] = getattr(event, name)
    return row


_SLOT = "\x00"  # marks a column's place in a batch's row; never in a formatted value


def _batch_text(batch: EventBatch) -> str:
    """The ledger.csv rows of ``batch``: the template's row through csv once, with a slot for each
    column that differs by node, then the columns' values (Python's str, as csv writes them)."""
    template, fields = _ROW_TEMPLATES[type(batch.template)]
    row = template.copy()
    for column, name in fields:
        row[column] = getattr(batch.template, name)
    varying = ["node", *batch.columns]
    for column, name in fields:
        if name in varying:
            row[column] = f"{_SLOT}{varying.index(name)}{_SLOT}"
    buf = io.StringIO()
    csv.writer(buf).writerow(row)
    pieces = buf.getvalue().split(_SLOT)  # text, slot index, text, slot index, ..., text
    texts, slots = pieces[0::2], [int(k) for k in pieces[1::2]]
    # One format string per batch, a "{}" per slot (str.format of a Python int, float, bool or str
    # with no spec is its str): every row formatted in C, not a Python loop over rows and columns.
    row_format = "{}".join(text.replace("{", "{{").replace("}", "}}") for text in texts)
    values = [batch.nodes, *batch.columns.values()]
    return "".join(map(row_format.format, *(_column_values(values[k]) for k in slots)))


_FORMATTED_ONCE_FROM = 16  # rows; below, np.unique costs more than the floats' repr


def _column_values(column: np.ndarray) -> list:
    """A batch column's values for its rows' text (formatted with their str): a float column's
    distinct values are formatted once, as text. A float's shortest repr is the costly step (0.65
    µs each; a coordinator's round has one measured seconds and joules per host for 80 nodes), and
    distinct means distinct bits: -0.0 is not 0.0."""
    column = np.asarray(column)
    if column.dtype != np.float64 or column.size < _FORMATTED_ONCE_FROM:
        return column.tolist()
    bits, rows = np.unique(column.view(np.uint64), return_inverse=True)
    return np.array([str(v) for v in bits.view(np.float64).tolist()], dtype=object)[rows.ravel()].tolist()


def ledger_header() -> str:
    """ledger.csv's header line, as :class:`LedgerWriter` writes it."""
    buf = io.StringIO()
    csv.writer(buf).writerow(LEDGER_COLUMNS)
    return buf.getvalue()


class LedgerWriter:
    """Appends events to ``ledger.csv`` (one row per event, a ``kind`` column, a ``node`` column),
    flushed after every round so a killed run leaves a readable ledger.

    It keeps a running sha256 and row count, so :meth:`mark` tells a checkpoint what the ledger
    held, at the cost of hashing the bytes written (the file is hashed once when reopened).
    Each :meth:`write` is one write to the file: a killed process leaves whole calls or none.

    Example::

        >>> import tempfile, pathlib
        >>> from testbed.ledger.events import ComputeEvent
        >>> w = LedgerWriter(pathlib.Path(tempfile.mkdtemp()) / "ledger.csv")
        >>> w.write([ComputeEvent(node=0, round=0, local_steps=5)])
        >>> w.mark().rows
        1
    """

    def __init__(self, path: Path, sync: bool = True):
        try:
            self._log = AppendLog(Path(path), header=ledger_header(), sync=sync)
        except ValueError as exc:
            raise UserError(f"{path}: {exc}") from None

    def write(self, events: Iterable[Event]) -> None:
        rows = [_row(event) for event in events]
        if rows:
            buf = io.StringIO()
            csv.writer(buf).writerows(rows)
            self._log.append(buf.getvalue(), len(rows))

    def write_batches(self, batches: Iterable[EventBatch]) -> None:
        """The rows of ``batches``, in one write: the rows :meth:`write` makes of each batch's
        events, formatted a column at a time."""
        parts, rows = [], 0
        for batch in batches:
            if len(batch):
                parts.append(_batch_text(batch))
                rows += len(batch)
        if rows:
            self._log.append("".join(parts), rows)

    def mark(self) -> LedgerMark:
        """What the ledger holds now (rows, bytes, sha256), synced to disk: for the checkpoint."""
        return self._log.mark()

    def close(self) -> None:
        self._log.close()



def read_ledger(path: Path) -> Iterator[Event]:
    """The events of a ``ledger.csv``, in the order written.

    Raises:
        ValueError: a header that is not :data:`LEDGER_COLUMNS` or a bad row (naming its number, the
            header being line 1); a cut last line is a bad row too.
    """
    try:  # a FIFO would block the reader, a device never end: a regular file only (streamed: any size)
        regular_file(Path(path), 1 << 62, "")
    except UserError as exc:
        raise ValueError(str(exc).removeprefix(f" {path}: ")) from None
    with open(path, "rb") as raw:
        if raw.seek(0, 2) and (raw.seek(-1, 2), raw.read(1))[1] != b"\n":
            # A cut number still parses ("0.125" cut to "0.1"): a last line without its end is refused.
            raise ValueError("its last line is cut (no line end)")
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.reader(f)
        try:
            header = next(reader, None)
            if header != LEDGER_COLUMNS:
                raise ValueError("its header is not the ledger's columns")
            for row in reader:
                if len(row) != len(LEDGER_COLUMNS):
                    raise ValueError(f"line {reader.line_num}: {len(row)} cells, the header has {len(LEDGER_COLUMNS)}")
                try:
                    yield event_from_dict(dict(zip(LEDGER_COLUMNS, row)))
                except ValueError as exc:
                    raise ValueError(f"line {reader.line_num}: {exc}") from None
        except csv.Error as exc:
            raise ValueError(f"line {reader.line_num}: not CSV ({exc})") from None


def read_whole_rows(path: Path) -> list[Event]:
    """The events of a ledger file's whole rows, a last line cut by a kill left out (a node logs
    an event before it sends it: a row cut in writing was never released). ValueError on anything
    else :func:`read_ledger` refuses."""
    text = Path(path).read_text(encoding="utf-8")
    if not text.endswith("\n"):
        text = text[: text.rfind("\n") + 1]
    header, _, body = text.partition("\n")
    if next(csv.reader([header]), None) != LEDGER_COLUMNS:
        raise ValueError("its header is not the ledger's columns")
    return parse_rows(body)


def parse_rows(text: str, first_line: int = 2) -> list[Event]:
    """The events of whole ledger.csv rows without their header (a tail past a checkpoint's mark).

    Raises:
        ValueError: a bad row, naming its line number counted from ``first_line``.
    """
    events = []
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        for row in reader:
            line = first_line + reader.line_num - 1
            if len(row) != len(LEDGER_COLUMNS):
                raise ValueError(f"line {line}: {len(row)} cells, the header has {len(LEDGER_COLUMNS)}")
            try:
                events.append(event_from_dict(dict(zip(LEDGER_COLUMNS, row))))
            except ValueError as exc:
                raise ValueError(f"line {line}: {exc}") from None
    except csv.Error as exc:
        raise ValueError(f"line {first_line + reader.line_num - 1}: not CSV ({exc})") from None
    return events
