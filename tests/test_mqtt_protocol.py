"""Brokers other than ours: one that closes an MQTT v5 CONNECT without a CONNACK (RabbitMQ's MQTT
plugin, 3.1.1 only) gets 3.1.1 at once with protocol "auto", and a clear error with "5" forced.
First against a loopback stand-in that drops v5 CONNECTs and proxies 3.1.1 ones to the embedded
broker; then, where rabbitmq-server is installed, against a private RabbitMQ on loopback (the
quickstart runs over it with the same numbers as sim). Network: 127.0.0.1 only."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from testbed.errors import UserError
from testbed.mqtt import wire
from testbed.mqtt import topics
from testbed.mqtt.broker import free_port, parse_broker_url
from testbed.mqtt.client import MqttClient

from conftest import REPO, require_command, require_tool


class V5Dropper:
    """A TCP listener on 127.0.0.1 that reads each connection's CONNECT: protocol level 5 is closed
    without a CONNACK (as RabbitMQ 3.10 does), anything else is proxied to `upstream`."""

    def __init__(self, upstream: str):
        u = parse_broker_url(upstream)
        self.upstream = (u.host, u.port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"mqtt://127.0.0.1:{self.listener.getsockname()[1]}"
        self.dropped = 0  # v5 CONNECTs closed
        self.proxied = 0
        self._sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self._sockets.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            first = conn.recv(2)  # fixed header: type, first byte of the remaining length
            head = first + conn.recv(16)
            level = head[8] if len(head) > 8 and head[0] == 0x10 else None  # after 0x10, len, 00 04 "MQTT"
            if level == 5:
                self.dropped += 1
                conn.close()
                return
            up = socket.create_connection(self.upstream)
            self._sockets.append(up)
            self.proxied += 1
            up.sendall(head)
            threading.Thread(target=_pump, args=(up, conn), daemon=True).start()
            _pump(conn, up)
        except OSError:
            conn.close()

    def close(self) -> None:
        self.listener.close()
        for s in self._sockets:
            try:
                s.close()
            except OSError:
                pass


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


@pytest.fixture
def v5_dropper(embedded_broker) -> Iterator[V5Dropper]:
    proxy = V5Dropper(embedded_broker.url)
    yield proxy
    proxy.close()


def _round_trip(url: str, run_id: str, connect) -> tuple[MqttClient, MqttClient]:
    coord = connect(MqttClient.for_coordinator(url, run_id), timeout_s=30)
    node = connect(MqttClient.for_node(url, run_id, "n1"), timeout_s=30)
    node.publish(topics.up(run_id, "n1"),
                 wire.encode({"run": run_id, "round": 0, "sender": "n1", "kind": "update"}, {"w": np.ones(3)}))
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        got = coord.receive(0.5)
        if got is not None and got.kind == topics.UP:
            assert got.node == "n1" and np.array_equal(got.message.tensors["w"], np.ones(3))
            return coord, node
    raise AssertionError("no uplink message through the broker")


def test_auto_falls_back_to_311_when_v5_connect_is_closed(v5_dropper, run_id, connect):
    start = time.monotonic()
    coord, node = _round_trip(v5_dropper.url, run_id, connect)
    assert coord.protocol == node.protocol == "3.1.1"
    assert v5_dropper.dropped >= 1 and v5_dropper.proxied >= 2
    assert time.monotonic() - start < 5  # not the 30 s connect timeout


def test_forced_v5_on_a_broker_that_closes_it_is_said_at_once(v5_dropper, run_id):
    start = time.monotonic()
    with pytest.raises(UserError, match=r'does not speak v5; set mqtt.protocol / --protocol to "3.1.1"'):
        MqttClient.for_node(v5_dropper.url, run_id, "n1", protocol="5").connect(timeout_s=30)
    assert time.monotonic() - start < 3


def test_forced_311_goes_straight_through(v5_dropper, run_id, connect):
    node = connect(MqttClient.for_node(v5_dropper.url, run_id, "n1", protocol="3.1.1"), timeout_s=10)
    assert node.protocol == "3.1.1" and v5_dropper.dropped == 0


def test_bad_protocol_value_names_the_key(run_id):
    from testbed.errors import ConfigError

    with pytest.raises(ConfigError, match="mqtt.protocol: must be one of auto, 5, 3.1.1"):
        MqttClient.for_node("mqtt://127.0.0.1:1883", run_id, "n1", protocol="4")


# ---- a real RabbitMQ, where installed --------------------------------------------------------

RABBIT = Path("/usr/lib/rabbitmq/bin/rabbitmq-server")


@pytest.fixture(scope="module")
def rabbitmq() -> Iterator[str]:
    """A private RabbitMQ with the MQTT plugin, every listener on 127.0.0.1, in a temporary
    directory; yields its MQTT URL. Where rabbitmq-server is not installed or does not start, skips
    (fails under CI=true, where .ci/run installs it)."""
    exe = RABBIT if RABBIT.exists() else require_command("rabbitmq-server", "apt-get install rabbitmq-server")
    base = Path(tempfile.mkdtemp(prefix="tb-rabbitmq-"))
    mqtt_port, dist_port = free_port(), free_port()
    (base / "rabbitmq.conf").write_text(
        "listeners.tcp = none\n"  # no AMQP listener: MQTT only
        f"mqtt.listeners.tcp.1 = 127.0.0.1:{mqtt_port}\n"
        "mqtt.allow_anonymous = true\nloopback_users = none\n")
    (base / "enabled_plugins").write_text("[rabbitmq_mqtt].\n")
    env = {**os.environ, "HOME": str(base), "RABBITMQ_MNESIA_BASE": str(base / "mnesia"),
           "RABBITMQ_LOG_BASE": str(base / "log"), "RABBITMQ_CONFIG_FILE": str(base / "rabbitmq.conf"),
           "RABBITMQ_ENABLED_PLUGINS_FILE": str(base / "enabled_plugins"),
           "RABBITMQ_NODENAME": f"tb{mqtt_port}@localhost", "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
           "RABBITMQ_DIST_PORT": str(dist_port), "ERL_EPMD_ADDRESS": "127.0.0.1",
           "RABBITMQ_PID_FILE": str(base / "pid"),
           "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}"}
    epmd_before = _listening(4369)
    log = open(base / "server.log", "wb")
    proc = subprocess.Popen([str(exe)], env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                socket.create_connection(("127.0.0.1", mqtt_port), timeout=0.5).close()
                break
            except OSError:
                time.sleep(0.25)
        else:
            require_tool("rabbitmq-server", False, "did not start: " + " ".join((base / "server.log").read_text()[-500:].split()))
        yield f"mqtt://127.0.0.1:{mqtt_port}"
    finally:
        # The server script runs the Erlang VM as a child: stop the whole session we started.
        try:
            os.killpg(proc.pid, 15)
            proc.wait(20)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, 9)
            except ProcessLookupError:
                pass
        log.close()
        shutil.rmtree(base, ignore_errors=True)
        if not epmd_before and shutil.which("epmd"):  # the Erlang port mapper our server started
            subprocess.run(["epmd", "-kill"], env={**os.environ, "ERL_EPMD_ADDRESS": "127.0.0.1"},
                           capture_output=True, timeout=10)


def _listening(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


def test_rabbitmq_auto_uses_311(rabbitmq, run_id, connect):
    start = time.monotonic()
    coord, node = _round_trip(rabbitmq, run_id, connect)
    assert coord.protocol == node.protocol == "3.1.1"
    assert time.monotonic() - start < 10


def test_quickstart_over_rabbitmq_matches_sim(rabbitmq, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    runs = {}
    for name, extra in (("rabbitmq", ["--set", f"mqtt.broker_url='{rabbitmq}'", "--set", "mqtt.run_id='rq'"]),
                        ("sim", ["--mode", "sim"])):
        out = tmp_path / name
        done = subprocess.run([sys.executable, "-m", "testbed", "run", "experiments/quickstart.toml", "--quiet",
                               "--out", str(out), *extra], cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, done.stderr
        runs[name] = json.loads((out / "summary.json").read_text())
    assert runs["rabbitmq"]["mode"] == "mqtt" and runs["rabbitmq"]["status"] == "completed"
    assert runs["rabbitmq"]["final"] == pytest.approx(runs["sim"]["final"], abs=1e-6)
    assert runs["rabbitmq"]["rounds"] == runs["sim"]["rounds"]


@pytest.mark.parametrize("name,index", [("0", 0), ("17", 17), ("03", None), (" 3", None), ("1_0", None), ("-1", None),
                                        ("\u0663", None), ("channel", None), ("", None), (None, None)])
def test_a_node_is_named_on_a_topic_by_its_decimal_digits_only(name, index):
    """int() reads " 3", "1_0", "03" and Arabic-Indic digits as node ids: a topic of another spelling
    would speak for that node."""
    assert topics.node_index(name) == index
