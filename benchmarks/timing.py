"""What the whole-process speed benchmarks share: timing a child process, with the project's
bytecode compiled first, from this tree or from a git worktree of another revision (``--against``).

A Python that writes no bytecode (``PYTHONDONTWRITEBYTECODE``, set in some sandboxes and CI
images) compiles every testbed module again in every run, ~0.2 s that a user's Python, which
caches bytecode, never pays; the floors import only numpy, whose bytecode pip compiled.
"""

from __future__ import annotations

import compileall
import contextlib
import os
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("testbed", "nodes", "channel", "firmware_bridge")


def compile_project(root: Path = REPO) -> None:
    """Byte-compile the packages of the project at ``root`` (a no-op where they are up to date)."""
    for package in PACKAGES:
        if (root / package).is_dir():
            compileall.compile_dir(root / package, quiet=1)


@dataclass(frozen=True)
class Timing:
    """One child process: wall seconds, CPU seconds (user + system, its waited-for children
    included) and peak resident set size in MB."""

    wall_s: float
    cpu_s: float
    peak_rss_mb: float


def timed(cmd: list[str], tree: Path = REPO, env: dict[str, str] | None = None) -> Timing:
    """Run ``cmd`` from ``tree``'s root (this repository's, or a :func:`worktree`'s: its own
    packages imported, not this tree's), its output discarded; SystemExit if it fails."""
    env = dict(os.environ if env is None else env)
    if tree != REPO:
        env["PYTHONPATH"] = str(tree)
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, cwd=tree, env=env)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}")
    return Timing(wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024)


@contextlib.contextmanager
def worktree(rev: str, tmp: str) -> Iterator[tuple[str, Path]]:
    """(REV, a detached git worktree of it under ``tmp``, its bytecode compiled), removed on the
    way out: the other side of a benchmark's ``--against REV``."""
    path = Path(tmp) / "against"
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "--quiet", str(path), rev], check=True)
    try:
        compile_project(path)  # its first run must not pay for its bytecode
        yield rev, path
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(path)], check=False)
