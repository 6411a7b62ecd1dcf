"""Hosts end with their coordinator, a resumed session fences the old one, and the coordinator waits
out a broker outage (up to mqtt.outage_limit_s) instead of dying of a raw TimeoutError."""

from __future__ import annotations

import csv
import json
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import psutil
import pytest

from testbed.assembly.config import load_config_text, replace, to_toml
from testbed.errors import UserError
from testbed.ledger.files import read_ledger
from testbed.ledger.node import SPENT_AGAIN
from testbed.mqtt import wire
from testbed.mqtt import replay, topics
from testbed.mqtt.client import Inbound
from testbed.orchestration.runner import run_experiment
from testbed.reports.asked import read_asked
from testbed.rounds import protocol

from conftest import REPO
from run_dir_cases import is_top_up_event
from nodes.host import SessionFence, _loop

EXPERIMENT = """
[run]
name = "life"
seed = 5
mode = "mqtt"
[data]
num_nodes = 4
samples_per_node = 40
dim = 4
[dp_pasgd]
steps = 60
tau = 3
batch = 8
lr = 0.5
sigma = 1.0
clip = true           # G = 1 below the logistic model's own bound 2: held by clipping (issue 39)
lipschitz = 1.0
[mqtt]
round_timeout_s = 20.0
connect_timeout_s = 30.0
[output]
figures = false
"""


def _config(**sections):
    return replace(load_config_text(EXPERIMENT), **sections)


def _rounds_done(run_dir: Path) -> int:
    path = run_dir / "metrics.csv"
    if not path.exists():
        return 0
    with open(path, newline="") as f:
        return len(list(csv.DictReader(f)))


def _metrics(run_dir: Path) -> list[dict]:
    with open(run_dir / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


def _charged_once(run_dir: Path) -> None:
    """Every release (node, round, kind) at most once in the ledger: nothing counted twice; a
    round's compute and communication at most once per session that asked the node that round
    (asked.csv: a round re-run after a resume is computed and sent again)."""
    asked = Counter((n, a.round) for a in read_asked(run_dir / "asked.csv", None, 2**40) for n in a.nodes)
    keys = Counter((e.node, e.round, e.kind, getattr(e, "reason", None)) for e in read_ledger(run_dir / "ledger.csv")
                   if not is_top_up_event(e))  # a straggle row of each reason
    assert [k for k, count in keys.items() if count > (asked[k[:2]] if k[2] in SPENT_AGAIN else 1)] == []


def _gone(proc: psutil.Process) -> bool:
    try:
        return proc.status() == psutil.STATUS_ZOMBIE  # exited, not yet reaped by its new parent
    except psutil.NoSuchProcess:
        return True


# ------------------------------------------------------------------------------ session fence

def test_a_host_started_by_a_coordinator_serves_its_session_only(caplog):
    fence = SessionFence("s1")
    caplog.set_level(logging.WARNING)
    assert fence.admits("s1")
    assert not fence.admits("s2") and not fence.admits("s2") and not fence.admits(None)
    assert fence.admits("s1")
    assert caplog.text.count("ignoring messages of coordinator session s2") == 1  # once, not per message


def test_a_board_follows_a_newer_session_and_never_goes_back():
    fence = SessionFence()
    assert fence.admits("old") and fence.admits("old")
    assert fence.admits("new")  # a resumed run reaches the board
    assert not fence.admits("old")  # a late round of the killed coordinator
    assert fence.admits("new") and fence.admits("newer") and not fence.admits("new")


class _Agent:
    def __init__(self, node: int):
        self.node, self.rounds = node, []

    def handle(self, msg: wire.Message) -> protocol.Reply:
        # A stop is answered too (the node's ledger report), but is not a round it ran.
        if msg.kind != protocol.STOP:
            self.rounds.append((protocol.session_of(msg), msg.round))
        return protocol.Reply(protocol.COORDINATOR, b"reply")

    def close(self) -> None:
        pass


class _Client:
    connected = True

    def __init__(self):
        self.published = []

    def publish(self, topic: str, payload: bytes, timeout_s: float | None = 30.0) -> None:
        self.published.append(topic)


def _inbound(kind: str, session: str, round_index: int = 0) -> Inbound:
    if kind == protocol.STOP:
        raw = protocol.stop("r", session, "completed", round_index)
    else:
        raw = protocol.round_("r", session, round_index, "", [0], {})
    return Inbound(topics.bcast("r"), "bcast", None, raw, wire.decode(raw), "0")


def test_the_host_loop_ignores_other_sessions_and_their_stop():
    inbox: queue.Queue[Inbound] = queue.Queue()
    for item in [_inbound(protocol.ROUND, "mine", 0), _inbound(protocol.ROUND, "other", 1),
                 _inbound(protocol.STOP, "other"), _inbound(protocol.ROUND, "mine", 1),
                 _inbound(protocol.STOP, "mine")]:
        inbox.put(item)
    agent, client = _Agent(0), _Client()
    answered = _loop(inbox, {"0": agent}, {"0": client}, "r", 30.0, None, SessionFence("mine"))
    # round 0 of "mine" came in the same batch as its round 1: closed, skipped (nodes.round_fence)
    assert answered == 1 and agent.rounds == [("mine", 1)]


def test_the_hosts_hear_the_stop_of_a_run_longer_than_the_replay_window(tmp_path, caplog):
    """The stop carries the last round: a stop of round 0 was a replay to nodes past round 16, so
    each host was waited for 10 s and terminated."""
    result = run_experiment(_config(mqtt={"hosts": 2}), out_dir=tmp_path / "r", quiet=True)
    assert result.summary["rounds"] == 20 > replay.ReplayGuard().window_rounds
    assert "did not leave" not in caplog.text and "replay window" not in caplog.text


def test_a_board_outlives_a_broker_outage_longer_than_its_grace():
    """With every client disconnected past the grace, the host keeps serving: the round and the
    stop that arrive once the broker is back are handled."""
    inbox: queue.Queue[Inbound] = queue.Queue()

    class Client(_Client):  # the stop follows the node's answer (with the round, it closes it)
        def publish(self, topic: str, payload: bytes, timeout_s: float | None = 30.0) -> None:
            super().publish(topic, payload, timeout_s)
            inbox.put(_inbound(protocol.STOP, "s", 0))

    agent, client = _Agent(0), Client()
    client.connected = False

    def broker_back():
        time.sleep(1.6)  # three of the loop's ticks, sixteen times the grace below
        client.connected = True
        inbox.put(_inbound(protocol.ROUND, "s", 0))

    threading.Thread(target=broker_back, daemon=True).start()
    assert _loop(inbox, {"0": agent}, {"0": client}, "r", 0.1, None) == 1 and agent.rounds == [("s", 0)]


# ---------------------------------------------------------------- the coordinator is killed

def test_hosts_leave_with_their_killed_coordinator_and_the_resume_counts_nothing_twice(mosquitto_broker, tmp_path):
    """An external broker, so the hosts do not simply lose it with the coordinator: they must notice
    the coordinator itself is gone."""
    config = _config(mqtt={"broker_url": mosquitto_broker.url, "hosts": 2})
    exp = tmp_path / "exp.toml"
    exp.write_text(to_toml(config))
    run_dir = tmp_path / "r"
    coordinator = subprocess.Popen([sys.executable, "-m", "testbed", "run", str(exp), "--out", str(run_dir),
                                    "--quiet"], cwd=REPO, start_new_session=True, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while _rounds_done(run_dir) < 3:
            assert time.monotonic() < deadline and coordinator.poll() is None
            time.sleep(0.01)
        hosts = [p for p in psutil.Process(coordinator.pid).children() if p.name().startswith("nodes ")]  # forked
        assert len(hosts) == 2
        coordinator.send_signal(signal.SIGKILL)  # the coordinator only, not its process group
        coordinator.wait()
        killed = time.monotonic()
        while not all(_gone(h) for h in hosts):
            assert time.monotonic() - killed < 3.0, "emulated hosts outlived their coordinator"
            time.sleep(0.05)
    finally:
        _kill_group(coordinator.pid)  # whatever is left of it, if the test failed
    assert _rounds_done(run_dir) < 20
    resumed = subprocess.run([sys.executable, "-m", "testbed", "run", "--resume", str(run_dir), "--quiet"],
                             cwd=REPO, capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["rounds"] == 20
    assert "dropped a second" not in resumed.stderr
    _charged_once(run_dir)
    sim = run_experiment(replace(config, run={"mode": "sim"}), out_dir=tmp_path / "sim", quiet=True)
    assert summary["nodes"]["0"]["epsilon"] == pytest.approx(sim.summary["nodes"]["0"]["epsilon"], rel=1e-12)
    assert summary["nodes"]["0"]["local_steps"] > sim.summary["nodes"]["0"]["local_steps"]  # re-run rounds: again
    np.testing.assert_allclose(np.load(run_dir / "final_params.npy"), np.load(sim.run_dir / "final_params.npy"),
                               atol=1e-6)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


# ------------------------------------------------------------------------------ broker outages

def _stop_broker_after(broker, run_dir: Path, rounds: int, outage_s: float | None, done: threading.Event) -> None:
    """Stop ``broker`` once ``rounds`` rounds are in metrics.csv; restart it on the same port after
    ``outage_s`` (None: leave it stopped)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and _rounds_done(run_dir) < rounds:
        time.sleep(0.02)
    broker.stop()
    done.set()
    if outage_s is not None:
        time.sleep(outage_s)
        broker.start()


def _outage_config(url: str, limit_s: float):
    return _config(mqtt={"broker_url": url, "round_timeout_s": 1.0, "outage_limit_s": limit_s})


def test_an_outage_shorter_than_the_limit_is_waited_out_with_stragglers(mosquitto_broker, tmp_path):
    run_dir = tmp_path / "r"
    stopped = threading.Event()
    threading.Thread(target=_stop_broker_after, args=(mosquitto_broker, run_dir, 3, 4.0, stopped),
                     daemon=True).start()
    started = time.monotonic()
    result = run_experiment(_outage_config(mosquitto_broker.url, 30.0), out_dir=run_dir, quiet=True)
    assert stopped.is_set() and time.monotonic() - started < 45
    assert result.summary["status"] == "completed" and result.summary["rounds"] == 20
    stragglers = [int(row["stragglers"]) for row in _metrics(run_dir)]
    assert stragglers[:3] == [0, 0, 0] and 4 in stragglers[3:]  # the outage rounds: every node straggled
    # And the nodes were back afterwards, each on its own jittered reconnect schedule (after a 4 s
    # outage a node may wait a few seconds more; tests/test_mqtt_scale.py checks the spread).
    assert stragglers[-1] < 4
    _charged_once(run_dir)


def test_an_outage_past_the_limit_fails_in_one_line_and_resumes(mosquitto_broker, tmp_path):
    run_dir = tmp_path / "r"
    stopped = threading.Event()
    threading.Thread(target=_stop_broker_after, args=(mosquitto_broker, run_dir, 3, None, stopped),
                     daemon=True).start()
    config = _outage_config(mosquitto_broker.url, 3.0)
    started = time.monotonic()
    with pytest.raises(UserError) as failure:
        run_experiment(config, out_dir=run_dir, quiet=True)
    assert time.monotonic() - started < 30
    message = str(failure.value)
    assert "\n" not in message and mosquitto_broker.url in message and "outage_limit_s = 3 s" in message
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and "outage_limit_s" in summary["failure"]
    assert 3 <= summary["rounds"] < 20

    mosquitto_broker.start()  # the broker is back: the run continues where it stopped
    resumed = run_experiment(config, out_dir=run_dir, quiet=True, resume=True)
    assert resumed.summary["status"] == "completed" and resumed.summary["rounds"] == 20
    assert [int(r["round"]) for r in _metrics(run_dir)] == list(range(1, 21))
    _charged_once(run_dir)


# ------------------------------------------------------------------------------ sessions

@pytest.mark.parametrize("shared_loop", [False, True], ids=["own-thread", "network-loop"])
def test_a_closed_v5_client_leaves_no_session_on_the_broker(mosquitto_broker, shared_loop):
    """A broker keeps a session for its expiry interval after a disconnect, and queues what its
    subscriptions match: runs on the same run id piled up queued broadcasts for every node of every
    run before. A client that closes ends its session (MQTT 5: expiry 0 on DISCONNECT)."""
    import paho.mqtt.client as paho

    from testbed.mqtt.broker import parse_broker_url
    from testbed.mqtt.client import MqttClient
    from testbed.mqtt.network_loop import NetworkLoop

    network = NetworkLoop() if shared_loop else None
    client = MqttClient(mosquitto_broker.url, client_id="closing", run="r", subscriptions=[topics.bcast("r")],
                        network=network).connect(timeout_s=10)
    assert client.protocol == "5"
    client.close()
    if network is not None:
        network.close()
    u = parse_broker_url(mosquitto_broker.url)
    present: list[bool] = []
    again = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id="closing", protocol=paho.MQTTv5)
    again.on_connect = lambda c, userdata, flags, code, props: present.append(flags.session_present)
    again.connect(u.host, u.port, clean_start=False)
    again.loop_start()
    try:
        deadline = time.monotonic() + 10
        while not present and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        again.disconnect()
        again.loop_stop()
    assert present == [False]
