"""A whole MQTT run in one process, without a broker, for generated faults at the coordinator.

The coordinator (testbed.orchestration.coordinator.MqttNodes) runs unchanged but for its client: a
:class:`LoopbackClient` is the real :class:`~testbed.mqtt.client.MqttClient` on its receiving side
(every message goes through ``_take``: decoding, the coordinator's ``admit``, the replay window,
the coordinator's checks) whose ``publish`` hands what the coordinator sends to honest node agents
(nodes.agent.NodeAgent, each with its own ledger) in this process. What a node sends the coordinator
is sealed with that node's key (testbed.mqtt.auth; keys of a run key, as the run's emulated boards
get them): a tampered reply is what a node lying under its own key sends. A ``tamper`` hook decides what
of each node's reply reaches the coordinator: the reply, a mutant of it, both, twice, later, never.

Example::

    >>> # see tests/test_trust_coordinator.py
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Callable, Iterator

from nodes.agent import NodeAgent
from testbed.mqtt import wire
from testbed.mqtt import auth, topics
from testbed.mqtt.client import MqttClient
from testbed.orchestration import coordinator
from testbed.rounds import protocol

#: (node, the message it answers, its honest reply) → the payloads to deliver now, and per payload
#: a delay: 0 now, k > 0 with the coordinator's k-th publish after this one, None at the stop.
Tamper = Callable[[int, wire.Message, bytes], list[tuple[bytes, int | None]]]


@dataclasses.dataclass
class Loopback:
    """The honest nodes and what the test does to their replies."""

    tamper: Tamper
    agents: dict[int, NodeAgent] = dataclasses.field(default_factory=dict)
    client: "LoopbackClient | None" = None
    delayed: list[tuple[int | None, str, bytes]] = dataclasses.field(default_factory=list)
    publishes: int = 0
    session: str | None = None  # the coordinator's, from what it sent

    def agent(self, node: int) -> NodeAgent:
        if node not in self.agents:
            self.agents[node] = NodeAgent(node)
        return self.agents[node]

    def published(self, topic: str, payload: bytes) -> None:
        """The coordinator published: deliver what was delayed until now, then every node's answer."""
        assert self.client is not None
        self.publishes += 1
        msg = wire.decode(payload)
        self.session = protocol.session_of(msg)
        stop = msg.kind == protocol.STOP
        due = [(t, p) for when, t, p in self.delayed if (when is None and stop) or (when is not None and when <= self.publishes)]
        self.delayed = [(w, t, p) for w, t, p in self.delayed
                        if not ((w is None and stop) or (w is not None and w <= self.publishes))]
        for up_topic, late in due:
            self.client.take_sealed(up_topic, late)
        t = topics.parse(topic)
        receivers = sorted(self.agents) if t.kind == topics.BCAST else [int(t.node)]  # type: ignore[arg-type]
        for node in receivers:
            reply = self.agent(node).handle(msg)
            if reply is None or reply.to != protocol.COORDINATOR:
                continue
            up = topics.up(self.client.run, str(node))
            for out, delay in self.tamper(node, msg, reply.payload):
                if delay == 0:
                    self.client.take_sealed(up, out)
                else:
                    self.delayed.append((None if delay is None else self.publishes + delay, up, out))


class LoopbackClient(MqttClient):
    """MqttClient whose network is :class:`Loopback`: connected at once (every node online),
    publishing to the honest agents."""

    loopback: Loopback  # set by :func:`loopback`

    def connect(self, timeout_s: float = 10.0, *, probe_first: bool = True) -> "LoopbackClient":
        self.connected, self.protocol = True, "5"
        for node in self.loopback.agents:
            self.take_sealed(topics.status(self.run, str(node)), topics.STATUS_ONLINE)
        return self

    def take_sealed(self, topic: str, payload: bytes) -> None:
        """``payload`` received on ``topic``, sealed by the topic's node with its key (a status for a
        new connection epoch, a message for the session and round its header names)."""
        node = topics.parse(topic).node
        if self._keys is None:
            self._take(topic, payload)
            return
        if topics.parse(topic).kind == topics.STATUS:
            session, round_index = "", auth.new_epoch()
        else:
            session, round_index = wire.session_and_round(payload)
        self._take(topic, auth.seal(self._keys, topic, [node], session, round_index, payload))

    def publish(self, topic: str, payload: bytes, *, retain: bool = False, timeout_s: float | None = 30.0) -> None:
        self.loopback.published(topic, payload)

    def publish_then(self, topic: str, payload: bytes, *, timeout_s: float = 30.0):
        self.loopback.published(topic, payload)
        return lambda: None

    def close(self, timeout_s: float = 5.0) -> None:
        self.connected = False


@contextlib.contextmanager
def loopback(monkeypatch, node_ids: list[int], tamper: Tamper) -> Iterator[Loopback]:
    """Within: every coordinator built talks to honest agents of ``node_ids`` through ``tamper``."""
    state = Loopback(tamper)
    for node in node_ids:
        state.agent(node)

    class Bound(LoopbackClient):
        loopback = state

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            state.client = self

    monkeypatch.setattr("testbed.orchestration.coordinator.MqttClient", Bound)
    # The honest agents stand for boards the run does not start (mqtt.emulated = false): their keys
    # are a run key's, as the run's own emulated boards' are.
    real_keys = coordinator.run_keys
    monkeypatch.setattr(coordinator, "run_keys", lambda m, run, ids: real_keys(
        m.model_copy(update={"emulated": True}) if m.keys is None else m, run, ids))
    yield state


def honest(node: int, msg: wire.Message, reply: bytes) -> list[tuple[bytes, int | None]]:
    """Every reply as the node sent it, at once."""
    return [(reply, 0)]
