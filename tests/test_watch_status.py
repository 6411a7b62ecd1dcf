"""`testbed watch` over MQTT: the read-only `watch` user of `testbed acl` on a Mosquitto with the
run's ACL follows the nodes' status topics and nothing else."""

from __future__ import annotations

import json
import threading
from types import SimpleNamespace

import paho.mqtt.client as paho
import pytest

from testbed.mqtt import acl, topics
from testbed.mqtt.broker import parse_broker_url
from testbed.mqtt.brokers import mosquitto
from testbed.mqtt.client import MqttClient
from testbed.watch.status import StatusListener, watch_credentials

from conftest import wait_until


def _subscribed(client: paho.Client, topic: str) -> None:
    """Subscribe ``client`` to ``topic``; return on the broker's answer. The broker sends a client's
    packets in order: what it sent the client before that answer has been taken in by then."""
    answered = threading.Event()
    client.on_subscribe = lambda *args: answered.set()
    client.subscribe(topic, qos=1)
    assert answered.wait(30), f"the broker never answered the subscription to {topic}"


@pytest.mark.slow
def test_watch_user_follows_status_and_reads_nothing_else(tmp_path, run_id, start_mosquitto):
    access = acl.generate_access(run_id, ["0", "1"])
    passwords = dict(access.passwords)
    broker = start_mosquitto(acl_file=mosquitto.write_acl_file(tmp_path / "acl", access.grants),
                             password_file=mosquitto.write_password_file(tmp_path / "passwords", passwords))
    creds = tmp_path / "credentials.json"
    creds.write_text(json.dumps(passwords))
    mqtt = SimpleNamespace(broker_url=broker.url, run_id=run_id, credentials=str(creds), tls_ca=None, protocol="auto")
    seen: list[tuple[int, bool]] = []
    coordinator: list[bool] = []
    lock = threading.Lock()

    def on_node(node: int, online: bool) -> None:
        with lock:
            seen.append((node, online))

    node = MqttClient.for_node(broker.url, run_id, "0", username="0", password=passwords["0"])
    # First the watch user's credentials in a plain client, trying what its ACL forbids. (Client ids
    # are bound to usernames: one `watch` client at a time, so before the listener connects.)
    u = parse_broker_url(broker.url)
    snoop = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id="watch-snoop", protocol=paho.MQTTv311)
    snoop.username_pw_set(acl.WATCH_USER, passwords[acl.WATCH_USER])
    snooped: list[str] = []
    snoop.on_message = lambda c, userdata, msg: snooped.append(msg.topic)
    snoop.connect(u.host, u.port)
    snoop.loop_start()
    # The control: the coordinator's credentials read the same update; it reaches them, so it would
    # have reached the watch user had the ACL let it.
    reader = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id="coordinator", protocol=paho.MQTTv311)
    reader.username_pw_set("coordinator", passwords["coordinator"])
    read: list[str] = []
    reader.on_message = lambda c, userdata, msg: read.append(msg.topic)
    reader.connect(u.host, u.port)
    reader.loop_start()
    listener = None
    try:
        _subscribed(snoop, topics.all_up(run_id))
        _subscribed(reader, topics.all_up(run_id))
        node.connect()
        node.publish(topics.up(run_id, "0"), b"an update", timeout_s=5)  # not for the watch user's eyes
        wait_until(lambda: read, 30, "the update at the control reader")
        snoop.publish(topics.status(run_id, "1"), topics.STATUS_ONLINE, qos=1, retain=True).wait_for_publish(5)
        _subscribed(snoop, topics.all_up(run_id))  # whatever the broker sent the snoop before has come
        snoop.disconnect()
        snoop.loop_stop()
        assert snooped == [] and read == [topics.up(run_id, "0")]
        listener = StatusListener(mqtt, on_node, coordinator.append).start()
        wait_until(lambda: (0, True) in seen, 10, "node 0 online (its retained status)")
        node.publish(topics.status(run_id, "0"), b"garbage", timeout_s=5)  # not a declared status
        wait_until(lambda: listener.router.dropped == 1, 10, "the garbage status dropped")
        assert (0, False) not in seen  # never read as offline
        node.close()
        wait_until(lambda: (0, False) in seen, 10, "node 0 offline")
        # A retained status "1" would have come on subscribing, before node 0's live `offline`
        assert all(n == 0 for n, _ in seen), seen  # the watch user's own status publish was refused
    finally:
        snoop.loop_stop()
        reader.disconnect()
        reader.loop_stop()
        node.close()
        if listener is not None:
            listener.close()


def test_watch_credentials(tmp_path):
    assert watch_credentials(None) == (None, None)
    path = tmp_path / "c.json"
    path.write_text(json.dumps({"coordinator": "x"}))
    with pytest.raises(ValueError, match="no 'watch' user"):
        watch_credentials(str(path))
    path.write_text(json.dumps({"watch": "pw"}))
    assert watch_credentials(str(path)) == ("watch", "pw")
