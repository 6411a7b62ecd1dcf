"""An emulated board's CPU seconds, as this machine's: qemu-user runs the board's aarch64 code
about ten times slower than the host runs its own, so a model fed the seconds measured inside the
board (``compute_s`` × the profile's factor) would charge the board the emulator's slowness (12.8×
the x86 node's joules for the same step). `testbed board run` times :func:`reference_seconds`
natively and passes it, with the emulator's name, into the board (:data:`EMULATOR_VAR`,
:data:`REFERENCE_VAR`); the node times the same work inside and divides every CPU time it feeds the
profile's model by the ratio (:func:`slowdown`), and says so in the charge's source.
"""

from __future__ import annotations

import os
import time
from functools import cache

import numpy as np

#: Set by `testbed board run` in the board: the emulator (e.g. "qemu-aarch64").
EMULATOR_VAR = "TESTBED_EMULATOR"
#: Set by `testbed board run`: the host's own CPU seconds of :func:`reference_seconds`.
REFERENCE_VAR = "TESTBED_EMULATION_REFERENCE_S"


def _reference_work() -> float:
    """A node's kind of step, fixed: logistic-regression gradient steps on 256 × 32 rows (small
    numpy products and Python between them, as the quick start's model)."""
    rng = np.random.default_rng(0)
    x, y, w = rng.standard_normal((256, 32)), rng.integers(0, 2, 256), np.zeros(32)
    for _ in range(300):
        p = 1.0 / (1.0 + np.exp(-(x @ w)))
        w -= 0.1 * (x.T @ (p - y)) / len(y)
    return float(w[0])


def reference_seconds(repeats: int = 3) -> float:
    """CPU seconds of the reference work, the least of ``repeats`` (this process, this machine)."""
    best = float("inf")
    for _ in range(repeats):
        start = time.process_time()
        _reference_work()
        best = min(best, time.process_time() - start)
    return max(best, 1e-6)


@cache
def slowdown() -> tuple[float, str] | None:
    """(how many times slower this process runs than the host it is emulated on, the emulator), or
    None when not emulated (no :data:`EMULATOR_VAR`) or the host's reference is missing or bad."""
    emulator, reference = os.environ.get(EMULATOR_VAR), os.environ.get(REFERENCE_VAR)
    if not emulator or not reference:
        return None
    try:
        host_s = float(reference)
    except ValueError:
        return None
    if not 0.0 < host_s < 60.0:
        return None
    return max(1.0, reference_seconds() / host_s), emulator
