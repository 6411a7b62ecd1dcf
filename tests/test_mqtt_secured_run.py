"""`testbed run EXPERIMENT --mode mqtt` end to end against a secured Mosquitto, as a user sets it up:
per-node credentials and the ACL from `testbed acl`, the broker refusing anonymous clients, the
experiment's `[mqtt]` pointing at it with `credentials` (and `tls_ca` over mqtts://), emulated node
hosts started by the run logging in under their own ids. A wrong password for one node must stop the
run at once with an error naming that node. Network: 127.0.0.1 only."""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest

from testbed import cli
from testbed.assembly.config import replace, to_toml
from testbed.ledger.files import read_ledger
from testbed.mqtt.client import BrokerRefused, MqttClient

from test_mqtt_runtime import _config, _metrics, _testbed

NODES = 4
ROUNDS = 2


@pytest.fixture(params=["mqtt", "mqtts"])
def secured_broker(request, tmp_path, run_id, start_mosquitto):
    """(broker, credentials.json, tls CA or None): a Mosquitto with the password file and ACL that
    `testbed acl` wrote for nodes 0..NODES-1 of `run_id`, plain or (mqtts) with TLS."""
    secrets = tmp_path / "secrets"
    assert cli.main(["acl", "--run", run_id, "--nodes", str(NODES), "--out", str(secrets)]) == 0
    tls = request.getfixturevalue("tls_files") if request.param == "mqtts" else None
    broker = start_mosquitto(acl_file=secrets / "acl", password_file=secrets / "passwords", tls=tls)
    assert broker.url.startswith(f"{request.param}://")
    return broker, secrets / "credentials.json", tls.cafile if tls else None


def _run(broker, run_id: str, credentials: Path, tls_ca: Path | None, tmp_path: Path,
         ) -> tuple[subprocess.CompletedProcess, Path, float]:
    """`testbed run exp.toml --mode mqtt` with emulated nodes over two host processes; returns the
    finished process, the run directory and the wall time."""
    mqtt = {"broker_url": broker.url, "run_id": run_id, "credentials": str(credentials), "hosts": 2,
            "round_timeout_s": 10.0, "connect_timeout_s": 20.0}
    if tls_ca is not None:
        mqtt["tls_ca"] = str(tls_ca)
    config = replace(_config(mqtt=mqtt, dp_pasgd={"steps": 5 * ROUNDS}), run={"mode": "sim"})
    exp, run_dir = tmp_path / "exp.toml", tmp_path / "run"
    exp.write_text(to_toml(config))
    t0 = time.monotonic()
    proc = _testbed("run", str(exp), "--mode", "mqtt", "--out", str(run_dir), "--quiet",
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), run_dir, time.monotonic() - t0


def _logins(broker) -> set[str]:
    """The usernames Mosquitto logged a successful connection for."""
    return set(re.findall(r"New client connected from .* u'([^']*)'\)", broker.log_text()))


def test_secured_run_completes_with_every_node(secured_broker, run_id, tmp_path):
    broker, credentials, tls_ca = secured_broker
    done, run_dir, _ = _run(broker, run_id, credentials, tls_ca, tmp_path)
    assert done.returncode == 0, done.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["mode"] == "mqtt" and summary["rounds"] == ROUNDS
    assert [int(r["stragglers"]) for r in _metrics(run_dir)] == [0] * ROUNDS
    computed = {(e.node, e.round) for e in read_ledger(run_dir / "ledger.csv") if e.kind == "compute"}
    assert computed == {(n, r) for n in range(NODES) for r in range(ROUNDS)}
    assert all(summary["nodes"][str(n)]["rounds"] == ROUNDS for n in range(NODES))
    # every node and the coordinator logged in under its own name, on a broker that refuses
    # anonymous clients and enforces the ACL of `testbed acl`
    assert {"coordinator", *map(str, range(NODES))} <= _logins(broker)
    with pytest.raises(BrokerRefused):
        MqttClient.for_node(broker.url, run_id, "0", tls_ca=tls_ca).connect(timeout_s=5)


def test_wrong_password_for_one_node_fails_naming_it(secured_broker, run_id, tmp_path):
    broker, credentials, tls_ca = secured_broker
    passwords = json.loads(credentials.read_text())
    passwords["2"] = "not-" + passwords["2"]
    tampered = tmp_path / "tampered.json"
    tampered.write_text(json.dumps(passwords))
    done, run_dir, wall_s = _run(broker, run_id, tampered, tls_ca, tmp_path)
    # The run cannot start: the broker refuses node 2, its host exits, and the run stops with one
    # line on stderr naming node 2 (its client id tb-RUN-2-...) and why, status 2 and no waiting
    # out connect_timeout_s (20 s) for a node that will never come.
    assert done.returncode == 2, done.stderr
    error = done.stderr.strip().splitlines()[-1]
    assert error.startswith("testbed: the emulated host of nodes 2, 3 exited"), done.stderr
    assert re.search(rf"refused client 'tb-{run_id}-2-\w+'.*not authori[sz]ed", error, re.IGNORECASE), done.stderr
    assert wall_s < 15
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["rounds"] == 0
    assert not list(read_ledger(run_dir / "ledger.csv"))
    assert "2" not in _logins(broker)


def test_credentials_without_a_node_are_a_config_error(secured_broker, run_id, tmp_path):
    broker, credentials, tls_ca = secured_broker
    passwords = json.loads(credentials.read_text())
    del passwords["3"]
    short = tmp_path / "short.json"
    short.write_text(json.dumps(passwords))
    done, run_dir, _ = _run(broker, run_id, short, tls_ca, tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        f"testbed: config error: mqtt.credentials: {short} has no password for node(s) 3 "
        "(`testbed acl --run RUN --nodes N` writes one for each of nodes 0..N-1)")
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "failed"
