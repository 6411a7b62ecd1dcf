"""The coordinator's inbox: every message from a node, handed over by the MQTT client's network
thread under one lock (``_on_inbound``). A node's status moves who is online; a reply to the round
being collected (:class:`Collection`) is taken if it passes the checks (testbed.orchestration.
reply_checks), else it is that node's straggle reason; a reply of an earlier round is charged once
however late; a node's ready and its ledger report are kept. :class:`Inbox` is that part of
testbed.orchestration.coordinator.MqttNodes."""

from __future__ import annotations

import dataclasses
import functools
import logging
import time

from testbed.algorithms.contract import SETUP_ROUND, RoundContext, check_metrics, check_tensors
from testbed.ledger.events import Event
from testbed.ledger.node import RoundSet
from testbed.mqtt import wire
from testbed.mqtt import topics
from testbed.mqtt.client import Inbound
from testbed.orchestration.reply_checks import check_refusal
from testbed.rounds import protocol
from testbed.streams.node_secret import RUN_SEED

# The coordinator's one logger, whichever of its modules writes: what users and tests filter on.
log = logging.getLogger("testbed.orchestration.coordinator")

REAP_INTERVAL_S = 0.1  # how often a round's collection looks for emulated hosts that died
_FAILED = wire.WireError("failed", "its hand-over raised")  # a reply dropped, neither taken nor refused


class Inbox:
    """What the nodes send the coordinator (a part of
    :class:`testbed.orchestration.coordinator.MqttNodes`, whose bookkeeping holds the state named here)."""

    def _collect(self, ctx: RoundContext, spec, kind: str):
        """Replies until every expected node answered, refused or left, or the deadline. A reply that
        fails the checks is logged and does not end the node's round (without the broker's ACL
        anyone could forge it); with no good reply by the deadline it is the node's straggle reason.
        The network thread takes the replies (_on_inbound); this one waits for the last, and looks
        for emulated hosts that died every REAP_INTERVAL_S."""
        deadline = time.monotonic() + self.round_timeout_s
        with self._lock:
            metric_spec = self._metric_spec if kind == protocol.UPDATE else {}  # a setup upload reports none
            collection = self._collecting = Collection(ctx, spec, metric_spec, kind, outstanding=set(ctx.expected))
            self._offline(set(ctx.expected) - self.online)
            self._arrived_s = collection.arrived_s
            # Replies can come between the round's publish and this line: they answer it.
            self._drain_pending()
        try:
            while True:
                with self._lock:
                    remaining = deadline - time.monotonic()
                    if not collection.outstanding or remaining <= 0:
                        break
                    self._lock.wait(min(remaining, REAP_INTERVAL_S))
                self._reap_hosts()
        finally:
            with self._lock:
                self._collecting = None
        return collection.answers, collection.refusals, collection.reasons, collection.content_refused

    def _on_inbound(self, item: Inbound) -> None:
        """The network thread's hand-over of one message (see ``_lock``)."""
        with self._lock:
            if item.kind == topics.STATUS:
                node = topics.node_index(item.node)
                online = item.payload == topics.STATUS_ONLINE
                # Only a change wakes the waiters: a broker replays every node's retained status
                # to a new subscriber, and a wake-up per message hands the interpreter back and
                # forth between the threads (50 ms before a run of 100 nodes could start).
                if node is not None and online is not (node in self.online):
                    if online:
                        self.online.add(node)
                    else:
                        self._offline({node})
                    self._lock.notify_all()
            elif self._collecting is not None:
                self._handle(item, self._collecting)
                if not self._collecting.outstanding:
                    self._lock.notify_all()
            else:
                self._pending.append(item)
                if self._preparing:  # a ready is awaited: taken now, not at the next wake-up
                    self._drain_pending()
                    self._lock.notify_all()

    def _on_inbound_all(self, items: list[Inbound]) -> int:
        """The network thread's hand-over of a container's messages (testbed.mqtt.carried), in order:
        as many calls of :meth:`_on_inbound` under one taking of the lock; how many failed (an
        exception, logged: dropped as the client drops a message whose hand-over raised).

        Replies to the round being collected, each from another expected node that has not
        answered yet, are checked a check at a time (every reply's tensors, then every one's
        events, then metrics; 40 replies in a row of the same code cost less than each reply's
        whole path in turn). The decisions are those of one reply after another: no reply's checks
        depend on another's (a node's second reply, which does, sends the container one by one)."""
        with self._lock:
            collection = self._collecting
            if collection is None or not self._plain_replies(items, collection):
                for item in items:
                    self._on_inbound(item)
                return 0
            replies = [[int(item.node), item.message, None, None] for item in items]  # type: ignore[arg-type]
            failed = 0
            for check in (self._tensors_fit, self._events_fit, self._metrics_fit):
                for reply in replies:
                    if reply[2] is None:
                        try:
                            check(collection, reply)
                        except wire.WireError as exc:
                            reply[2] = exc
                        except Exception:  # noqa: BLE001  as the client's hand-over of one message
                            log.exception("failed to handle %s of node %d", reply[1].kind, reply[0])
                            reply[2], failed = _FAILED, failed + 1
            for node, msg, exc, events in replies:
                if exc is None:
                    self._accept(collection, node, msg, events)
                elif exc is not _FAILED:
                    self._refuse(collection, node, msg, exc)
            if not collection.outstanding:
                self._lock.notify_all()
            return failed

    def _tensors_fit(self, collection: Collection, reply: list) -> None:
        node, msg = reply[0], reply[1]
        problem = check_tensors(collection.spec, msg.tensors, self._sent.get(node), finite_known=True)
        if problem is not None:
            raise wire.WireError("bad_header", problem)

    def _events_fit(self, collection: Collection, reply: list) -> None:
        reply[3] = self._check_events(reply[0], collection.ctx, reply[1])

    def _metrics_fit(self, collection: Collection, reply: list) -> None:
        problem = check_metrics(collection.metric_spec, reply[1].meta.get("metrics", {}))
        if problem is not None:
            raise wire.WireError("bad_header", problem)

    def _plain_replies(self, items: list[Inbound], collection: Collection) -> bool:
        """Whether ``items`` are updates (setup updates) of the round ``collection`` collects, each
        from another node of the run it expects that has neither answered nor refused (lock held)."""
        wire_round = max(collection.ctx.round_index, 0)
        nodes = set()
        for item in items:
            msg, node = item.message, topics.node_index(item.node)
            if msg is None or node is None or node not in self._node_set or msg.kind != collection.kind \
                    or msg.round != wire_round or node not in collection.expected or node in collection.answers \
                    or node in collection.refusals or node in nodes:
                return False
            nodes.add(node)
        return True

    def _wait(self, timeout_s: float) -> None:
        """Up to ``timeout_s`` for a node's status to change; late messages handled meanwhile."""
        with self._lock:
            self._drain_pending()
            self._lock.wait(timeout_s)
            self._drain_pending()

    def _drain_pending(self) -> None:
        """The messages that came while no round was being collected (late replies, and the first
        replies to a round just sent), handled (lock held)."""
        pending, self._pending = self._pending, []
        for item in pending:
            self._handle(item, self._collecting)

    def _offline(self, nodes: set[int]) -> None:
        """``nodes`` left (their will, or their host died): a round being collected stops waiting
        for them (lock held)."""
        self.online -= nodes
        collection = self._collecting
        if collection is not None:
            for node in nodes & collection.outstanding:
                collection.reasons[node] = "offline"
                collection.outstanding.discard(node)

    def _handle(self, item: Inbound, collection: Collection | None) -> None:
        """A node's message (lock held; its session, kind and round admitted by ``_admit``): a reply
        taken if it answers ``collection``, the round being collected, and passes the checks; a
        late one charged; a ledger report kept; anything else dropped."""
        msg, node = item.message, topics.node_index(item.node)
        if msg is None or node is None or node not in self._node_set:
            return
        if msg.kind == protocol.LEDGER:
            self._take_report(node, msg)
            return
        if msg.kind == protocol.READY:
            self._take_ready(node, msg)
            return
        if collection is None:
            self._maybe_late(node, msg)
            return
        ctx, answers, refusals = collection.ctx, collection.answers, collection.refusals
        wire_round = max(ctx.round_index, 0)
        if msg.round != wire_round or msg.kind not in (collection.kind, protocol.REFUSED):
            self._maybe_late(node, msg)
            return
        if node not in collection.expected:
            log.warning("dropped %s of node %d for round %d: it was not asked", msg.kind, node, wire_round)
            return
        if node in answers or node in refusals:
            log.warning("dropped a second %s of node %d for round %d", msg.kind, node, wire_round)
            return
        try:
            if msg.kind == protocol.REFUSED:
                check_refusal(msg)
                refusals[node] = msg
                if self._channel is not None:  # it will not transmit: the channel need not wait for it
                    self._channel.withdraw(self.session, wire_round, node)
                collection.outstanding.discard(node)
                return
            reply = [node, msg, None, None]
            for check in (self._tensors_fit, self._events_fit, self._metrics_fit):
                check(collection, reply)
            self._accept(collection, node, msg, reply[3])
        except wire.WireError as exc:
            self._refuse(collection, node, msg, exc)

    def _accept(self, collection: Collection, node: int, msg: wire.Message, events: list[Event]) -> None:
        """``node``'s reply to the round being collected, checked: its answer (lock held)."""
        collection.answers[node] = ({k: msg.tensors[k] for k in collection.spec}, events, msg.meta.get("metrics", {}))
        collection.arrived_s[node] = time.monotonic()
        collection.outstanding.discard(node)
        self._note_costs(node, events)

    def _refuse(self, collection: Collection, node: int, msg: wire.Message, exc: wire.WireError) -> None:
        """``node``'s reply (not a refusal) failed a check for ``exc``: its straggle reason unless a
        good one comes, and what it released charged (lock held)."""
        collection.reasons[node] = "refused_update"
        if msg.kind != protocol.REFUSED:  # released all the same: charged unless a good one comes
            events = self._events_or_none(node, collection.ctx, msg)[0]
            collection.content_refused[node] = events if events is not None else \
                self._release_at_bound(node, collection.ctx)
        log.warning("rejected %s of node %d for round %d: %s", msg.kind, node, max(collection.ctx.round_index, 0), exc)

    def _maybe_late(self, node: int, msg: wire.Message) -> None:
        """A reply of an earlier round (or the setup) of this session, however late: charged once
        (released is spent), never used; its events as the node says when they are the plan, else
        the plan."""
        round_index = SETUP_ROUND if msg.kind == protocol.SETUP_UPDATE else msg.round
        ctx = self._rounds.get(round_index)
        if msg.kind not in (protocol.UPDATE, protocol.SETUP_UPDATE) or ctx is None or node not in ctx.expected:
            log.info("dropped %s of node %d for round %d: not this round", msg.kind, node, msg.round)
            return
        if (node, round_index) in self._on_ask:  # charged its plan: what it measured raises the
            self._on_ask.discard((node, round_index))  # estimate the session's end tops it up to
            self._events_or_none(node, ctx, msg)
            log.warning("late %s of node %d for round %d: not used, charged on ask already", msg.kind, node, msg.round)
            return
        if self._already_charged(node, round_index):
            log.info("dropped a late copy of node %d's %s for round %d: already charged", node, msg.kind, msg.round)
            return
        events, problems = self._events_or_none(node, ctx, msg)
        log.warning("late %s of node %d for round %d: not used, charged%s", msg.kind, node, msg.round,
                    " as planned, its seconds and joules at their bound (its events are not the plan)" if events is None
                    else f" with {'; '.join(problems)}: at the bound" if problems else "")
        self._late[(node, round_index)] = events if events is not None else self._release_at_bound(node, ctx)

    def _take_report(self, node: int, msg: wire.Message) -> None:
        """A node's own ledger of this session (as it left before the stop, or its answer to the
        stop), kept for :meth:`close`: merged with what it reported before (a ledger only grows;
        messages may cross)."""
        try:
            report = protocol.report_of(msg)
        except wire.WireError as exc:
            log.warning("rejected the ledger report of node %d: %s", node, exc)
            return
        known = self._reports.get(node)
        self._reports[node] = report if known is None else known.merged(report)
        if self._stopping:
            self._stop_answers.add(node)
        else:
            log.info("node %d left before the stop; its ledger report is kept", node)
        self._lock.notify_all()

    def _take_ready(self, node: int, msg: wire.Message) -> None:
        """A node's ready (lock held): noted while the prepare is awaited if it names this run's
        experiment; anything else logged and dropped (it moves nothing)."""
        try:
            key = protocol.ready_of(msg)
        except wire.WireError as exc:
            log.warning("rejected the ready of node %d: %s", node, exc)
            return
        if key != self._experiment_key:
            log.warning("rejected the ready of node %d: experiment %s…, not this run's", node, key[:12])
            return
        # A node that ever said run_seed (a restart in the other mode) keeps it: the weaker claim.
        said = protocol.randomness_of(msg)
        self._randomness[node] = RUN_SEED if RUN_SEED in (said, self._randomness.get(node)) else said
        if not self._preparing:
            log.info("dropped the ready of node %d: the first round has begun", node)
            return
        self._ready.add(node)

    def _mark_released(self, charged: dict[tuple[int, int], list[Event]]) -> None:
        """Note what is handed to the runner as charged: a second copy of it (a redelivery, a late
        duplicate, a node's report of the same round) is never charged again."""
        released = self._released
        for node, round_index in charged:
            rounds = released.get(node)
            if rounds is None:  # (not setdefault: its default would be built for every release)
                rounds = released[node] = RoundSet()
            rounds.add(round_index)

    def _already_charged(self, node: int, round_index: int) -> bool:
        return round_index in self._released.get(node, ()) or (node, round_index) in self._late


@dataclasses.dataclass
class Collection:
    """A round's replies as they come: ``outstanding`` the expected nodes that neither answered, nor
    refused, nor left yet (the round is complete when it is empty)."""

    ctx: RoundContext
    spec: dict
    metric_spec: dict
    kind: str
    outstanding: set[int]
    answers: dict[int, tuple[dict, list[Event], dict]] = dataclasses.field(default_factory=dict)
    refusals: dict[int, wire.Message] = dataclasses.field(default_factory=dict)
    reasons: dict[int, str] = dataclasses.field(default_factory=dict)
    # node → what an update that failed the checks is charged: its events when they are the plan,
    # else the plan at the bounds of its window (ReplyChecks._release_at_bound)
    content_refused: dict[int, list[Event] | None] = dataclasses.field(default_factory=dict)
    arrived_s: dict[int, float] = dataclasses.field(default_factory=dict)  # node → when its answer came (monotonic)

    @functools.cached_property
    def expected(self) -> frozenset[int]:
        """The nodes asked (``ctx.expected``), to look a reply's sender up in."""
        return frozenset(self.ctx.expected)
