"""One writer per directory: an exclusive OS file lock on ``DIR/.lock`` for as long as a process
writes the directory (a run, a resume, `testbed report`, a sweep's folder).

The lock is ``flock`` on the lock file: the kernel drops it when the process that took it ends,
however it ends (a SIGKILL, a power cut's reboot), so a lock file a killed run left behind never
blocks the next writer. While held, the file holds the holder's pid, so a refused writer can say
whom it waits for; released, it is empty again (a refused writer leaves every file as it was).

A flock belongs to the open file description, which a forked child shares: a child forked while
the lock is held (an emulated host, the embedded broker, a sweep's worker) would keep it alive after
its parent died. The descriptor is closed in every forked child (``os.register_at_fork``), so only
the process that took the lock holds it; children started by exec never inherit it (close-on-exec).

Example::

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> with DirectoryLock(d):
    ...     holder_pid(d) == os.getpid()
    True
    >>> holder_pid(d) is None
    True
"""

from __future__ import annotations

import errno
import fcntl
import os
import re
import stat
from pathlib import Path

from testbed.errors import UserError

LOCK_NAME = ".lock"
_PID = re.compile(rb"\s*([1-9][0-9]{0,9})\s*")  # what a holder writes: its pid and a line end
_PID_LIMIT = 2**31  # beyond any pid (Linux's pid_max is at most 2**22)
_PID_READ_BYTES = 32  # a pid and a line end; a longer file is garbage, read no further

# Lock descriptors this process holds: closed in a forked child (see the module's docstring).
_held: set[int] = set()


def _close_in_child() -> None:
    for fd in _held:
        try:
            os.close(fd)
        except OSError:
            pass
    _held.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_in_child)


class DirectoryLock:
    """The exclusive lock on ``directory`` (which must exist), taken at once or refused.

    Args:
        directory: the directory to write.
        what: what the directory is, for the refusal ("run directory", "sweep folder").

    Raises:
        UserError: one line: another process holds the lock (naming its pid, when it wrote one), or
            the lock file cannot be opened or locked (not a regular file, a read-only directory, a
            file system without locks).
    """

    def __init__(self, directory: Path, what: str = "run directory"):
        self.directory = Path(directory)
        self.path = self.directory / LOCK_NAME
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, 0o644)
        except OSError as exc:
            raise UserError(f"cannot lock the {what} {self.directory}: {self.path.name}: "
                            f"{exc.strerror or exc}") from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise UserError(f"cannot lock the {what} {self.directory}: {self.path.name} is not a regular file")
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                if exc.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                    raise UserError(f"cannot lock the {what} {self.directory}: {exc.strerror or exc}") from None
                pid = _read_pid(fd)
                raise UserError(f"{self.directory} is being written by another process "
                                f"(pid {pid if pid is not None else 'unknown'}): one writer per {what}; "
                                "wait until it ends, or stop it") from None
            try:
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
            except OSError:  # a full disk: the lock holds all the same, a refused writer says "pid unknown"
                pass
        except BaseException:
            os.close(fd)
            raise
        self._fd: int | None = fd
        self._owner_pid = os.getpid()
        _held.add(fd)

    def release(self) -> None:
        """Empty the lock file and drop the lock (once; a no-op in a forked child, whose copy of
        the descriptor was closed at the fork)."""
        fd, self._fd = self._fd, None
        if fd is None or self._owner_pid != os.getpid():
            return
        _held.discard(fd)
        try:
            os.ftruncate(fd, 0)
        except OSError:  # the pid stays: the next holder overwrites it
            pass
        os.close(fd)  # drops the flock: this process held the only descriptor of it

    def __enter__(self) -> "DirectoryLock":
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def __del__(self) -> None:  # an abandoned lock (a failure between taking and handing it on)
        if getattr(self, "_fd", None) is not None:
            try:
                self.release()
            except Exception:  # noqa: BLE001  at interpreter exit os may be gone: the kernel drops it
                pass


def holder_pid(directory: Path) -> int | None:
    """The pid written in ``directory``'s lock file, or None: no lock file, empty (released), or
    not a pid (garbage). It does not say whether that process still holds the lock."""
    try:
        fd = os.open(Path(directory) / LOCK_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        return _read_pid(fd)
    finally:
        os.close(fd)


def holder_gone(directory: Path) -> bool:
    """Whether the lock file of ``directory`` names a holder that ended without releasing it (a
    killed writer: the kernel dropped its lock, its pid stays in the file). False while that
    process lives or still holds the lock (seen in /proc/locks), and when the file names no holder
    (released, or never taken). A pid of another machine's process (a run directory on a shared
    file system) is not one of this machine's: `testbed watch` runs where its run runs."""
    pid = holder_pid(directory)
    if pid is None:
        return False
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return not _flock_listed(Path(directory) / LOCK_NAME)
    except PermissionError:  # another user's process: it exists
        return False
    return False


def _flock_listed(path: Path) -> bool:
    """Whether the kernel lists a granted flock on ``path`` (Linux's /proc/locks; False where it
    cannot be read): a holder alive in another pid namespace, whose pid this one does not see."""
    try:
        st = os.stat(path)
        with open("/proc/locks", encoding="ascii", errors="replace") as f:
            listed = f.read(1 << 20)
    except OSError:
        return False
    inode = f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}"
    return any("FLOCK" in fields and inode in fields and "->" not in fields
               for fields in (line.split() for line in listed.splitlines()))


def _read_pid(fd: int) -> int | None:
    """The pid a lock file holds, or None for anything else (empty, garbage, too long, unreadable)."""
    try:
        data = os.pread(fd, _PID_READ_BYTES + 1, 0)
    except OSError:
        return None
    match = _PID.fullmatch(data) if len(data) <= _PID_READ_BYTES else None
    if match is None:
        return None
    pid = int(match.group(1))
    return pid if pid < _PID_LIMIT else None
