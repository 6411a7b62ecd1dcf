"""How many threads the BLAS library under numpy may use in this process.

The testbed's kernels are many small matrix products vectorised across nodes (a (M, B, d) batch
times (M, d, C) models; a (N, d) evaluation times (d, C) with C = 2), where OpenBLAS's threads cost
more than they give: on the 2-core machine J1 (benchmarks/j1.py) took 9.4 s of CPU for 6.9 s of wall
time with OpenBLAS's default of one thread per core, and 5.4 s of CPU for 5.4 s of wall with one
thread; on a loaded machine the threaded run took up to 10 s, spinning. Emulated node hosts share a
machine's cores among themselves, so each runs its BLAS on one thread as well.

The `testbed` program also starts OpenBLAS with one thread (:func:`one_blas_thread_at_load`): an
OpenBLAS that loads with a thread per core starts them at once, and each spins for about a tenth of
a second (OpenBLAS's THREAD_TIMEOUT, 2^28 cycles) before it sleeps. A run's start paid that on the
core its helpers import on, and again in each helper that loads scipy's own OpenBLAS.
"""

from __future__ import annotations

import os

#: The variable OpenBLAS reads once, when it loads (with numpy or scipy).
OPENBLAS_THREADS_AT_LOAD = "OPENBLAS_NUM_THREADS"


def one_blas_thread_at_load() -> None:
    """Have OpenBLAS load with one thread in this process and the processes it starts, unless the
    environment already says how many; before numpy is imported. A run raises it where asked
    (``run.blas_threads``: :func:`limit_blas_threads` starts the threads then)."""
    os.environ.setdefault(OPENBLAS_THREADS_AT_LOAD, "1")


def limit_blas_threads(threads: int) -> None:
    """Let numpy's BLAS use at most ``threads`` threads in this process from now on (threadpoolctl,
    which talks to OpenBLAS, MKL or BLIS, whichever numpy loaded)."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=threads, user_api="blas")
