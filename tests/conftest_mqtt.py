"""Pytest fixtures for MQTT tests: brokers on loopback (always stopped), run ids and clients (always
closed). Registered from tests/conftest.py with `pytest_plugins = ["conftest_mqtt"]`."""

from __future__ import annotations

import json
import os
import re
import subprocess
import tomllib
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from ledger_invariant import FIGURES, PLANNED, under_counts
from testbed.ledger.events import Event
from testbed.ledger.files import read_whole_rows
from testbed.ledger.node import merge_sessions
from testbed.mqtt import acl, auth
from testbed.mqtt.brokers import mosquitto
from testbed.mqtt.brokers.mosquitto import MosquittoBroker, TlsFiles
from testbed.mqtt.client import MqttClient
from testbed.mqtt.embedded_broker import EmbeddedBroker

from conftest import require_command


def write_node_keys(path: Path, nodes: int | list[int] = 8) -> str:
    """A keys file (testbed.mqtt.auth, as `testbed provision` writes them) of nodes 0..nodes-1 (or
    of the ids listed), for a coordinator's ``mqtt.keys`` and for `testbed node --keys`, which take
    the keys of their own nodes from it; its path."""
    ids = range(nodes) if isinstance(nodes, int) else nodes
    auth.write_keys(path, auth.Keys("any", {str(n): auth.new_key() for n in ids}))
    return str(path)


@pytest.fixture
def board_keys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A keys file of nodes 0..7 (:func:`write_node_keys`), named in this test's environment as a run
    names its hosts' (testbed.mqtt.auth.KEYS_ENV): the `testbed node(s)` processes the test starts
    find their keys there. Its path; :func:`with_board_keys` gives it to the test's coordinators."""
    path = write_node_keys(tmp_path / "keys.json")
    monkeypatch.setenv(auth.KEYS_ENV, path)
    return path


def with_board_keys(mqtt: dict) -> dict:
    """An [mqtt] section's overrides, with ``keys`` = the file of :func:`board_keys` when the run's
    boards are started by the test (``emulated`` false) and authenticated."""
    if mqtt.get("emulated") is False and mqtt.get("authenticate", True) and "keys" not in mqtt:
        return {**mqtt, "keys": os.environ[auth.KEYS_ENV]}
    return mqtt


def keys_of_test(run: str) -> "auth.Keys":
    """The keys of :func:`board_keys`, for a host a test serves in its own process (nodes.host.serve)."""
    return auth.load_keys(os.environ[auth.KEYS_ENV], run)


@pytest.fixture
def embedded_broker() -> Iterator[EmbeddedBroker]:
    """A running amqtt broker on 127.0.0.1 and a free port."""
    broker = EmbeddedBroker()
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()


@pytest.fixture
def start_mosquitto() -> Iterator[Callable[..., MosquittoBroker]]:
    """`start_mosquitto(**kwargs)` starts a `MosquittoBroker(**kwargs)` on 127.0.0.1 (password file,
    ACL, TLS...) and stops it at teardown; where mosquitto is absent, skips (fails under CI=true)."""
    require_command("mosquitto", "apt-get install mosquitto")
    started: list[MosquittoBroker] = []

    def _start(**kwargs) -> MosquittoBroker:
        broker = MosquittoBroker(**kwargs)
        started.append(broker)
        return broker.start()

    yield _start
    for broker in reversed(started):
        broker.stop()


@pytest.fixture
def mosquitto_broker(start_mosquitto: Callable[..., MosquittoBroker]) -> MosquittoBroker:
    """A running anonymous mosquitto on 127.0.0.1 and a free port (see start_mosquitto)."""
    return start_mosquitto()


@pytest.fixture
def tls_files(tmp_path: Path) -> TlsFiles:
    """A self-signed EC certificate for 127.0.0.1 (its own CA) and its key, for a TLS listener
    (`MosquittoBroker(tls=...)`) and clients' `tls_ca`; where openssl is absent, skips (fails under CI=true)."""
    require_command("openssl", "apt-get install openssl")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return TlsFiles(cafile=cert, certfile=cert, keyfile=key)


@pytest.fixture(params=["amqtt", "mosquitto"])
def broker(request: pytest.FixtureRequest) -> EmbeddedBroker | MosquittoBroker:
    """Each test runs against both brokers; both have `.url`, `.start()` and `.stop()`."""
    return request.getfixturevalue("embedded_broker" if request.param == "amqtt" else "mosquitto_broker")


@pytest.fixture
def run_id() -> str:
    """A fresh run id, so retained messages of other tests never match."""
    return f"t{uuid.uuid4().hex[:12]}"


@pytest.fixture
def secured_mosquitto(tmp_path: Path, run_id: str, start_mosquitto: Callable[..., MosquittoBroker]
                      ) -> tuple[MosquittoBroker, dict[str, str]]:
    """Mosquitto with the run's ACL and per-user passwords for nodes "a", "b" and the coordinator.

    Returns (broker, {username: password}).
    """
    access = acl.generate_access(run_id, ["a", "b"])
    broker = start_mosquitto(acl_file=mosquitto.write_acl_file(tmp_path / "acl", access.grants),
                             password_file=mosquitto.write_password_file(tmp_path / "passwords", access.passwords))
    return broker, dict(access.passwords)


@pytest.fixture
def connect() -> Iterator[Callable[..., MqttClient]]:
    """`connect(client, timeout_s=10)` connects `client` and closes it at teardown."""
    made: list[MqttClient] = []

    def _connect(client: MqttClient, timeout_s: float = 10.0) -> MqttClient:
        made.append(client)
        return client.connect(timeout_s)

    yield _connect
    for client in reversed(made):
        client.close(timeout_s=1.0)


_NODE_LEDGER = re.compile(r"ledger-(?P<run>.+)-(?P<session>[0-9a-f]{16})-node(?P<node>\d+)\.csv")


@pytest.fixture(autouse=True)
def _no_node_ledger_above_the_summary(request: pytest.FixtureRequest) -> Iterator[None]:
    """Invariant 1 after every test whose run had nodes with state directories under its tmp_path:
    no node's own ledgers (``ledger-RUN-SESSION-nodeN.csv``, one per session), summed over every
    session of a run (the summary's ``sessions``: the first run and each ``--resume``), show more ε,
    energy, bytes, steps or rounds than the run's summary.json says of the node. A round that
    several sessions ran (re-run after a resume) counts its compute and communication once per
    session (spent again) and its release once (the same values again). New MQTT tests get the
    check for free by keeping their run and state directories under tmp_path."""
    yield
    tmp = request.node.funcargs.get("tmp_path")
    if tmp is None or not tmp.exists():
        return
    ledgers = [(m["run"], m["session"], p) for p in tmp.rglob("ledger-*-node*.csv")
               if (m := _NODE_LEDGER.fullmatch(p.name))]
    if not ledgers:
        return
    run_of: dict[str, int] = {}  # session → index of its run's summary
    summaries = []
    for path in tmp.rglob("summary.json"):
        try:
            summary = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(summary, dict) and summary.get("session"):
            summaries.append(summary)
            for session in summary.get("sessions") or [summary["session"]]:
                run_of[session] = len(summaries) - 1
    # A session the summary does not list (a run directory that lost its record of them) belongs to
    # the one run of its run id, when one summary alone is of that run id.
    by_run_id: dict[str, list[int]] = {}
    for i, summary in enumerate(summaries):
        if (run_id := _run_id(summary)) is not None:
            by_run_id.setdefault(run_id, []).append(i)
    by_node: dict[tuple[int, int], list[list[Event]]] = {}  # (run, node) → its events in each session
    for run_id, session, path in ledgers:
        run = run_of.get(session)
        if run is None and len(by_run_id.get(run_id, ())) == 1:
            run = by_run_id[run_id][0]
        if run is not None:
            node, events = _node_events(path)
            by_node.setdefault((run, node), []).append(events)
    problems = []
    for (run, node), sessions in sorted(by_node.items(), key=lambda item: item[0]):
        summary = summaries[run]
        # A node that never reported (it died) is `unconfirmed`: what it spent after its last
        # answer is charged at the plan, its seconds and joules an estimate (the costliest earlier
        # event), so only the planned figures and ε are held.
        estimated = summary["nodes"].get(str(node), {}).get("ledger_check") == "unconfirmed"
        problems += [f"node {node}'s ledgers of {len(sessions)} session(s): {line}"
                     for line in under_counts(summary, [merge_sessions(node, sessions)],
                                              PLANNED if estimated else FIGURES)]
    assert problems == [], "a node's own ledger shows more than the run's summary:\n" + "\n".join(problems)


def _run_id(summary: dict) -> str | None:
    """mqtt.run_id of the run whose summary this is (its run directory's config.toml), or None."""
    try:
        config = tomllib.loads((Path(summary["run_dir"]) / "config.toml").read_text())
        return str(config["mqtt"]["run_id"])
    except (OSError, KeyError, TypeError, ValueError):
        return None


def _node_events(path: Path) -> tuple[int, list[Event]]:
    """(node, events) of a node's ledger file as its node keeps it (read_whole_rows: a last line
    cut by a kill is left out, never released)."""
    events = read_whole_rows(path)
    return (events[0].node if events else int(_NODE_LEDGER.fullmatch(path.name)["node"])), events
