"""Whole lines appended to one of a run's logs (metrics.csv, ledger.csv), read in bounded pieces.

A run appends to its logs and flushes them every round; `testbed watch` reads them from where it
last stopped. Nothing in them is trusted: :class:`LineTail` never holds more than one piece
(:data:`PIECE_BYTES`) plus one line (at most :data:`MAX_LINE_BYTES`; a longer one is skipped and
said), checks the header, and tells a file that shrank, was replaced or rewritten (a new run in the
same folder, ``--resume`` dropping rows past its checkpoint) from one that grew, and one that was
deleted from one that was never there.

Example::

    >>> import tempfile, pathlib
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "log.csv"
    >>> _ = path.write_bytes(b"a,b\\n1,2\\n3,")
    >>> piece = LineTail(path, "a,b").read()
    >>> (piece.lines, piece.problems, piece.more)
    ([(2, '1,2')], [], False)
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from testbed.util.userfiles import NotRegular, open_regular

#: The longest line a run writes is a few hundred bytes; a line past this is not the run's.
MAX_LINE_BYTES = 64 * 1024
#: Bytes read per call: a huge file is read over several calls, never whole.
PIECE_BYTES = 1024 * 1024
#: What a file deleted after it was read is (its rows stay shown).
DELETED = "deleted while watched; what it held is still shown"
#: Bytes before the read offset compared on every call: a file rewritten or with lines inserted is
#: a new file. More than a round of rows, so that rows repeated with another round's numbers differ.
_MARK_BYTES = 4096


@dataclass
class Piece:
    """What one :meth:`LineTail.read` found.

    Attributes:
        lines: (line number, text) of each whole, well-formed line, the header excluded.
        problems: one line each: a line skipped (too long, not UTF-8, a wrong header), or the
            file deleted or unreadable.
        restarted: the file is not the one read so far (it shrank, or was replaced or rewritten):
            what was read from it no longer holds, and the next call reads it from its start.
        more: bytes are left to read now (call again).
    """

    lines: list[tuple[int, str]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    restarted: bool = False
    more: bool = False


class LineTail:
    """The whole lines appended to ``path`` since the last call, in pieces of bounded size.

    Args:
        path: the file (it may not exist yet).
        header: its first line as the run writes it (without the line end).
    """

    def __init__(self, path: Path, header: str, max_line_bytes: int = MAX_LINE_BYTES,
                 piece_bytes: int = PIECE_BYTES):
        self.path = Path(path)
        self.header = header
        self.max_line_bytes = max_line_bytes
        self.piece_bytes = piece_bytes
        self._start()
        self._gone_said = False

    def _start(self) -> None:
        self._offset = 0
        self._identity: tuple[int, int] | None = None  # (st_dev, st_ino) of the file being read
        self._mark = b""       # the bytes just before _offset, as read
        self._rest = b""       # a line not yet ended
        self._skipping = False  # inside a line too long to keep: drop up to its end
        self._line = 0         # number of the last line ended
        self._bad_header = False

    @property
    def pending_bytes(self) -> int:
        """Bytes of a last line not ended yet (cut short, if the run is over)."""
        return len(self._rest)

    @property
    def started(self) -> bool:
        """Whether anything of the current file has been read."""
        return self._identity is not None

    def read(self) -> Piece:
        """The lines ended since the last call (at most :attr:`piece_bytes` of the file)."""
        piece = Piece()
        try:
            with open_regular(self.path) as f:  # a FIFO put in its place would block the page's reader
                st = os.fstat(f.fileno())
                if not self._same_file(f, st):
                    piece.restarted = self.started
                    self._start()
                    if piece.restarted:
                        return piece
                self._gone_said = False
                self._identity = (st.st_dev, st.st_ino)
                f.seek(self._offset)
                data = f.read(min(self.piece_bytes, max(st.st_size - self._offset, 0)))
                piece.more = self._offset + len(data) < st.st_size
        except FileNotFoundError:
            if self.started and not self._gone_said:  # was there: what it held is shown, said so
                self._gone_said = True
                piece.problems.append(DELETED)
            return piece
        except NotRegular:  # a FIFO, a device: the same file may come back
            piece.problems.append("unreadable (not a regular file)")
            return piece
        except OSError as exc:  # a directory now, no permission: the same file may come back
            piece.problems.append(f"unreadable ({exc.strerror or type(exc).__name__})")
            return piece
        self._offset += len(data)
        self._mark = (self._mark + data)[-_MARK_BYTES:]
        self._split(data, piece)
        return piece

    def _same_file(self, f, st: os.stat_result) -> bool:
        """Whether ``f`` is the file read so far, grown or not (not shrunk, replaced or rewritten)."""
        if self._identity is None:
            return True
        if (st.st_dev, st.st_ino) != self._identity or st.st_size < self._offset:
            return False
        f.seek(self._offset - len(self._mark))
        return f.read(len(self._mark)) == self._mark

    def _split(self, data: bytes, piece: Piece) -> None:
        start = 0
        while True:
            end = data.find(b"\n", start)
            if end < 0:
                break
            self._line += 1
            if self._skipping:
                self._skipping = False
            else:
                self._take(self._rest + data[start:end], piece)
            self._rest = b""
            start = end + 1
        tail = data[start:]
        if self._skipping:
            return
        if len(self._rest) + len(tail) > self.max_line_bytes:
            self._skipping, self._rest = True, b""
            self._refuse(self._line + 1, f"longer than {self.max_line_bytes} bytes, skipped", piece)
        else:
            self._rest += tail

    def _take(self, raw: bytes, piece: Piece) -> None:
        if len(raw) > self.max_line_bytes:  # ended in this piece, but too long all the same
            self._refuse(self._line, f"longer than {self.max_line_bytes} bytes, skipped", piece)
            return
        try:
            text = raw.decode("utf-8").removesuffix("\r")
        except UnicodeDecodeError:
            self._refuse(self._line, "not UTF-8 text, skipped", piece)
            return
        if self._line == 1:
            if text != self.header:
                self._refuse(1, "not the header the run writes", piece)
            return
        if not self._bad_header:
            piece.lines.append((self._line, text))

    def _refuse(self, line: int, why: str, piece: Piece) -> None:
        if line == 1:  # without the run's header, no row of the file can be read as the run's
            self._bad_header = True
            why += "; nothing in the file is used"
        piece.problems.append(f"line {line}: {why}")
