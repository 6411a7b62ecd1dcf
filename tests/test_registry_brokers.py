"""The managed-broker registry (testbed.mqtt.brokers): each registered broker starts on loopback,
serves a real paho client, writes a run's ACL in its own format and enforces it where it can, and
leaves no process behind; a run with no broker_url starts the fast one the machine has (Mosquitto
where installed, else the embedded amqtt), or the one ``mqtt.broker`` names, records it in
summary.json, and stops it however the run ends. Network: 127.0.0.1 only.

``mqtt.broker`` is a new config key: the experiment file's JSON Schema gained it on purpose
(:func:`test_the_schema_offers_the_broker_choice`)."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import paho.mqtt.client as paho
import pytest
from hypothesis import given, strategies as st

from testbed.assembly.config import load_config_text, replace
from testbed.cli.run import format_summary
from testbed.errors import ConfigError, UserError
from testbed.mqtt import acl, topics
from testbed.mqtt.brokers import mosquitto, registry
from testbed.mqtt.brokers.mosquitto import MosquittoBroker
from testbed.orchestration.runner import run_experiment

from conftest import require_tool

REPO = Path(__file__).resolve().parents[1]
EXPERIMENT = """
[run]
name = "brokers"
seed = 3
mode = "mqtt"
[data]
num_nodes = 3
samples_per_node = 40
dim = 4
[dp_pasgd]
steps = 6
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


def _need_mosquitto() -> None:
    require_tool("mosquitto", mosquitto.find_binary() is not None,
                 f"not on PATH or in {', '.join(mosquitto.SBIN_DIRS)} (apt-get install mosquitto)")


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped by its parent, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def _gone_within(pid: int, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while _alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _child_pid(broker: object) -> int:
    """The process a managed broker started (both kinds keep it as ``_proc``)."""
    return broker._proc.pid  # type: ignore[attr-defined]


class _Client:
    """A plain paho client (MQTT 3.1.1, which every registered broker speaks) that records what it
    receives."""

    def __init__(self, url: str, username: str | None = None, password: str | None = None):
        host, port = url.removeprefix("mqtt://").rsplit(":", 1)
        self.received: queue.Queue[tuple[str, bytes]] = queue.Queue()
        self.connected: queue.Queue[int] = queue.Queue()
        self.paho = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id=f"t-{uuid.uuid4().hex[:8]}",
                                protocol=paho.MQTTv311)
        if username is not None:
            self.paho.username_pw_set(username, password)
        self.paho.on_connect = lambda c, u, flags, rc, props: self.connected.put(rc.value)
        self.paho.on_message = lambda c, u, msg: self.received.put((msg.topic, msg.payload))
        self.paho.connect(host, int(port))
        self.paho.loop_start()

    def connect_code(self) -> int:
        """The CONNACK's return code (0: accepted)."""
        return self.connected.get(timeout=10)

    def subscribe(self, topic: str) -> None:
        done: queue.Queue[bool] = queue.Queue()
        self.paho.on_subscribe = lambda *args: done.put(True)
        self.paho.subscribe(topic, qos=1)
        assert done.get(timeout=10)

    def publish(self, topic: str, payload: bytes) -> None:
        self.paho.publish(topic, payload, qos=1).wait_for_publish(timeout=10)

    def close(self) -> None:
        self.paho.disconnect()
        self.paho.loop_stop()


# ---- the registry ----------------------------------------------------------------------------


def test_the_registry_lists_each_broker_module_once():
    regs = registry.registrations()
    assert {"embedded", "mosquitto"} <= set(regs) and registry.AUTO not in regs
    assert registry.names() == list(regs) == sorted(regs)
    for name, reg in regs.items():
        assert reg.name == name and reg.description and callable(reg.make)
    assert registry.with_access() == [n for n, r in regs.items() if r.access is not None]
    assert "mosquitto" in registry.with_access() and "embedded" not in registry.with_access()


def test_auto_is_mosquitto_where_installed_else_embedded(monkeypatch):
    _need_mosquitto()
    assert registry.choose("auto").name == "mosquitto"
    monkeypatch.setattr(mosquitto, "find_binary", lambda name="mosquitto": None)
    assert registry.choose("auto").name == "embedded"
    with pytest.raises(ConfigError, match=r"mqtt.broker: mosquitto: the mosquitto binary is not on PATH"):
        registry.choose("mosquitto")


def test_an_unknown_broker_is_one_line_naming_the_key():
    with pytest.raises(ConfigError, match=r"mqtt.broker: must be auto or one of .*embedded.*mosquitto.*'rabbit'"):
        registry.choose("rabbit")


def test_mosquitto_is_found_in_sbin_when_path_lacks_it(monkeypatch, tmp_path):
    _need_mosquitto()
    monkeypatch.setenv("PATH", str(tmp_path))  # an ordinary user's PATH, without /usr/sbin
    found = mosquitto.find_binary()
    assert found is not None and os.path.dirname(found) in mosquitto.SBIN_DIRS
    assert mosquitto.find_binary("/no/such/mosquitto") is None  # a path is taken as it is


# ---- each registered broker ------------------------------------------------------------------


@pytest.fixture(params=registry.names())
def registration(request) -> registry.Registration:
    reg = registry.get(request.param)
    if reg.name == "mosquitto":
        _need_mosquitto()
    elif (why := reg.missing()) is not None:  # a plugin's broker this machine cannot run: nothing to serve
        pytest.skip(f"{reg.name}: {why}")
    return reg


def test_each_broker_serves_a_paho_client_on_loopback_and_leaves_no_process(registration, run_id):
    broker = registration.make(registry.BrokerOptions(nodes=2)).start()
    try:
        assert broker.url.startswith("mqtt://127.0.0.1:")
        pid = _child_pid(broker)
        assert _alive(pid)
        reader, writer = _Client(broker.url), _Client(broker.url)
        try:
            assert reader.connect_code() == 0 and writer.connect_code() == 0
            reader.subscribe(topics.all_up(run_id))
            writer.publish(topics.up(run_id, "7"), b"hello")
            assert reader.received.get(timeout=10) == (topics.up(run_id, "7"), b"hello")
        finally:
            reader.close()
            writer.close()
    finally:
        broker.stop()
    assert not _alive(pid)
    broker.stop()  # twice: nothing left to stop


@pytest.mark.parametrize("name", [n for n, r in registry.registrations().items() if r.access is not None])
def test_each_broker_with_an_access_format_writes_its_files_privately(name, tmp_path):
    fmt = registry.registrations()[name].access
    access = acl.generate_access("r1", ["0", "1"])
    fmt.write(tmp_path, access)
    for name in fmt.files:
        assert (tmp_path / name).stat().st_mode & 0o077 == 0
        assert "coordinator" in (tmp_path / name).read_text()
    for nodes, tls in ((2, False), (5000, True)):
        conf = fmt.config(fmt.installed_dir, 8883, nodes, tls)
        assert all(f"{fmt.installed_dir}/{name}" in conf for name in fmt.files)
        assert ("cert.pem" in conf) == tls


@pytest.mark.parametrize("protocol", [paho.MQTTv311, paho.MQTTv5], ids=["3.1.1", "5"])
def test_mosquitto_enforces_the_run_access_it_was_given(run_id, protocol):
    _need_mosquitto()
    access = acl.generate_access(run_id, ["a", "b"])
    broker = registry.get("mosquitto").make(registry.BrokerOptions(nodes=2, access=access)).start()
    try:
        anonymous = _Client(broker.url)
        assert anonymous.connect_code() != 0
        anonymous.close()
        wrong = _Client(broker.url, "a", access.passwords["b"])
        assert wrong.connect_code() != 0
        wrong.close()
        coordinator = _Client(broker.url, "coordinator", access.passwords["coordinator"])
        node = _Client(broker.url, "a", access.passwords["a"])
        try:
            assert coordinator.connect_code() == 0 and node.connect_code() == 0
            coordinator.subscribe(topics.all_up(run_id))
            node.publish(topics.up(run_id, "b"), b"forged")  # another node's uplink: dropped
            node.publish(topics.up(run_id, "a"), b"own")
            assert coordinator.received.get(timeout=10) == (topics.up(run_id, "a"), b"own")
            assert coordinator.received.empty()
        finally:
            coordinator.close()
            node.close()
    finally:
        broker.stop()


def test_a_process_killed_outright_leaves_no_managed_mosquitto(tmp_path):
    _need_mosquitto()
    script = ("import sys, time\n"
              "from testbed.mqtt.brokers import registry\n"
              "b = registry.get('mosquitto').make(registry.BrokerOptions()).start()\n"
              "print(b._proc.pid, flush=True)\n"
              "time.sleep(60)\n")
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE, text=True)
    try:
        pid = int(proc.stdout.readline())
        assert _alive(pid)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        assert _gone_within(pid, 10), "the killed process's mosquitto is still running"
    finally:
        proc.kill()
        proc.wait()


# ---- the acl's format ------------------------------------------------------------------------

_IDS = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,12}", fullmatch=True).filter(
    lambda s: s not in ("coordinator", topics.CHANNEL, acl.WATCH_USER))


@given(nodes=st.lists(_IDS, min_size=1, max_size=6))
def test_mosquitto_acl_text_says_exactly_the_grants(nodes):
    """Read back, the acl_file is the grants: one block per user, each rule in order, nothing else;
    and no node may write where another node's rules let it read or write."""
    grants = acl.run_grants("r", nodes)
    blocks = mosquitto.acl_text(grants).split("\n\n")[1:]
    parsed = []
    for block in blocks:
        head, *rules = block.strip().splitlines()
        parsed.append(acl.Grant(head.removeprefix("user "),
                                tuple(tuple(r.removeprefix("topic ").split(" ", 1)) for r in rules)))
    assert tuple(parsed) == grants
    assert [g.user for g in grants[3:]] == list(dict.fromkeys(nodes))
    for g in grants[3:]:
        for other in grants[3:]:
            if other.user != g.user:
                assert not set(g.topics("write")) & set(other.topics("write") + other.topics("read"))


# ---- runs ------------------------------------------------------------------------------------


def _config(**mqtt):
    return replace(load_config_text(EXPERIMENT), mqtt={"run_id": f"t{uuid.uuid4().hex[:10]}", **mqtt})


def test_a_run_with_no_broker_url_starts_mosquitto_and_records_it(tmp_path):
    _need_mosquitto()
    result = run_experiment(_config(), out_dir=tmp_path / "r", quiet=True)
    assert result.summary["status"] == "completed"
    broker = json.loads((tmp_path / "r" / "summary.json").read_text())["broker"]
    assert broker["kind"] == "mosquitto" and broker["url"].startswith("mqtt://127.0.0.1:")
    assert f"broker       mosquitto at {broker['url']}" in format_summary(result.summary).splitlines()


def test_forcing_the_embedded_broker_runs_on_it_with_the_same_numbers(tmp_path):
    _need_mosquitto()
    embedded = run_experiment(_config(broker="embedded"), out_dir=tmp_path / "e", quiet=True)
    assert embedded.summary["status"] == "completed" and embedded.summary["broker"]["kind"] == "embedded"
    default = run_experiment(_config(), out_dir=tmp_path / "m", quiet=True)
    assert default.summary["broker"]["kind"] == "mosquitto"
    # The broker never changes results: the same model, from the same streams.
    assert (tmp_path / "e" / "final_params.npy").read_bytes() == (tmp_path / "m" / "final_params.npy").read_bytes()


def test_auto_without_mosquitto_is_the_embedded_broker(tmp_path, monkeypatch):
    monkeypatch.setattr(mosquitto, "find_binary", lambda name="mosquitto": None)
    result = run_experiment(_config(), out_dir=tmp_path / "r", quiet=True)
    assert result.summary["status"] == "completed" and result.summary["broker"]["kind"] == "embedded"


def test_a_given_broker_url_is_recorded_as_external(tmp_path, mosquitto_broker):
    result = run_experiment(_config(broker_url=mosquitto_broker.url), out_dir=tmp_path / "r", quiet=True)
    assert result.summary["broker"] == {"kind": "external", "url": mosquitto_broker.url}


def test_sim_records_no_broker(tmp_path):
    result = run_experiment(replace(load_config_text(EXPERIMENT), run={"mode": "sim"}), out_dir=tmp_path / "r",
                            quiet=True)
    assert result.summary["broker"] is None


def test_a_run_on_a_missing_broker_is_refused_before_it_starts(tmp_path, monkeypatch):
    monkeypatch.setattr(mosquitto, "find_binary", lambda name="mosquitto": None)
    with pytest.raises(ConfigError, match="mqtt.broker: mosquitto: the mosquitto binary is not on PATH"):
        run_experiment(_config(broker="mosquitto"), out_dir=tmp_path / "r", quiet=True)
    assert not (tmp_path / "r").exists()


def test_a_broker_choice_beside_a_broker_url_is_refused():
    with pytest.raises(ConfigError, match="mqtt.broker: 'embedded' names the broker a run starts itself"):
        _config(broker="embedded", broker_url="mqtt://127.0.0.1:1883")
    with pytest.raises(ConfigError, match="mqtt.broker"):
        _config(broker="Not A Name")


@pytest.fixture
def started_mosquittos(monkeypatch) -> list[MosquittoBroker]:
    """Every MosquittoBroker started during the test."""
    started: list[MosquittoBroker] = []
    start = MosquittoBroker.start

    def recording(self: MosquittoBroker) -> MosquittoBroker:
        started.append(self)
        return start(self)

    monkeypatch.setattr(MosquittoBroker, "start", recording)
    return started


@pytest.mark.parametrize("fault", ["nodes never connect", "interrupted mid-run"])
def test_the_run_broker_stops_when_the_run_fails_or_is_interrupted(tmp_path, monkeypatch, started_mosquittos,
                                                                    fault, board_keys):
    _need_mosquitto()
    if fault == "nodes never connect":
        config, expected = _config(emulated=False, connect_timeout_s=1.0, keys=board_keys), UserError
    else:
        from testbed.orchestration.coordinator import MqttNodes

        def interrupted(self, *args, **kwargs):
            raise KeyboardInterrupt

        monkeypatch.setattr(MqttNodes, "round", interrupted)
        config, expected = _config(), KeyboardInterrupt
    with pytest.raises(expected):
        run_experiment(config, out_dir=tmp_path / "r", quiet=True)
    assert len(started_mosquittos) == 1
    broker = started_mosquittos[0]
    assert not broker.running and broker.log_path is None  # stopped, its temporary directory gone
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["status"] == "failed"


def test_with_credentials_the_run_broker_enforces_the_run_acl(tmp_path, started_mosquittos):
    _need_mosquitto()
    from testbed import cli

    config = _config()
    secrets = tmp_path / "secrets"
    assert cli.main(["acl", "--run", config.mqtt.run_id, "--nodes", "3", "--out", str(secrets)]) == 0
    result = run_experiment(replace(config, mqtt={"credentials": str(secrets / "credentials.json")}),
                            out_dir=tmp_path / "r", quiet=True)
    assert result.summary["status"] == "completed" and result.summary["broker"]["kind"] == "mosquitto"
    broker = started_mosquittos[0]
    assert broker.access is not None and broker.bind_client_ids
    assert {g.user for g in broker.access.grants} == {"coordinator", "channel", "watch", "0", "1", "2"}


def test_the_schema_offers_the_broker_choice():
    """A change of the JSON Schema on purpose: [mqtt] gained ``broker``."""
    from testbed.assembly.config import json_schema

    prop = next(d for d in json_schema()["$defs"].values() if d.get("title") == "MqttSection")["properties"]["broker"]
    assert prop["default"] == "auto" and prop["type"] == "string"



@pytest.mark.parametrize("entries", [{"0": "x", "1": "y", "2": "z"}, {"coordinator": "c", "0": ["not", "text"]}],
                         ids=["no coordinator", "a password that is not text"])
def test_a_credentials_file_refused_starts_no_broker(tmp_path, started_mosquittos, entries):
    _need_mosquitto()
    creds = tmp_path / "credentials.json"
    creds.write_text(json.dumps(entries))
    with pytest.raises(ConfigError, match="mqtt.credentials"):
        run_experiment(_config(credentials=str(creds)), out_dir=tmp_path / "r", quiet=True)
    assert started_mosquittos == []  # refused before any broker started
