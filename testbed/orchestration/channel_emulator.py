"""The radio between the nodes of an over-the-air run, over MQTT.

The channel emulator is an MQTT client of its own (id and username ``channel``), built from the
channel half the run's algorithm registers (testbed.algorithms.contract.ChannelHalf); it names no
algorithm. Each round the coordinator tells it which nodes will transmit, the signal's shape and
the round's channel (``transmit`` on ``chan``); it collects their transmit signals (``tx/{node}``)
until all arrived, a sender went offline or refused the round (the coordinator says so:
:meth:`ChannelEmulator.withdraw`), or the signal deadline passed; then it runs the same
``superpose`` a sim run runs and sends each sender only its own received signal (``rx/{node}``).
A node that stayed silent contributes nothing; the others learn who transmitted. The coordinator
asks :meth:`ChannelEmulator.close_round` who really transmitted, to charge each of them.

Nothing from a node is trusted: a signal must be what the round's notice declares (the
algorithm's spec, never the first signal's): its shape and dtype, finite values, and the power
bound when the notice carries one (:meth:`testbed.algorithms.dwfl.Dwfl.signal_norm_bound`: eq. (2)
under the power constraint). Signals that arrive before their notice are kept only from the run's
own nodes in the coordinator's session, of the last declared shape and dtype, at most one per node
and round and at most :data:`EARLY_ROUNDS` + 1 per node, for at most :data:`EARLY_ROUNDS` rounds
ahead of the current one: whatever arrives, they hold at most (EARLY_ROUNDS + 1) x nodes signals.
An early signal is checked against its own round's notice (the bound included: it depends on the
round's channel and the senders' models) when that comes, before it goes on the air.

Example (against a running broker)::

    >>> emulator = ChannelEmulator("mqtt://127.0.0.1:1883", run="testbed", session="5f0c...",
    ...                            nodes=[0, 1, 2, 3], signal_spec=TensorSpec((14,)))  # doctest: +SKIP
    >>> ...                                                                  # doctest: +SKIP
    >>> emulator.close()                                                     # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from testbed.algorithms.contract import ChannelHalf, RoundContext, TensorSpec
from testbed.assembly import assemble
from testbed.assembly.config import Config, load_config_text
from testbed.mqtt import wire
from testbed.mqtt import topics
from testbed.mqtt.client import Inbound, MqttClient
from testbed.rounds import protocol

log = logging.getLogger(__name__)

#: How many rounds ahead of the current one a signal may arrive before its notice.
EARLY_ROUNDS = 2


@dataclass
class _Round:
    """One round on the air: who should transmit, and what arrived so far."""

    session: str
    index: int
    half: ChannelHalf
    channel: dict[str, np.ndarray]
    config: Config
    spec: TensorSpec
    expected: set[int]
    deadline: float
    signals: dict[int, np.ndarray] = field(default_factory=dict)
    done: bool = False


class ChannelEmulator:
    """Serves the channel of run ``run`` from a thread until :meth:`close`.

    Args:
        url: broker URL.
        run: run id.
        session: the coordinator's session: signals of any other are not this run's.
        nodes: the run's nodes: nobody else transmits.
        signal_spec: the algorithm's transmit signal (what an early signal must be before the
            first notice declares it).
        client_options: passed to :meth:`MqttClient.for_channel` (credentials, TLS, protocol,
            chunk size).
        connect_timeout_s: how long to wait for the broker.
    """

    def __init__(self, url: str, run: str, *, session: str, nodes: Sequence[int], signal_spec: TensorSpec,
                 connect_timeout_s: float = 30.0, **client_options: Any):
        self.run = run
        self.session = session
        self.nodes = frozenset(int(n) for n in nodes)
        self._online: set[int] = set()
        self._round: _Round | None = None
        self._early: dict[tuple[str, int], dict[int, np.ndarray]] = {}  # signals ahead of their notice
        # (session, round) → nodes that refused it before its notice arrived (at most one entry per
        # node and run: a refusing node is asked nothing more)
        self._withdrawn: dict[tuple[str, int], set[int]] = {}
        # The shape and dtype of the last declared signal, what an early signal must have; from the
        # algorithm until the first notice, never from a signal (a short one sent first would else
        # fix the round's size). The power bound is each round's own (checked at its notice).
        self._early_spec = TensorSpec(tuple(signal_spec.shape), signal_spec.dtype)
        self._halves: dict[str, tuple[Config, ChannelHalf]] = {}
        self.client = MqttClient.for_channel(url, run, admit=self._admit, **client_options) \
            .connect(timeout_s=connect_timeout_s)
        self._heard: dict[tuple[str, int], tuple[int, ...]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name=f"channel-{run}", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop serving and disconnect."""
        self._stop.set()
        self._thread.join(timeout=10.0)
        self.client.close()

    def _admit(self, msg: wire.Message) -> str | None:
        """What the channel may take, checked on the network thread before the client moves any
        per-sender state (its replay window): this session's round notices, and signals of rounds
        it keeps (up to EARLY_ROUNDS past the current one; before the first notice, which may be of
        a resumed run's later round, any). Why not, or None."""
        session = protocol.session_of(msg)
        if session != self.session:
            return f"session {session!r:.24}, not this run's"
        if msg.kind == protocol.SIGNAL:
            current = self._round  # one read: the serving thread may replace it meanwhile
            if current is not None and msg.round > current.index + EARLY_ROUNDS:
                return f"a signal of round {msg.round}, past the rounds the channel keeps"
        elif msg.kind != protocol.TRANSMIT:
            return f"a {msg.kind!r:.24} is not what the channel takes"
        return None

    def close_round(self, session: str, round_index: int) -> tuple[int, ...]:
        """The nodes whose signal of the round reached the channel (ascending). A round still
        collecting is ended here: nothing more goes on the air for it."""
        with self._lock:
            current = self._round
            if current is not None and (current.session, current.index) == (session, round_index) and not current.done:
                current.done = True
                self._heard[(session, round_index)] = tuple(sorted(current.signals))
            return self._heard.pop((session, round_index), ())

    def withdraw(self, session: str, round_index: int, node: int) -> None:
        """``node`` refused the round (its budget, told to the coordinator): it will not transmit,
        and the round waits no longer for its signal."""
        with self._lock:
            current = self._round
            if current is not None and (current.session, current.index) == (session, round_index):
                current.expected.discard(node)
            else:  # the refusal came before the round's notice
                self._withdrawn.setdefault((session, round_index), set()).add(node)

    def _serve(self) -> None:
        while not self._stop.is_set():
            item = self.client.receive(timeout_s=0.2)
            try:
                with self._lock:
                    if item is not None:
                        self._handle(item)
                    current = self._round
                    if current is not None and not current.done and self._ready(current):
                        current.done = True
                        self._heard[(current.session, current.index)] = tuple(sorted(current.signals))
                        self._transmit(current)
            except wire.WireError as exc:
                log.warning("channel: rejected a message: %s", exc)
            except Exception:  # one bad round must not silence the channel for the rest of the run
                log.exception("channel emulator of run %s: round failed", self.run)
                if self._round is not None:
                    self._round.done = True

    def _handle(self, item: Inbound) -> None:
        if item.kind == topics.STATUS:
            node = topics.node_index(item.node)
            if node is not None:
                (self._online.add if item.payload == topics.STATUS_ONLINE else self._online.discard)(node)
            return
        msg = item.message
        if msg is None:
            return
        session = protocol.session_of(msg)
        if msg.kind == protocol.TRANSMIT and item.kind == topics.CHAN:
            if session != self.session:  # without an ACL anyone can publish a notice
                log.warning("channel: dropped a round notice of session %s: not this run's", session)
                return
            self._begin(msg, session)
        elif msg.kind == protocol.SIGNAL and item.kind == topics.TX:
            self._signal(topics.node_index(item.node), session, msg)

    def _signal(self, node: int | None, session: str | None, msg: wire.Message) -> None:
        signal = msg.tensors.get("signal")
        if node is None or session is None or signal is None or set(msg.tensors) != {"signal"}:
            log.warning("channel: rejected a malformed signal from node %s", node)
            return
        if session != self.session or node not in self.nodes:
            log.info("channel: dropped a signal of node %d (session %s): not of this run", node, session)
            return
        current = self._round
        if current is not None and current.index == msg.round:
            self._accept(current, node, signal)
        elif current is None or current.index < msg.round <= current.index + EARLY_ROUNDS:
            self._keep_early(node, msg.round, signal)
        else:
            log.info("channel: dropped node %d's signal of round %d: not this round", node, msg.round)

    def _keep_early(self, node: int, round_index: int, signal: np.ndarray) -> None:
        """Keep a signal that came before its round's notice, within the per-node bound."""
        problem = self._early_spec.problem(signal, finite_known=True)  # testbed.mqtt.wire refused non-finite ones
        if problem is not None:
            log.warning("channel: dropped node %d's early signal of round %d: %s", node, round_index, problem)
            return
        held = sorted(r for (_, r), early in self._early.items() if node in early)
        if round_index in held:
            log.warning("channel: dropped a second early signal of node %d for round %d", node, round_index)
            return
        if len(held) > EARLY_ROUNDS:
            # Before the first notice any round may come: the bound is per sender, so a node
            # flooding future rounds only ever spends its own slots.
            log.warning("channel: dropped node %d's early signal of round %d: it already has %d waiting (rounds %s)",
                        node, round_index, len(held), ", ".join(map(str, held)))
            return
        self._early.setdefault((self.session, round_index), {})[node] = signal

    def _begin(self, msg: wire.Message, session: str | None) -> None:
        timeout_s = msg.meta.get("signal_timeout_s")
        config_text = protocol.config_of(msg)
        if not isinstance(timeout_s, (int, float)) or isinstance(timeout_s, bool) or not 0 < timeout_s < 86400:
            raise wire.WireError("bad_header", "a transmit notice needs a signal timeout")
        assert session is not None
        spec = protocol.signal_spec_of(msg)
        config, half = self._half(config_text)
        if self._round is not None and not self._round.done:
            log.warning("channel: round %d superseded by round %d before it completed", self._round.index, msg.round)
        senders = protocol.senders_of(msg)
        withdrawn = self._withdrawn.pop((session, msg.round), set())
        self._withdrawn = {k: v for k, v in self._withdrawn.items() if k[0] == session and k[1] > msg.round}
        self._round = _Round(session, msg.round, half, dict(msg.tensors), config, spec,
                             set(senders) - withdrawn, time.monotonic() + float(timeout_s))
        self._early_spec = TensorSpec(spec.shape, spec.dtype)
        early = self._early.pop((session, msg.round), {})
        for node, signal in early.items():
            self._accept(self._round, node, signal)
        self._early = {k: v for k, v in self._early.items() if k[0] == session and k[1] > msg.round}
        self._heard = {k: v for k, v in self._heard.items() if k[0] == session and k[1] >= msg.round - 8}

    def _half(self, config_text: str) -> tuple[Config, ChannelHalf]:
        key = hashlib.sha256(config_text.encode()).hexdigest()
        if key not in self._halves:
            config = load_config_text(config_text, source="the coordinator's experiment")
            self._halves = {key: (config, assemble.build_channel(config))}
        return self._halves[key]

    def _ready(self, current: _Round) -> bool:
        waiting = current.expected - set(current.signals) - (current.expected - self._online)
        return not waiting or time.monotonic() >= current.deadline

    def _transmit(self, current: _Round) -> None:
        senders = sorted(current.signals)
        silent = sorted(current.expected - set(senders))
        if silent:
            log.warning("channel: round %d: no signal from %d node(s): %s", current.index, len(silent),
                        ", ".join(map(str, silent[:10])))
        half = current.half
        if len(senders) < half.min_senders:
            log.warning("channel: round %d: %d sender(s), no exchange possible", current.index, len(senders))
            return
        n = current.config.data.num_nodes
        signals = np.zeros((n,) + current.spec.shape, dtype=current.spec.dtype)
        for node, row in current.signals.items():
            signals[node] = row
        ctx = RoundContext(current.index, current.config.run.seed, n, tuple(sorted(current.expected))).closed(senders)
        received = half.superpose(signals, current.channel, ctx, out=signals)
        for node in senders:
            self.client.publish(topics.rx(self.run, str(node)),
                                protocol.received(self.run, current.session, current.index, senders,
                                                  np.ascontiguousarray(received[node])))

    def _accept(self, current: _Round, node: int, signal: np.ndarray) -> None:
        """Keep ``node``'s signal for the round if it was announced and is what the notice declares."""
        if node not in current.expected:
            log.warning("channel: node %d transmitted in round %d unannounced; ignored", node, current.index)
            return
        if node in current.signals:
            log.warning("channel: dropped a second signal of node %d for round %d", node, current.index)
            return
        problem = current.spec.problem(signal)
        if problem is not None:
            log.warning("channel: node %d's signal of round %d refused: %s", node, current.index, problem)
            return
        current.signals[node] = signal
