"""Memory this machine has available: what a check before a large allocation compares its estimate
with (the run's whole estimate in testbed.assembly.resources; an algorithm's mini-batch indices; an
edge list file's graph), so a run too large for the machine is one line, not an allocation error.

Callers look it up as ``memory.available_bytes()`` at the time of the check, so a test can stand
in a small machine by replacing this one function.
"""

from __future__ import annotations

import ctypes
import os
import time
from pathlib import Path


#: How long a reading stands for the next checks: an emulated host builds each of its 1,000 nodes'
#: algorithm, each checking its mini-batches (testbed.algorithms.batches), and /proc/meminfo took
#: half a millisecond a read (5 s of CPU in a 10,000-node run's first round).
_FRESH_S = 0.5
_last: tuple[float, int | None] | None = None  # (time.monotonic() of the reading, the reading)


def available_bytes() -> int | None:
    """Memory available to a new allocation on this machine (MemAvailable of /proc/meminfo, else
    the free physical pages), in bytes, read at most every :data:`_FRESH_S`; None if neither can be
    read."""
    global _last
    now = time.monotonic()
    if _last is None or now - _last[0] >= _FRESH_S:
        _last = (now, _read())
    return _last[1]


def _read() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        return None


#: glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


def keep_freed_heap(largest_bytes: int) -> None:
    """Have glibc's malloc serve blocks of up to ``largest_bytes`` from its heap and keep up to twice
    that freed at its top, instead of mapping and unmapping each large block: a loop that allocates
    and frees the same few MB of temporaries every step (a node step's gathered batches, an
    evaluation's logits) then stops faulting in fresh zeroed pages (J1 with it in the whole run:
    215,000 page faults and 1.3 s of system time, 65,000 and 0.8 s). The process's peak memory then
    holds what it freed: not for one that takes large transient buffers from outside. Nothing where
    malloc is not glibc's."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt(_M_MMAP_THRESHOLD, largest_bytes)
    mallopt(_M_TRIM_THRESHOLD, 2 * largest_bytes)
