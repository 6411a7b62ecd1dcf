"""How many threads the BLAS library under numpy may use in this process.

The testbed's kernels are many small matrix products vectorised across nodes (a (M, B, d) batch
times (M, d, C) models; a (N, d) evaluation times (d, C) with C = 2), where OpenBLAS's threads cost
more than they give: on the 2-core machine J1 (benchmarks/j1.py) took 9.4 s of CPU for 6.9 s of wall
time with OpenBLAS's default of one thread per core, and 5.4 s of CPU for 5.4 s of wall with one
thread; on a loaded machine the threaded run took up to 10 s, spinning. Emulated node hosts share a
machine's cores among themselves, so each runs its BLAS on one thread as well.
"""

from __future__ import annotations


def limit_blas_threads(threads: int) -> None:
    """Let numpy's BLAS use at most ``threads`` threads in this process from now on (threadpoolctl,
    which talks to OpenBLAS, MKL or BLIS, whichever numpy loaded)."""
    from threadpoolctl import threadpool_limits

    threadpool_limits(limits=threads, user_api="blas")
