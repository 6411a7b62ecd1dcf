"""A `testbed` command run in a fork of this process, for the emulated node hosts of a run and its
embedded broker.

A new interpreter pays for its imports before it does anything (numpy, pydantic, paho and the
testbed's own modules: ~0.25 s of CPU for `testbed nodes` on this project's 2-core machine), and a
run's hosts and broker start while the coordinator waits for them; a fork of the coordinator, which
has imported nearly all of it, starts at once. :class:`ForkedCommand` is the
``subprocess.Popen`` of such a child, as far as the coordinator uses one: ``pid``, ``stderr`` (a
text stream, or None when it goes to a file), ``poll``, ``wait``, ``terminate``, ``kill`` and
``returncode``.

A run's helper processes (its tight accountant, its figures) are forked the same way, with
``entry_point`` their serving function and ``pipes``: stdin and stdout then are pipes to the parent
(``stdin``, ``stdout``, binary, as ``subprocess.Popen``'s with PIPE), so the helper starts without
a second import of numpy and the testbed (~0.2 s of CPU each).

The child is a clean `testbed` command, named in ps and top (Linux): stdin and stdout on
/dev/null (or the pipes), stderr on its own pipe (or the file it is given), the coordinator's log handlers dropped
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
import io
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Mapping, Sequence

_POLL_S = 0.005  # how often wait() looks whether the child has exited, at most
_FIRST_POLL_S = 0.0005  # and first
#: The `testbed` command the child runs (what pyproject.toml's console script, testbed.cli.program,
#: runs and then leaves by): a command is started by name, so this utility imports nothing above it.
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
        entry_point: ``"module:function"`` the child calls with ``argv``; its int is the exit code.
        pipes: stdin and stdout of the child as pipes to this process (``stdin``, ``stdout``), not
            /dev/null.
    """

    def __init__(self, argv: Sequence[str], env: Mapping[str, str] | None = None, name: str | None = None,
                 stderr_fd: int | None = None, entry_point: str = COMMAND_ENTRY_POINT, pipes: bool = False):
        self.args = list(argv)
        self.returncode: int | None = None
        sys.stdout.flush()  # else the child's copy of what is buffered would be written twice
        sys.stderr.flush()
        read_end, write_end = os.pipe() if stderr_fd is None else (None, stderr_fd)
        # (child's end, parent's end) of stdin (read, write), then of stdout (write, read)
        ends = (os.pipe(), os.pipe()[::-1]) if pipes else None
        with warnings.catch_warnings():
            # Python 3.12+ warns when a process with threads forks: the child runs only the
            # command, on its own objects (the modules that keep threads forget them there).
            warnings.filterwarnings("ignore", category=DeprecationWarning, message=".*fork.*")
            pid = os.fork()
        if pid == 0:  # pragma: no cover  (the child; it never returns)
            if read_end is not None:
                os.close(read_end)
            if ends is not None:
                for _, parents in ends:
                    os.close(parents)
            _run_child(self.args, dict(env or {}), write_end, name or f"testbed {self.args[0]}", entry_point,
                       None if ends is None else (ends[0][0], ends[1][0]))
        self.pid = pid
        self.stderr = self.stdin = self.stdout = None
        if read_end is not None:
            os.close(write_end)
            self.stderr = os.fdopen(read_end, "r", errors="replace")
        if ends is not None:
            (child_in, parent_in), (child_out, parent_out) = ends
            os.close(child_in)
            os.close(child_out)
            self.stdin, self.stdout = os.fdopen(parent_in, "wb"), os.fdopen(parent_out, "rb")

    def poll(self) -> int | None:
        """The exit code once the child has exited (negative: the signal that ended it), else None."""
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """The exit code, waiting at most ``timeout`` seconds (subprocess.TimeoutExpired). Looked
        at after 0.5 ms, then twice as long each time up to every ``_POLL_S``: a host told to stop
        leaves within milliseconds, and a run's stop waits for each of them in turn."""
        deadline = None if timeout is None else time.monotonic() + timeout
        delay = _FIRST_POLL_S
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(["testbed", *self.args], timeout or 0)
            time.sleep(delay)
            delay = min(2 * delay, _POLL_S)
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


#: The niceness a run's helpers (its tight accountant's, its figures') do their work at while the
#: rounds run (their imports, the planned ε), so that the run's own processes come first on a busy
#: core: on the 2-core machine J1's node workers leave gaps between rounds that hold it, where at 10
#: it took a tenth of a worker's core (J1: 2.80 s against 2.88 s, 8 interleaved runs each). What the
#: run waits for at its end (the figures) is drawn at the run's own niceness.
BACKGROUND_NICENESS = 19


def at_niceness(niceness: int) -> None:
    """Raise the calling thread's niceness to ``niceness`` (Linux: a thread's own, and a fork's
    from the thread that forks; the process's elsewhere); never lowers it."""
    os.nice(max(0, niceness - os.nice(0)))


def helper_process(module: str, argv: Sequence[str], name: str) -> "ForkedCommand | subprocess.Popen":
    """A run's helper ``python -m module ARGV`` (its ``serve(argv)``), stdin and stdout binary pipes
    to this process and stderr a text one: forked when :func:`can_fork`, else a new interpreter."""
    if can_fork() and _no_busy_threads():
        return ForkedCommand(argv, name=name, entry_point=f"{module}:serve", pipes=True)
    proc = subprocess.Popen([sys.executable, "-m", module, *argv], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stderr = io.TextIOWrapper(proc.stderr, errors="replace")
    return proc


def _no_busy_threads() -> bool:
    """Whether this is the main thread and no other runs but the idle worker pool (testbed.util.parallel,
    between runs): a thread caught holding a lock at the fork (a broker's, a server's) would leave
    it held in the child. A run's own threads start after its helpers."""
    return threading.current_thread() is threading.main_thread() and all(
        t is threading.main_thread() or t.name.startswith("testbed-nodes") for t in threading.enumerate())


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


def _run_child(argv: list[str], env: dict[str, str], stderr_fd: int, name: str, entry_point: str,
               stdio: tuple[int, int] | None) -> None:  # pragma: no cover
    """The child: ``stdio`` (stdin's and stdout's descriptors: the pipes) or /dev/null as 0 and 1."""
    code = 1
    try:
        gc.freeze()
        devnull = os.open(os.devnull, os.O_RDWR)
        stdin_fd, stdout_fd = stdio or (devnull, devnull)
        os.dup2(stdin_fd, 0)
        os.dup2(stdout_fd, 1)
        os.dup2(stderr_fd, 2)
        for fd in {devnull, stderr_fd, stdin_fd, stdout_fd} - {0, 1, 2}:
            os.close(fd)
        # The parent's descriptors (its MQTT connection, the run's files): the child must not hold
        # them open, or the broker would not see the coordinator's connection end with it.
        os.closerange(3, _fd_limit())
        # The parent's streams may be anything (pytest's captures): the child's are its fds.
        sys.stdin = sys.__stdin__ = open(0, "r", encoding="utf-8", closefd=False)  # noqa: SIM115
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
        module, function = entry_point.split(":")
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
