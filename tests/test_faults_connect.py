"""Fault class: the broker is not there. A connection refused (nothing listens on the port) and a
host name that does not resolve are one line within a few seconds, for a client, the coordinator,
`testbed node` and `testbed bridge`, whatever the connect timeout; a broker being started is still
waited for (the grace), and a port that accepts but never answers, or drops the SYN, still gets
the whole connect timeout. The state lines of `testbed node` and `testbed bridge` (nodes.state_lines)
are tested here too, with a broker that goes away and comes back."""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from nodes.state_lines import StateLines
from testbed.assembly.config import load_config_text
from testbed.errors import UserError
from testbed.mqtt import probe
from testbed.mqtt.broker import free_port
from testbed.mqtt.client import MqttClient
from testbed.orchestration.runner import run_experiment

from conftest import REPO

#: A refused connection is reported after the grace; the rest is the machine's slack.
FAST_S = probe.FAST_FAILURE_GRACE_S + 2.0
#: ...and a new interpreter's start-up on top, for the commands.
COMMAND_S = FAST_S + 6.0
UNKNOWN_HOST = "no-such-host.invalid"  # RFC 2606: never resolves


def _refused(scheme: str = "mqtt") -> str:
    return f"{scheme}://127.0.0.1:{free_port()}"


@pytest.mark.parametrize("url, said", [
    (_refused(), "connection refused for 3 s (nothing listens on port"),
    (_refused("mqtts"), "connection refused for 3 s (nothing listens on port"),
    (f"mqtt://{UNKNOWN_HOST}:1883", f"unknown host '{UNKNOWN_HOST}'"),
    (f"mqtts://{UNKNOWN_HOST}:8883", f"unknown host '{UNKNOWN_HOST}'"),
], ids=["refused", "refused-tls", "unknown-host", "unknown-host-tls"])
def test_a_client_learns_in_one_line_within_seconds_not_at_its_timeout(url, said):
    start = time.monotonic()
    with pytest.raises(UserError) as err:
        MqttClient.for_node(url, "r", "n1").connect(timeout_s=60)
    took = time.monotonic() - start
    assert said in str(err.value) and "not reachable" in str(err.value) and "\n" not in str(err.value)
    assert took < FAST_S


@pytest.mark.parametrize("url", [_refused(), f"mqtt://{UNKNOWN_HOST}:1883"], ids=["refused", "unknown-host"])
def test_the_coordinator_learns_in_one_line_within_seconds(tmp_path, small_config_text, url, board_keys):
    config = load_config_text(small_config_text.replace("[output]", f'[mqtt]\nbroker_url = "{url}"\n'
                                                        f'emulated = false\nconnect_timeout_s = 60\n'
                                                        f'keys = "{board_keys}"\n[output]')
                              .replace('[run]', '[run]\nmode = "mqtt"'))
    start = time.monotonic()
    with pytest.raises(UserError, match="not reachable: ") as err:
        run_experiment(config, out_dir=tmp_path / "run", quiet=True)
    assert time.monotonic() - start < FAST_S and "\n" not in str(err.value)


@pytest.mark.parametrize("command", [
    ["node", "--node-id", "3"],
    ["bridge", "--serial", "loop://", "--node-id", "3"],
])
@pytest.mark.parametrize("broker, said", [
    (_refused(), "connection refused for 3 s"),
    (f"mqtts://{UNKNOWN_HOST}:8883", "unknown host"),
], ids=["refused", "unknown-host-tls"])
def test_node_and_bridge_say_connecting_then_fail_in_one_line(tmp_path, command, broker, said, board_keys):
    start = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "testbed", *command, "--broker", broker,
                           "--state-dir", str(tmp_path / "state")], cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    assert time.monotonic() - start < COMMAND_S
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("testbed: node 3: broker ") and said in done.stderr
    assert done.stdout.endswith(f"node 3: connecting to {broker}\n") and done.stdout.count("\n") == 1


def _blackholed() -> tuple[socket.socket, list[socket.socket]]:
    """A listening port whose accept queue is full: the kernel drops every further SYN."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(0)
    held = [socket.create_connection(server.getsockname(), timeout=2)]  # fills the queue of one
    return server, held


def _silent() -> tuple[socket.socket, list[socket.socket]]:
    """A port that accepts every connection and never says a word (a broker stuck, or slow)."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(server.accept()[0])
            except OSError:
                return

    threading.Thread(target=accept, daemon=True).start()
    return server, held


@pytest.mark.parametrize("make, said", [(_blackholed, "cannot connect: timed out"),
                                        (_silent, "the server accepted the connection but did not answer an MQTT CONNECT")])
@pytest.mark.parametrize("timeout_s", [1.5, 4.0])
def test_a_port_that_accepts_but_never_answers_gets_the_whole_timeout(make, said, timeout_s):
    server, held = make()
    try:
        start = time.monotonic()
        with pytest.raises(UserError) as err:
            MqttClient.for_node(f"mqtt://127.0.0.1:{server.getsockname()[1]}", "r", "n1").connect(timeout_s=timeout_s)
        took = time.monotonic() - start
    finally:
        server.close()
        for sock in held:
            sock.close()
    assert f"not reachable within {timeout_s:g} s ({said})" in str(err.value)
    assert timeout_s - 0.1 <= took < timeout_s + 2.0


@pytest.mark.parametrize("delay_s", [0.5, 1.5])
def test_a_broker_that_starts_within_the_grace_is_waited_for(start_mosquitto, delay_s):
    port = free_port()
    started = threading.Timer(delay_s, lambda: start_mosquitto(port=port))
    started.start()
    client = MqttClient.for_node(f"mqtt://127.0.0.1:{port}", "r", "n1")
    try:
        client.connect(timeout_s=30)
        assert client.connected
    finally:
        started.join()
        client.close()


# ---- state lines -------------------------------------------------------------------------------


def test_a_client_tells_a_lost_connection_and_its_return_not_its_first_connect_nor_its_close(start_mosquitto):
    port = free_port()
    broker = start_mosquitto(port=port)
    seen: list[bool] = []
    changed = threading.Condition()

    def on_connection(up: bool) -> None:
        with changed:
            seen.append(up)
            changed.notify_all()

    client = MqttClient.for_node(broker.url, "r", "n1", on_connection=on_connection, reconnect_max_s=0.5)
    try:
        client.connect(timeout_s=10)
        assert seen == []
        broker.stop()
        with changed:
            assert changed.wait_for(lambda: seen == [False], 10)
        broker.start()
        with changed:
            assert changed.wait_for(lambda: seen == [False, True], 20)
    finally:
        client.close()
    assert seen == [False, True]


_STATES = st.sampled_from([("connecting", ("mqtt://b:1",)), ("waiting", ("r",)), ("joined", ("r", "s1")),
                           ("joined", ("r", "s2")), ("round_done", (1,)), ("round_done", (2,)),
                           ("connection", (False, "mqtt://b:1")), ("connection", (True, "mqtt://b:1")),
                           ("ended", ("r", 3))])


@given(st.lists(_STATES, max_size=30))
def test_state_lines_say_each_change_once_and_only_changes(calls):
    lines: list[str] = []
    states = StateLines("node 3", write=lines.append, clock=lambda: "T")
    for method, args in calls:
        getattr(states, method)(*args)
    said = [line.removeprefix("T node 3: ") for line in lines]
    assert all(line.startswith("T node 3: ") for line in lines)
    assert all(a != b for a, b in zip(said, said[1:]))  # a repeated state is one line
    expected: list[str] = []
    probe_lines: list[str] = []
    for method, args in calls:  # each call alone says exactly one line
        one = StateLines("x", write=probe_lines.append, clock=lambda: "")
        getattr(one, method)(*args)
        text = probe_lines.pop().removeprefix(" x: ")
        if not expected or expected[-1] != text:
            expected.append(text)
    assert said == expected


def test_state_lines_go_to_stdout_flushed_counting_rounds_from_1_as_the_summary(capfd):
    StateLines("node 7", clock=lambda: "12:00:00").round_done(2)  # the wire's round 2: the third
    assert capfd.readouterr().out == "12:00:00 node 7: round 3 done\n"


def test_a_state_dir_this_machine_cannot_write_is_one_line_saying_how_to_adapt(tmp_path, capsys):
    from testbed.cli import main

    (tmp_path / "file").write_text("")
    assert main(["node", "--broker", _refused(), "--node-id", "1", "--state-dir", str(tmp_path / "file" / "x")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"testbed: node: state_dir {tmp_path / 'file' / 'x'}: cannot write there (")
    assert "give --state-dir DIR" in err and "\n" not in err


@pytest.mark.parametrize("meter", ["ina260", "ina219"])
def test_a_meter_this_machine_lacks_is_one_line_saying_how_to_adapt(tmp_path, capsys, meter):
    from testbed.cli import main

    if Path("/dev/i2c-1").exists():
        pytest.skip("this machine has an I2C bus 1: the meter may be there")
    assert main(["node", "--broker", _refused(), "--node-id", "1", "--state-dir", str(tmp_path), "--meter", meter]) == 2
    err = capsys.readouterr().err.strip()
    assert f"meter '{meter}' is not available" in err and "use meter 'auto'" in err and "'model'" in err
    assert "\n" not in err


# ---- the probe's retry rule, over any sequence of outcomes (a fake clock) -----------------------


class _Clock:
    """time.monotonic and time.sleep of the probe, on a clock the test moves."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.now += seconds


_OUTCOMES = st.lists(st.tuples(st.sampled_from(["refused", "unreachable", "silent", "connack"]),
                               st.floats(0.0, 6.0)), max_size=40)


@given(outcomes=_OUTCOMES, timeout_s=st.floats(0.5, 120.0))
def test_the_probe_gives_up_on_a_refusal_after_the_grace_and_on_silence_at_its_deadline(outcomes, timeout_s):
    """Whatever the broker's answers and how long each takes: a CONNACK ends the probe; a refusal
    (or no route) is reported at the first one that ends past the grace (never before), silence at
    the first one past the deadline (never before); a refusal forever is reported within the grace
    and one attempt."""
    from unittest import mock

    from testbed.mqtt.probe import _Answer

    clock = _Clock()
    seen: list[tuple[str, float]] = []  # (outcome, when it ended)
    answers = iter(outcomes)

    def ask(*args, **kwargs) -> _Answer:
        kind, cost_s = next(answers, ("refused", 0.01))  # after the list: refused for ever
        clock.now += cost_s
        seen.append((kind, clock.now))
        return _Answer(connack=0) if kind == "connack" else _Answer(seen=kind, detail="No route to host")

    grace_s = min(timeout_s, probe.FAST_FAILURE_GRACE_S)
    with mock.patch.object(probe, "time", clock), mock.patch.object(probe, "_ask", ask):
        try:
            probe.negotiate("mqtt://h:1883", tls_ca=None, protocol="3.1.1", client_id="c", username=None,
                            password=None, deadline=timeout_s, timeout_s=timeout_s)
            raised = None
        except UserError as exc:
            raised = str(exc)
    kind, ended = seen[-1]
    if raised is None:
        assert kind == "connack"
        return
    assert kind != "connack" and "\n" not in raised
    limit = grace_s if kind in ("refused", "unreachable") else timeout_s
    assert ended >= limit  # never before its limit...
    assert all(end < limit for k, end in seen[:-1] if (k == "silent") == (kind == "silent"))  # ...at the first past it
    if kind == "refused":
        assert "connection refused for" in raised
    if all(k != "silent" for k, _ in seen) and len(seen) > len(outcomes):
        assert ended <= grace_s + 6.0 + 0.01  # refused for ever: the grace and one attempt
