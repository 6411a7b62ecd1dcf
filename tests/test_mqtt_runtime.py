"""The HIL runtime end to end on loopback: a real broker, real node processes, the same numbers as
sim mode, and the faults of the issue (node killed mid-round, broker restart, coordinator killed,
bad messages)."""

from __future__ import annotations

import csv
import dataclasses
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import paho.mqtt.client as paho
import pytest

from testbed.assembly import assemble
from testbed.assembly.config import load_config_text, replace, to_toml
from testbed.ledger.events import ComputeEvent
from testbed.ledger.files import read_ledger
from testbed.ledger.node import NodeLedger
from testbed.mqtt import wire
from testbed.mqtt import topics
from testbed.mqtt.broker import parse_broker_url
from testbed.orchestration.runner import run_experiment
from testbed.reports.asked import read_asked
from testbed.reports.results import read_checkpoint
from testbed.rounds import protocol

from conftest import REPO
from conftest_mqtt import keys_of_test, with_board_keys
from ledger_invariant import PLANNED, under_counts
from run_dir_cases import is_top_up_event

EXPERIMENT = """
[run]
name = "hil"
seed = 3
mode = "mqtt"
[data]
num_nodes = 4
samples_per_node = 80
dim = 8
[dp_pasgd]
steps = 20
tau = 5
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
    if "mqtt" in sections:
        sections["mqtt"] = with_board_keys(sections["mqtt"])
    return replace(load_config_text(EXPERIMENT), **sections)


@pytest.fixture(autouse=True)
def _keys(board_keys) -> str:
    """The message keys of the boards these tests start (conftest_mqtt.board_keys)."""
    return board_keys


def _comparable(run_dir: Path) -> list:
    """The ledger without what a meter measured (seconds, joules), in a fixed order."""
    events = [dataclasses.replace(e, compute_s=0.0, energy_j=0.0, measured=False) if e.kind == "compute" else e
              for e in read_ledger(run_dir / "ledger.csv")]
    return sorted(events, key=lambda e: (e.round, e.node, e.kind))


def _metrics(run_dir: Path) -> list[dict]:
    with open(run_dir / "metrics.csv", newline="") as f:
        return list(csv.DictReader(f))


def _sim_twin(config, tmp_path):
    return run_experiment(replace(config, run={"mode": "sim"}), out_dir=tmp_path / "sim", quiet=True)


def _testbed(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "testbed", *args], cwd=REPO, **kw)


def test_sim_and_mqtt_give_the_same_model_and_ledger(broker, tmp_path):
    config = _config(mqtt={"broker_url": broker.url})
    mq = run_experiment(config, out_dir=tmp_path / "mqtt", quiet=True)
    sim = _sim_twin(config, tmp_path)
    assert mq.summary["status"] == sim.summary["status"] == "completed"
    np.testing.assert_allclose(np.load(mq.run_dir / "final_params.npy"), np.load(sim.run_dir / "final_params.npy"),
                               atol=1e-6)
    assert _comparable(mq.run_dir) == _comparable(sim.run_dir)
    assert all(e.compute_s > 0 for e in read_ledger(mq.run_dir / "ledger.csv") if e.kind == "compute")


def test_embedded_broker_and_emulated_hosts_over_two_processes(tmp_path):
    result = run_experiment(_config(mqtt={"hosts": 2, "broker": "embedded"}), out_dir=tmp_path / "r", quiet=True)
    assert result.summary["status"] == "completed" and result.summary["mode"] == "mqtt"
    assert _comparable(result.run_dir) == _comparable(_sim_twin(_config(), tmp_path).run_dir)


def run_with_node_crash(config, url: str, tmp_path: Path, *, rejoin: bool, crash_round: int = 2,
                        after_reply: bool = False, after_log: bool = False):
    """Run ``config`` with 4 real `testbed node` processes on ``url``; node 3 loses power when round
    ``crash_round`` arrives (``after_reply``: just after its first reply of it; ``after_log``: after
    its step logged its release, before the reply left) and, with ``rejoin``, comes back (same id
    and state directory)."""
    state = tmp_path / "node-state"

    def node(n, *extra):
        return _testbed("node", "--broker", url, "--node-id", str(n), "--state-dir", str(state), "--reproducible",
                        *extra,
                        stderr=subprocess.DEVNULL)

    crash = ["--crash-at-round", str(crash_round)] + (["--crash-after-reply"] if after_reply else []) \
        + (["--crash-after-log"] if after_log else [])
    procs = [node(n) for n in range(3)] + [node(3, *crash)]
    result = {}
    coordinator = threading.Thread(target=lambda: result.update(
        r=run_experiment(config, out_dir=tmp_path / "r", quiet=True)))
    coordinator.start()
    try:
        assert procs[3].wait(timeout=60) != 0  # it crashed when the round arrived
        if rejoin:
            procs[3] = node(3)
        coordinator.join(timeout=120)
        assert not coordinator.is_alive()
    finally:
        for p in procs:
            p.kill()
            p.wait()
    return result["r"]


def test_node_killed_mid_round_is_a_straggler_and_rejoins(mosquitto_broker, tmp_path):
    url = mosquitto_broker.url
    # quorum 4: after the crash round, the next round waits until node 3 is back
    config = _config(mqtt={"broker_url": url, "emulated": False, "round_timeout_s": 30.0, "quorum": 4},
                     dp_pasgd={"steps": 40, "tau": 5})
    result = {"r": run_with_node_crash(config, url, tmp_path, rejoin=True)}
    assert result["r"].summary["status"] == "completed"
    rows = _metrics(result["r"].run_dir)
    assert len(rows) == 8 and int(rows[2]["stragglers"]) == 1
    events = list(read_ledger(result["r"].run_dir / "ledger.csv"))
    rounds_of_3 = {e.round for e in events if e.node == 3 and e.kind != "straggle"}
    # Missed the crash round only, rejoined at the next; asked in it, it is charged it on ask (it
    # died as the round arrived, before logging it: an over-count, never an under-count).
    assert rounds_of_3 == set(range(8))
    assert [(e.round, e.reason) for e in events if e.kind == "straggle"] in ([(2, "offline")], [(2, "deadline")])
    # Nothing counted twice (beside the plan, a top-up row of no steps may raise its seconds and
    # joules to the node's costliest round of the session).
    keys = [(e.node, e.round, e.kind) for e in events if not is_top_up_event(e)]
    assert len(keys) == len(set(keys))
    steps_of_3 = sum(e.local_steps for e in events if e.node == 3 and e.kind == "compute")
    assert result["r"].summary["nodes"]["3"]["local_steps"] == steps_of_3 == 5 * len(rounds_of_3)
    assert result["r"].summary["nodes"]["3"]["source"] == "charged on ask"


@pytest.mark.parametrize("crash_round", [0, 3])
def test_a_node_killed_after_logging_its_release_before_sending_it_is_charged_on_ask(mosquitto_broker, tmp_path,
                                                                                     crash_round):
    """Issue 39: `testbed node` killed (os._exit) after its step logged round ``crash_round`` and
    before the reply left; it never comes back. The coordinator asked it: the round is charged its
    plan, and the summary is never below the node's own ledger file (ε, and the planned figures)."""
    url = mosquitto_broker.url
    config = _config(mqtt={"broker_url": url, "emulated": False, "round_timeout_s": 5.0, "quorum": 3},
                     dp_pasgd={"steps": 20, "tau": 5})
    r = run_with_node_crash(config, url, tmp_path, rejoin=False, crash_round=crash_round, after_log=True)
    assert r.summary["status"] == "completed"
    (own_file,) = (tmp_path / "node-state").glob(f"ledger-{config.mqtt.run_id}-*-node3.csv")
    own = NodeLedger(3)
    own.extend(read_ledger(own_file))
    assert crash_round in own.rounds_logged  # logged before it died, never sent
    assert under_counts(r.summary, [own], PLANNED) == []
    charged = {e.round for e in read_ledger(r.run_dir / "ledger.csv") if e.node == 3 and e.kind == "privacy"}
    assert charged == set(range(crash_round + 1))  # then offline: asked nothing more
    assert r.summary["nodes"]["3"]["source"] == "charged on ask"


def test_broker_restart_mid_run(mosquitto_broker, tmp_path):
    config = _config(mqtt={"broker_url": mosquitto_broker.url, "round_timeout_s": 5.0},
                     dp_pasgd={"steps": 60, "tau": 5})
    run_dir = tmp_path / "r"
    restarted = threading.Event()

    def restart_after_round_two():
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if (run_dir / "metrics.csv").exists() and len(_metrics(run_dir)) >= 2:
                mosquitto_broker.stop()
                time.sleep(0.5)
                mosquitto_broker.start()  # same port
                restarted.set()
                return
            time.sleep(0.02)

    threading.Thread(target=restart_after_round_two, daemon=True).start()
    result = run_experiment(config, out_dir=run_dir, quiet=True)
    assert restarted.is_set()
    assert result.summary["status"] == "completed" and result.summary["rounds"] == 12
    assert len(_metrics(run_dir)) == 12


def _run_then_kill_after_3_rounds(exp: Path, run_dir: Path) -> None:
    """`testbed run EXP` in a session of its own, SIGKILLed (with its broker and node hosts) once
    metrics.csv holds 3 rounds."""
    coordinator = _testbed("run", str(exp), "--out", str(run_dir), "--quiet", start_new_session=True,
                           stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not ((run_dir / "metrics.csv").exists() and len(_metrics(run_dir)) >= 3):
            assert time.monotonic() < deadline and coordinator.poll() is None
            time.sleep(0.01)
    finally:
        os.killpg(coordinator.pid, signal.SIGKILL)  # the coordinator, its broker and its node hosts
        coordinator.wait()


def test_killed_coordinator_resumes_without_double_counting(tmp_path):
    config = _config(dp_pasgd={"steps": 60, "tau": 3})
    exp = tmp_path / "exp.toml"
    exp.write_text(to_toml(config))
    run_dir = tmp_path / "r"
    _run_then_kill_after_3_rounds(exp, run_dir)
    killed_at = len(_metrics(run_dir))
    assert killed_at < 20
    mark = read_checkpoint(run_dir).rounds_done
    # Each node the killed session asked in a round the resume runs again computed and sent it then.
    spent_before = Counter((kind, n, a.round) for a in read_asked(run_dir / "asked.csv", range(4), 19)
                           if a.round >= mark for n in a.nodes for kind in ("compute", "communication"))
    resumed = _testbed("run", "--resume", str(run_dir), "--quiet", stderr=subprocess.DEVNULL)
    assert resumed.wait(timeout=120) == 0
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["rounds"] == 20
    assert [int(r["round"]) for r in _metrics(run_dir)] == list(range(1, 21))
    sim = _sim_twin(config, tmp_path)
    # Each release charged once; each re-run round's compute and communication once per session.
    charged = Counter(e for e in _comparable(run_dir) if not is_top_up_event(e))
    once = Counter(_comparable(sim.run_dir))
    assert spent_before and Counter((e.kind, e.node, e.round) for e in charged - once) == spent_before
    assert not once - charged
    np.testing.assert_allclose(np.load(run_dir / "final_params.npy"), np.load(sim.run_dir / "final_params.npy"),
                               atol=1e-6)
    assert summary["nodes"]["0"]["epsilon"] == pytest.approx(sim.summary["nodes"]["0"]["epsilon"], rel=1e-12)


def test_bad_messages_are_rejected_and_logged(mosquitto_broker, tmp_path, caplog):
    """Garbage, another run's, stale-round, replayed, non-finite and forged-ledger messages on a
    node's uplink: all logged and dropped; the run's numbers are those of sim mode. Without
    authentication: the checks behind it (what a node holding its own key may still send) are
    the second wall, tested here as anyone on the broker would reach them
    (tests/test_mqtt_forgery.py: authenticated, such frames are dropped unread)."""
    url = mosquitto_broker.url
    config = _config(mqtt={"broker_url": url, "authenticate": False})
    run = config.mqtt.run_id
    u = parse_broker_url(url)
    rogue = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id="rogue", protocol=paho.MQTTv311)
    rogue.connect(u.host, u.port)
    from testbed.algorithms import RoundContext
    from testbed.orchestration.runner import load

    data, model = load(config)
    alg = assemble.build_algorithm(config, model, data)
    size = alg.model.num_params
    up0 = topics.up(run, "0")

    def forge(client, userdata, message) -> None:
        """Forgeries of the round just broadcast, sent at once: they reach the coordinator while it
        collects that round, before node 0's own reply (its host steps first)."""
        msg = wire.decode(message.payload)
        if msg.kind != protocol.ROUND:
            return
        session = protocol.session_of(msg)
        ctx = RoundContext(msg.round, config.run.seed, data.num_nodes, tuple(protocol.expected_of(msg)))
        planned = alg.planned_events(0, ctx)
        for payload in (
                protocol.update(run, session, msg.round + 7, 0, {"update": np.zeros(size)}, planned),
                # node 0 charging node 1's ledger: refused whatever its tensors
                protocol.update(run, session, msg.round, 0, {"update": np.zeros(size)},
                                [ComputeEvent(node=1, round=msg.round, local_steps=5)]),
                # the plan's events, but a model no honest node can produce (the norm bound)
                protocol.update(run, session, msg.round, 0, {"update": msg.tensors["model"] + 1e6}, planned),
                # no events at all: refused, never averaged in uncharged
                protocol.update(run, session, msg.round, 0, {"update": msg.tensors["model"]}, [])):
            client.publish(up0, payload, qos=1)

    rogue.on_message = forge
    rogue.subscribe(topics.bcast(run), qos=1)
    rogue.loop_start()
    stop = threading.Event()

    def attack():
        while not stop.is_set():
            non_finite = bytearray(protocol.update(run, "s", 0, 0, {"update": np.zeros(size)}, []))
            non_finite[-size * 8:] = np.full(size, np.nan).tobytes()  # the encoder itself refuses NaN
            bad = [b"garbage", wire.encode({"run": "other", "round": 0, "sender": "0", "kind": "update"}),
                   protocol.update(run, "stale-session", 0, 0, {"update": np.zeros(size)}, []),
                   bytes(non_finite)]
            for payload in bad:
                rogue.publish(up0, payload, qos=1)
            time.sleep(0.05)

    attacker = threading.Thread(target=attack, daemon=True)
    caplog.set_level(logging.WARNING)
    attacker.start()
    try:
        result = run_experiment(config, out_dir=tmp_path / "r", quiet=True)
    finally:
        stop.set()
        attacker.join()
        rogue.loop_stop()
        rogue.disconnect()
    assert result.summary["status"] == "completed"
    sim = _sim_twin(config, tmp_path)
    np.testing.assert_allclose(np.load(result.run_dir / "final_params.npy"),
                               np.load(sim.run_dir / "final_params.npy"), atol=1e-6)
    logged = caplog.text
    assert "rejected" in logged and "from 0" in logged
    assert "no honest node exceeds" in logged and "the plan says" in logged


def test_a_host_serves_any_node_kind_through_its_agent_factory(mosquitto_broker, tmp_path):
    """Another kind of board plugs into the host as a NodeProtocol (here a wrapper counting what it
    handles): the run completes through it, equal to sim."""
    from nodes.agent import NodeAgent
    from nodes.host import serve

    handled: list[tuple[int, str]] = []

    class Counting:
        def __init__(self, node: int):
            self.node, self.inner = node, NodeAgent(node)

        def handle(self, msg):
            handled.append((self.node, msg.kind))
            return self.inner.handle(msg)

        def close(self):
            self.inner.close()

    url = mosquitto_broker.url
    config = _config(mqtt={"broker_url": url, "emulated": False})
    host = threading.Thread(target=serve, args=(url, config.mqtt.run_id, range(4)),
                            kwargs={"agent_factory": Counting, "keys": keys_of_test(config.mqtt.run_id)}, daemon=True)
    host.start()
    result = run_experiment(config, out_dir=tmp_path / "r", quiet=True)
    host.join(timeout=30)
    assert result.summary["status"] == "completed" and not host.is_alive()
    assert {n for n, kind in handled if kind == "round"} == {0, 1, 2, 3}
    sim = _sim_twin(config, tmp_path)
    np.testing.assert_allclose(np.load(result.run_dir / "final_params.npy"), np.load(sim.run_dir / "final_params.npy"),
                               atol=1e-6)


def test_a_release_the_killed_coordinator_never_logged_is_charged_when_the_node_does_not_answer_again(
        mosquitto_broker, tmp_path):
    """The coordinator is killed (SIGKILL) mid-run; node 3's rows of the rounds past the checkpoint
    are cut from ledger.csv (its replies never reached it), and in the resumed session node 3 dies
    as the first re-run round arrives. Its own ledger of the first session logged that round (it
    released): the resumed session, which asked it too, charges it the plan on ask, once, and the
    ledger-invariant fixture holds node 3's ledgers of both sessions to the summary."""
    url = mosquitto_broker.url
    config = _config(mqtt={"broker_url": url, "emulated": False, "round_timeout_s": 5.0, "quorum": 3},
                     dp_pasgd={"steps": 60, "tau": 3})
    exp, run_dir, state = tmp_path / "exp.toml", tmp_path / "r", tmp_path / "node-state"
    exp.write_text(to_toml(config))

    def node(n, *extra):
        return _testbed("node", "--broker", url, "--node-id", str(n), "--state-dir", str(state), "--reproducible",
                        *extra,
                        stderr=subprocess.DEVNULL)

    procs = [node(n) for n in range(4)]
    try:
        _run_then_kill_after_3_rounds(exp, run_dir)
        procs[3].kill()
        procs[3].wait()
        mark = read_checkpoint(run_dir).rounds_done
        first = [p for p in state.glob("ledger-*-node3.csv")]
        assert len(first) == 1
        logged = {e.round for e in read_ledger(first[0]) if e.kind == "compute"}
        assert mark in logged  # node 3 released the first round the resume runs again
        events = list(read_ledger(run_dir / "ledger.csv"))
        with open(run_dir / "ledger.csv", newline="") as f:
            rows = list(csv.reader(f))
        kept = [row for row, e in zip(rows[1:], events) if not (e.node == 3 and e.round >= mark)]
        with open(run_dir / "ledger.csv", "w", newline="") as f:
            csv.writer(f).writerows([rows[0], *kept])
        procs[3] = node(3, "--crash-at-round", str(mark))
        resumed = _testbed("run", "--resume", str(run_dir), "--quiet", stderr=subprocess.DEVNULL)
        assert resumed.wait(timeout=120) == 0
    finally:
        for p in procs:
            p.kill()
            p.wait()
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and len(summary["sessions"]) == 2
    of_3 = [(e.kind, getattr(e, "reason", None)) for e in read_ledger(run_dir / "ledger.csv")
            if e.node == 3 and e.round == mark]
    # Asked by both sessions: its release charged once, each asking session's compute and
    # communication (the resumed one's on ask: it died as the round arrived, an over-count), and
    # the straggle row of the session it missed.
    assert sorted(k for k, _ in of_3) == ["communication", "communication", "compute", "compute", "privacy",
                                          "straggle"]
