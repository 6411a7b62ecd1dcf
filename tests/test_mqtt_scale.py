"""Many emulated nodes over Mosquitto on loopback: node hosts that share only the broker URL serve
one run, and a broker restart under a few hundred nodes is survived with spread-out reconnects
(the connection-storm part of the scale issue; the 10,000-node run is benchmarks/mqtt_scale.py)."""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import paho.mqtt.client as paho
import pytest

from testbed import cli
from testbed.assembly.config import load_config_text
from testbed.ledger.files import read_ledger
from testbed.mqtt import auth, topics
from testbed.mqtt.broker import free_port, parse_broker_url
from testbed.mqtt.network_loop import NetworkLoop
from testbed.orchestration.runner import run_experiment

from conftest import REPO, wait_until
from conftest_mqtt import write_node_keys
from test_faults_mqtt import _metrics  # metrics.csv's rows so far

EXPERIMENT = """
[run]
name = "scale"
seed = 5
mode = "mqtt"
[data]
num_nodes = {nodes}
samples_per_node = 20
dim = 4
[dp_pasgd]
steps = {steps}
tau = 2
batch = 4
lr = 0.5
sigma = 1.0
clip = true           # G = 1 below the logistic model's own bound 2: held by clipping (issue 39)
lipschitz = 1.0
[privacy]
tight_accountant = "none"
[mqtt]
broker_url = "{url}"
run_id = "{run_id}"
emulated = false
round_timeout_s = {round_timeout_s}
connect_timeout_s = 120.0
[output]
figures = false
"""


def _hosts(url: str, run_id: str, nodes: int, hosts: int, *, credentials: Path | None = None,
           tls_ca: Path | None = None, tmp_path: Path | None = None) -> list[subprocess.Popen]:
    """``hosts`` `testbed nodes` processes serving ``nodes`` nodes between them; they know only
    the broker URL and the run id, as on separate machines, and with ``credentials`` (the file of
    `testbed acl`) each gets a file with its own nodes' passwords only, as docs/multi-host.md says."""
    share = nodes // hosts
    procs = []
    for h in range(hosts):
        ids = range(h * share, (h + 1) * share)
        cmd = [sys.executable, "-m", "testbed", "nodes", "--broker", url, "--run", run_id,
               "--first-id", str(ids[0]), "--count", str(share)]
        if tmp_path is not None:  # its own nodes' message keys only, as provisioning gives a board its own
            every_key = auth.load_keys(os.environ[auth.KEYS_ENV], run_id)
            cmd += ["--keys", str(auth.write_keys(tmp_path / f"keys-{h}.json", every_key.only(str(n) for n in ids)))]
        if credentials is not None and tmp_path is not None:
            every = json.loads(credentials.read_text())
            own = tmp_path / f"host-{h}.json"
            own.write_text(json.dumps({str(n): every[str(n)] for n in ids}))
            cmd += ["--credentials", str(own)]
        if tls_ca is not None:
            cmd += ["--tls-ca", str(tls_ca)]
        procs.append(subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
    return procs


def _stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        if p.poll() is None:
            p.kill()
        p.wait()


class StatusWatch:
    """A client of its own that records when each node's `online` reaches the broker (arrival
    time, monotonic s). It reconnects every 20 ms after a broker restart (the nodes wait a jittered
    0.25 s or more), so it is back before them; a node's `online` it finds retained on
    resubscribing counts at that moment (which can only bunch them up)."""

    def __init__(self, url: str, run_id: str):
        self.online: dict[str, list[float]] = {}
        self._lock = threading.Lock()
        parsed = parse_broker_url(url)
        self._client = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id=f"watch-{run_id}")
        self._client.reconnect_delay_set(0.02, 0.02)  # type: ignore[arg-type]  # floats work
        self._client.on_connect = lambda c, u, f, code, p: c.subscribe(topics.all_status(run_id), qos=1)
        self._client.on_message = self._on_message
        self._client.connect(parsed.host, parsed.port)
        self._client.loop_start()

    def _on_message(self, client, userdata, msg) -> None:
        node = topics.parse(msg.topic).node
        if auth.unverified_body(msg.payload) == topics.STATUS_ONLINE:  # a display: sealed, read unverified
            with self._lock:
                self.online.setdefault(node, []).append(time.monotonic())

    def first_online_after(self, t: float) -> dict[str, float]:
        with self._lock:
            return {n: min(x for x in ts if x >= t) for n, ts in self.online.items() if any(x >= t for x in ts)}

    def close(self) -> None:
        self._client.loop_stop()
        self._client.disconnect()


class _CountedClient(paho.Client):
    """A paho client that notes when the loop tries to connect it."""

    def __init__(self) -> None:
        super().__init__(paho.CallbackAPIVersion.VERSION2, client_id="attempts")
        self.attempts: list[float] = []

    def reconnect(self):
        self.attempts.append(time.monotonic())
        return super().reconnect()


class _NotedRandom(random.Random):
    """The loop's jitter source, noting each wait it draws: (its bound b, the wait)."""

    def __init__(self, seed: int) -> None:
        super().__init__(seed)
        self.draws: list[tuple[float, float]] = []

    def uniform(self, a: float, b: float) -> float:
        wait = super().uniform(a, b)
        self.draws.append((b, wait))
        return wait


ATTEMPTS = 7


def test_reconnect_waits_are_jittered_under_a_doubling_bound():
    """Against a port nobody listens on, attempt k + 1 follows attempt k after a wait drawn in
    [0, b_k], b_k = min(0.1 * 2**k, 0.4): never longer than the bound, and not the bound itself
    (without jitter every client of a host would wait exactly b_k and arrive together). The waits
    are the loop's draws; the attempts' clock shows the loop keeps to them (a loaded machine only
    delays a wake-up now and then, so the typical delay is what is bounded)."""
    rng = _NotedRandom(7)
    loop = NetworkLoop(rng=rng)
    client = _CountedClient()
    try:
        loop.add(client, "127.0.0.1", free_port("127.0.0.1"), keepalive_s=30, reconnect_min_s=0.1, reconnect_max_s=0.4)
        wait_until(lambda: len(client.attempts) >= ATTEMPTS, 60, f"{ATTEMPTS} connect attempts")
    finally:
        loop.remove(client)
        loop.close()
    n = ATTEMPTS - 1  # waits between the first ATTEMPTS attempts
    drawn_bounds, drawn = (np.array(x) for x in zip(*rng.draws[:n]))
    bounds = np.minimum(0.1 * 2.0 ** np.arange(n), 0.4)
    np.testing.assert_allclose(drawn_bounds, bounds)  # the bound doubles up to the maximum
    assert np.all((0 <= drawn) & (drawn <= bounds)), (drawn, bounds)
    assert np.mean(drawn / bounds) < 0.8, (drawn, bounds)  # drawn below the bound (mean 0.5), not the bound
    late_s = np.diff(client.attempts[:ATTEMPTS]) - drawn
    assert np.median(late_s) < 0.05, (late_s, drawn)  # each attempt when its wait is over, not at a later tick


@pytest.fixture
def keys(tmp_path, monkeypatch) -> str:
    """Message keys of 300 nodes (conftest_mqtt.write_node_keys), named in the environment: every
    host's `testbed nodes` finds its own there (or is given its own file, :func:`_hosts`)."""
    path = write_node_keys(tmp_path / "keys.json", 300)
    monkeypatch.setenv(auth.KEYS_ENV, path)
    return path


def test_hosts_sharing_only_the_broker_url_serve_one_run(start_mosquitto, tls_files, run_id, tmp_path, monkeypatch):
    """docs/multi-host.md on loopback: `testbed acl` credentials, message keys and ACL, TLS, three
    hosts that each hold their own nodes' passwords and keys and the CA, a coordinator with
    mqtt.emulated = false."""
    nodes, hosts = 90, 3
    secrets = tmp_path / "secrets"
    assert cli.main(["acl", "--run", run_id, "--nodes", str(nodes), "--out", str(secrets)]) == 0
    keys = secrets / "keys.json"
    assert (keys.stat().st_mode & 0o777) == 0o600
    monkeypatch.setenv(auth.KEYS_ENV, str(keys))  # what _hosts gives each host its own share of
    broker = start_mosquitto(acl_file=secrets / "acl", password_file=secrets / "passwords", tls=tls_files)
    credentials = secrets / "credentials.json"
    text = EXPERIMENT.format(nodes=nodes, steps=6, url=broker.url, run_id=run_id, round_timeout_s=30.0)
    config = load_config_text(text, [f"mqtt.credentials='{credentials}'", f"mqtt.tls_ca='{tls_files.cafile}'",
                                     f"mqtt.keys='{keys}'"])
    procs = _hosts(broker.url, run_id, nodes, hosts, credentials=credentials, tls_ca=tls_files.cafile,
                   tmp_path=tmp_path)
    try:
        result = run_experiment(config, out_dir=tmp_path / "r", quiet=True)
        for p in procs:  # the coordinator's stop reaches every host, and each leaves cleanly
            assert p.wait(timeout=30) == 0, p.stderr.read()
    finally:
        _stop(procs)
    assert result.summary["status"] == "completed" and result.summary["rounds"] == 3
    assert [int(row["stragglers"]) for row in _metrics(result.run_dir)] == [0, 0, 0]
    computed = {(e.node, e.round) for e in read_ledger(result.run_dir / "ledger.csv") if e.kind == "compute"}
    assert computed == {(n, r) for n in range(nodes) for r in range(3)}  # every node of every host, every round
    logins = set(re.findall(r"New client connected from .* u'([^']*)'\)", broker.log_text()))
    assert {"coordinator", *map(str, range(nodes))} <= logins  # each under its own name, over TLS
    sim = run_experiment(load_config_text(text.replace('mode = "mqtt"', 'mode = "sim"')), out_dir=tmp_path / "sim",
                         quiet=True)
    np.testing.assert_allclose(np.load(result.run_dir / "final_params.npy"), np.load(sim.run_dir / "final_params.npy"),
                               atol=1e-6)


def test_nodes_come_back_spread_out_after_a_broker_restart(mosquitto_broker, run_id, tmp_path, keys):
    nodes, hosts, outage_s = 300, 3, 2.0
    config = load_config_text(EXPERIMENT.format(nodes=nodes, steps=40, url=mosquitto_broker.url, run_id=run_id,
                                                round_timeout_s=10.0), [f"mqtt.keys='{keys}'"])
    run_dir = tmp_path / "r"
    procs = _hosts(mosquitto_broker.url, run_id, nodes, hosts)
    watch = StatusWatch(mosquitto_broker.url, run_id)
    stopped_at: list[float] = []

    def restart_after_round_two() -> None:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and len(_metrics(run_dir)) < 2:
            time.sleep(0.05)
        mosquitto_broker.stop()
        stopped_at.append(time.monotonic())  # an `online` from now on is a reconnect
        time.sleep(outage_s)
        mosquitto_broker.start()  # same port, nothing retained (no persistence)

    restarter = threading.Thread(target=restart_after_round_two, daemon=True)
    restarter.start()
    try:
        result = run_experiment(config, out_dir=run_dir, quiet=True)
        restarter.join(timeout=5)
        back = watch.first_online_after(stopped_at[0])
    finally:
        watch.close()
        _stop(procs)
    assert result.summary["status"] == "completed" and result.summary["rounds"] == 20
    rows = _metrics(run_dir)
    assert int(rows[-1]["stragglers"]) == 0  # everyone answered once more after the restart

    assert len(back) == nodes  # every node reconnected and announced itself again
    t = np.sort(np.array(list(back.values())) - stopped_at[0] - outage_s)  # s after the restart
    busiest = max(np.searchsorted(t, x + 0.1) - i for i, x in enumerate(t))
    # Spread out: reconnects without jitter come in one burst per host (each host's clients retried
    # on the same tick), i.e. at least a third of the nodes within 100 ms.
    assert busiest <= 0.25 * nodes, f"{busiest} of {nodes} nodes reconnected within 100 ms"
    assert t[int(0.9 * nodes)] - t[int(0.1 * nodes)] >= 0.3, t
    assert t[-1] < 30.0, "the last node took over 30 s to come back"
