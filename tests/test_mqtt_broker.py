"""MQTT transport tests: topics, ACL generation, both brokers, the client (round trips, chunking,
last will, reconnect, rejection of bad messages) and the Mosquitto ACL. Network: 127.0.0.1 only."""

from __future__ import annotations

import logging
import os
import queue
import resource
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import paho.mqtt.client as paho
import pytest

from testbed.errors import UserError
from testbed.mqtt import wire
from testbed.mqtt import acl, chunks, topics
from testbed.mqtt.broker import accepts_tcp, free_port, parse_broker_url, wait_for_broker
from testbed.mqtt.brokers import mosquitto
from testbed.mqtt.brokers.embedded import BrokerProcess
from testbed.mqtt.brokers.mosquitto import MosquittoBroker
from testbed.mqtt.client import BrokerRefused, Inbound, MqttClient, close_all
from testbed.mqtt.client_batches import connect_all
from testbed.mqtt.embedded_broker import EmbeddedBroker
from testbed.mqtt.network_loop import NetworkLoop

from conftest import require_command

FAST = {"reconnect_min_s": 0.1, "reconnect_max_s": 0.5}
# How long a test waits to see that no will follows a clean leave; the control shows a will comes
# within it once a socket closes without a DISCONNECT (test_a_client_whose_status_paho_refuses_...)
NO_WILL_WINDOW_S = 0.5


def _receive(client: MqttClient, kind: str, timeout_s: float = 5.0, payload: bytes | None = None) -> Inbound | None:
    """The next inbound message of `kind` (and `payload`, if given), skipping others."""
    deadline = time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0:
        m = client.receive(left)
        if m is not None and m.kind == kind and (payload is None or m.payload == payload):
            return m
    return None


def _update(run: str, sender: str, rnd: int = 0, **tensors: np.ndarray) -> bytes:
    return wire.encode({"run": run, "round": rnd, "sender": sender, "kind": "update"}, tensors)


def _raw_client(url: str) -> paho.Client:
    """A bare paho client (3.1.1: both brokers speak it) for sending what MqttClient would not."""
    u = parse_broker_url(url)
    c = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id="raw", protocol=paho.MQTTv311)
    c.connect(u.host, u.port)
    c.loop_start()
    return c


# ---- topics, URLs, ACL text (no network) ------------------------------------------------------


def test_topic_builders_and_parse():
    assert topics.up("r1", "n1") == "tb/v1/r1/up/n1"
    assert topics.down("r1", "n1") == "tb/v1/r1/down/n1"
    assert topics.bcast("r1") == "tb/v1/r1/bcast"
    assert topics.status("r1", "n1") == "tb/v1/r1/status/n1"
    assert topics.coord("r1") == "tb/v1/r1/coord"
    for t, parsed in [("tb/v1/r1/up/n1", ("r1", "up", "n1")), ("tb/v1/r1/down/n-2", ("r1", "down", "n-2")),
                      ("tb/v1/r1/status/n1", ("r1", "status", "n1")), ("tb/v1/r1/bcast", ("r1", "bcast", None)),
                      ("tb/v1/r1/coord", ("r1", "coord", None))]:
        p = topics.parse(t)
        assert (p.run, p.kind, p.node) == parsed


@pytest.mark.parametrize("bad", ["tb/v2/r1/up/n1", "xx/v1/r1/up/n1", "tb/v1/r1/up", "tb/v1/r1/up/n1/x",
                                 "tb/v1/r1/bcast/n1", "tb/v1/r1/side/n1", "tb/v1/r1/up/+", "tb/v1/+/up/n1",
                                 "tb/v1/r1/up/#", "tb/v1//up/n1", "", "tb/v1/r1/up/$n"])
def test_parse_rejects_foreign_topics(bad):
    with pytest.raises(topics.TopicError):
        topics.parse(bad)


def test_topic_builders_reject_bad_ids():
    for node in ["a/b", "+", "#", "", "x" * 65, "a b"]:
        with pytest.raises(topics.TopicError):
            topics.up("r1", node)


def test_parse_broker_url():
    u = parse_broker_url("mqtt://node%2F1:p%40ss@127.0.0.1:1999")
    assert (u.host, u.port, u.tls, u.username, u.password) == ("127.0.0.1", 1999, False, "node/1", "p@ss")
    assert str(u) == "mqtt://127.0.0.1:1999"  # no credentials in logs
    assert parse_broker_url("mqtts://localhost").port == 8883
    assert parse_broker_url("mqtt://localhost").port == 1883
    for bad in ["http://h:1", "mqtt://", "mqtt://h:99999", "mqtt://h:1/path"]:
        with pytest.raises(UserError):
            parse_broker_url(bad)


def test_generate_acl():
    access = acl.generate_access("r1", ["a", "b", "a"])
    text, passwords = mosquitto.acl_text(access.grants), access.passwords
    assert set(passwords) == {"coordinator", "channel", "watch", "a", "b"} and len(set(passwords.values())) == 5
    blocks = {b.splitlines()[0]: b.splitlines()[1:] for b in text.split("\n\n")[1:]}
    assert blocks["user a"] == ["topic write tb/v1/r1/up/a", "topic write tb/v1/r1/tx/a",
                                "topic write tb/v1/r1/status/a", "topic read tb/v1/r1/down/a",
                                "topic read tb/v1/r1/rx/a", "topic read tb/v1/r1/bcast",
                                "topic read tb/v1/r1/coord"]
    assert blocks["user coordinator"] == ["topic read tb/v1/r1/up/+", "topic read tb/v1/r1/status/+",
                                          "topic write tb/v1/r1/down/+", "topic write tb/v1/r1/bcast",
                                          "topic write tb/v1/r1/chan", "topic write tb/v1/r1/coord"]
    assert blocks["user channel"] == ["topic read tb/v1/r1/chan", "topic read tb/v1/r1/tx/+",
                                      "topic read tb/v1/r1/status/+", "topic read tb/v1/r1/coord",
                                      "topic write tb/v1/r1/rx/+", "topic write tb/v1/r1/status/channel"]
    assert blocks["user watch"] == ["topic read tb/v1/r1/status/+", "topic read tb/v1/r1/coord"]
    for reserved in ("coordinator", "channel", "watch"):
        with pytest.raises(ValueError):
            acl.generate_access("r1", [reserved])


def test_password_hash_format(tmp_path):
    h = mosquitto.hash_password("secret", salt=b"s" * 12)
    assert h.startswith("$7$101$" + "c3Nzc3Nzc3Nzc3Nz" + "$") and len(h.split("$")[4]) == 88  # 64-byte digest
    path = mosquitto.write_password_file(tmp_path / "pw", {"a": "x", "b": "y"})
    assert [line.split(":")[0] for line in path.read_text().splitlines()] == ["a", "b"]
    assert path.stat().st_mode & 0o077 == 0


def test_brokers_refuse_non_loopback_hosts():
    with pytest.raises(UserError, match="loopback"):
        EmbeddedBroker(host="0.0.0.0")
    with pytest.raises(UserError, match="loopback"):
        MosquittoBroker(host="192.0.2.1")


@pytest.mark.parametrize("kind", [EmbeddedBroker, MosquittoBroker])
def test_port_in_use_is_a_user_error(kind):
    if kind is MosquittoBroker:
        require_command("mosquitto", "apt-get install mosquitto")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        broker = kind(port=s.getsockname()[1])
        try:
            with pytest.raises(UserError, match="did not start"):
                broker.start()
        finally:
            broker.stop()


def test_an_idle_mosquitto_stops_at_once():
    """Mosquitto 2.0 blocks its signals while it waits for its sockets (up to 0.1 s): stop() wakes it,
    so a run's stop does not wait that out (70 ms at each stop of an idle broker before)."""
    require_command("mosquitto", "apt-get install mosquitto")
    took = []
    for _ in range(3):
        broker = MosquittoBroker().start()
        time.sleep(0.15)  # idle, as at the end of a run
        started = time.monotonic()
        broker.stop()
        took.append(time.monotonic() - started)
        assert not broker.running
    assert sorted(took)[1] < 0.045, took


def test_missing_mosquitto_binary_is_a_user_error():
    with pytest.raises(UserError, match="not found"):
        MosquittoBroker(binary="no-such-mosquitto-binary").start()


def test_wait_for_broker_times_out_on_closed_port():
    t0 = time.monotonic()
    with pytest.raises(UserError, match="not reachable"):
        wait_for_broker(f"mqtt://127.0.0.1:{free_port()}", timeout_s=0.3)
    assert time.monotonic() - t0 < 2


def test_client_connect_to_nothing_is_a_user_error(run_id):
    with pytest.raises(UserError, match="not reachable"):
        MqttClient.for_node(f"mqtt://127.0.0.1:{free_port()}", run_id, "n1", **FAST).connect(timeout_s=0.5)


# ---- both brokers ------------------------------------------------------------------------------


def test_broker_accepts_connections(broker):
    wait_for_broker(broker.url, timeout_s=2)
    assert broker.url.startswith("mqtt://127.0.0.1:")


def test_protocol_negotiation(broker, run_id, connect):
    client = connect(MqttClient.for_node(broker.url, run_id, "n1"))
    # amqtt 0.12 speaks 3.1.1 only; mosquitto 2 speaks v5
    assert client.protocol == ("3.1.1" if isinstance(broker, EmbeddedBroker) else "5")


def test_round_trip_2mb_tensor_both_ways(broker, run_id, connect):
    coord = connect(MqttClient.for_coordinator(broker.url, run_id))
    node = connect(MqttClient.for_node(broker.url, run_id, "n1"))
    w = np.random.default_rng(0).normal(size=(500, 500))  # 2 MB of float64
    payload = _update(run_id, "n1", 5, w=w, mask=np.arange(10, dtype=np.int64))
    assert len(payload) > 4 * node.max_chunk_bytes  # travels as chunks
    node.publish(topics.up(run_id, "n1"), payload)
    got = _receive(coord, topics.UP)
    assert got is not None and got.node == "n1" and got.payload == payload
    assert got.message.round == 5 and got.message.sender == "n1"
    np.testing.assert_array_equal(got.message.tensors["w"], w)

    model = wire.encode({"run": run_id, "round": 6, "sender": "coordinator", "kind": "model"}, {"w": w * 2})
    coord.publish(topics.bcast(run_id), model)
    coord.publish(topics.down(run_id, "n1"), wire.encode(
        {"run": run_id, "round": 6, "sender": "coordinator", "kind": "lr"}, {"lr": np.array(0.1)}))
    got = _receive(node, topics.BCAST)
    np.testing.assert_array_equal(got.message.tensors["w"], w * 2)
    got = _receive(node, topics.DOWN)
    assert got.message.kind == "lr" and float(got.message.tensors["lr"]) == 0.1


def test_status_online_and_clean_close(broker, run_id, connect):
    coord = connect(MqttClient.for_coordinator(broker.url, run_id))
    node = MqttClient.for_node(broker.url, run_id, "n1").connect()
    assert _receive(coord, topics.STATUS, payload=topics.STATUS_ONLINE).node == "n1"
    node.close()
    assert _receive(coord, topics.STATUS, payload=topics.STATUS_OFFLINE).node == "n1"
    # retained: a coordinator that starts later still sees the node's last status
    late = connect(MqttClient(broker.url, client_id="late", run=run_id, subscriptions=[topics.all_status(run_id)]))
    assert _receive(late, topics.STATUS).payload == topics.STATUS_OFFLINE


def test_clients_closed_together_each_leave_cleanly(broker, run_id, connect):
    """close_all: the clients of one network loop (an emulated host's nodes) and one with its own
    thread each publish `offline` (retained, so no will follows) and disconnect; the loop serves
    none of them after."""
    coord = connect(MqttClient.for_coordinator(broker.url, run_id))
    loop = NetworkLoop()
    try:
        nodes = [MqttClient.for_node(broker.url, run_id, f"n{i}", network=loop, inbox=queue.Queue()).connect()
                 for i in range(4)]
        nodes.append(MqttClient.for_node(broker.url, run_id, "n4").connect())
        online = {_receive(coord, topics.STATUS, payload=topics.STATUS_ONLINE).node for _ in nodes}
        assert online == {f"n{i}" for i in range(5)}
        close_all(nodes)
        offline = [_receive(coord, topics.STATUS, payload=topics.STATUS_OFFLINE) for _ in nodes]
        assert sorted(m.node for m in offline) == [f"n{i}" for i in range(5)]
        assert all(n._paho is None and not n.connected for n in nodes) and not loop._served
        assert _receive(coord, topics.STATUS, timeout_s=NO_WILL_WINDOW_S) is None  # and no will after the statuses
    finally:
        loop.close()


def test_clients_connected_together_are_each_online(broker, run_id, connect):
    """connect_all: the clients of one network loop (an emulated host's nodes), at most two of them
    awaiting the broker at once, each connect, subscribe and say online, as connect() does."""
    coord = connect(MqttClient.for_coordinator(broker.url, run_id))
    loop, inbox = NetworkLoop(), queue.Queue()
    nodes = {f"node n{i}": MqttClient.for_node(broker.url, run_id, f"n{i}", network=loop, inbox=inbox) for i in range(5)}
    try:
        connect_all(nodes, 10.0, in_flight=2)
        assert all(n.connected and n.protocol in ("5", "3.1.1") for n in nodes.values())
        assert {_receive(coord, topics.STATUS, payload=topics.STATUS_ONLINE).node for _ in nodes} == {f"n{i}" for i in range(5)}
        coord.publish(topics.down(run_id, "n3"), wire.encode({"run": run_id, "round": 0, "sender": "coordinator",
                                                             "kind": "lr"}, {"lr": np.array(0.1)}))
        got = [inbox.get(timeout=5) for _ in range(len(nodes) + 1)]  # each sees the coordinator's status
        assert [(m.receiver, m.message.kind) for m in got if m.kind == topics.DOWN] == [("n3", "lr")]  # subscribed
        close_all(nodes.values())
    finally:
        loop.close()


def test_connect_all_keeps_at_most_in_flight_clients_awaiting_the_broker():
    """The next client starts once the oldest is connected; a client already started is skipped."""
    events, awaiting = [], set()

    class Fake:
        def __init__(self, name, started=False):
            self.name, self._paho = name, object() if started else None

        def _start_connect(self, timeout_s, probe_first):
            awaiting.add(self.name)
            events.append(("start", self.name, len(awaiting)))
            return self.name

        def _finish_connect(self, connecting):
            assert connecting == self.name
            awaiting.discard(self.name)
            events.append(("finish", self.name, len(awaiting)))

    clients = {f"c{i}": Fake(f"c{i}", started=i == 2) for i in range(6)}
    connect_all(clients, in_flight=2)  # type: ignore[arg-type]
    assert max(n for kind, _, n in events if kind == "start") == 2
    assert [e[:2] for e in events] == [("start", "c0"), ("start", "c1"), ("finish", "c0"), ("start", "c3"),
                                       ("finish", "c1"), ("start", "c4"), ("finish", "c3"), ("start", "c5"),
                                       ("finish", "c4"), ("finish", "c5")]
    with pytest.raises(ValueError, match="in_flight must be >= 1"):
        connect_all(clients, in_flight=0)  # type: ignore[arg-type]


def test_connect_all_names_the_client_the_broker_refused(secured_mosquitto, run_id):
    """A refusal (a wrong password) stays a BrokerRefused, its client's name first."""
    broker, pw = secured_mosquitto
    loop = NetworkLoop()
    nodes = {f"node {n}": MqttClient.for_node(broker.url, run_id, n, network=loop, inbox=queue.Queue(), username=n,
                                              password=pw[n] if n == "a" else "wrong")
             for n in ("a", "b")}
    try:
        with pytest.raises(BrokerRefused, match=r"^node b: broker .* refused client"):
            connect_all(nodes, 5.0)
        assert nodes["node a"].connected
    finally:
        close_all(nodes.values())
        loop.close()


def test_connect_all_names_the_client_that_failed():
    """A client the broker never answers fails as connect() fails, its name first."""
    loop = NetworkLoop()
    port = free_port()  # nobody listens: paho retries until the deadline
    nodes = {f"node {i}": MqttClient.for_node(f"mqtt://127.0.0.1:{port}", "r", str(i), network=loop,
                                               inbox=queue.Queue(), protocol="3.1.1") for i in range(2)}
    try:
        with pytest.raises(UserError, match=rf"^node 0: broker mqtt://127.0.0.1:{port} not reachable within 0.3 s$"):
            connect_all(nodes, 0.3, probe_first=False)
    finally:
        close_all(nodes.values())
        loop.close()


def test_a_client_whose_status_paho_refuses_is_left_to_its_will(broker, run_id, connect, monkeypatch):
    """close_all: when paho does not take a client's offline status, the others still leave
    cleanly, that client is not disconnected cleanly (its will says offline once its socket
    closes) and the error is raised, as MqttClient.close raises it."""
    coord = connect(MqttClient.for_coordinator(broker.url, run_id))
    loop = NetworkLoop()
    try:
        nodes = [MqttClient.for_node(broker.url, run_id, f"n{i}", network=loop, inbox=queue.Queue()).connect()
                 for i in range(3)]
        assert {_receive(coord, topics.STATUS, payload=topics.STATUS_ONLINE).node for _ in nodes} == {"n0", "n1", "n2"}

        def refused(*args, **kwargs):
            raise RuntimeError("publish failed: out of memory")

        monkeypatch.setattr(nodes[1], "_send", refused)
        with pytest.raises(RuntimeError, match="out of memory"):
            close_all(nodes)
        assert nodes[0]._paho is None and nodes[2]._paho is None and nodes[1]._paho is not None
        assert sorted(_receive(coord, topics.STATUS, payload=topics.STATUS_OFFLINE).node for _ in range(2)) == ["n0", "n2"]
    finally:
        closed = time.monotonic()
        loop.close()  # n1's socket closes without a DISCONNECT
    assert _receive(coord, topics.STATUS, payload=topics.STATUS_OFFLINE).node == "n1"
    took_s = time.monotonic() - closed
    assert took_s < NO_WILL_WINDOW_S, took_s  # the control: the no-will windows would have seen a will


_VICTIM = """
import sys, time
from testbed.mqtt.client import MqttClient
MqttClient.for_node(sys.argv[1], sys.argv[2], "victim").connect()
time.sleep(60)
"""


def test_last_will_when_node_is_killed(broker, run_id, connect):
    coord = connect(MqttClient.for_coordinator(broker.url, run_id))
    proc = subprocess.Popen([sys.executable, "-c", _VICTIM, broker.url, run_id])
    try:
        assert _receive(coord, topics.STATUS, timeout_s=10, payload=topics.STATUS_ONLINE).node == "victim"
        proc.send_signal(signal.SIGKILL)  # no DISCONNECT: the broker must publish the will
        offline = _receive(coord, topics.STATUS, payload=topics.STATUS_OFFLINE)
        assert offline is not None and offline.node == "victim"
    finally:
        proc.kill()
        proc.wait()


def test_reconnect_after_broker_restart(broker, run_id, connect):
    coord = connect(MqttClient.for_coordinator(broker.url, run_id, **FAST))
    node = connect(MqttClient.for_node(broker.url, run_id, "n1", **FAST))
    broker.stop()
    deadline = time.monotonic() + 5
    while (coord.connected or node.connected) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not coord.connected and not node.connected
    broker.start()  # same port
    deadline = time.monotonic() + 10
    while not (coord.connected and node.connected) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert coord.connected and node.connected
    # the broker lost every subscription: this arrives only if the coordinator resubscribed
    for _ in range(25):  # the node may be back before the coordinator's SUBACK; retry until seen
        node.publish(topics.up(run_id, "n1"), _update(run_id, "n1", 1, w=np.ones(3)))
        if (got := _receive(coord, topics.UP, timeout_s=0.2)) is not None:
            break
    assert got is not None and got.message.round == 1


def test_bad_messages_are_rejected_and_logged_not_raised(broker, run_id, connect, caplog):
    coord = connect(MqttClient.for_coordinator(broker.url, run_id))
    raw = _raw_client(broker.url)
    try:
        good = _update(run_id, "n1", 2, w=np.ones(4))
        nan = bytearray(good)
        nan[-8:] = np.array([np.nan]).tobytes()
        bad = [
            (topics.up(run_id, "n1"), b"garbage!" * 4),
            (topics.up(run_id, "n1"), _update(run_id, "n2")),  # n1 publishing as n2
            (topics.up(run_id, "n1"), _update("otherrun", "n1")),
            (topics.up(run_id, "n1"), bytes(nan)),
            (topics.up(run_id, "n1"), chunks.chunk(good, 100)[0][:20]),  # torn chunk header
            (topics.up(run_id, "n1"), good[:-3]),
        ]
        with caplog.at_level(logging.WARNING, logger="testbed.mqtt.client"):
            for topic, payload in bad:
                raw.publish(topic, payload, qos=1).wait_for_publish(5)
            raw.publish(topics.up(run_id, "n1"), good, qos=1).wait_for_publish(5)
            raw.publish(topics.up(run_id, "n1"), good, qos=1).wait_for_publish(5)  # replayed
            raw.publish(topics.up(run_id, "n1"), _update(run_id, "n1", 3), qos=1).wait_for_publish(5)
            first, second = _receive(coord, topics.UP), _receive(coord, topics.UP)
        assert first.payload == good and second.message.round == 3  # the replay was dropped
        assert coord.rejected == len(bad) + 1
        rejections = [r.getMessage() for r in caplog.records if "rejected" in r.getMessage()]
        assert len(rejections) == len(bad) + 1
        assert all("from n1" in r for r in rejections)
        codes = ["bad_magic", "wrong_sender", "wrong_run", "non_finite", "bad_chunk", "size_mismatch", "replay"]
        assert [c for r in rejections for c in codes if f"{c}:" in r] == codes
    finally:
        raw.disconnect()
        raw.loop_stop()


# ---- Mosquitto only: ACLs and TLS ---------------------------------------------------------------


def _node(broker, run_id, node, passwords, **kwargs):
    return MqttClient.for_node(broker.url, run_id, node, username=node, password=passwords[node], **kwargs)


@pytest.mark.parametrize("protocol", ["5", "3.1.1"])
def test_acl_node_cannot_publish_as_another_node(secured_mosquitto, run_id, connect, protocol):
    broker, pw = secured_mosquitto
    coord = connect(MqttClient.for_coordinator(broker.url, run_id, username="coordinator",
                                               password=pw["coordinator"], protocol=protocol))
    a = connect(_node(broker, run_id, "a", pw, protocol=protocol))
    forged = _update(run_id, "b", 0, w=np.ones(2))
    if protocol == "5":  # v5 PUBACK says "not authorized"
        with pytest.raises(BrokerRefused, match="Not authorized"):
            a.publish(topics.up(run_id, "b"), forged)
    else:  # 3.1.1 cannot say no: the broker acknowledges and drops
        a.publish(topics.up(run_id, "b"), forged)
    a.publish(topics.up(run_id, "a"), _update(run_id, "a", 0, w=np.ones(2)))
    got = _receive(coord, topics.UP)
    assert got.node == "a"  # and nothing from "b" came before it
    assert _receive(coord, topics.UP, timeout_s=0.3) is None


def test_acl_node_cannot_read_another_nodes_downlink(secured_mosquitto, run_id, connect):
    broker, pw = secured_mosquitto
    coord = connect(MqttClient.for_coordinator(broker.url, run_id, username="coordinator", password=pw["coordinator"]))
    b = connect(_node(broker, run_id, "b", pw))
    # node a, with its own credentials, subscribes to b's downlink too
    spy = connect(MqttClient(broker.url, client_id="spy", run=run_id, username="a", password=pw["a"],
                             subscriptions=[topics.down(run_id, "b"), topics.down(run_id, "a")]))
    msg = wire.encode({"run": run_id, "round": 0, "sender": "coordinator", "kind": "model"}, {"w": np.ones(2)})
    coord.publish(topics.down(run_id, "b"), msg)
    assert _receive(b, topics.DOWN).payload == msg
    coord.publish(topics.down(run_id, "a"), msg)
    got = _receive(spy, topics.DOWN)
    assert got.node == "a"  # its own downlink arrives, b's never did
    assert _receive(spy, topics.DOWN, timeout_s=0.3) is None


def test_acl_rejects_bad_credentials(secured_mosquitto, run_id):
    broker, pw = secured_mosquitto
    with pytest.raises(BrokerRefused):
        MqttClient.for_node(broker.url, run_id, "a", username="a", password="wrong").connect(timeout_s=5)
    with pytest.raises(BrokerRefused):
        MqttClient.for_node(broker.url, run_id, "a").connect(timeout_s=5)  # anonymous


def test_acl_credentials_from_url(secured_mosquitto, run_id, connect):
    broker, pw = secured_mosquitto
    url = broker.url.replace("mqtt://", f"mqtt://a:{pw['a']}@")
    assert connect(MqttClient.for_node(url, run_id, "a")).connected


def test_mosquitto_tls(start_mosquitto, tls_files, run_id):
    broker = start_mosquitto(tls=tls_files)
    assert broker.url.startswith("mqtts://")
    cert = tls_files.cafile
    with MqttClient.for_coordinator(broker.url, run_id, tls_ca=cert) as coord, \
            MqttClient.for_node(broker.url, run_id, "n1", tls_ca=cert) as node:
        node.publish(topics.up(run_id, "n1"), _update(run_id, "n1", 0, w=np.ones(3)))
        assert _receive(coord, topics.UP).node == "n1"


def test_mosquitto_tls_untrusted_certificate_is_said_at_once(start_mosquitto, tls_files, run_id):
    """Without the CA the broker's certificate fails verification: a clear error, not a timeout."""
    broker = start_mosquitto(tls=tls_files)
    start = time.monotonic()
    with pytest.raises(UserError, match="TLS certificate not trusted.*tls_ca"):
        MqttClient.for_node(broker.url, run_id, "n1").connect(timeout_s=20)
    assert time.monotonic() - start < 5


def test_network_loop_serves_clients_beyond_select_limit(broker, run_id, connect):
    """A shared NetworkLoop (epoll) serves sockets numbered above 1023, where paho's own select()
    loop cannot go, and carries chunked messages larger than paho's in-flight window both ways."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1300:
        pytest.skip(f"hard limit of {hard} open files")
    coord = connect(MqttClient.for_coordinator(broker.url, run_id))  # its paho thread uses select()
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1300), hard))
    filler = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100 - len(os.listdir("/proc/self/fd")))]
    loop = NetworkLoop()
    inbox: queue.Queue = queue.Queue()
    nodes: list[MqttClient] = []
    try:
        nodes += [connect(MqttClient.for_node(broker.url, run_id, f"n{i}", network=loop, inbox=inbox,
                                             max_chunk_bytes=32 * 1024)) for i in range(4)]
        assert min(n._paho.socket().fileno() for n in nodes) > 1024
        big = np.arange(300_000, dtype=np.float64)  # 2.4 MB: 74 chunks, over 20 in flight
        nodes[0].publish(topics.up(run_id, "n0"), _update(run_id, "n0", 0, w=big))
        for n in nodes[1:]:
            n.publish(topics.up(run_id, n.owner), _update(run_id, n.owner, 0, w=np.ones(3)))
        got = {}
        for _ in nodes:
            m = _receive(coord, topics.UP)
            got[m.node] = m.message.tensors["w"]
        assert sorted(got) == ["n0", "n1", "n2", "n3"] and np.array_equal(got["n0"], big)
        bcast = wire.encode({"run": run_id, "round": 1, "sender": "coordinator", "kind": "round"}, {"w": big})
        coord.publish(topics.bcast(run_id), bcast)
        receivers = set()
        deadline = time.monotonic() + 10
        while len(receivers) < len(nodes) and time.monotonic() < deadline:
            m = inbox.get(timeout=max(0.0, deadline - time.monotonic()))
            if m.kind == topics.BCAST and m.payload == bcast:
                receivers.add(m.receiver)
        assert receivers == {"n0", "n1", "n2", "n3"}
    finally:
        for n in nodes:
            n.close()
        loop.close()
        for fd in filler:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.fixture(params=["forked", "new-interpreter"])
def broker_launch(request):
    """How BrokerProcess starts its child: a fork of this process, as a run's coordinator does
    where it can, or its default, a new interpreter; and the type of child it then holds."""
    from testbed.orchestration.coordinator import _fork_broker
    from testbed.util.forked import ForkedCommand

    return (_fork_broker, ForkedCommand) if request.param == "forked" else (None, subprocess.Popen)


def test_broker_process_serves_and_stops(run_id, connect, broker_launch):
    launch, child_type = broker_launch
    with BrokerProcess(launch=launch) as broker:
        assert isinstance(broker._proc, child_type)
        client = connect(MqttClient.for_node(broker.url, run_id, "n1", **FAST))
        client.publish(topics.up(run_id, "n1"), wire.encode({"run": run_id, "round": 0, "sender": "n1", "kind": "k"}))
        client.close()
        url = parse_broker_url(broker.url)
    deadline = time.monotonic() + 5
    while accepts_tcp(url.host, url.port) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not accepts_tcp(url.host, url.port)


@pytest.mark.parametrize("launch", ["_fork_broker", "None"], ids=["forked", "new-interpreter"])
def test_broker_process_leaves_with_its_parent(launch):
    """A coordinator killed outright leaves no broker behind: the child watches its parent."""
    port = free_port()
    parent = subprocess.run([sys.executable, "-c", f"""
import os
from testbed.mqtt.brokers.embedded import BrokerProcess
from testbed.orchestration.coordinator import _fork_broker
b = BrokerProcess(launch={launch})
b.port = {port}
b.start()
os._exit(0)  # no stop(): as a SIGKILL would leave it
"""], capture_output=True, text=True, timeout=60)
    assert parent.returncode == 0, parent.stderr
    deadline = time.monotonic() + 5
    while accepts_tcp("127.0.0.1", port) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not accepts_tcp("127.0.0.1", port)


def test_broker_process_that_cannot_start_says_why(broker_launch):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))  # bound, not listening: the child's bind fails, nothing accepts
        broker = BrokerProcess(start_timeout_s=20, launch=broker_launch[0])
        broker.port = taken.getsockname()[1]
        with pytest.raises(UserError, match="did not start: .*(in use|Errno 98)"):
            broker.start()

