"""Per-node work split over this machine's cores, in threads.

numpy's generators fill arrays without holding the GIL, and so do most of its array routines
(partition, matmul, elementwise ufuncs on large arrays): drawing every node's noise, batch keys or
data from each node's own stream, or taking every node's local steps, in parts of the nodes at once,
takes about 1/parts of the time on that many cores. Each node's values come from its own stream and
its own rows, and nothing is summed across nodes inside a part, so they do not depend on the split
(tests/test_parallel.py: any cut points, any node count, the same bits).

How many parts: ``run.threads`` of the experiment file (:func:`set_threads`; 0, the default, one per
core), else the ``TESTBED_THREADS`` environment variable for a process no run configures.

Example::

    >>> import numpy as np
    >>> out = np.zeros(6)
    >>> def work(lo, hi): out[lo:hi] = np.arange(lo, hi)
    >>> split_work(6, work, numbers=10**7)
    >>> out.tolist()
    [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
"""

from __future__ import annotations

import logging
import os
import threading
from concurrent.futures import ThreadPoolExecutor, wait
from contextlib import contextmanager
from typing import Callable, Iterator

#: Rows of a model-sized array a worker takes at a time when it draws, mixes and adds per row: a few
#: rows of 10,000 float64 (80 KB each) in each of three arrays stay in a core's L2 (2 MB here), so a
#: row is drawn, scaled and added before it is evicted (one pass over memory instead of three).
ROWS_IN_CACHE = 8
#: Below this many numbers drawn or touched, one thread: handing work to another costs ~50 µs.
MIN_NUMBERS = 200_000
#: Parts a split makes per thread (each worth MIN_NUMBERS / 2 at least).
PARTS_PER_THREAD = 2
log = logging.getLogger(__name__)
_pool: ThreadPoolExecutor | None = None
_pool_size = 0
_threads = 0  # run.threads: 0, one per core
_cores = 0  # the cores "one per core" counts in this process: 0, the machine's (see cores())
_inside = threading.local()  # .part: this thread runs a part of a split


def _forget_pool() -> None:
    global _pool
    _pool = None  # a forked child (testbed.util.forked) has no pool thread: it starts its own


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_forget_pool)


def set_threads(threads: int) -> None:
    """Split per-node work into ``threads`` parts from now on in this process (1: never split;
    0: one part per core)."""
    global _threads
    if threads < 0:
        raise ValueError(f"threads must be 0 (one per core) or more, not {threads}")
    _threads = threads


@contextmanager
def cores(count: int) -> Iterator[None]:
    """Within the block, count ``count`` cores where a run asks for one thread per core
    (``run.threads = 0``, and its node workers, one per thread); 0: the machine's. A sweep that
    runs k jobs at once gives each its share, so that k jobs do not each split over every core."""
    global _cores
    if count < 0:
        raise ValueError(f"cores must be 0 (the machine's) or more, not {count}")
    before, _cores = _cores, count
    try:
        yield
    finally:
        _cores = before


def threads() -> int:
    """How many parts :func:`split_work` makes of work worth splitting."""
    return _threads or _ENV_THREADS or _cores or os.cpu_count() or 1


def _from_environment() -> int:
    text = os.environ.get("TESTBED_THREADS", "")
    if text.isdigit() and len(text) < 6:
        return int(text)
    if text:
        log.warning("TESTBED_THREADS=%r is not a count of threads: ignored", text[:40])
    return 0


_ENV_THREADS = _from_environment()  # read once: the process's environment is its start's


def cuts(count: int, parts: int) -> list[int]:
    """Where ``parts`` near-equal parts of ``range(count)`` begin, and ``count``: [0, ..., count]."""
    return [count * i // parts for i in range(parts + 1)]


def fixed_cuts(count: int, numbers: int, parts: int) -> list[int]:
    """Where :func:`split_work`'s ``fixed_parts=parts`` cuts ``range(count)`` (work of ``numbers``):
    ``parts`` even parts when worth splitting at all, else one, whatever the threads. What another
    process computing the same parts (testbed.orchestration.sim_workers) cuts by."""
    worth = count >= 2 and numbers >= MIN_NUMBERS
    return [count * i // parts for i in range(parts + 1)] if worth else [0, count]  # not cuts(): a thread split's


def _part(work: Callable[[int, int], None], lo: int, hi: int) -> None:
    """``work(lo, hi)`` as one part of a split: a :func:`split_work` inside it runs whole, in this
    thread (a part waiting on the pool's threads, which run the other parts, would wait forever)."""
    _inside.part = True
    try:
        work(lo, hi)
    finally:
        _inside.part = False


def split_work(count: int, work: Callable[[int, int], None], numbers: int, *,
               fixed_parts: int | None = None) -> None:
    """``work(lo, hi)`` over ``[0, count)`` in parts (:func:`cuts`) that this thread and up to
    :func:`threads` − 1 pool threads take in turn, when ``numbers`` (what the whole work draws or
    touches) is worth it (:data:`MIN_NUMBERS` for two parts, half as many more a part); else
    ``work(0, count)``. ``work`` must write only its own rows; this returns when every part has
    ended, and raises the error of the first part (in order) that failed. Within a part,
    split_work runs its work in that thread: an algorithm's split node step may call a split helper.

    Parts are taken, not dealt: :data:`PARTS_PER_THREAD` a thread, so a thread that gets less of a
    core (another process runs there) takes fewer and the others do not wait on it at the end.

    ``fixed_parts``: for work whose numbers depend on where it is cut (a BLAS product over rows
    rounds by the blocks it is given, and a block of one row takes another routine): always that
    many even parts when worth it, whatever the threads, which take them (one: in turn, here)."""
    inside = getattr(_inside, "part", False)
    worth = count >= 2 and numbers >= MIN_NUMBERS
    if fixed_parts is not None:
        bounds = fixed_cuts(count, numbers, fixed_parts)
    else:
        # Each part worth handing to a thread: half of MIN_NUMBERS at least (many cores, small work).
        most = min(count, PARTS_PER_THREAD * threads(), 2 * numbers // max(1, MIN_NUMBERS))
        parts = 1 if inside or not worth or threads() < 2 else most
        bounds = cuts(count, parts) if parts > 1 else [0, count]
    spans = list(zip(bounds[:-1], bounds[1:]))
    if len(spans) == 1 or inside or threads() < 2:
        for lo, hi in spans:
            work(lo, hi)
        return
    parts = _Parts(spans)
    helpers = min(len(spans), threads()) - 1
    others = [_workers(helpers).submit(parts.take_all, work) for _ in range(helpers)]
    try:
        parts.take_all(work)
    finally:  # no thread may still be writing when the caller sees the result or an error
        wait(others)
    for f in others:
        f.result()  # an error of the pool's own, not of a part
    parts.raise_first_error()


class _Parts:
    """The spans of one split, handed out one at a time to whichever thread asks next."""

    def __init__(self, spans: list[tuple[int, int]]):
        self._spans = spans
        self._next = 0
        self._lock = threading.Lock()
        self._errors: dict[int, BaseException] = {}

    def take_all(self, work: Callable[[int, int], None]) -> None:
        """Run ``work`` on spans not yet taken until none is left; a span's error is kept, not raised."""
        while True:
            with self._lock:
                index = self._next
                self._next += 1
            if index >= len(self._spans):
                return
            try:
                _part(work, *self._spans[index])
            except BaseException as exc:  # noqa: BLE001  raised in the caller's thread, in order
                self._errors[index] = exc

    def raise_first_error(self) -> None:
        if self._errors:
            raise self._errors[min(self._errors)]


def _workers(size: int) -> ThreadPoolExecutor:
    """The pool, with at least ``size`` threads (a new one when run.threads grew: the old one's
    threads end once idle)."""
    global _pool, _pool_size
    if _pool is None or _pool_size < size:
        if _pool is not None:
            _pool.shutdown(wait=False)
        _pool, _pool_size = ThreadPoolExecutor(max_workers=size, thread_name_prefix="testbed-nodes"), size
    return _pool

