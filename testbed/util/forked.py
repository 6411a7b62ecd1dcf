"""A `testbed` command run in a fork of this process, for the emulated node hosts of a run and its
embedded broker.

A new interpreter pays for its imports before it does anything (numpy, pydantic, paho and the
testbed's own modules: ~0.25 s of CPU for `testbed nodes` on this project's 2-core machine), and a
run's hosts and broker start while the coordinator waits for them; a fork of the coordinator, which
has imported nearly all of it, starts at once. :class:`ForkedCommand` is the
``subprocess.Popen`` of such a child, as far as the coordinator uses one: ``pid``, ``stderr`` (a
text stream, or None when it goes to a file), ``poll``, ``wait``, ``terminate``, ``kill`` and
``returncode``.

The child is a clean `testbed` command, named in ps and top (Linux): stdin and stdout on
/dev/null, stderr on its own pipe (or the file it is given), the coordinator's log handlers dropped
and its signal handlers back to Python's defaults, what the command asks of the environment set,
and it leaves with ``os._exit`` (none of the coordinator's exit handlers, no flush of its buffers).
The descriptors it inherits (the coordinator's MQTT connection, the run's files) are closed in it,
and the objects that held them never finalised (``gc.freeze``): a descriptor number the child
reuses is never closed under it.
Modules that keep threads (``testbed.util.parallel``'s pool) forget them in the child
(``os.register_at_fork``), since only the forking thread exists there.

:func:`can_fork` says when a fork is safe: a POSIX system, and no torch loaded (its thread pools do
not survive a fork); otherwise the coordinator starts a new interpreter.
"""

from __future__ import annotations

import gc
import importlib
import logging
import os
import signal
import subprocess
import sys
import time
import traceback
import warnings
from collections.abc import Mapping, Sequence

_POLL_S = 0.005  # how often wait() looks whether the child has exited
#: The `testbed` command the child runs, named as pyproject.toml's console script names it: a command
#: is started by name, as `python -m testbed` starts it, so this utility imports nothing above it.
COMMAND_ENTRY_POINT = "testbed.cli:main"


def can_fork() -> bool:
    """Whether :class:`ForkedCommand` may run here (else: a new interpreter)."""
    return hasattr(os, "fork") and "torch" not in sys.modules


class ForkedCommand:
    """``testbed ARGV`` in a child forked from this process.

    Args:
        argv: the command's arguments (``["nodes", "--broker", ...]``), as after ``testbed``.
        env: environment variables the child sets before it runs the command.
        name: what ps and top show for the child (Linux, at most 15 characters; default
            ``testbed ARGV[0]``): its command line is this process's.
        stderr_fd: a file the child's stderr goes to instead of the ``stderr`` pipe (None then):
            for a child that may log more than anyone reads.
    """

    def __init__(self, argv: Sequence[str], env: Mapping[str, str] | None = None, name: str | None = None,
                 stderr_fd: int | None = None):
        self.args = list(argv)
        self.returncode: int | None = None
        sys.stdout.flush()  # else the child's copy of what is buffered would be written twice
        sys.stderr.flush()
        read_end, write_end = os.pipe() if stderr_fd is None else (None, stderr_fd)
        with warnings.catch_warnings():
            # Python 3.12+ warns when a process with threads forks: the child runs only the
            # command, on its own objects (the modules that keep threads forget them there).
            warnings.filterwarnings("ignore", category=DeprecationWarning, message=".*fork.*")
            pid = os.fork()
        if pid == 0:  # pragma: no cover  (the child; it never returns)
            if read_end is not None:
                os.close(read_end)
            _run_child(self.args, dict(env or {}), write_end, name or f"testbed {self.args[0]}")
        self.pid = pid
        self.stderr = None
        if read_end is not None:
            os.close(write_end)
            self.stderr = os.fdopen(read_end, "r", errors="replace")

    def poll(self) -> int | None:
        """The exit code once the child has exited (negative: the signal that ended it), else None."""
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """The exit code, waiting at most ``timeout`` seconds (subprocess.TimeoutExpired)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(["testbed", *self.args], timeout or 0)
            time.sleep(_POLL_S)
        return code

    def terminate(self) -> None:
        """SIGTERM to the child, unless it has exited."""
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL to the child, unless it has exited."""
        self._signal(signal.SIGKILL)

    def _signal(self, number: int) -> None:
        if self.poll() is None:
            try:
                os.kill(self.pid, number)
            except ProcessLookupError:
                pass


def _fd_limit() -> int:
    try:
        return min(os.sysconf("SC_OPEN_MAX"), 1 << 20)
    except (ValueError, OSError):
        return 1 << 16


def _name_process(name: str) -> None:  # pragma: no cover  (the child)
    """What ps and top show as this process's name: Linux only."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)  # 15: PR_SET_NAME
    except (OSError, AttributeError):
        pass


def _run_child(argv: list[str], env: dict[str, str], stderr_fd: int, name: str) -> None:  # pragma: no cover
    code = 1
    try:
        gc.freeze()
        devnull = os.open(os.devnull, os.O_RDWR)
        os.dup2(devnull, 0)
        os.dup2(devnull, 1)
        os.dup2(stderr_fd, 2)
        os.close(devnull)
        os.close(stderr_fd)
        # The parent's descriptors (its MQTT connection, the run's files): the child must not hold
        # them open, or the broker would not see the coordinator's connection end with it.
        os.closerange(3, _fd_limit())
        # The parent's streams may be anything (pytest's captures): the child's are its fds.
        sys.stdout = sys.__stdout__ = open(1, "w", closefd=False)  # noqa: SIM115
        sys.stderr = sys.__stderr__ = open(2, "w", buffering=1, closefd=False, errors="backslashreplace")  # noqa: SIM115
        _name_process(name)
        signal.set_wakeup_fd(-1)  # an asyncio loop's, among the descriptors closed above
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        root = logging.getLogger()
        for handler in list(root.handlers):
            root.removeHandler(handler)
        os.environ.update(env)
        module, function = COMMAND_ENTRY_POINT.split(":")
        code = getattr(importlib.import_module(module), function)(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:  # noqa: BLE001  said on stderr, the coordinator passes it on
        traceback.print_exc()
    finally:
        try:
            sys.stderr.flush()
        finally:
            os._exit(code)
