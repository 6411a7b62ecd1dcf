"""Files a user or an inventory names, held to one rule wherever they are read, joined or copied.

- :func:`regular_file` / :func:`read_bytes` / :func:`read_text`: a file read whole is a regular
  file (not /dev/zero, a FIFO, a folder) no larger than a bound its reader declares, checked by
  ``stat`` before a byte is read and again while reading (a file that grows meanwhile);
  :func:`bounded_chunks` streams one, whole lines at a time, under the same bound.
- :data:`NAME` / :func:`inside`: a name that becomes a path component is an identifier (never
  ``..``, a separator or a leading dot: testbed.checked.sections.Name in config), and a path named
  relative to a folder stays in that folder once symlinks are resolved; an absolute path only
  where the caller allows it.
- :func:`copy_file`: a copy never widens a file's mode: the source's permission bits masked by
  the caller's ceiling (0600 for anything secret-ish: passwords, keys, a node's data).

Each refusal is a :class:`testbed.errors.UserError` of one line naming what the user typed.

Example::

    >>> import tempfile, pathlib
    >>> base = pathlib.Path(tempfile.mkdtemp())
    >>> _ = (base / "edges.txt").write_text("0 1\\n")
    >>> read_text(base / "edges.txt", 100, "topology.path")
    '0 1\\n'
    >>> inside(base, "../etc/shadow", "data")
    Traceback (most recent call last):
    ...
    testbed.errors.UserError: data '../etc/shadow': outside ... (a relative path must stay inside it)
"""

from __future__ import annotations

import os
import re
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from testbed.errors import UserError

#: What a name that goes into a path (a run's name, a host's bundle) may be: letters, digits, '_',
#: '.', '-', starting with a letter or digit (so never "." or ".."), at most 64 characters; the
#: same as an MQTT id (testbed.mqtt.wire.ID_PATTERN), which such names often also become.
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
#: Mode bits a copy may carry at most: no execute, nobody but the owner writes.
PUBLIC_MODE = 0o644
#: Mode bits of anything secret-ish (a password, a key, a node's training data): the owner's only.
PRIVATE_MODE = 0o600
_CHUNK_BYTES = 1 << 20


def inside(base: Path, value: str | os.PathLike[str], what: str, *, allow_absolute: bool = False) -> Path:
    """The path ``value`` names relative to the folder ``base``, symlinks resolved, checked to be in
    ``base`` (symlinks resolved too). An absolute ``value`` is taken as it is only with
    ``allow_absolute`` (the user's explicit say-so); otherwise it too must lie in ``base``.

    Raises:
        UserError: it lies outside ``base`` (naming ``what``, the key or option the user typed).
    """
    text = os.fspath(value)
    if "\x00" in text:
        raise UserError(f"{what} {text!r}: a path cannot hold a NUL byte")
    root = Path(base).resolve()
    given = Path(text).expanduser()
    resolved = (root / given).resolve()  # an absolute `given` replaces root
    if given.is_absolute() and allow_absolute:
        return resolved
    if resolved != root and root not in resolved.parents:
        how = ("an absolute path needs its explicit allowance" if given.is_absolute()
               else "a relative path must stay inside it")
        raise UserError(f"{what} {text!r}: outside {root} ({how})")
    return resolved


def regular_file(path: Path, max_bytes: int, what: str) -> int:
    """The size of ``path`` in bytes if it is a regular file of at most ``max_bytes``; else
    UserError naming ``what`` (missing, a device such as /dev/zero, a FIFO, a folder, too large)."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise UserError(f"{what} {path}: no such file") from None
    except OSError as exc:
        raise UserError(f"{what} {path}: cannot be read ({exc.strerror or exc})") from None
    if not stat.S_ISREG(info.st_mode):
        kind = "a folder" if stat.S_ISDIR(info.st_mode) else "a device, pipe or socket"
        raise UserError(f"{what} {path}: not a regular file ({kind})")
    if info.st_size > max_bytes:
        raise UserError(f"{what} {path}: {info.st_size:,} bytes, more than the {max_bytes:,} it may hold")
    return info.st_size


def read_bytes(path: Path, max_bytes: int, what: str) -> bytes:
    """The bytes of ``path``, a regular file of at most ``max_bytes`` (:func:`regular_file`),
    reading at most that many even if it grows meanwhile. Checked on the file opened (without
    blocking: a FIFO swapped in after the check is refused, not waited on). UserError as
    :func:`regular_file`."""
    regular_file(path, max_bytes, what)
    chunks: list[bytes] = []
    held = 0
    try:
        with open_regular(path) as f:
            # As much as the file holds, and one byte more to see it grew: read(max_bytes) would
            # allocate max_bytes up front, a gigabyte for a summary of a few kilobytes.
            want = min(os.fstat(f.fileno()).st_size, max_bytes) + 1
            while block := f.read(want):
                held += len(block)
                if held > max_bytes:
                    raise UserError(f"{what} {path}: grew past the {max_bytes:,} bytes it may hold while being read")
                chunks.append(block)
                want = min(_CHUNK_BYTES, max_bytes - held + 1)
    except NotRegular:
        raise UserError(f"{what} {path}: not a regular file (a device, pipe or socket)") from None
    except OSError as exc:
        raise UserError(f"{what} {path}: cannot be read ({exc.strerror or exc})") from None
    return b"".join(chunks)


class NotRegular(OSError):
    """What :func:`open_regular` raises for a file that is not a regular file."""


def open_regular(path: Path) -> BinaryIO:
    """``path`` opened for reading in binary, if it is a regular file: opened without blocking
    (a FIFO would wait for a writer), then checked on the descriptor (no race with a swap).

    Raises:
        NotRegular: a device, FIFO, socket or folder.
        OSError: it cannot be opened.
    """
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise NotRegular(f"{path}: not a regular file")
    os.set_blocking(fd, True)
    return os.fdopen(fd, "rb")


def read_text(path: Path, max_bytes: int, what: str) -> str:
    """:func:`read_bytes` decoded as UTF-8; UserError for bytes that are not."""
    data = read_bytes(path, max_bytes, what)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{what} {path}: not UTF-8 text (byte {exc.start})") from None


def bounded_chunks(path: Path, max_bytes: int, what: str, chunk_bytes: int = _CHUNK_BYTES) -> Iterator[bytes]:
    """The bytes of ``path`` in pieces of whole lines (about ``chunk_bytes`` each; the last may
    lack its line end), from a regular file of at most ``max_bytes`` (checked before and while
    reading): a parser that counts as it goes never holds the file whole. UserError as
    :func:`regular_file`."""
    regular_file(path, max_bytes, what)
    seen, carry = 0, b""
    try:
        with open_regular(path) as f:
            while True:
                block = f.read(chunk_bytes)
                seen += len(block)
                if seen > max_bytes:
                    raise UserError(f"{what} {path}: grew past the {max_bytes:,} bytes it may hold while being read")
                if not block:
                    break
                block = carry + block
                cut = block.rfind(b"\n") + 1
                carry = block[cut:]
                if cut:
                    yield block[:cut]
    except NotRegular:
        raise UserError(f"{what} {path}: not a regular file (a device, pipe or socket)") from None
    except OSError as exc:
        raise UserError(f"{what} {path}: cannot be read ({exc.strerror or exc})") from None
    if carry:
        yield carry


def copy_file(source: Path, target: Path, *, ceiling: int = PUBLIC_MODE, max_bytes: int | None = None,
              what: str = "file") -> Path:
    """Copy the regular file ``source`` to ``target`` (created, never through an existing link),
    with the source's permission bits masked by ``ceiling``: a copy never widens a file's mode
    (PRIVATE_MODE for anything secret-ish).

    Raises:
        UserError: ``source`` is not a regular file (or is over ``max_bytes``), or cannot be copied.
    """
    limit = max_bytes if max_bytes is not None else 1 << 62
    regular_file(source, limit, what)
    mode = stat.S_IMODE(os.stat(source).st_mode) & ceiling & 0o777
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), mode)
        with open(source, "rb") as src, os.fdopen(fd, "wb") as dst:
            shutil.copyfileobj(src, dst, _CHUNK_BYTES)
        os.chmod(target, mode)  # exactly this: the source's bits under the ceiling, whatever the umask
    except OSError as exc:
        raise UserError(f"{what} {source}: cannot copy to {target} ({exc.strerror or exc})") from None
    return target
