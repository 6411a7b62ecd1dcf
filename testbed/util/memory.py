"""Memory this machine has available: what a check before a large allocation compares its estimate
with (the run's whole estimate in testbed.assembly.resources; an algorithm's mini-batch indices; an
edge list file's graph), so a run too large for the machine is one line, not an allocation error.

Callers look it up as ``memory.available_bytes()`` at the time of the check, so a test can stand
in a small machine by replacing this one function.
"""

from __future__ import annotations

import os
from pathlib import Path


def available_bytes() -> int | None:
    """Memory available to a new allocation on this machine (MemAvailable of /proc/meminfo, else
    the free physical pages), in bytes; None if neither can be read."""
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
