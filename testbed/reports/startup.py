"""What a run does before round 1, said as it happens, and how long it took.

A run's set-up (its data, the plan, the algorithm with the libraries it imports on first use, the
accountants, the nodes) can take tens of seconds under load (Sionna's import alone ~19 s); silent,
it looks like a hang, and counted into round 1 it makes every "seconds per round" wrong. So a
stage still running after :data:`SAY_AFTER_S` is named on stderr while it runs (a line per stage,
before round 1), the set-up's seconds and the heavy libraries it imported are said once it is done
(if it took that long), and the total is kept as ``setup_s`` (summary.json), apart from the rounds'
own clock (metrics.csv ``wall_s`` counts from the first round). A quick set-up says nothing, so a
refused experiment is still one line. Silent with --quiet.
"""

from __future__ import annotations

import importlib.util
import sys
import threading
import time
from contextlib import contextmanager
from typing import Iterator, TextIO

#: A stage is named once it has run this long (a quick one, or one refused at once, says nothing).
SAY_AFTER_S = 0.5
#: Libraries slow enough to import (seconds each) that a stage importing them is worth naming.
HEAVY = ("torch", "sionna", "tensorflow", "dp_accounting", "matplotlib", "scipy")


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def not_yet_imported(names: tuple[str, ...] = HEAVY) -> list[str]:
    """The libraries of ``names`` installed here and not imported yet: what a stage may still load."""
    return [n for n in names if n not in sys.modules and _installed(n)]


class Startup:
    """The set-up's stages, announced as they start and timed.

    Args:
        enabled: False for --quiet (stages are still timed).
        stream: where the lines go (default stderr).
        clock: seconds, monotonic (a test passes its own).

    Example::

        >>> import io
        >>> out = io.StringIO()
        >>> s = Startup(stream=out, say_after_s=0.0)
        >>> with s.stage("loading data (adult, 4 nodes)"):
        ...     time.sleep(0.1)
        >>> out.getvalue()
        'setup: loading data (adult, 4 nodes)…\\n'
        >>> s.seconds() >= 0.1
        True
    """

    def __init__(self, enabled: bool = True, stream: TextIO | None = None, clock=time.monotonic,
                 say_after_s: float | None = None):
        self.enabled = enabled
        self.say_after_s = SAY_AFTER_S if say_after_s is None else say_after_s
        self._said = False
        self._lock = threading.Lock()
        self.stream = stream or sys.stderr
        self.clock = clock
        self.start = clock()
        self.stages: dict[str, float] = {}  # stage → seconds, in order
        self.imported: list[str] = []  # heavy libraries the set-up imported
        self.end: float | None = None

    def say(self, text: str) -> None:
        if self.enabled:
            with self._lock:
                self._said = True
                self.stream.write(f"setup: {text}\n")
                self.stream.flush()

    @contextmanager
    def stage(self, name: str, may_import: tuple[str, ...] = (), announce: bool = True) -> Iterator[None]:
        """Announce ``name`` (with the libraries of ``may_import`` it may still have to import)
        once it has run :data:`SAY_AFTER_S`, run the block, time it. ``announce=False`` for a stage
        that forks (its timer would be a thread at the fork): it is said in :meth:`done`'s line only."""
        pending = not_yet_imported(may_import)
        before = {n for n in HEAVY if n in sys.modules}
        line = name + (f" (may import {', '.join(pending)} on first use: seconds each)" if pending else "") + "…"
        # Said from a timer while the stage runs (the stage itself may hold the interpreter in an
        # import: the timer thread gets its turn at the import's own I/O and bytecode switches).
        timer = threading.Timer(self.say_after_s, self.say, (line,)) if self.enabled and announce else None
        if timer is not None:
            timer.daemon = True
            timer.start()
        t0 = self.clock()
        try:
            yield
        finally:
            if timer is not None:
                timer.cancel()
                timer.join()  # a line being written is whole before the next
            self.stages[name] = self.clock() - t0
            self.imported += [n for n in HEAVY if n in sys.modules and n not in before]

    def done(self) -> float:
        """Close the set-up (the rounds' clock starts now): say how long it took; its seconds."""
        self.end = self.clock()
        if not self._said and self.seconds() < self.say_after_s:
            return self.seconds()  # quick: nothing to explain
        took = ", ".join(f"{name.split(' (')[0]} {s:.1f} s" for name, s in self.stages.items() if s >= 0.05)
        imported = f"; imported {', '.join(self.imported)}" if self.imported else ""
        self.say(f"done in {self.seconds():.1f} s ({took or 'nothing slow'}{imported}); round 1 starts")
        return self.seconds()

    def seconds(self) -> float:
        """The set-up's seconds: until :meth:`done`, or so far."""
        return (self.end if self.end is not None else self.clock()) - self.start


def time_text(s: dict) -> str:
    """The rounds' seconds, per round, and the set-up's before them (summary ``wall_s``, ``setup_s``),
    as the terminal summary and the HTML report say them.

    Example::

        >>> time_text({"wall_s": 3.0, "rounds": 30, "setup_s": 39.5})
        '3 s for 30 rounds (0.1 s per round), after 39.5 s of set-up'
    """
    rounds, wall = s.get("rounds") or 0, s.get("wall_s") or 0.0
    text = f"{wall:.3g} s for {rounds} rounds" + (f" ({wall / rounds:.3g} s per round)" if rounds else "")
    return text + (f", after {s['setup_s']:.3g} s of set-up" if s.get("setup_s") is not None else "")
