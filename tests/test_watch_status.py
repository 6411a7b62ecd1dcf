"""`testbed watch` over MQTT: the read-only `watch` user of `testbed acl` on a Mosquitto with the
run's ACL follows the nodes' status topics and nothing else."""

from __future__ import annotations

import json
import threading
import time
from types import SimpleNamespace

import paho.mqtt.client as paho
import pytest

from testbed.mqtt import acl, topics
from testbed.mqtt.broker import parse_broker_url
from testbed.mqtt.client import MqttClient
from testbed.watch.status import StatusListener, watch_credentials


def _wait(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@pytest.mark.slow
def test_watch_user_follows_status_and_reads_nothing_else(tmp_path, run_id, start_mosquitto):
    acl_text, passwords = acl.generate_acl(run_id, ["0", "1"])
    broker = start_mosquitto(acl_file=acl.write_acl_file(tmp_path / "acl", acl_text),
                             password_file=acl.write_password_file(tmp_path / "passwords", passwords))
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
    listener = None
    try:
        snoop.subscribe(topics.all_up(run_id), qos=1)
        node.connect()
        node.publish(topics.up(run_id, "0"), b"an update", timeout_s=5)  # not for the watch user's eyes
        snoop.publish(topics.status(run_id, "1"), topics.STATUS_ONLINE, qos=1, retain=True).wait_for_publish(5)
        time.sleep(0.3)
        snoop.disconnect()
        snoop.loop_stop()
        assert snooped == []
        listener = StatusListener(mqtt, on_node, coordinator.append).start()
        _wait(lambda: (0, True) in seen, 10, "node 0 online (its retained status)")
        node.publish(topics.status(run_id, "0"), b"garbage", timeout_s=5)  # not a declared status
        _wait(lambda: listener.router.dropped == 1, 10, "the garbage status dropped")
        assert (0, False) not in seen  # never read as offline
        node.close()
        _wait(lambda: (0, False) in seen, 10, "node 0 offline")
        time.sleep(0.3)
        assert all(n == 0 for n, _ in seen), seen  # the watch user's own status publish was refused
    finally:
        snoop.loop_stop()
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
