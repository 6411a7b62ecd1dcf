"""Forgeries on an anonymous broker (issue 40): whoever can publish on the run's topics, without a
node's or the coordinator's key, moves nothing. A raw paho client on the run's broker reads the
run's frames (their seals name the session and round in clear, as they would tell an attacker) and,
once the first round is out, publishes:

- a round r+2 downlink (a node would skip two real rounds) and a round r+1 one carrying the
  forger's model (it would be trained and aggregated), on the broadcast and on a node's downlink;
- a stop (the run would fail);
- an `offline` status of a live node (it would be dropped for good), and its real status replayed;
- a flood of incomplete chunk sets on a node's uplink (its real updates would be evicted, and the
  coordinator wrote a line per frame);
- containers of carried uplinks (testbed.mqtt.carried) holding a frame of its own in another node's
  name and real frames of the run's hosts, one cut short and one inside another;
- containers of rows under a shared header (testbed.mqtt.shared_header): the hosts' real rows under
  a later round's header and tagged again with its own keys, one cut short, one inside a container
  of frames;
- every real frame it saw, again (replays);

each unsealed and sealed with keys of its own. The run completes with the numbers of the same run
in sim (tests/test_algorithm_contract.py: sim == MQTT), the summary counts the forged frames, and
the coordinator's log has a few lines about them, not one per frame.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time

import numpy as np
import paho.mqtt.client as paho
import pytest

from conftest import REPO, wait_until
from test_algorithm_contract import ATOL_MODES, _config, _dtype, _ledger_without_seconds
from test_mqtt_shared_header import rebuilt
from testbed.assembly.config import replace
from testbed.mqtt import auth, carried, chunks, shared_header, topics
from testbed.mqtt import wire
from testbed.orchestration.runner import load, run_experiment
from testbed.reports.results import read_checkpoint
from testbed.rounds import protocol

FLOOD = 1500


class Forger:
    """A client of the broker with no key of the run's: it watches, and forges once the first round
    is out."""

    def __init__(self, url: str, run: str):
        host, port = url.removeprefix("mqtt://").split(":")
        self.run = run
        self.seen: list[tuple[str, bytes]] = []
        self.fired = threading.Event()
        self.row_containers = 0  # real containers of rows it forged from
        self.keys = auth.Keys(run, {p: auth.new_key() for p in ["0", "1", "2", "3", "4", "channel"]})
        self.client = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id=f"forger-{run}")
        self.client.on_message = self._on_message
        self.client.connect(host, int(port))
        self.client.subscribe(f"tb/v1/{run}/#", qos=1)
        self.client.loop_start()

    def _on_message(self, client, userdata, msg) -> None:
        if len(self.seen) < 2000:
            self.seen.append((msg.topic, msg.payload))
        t = topics.parse(msg.topic)
        if t.kind != topics.BCAST or self.fired.is_set():
            return
        # a whole round (the broadcast of a small model is not chunked); seals hide nothing
        real = wire.decode(auth.unverified_body(msg.payload))
        if real.kind == protocol.ROUND and real.round >= 1:
            self.fired.set()
            threading.Thread(target=self.forge, args=(real.meta["session"], real.round, real), daemon=True).start()

    def _both(self, topic: str, payload: bytes, session: str, round_index: int, readers: list[str]) -> None:
        """``payload`` as is, and sealed with the forger's own keys."""
        self.client.publish(topic, payload, qos=1)
        self.client.publish(topic, auth.seal(self.keys, topic, readers, session, round_index, payload), qos=1)

    def forge(self, session: str, round_index: int, real: wire.Message) -> None:
        run, nodes = self.run, [0, 1, 2, 3, 4]
        names = [str(n) for n in nodes]
        model = {k: np.array(v) for k, v in real.tensors.items()}
        hostile = {k: np.full_like(v, 1e3) for k, v in model.items()}
        for ahead, tensors in ((2, model), (1, hostile)):
            forged = protocol.round_(run, session, round_index + ahead, real.meta["config"], nodes, tensors)
            self._both(topics.bcast(run), forged, session, round_index + ahead, names)
            self._both(topics.down(run, "0"), forged, session, round_index + ahead, ["0"])
        # a session of its own: a board, which serves whatever session comes, would supersede the real one
        other = "f" * 16
        self._both(topics.bcast(run), protocol.round_(run, other, round_index + 1, real.meta["config"], nodes, model),
                   other, round_index + 1, names)
        stop = protocol.stop(run, session, "failed", round_index)
        self._both(topics.bcast(run), stop, session, round_index, names)
        for node in ("0", "1"):
            self._both(topics.status(run, node), topics.STATUS_OFFLINE, session, auth.new_epoch(), [node])
        self._both(topics.coord(run), topics.STATUS_OFFLINE, session, auth.new_epoch(), names)
        for i in range(FLOOD):  # incomplete chunk sets: two of three chunks each
            frame = chunks.chunk(bytes(300), 136)[i % 2]
            self._both(topics.up(run, "0"), frame, session, round_index, ["0"])
        # containers of carried uplinks on node 0's uplink: a frame of the forger's in node 1's name
        # beside real frames of the run's hosts (replays), one cut short, one inside another
        mine = auth.seal(self.keys, topics.up(run, "1"), ["1"], session, round_index, stop)
        real = [frame for topic, payload in list(self.seen) if carried.is_carried(payload)
                for frame in carried.unpack(payload, max_bytes=1 << 24)]
        box = carried.pack([("1", mine), *real[:40]])
        for payload in (box, box[:-3], carried.pack([("0", box)])):
            self.client.publish(topics.up(run, "0"), payload, qos=1)
        # containers of rows under a shared header (testbed.mqtt.shared_header) on node 0's uplink:
        # real rows under a later round's header, real rows tagged again with the forger's keys,
        # one cut short, one inside a container of frames
        for payload in [p for _, p in list(self.seen) if shared_header.is_shared(p)][:3]:
            container = shared_header.unpack(payload, max_bytes=1 << 24)
            later = container.header.replace(b'"round":', b'"round":1')  # round r -> 1r: a round ahead
            mine = [(r.node, bytes(r.body), auth.tag(self.keys, r.node, session, r.tag + bytes(16)))
                    for r in container.rows]
            for forged in (rebuilt(payload, header=later), rebuilt(payload, rows=mine), payload[:-5],
                           carried.pack([("0", payload)])):
                self.client.publish(topics.up(run, "0"), forged, qos=1)
            self.row_containers += 1
        for topic, payload in list(self.seen):  # replays of what the run really sent
            self.client.publish(topic, payload, qos=1)

    def close(self) -> None:
        self.client.loop_stop()
        self.client.disconnect()


@pytest.mark.slow
@pytest.mark.parametrize("hosts", ["emulated", "boards"])
def test_forgeries_on_an_anonymous_broker_change_nothing(mosquitto_broker, tmp_path, caplog, hosts, board_keys):
    """The run's own emulated hosts (bound to its session), or five `testbed node` boards with
    provisioned-style keys (serving any session: their statuses carry none)."""
    name = "dp_pasgd"
    config = _config(name)
    run_experiment(config, out_dir=tmp_path / "sim", quiet=True)
    url = mosquitto_broker.url
    mqtt = {"hosts": 2, "broker_url": url, "run_id": "forged", "round_timeout_s": 20.0}
    if hosts == "boards":
        mqtt.update(emulated=False, keys=board_keys, quorum=5)
    mqtt_config = replace(config, run={"mode": "mqtt"}, mqtt=mqtt)
    data, model = load(config)
    state = read_checkpoint(tmp_path / "sim").state
    forger = Forger(url, "forged")
    boards = [subprocess.Popen([sys.executable, "-m", "testbed", "node", "--broker", url, "--run", "forged",
                                "--node-id", str(n), "--state-dir", str(tmp_path / "state"), "--reproducible",
                                "--keys", board_keys, "--quiet"], cwd=REPO, stderr=subprocess.DEVNULL)
              for n in range(5)] if hosts == "boards" else []
    caplog.set_level(logging.WARNING)
    try:
        mqtt = run_experiment(mqtt_config, out_dir=tmp_path / "mqtt", quiet=True)
        for board in boards:  # the stop reaches every board (the forged ones did not), and each leaves
            assert board.wait(timeout=30) == 0
    finally:
        forger.close()
        for board in boards:
            board.kill()
            board.wait()
    assert forger.fired.is_set(), "the forger never saw a round"
    # the run's own hosts carry their nodes' replies (updates as rows, reports as frames); a board sends its own
    assert any(carried.is_carried(p) for _, p in forger.seen) == (hosts == "emulated")
    assert any(shared_header.is_shared(p) for _, p in forger.seen) == (hosts == "emulated")
    assert (forger.row_containers > 0) == (hosts == "emulated")
    assert mqtt.summary["status"] == "completed", mqtt.summary.get("failure")
    a, b = state, read_checkpoint(tmp_path / "mqtt").state
    for key in a:
        np.testing.assert_allclose(b[key], a[key], rtol=0, atol=ATOL_MODES[_dtype(model)])
    assert _ledger_without_seconds(tmp_path / "sim") == _ledger_without_seconds(tmp_path / "mqtt")
    assert all(n["rounds_straggled"] == 0 for n in mqtt.summary["nodes"].values())
    authentication = mqtt.summary["authentication"]
    # How much of the flood arrives before the run ends is the machine's (91 of it once the run's stop
    # got faster): some did, each dropped, counted, and none moved the state or the ledger (above).
    assert authentication["enabled"] and authentication["forged_dropped"] >= 1
    lines = [r for r in caplog.records if "does not authenticate" in r.getMessage()]
    assert 0 < len(lines) <= 20, len(lines)


def test_a_run_without_authentication_says_so(embedded_broker, tmp_path):
    config = replace(_config("fedavg"), run={"mode": "mqtt"},
                     mqtt={"broker_url": embedded_broker.url, "authenticate": False})
    result = run_experiment(config, out_dir=tmp_path / "mqtt", quiet=True)
    assert result.summary["status"] == "completed"
    assert result.summary["authentication"]["enabled"] is False
    assert "not authenticated" in result.summary["authentication"]["statement"]
    from testbed.cli.run import format_summary  # noqa: PLC0415

    assert "not authenticated" in format_summary(result.summary)


@pytest.mark.slow
def test_a_boards_will_replayed_before_the_coordinator_starts_does_not_keep_it_out(mosquitto_broker, tmp_path,
                                                                                   board_keys):
    """Board 0 loses its connection (killed: the broker publishes its will, which anyone on the
    broker records) and comes back; before the coordinator starts, the recorded will is published
    again as the retained status. The coordinator's first view of board 0 is that will (it verifies:
    a board's statuses carry no session), but board 0 answers the coordinator's connection with its
    own online, and the run waits for no one."""
    url, run = mosquitto_broker.url, "willrun"
    seen: dict[str, bytes] = {}
    host, port = url.removeprefix("mqtt://").split(":")
    recorder = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id="recorder")
    recorder.on_message = lambda c, u, m: seen.__setitem__(auth.unverified_body(m.payload).decode(errors="replace"),
                                                           m.payload)
    recorder.connect(host, int(port))
    recorder.subscribe(topics.status(run, "0"), qos=1)
    recorder.loop_start()

    def board(n: int) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "testbed", "node", "--broker", url, "--run", run,
                                 "--node-id", str(n), "--state-dir", str(tmp_path / "state"), "--reproducible",
                                 "--keys", board_keys, "--quiet"], cwd=REPO, stderr=subprocess.DEVNULL)

    boards = [board(n) for n in range(5)]
    try:
        wait_until(lambda: "online" in seen, 60, "board 0 online")
        boards[0].kill()
        boards[0].wait()
        wait_until(lambda: "offline" in seen, 60, "board 0's will")
        will = seen["offline"]
        seen.clear()
        boards[0] = board(0)
        wait_until(lambda: "online" in seen, 60, "board 0 back")
        recorder.publish(topics.status(run, "0"), will, qos=1, retain=True).wait_for_publish(10)
        config = replace(_config("dp_pasgd"), run={"mode": "mqtt"},
                         mqtt={"broker_url": url, "run_id": run, "emulated": False, "keys": board_keys,
                               "quorum": 5, "connect_timeout_s": 30.0, "round_timeout_s": 20.0})
        result = run_experiment(config, out_dir=tmp_path / "mqtt", quiet=True)
    finally:
        recorder.loop_stop()
        recorder.disconnect()
        for b in boards:
            b.kill()
            b.wait()
    assert result.summary["status"] == "completed"
    assert all(n["rounds_straggled"] == 0 for n in result.summary["nodes"].values())
