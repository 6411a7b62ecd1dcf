"""What the whole-process speed benchmarks share: timing a child process, with the project's
bytecode compiled first.

A Python that writes no bytecode (``PYTHONDONTWRITEBYTECODE``, set in some sandboxes and CI
images) compiles every testbed module again in every run, ~0.2 s that a user's Python, which
caches bytecode, never pays; the floors import only numpy, whose bytecode pip compiled.
"""

from __future__ import annotations

import compileall
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("testbed", "nodes", "channel", "firmware_bridge")


def compile_project() -> None:
    """Byte-compile the project's packages (a no-op where they are up to date)."""
    for package in PACKAGES:
        compileall.compile_dir(REPO / package, quiet=1)


@dataclass(frozen=True)
class Timing:
    """One child process: wall seconds, CPU seconds (user + system, its waited-for children
    included) and peak resident set size in MB."""

    wall_s: float
    cpu_s: float
    peak_rss_mb: float


def timed(cmd: list[str]) -> Timing:
    """Run ``cmd`` from the repository's root, its output discarded; SystemExit if it fails."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, cwd=REPO)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}")
    return Timing(wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024)
