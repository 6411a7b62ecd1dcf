"""A sim run's node steps in forked worker processes, one per core.

Why processes: a node step is a Python loop of small numpy calls (J1: about twenty a local step on a
part of 50 nodes). In two threads of one interpreter each call hands the interpreter lock to the
other thread and waits to take it back: 20,000–29,000 context switches a J1 run, and every part
costs a fifth more CPU than in one thread (docs/performance.md, "What the second thread costs").
Processes share no lock.

Each worker is a fork of the run (testbed.util.forked: its descriptors closed, its own signal
handlers), made at the first round worth it, so it holds the run's algorithm and data as they were
then, shared copy-on-write. The run's nodes are cut into fixed groups of ids, as the emulated hosts
of an MQTT run are (``np.array_split`` of the ids, testbed.orchestration.emulated_hosts), and every
round each worker steps the round's expected nodes of its group with the algorithm's own
``node_step``, exactly as an emulated host steps the nodes whose round it received. So a node's
numbers are the ones an MQTT run with as many hosts gives, which are sim's (the conformance suite).

A round crosses each worker's pipe once each way: the group's expected ids, their rows of the
downlink (a broadcast model as one row) and the round's context (sim holds no node secret); back,
the group's :class:`NodeResult` and the CPU seconds the step took there, which the run charges to
the nodes as it charges its own (testbed.orchestration.sim_nodes). Lazy nodes' rows are made in the
worker too. The run hands a round out before it reports the round before and asks this one
(:meth:`SimWorkers.start_step`), and reads the answers after (:meth:`SimWorkers.finish_step`): the
step runs beside the report, and nothing leaves a worker before its round is asked.

The report's evaluation is scored in the workers too (:meth:`SimWorkers.score`): each scores its
half of the evaluated rows, held from the fork, into memory shared with the run, and then takes
the round's step, sent behind the scoring in its pipe. So the run's process does not read 40 MB of
rows (J1) on the cores the steps run on, and the numbers are the ones it would make itself
(testbed.orchestration.model_evaluation: the same blocks of rows).

Nothing a worker keeps lives longer than a round but the rows of its last nodes, so a resumed run
or a new worker gives the same numbers. A worker that dies or fails fails the round with one line.
"""

from __future__ import annotations

import logging
import mmap
import os
import pickle
import signal
import struct
import time
from typing import Any, Sequence

import numpy as np

from testbed.algorithms.contract import Algorithm, NodeResult, RoundContext
from testbed.data.federated import FederatedData, Split
from testbed.data.lazy import LazyFederatedData, training_rows
from testbed.learning.models import Model
from testbed.ledger.events import NodeEvents
from testbed.orchestration.model_evaluation import SPLITS, Block
from testbed.util import memory, parallel
from testbed.util.forked import ForkedCommand

log = logging.getLogger(__name__)

#: A round's node step is handed to the workers when its nodes' local steps are worth this many
#: floating-point operations a step (``len(expected) × flops_per_step``): J1's 100 nodes are 3.9
#: million. A round's trip through a worker's pipe costs ~0.2 ms; below this the step takes little
#: more, and a small run (the tests') keeps every node in its own process.
MIN_FLOPS = 1_000_000
_LENGTH = struct.Struct("<Q")

#: What the next forked worker serves: (algorithm, data, the run's model and evaluated rows). Set
#: just before the fork and read by :func:`serve` in the child, which inherits this module's memory.
_HANDED: tuple[Algorithm, FederatedData | LazyFederatedData, tuple[Model, _Scores] | None] | None = None


class WorkerFailed(RuntimeError):
    """A worker process exited or could not return its nodes' step."""


class SimWorkers:
    """``count`` forked workers, each stepping its fixed group of the run's nodes.

    Args:
        algorithm, data: the run's, as the workers inherit them.
        count: workers (>= 2).
        evaluation: the run's model and the rows it is evaluated on, which the workers score
            (:meth:`score`); None: they score nothing.
    """

    def __init__(self, algorithm: Algorithm, data: FederatedData | LazyFederatedData, count: int,
                 evaluation: tuple[Model, FederatedData] | None = None):
        global _HANDED
        held = data.node_ids  # a lazy federation's is a range of a million: made in C, not one by one
        ids = np.arange(held.start, held.stop, held.step) if isinstance(held, range) else np.asarray(held, np.int64)
        if len(ids) > 1 and not (np.diff(ids) > 0).all():
            raise ValueError("a sim run's node ids ascend (a whole federation's: 0..N-1)")
        #: (first id, last id) of each worker's group: the MQTT hosts' np.array_split of the ids.
        self.groups = [(int(g[0]), int(g[-1])) for g in np.array_split(ids, count) if len(g)]
        self._firsts = np.array([first for first, _ in self.groups], dtype=np.int64)
        self._procs: list[ForkedCommand] = []
        self._pending: list[int] = []  # the workers whose answer to the step out is unread
        self._unsent: list[tuple[int, tuple]] = []  # the step out, not yet sent: (worker, message)
        # What the workers score the evaluated rows into, shared with them (a fork keeps the mapping):
        # the rows' numbers do not cross the pipes (J1: 400 KB a round, more than a pipe holds).
        self._scores = None if evaluation is None else _Scores(evaluation[1])
        try:
            for group in self.groups:
                _HANDED = (algorithm, data, None if evaluation is None else (evaluation[0], self._scores))
                # The child's stderr is the run's own: a warning there is the user's to see.
                self._procs.append(ForkedCommand([], name=f"testbed sim {group[0]}-{group[-1]}", stderr_fd=2,
                                                 entry_point=f"{__name__}:serve", pipes=True))
        except BaseException:
            self.close()
            raise
        finally:
            _HANDED = None
        log.info("node steps in %d worker processes (nodes %s)", len(self.groups),
                 ", ".join(f"{first}-{last}" for first, last in self.groups))

    def parts(self, expected: Sequence[int]) -> list[tuple[int, list[int]]]:
        """(worker, the positions in ``expected`` of its nodes) for each worker with some."""
        which = np.searchsorted(self._firsts, np.asarray(expected, dtype=np.int64), side="right") - 1
        # The workers with some, by a count: np.unique would import numpy.ma (15 ms of a run's start).
        return [(int(w), np.flatnonzero(which == w).tolist()) for w in np.flatnonzero(np.bincount(which))]

    def start_step(self, received: dict[str, np.ndarray], expected: Sequence[int], ctx: RoundContext) -> None:
        """Hand each worker its part of the step, sent at the next :meth:`dispatch` or :meth:`score`
        (whose rows go first); nothing is awaited (one step at a time)."""
        if self._pending:
            raise RuntimeError("a step is already out to the workers")
        self._pending = [worker for worker, _ in self.parts(expected)]
        self._unsent = [(worker, ("step", tuple(int(expected[i]) for i in positions),
                                  {k: _rows(v, positions) for k, v in received.items()}, ctx))
                        for worker, positions in self.parts(expected)]

    def dispatch(self) -> None:
        """Send the step :meth:`start_step` handed out, if it is not on its way yet."""
        unsent, self._unsent = self._unsent, []
        for worker, message in unsent:
            self._send(worker, message)

    def score(self, params: np.ndarray, blocks: Sequence[Block]
              ) -> list[tuple[np.ndarray, np.ndarray]] | None:
        """(loss, correct) of the evaluated rows of each block (split name, first row, end row) under
        ``params``: block i in worker i mod count, ahead of the step handed out (then sent). The
        numbers are the evaluation's in the run's process (testbed.orchestration.model_evaluation);
        the CPU it takes is no node's. None while a step is on its way: its answers come first, so
        the caller scores the rows itself."""
        if self._scores is None or (self._pending and not self._unsent):
            return None
        workers = self._ask_score(params, blocks)
        self.dispatch()  # the step, behind the scoring in each pipe
        for answer in self._answers(workers).values():
            if answer[0] != "ok":
                raise answer[1]
        return [self._scores.taken(*block) for block in blocks]

    def _ask_score(self, params: np.ndarray, blocks: Sequence[Block]) -> list[int]:
        """Send each worker its blocks to score (block i to worker i mod count); the workers asked."""
        mine: dict[int, list[Block]] = {}
        for i, block in enumerate(blocks):
            mine.setdefault(i % len(self._procs), []).append(block)
        for worker, its in mine.items():
            self._send(worker, ("score", params, its))
        return list(mine)

    def _answers(self, workers: list[int]) -> dict[int, tuple]:
        """Each of ``workers``' next answer, every one read before any error is raised."""
        try:
            return {worker: self._receive(worker) for worker in workers}
        except WorkerFailed:
            self.close()
            raise

    def finish_step(self) -> tuple[NodeResult, float]:
        """The step :meth:`start_step` handed out: the parts' results as one, in the order of its
        nodes, and the CPU seconds it took in the workers. A part's error is raised here (the
        first part's first), once every worker has answered."""
        self.dispatch()
        pending, self._pending = self._pending, []
        results = []
        try:
            for worker in pending:  # every worker's answer read, so that none is left in its pipe
                results.append(self._receive(worker))
        except WorkerFailed:
            self.close()  # the others' answers to this step are left unread: no step may read them
            raise
        failures = [r for r in results if r[0] != "ok"]
        if failures:
            raise failures[0][1]
        return concatenate([r[1] for r in results]), sum(r[2] for r in results)

    def abandon_step(self) -> None:
        """Read and drop the answers of the step out (the run failed before it could take them); a
        step not sent yet is not sent."""
        if self._unsent:
            self._unsent, self._pending = [], []
            return
        try:
            self.finish_step()
        except Exception:  # noqa: BLE001  the run's own error is the one it raises
            pass

    def close(self) -> None:
        """End the workers: their pipes closed, each leaves at once (killed if it does not)."""
        for proc in self._procs:
            for pipe in (proc.stdin, proc.stdout, proc.stderr):
                if pipe is not None:
                    try:
                        pipe.close()
                    except OSError:  # a dead worker's pipe: what was buffered for it is dropped
                        pass
        for proc in self._procs:
            try:
                proc.wait(timeout=5)
            except Exception:  # noqa: BLE001  a worker stuck in a step: killed
                proc.kill()
                proc.wait()
        self._procs = []

    def _send(self, worker: int, message: tuple) -> None:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        try:
            pipe = self._procs[worker].stdin
            pipe.write(_LENGTH.pack(len(data)))
            pipe.write(data)
            pipe.flush()
        except (BrokenPipeError, ValueError, IndexError) as exc:  # ValueError, IndexError: closed already
            raise self._gone(worker) from exc

    def _receive(self, worker: int) -> tuple:
        try:
            pipe = self._procs[worker].stdout
            head = pipe.read(_LENGTH.size)
            size = _LENGTH.unpack(head)[0] if len(head) == _LENGTH.size else -1
            body = pipe.read(size) if size > 0 else b""
        except (ValueError, IndexError, OSError) as exc:  # ValueError, IndexError: closed already
            raise self._gone(worker) from exc
        if size <= 0 or len(body) != size:  # the worker's end closed, before or within its answer
            raise self._gone(worker)
        return pickle.loads(body)

    def _gone(self, worker: int) -> WorkerFailed:
        code = None
        if worker < len(self._procs):
            try:
                code = self._procs[worker].wait(timeout=1)
            except Exception:  # noqa: BLE001  still there, its pipe closed: said as it is
                pass
        first, last = self.groups[worker]
        status = "closed" if code is None else f"exited (status {code})"
        return WorkerFailed(f"the sim worker of nodes {first}-{last} {status}")


def _rows(value: np.ndarray, positions: list[int]) -> np.ndarray:
    """The rows of a downlink tensor at ``positions``; a tensor broadcast over the nodes (one model
    for all) as one row and the count, rebuilt as the same read-only broadcast in the worker."""
    if value.ndim and value.strides[0] == 0:
        return _Broadcast(np.ascontiguousarray(value[0]), len(positions))
    return value[positions]


class _Broadcast:
    """A row every node of a part receives, sent once."""

    def __init__(self, row: np.ndarray, count: int):
        self.row, self.count = row, count

    def array(self) -> np.ndarray:
        return np.broadcast_to(self.row, (self.count,) + self.row.shape)


def concatenate(parts: list[NodeResult]) -> NodeResult:
    """The node results of consecutive parts of one step as one: rows, metrics, carries stacked in
    order, events as batches when every part's batches pair up (else the per-node lists)."""
    if len(parts) == 1:
        return parts[0]
    ids = tuple(n for p in parts for n in p.node_ids)

    def stacked(field: str) -> dict[str, np.ndarray]:
        return {k: np.concatenate([getattr(p, field)[k] for p in parts]) for k in getattr(parts[0], field)}

    return NodeResult(ids, stacked("tensors"), stacked("metrics"), NodeEvents.concatenate([p.events for p in parts]),
                      stacked("carry"))


def serve(argv: list[str]) -> int:  # pragma: no cover  (the forked child; tests/test_sim_workers.py runs it)
    """The worker: step what the run asks until its pipe closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the run stops its workers; a terminal's ^C is the run's
    assert _HANDED is not None
    algorithm, data, evaluation = _HANDED
    parallel.set_threads(1)  # the other workers hold the other cores
    # A step's temporaries (gathered batches of ~1 MB) reused, not mapped and faulted in afresh each
    # time. Only here: a coordinator's large transient buffers (a 2 MiB signal) must go back at once.
    memory.keep_freed_heap(4 << 20)
    lazy = isinstance(data, LazyFederatedData)
    position = {} if lazy else {n: i for i, n in enumerate(data.node_ids)}
    made: tuple[tuple[int, ...], Split] | None = None  # the last nodes' rows, while they repeat

    def rows(ids: tuple[int, ...]) -> Split:
        nonlocal made
        if lazy:  # made for the step from the nodes' own streams, dropped with it
            return training_rows(data, ids, position)
        if made is None or made[0] != ids:
            made = (ids, training_rows(data, ids, position))
        return made[1]

    reader, writer = os.fdopen(0, "rb", closefd=False), os.fdopen(1, "wb", closefd=False)
    while True:
        head = reader.read(_LENGTH.size)
        if len(head) < _LENGTH.size:
            return 0  # the run closed the pipe
        (size,) = _LENGTH.unpack(head)
        kind, *message = pickle.loads(reader.read(size))
        start = time.process_time()
        try:
            if kind == "score":  # the run's evaluation: no node's step, no node's CPU
                assert evaluation is not None
                model, scores = evaluation
                scores.score(model, *message)
                answer: tuple[Any, ...] = ("ok", None, 0.0)
            else:
                ids, received, ctx = message
                received = {k: v.array() if isinstance(v, _Broadcast) else v for k, v in received.items()}
                answer = ("ok", algorithm.node_step(received, rows(ids), ids, ctx), time.process_time() - start)
            data_out = pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # noqa: BLE001  raised in the run, as if the step ran there
            data_out = _pickled_error(exc)
        try:
            writer.write(_LENGTH.pack(len(data_out)))
            writer.write(data_out)
            writer.flush()
        except BrokenPipeError:  # the run has stopped its workers
            return 0


class _Scores:
    """Each evaluated split's per-row (loss, correct), in memory the run and its forked workers
    share: a worker writes its blocks' rows, the run takes them when every worker has answered."""

    def __init__(self, data: FederatedData):
        self.data = data
        sizes = {name: len(getattr(data, name).y) for name in SPLITS}
        self._memory = mmap.mmap(-1, max(1, 9 * sum(sizes.values())))  # anonymous: shared across a fork
        self.loss, self.correct, at = {}, {}, 0
        for name, n in sizes.items():  # the losses first, each aligned to its 8 bytes
            self.loss[name] = np.frombuffer(self._memory, np.float64, n, at)
            at += 8 * n
        for name, n in sizes.items():
            self.correct[name] = np.frombuffer(self._memory, np.bool_, n, at)
            at += n

    def score(self, model: Model, params: np.ndarray, blocks: list[Block]) -> None:
        """Score ``blocks`` (in a worker): the numbers model_evaluation.per_sample makes of them."""
        for name, lo, hi in blocks:
            split = getattr(self.data, name)
            self.loss[name][lo:hi], self.correct[name][lo:hi] = model.loss_and_correct(params, split.x[lo:hi],
                                                                                       split.y[lo:hi])

    def taken(self, name: str, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
        """A block's (loss, correct), copied out before the next scoring overwrites them."""
        return self.loss[name][lo:hi].copy(), self.correct[name][lo:hi].copy()


def _pickled_error(exc: Exception) -> bytes:
    """``("error", exc)`` pickled; an error that does not pickle as a WorkerFailed saying it."""
    try:
        data = pickle.dumps(("error", exc), protocol=pickle.HIGHEST_PROTOCOL)
        pickle.loads(data)  # an error whose class cannot be built from its pickle would fail the run's read
        return data
    except Exception:  # noqa: BLE001
        return pickle.dumps(("error", WorkerFailed(f"{type(exc).__name__}: {exc}")))
