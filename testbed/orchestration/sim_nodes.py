"""Every node in this process (``run.mode = "sim"``), stepped at once on stacked arrays.

Each node is charged an equal share of the step's CPU time, through its device profile's model.
An over-the-air round runs the algorithm's channel half here, between the node step and
``node_finish``, exactly as the channel emulator does over MQTT.

Example::

    >>> from testbed.assembly.config import load_config_text
    >>> from testbed.assembly import assemble
    >>> from testbed.algorithms import registry
    >>> from testbed.orchestration.runner import load
    >>> cfg = load_config_text("[data]\\nnum_nodes = 3\\nsamples_per_node = 40\\ndim = 3\\n"
    ...                        "[dp_pasgd]\\nsteps = 4\\ntau = 2\\nbatch = 4\\nsigma = 1.0\\n")
    >>> data, model = load(cfg)
    >>> alg = assemble.build_algorithm(cfg, model, data)
    >>> nodes = SimNodes(alg, data, seed=0, profile="host")
    >>> outcome = nodes.round(alg.init_state(model.init(None)), 0, frozenset({1}))
    >>> outcome.result.node_ids, outcome.ctx.stragglers, outcome.straggled
    ((0, 2), (1,), {1: 'emulated'})
"""

from __future__ import annotations

import logging
import secrets
import threading
import time
from typing import TYPE_CHECKING, Callable, Sequence, TypeVar

import numpy as np

from nodes.costs import NodeCosts
from testbed.algorithms.contract import (
    SETUP_ROUND,
    Algorithm,
    NodeResult,
    OverTheAir,
    RoundContext,
    State,
    WithSetup,
)
from testbed.data.federated import FederatedData, Split
from testbed.data.lazy import LazyFederatedData, training_rows
from testbed.ledger.events import Event, EventBatch, NodeEvents
from testbed.ledger.fields import event_to_dict, event_within
from testbed.orchestration.measured_bounds import MeasuredBounds
from testbed.orchestration.nodes_api import Closing, RoundOutcome
from testbed.orchestration.sim_workers import MIN_FLOPS, SimWorkers
from testbed.privacy import canaries
from testbed.util import parallel
from testbed.util.forked import can_fork

if TYPE_CHECKING:
    from testbed.learning.models import Model
    from testbed.orchestration.model_evaluation import Block

log = logging.getLogger(__name__)
T = TypeVar("T")


class SimNodes:
    """The run's nodes, all in this process.

    Args:
        algorithm: the run's algorithm.
        data: every node's data, or the lazy federation whose sampled nodes' rows each round makes.
        seed: the run's seed.
        profile: the device profile whose model charges seconds and joules.
        mcu_nodes: nodes that are microcontroller boards (``[nodes] mcu``): charged as their bridge
            charges a virtual board (steps × FLOPs through the board profile ``mcu_profile``), so
            sim and a bridged run keep the same ledger.
        workers: processes the node steps run in (``run.workers``): 1, this one; k >= 2, k forked
            workers (testbed.orchestration.sim_workers); 0, one per thread of the run
            (testbed.util.parallel) for each round whose step is worth it, where the run can fork
            and no audit scores its releases here.
        evaluation: the run's model and the rows it is evaluated on: the workers, while they run,
            score them for the run's report (:meth:`score_rows`), ahead of their step.
    """

    def __init__(self, algorithm: Algorithm, data: FederatedData | LazyFederatedData, seed: int, profile: str,
                 mcu_nodes: Sequence[int] = (), mcu_profile: str | None = None, workers: int = 1,
                 evaluation: tuple[Model, FederatedData] | None = None):
        self.alg, self.data, self.seed = algorithm, data, seed
        self.workers = workers
        self.evaluation = evaluation
        self._workers: SimWorkers | None = None
        self.costs = NodeCosts(profile, "model")
        # What a node's seconds and joules can be in a round: a cost model's figure beyond them is
        # charged at the bound, as the coordinator charges a reply's (testbed.orchestration.measured_bounds).
        self._bounds = MeasuredBounds.of_profile(profile)
        self._board_bounds = MeasuredBounds()
        self.mcu_nodes = frozenset(int(n) for n in mcu_nodes)
        self._board_costs = None
        if self.mcu_nodes:
            from firmware_bridge.costs import BoardCosts

            self._board_costs = BoardCosts(mcu_profile or "rp2040", algorithm.flops_per_step)
            self._board_bounds = MeasuredBounds.of_board(mcu_profile or "rp2040", algorithm.flops_per_step)
        self.node_ids = list(data.node_ids)
        self.session = secrets.token_hex(8)  # this process's session of the run (the asked-log's records)
        self.earlier_sessions: tuple[str, ...] = ()  # sim: the book is the nodes' ledger
        self._most_share_s = 0.0  # the most CPU seconds one node's share of a round took so far
        self._lazy = isinstance(data, LazyFederatedData)
        self._position = {} if self._lazy else {node: i for i, node in enumerate(self.node_ids)}

    def setup(self, state: State, asking: Callable[[RoundContext], None] | None = None) -> RoundOutcome:
        alg = self.alg
        assert isinstance(alg, WithSetup)
        ctx = RoundContext(SETUP_ROUND, self.seed, len(self.node_ids), tuple(self.node_ids))
        if asking is not None:
            asking(ctx)
        began, start = time.monotonic(), time.process_time()
        result = alg.setup_step(self._train(tuple(self.node_ids)), self.node_ids, ctx)
        return self._outcome(result, ctx.closed(result.node_ids), began, start, {})

    def round(self, state: State, round_index: int, excluded: frozenset[int],
              sampled: tuple[int, ...] | None = None, meanwhile: Callable[[], None] | None = None,
              asking: Callable[[RoundContext], None] | None = None) -> RoundOutcome:
        alg = self.alg
        expected = tuple(n for n in (self.node_ids if sampled is None else sampled) if n not in excluded)
        ctx = RoundContext(round_index, self.seed, len(self.node_ids), expected, sampled=sampled)
        straggled = {n: "emulated" for n in sorted(excluded)}
        workers = self._workers_for(expected)
        if workers is not None:
            # The workers step (and make lazy nodes' rows) while the report of the round before runs
            # here. Nothing leaves them before this round is asked: its answers are read after
            # ``asking``, so the records come in the order of a step run after the ask, a run that
            # ends in the report released nothing, and its resume draws the same numbers again.
            began = time.monotonic()
            workers.start_step(alg.downlink(state, ctx, expected), expected, ctx)
            try:
                if meanwhile is not None:
                    meanwhile()  # its evaluation, scored in the workers, goes out ahead of the step
                workers.dispatch()
                if asking is not None:
                    asking(ctx)
            except BaseException:
                workers.abandon_step()
                raise
            start = time.process_time()
            result, elsewhere_s = workers.finish_step()
        else:
            train = None
            if meanwhile is not None and expected and self._lazy:
                # The report of the round before and the making of this round's lazy rows overlap (at a
                # million nodes each takes about as long); making rows changes nothing, so the report
                # still ends before this round asks or steps anything, as when it ran first.
                train = self._beside(meanwhile, lambda: self._train(expected))
            elif meanwhile is not None:  # nothing to make: the report first
                meanwhile()
            if not expected:
                return RoundOutcome(NodeResult((), {}), ctx.closed(()), straggled=straggled)
            if asking is not None:
                asking(ctx)
            train = train if train is not None else self._train(expected)
            began, start = time.monotonic(), time.process_time()
            result, elsewhere_s = alg.node_step(alg.downlink(state, ctx, expected), train, expected, ctx), 0.0
        closed = ctx.closed(expected)
        if isinstance(alg, OverTheAir):
            released = result
            result = self._exchange(result, closed)
            if not result.node_ids:
                straggled.update({n: "no_exchange" for n in expected})
            result = NodeResult(result.node_ids, result.tensors, released.metrics, released.events)
        return self._outcome(result, closed, began, start, straggled, elsewhere_s)

    def _workers_for(self, expected: tuple[int, ...]) -> SimWorkers | None:
        """The workers that step this round's nodes (started at the first such round), or None:
        this process steps them (``workers``: the constructor's)."""
        count = self.workers or parallel.threads()
        # An audit scores the canaries where the releases are made: in this process (a fork of
        # one with torch loaded would lose torch's thread pools).
        if count < 2 or not expected or canaries.auditing() or not can_fork():
            return None
        if not self.workers and len(expected) * self.alg.flops_per_step < MIN_FLOPS:
            return None
        if self._workers is None:
            self._workers = SimWorkers(self.alg, self.data, count, self.evaluation)
        return self._workers

    def score_rows(self, model: Model, params: np.ndarray, data: FederatedData,
                   blocks: Sequence[Block]) -> list[tuple[np.ndarray, np.ndarray]] | None:
        """The run's evaluation of ``model`` on ``data``'s ``blocks`` of rows, scored in the node
        workers (a :class:`~testbed.orchestration.model_evaluation.RowScorer`); None where they
        do not run or hold other rows: scored by the caller. Not charged to any node: the
        evaluation is the run's, not a node's."""
        if not self._holds(model, data):
            return None
        return self._workers.score(params, blocks)

    def _holds(self, model: Model, data: FederatedData) -> bool:
        """Whether workers run that hold ``model`` and ``data`` as the run's evaluation."""
        held = self.evaluation
        return self._workers is not None and held is not None and held[0] is model and held[1] is data

    @staticmethod
    def _beside(meanwhile: Callable[[], None], work: Callable[[], T]) -> T:
        """``work()``, with ``meanwhile()`` on a thread beside it; both have ended when this
        returns, and an exception of either is raised here (``meanwhile``'s first)."""
        failed: list[BaseException] = []

        def report() -> None:
            try:
                meanwhile()
            except BaseException as exc:  # noqa: BLE001  raised again in the caller's thread
                failed.append(exc)

        thread = threading.Thread(target=report, name="testbed-report")
        thread.start()
        try:
            result = work()
        finally:
            thread.join()
            if failed:
                raise failed[0]
        return result

    def _train(self, expected: tuple[int, ...]) -> Split:
        """The training rows of ``expected`` (node ids, in order): lazy nodes' are made now (from
        their own streams, or gathered from the memory-mapped file set) and dropped with the round
        (testbed.data.lazy)."""
        return training_rows(self.data, expected, self._position)

    def _exchange(self, sent: NodeResult, ctx: RoundContext) -> NodeResult:
        """The channel between the nodes: superpose the transmit signals, each node finishes."""
        alg = self.alg
        assert isinstance(alg, OverTheAir)
        channel = alg.channel
        if len(ctx.answered) < channel.min_senders:
            return NodeResult((), {})
        signals = sent.tensors["signal"]
        n = len(self.node_ids)
        every = len(sent.node_ids) == n
        if not every:  # silent senders: zero rows
            full = np.zeros((n,) + signals.shape[1:])
            full[list(sent.node_ids)] = signals
            signals = full
        heard = channel.superpose(signals, alg.channel_tensors(ctx), ctx, out=signals)
        rows = heard if every else heard[list(sent.node_ids)]
        return alg.node_finish(sent.carry, rows, sent.node_ids, ctx)

    def _outcome(self, result: NodeResult, ctx: RoundContext, began: float, start: float,
                 straggled: dict[int, str], elsewhere_s: float = 0.0) -> RoundOutcome:
        """The round's charges: each node's share of the step's CPU time (``start``: process time at
        its beginning; ``elsewhere_s``: what the step took in the workers) through its cost model,
        within the bounds of a round open since ``began``."""
        released = result.events
        share = (time.process_time() - start + elsewhere_s) / max(1, len(ctx.answered))
        self._most_share_s = max(self._most_share_s, share)
        open_s = time.monotonic() - began
        charged: dict[tuple[int, int], list[Event]] = {}
        batches: list[EventBatch] = []
        if isinstance(released, NodeEvents) and tuple(released.nodes.tolist()) == ctx.answered:
            # One charge per distinct event, not per node: every node's share of the step is the same.
            boards = np.isin(released.nodes, list(self.mcu_nodes)) if self.mcu_nodes else None
            for batch in released.batches:
                rest = batch if boards is None else batch.take(~boards)
                batches.append(rest.map(lambda e: self._within(self.costs.charge_modelled([e], share)[0], e,
                                                               self._bounds, open_s)))
            board_rows = [] if boards is None else np.flatnonzero(boards).tolist()
            released = {i: released[i] for i in board_rows}
        else:
            released = dict(enumerate(released))
        for i, events in released.items():
            node = ctx.answered[i]
            board = node in self.mcu_nodes
            costs = self._board_charge(events) if board else self.costs.charge_modelled(events, share)
            bounds = self._board_bounds if board else self._bounds
            charged[(node, ctx.round_index)] = [self._within(cost, plan, bounds, open_s)
                                                for cost, plan in zip(costs, events)]
        return RoundOutcome(result, ctx, charged, straggled, batches=tuple(batches))

    @staticmethod
    def _within(charged: Event, planned: Event, bounds: MeasuredBounds, open_s: float) -> Event:
        """``charged`` (``planned`` with its cost model's seconds and joules) with each of them that
        is beyond its bound at the bound, logged."""
        limits = bounds.limits(planned, open_s)
        if all(getattr(charged, name) <= bound for name, bound in limits.items()):
            return charged
        event, problems = event_within(event_to_dict(charged), planned, limits)
        if problems:
            log.warning("node %d, round %d: %s: charged at the bound", planned.node, planned.round,
                        "; ".join(problems))
        return event

    def _board_charge(self, events: list[Event]) -> list[Event]:
        """A microcontroller node's events as its bridge charges a virtual board's."""
        costs = self._board_costs
        steps = sum(getattr(e, "local_steps", 0) for e in events)
        costs.record(steps=steps, cycles=0, counter_hz=1, kind="emulated")
        return costs.charge(events, costs.last)

    def planned_release(self, node: int, ctx: RoundContext) -> list[Event]:
        """What a release whose own events never reached the ledger is charged: the plan, its
        seconds and joules the cost model's for the most CPU time a node's share of a round took
        in this session (a board's as its bridge charges it)."""
        planned = self.alg.setup_events(node) if ctx.round_index == SETUP_ROUND else self.alg.planned_events(node, ctx)
        if node in self.mcu_nodes:
            return self._board_charge(planned)
        return self.costs.charge_modelled(planned, self._most_share_s)

    def deliver(self, events: Sequence[Event]) -> None:
        """Nothing to carry: in sim the runner's ledgers are the nodes' own."""

    def close(self, status: str) -> Closing:
        """Nothing is in flight in one process: the nodes' ledgers are the runner's own."""
        workers = 0
        if self._workers is not None:
            workers = len(self._workers.groups)
            self._workers.close()
            self._workers = None
        self.costs.close()
        return Closing(sim_workers=workers)
