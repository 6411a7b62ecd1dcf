"""The fence around the MQTT speed layer (testbed.mqtt.fence): the installed paho-mqtt and amqtt hold
every internal the layer's tables declare; one that differs (a method's parameters, code that no
longer calls an override, a packet dict with another key, a missing attribute, a fake module) turns
the layer off with one warning naming it, and the plain client (amqtt's stock broker) then carries
the same messages; ``TESTBED_MQTT_SPEEDUPS=0`` turns paho's layer off without a warning, and a run
so equals the sped-up run bit for bit."""

from __future__ import annotations

import collections
import logging
import sys
import threading
import time
import types
from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import given, strategies as st

import paho.mqtt.client as paho
from paho.mqtt.properties import Properties

from testbed.assembly.config import load_config_text, replace
from testbed.errors import UserError
from testbed.ledger.files import read_ledger
from testbed.mqtt import wire
from testbed.mqtt import embedded_broker, fence, paho_speedups, topics
from testbed.mqtt.client import MqttClient
from testbed.orchestration.runner import run_experiment
from testbed.reports.results import read_checkpoint, read_metrics

from conftest import require_module

_packet = require_module("paho.mqtt._packet", "node")


@pytest.fixture
def fresh_fence(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The speed layer's choices made afresh in this test (and forgotten after it), with paho's
    decoder as paho ships it and the switch unset."""
    monkeypatch.delenv(fence.SWITCH, raising=False)
    monkeypatch.setattr(_packet, "Properties", Properties)
    paho_speedups.client_class.cache_clear()
    embedded_broker._broker_class.cache_clear()
    yield
    paho_speedups.client_class.cache_clear()
    embedded_broker._broker_class.cache_clear()


def _fence_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == fence.__name__ and r.levelno >= logging.WARNING]


def test_the_installed_packages_hold_every_declared_internal(fresh_fence, caplog):
    """What pyproject.toml pins is what the tables were written against: the layer is on."""
    assert fence.differences(paho_speedups.PAHO_INTERNALS) == []
    assert fence.differences(embedded_broker.AMQTT_INTERNALS) == []
    assert paho_speedups.client_class() is paho_speedups.Client
    assert embedded_broker._broker_class().__name__ == "OwnSubscriptionsBroker"
    assert _packet.Properties is paho_speedups.SharedTableProperties  # installed with the client class
    assert _fence_warnings(caplog) == []


# ---- paho: each kind of difference, made for real on paho's own classes -------------------------

def _signature_changed(monkeypatch: pytest.MonkeyPatch) -> str:
    original = paho.Client._sock_recv

    def _sock_recv(self, bufsize, flags=0):  # noqa: ARG001  paho's reads go on working
        return original(self, bufsize)

    monkeypatch.setattr(paho.Client, "_sock_recv", _sock_recv)
    return "paho.mqtt.client.Client._sock_recv: takes (self, bufsize, flags=0), not (self, bufsize)"


def _override_not_reached(monkeypatch: pytest.MonkeyPatch) -> str:
    original = paho.Client._packet_handle

    def _packet_handle(self):
        return original(self)

    monkeypatch.setattr(paho.Client, "_packet_handle", _packet_handle)
    return "paho.mqtt.client.Client._packet_handle: no longer uses _handle_publish, _handle_pubackcomp"


class _TaggingQueue(collections.deque):
    """paho's queue of packets to send, as if paho put another key in each packet's dict."""

    def append(self, packet: dict) -> None:
        super().append({**packet, "retries": 0})


def _packet_key_added(monkeypatch: pytest.MonkeyPatch) -> str:
    original = paho.Client.__init__

    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        self._out_packet = _TaggingQueue()

    monkeypatch.setattr(paho.Client, "__init__", __init__)
    return ("a packet paho.mqtt.client.Client._packet_queue queues: has keys command, info, mid, packet, pos, qos, "
            "retries, to_process, not command, info, mid, packet, pos, qos, to_process")


def _fake_decoder_module(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setitem(sys.modules, "paho.mqtt._packet", types.ModuleType("paho.mqtt._packet"))
    return "paho.mqtt._packet.Properties: cannot be read (AttributeError: "


def _method_missing(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.delattr(paho.Client, "_do_on_publish")
    return "paho.mqtt.client.Client._do_on_publish: cannot be read (AttributeError: "


#: Differences paho's plain client still works with (the exchange below runs over them).
WORKING = {"signature": _signature_changed, "not-reached": _override_not_reached, "packet-key": _packet_key_added,
           "fake-module": _fake_decoder_module}


@pytest.mark.parametrize("change", [*WORKING.values(), _method_missing], ids=[*WORKING, "missing"])
def test_a_changed_paho_internal_falls_back_to_the_plain_client_with_one_warning(fresh_fence, monkeypatch, caplog,
                                                                                 change):
    said = change(monkeypatch)
    assert paho_speedups.client_class() is paho.Client
    assert paho_speedups.client_class() is paho.Client  # decided once: no second warning
    warned = _fence_warnings(caplog)
    assert len(warned) == 1 and said in warned[0], warned
    assert warned[0].startswith("testbed.mqtt.paho_speedups off: paho-mqtt 2.")
    assert warned[0].endswith("paho's plain client (slower, the same results) instead")
    assert _packet.Properties is Properties or "_packet" in said  # the decoder left as paho ships it


def test_many_first_calls_at_once_check_once_and_warn_once(fresh_fence, monkeypatch, caplog):
    _signature_changed(monkeypatch)
    start = threading.Barrier(8)
    chosen: list[type] = []

    def first() -> None:
        start.wait()
        chosen.append(paho_speedups.client_class())

    threads = [threading.Thread(target=first) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert chosen == [paho.Client] * 8 and len(_fence_warnings(caplog)) == 1


@pytest.mark.parametrize("value, chosen", [("0", paho.Client), ("1", paho_speedups.Client), ("", paho_speedups.Client)],
                         ids=["off", "on", "empty"])
def test_the_switch_turns_pahos_layer_off_without_a_warning(fresh_fence, monkeypatch, caplog, value, chosen):
    monkeypatch.setenv(fence.SWITCH, value)
    caplog.set_level(logging.INFO, logger=fence.__name__)
    assert paho_speedups.client_class() is chosen
    assert _fence_warnings(caplog) == []
    assert any("TESTBED_MQTT_SPEEDUPS=0" in r.getMessage() for r in caplog.records) == (value == "0")
    assert (_packet.Properties is Properties) == (value == "0")
    assert embedded_broker._broker_class().__name__ == "OwnSubscriptionsBroker"  # amqtt 0.12's mends stay


@pytest.mark.parametrize("value", ["no", "false", " 0", "2"])
def test_a_switch_value_other_than_0_or_1_is_one_line(fresh_fence, monkeypatch, value):
    monkeypatch.setenv(fence.SWITCH, value)
    with pytest.raises(UserError, match=rf"^TESTBED_MQTT_SPEEDUPS must be 0 .* or 1 .*, not {value!r}$"):
        paho_speedups.client_class()


# ---- what the fallback carries equals what the speed layer carries ------------------------------

def _messages(run: str) -> list[tuple[str, bytes]]:
    """(topic, payload) of uplinks of two nodes (one of 300 kB: several reads), a downlink and a
    broadcast, each encoded once so that both clients are handed the same bytes."""
    rng = np.random.default_rng(7)
    out = []
    for r in range(3):
        for node, size in (("1", 5), ("2", 40_000)):
            tensors = {"update": rng.standard_normal(size), "count": np.array([r, size])}
            out.append((topics.up(run, node), wire.encode({"run": run, "round": r, "sender": node, "kind": "update",
                                                           "msg_id": f"{r:016x}{int(node):016x}"}, tensors)))
    out.append((topics.down(run, "1"), wire.encode({"run": run, "round": 3, "sender": "coordinator", "kind": "model",
                                                    "msg_id": "d" * 32}, {"w": rng.standard_normal(6)})))
    out.append((topics.bcast(run), wire.encode({"run": run, "round": 3, "sender": "coordinator", "kind": "model",
                                                "msg_id": "b" * 32}, {"w": rng.standard_normal(6)})))
    return out


def _exchange(url: str, run: str) -> tuple[list[tuple], list[tuple], type]:
    """What a coordinator and node 1 receive of :func:`_messages` (data messages, in order), and
    the class of their paho clients."""
    coord = MqttClient.for_coordinator(url, run).connect(10)
    nodes = {n: MqttClient.for_node(url, run, n).connect(10) for n in ("1", "2")}
    try:
        for topic, payload in _messages(run):
            sender = nodes[topic.rsplit("/", 1)[1]] if f"/{topics.UP}/" in topic else coord
            sender.publish(topic, payload)
        return _received(coord, 6), _received(nodes["1"], 2), type(coord._paho)
    finally:
        for client in (coord, *nodes.values()):
            client.close(timeout_s=2.0)


def _received(client: MqttClient, count: int) -> list[tuple]:
    """The first ``count`` data messages ``client`` receives (within 10 s): each with what it
    decoded, sorted (two publishers' messages may interleave differently)."""
    got, deadline = [], time.monotonic() + 10
    while len(got) < count and time.monotonic() < deadline:
        inbound = client.receive(0.5)
        if inbound is not None and inbound.kind in topics.DATA_KINDS:
            m = inbound.message
            got.append((inbound.topic, inbound.kind, inbound.node, inbound.payload, m.round, m.sender, m.msg_id,
                        sorted((k, v.dtype.str, v.shape, v.tobytes()) for k, v in m.tensors.items())))
    return sorted(got)


@pytest.mark.slow
@pytest.mark.parametrize("change", list(WORKING.values()), ids=list(WORKING))
def test_the_plain_client_a_difference_falls_back_to_carries_the_same_messages(fresh_fence, monkeypatch, broker,
                                                                                run_id, change):
    """Over both brokers (amqtt: MQTT 3.1.1; Mosquitto: v5, whose property lists the layer decodes)."""
    fast = _exchange(broker.url, run_id)
    paho_speedups.client_class.cache_clear()
    change(monkeypatch)
    plain = _exchange(broker.url, run_id)
    assert fast[2] is paho_speedups.Client and plain[2] is paho.Client
    assert len(fast[0]) == 6 and len(fast[1]) == 2
    assert plain[:2] == fast[:2]


# ---- amqtt: the embedded broker's mends step aside for its stock broker -------------------------

def _amqtt_matches_changed(monkeypatch: pytest.MonkeyPatch) -> str:
    from amqtt.broker import Broker

    original = Broker._matches

    def _matches(self, topic, a_filter, strict=True):  # noqa: ARG001  amqtt's routing goes on working
        return original(self, topic, a_filter)

    monkeypatch.setattr(Broker, "_matches", _matches)
    return "amqtt.broker.Broker._matches: takes (self, topic, a_filter, strict=True), not (self, topic, a_filter)"


def _amqtt_loop_calls_elsewhere(monkeypatch: pytest.MonkeyPatch) -> str:
    from amqtt.broker import Broker

    original = Broker._broadcast_loop

    async def _broadcast_loop(self):
        await original(self)

    monkeypatch.setattr(Broker, "_broadcast_loop", _broadcast_loop)
    return "amqtt.broker.Broker._broadcast_loop: no longer uses _run_broadcast"


@pytest.mark.slow
@pytest.mark.parametrize("change", [_amqtt_matches_changed, _amqtt_loop_calls_elsewhere],
                         ids=["signature", "not-reached"])
def test_a_changed_amqtt_internal_serves_amqtts_stock_broker_with_one_warning(fresh_fence, monkeypatch, caplog,
                                                                              run_id, change):
    require_module("amqtt.broker", "coordinator")
    from amqtt.broker import Broker

    with embedded_broker.EmbeddedBroker() as mended:
        fast = _exchange(mended.url, run_id)
    said = change(monkeypatch)
    embedded_broker._broker_class.cache_clear()
    with embedded_broker.EmbeddedBroker() as stock:
        assert type(stock._broker) is Broker
        plain = _exchange(stock.url, run_id)
    warned = _fence_warnings(caplog)
    assert len(warned) == 1 and said in warned[0] and warned[0].startswith("testbed.mqtt.embedded_broker off: amqtt 0.")
    assert "amqtt's stock broker" in warned[0]
    assert len(fast[0]) == 6 and plain[:2] == fast[:2]


# ---- a run with the fallback forced equals the sped-up run bit for bit --------------------------

RUN = """
[run]
name = "fence"
seed = 4
mode = "mqtt"
algorithm = "fedavg"
[data]
dataset = "synthetic"
num_nodes = 5
samples_per_node = 60
dim = 6
[fedavg]
rounds = 5
local_steps = 3
batch = 8
lr = 0.5
[stragglers]
model = "bernoulli"
p = 0.3
[privacy]
tight_accountant = "none"
[mqtt]
hosts = 2
round_timeout_s = 20.0
connect_timeout_s = 30.0
[output]
figures = false
"""


def _ledger_rows(run_dir) -> list:
    """The ledger without what a clock measured (compute seconds and joules)."""
    return sorted(((e.kind, e.node, e.round, e.local_steps, e.cost_units) if e.kind == "compute" else e
                   for e in read_ledger(run_dir / "ledger.csv")), key=repr)


@pytest.mark.slow
def test_a_run_with_pahos_plain_client_equals_the_sped_up_run_bit_for_bit(fresh_fence, monkeypatch, mosquitto_broker,
                                                                          tmp_path):
    """Over Mosquitto (MQTT v5: the layer's own decoding of every reply and acknowledgement); CI
    runs the contract's sim-equals-MQTT tests of every algorithm with the switch at 0 as well."""
    config = replace(load_config_text(RUN), mqtt={"broker_url": mosquitto_broker.url})
    fast = run_experiment(config, out_dir=tmp_path / "fast", quiet=True)
    assert paho_speedups.client_class() is paho_speedups.Client
    monkeypatch.setenv(fence.SWITCH, "0")
    paho_speedups.client_class.cache_clear()
    plain = run_experiment(config, out_dir=tmp_path / "plain", quiet=True)
    assert paho_speedups.client_class() is paho.Client
    assert fast.summary["status"] == plain.summary["status"] == "completed"
    a, b = read_checkpoint(tmp_path / "fast").state, read_checkpoint(tmp_path / "plain").state
    assert a.keys() == b.keys() and all(a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]) for k in a)
    assert _ledger_rows(tmp_path / "fast") == _ledger_rows(tmp_path / "plain")
    rows = [[{k: v for k, v in row.items() if k != "wall_s"} for row in read_metrics(tmp_path / d)]
            for d in ("fast", "plain")]
    assert rows[0] == rows[1] and sum(int(r["stragglers"]) for r in rows[0]) > 0


# ---- the fence itself: a table's differences are exactly the entries that differ ----------------

#: How a drawn entry reads: as declared, different, or failing to be read.
OUTCOMES = st.sampled_from(["holds", "differs", "raises"])


def _entry(index: int, outcome: str) -> fence.Internal:
    def differs() -> str | None:
        if outcome == "raises":
            raise AttributeError(f"gone {index}")
        return None if outcome == "holds" else f"changed {index}"

    return fence.Internal(f"pkg.thing{index}", differs)


@given(st.lists(OUTCOMES, max_size=12))
def test_differences_name_each_entry_that_differs_in_order_and_holds_warns_once_iff_any(outcomes):
    table = [_entry(i, o) for i, o in enumerate(outcomes)]
    expected = [f"pkg.thing{i}: " + (f"changed {i}" if o == "differs" else f"cannot be read (AttributeError: gone {i})")
                for i, o in enumerate(outcomes) if o != "holds"]
    assert fence.differences(table) == expected
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append  # type: ignore[method-assign]
    fence.log.addHandler(handler)
    try:
        assert fence.holds("layer", "paho-mqtt", table, fallback="plain") == (not expected)
    finally:
        fence.log.removeHandler(handler)
    assert len(records) == (1 if expected else 0)
    if expected:
        assert records[0].levelno == logging.WARNING and "; ".join(expected) in records[0].getMessage()


#: Parameter names a drawn function takes (any would do: these keep the drawing fast).
_NAMES = st.lists(st.sampled_from(["self", "command", "packet", "mid", "qos", "info", "buf_2", "x"]), min_size=1,
                  max_size=5, unique=True)


@given(_NAMES, st.integers(0, 5), st.booleans())
def test_parameters_hold_for_the_signature_as_written_and_differ_for_any_other(names, defaults, star):
    """A function made from drawn parameter names (the last ``defaults`` of them with defaults, and
    ``*args`` or not) holds its own rendering and differs from one name fewer."""
    defaults = min(defaults, len(names))
    shown = [n if i < len(names) - defaults else f"{n}=None" for i, n in enumerate(names)]
    text = ", ".join(shown + (["*rest"] if star and "rest" not in names else []))
    namespace: dict = {}
    exec(f"def made({text}):\n    pass", namespace)  # noqa: S102  names drawn from _NAMES
    module = types.ModuleType("fence_made")
    module.made = namespace["made"]
    sys.modules["fence_made"] = module
    try:
        assert fence.differences([fence.parameters("fence_made.made", text)]) == []
        fewer = ", ".join(shown[:-1])
        assert fence.differences([fence.parameters("fence_made.made", fewer)]) == [
            f"fence_made.made: takes ({text}), not ({fewer})"]
    finally:
        del sys.modules["fence_made"]
