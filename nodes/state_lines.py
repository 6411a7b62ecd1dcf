"""What a board's node agent (`testbed node`, `testbed bridge`) tells the person watching it: one
line per change of state, so a waiting board can be told from a hung one.

The states, in the order a board goes through them::

    connecting -> connected -> waiting for a run -> joined run R -> round k done (k from 1) ... -> run ended
                       ^                                  |
                       +-------- reconnecting <-----------+  (the broker went away; any state)

Each line is written once per change (a broadcast reaches every node of a host: the same state
twice is one line), with the wall-clock time, to standard output; ``--quiet`` gives no
:class:`StateLines` at all. The process's log (``--verbose``) says more, on standard error.

Example::

    >>> lines = []
    >>> states = StateLines("node 3", write=lines.append, clock=lambda: "12:00:00")
    >>> states.connecting("mqtt://broker.lan:1883"); states.connecting("mqtt://broker.lan:1883")
    >>> states.round_done(4)  # the wire's round 4 is the fifth
    >>> lines
    ['12:00:00 node 3: connecting to mqtt://broker.lan:1883', '12:00:00 node 3: round 5 done']
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Callable


def _print_line(line: str) -> None:
    print(line, file=sys.stdout, flush=True)  # flushed: a journal or a pipe sees it as it happens


class StateLines:
    """Writes the node agent's state changes, one line each.

    Args:
        who: what the lines speak for ("node 3").
        write: where a line goes (default: standard output, flushed).
        clock: the time stamp of a line (default: local wall-clock time, HH:MM:SS).

    Called from the host's thread and from the MQTT network thread (connection changes): a lock
    keeps the lines whole and the last state consistent.
    """

    def __init__(self, who: str, write: Callable[[str], None] = _print_line,
                 clock: Callable[[], str] = lambda: time.strftime("%H:%M:%S")) -> None:
        self.who = who
        self._write = write
        self._clock = clock
        self._lock = threading.Lock()
        self._last: str | None = None

    def _say(self, state: str) -> None:
        with self._lock:
            if state == self._last:
                return
            self._last = state
            self._write(f"{self._clock()} {self.who}: {state}")

    def connecting(self, broker_url: str) -> None:
        self._say(f"connecting to {broker_url}")

    def connected(self, broker_url: str, took_s: float) -> None:
        self._say(f"connected to {broker_url} in {took_s:.1f} s")

    def waiting(self, run: str) -> None:
        self._say(f"waiting for a run (run id {run})")

    def joined(self, run: str, session: str) -> None:
        self._say(f"joined run {run} (coordinator session {session})")

    def round_done(self, round_index: int) -> None:
        """Round ``round_index`` (0-based, as on the wire) answered: said counting from 1, as the
        coordinator's progress, metrics.csv and summary.json count rounds."""
        self._say(f"round {round_index + 1} done")

    def ended(self, run: str, rounds: int, why: str = "the coordinator ended it") -> None:
        self._say(f"run {run} ended ({why}); {rounds} round(s) answered")

    def connection(self, up: bool, broker_url: str) -> None:
        """A connection change the MQTT client saw (after the first connect)."""
        self._say(f"reconnected to {broker_url}" if up else f"connection to {broker_url} lost; reconnecting")
