"""Per-node work split over this machine's two cores, in threads.

numpy's generators fill arrays without holding the GIL, and so do most of its array routines
(partition, matmul, elementwise ufuncs on large arrays): drawing every node's noise, batch keys or
data from each node's own stream, two halves of the nodes at once, takes about half the time on
two cores. Each node's values come from its own stream, so they do not depend on the split.

Example::

    >>> import numpy as np
    >>> out = np.zeros(6)
    >>> def work(lo, hi): out[lo:hi] = np.arange(lo, hi)
    >>> split_work(6, work, numbers=10**7)
    >>> out.tolist()
    [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

#: Rows of a model-sized array a worker takes at a time when it draws, mixes and adds per row: a few
#: rows of 10,000 float64 (80 KB each) in each of three arrays stay in a core's L2 (2 MB here), so a
#: row is drawn, scaled and added before it is evicted (one pass over memory instead of three).
ROWS_IN_CACHE = 8
#: Below this many numbers drawn or touched, one thread: handing work to another costs ~50 µs.
MIN_NUMBERS = 200_000
_pool: ThreadPoolExecutor | None = None


def _forget_pool() -> None:
    global _pool
    _pool = None  # a forked child (testbed.util.forked) has no pool thread: it starts its own


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_forget_pool)


def split_work(count: int, work: Callable[[int, int], None], numbers: int) -> None:
    """``work(lo, hi)`` over ``[0, count)``: the first half on a pool thread and the second here
    when the machine has two cores or more and ``numbers`` (what the whole work draws or touches)
    is worth it; else ``work(0, count)``. ``work`` must write only its own rows."""
    global _pool
    if count < 2 or numbers < MIN_NUMBERS or (os.cpu_count() or 1) < 2:
        work(0, count)
        return
    if _pool is None:
        _pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="testbed-nodes")
    middle = count // 2
    first = _pool.submit(work, 0, middle)
    try:
        work(middle, count)
    except BaseException:
        first.exception()  # wait: no thread may still be writing when the caller sees the error
        raise
    first.result()
