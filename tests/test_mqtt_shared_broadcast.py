"""An emulated host reads the broadcast once, through a shared subscription of its nodes
(testbed.mqtt.topics): both brokers serve it (the embedded one through our routing), the ACL allows
it, the probe learns whether a broker serves it, and the host hands each node its copy.
Network: 127.0.0.1 only."""

from __future__ import annotations

import dataclasses

import queue
import socket
import threading
import time

import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from nodes.host import _broadcast_group, _copies, _gather
from testbed.mqtt import wire
from testbed.mqtt import probe, topics
from testbed.mqtt.client import Inbound, MqttClient
from testbed.mqtt.network_loop import NetworkLoop
from testbed.rounds import protocol

from conftest import wait_until

GRACE_S = 0.2  # after the awaited messages came: where a duplicate or a stray copy would show


def _stops(clients: list[MqttClient], count: int, timeout_s: float = 30.0) -> list[list[int]]:
    """The rounds of the stop messages each of ``clients`` receives: until ``count`` have come
    between them (the test fails after ``timeout_s``), then whatever else comes within GRACE_S."""
    got: list[list[int]] = [[] for _ in clients]

    def take() -> bool:
        for client, rounds in zip(clients, got):
            while (item := client.receive(0)) is not None:
                if item.message is not None and item.message.kind == protocol.STOP:
                    rounds.append(item.message.round)
        return sum(map(len, got)) >= count

    wait_until(take, timeout_s, f"{count} stop messages")
    grace_ends = time.monotonic() + GRACE_S
    while time.monotonic() < grace_ends:
        take()
        time.sleep(0.01)
    take()
    return got


def test_a_shared_broadcast_reaches_one_member_of_the_group_and_every_plain_subscriber(broker, run_id, connect):
    group = "host-0123456789ab"
    members = [connect(MqttClient.for_node(broker.url, run_id, n, subscriptions=topics.node_subscriptions(run_id, n, group)))
               for n in ("0", "1")]
    plain = connect(MqttClient.for_node(broker.url, run_id, "2"))
    coordinator = connect(MqttClient.for_coordinator(broker.url, run_id))
    for r in range(1, 7):
        coordinator.publish(topics.bcast(run_id), protocol.stop(run_id, "s", "completed", r))
    assert _stops([plain], 6) == [list(range(1, 7))]
    got = _stops(members, 6)  # the plain subscriber's copies came: so did the group's, in the same fan-out
    assert sorted(got[0] + got[1]) == list(range(1, 7))  # each message once, to one member


def test_the_embedded_broker_hands_a_shared_broadcast_to_a_connected_member(embedded_broker, run_id, connect):
    url, group = embedded_broker.url, "host-0123456789ab"
    members = [connect(MqttClient.for_node(url, run_id, n, subscriptions=topics.node_subscriptions(run_id, n, group)))
               for n in ("0", "1")]
    coordinator = connect(MqttClient.for_coordinator(url, run_id))
    coordinator.publish(topics.bcast(run_id), protocol.stop(run_id, "s", "completed", 1))
    taker = 0 if _stops(members, 1)[0] else 1
    members[taker].close()  # its persistent session stays: it is no longer the one served
    coordinator.publish(topics.bcast(run_id), protocol.stop(run_id, "s", "completed", 2))
    assert _stops([members[1 - taker]], 1) == [[2]]


def test_the_acl_lets_a_node_read_the_broadcast_through_a_shared_subscription(secured_mosquitto, run_id, connect):
    broker, pw = secured_mosquitto
    node = connect(MqttClient.for_node(broker.url, run_id, "a", username="a", password=pw["a"],
                                       subscriptions=topics.node_subscriptions(run_id, "a", "host-1")))
    coordinator = connect(MqttClient.for_coordinator(broker.url, run_id, username="coordinator",
                                                     password=pw["coordinator"]))
    coordinator.publish(topics.bcast(run_id), protocol.stop(run_id, "s", "completed", 3))
    assert _stops([node], 1) == [[3]]


def test_the_probe_learns_whether_the_broker_serves_shared_subscriptions(embedded_broker, mosquitto_broker):
    def ask(url: str, version: str) -> probe.Negotiated:
        return probe.negotiate(url, tls_ca=None, protocol=version, client_id="probe-test", username=None,
                               password=None, deadline=time.monotonic() + 10, timeout_s=10)

    assert ask(mosquitto_broker.url, "auto") == probe.Negotiated("5", True)
    assert ask(mosquitto_broker.url, "3.1.1") == probe.Negotiated("3.1.1", None)  # 3.1.1 cannot say
    assert ask(embedded_broker.url, "auto") == probe.Negotiated("3.1.1", None)


@pytest.mark.parametrize("available, expected", [(0, False), (1, True), (None, True)])
def test_a_v5_connack_says_whether_shared_subscriptions_are_served(available, expected):
    props = Properties(PacketTypes.CONNACK)
    props.ReceiveMaximum = 20
    if available is not None:
        props.SharedSubscriptionAvailable = available
    body = b"\x00\x00" + props.pack()  # flags, reason code (success), properties
    ours, theirs = socket.socketpair()
    with ours, theirs:
        theirs.sendall(bytes([0x20, len(body)]) + body)
        answer = probe._read_connack(ours, v5=True)
    assert answer.connack == 0 and answer.shared_subscriptions is expected


@pytest.mark.parametrize("garbage", [b"\x05\xff\x00\x00\x00\x00", b"\x09\x2a", b"\x03\x1f\x00\x09"])
def test_garbled_connack_properties_leave_shared_subscriptions_unknown(garbage, caplog):
    """Unknown property ids, a length past the end, a truncated string: no traceback, no claim."""
    body = b"\x00\x00" + garbage
    ours, theirs = socket.socketpair()
    with ours, theirs:
        theirs.sendall(bytes([0x20, len(body)]) + body)
        answer = probe._read_connack(ours, v5=True)
    assert answer.connack == 0 and answer.shared_subscriptions is None
    assert _broadcast_group("auto", probe.Negotiated("5", answer.shared_subscriptions), 50) is None


def test_broadcast_mode_of_a_host():
    says_yes, cannot_say = probe.Negotiated("5", True), probe.Negotiated("3.1.1", None)
    assert _broadcast_group("auto", says_yes, 50).startswith("host-")
    assert _broadcast_group("auto", cannot_say, 50) is None  # e.g. RabbitMQ 3.x: per node, which works
    assert _broadcast_group("shared", cannot_say, 50).startswith("host-")
    assert _broadcast_group("per-node", says_yes, 50) is None
    assert _broadcast_group("shared", says_yes, 1) is None  # a board: a group of one is its own copy
    assert _broadcast_group("auto", says_yes, 2) != _broadcast_group("auto", says_yes, 2)  # one per host


def _round_inbound(run: str, receiver: str, expected: list[int]) -> Inbound:
    payload = protocol.round_(run, "s", 4, "[run]\n", expected, {}, [])
    return Inbound(topics.bcast(run), topics.BCAST, None, payload, wire.decode(payload), receiver)


def test_a_shared_broadcast_becomes_one_copy_for_each_connected_member():
    item = _round_inbound("r", "1", [0, 1, 2])
    copies = _copies(item, lambda: ["0", "2"])  # node 1's connection is down: it did not hear it
    assert [c.receiver for c in copies] == ["0", "2"] and all(c.message is item.message for c in copies)
    assert copies == [dataclasses.replace(item, receiver=name) for name in ("0", "2")]  # every other field kept
    assert _copies(item, None) == [item]  # per-node copies: each its own
    status = Inbound(topics.coord("r"), topics.COORD, None, topics.STATUS_ONLINE, None, "1")
    assert _copies(status, lambda: ["0", "2"]) == [status]


GATHER_WINDOW_S = 1.0  # the host's gather window (20 ms), widened so a wait shows on a loaded machine


@pytest.mark.parametrize("members, receivers, waits", [(lambda: ["0", "1", "2"], ["0", "1", "2"], False),
                                                       (None, ["1"], True)], ids=["shared", "per-node-control"])
def test_a_host_does_not_wait_for_more_copies_of_a_shared_broadcast(monkeypatch, members, receivers, waits):
    """The shared broadcast's copies are all made at once: no wait for more. The control, per-node
    copies of which only node 1's came, waits the window for the others: the same clock sees a wait."""
    monkeypatch.setattr("nodes.host._GATHER_S", GATHER_WINDOW_S)
    inbox: queue.Queue[Inbound] = queue.Queue()
    inbox.put(_round_inbound("r", "1", [0, 1, 2]))
    agents = {"0": object(), "1": object(), "2": object()}
    started = time.monotonic()
    items = _gather(inbox, 1.0, agents, members)  # type: ignore[arg-type]
    took_s = time.monotonic() - started
    assert sorted(i.receiver for i in items) == receivers
    assert took_s >= GATHER_WINDOW_S if waits else took_s < GATHER_WINDOW_S / 2, took_s


def test_a_batch_writes_the_held_flushes_in_one_request():
    loop = NetworkLoop()
    written: list[object] = []
    loop._write = written.append  # type: ignore[method-assign]  # the loop thread's write, observed
    try:
        clients = [object(), object()]
        with loop.batch():
            for c in clients + clients:
                loop.flush(c)  # type: ignore[arg-type]
            # The loop thread runs its requests in order: once this one ran, any flush handed over
            # before it was written (no sleep that a loaded machine outlasts)
            barrier = threading.Event()
            loop._call_soon(barrier.set)
            assert barrier.wait(30)
            assert written == [] and len(loop._requests) == 0  # held, not yet handed over
        wait_until(lambda: len(written) >= 2, 30, "the batch's writes")
        assert written == clients  # once each, in order
    finally:
        loop.close()


def test_a_reply_that_comes_before_the_collection_begins_answers_the_round():
    """The coordinator's network thread takes replies as they come; one that comes between the
    round's publish and the start of its collection waits and then answers it (not a late reply)."""
    import threading

    import numpy as np

    from testbed.assembly import assemble

    from testbed.algorithms.contract import RoundContext
    from testbed.assembly.assemble import load_data, model_for
    from testbed.assembly.config import load_config
    from testbed.orchestration.coordinator import MqttNodes

    config = load_config("benchmarks/acfl.toml")
    data = load_data(config.data, 0)
    alg = assemble.build_algorithm(config, model_for(config.model, data, 0), data)
    nodes = MqttNodes.__new__(MqttNodes)  # its round bookkeeping only: no broker, no hosts
    mqtt = config.mqtt.model_copy(update={"run_id": "r", "round_timeout_s": 5.0})
    nodes._init_bookkeeping(mqtt, config.nodes, "", list(range(100)), alg, seed=0)
    nodes.session, nodes.online = "s", {3, 4}
    ctx = RoundContext(7, 0, 100, (3, 4))
    nodes._remember(ctx)
    for node in (3, 4):
        payload = protocol.update("r", "s", 7, node, {"gradient": np.ones((10, 10))}, alg.planned_events(node, ctx),
                                  metrics={"samples": 10.0})
        nodes._on_inbound(Inbound(topics.up("r", str(node)), topics.UP, str(node), payload, wire.decode(payload)))
    started = time.monotonic()
    answers, refusals, reasons, refused = nodes._collect(ctx, alg.uplink_spec(), protocol.UPDATE)
    assert sorted(answers) == [3, 4] and not refusals and not reasons and not refused and not nodes._late
    assert time.monotonic() - started < 1.0  # complete at once, not at the deadline


def test_a_status_wakes_the_coordinator_only_when_it_changes_who_is_online():
    """A broker replays every node's retained status to a new subscriber: statuses that change
    nothing (a node already online, or offline and not online) wake no waiter; a change does, and a
    node going offline stops the round being collected from waiting for it."""
    import threading

    from testbed.algorithms.contract import RoundContext
    from testbed.orchestration.coordinator import MqttNodes
    from testbed.orchestration.coordinator_inbox import Collection

    class CountingCondition(threading.Condition):
        wakes = 0

        def notify_all(self) -> None:
            CountingCondition.wakes += 1
            super().notify_all()

    nodes = MqttNodes.__new__(MqttNodes)  # its status bookkeeping only: no broker, no hosts
    nodes._lock, nodes._collecting, nodes._pending, nodes.online = CountingCondition(), None, [], {1}

    def status(node: int, payload: bytes) -> None:
        nodes._on_inbound(Inbound(topics.status("r", str(node)), topics.STATUS, str(node), payload, None))

    for node in (2, 3):
        status(node, topics.STATUS_OFFLINE)  # retained, of a run before: nothing changes
    status(1, topics.STATUS_ONLINE)
    assert CountingCondition.wakes == 0 and nodes.online == {1}
    status(2, topics.STATUS_ONLINE)
    assert CountingCondition.wakes == 1 and nodes.online == {1, 2}
    nodes._collecting = Collection(RoundContext(0, 0, 3, (1, 2)), {}, {}, protocol.UPDATE, outstanding={1, 2})
    status(2, topics.STATUS_OFFLINE)
    assert CountingCondition.wakes == 2 and nodes.online == {1}
    assert nodes._collecting.outstanding == {1} and nodes._collecting.reasons == {2: "offline"}
