"""The MQTT session belongs to its owner: with the Mosquitto configuration `testbed acl` prints
(`use_username_as_clientid` on the listener), a node's credentials connecting under the
coordinator's client id cannot disconnect the coordinator; without the binding they can (the
control, which shows the test would see a takeover). Our clients cope with the binding: every
client logs in under its own username, so the ids the broker gives them never collide.
Network: 127.0.0.1 only."""

from __future__ import annotations

import json
import logging
import threading
import time

import numpy as np
import paho.mqtt.client as paho
import pytest

from testbed import cli
from testbed.mqtt import wire
from testbed.mqtt import topics
from testbed.mqtt.broker import parse_broker_url
from testbed.mqtt.brokers.mosquitto import BIND_CLIENT_IDS
from testbed.mqtt.client import MqttClient

from conftest import wait_until

TAKEOVER_NOTICED_S = 1.0  # the coordinator's client notices a takeover well within this (the control)


@pytest.fixture
def acl_files(tmp_path, run_id, capsys):
    """What `testbed acl --nodes 2` wrote and printed: (secrets dir, {user: password}, printed text)."""
    secrets = tmp_path / "secrets"
    assert cli.main(["acl", "--run", run_id, "--nodes", "2", "--out", str(secrets)]) == 0
    printed = capsys.readouterr().out
    return secrets, json.loads((secrets / "credentials.json").read_text()), printed


def test_acl_prints_the_binding_on_the_listener(acl_files):
    _, _, printed = acl_files
    lines = [line.strip() for line in printed.splitlines()]
    assert lines.index(BIND_CLIENT_IDS) == lines.index("listener 1883") + 1
    assert "allow_anonymous false" in lines


def _take_over(url: str, client_id: str, username: str, password: str) -> paho.Client:
    """Connect a bare paho client (3.1.1, so no probe of ours in between) with `client_id`; return
    once the broker answered its CONNECT: a takeover, if the broker allows one, has happened then."""
    u = parse_broker_url(url)
    thief = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=paho.MQTTv311)
    thief.username_pw_set(username, password)
    answered = threading.Event()
    thief.on_connect = lambda client, userdata, flags, code, props: answered.set()
    thief.connect(u.host, u.port)
    thief.loop_start()
    assert answered.wait(30), "the broker never answered the thief's CONNECT"
    return thief


def _uplink_arrives(coord: MqttClient, node: MqttClient, run_id: str) -> bool:
    payload = wire.encode({"run": run_id, "round": 0, "sender": node.owner, "kind": "update"}, {"w": np.ones(2)})
    node.publish(topics.up(run_id, node.owner), payload)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        got = coord.receive(0.2)
        if got is not None and got.kind == topics.UP and got.payload == payload:
            return True
    return False


@pytest.mark.parametrize("bound", [True, False], ids=["bound", "unbound-control"])
def test_node_credentials_cannot_take_over_the_coordinator(start_mosquitto, acl_files, run_id, connect,
                                                           caplog, bound):
    secrets, pw, _ = acl_files
    broker = start_mosquitto(acl_file=secrets / "acl", password_file=secrets / "passwords", bind_client_ids=bound)
    coord = connect(MqttClient.for_coordinator(broker.url, run_id, username="coordinator",
                                               password=pw["coordinator"], reconnect_min_s=5, reconnect_max_s=5))
    node = connect(MqttClient.for_node(broker.url, run_id, "1", username="1", password=pw["1"]))
    caplog.set_level(logging.WARNING, logger="testbed.mqtt.client")
    thief = _take_over(broker.url, coord.client_id, "0", pw["0"])  # node 0's credentials

    def lost() -> list[logging.LogRecord]:
        return [r for r in caplog.records if "lost connection" in r.getMessage() and coord.client_id in r.getMessage()]

    try:
        if bound:
            # The broker logs a takeover as it answers the CONNECT (the control shows it): the log
            # is checked after the answer. The coordinator's own client is given the control's time.
            assert "already connected, closing old connection" not in broker.log_text()
            time.sleep(TAKEOVER_NOTICED_S)
            assert coord.connected and not lost()
            assert _uplink_arrives(coord, node, run_id)  # the coordinator still serves the run
        else:  # the control: the same attempt without the binding kicks the coordinator off
            assert "already connected, closing old connection" in broker.log_text()
            noticed = time.monotonic()
            wait_until(lost, 30, "the coordinator's client to notice it was kicked off")
            took_s = time.monotonic() - noticed
            assert took_s < TAKEOVER_NOTICED_S, took_s  # the bound case's wait would have seen it
    finally:
        thief.disconnect()
        thief.loop_stop()


def test_our_clients_cope_with_bound_ids(start_mosquitto, acl_files, run_id, connect):
    """Coordinator, channel and nodes, each under its own username, all stay connected side by
    side, and reconnects keep working, when the broker replaces every client id by the username."""
    secrets, pw, _ = acl_files
    broker = start_mosquitto(acl_file=secrets / "acl", password_file=secrets / "passwords")
    assert broker.bind_client_ids
    coord = connect(MqttClient.for_coordinator(broker.url, run_id, username="coordinator", password=pw["coordinator"]))
    channel = connect(MqttClient.for_channel(broker.url, run_id, username="channel", password=pw["channel"]))
    nodes = [connect(MqttClient.for_node(broker.url, run_id, n, username=n, password=pw[n])) for n in ("0", "1")]
    # Each connect returned on the broker's answer, when a takeover would have been logged (below);
    # a client kicked off notices within TAKEOVER_NOTICED_S (the control above)
    time.sleep(TAKEOVER_NOTICED_S)
    assert all(c.connected for c in (coord, channel, *nodes))
    assert all(_uplink_arrives(coord, n, run_id) for n in nodes)
    log = broker.log_text()
    for user in ("coordinator", "channel", "0", "1"):
        assert f"as {user} (" in log  # the broker knows each client by its username
    assert "closing old connection" not in log


def test_client_ids_are_not_predictable(run_id):
    a = MqttClient.for_node("mqtt://127.0.0.1:1883", run_id, "n1")
    b = MqttClient.for_node("mqtt://127.0.0.1:1883", run_id, "n1")
    c = MqttClient.for_coordinator("mqtt://127.0.0.1:1883", run_id)
    assert a.client_id != b.client_id
    assert a.client_id.startswith(f"tb-{run_id}-n1-") and c.client_id.startswith(f"tb-{run_id}-coordinator-")
    assert len(a.client_id.rsplit("-", 1)[1]) == 16  # 64 random bits
