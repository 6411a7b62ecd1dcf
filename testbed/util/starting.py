"""Waiting for something that is starting (a broker's child process, its thread): as long as it is
alive and making progress, up to a larger cap, rather than a fixed wall time.

A fixed start timeout fails on a loaded machine (at load ~25 the embedded broker took over 10 s to
accept connections) while a real hang would be waited for just as long on an idle one. Progress is
the CPU time the starter spends (Linux: /proc/PID[/task/TID]/stat): a child that imports, binds
and serves uses CPU; one that is stuck does not. Where that cannot be read, being alive counts as
progress and only the cap applies.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Callable

#: Seconds without any CPU progress after which a live starter is taken as stuck.
STALL_S = 10.0
#: Seconds after which the wait ends whatever the starter does.
CAP_S = 120.0


def cpu_ticks(pid: int, tid: int | None = None) -> int | None:
    """The user + system clock ticks of process ``pid`` (or its thread ``tid``) so far; None where
    /proc does not tell (not Linux, the process gone)."""
    path = f"/proc/{pid}/task/{tid}/stat" if tid is not None else f"/proc/{pid}/stat"
    try:
        with open(path, "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()  # after "pid (comm)": comm may hold spaces
        return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of proc(5))
    except (OSError, IndexError, ValueError):
        return None


@dataclass(frozen=True)
class Waited:
    """How a wait ended: ``"ready"``, ``"exited"`` (the starter is gone), ``"stalled"`` (alive, no
    progress for ``stall_s``) or ``"cap"``; after ``seconds``."""

    outcome: str
    seconds: float

    def why(self, stall_s: float = STALL_S, cap_s: float = CAP_S) -> str:
        """The outcome in words, for a refusal."""
        return {"ready": "ready", "exited": "it exited",
                "stalled": f"it made no progress (no CPU time) for {stall_s:g} s",
                "cap": f"not ready within {cap_s:g} s though still starting"}[self.outcome]


def wait_while_starting(ready: Callable[[], bool], alive: Callable[[], bool],
                        progress: Callable[[], int | None] = lambda: None, *, stall_s: float = STALL_S,
                        cap_s: float = CAP_S, poll_s: float = 0.02,
                        clock: Callable[[], float] = time.monotonic,
                        sleep: Callable[[float], None] = time.sleep) -> Waited:
    """Poll until ``ready()``; give up when not ``alive()``, when ``progress()`` (a counter that
    grows while the starter works, None if unknown) has not grown for ``stall_s``, or at ``cap_s``.

    Example::

        >>> t = [0.0]
        >>> ticks = iter(range(1000))  # a starter always at work, never ready
        >>> w = wait_while_starting(lambda: False, lambda: True, lambda: next(ticks), cap_s=30.0,
        ...                         clock=lambda: t[0], sleep=lambda s: t.__setitem__(0, t[0] + 1.0))
        >>> w.outcome, w.seconds
        ('cap', 31.0)
    """
    start = clock()
    last, last_change = progress(), start
    while True:
        if ready():
            return Waited("ready", clock() - start)
        now = clock()
        if not alive():
            return Waited("exited", now - start)
        seen = progress()
        if seen is None or seen != last:
            last, last_change = seen, now
        elif now - last_change > stall_s:
            return Waited("stalled", now - start)
        if now - start > cap_s:
            return Waited("cap", now - start)
        sleep(poll_s)


class StillWorking:
    """Whether starters past their deadline are still worth waiting for: they made progress
    within the last ``stall_s`` and ``cap_s`` has not passed since this was made.

    Example::

        >>> t, ticks = [0.0], [0]
        >>> working = StillWorking(lambda: ticks[0], stall_s=10.0, cap_s=60.0, clock=lambda: t[0])
        >>> t[0] = 9.0; working()
        True
        >>> t[0] = 20.0; working()  # no tick since 0 s
        False
        >>> ticks[0] = 5; working(), working.why()
        (True, '')
    """

    def __init__(self, progress: Callable[[], int | None], *, stall_s: float = STALL_S, cap_s: float = CAP_S,
                 clock: Callable[[], float] = time.monotonic):
        self._progress, self.stall_s, self.cap_s, self._clock = progress, stall_s, cap_s, clock
        self._start = self._last_change = clock()
        self._last = progress()
        self._why = ""

    def __call__(self) -> bool:
        now, seen = self._clock(), self._progress()
        if seen is None or seen != self._last:
            self._last, self._last_change = seen, now
        if now - self._start > self.cap_s:
            self._why = f"still starting after {self.cap_s:g} s"
        elif now - self._last_change > self.stall_s:
            self._why = f"no progress (no CPU time) for {self.stall_s:g} s"
        else:
            self._why = ""
        return not self._why

    def why(self) -> str:
        """Why the last call said False ("" if it said True)."""
        return self._why


def process_progress(*pids: int) -> Callable[[], int | None]:
    """``progress`` for child processes: their CPU ticks together (None if none can be read)."""
    def ticks() -> int | None:
        seen = [t for t in (cpu_ticks(pid) for pid in pids) if t is not None]
        return sum(seen) if seen else None
    return ticks


def thread_progress(native_id: int | None) -> Callable[[], int | None]:
    """``progress`` for a thread of this process (``threading.Thread.native_id``): its CPU ticks."""
    return lambda: None if native_id is None else cpu_ticks(os.getpid(), native_id)
