"""The ``[links]`` section: emulated hosts in network namespaces of their own, joined to the
broker's by veth pairs and shaped with tc's tbf (testbed.orchestration.links).

The slow tests run the quickstart as docs/multi-host.md says (two hosts, the second shaped to
64 kbit/s), and kill a run's coordinator with SIGKILL: every namespace and device goes with it.
They need Linux, root, iproute2 and Mosquitto (CI: .ci/run installs them and runs as root).
"""

from __future__ import annotations

import json
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from conftest import REPO, needs_command, require_tool
from testbed.assembly.config import load_config
from testbed.errors import ConfigError
from testbed.mqtt.brokers.mosquitto import MosquittoBroker
from testbed.orchestration import links
from testbed.orchestration.emulated_hosts import host_rates, url_at

QUICKSTART = REPO / "experiments" / "quickstart.toml"
SLOW_RATE_BPS = 64_000
#: The slow host's rounds (publish to its last reply) against the seconds its link's bytes take at
#: the rate (links.rate_s): the median ratio over the run's rounds lies in this band. Below 1: the
#: bytes counted in a round include a few after its last reply (acks); above: the nodes' steps
#: and the broker's hops, which a loaded machine stretches (0.97-1.0 measured idle).
RATIO_BAND = (0.8, 1.35)
CLEANUP_S = 5.0  # after a SIGKILL: the watchdog's and the hosts' polls (0.5 s each), the deletions, the exits


def _need_links() -> None:
    why = links.missing()
    require_tool("links", why is None, why or "")


def _names(pid: int) -> tuple[list[str], list[str]]:
    """Run ``pid``'s namespaces and broker-side devices that exist now."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    spaces = [line.split()[0] for line in listed.splitlines() if line.startswith(f"testbed-{pid}-")]
    devices = [d for d in os.listdir("/sys/class/net") if re.fullmatch(rf"tb{pid}x\d+", d)]
    return spaces, devices


def _serving(pid: int) -> list[int]:
    """The processes still serving coordinator ``pid`` (its hosts: `--coordinator-pid PID`)."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:  # not a process, or gone meanwhile
            continue
        if b"--coordinator-pid" in argv and argv[argv.index(b"--coordinator-pid") + 1:][:1] == [str(pid).encode()]:
            found.append(int(entry))
    return found


def _run_command(out: Path) -> list[str]:
    """The quickstart behind links, as docs/multi-host.md runs it."""
    return [sys.executable, "-m", "testbed", "run", str(QUICKSTART), "--quiet", "--out", str(out),
            "--set", "mqtt.broker='mosquitto'", "--set", "links.netns=true",
            "--set", f"links.rate_bps=[0, {SLOW_RATE_BPS}]",
            "--set", "output.figures=false", "--set", "privacy.tight_accountant='none'"]


# ---- without root: the pieces ----------------------------------------------------------------

def test_rate_bps_needs_netns_and_takes_one_rate_a_list_or_channel():
    with pytest.raises(ConfigError, match="links.rate_bps: matters only with netns"):
        load_config(QUICKSTART, ["links.rate_bps=1000"])
    assert load_config(QUICKSTART, ["links.netns=true", "links.rate_bps=[0, 8000]"]).links.rate_bps == [0, 8000]
    with pytest.raises(ConfigError, match="links.rate_bps"):
        load_config(QUICKSTART, ["links.netns=true", "links.rate_bps='fast'"])
    with pytest.raises(ConfigError, match="links.rate_bps"):
        load_config(QUICKSTART, ["links.netns=true", "links.rate_bps=-5"])


def test_host_rates_one_each_and_channel_needs_a_link_model():
    hosts = [[0, 1], [2, 3]]
    assert host_rates(None, hosts, object()) == [None, None]
    assert host_rates(8000, hosts, object()) == [8000, 8000]
    assert host_rates([0, 8000], hosts, object()) == [None, 8000]
    with pytest.raises(ConfigError, match="2 emulated hosts"):
        host_rates([8000], hosts, object())
    with pytest.raises(ConfigError, match="no link model"):
        host_rates("channel", hosts, object())

    class Model:
        def link_rate_bps(self, nodes):
            return np.array([1e6, 2e6, 3e6, 5e5])[nodes]

    assert host_rates("channel", hosts, Model()) == [1_000_000, 500_000]  # each host's slowest node


def test_rate_s_is_the_bytes_past_each_directions_bucket_at_the_rate():
    burst = links.burst_bytes(64_000)
    assert burst == 1514  # one frame at a slow rate
    assert links.rate_s(burst + 1000, burst + 7000, 64_000) == pytest.approx(8000 * 8 / 64_000)
    assert links.rate_s(10, 10, 64_000) == 0.0
    assert links.burst_bytes(100_000_000) == 125_000  # 10 ms of a fast rate


@given(st.integers(0, 10**7), st.integers(0, 10**7), st.integers(1000, 10**9))
def test_rate_s_is_at_most_every_byte_at_the_rate_and_grows_with_the_bytes(down, up, rate):
    seconds = links.rate_s(down, up, rate)
    assert 0.0 <= seconds <= (down + up) * 8 / rate
    assert links.rate_s(down + 1, up, rate) >= seconds and links.rate_s(down, up + 1, rate) >= seconds
    assert seconds >= (down + up - 2 * links.burst_bytes(rate)) * 8 / rate - 1e-9  # one bucket each way, no more


@given(st.floats(0.0, 1e4), st.dictionaries(st.integers(0, 99), st.integers(0, 10**9), max_size=12))
def test_a_hosts_wire_seconds_split_by_bytes_sum_to_its_figure_and_none_is_negative(wire_s, bytes_by_node):
    shares = links.split_wire_s(wire_s, bytes_by_node)
    assert shares.keys() == bytes_by_node.keys()
    assert all(s >= 0.0 for s in shares.values())
    if bytes_by_node:
        assert sum(shares.values()) == pytest.approx(wire_s, rel=1e-9, abs=1e-12)
    if sum(bytes_by_node.values()):  # a node of no bytes takes none of a link that carried some
        assert all(shares[n] == 0.0 for n, b in bytes_by_node.items() if b == 0)
        heavy, light = max(bytes_by_node, key=bytes_by_node.get), min(bytes_by_node, key=bytes_by_node.get)
        assert shares[heavy] >= shares[light]


def test_a_wire_split_of_no_bytes_is_equal_shares_and_of_no_nodes_is_empty():
    assert links.split_wire_s(2.0, {3: 0, 4: 0, 5: 0, 6: 0}) == {3: 0.5, 4: 0.5, 5: 0.5, 6: 0.5}
    assert links.split_wire_s(2.0, {3: 0, 4: 10}) == {3: 0.0, 4: 2.0}
    assert links.split_wire_s(2.0, {}) == {}
    with pytest.raises(ValueError, match="negative"):
        links.split_wire_s(2.0, {3: -1, 4: 10})


class _CountedLinks(links.Links):
    """Two unshaped links whose counters a test sets (no namespace, no root)."""

    def __init__(self) -> None:
        super().__init__([links.Link(f"testbed-0-{i}", f"tb0x{i}", "10.213.0.1", "10.213.0.2", None)
                          for i in range(2)], None)
        self.carried = [(0, 0), (0, 0)]

    def counters(self) -> list[tuple[int, int]]:
        return list(self.carried)


def test_each_answered_node_gets_its_share_of_its_hosts_round_and_the_summary_sums_them():
    counted = _CountedLinks()
    rounds = links.LinkRounds(counted, [[0, 1], [2, 3]])
    rounds.start()
    start_s = rounds._start_s
    counted.carried = [(500, 900), (0, 0)]
    shares = rounds.end(0, {0: start_s + 0.4, 1: start_s + 0.2}, {0: 0.01, 1: 0.01}, {0: 300, 1: 100})
    assert shares == pytest.approx({0: 0.3, 1: 0.1})  # host 1 had no answer: no round timed, no shares
    rounds.start()
    start_s = rounds._start_s
    shares = rounds.end(1, {1: start_s + 0.5, 2: start_s + 0.1}, {}, {1: 100, 2: 100})
    assert shares == pytest.approx({1: 0.5, 2: 0.1})  # node 0 did not answer: its host's round is node 1's
    first, second = rounds.summary()
    assert first["wire_s"] == pytest.approx(0.9) and first["rounds_timed"] == 2
    assert first["nodes_wire_s"] == pytest.approx({"0": 0.3, "1": 0.6})
    assert second["nodes_wire_s"] == pytest.approx({"2": 0.1, "3": 0.0})


def test_a_hosts_round_beyond_the_rounds_window_is_charged_at_its_bound():
    counted = _CountedLinks()
    rounds = links.LinkRounds(counted, [[0], [1]])
    rounds.start()
    shares = rounds.end(0, {0: rounds._start_s + 1e9}, {}, {0: 10})  # a reply stamped after the round's close
    assert 0.0 < shares[0] <= links.wire_limit_s(60.0)  # the window: the moments this test took, plus slack


def test_links_refused_in_sim_in_one_line():
    from testbed.orchestration.runner import load

    with pytest.raises(ConfigError, match="links.netns: puts the emulated hosts of an MQTT run behind links"):
        load(load_config(QUICKSTART, ["links.netns=true", "run.mode='sim'"]))


def test_the_broker_listens_on_each_link_with_the_same_settings():
    broker = MosquittoBroker(port=1883, password_file="/dev/null", also_listen=("10.213.0.1", "10.213.0.5"))
    conf = broker._config()
    listeners = [line for line in conf.splitlines() if line.startswith("listener")]
    assert listeners == ["listener 1883 127.0.0.1", "listener 1883 10.213.0.1", "listener 1883 10.213.0.5"]
    assert conf.count("use_username_as_clientid true") == 3  # a listener setting: on each of them
    assert "per_listener_settings false" in conf  # users and topic rules: the broker's, on every listener


def test_a_host_reaches_the_broker_at_its_links_end():
    assert url_at("mqtt://127.0.0.1:41234", "10.213.0.1") == "mqtt://10.213.0.1:41234"
    assert url_at("mqtts://127.0.0.1:8883", "10.213.0.5") == "mqtts://10.213.0.5:8883"


def test_the_recipe_lists_the_commands_a_link_is_made_with():
    """docs/multi-host.md shows the commands of links.link_commands, for its example link."""
    doc = (REPO / "docs" / "multi-host.md").read_text()
    link = links.Link("testbed-PID-1", "tbPIDx1", "10.213.0.5", "10.213.0.6", SLOW_RATE_BPS)
    for command in links.link_commands(link, "tbPIDy1"):
        assert " ".join(command) in doc, " ".join(command)


# ---- as root: the runs ---------------------------------------------------------------------

@pytest.mark.slow
@needs_command("mosquitto", "apt-get install mosquitto")
def test_quickstart_with_a_slow_host_takes_the_time_its_rate_implies(tmp_path):
    _need_links()
    out = tmp_path / "run"
    done = subprocess.run(_run_command(out), cwd=REPO, capture_output=True, text=True, timeout=240,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0, done.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["rounds"] == 9
    fast, slow = summary["links"]
    assert (fast["rate_bps"], slow["rate_bps"]) == (None, SLOW_RATE_BPS)
    assert fast["nodes"] == list(range(8)) and slow["nodes"] == list(range(8, 16))
    assert fast["host_address"] != slow["host_address"]
    assert fast["rounds_timed"] == slow["rounds_timed"] == 9
    # Measured beside modelled: the bytes the link carried, its seconds, and the ledger's airtime.
    assert all(r["bytes_down"] > 0 and r["bytes_up"] > 0 and r["airtime_s"] > 0 for r in slow["rounds"])
    ratio = statistics.median(r["wire_s"] / r["rate_s"] for r in slow["rounds"])
    assert RATIO_BAND[0] <= ratio <= RATIO_BAND[1], slow["rounds"]
    # An unshaped host's rounds take a fraction of the slow one's (its bytes are about the same).
    assert statistics.median(r["wire_s"] for r in fast["rounds"]) < 0.25 * statistics.median(
        r["wire_s"] for r in slow["rounds"])
    # The ledger's wire rows: each answered node's share of its host's round, measured, summing
    # over the host's nodes to the host's figure every round.
    from testbed.ledger.files import read_ledger

    ledger = list(read_ledger(out / "ledger.csv"))
    wire = [e for e in ledger if e.kind == "wire"]
    assert wire and all(e.measured for e in wire)
    for host in (fast, slow):
        for row in host["rounds"]:
            ledger_s = [e.wire_s for e in wire if e.round == row["round"] and e.node in host["nodes"]]
            assert len(ledger_s) == len(host["nodes"])  # every node answered every round
            assert sum(ledger_s) == pytest.approx(row["wire_s"], rel=1e-9)
    by_node = {n: sum(e.wire_s for e in wire if e.node == n) for n in slow["nodes"]}
    assert by_node == pytest.approx({int(n): s for n, s in slow["nodes_wire_s"].items()}, rel=1e-9)
    # The slow host's nodes carry equal payloads: each is charged an eighth of its rounds, which are
    # far beyond their modelled airtime (the profile's Wi-Fi, not a 64 kbit/s link).
    airtime_s = {n: sum(e.airtime_s for e in ledger if e.kind == "communication" and e.node == n) for n in by_node}
    for node, seconds in by_node.items():
        assert seconds == pytest.approx(slow["wire_s"] / 8, rel=1e-6)
        assert seconds > 10 * airtime_s[node]
    from testbed.cli.run import format_summary

    link_lines = [line for line in format_summary(summary).splitlines() if line.startswith("link ")]
    assert len(link_lines) == 2 and all("s measured (ledger.csv wire rows)" in line for line in link_lines)
    pid = int(fast["netns"].split("-")[1])
    assert _names(pid) == ([], [])  # the run's close deleted them


@pytest.mark.slow
@needs_command("mosquitto", "apt-get install mosquitto")
def test_a_killed_coordinators_links_are_deleted_and_stale_ones_swept(tmp_path):
    _need_links()
    proc = subprocess.Popen(_run_command(tmp_path / "run"), cwd=REPO, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        deadline = time.monotonic() + 60
        while len(_names(proc.pid)[0]) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, "the run's links never appeared"
            time.sleep(0.2)
        metrics = tmp_path / "run" / "metrics.csv"
        while not (metrics.exists() and len(metrics.read_text().splitlines()) > 1):  # into its rounds
            assert proc.poll() is None and time.monotonic() < deadline, "the run never got to its rounds"
            time.sleep(0.2)
        assert len(_serving(proc.pid)) == 2
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        deadline = time.monotonic() + CLEANUP_S
        while (_names(proc.pid) != ([], []) or _serving(proc.pid)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _names(proc.pid) == ([], []), "the watchdog did not delete the killed run's links"
        assert _serving(proc.pid) == [], "the killed run's hosts still run"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    # A coordinator whose watchdog died too: the next start sweeps its names.
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = links.Link(f"testbed-{dead.pid}-0", f"tb{dead.pid}x0", "10.213.255.249", "10.213.255.250", None)
    try:
        for command in links.link_commands(stale, f"tb{dead.pid}y0"):
            subprocess.run(command, check=True, capture_output=True)
        assert _names(dead.pid) == ([stale.netns], [stale.device])
        assert stale.netns in links.sweep()
        assert _names(dead.pid) == ([], [])
    finally:
        subprocess.run(["ip", "netns", "del", stale.netns], capture_output=True)


def test_channel_rate_is_each_nodes_shannon_rate_as_the_digital_link_charges_it():
    """DWFL's link_rate_bps (links.rate_bps = "channel") is channel.digital_link's rate for each
    node's aligned power and gain: the rate its digital orthogonal airtime is charged at."""
    from channel import digital_link
    from testbed.assembly import assemble
    from testbed.orchestration.runner import load

    config = load_config(REPO / "experiments" / "dwfl" / "base.toml",
                         ["data.dataset='synthetic'", "data.dim=5", "run.mode='sim'", "dwfl.pathloss='free_space'",
                          "dwfl.fading='none'"])  # no fading: no Sionna to import (20 s)
    data, model = load(config)
    algorithm = assemble.build_algorithm(config, model, data)
    rc = algorithm.plan(0).channel
    nodes = list(data.node_ids)
    expected = [digital_link(8, rc.alignment.power_w[k], rc.gains[k] ** 2, 2 * algorithm.radio.noise_power_w,
                             algorithm.radio.bandwidth_hz).rate_bps for k in nodes]
    assert algorithm.link_rate_bps(nodes) == pytest.approx(expected, rel=1e-12)
    assert len(set(np.round(expected, 3))) > 1  # the nodes' distances differ: so do their rates
    assert host_rates("channel", [nodes[:5], nodes[5:]], algorithm) == [
        int(min(expected[:5])), int(min(expected[5:]))]


def test_a_host_whose_coordinator_died_while_it_started_leaves_at_once():
    """A host still importing when its coordinator was killed (its broker gone with it) does not
    wait out the connect timeout for a broker that will never come."""
    from nodes.host import serve

    dead = subprocess.Popen(["true"])
    dead.wait()
    started = time.monotonic()
    assert serve("mqtt://127.0.0.1:9", "testbed", [0, 1], coordinator_pid=dead.pid, connect_timeout_s=30.0) == 0
    assert time.monotonic() - started < 2.0
