"""The radio between the nodes of an over-the-air run (DWFL) over MQTT.

The channel emulator is an MQTT client of its own (id and username ``channel``). Each round the
coordinator tells it which nodes will transmit (``transmit`` on ``chan``); it collects their
transmit signals (``tx/{node}``) until all arrived, a sender went offline, or the signal deadline
passed; then it runs the same :func:`testbed.algorithms.dwfl_channel.propagate` a sim run runs
(on the round's channel h, which the coordinator sends with the notice; receiver noise from the
run's seed) and sends each sender only its own received signal (``rx/{node}``). A node that stayed silent
contributes nothing to the superposition; the others learn who transmitted and average over them.

Example (against a running broker)::

    >>> emulator = ChannelEmulator("mqtt://127.0.0.1:1883", run="testbed")   # doctest: +SKIP
    >>> ...                                                                  # doctest: +SKIP
    >>> emulator.close()                                                     # doctest: +SKIP
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from testbed import protocol, wire
from testbed.algorithms.dwfl import radio_from_config
from testbed.algorithms.dwfl_channel import Radio, RoundChannel, aligned_channel, propagate
from testbed.config import Config, load_config_text
from testbed.mqtt import topics
from testbed.mqtt.client import Inbound, MqttClient

log = logging.getLogger(__name__)


@dataclass
class _Round:
    """One round on the air: who should transmit, and what arrived so far."""

    session: str
    index: int
    radio: Radio
    channel: RoundChannel  # as the coordinator and the nodes have it
    config: Config
    expected: set[int]
    deadline: float
    signals: dict[int, np.ndarray] = field(default_factory=dict)
    size: int = 0  # entries of every signal, set by the first to arrive


class ChannelEmulator:
    """Serves the channel of run ``run`` from a thread until :meth:`close`.

    Args:
        url: broker URL.
        run: run id.
        client_options: passed to :meth:`MqttClient.for_channel` (credentials, TLS, protocol,
            chunk size).
        connect_timeout_s: how long to wait for the broker.
    """

    def __init__(self, url: str, run: str, *, connect_timeout_s: float = 30.0, **client_options: Any):
        self.client = MqttClient.for_channel(url, run, **client_options).connect(timeout_s=connect_timeout_s)
        self.run = run
        self._online: set[int] = set()
        self._round: _Round | None = None
        self._early: dict[tuple[str, int], dict[int, np.ndarray]] = {}  # signals ahead of their notice
        self._radios: dict[str, tuple[Config, Radio]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name=f"channel-{run}", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop serving and disconnect."""
        self._stop.set()
        self._thread.join(timeout=10.0)
        self.client.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            item = self.client.receive(timeout_s=0.2)
            try:
                if item is not None:
                    self._handle(item)
                if self._round is not None and self._ready(self._round):
                    self._transmit(self._round)
                    self._round = None
            except Exception:  # one bad round must not silence the channel for the rest of the run
                log.exception("channel emulator of run %s: round failed", self.run)
                self._round = None

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
            self._begin(msg, session)
        elif msg.kind == protocol.SIGNAL and item.kind == topics.TX:
            node = topics.node_index(item.node)
            signal = msg.tensors.get("signal")
            if node is None or session is None or signal is None or signal.ndim != 1:
                log.warning("channel: rejected a malformed signal from %s", item.node)
                return
            current = self._round
            if current is not None and (current.session, current.index) == (session, msg.round):
                _accept(current, node, signal)
            elif current is None or msg.round > current.index:
                early = self._early.setdefault((session, msg.round), {})
                early.setdefault(node, signal)
            else:
                log.info("channel: dropped node %d's signal of round %d (session %s): not this round",
                         node, msg.round, session)

    def _begin(self, msg: wire.Message, session: str | None) -> None:
        config_text = msg.meta.get("config")
        timeout_s = msg.meta.get("signal_timeout_s")
        if session is None or not isinstance(config_text, str) or not isinstance(timeout_s, (int, float)):
            raise wire.WireError("bad_header", "a transmit notice needs a session, a config and a signal timeout")
        config, radio = self._radio(config_text)
        h = msg.tensors.get("channel_h")
        if h is None or h.shape != (radio.num_nodes,):
            raise wire.WireError("bad_header", f"a transmit notice needs channel_h of shape ({radio.num_nodes},)")
        if self._round is not None:
            log.warning("channel: round %d superseded by round %d before it completed", self._round.index, msg.round)
        block = radio.schedule.block_index(msg.round)
        self._round = _Round(session, msg.round, radio, aligned_channel(radio, block, np.array(h)), config,
                             set(protocol.senders_of(msg)), time.monotonic() + float(timeout_s))
        early = self._early.pop((session, msg.round), {})
        for node, signal in early.items():
            _accept(self._round, node, signal)
        self._early = {k: v for k, v in self._early.items() if k[0] == session and k[1] > msg.round}

    def _radio(self, config_text: str) -> tuple[Config, Radio]:
        key = hashlib.sha256(config_text.encode()).hexdigest()
        if key not in self._radios:
            config = load_config_text(config_text, source="the coordinator's experiment")
            self._radios = {key: (config, radio_from_config(config, config.data.num_nodes))}
        return self._radios[key]

    def _ready(self, current: _Round) -> bool:
        waiting = current.expected - set(current.signals) - (current.expected - self._online)
        return not waiting or time.monotonic() >= current.deadline

    def _transmit(self, current: _Round) -> None:
        senders = sorted(current.signals)
        silent = sorted(current.expected - set(senders))
        if silent:
            log.warning("channel: round %d: no signal from %d node(s): %s", current.index, len(silent),
                        ", ".join(map(str, silent[:10])))
        if len(senders) < 2:
            log.warning("channel: round %d: %d sender(s), no exchange possible", current.index, len(senders))
            return
        config, radio = current.config, current.radio
        seed, scheme = config.run.seed, config.dwfl.scheme
        signals = np.zeros((radio.num_nodes, current.size))
        for node, row in current.signals.items():
            signals[node] = row
        received = propagate(scheme, signals, current.channel, radio, seed, current.index, out=signals)
        for node in senders:
            self.client.publish(topics.rx(self.run, str(node)),
                                protocol.received(self.run, current.session, current.index, senders,
                                                  np.ascontiguousarray(received[node])))


def _accept(current: _Round, node: int, signal: np.ndarray) -> None:
    """Keep ``node``'s signal for the round if it was announced and matches the others' size."""
    if node not in current.expected:
        log.warning("channel: node %d transmitted in round %d unannounced; ignored", node, current.index)
    elif current.signals and len(signal) != current.size:
        log.warning("channel: node %d's signal has %d entries, the others %d; ignored",
                    node, len(signal), current.size)
    else:
        current.size = len(signal)
        current.signals.setdefault(node, signal)
