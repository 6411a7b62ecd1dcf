"""Append-only text files with a running sha256, and the mark a checkpoint keeps of them.

A run appends to ``ledger.csv`` and ``metrics.csv`` every round. The checkpoint written after a
round records a :class:`Mark` of each (rows, bytes, sha256 of every byte so far), so a resume can
tell whether the file still holds what it held then: the marked prefix must hash to the mark,
and whatever follows is what the run wrote after that checkpoint.

Hashing as we write costs one ``sha256.update`` of the bytes appended (about a millisecond per
megabyte), not a re-read of the file.

Example::

    >>> import tempfile, pathlib
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "log.csv"
    >>> log = AppendLog(path, header="a,b\\r\\n")
    >>> log.append("1,2\\r\\n", rows=1)
    >>> mark = log.mark()
    >>> log.append("3,4\\r\\n", rows=1)
    >>> (mark.rows, tail_after(path, mark))
    (1, b'3,4\\r\\n')
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Callable, Mapping

_CHUNK = 1 << 20
_HEX64 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class Mark:
    """What an append-only file held at one moment.

    Attributes:
        rows: data rows (lines after the header).
        size_bytes: bytes of the file, header included.
        sha256: hex digest of those ``size_bytes`` bytes.
    """

    rows: int
    size_bytes: int
    sha256: str

    def to_dict(self) -> dict[str, Any]:
        return {"rows": self.rows, "size_bytes": self.size_bytes, "sha256": self.sha256}

    @classmethod
    def from_dict(cls, raw: Any) -> "Mark":
        """The mark ``to_dict`` wrote; ValueError if it is not one."""
        if not isinstance(raw, Mapping):
            raise ValueError("a file mark must be a mapping")
        rows, size, digest = raw.get("rows"), raw.get("size_bytes"), raw.get("sha256")
        for name, value in (("rows", rows), ("size_bytes", size)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"file mark {name} must be a non-negative integer, got {value!r}")
        if not isinstance(digest, str) or not _HEX64.fullmatch(digest):
            raise ValueError("file mark sha256 is not a hex digest")
        return cls(rows, size, digest)


class AppendLog:
    """A text file opened for appending, with a running sha256, row count and size.

    Opening an existing file hashes what it holds (once); the file must end with a whole line.
    """

    def __init__(self, path: Path, header: str, sync: bool = True):
        self.path = Path(path)
        self.sync = sync
        self._hash = hashlib.sha256()
        self.rows = 0
        self.size_bytes = 0
        last = b"\n"
        if self.path.exists():
            with open(self.path, "rb") as f:
                while chunk := f.read(_CHUNK):
                    self._hash.update(chunk)
                    self.size_bytes += len(chunk)
                    self.rows += chunk.count(b"\n")
                    last = chunk[-1:]
        if last != b"\n":
            raise ValueError(f"{self.path.name} ends in a partial line; it cannot be appended to")
        self._file = open(self.path, "ab")
        if self.size_bytes == 0:
            self.append(header, rows=0)
        else:
            self.rows -= 1  # the header line

    def append(self, text: str, rows: int) -> None:
        """Append ``text`` (``rows`` whole lines) and hand it to the OS (flushed, not yet synced)."""
        data = text.encode()
        self._file.write(data)
        self._file.flush()
        self._hash.update(data)
        self.rows += rows
        self.size_bytes += len(data)

    def mark(self) -> Mark:
        """What the file holds now, flushed (and, with ``sync``, on disk: a checkpoint that marks it
        may then be relied on to find at least that much after a power cut, not only after a kill)."""
        self._file.flush()
        if self.sync:
            os.fsync(self._file.fileno())
        return Mark(self.rows, self.size_bytes, self._hash.hexdigest())

    def close(self) -> None:
        self._file.close()


def tail_after(path: Path, mark: Mark) -> bytes:
    """The bytes ``path`` holds past ``mark``, once its first ``mark.size_bytes`` bytes are checked.

    Raises:
        FileNotFoundError: no such file.
        ValueError: the file is shorter than the mark, its marked bytes hash differently, or they
            hold another number of rows than the mark says (one line saying which, without the
            file's name).
    """
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        left = mark.size_bytes
        lines = 0
        while left:
            chunk = f.read(min(left, _CHUNK))
            if not chunk:
                break
            digest.update(chunk)
            lines += chunk.count(b"\n")
            left -= len(chunk)
        if left:
            held = max(lines - 1, 0)
            raise ValueError(f"holds {mark.size_bytes - left} bytes ({held} whole rows) where the checkpoint "
                             f"recorded {mark.size_bytes} ({mark.rows} rows): rows were lost")
        if digest.hexdigest() != mark.sha256:
            raise ValueError(f"its first {mark.rows} rows differ from what the checkpoint recorded "
                             "(sha256 mismatch): it was altered or damaged")
        held = lines - 1 if mark.size_bytes else 0  # the header line aside
        if held != mark.rows:  # a mark forged with its checkpoint's digest: rows are what a resume counts
            raise ValueError(f"the checkpoint recorded {mark.rows} rows in its first {mark.size_bytes} bytes, "
                             f"which hold {held}")
        return f.read()


def sha256_file(path: Path) -> str:
    """Hex sha256 of a whole file."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def write_atomic(path: Path, data: bytes | Callable[[BinaryIO], None], sync: bool = True) -> None:
    """Replace ``path`` by ``data`` (bytes, or a function writing to a binary file) so a reader or a
    killed process sees the old file or the new, never half: a temporary file beside it, then
    os.replace. With ``sync`` the file and the directory (the rename's record) are fsynced too, so
    a power cut cannot leave half either."""
    path = Path(path)
    tmp = _write_beside(path, data, sync)
    os.replace(tmp, path)
    if sync:
        _sync_directory(path)


def write_swapping(path: Path, data: bytes | Callable[[BinaryIO], None], sync: bool = True) -> None:
    """:func:`write_atomic` for a file rewritten every round, whose reader takes :func:`swap_file`
    when ``path`` is missing: without ``sync``, the temporary file is complete, then the old file
    unlinked and the new renamed in. A rename over an existing file makes ext4 (auto_da_alloc)
    write the new file's data out at once, 0.4 to 2 ms a round here; renaming onto a free name does
    not. A kill between the unlink and the rename leaves the complete temporary file."""
    if sync:
        write_atomic(path, data, sync=True)
        return
    path = Path(path)
    complete = swap_file(path)
    if complete != path:  # the last kill's complete file, kept before it is overwritten
        os.rename(complete, path)
    tmp = _write_beside(path, data, sync=False)
    path.unlink(missing_ok=True)
    os.rename(tmp, path)


def swap_file(path: Path) -> Path:
    """The file a reader of :func:`write_swapping`'s ``path`` reads: ``path``, or when a kill came
    between the unlink and the rename, the complete temporary file beside it."""
    path = Path(path)
    tmp = _tmp_beside(path)
    return tmp if not path.exists() and tmp.exists() else path


def _tmp_beside(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp")


def _write_beside(path: Path, data: bytes | Callable[[BinaryIO], None], sync: bool) -> Path:
    tmp = _tmp_beside(path)
    with open(tmp, "wb") as f:
        if callable(data):
            data(f)
        else:
            f.write(data)
        f.flush()
        if sync:
            os.fsync(f.fileno())
    return tmp


def _sync_directory(path: Path) -> None:
    try:
        fd = os.open(path.parent, os.O_RDONLY)
    except OSError:  # a platform without directory fds: the rename is still atomic
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def open_past_cut(path: Path, header: str, sync: bool) -> AppendLog:
    """An :class:`AppendLog` on ``path``, cut after its last line end first if a kill cut its
    last line mid-write (its reader ignored that line), so that the file can be appended to again."""
    try:
        return AppendLog(path, header=header, sync=sync)
    except ValueError:
        data = path.read_bytes()
        with open(path, "r+b") as f:
            f.truncate(data.rfind(b"\n") + 1)
        return AppendLog(path, header=header, sync=sync)
