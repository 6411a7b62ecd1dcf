"""paho's v5 packet decoding with shared property tables (testbed.mqtt.paho_speedups) gives what
paho's own gives: packets with and without properties, and instances that already hold some. The
client reads every whole packet the socket holds, in one system call for many, never leaving read
ahead bytes behind; and writes the small packets queued together in one."""

from __future__ import annotations

import os
import struct
import time

import pytest
from hypothesis import given, settings, strategies as st
import paho.mqtt.client as paho
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from testbed.mqtt import paho_speedups

from conftest import require_module

_packet = require_module("paho.mqtt._packet", "node")  # paho-mqtt 2


def _publish(properties: bytes) -> bytes:
    """A v5 PUBLISH's variable header and payload (after the fixed header), QoS 1, message id 7."""
    topic = b"tb/v1/run/up/3"
    return struct.pack("!H", len(topic)) + topic + struct.pack("!H", 7) + properties + b"payload bytes"


def _with_properties() -> bytes:
    props = Properties(PacketTypes.PUBLISH)
    props.MessageExpiryInterval = 30
    props.UserProperty = [("node", "3"), ("round", "12")]
    props.ContentType = "application/x-tbwm"
    return props.pack()


@pytest.mark.parametrize("properties", [b"\x00", _with_properties()], ids=["none", "some"])
def test_decoded_publish_equals_pahos_own(monkeypatch, properties):
    monkeypatch.setattr(_packet, "Properties", Properties)
    theirs = _packet.decode_publish(0x32, _publish(properties), 5)
    assert paho_speedups.install()
    ours = _packet.decode_publish(0x32, _publish(properties), 5)
    assert type(ours.properties) is paho_speedups.SharedTableProperties
    assert ours.properties.json() == theirs.properties.json()
    assert (ours.topic, ours.mid, ours.qos, ours.payload) == (theirs.topic, theirs.mid, theirs.qos, theirs.payload)
    assert ours.payload == b"payload bytes"


def test_tables_are_shared_and_instances_stay_apart():
    a, b = paho_speedups.SharedTableProperties(PacketTypes.PUBLISH), paho_speedups.SharedTableProperties(
        PacketTypes.CONNACK)
    assert a.names is b.names and a.properties is b.properties
    assert (a.packetType, b.packetType) == (PacketTypes.PUBLISH, PacketTypes.CONNACK)
    b.SessionExpiryInterval = 60  # paho's own checks still apply: a CONNACK property
    assert not hasattr(a, "SessionExpiryInterval")
    with pytest.raises(Exception, match="does not apply"):
        a.SessionExpiryInterval = 60


def test_an_instance_holding_properties_is_cleared_by_pahos_unpack():
    props = paho_speedups.SharedTableProperties(PacketTypes.PUBLISH)
    props.MessageExpiryInterval = 30
    props.unpack(b"\x00")
    assert props.json() == {}


def test_install_leaves_an_unknown_decoder_alone(monkeypatch):
    class Other:
        pass

    monkeypatch.setattr(_packet, "Properties", Other)
    assert not paho_speedups.install()
    assert _packet.Properties is Other


def _publish_packet(topic: str, payload: bytes) -> bytes:
    """A whole 3.1.1 PUBLISH at QoS 0 (fixed header included; remaining length < 128)."""
    body = struct.pack("!H", len(topic)) + topic.encode() + payload
    return bytes([0x30, len(body)]) + body


@pytest.mark.parametrize("client_class, per_read", [(paho_speedups.Client, 3), (paho.Client, 1)],
                         ids=["ours", "pahos"])
def test_one_read_takes_every_whole_packet_the_socket_holds(client_class, per_read):
    import socket

    ours, broker = socket.socketpair()
    ours.setblocking(False)
    client = client_class(paho.CallbackAPIVersion.VERSION2, protocol=paho.MQTTv311)
    got: list[bytes] = []
    client.on_message = lambda c, userdata, message: got.append(message.payload)
    client._sock = ours  # as after a connect
    packets = b"".join(_publish_packet("t", f"m{i}".encode()) for i in range(3))
    broker.sendall(packets + _publish_packet("t", b"m3")[:4])  # and the start of a fourth
    assert client.loop_read() == paho.MQTT_ERR_SUCCESS
    assert got == [b"m0", b"m1", b"m2"][:per_read]
    while len(got) < 3:
        client.loop_read()
    broker.sendall(_publish_packet("t", b"m3")[4:])  # the rest of the fourth: read whole
    client.loop_read()
    assert got == [b"m0", b"m1", b"m2", b"m3"]
    ours.close()
    broker.close()


def test_the_loop_thread_queues_without_waking_itself_and_others_wake_it():
    import socket
    import threading

    client = paho_speedups.Client(paho.CallbackAPIVersion.VERSION2, protocol=paho.MQTTv311)
    wake_r, wake_w = socket.socketpair()
    wake_r.setblocking(False)
    client._sockpairR, client._sockpairW = wake_r, wake_w
    client._thread = threading.current_thread()  # as if this were its loop thread

    def woken() -> bool:
        try:
            return bool(wake_r.recv(16))
        except BlockingIOError:
            return False

    client._packet_queue(paho.PUBACK, b"\x40\x02\x00\x01", 1, 0)
    assert not woken() and client._sockpairW is wake_w and client.want_write()
    other = threading.Thread(target=client._packet_queue, args=(paho.PUBACK, b"\x40\x02\x00\x02", 2, 0))
    other.start()
    other.join()
    assert woken() and len(client._out_packet) == 2
    wake_r.close()
    wake_w.close()


class _CountingSocket:
    """A socket of a socketpair that counts its recv and send calls."""

    def __init__(self, sock):
        self.sock, self.recvs, self.sends = sock, 0, []

    def recv(self, size: int) -> bytes:
        self.recvs += 1
        return self.sock.recv(size)

    def send(self, data) -> int:
        self.sends.append(bytes(data))
        return self.sock.send(data)

    def __getattr__(self, name):
        return getattr(self.sock, name)


def _reading_client(monkeypatch=None, per_read: int | None = None):
    import socket

    ours, broker = socket.socketpair()
    ours.setblocking(False)
    if per_read is not None:
        monkeypatch.setattr(paho_speedups, "MAX_PACKETS_PER_READ", per_read)
    client = paho_speedups.Client(paho.CallbackAPIVersion.VERSION2, protocol=paho.MQTTv311)
    got: list[bytes] = []
    client.on_message = lambda c, userdata, message: got.append(message.payload)
    client._sock = counting = _CountingSocket(ours)
    return client, counting, broker, got


def test_one_system_call_reads_many_packets():
    client, sock, broker, got = _reading_client()
    broker.sendall(b"".join(_publish_packet("t", f"m{i}".encode()) for i in range(20)))
    assert client.loop_read() == paho.MQTT_ERR_SUCCESS
    assert got == [f"m{i}".encode() for i in range(20)]
    assert sock.recvs == 1  # fewer bytes than it asked for: the socket held no more (paho: 3 reads a packet)
    broker.close()
    sock.close()


def test_past_the_cap_what_was_read_ahead_is_taken_and_no_more(monkeypatch):
    client, sock, broker, got = _reading_client(monkeypatch, per_read=2)
    broker.sendall(b"".join(_publish_packet("t", f"m{i}".encode()) for i in range(5)))
    client.loop_read()
    assert got == [f"m{i}".encode() for i in range(5)]  # all were in the one read: none left behind
    assert sock.recvs == 1
    big = _publish_packet("t", b"x" * 100)
    broker.sendall(_publish_packet("t", b"m5") + _publish_packet("t", b"m6") + big[:10])
    client.loop_read()
    assert got[5:] == [b"m5", b"m6"]  # the third packet's start was read ahead: taken, not left
    broker.sendall(big[10:] + _publish_packet("t", b"m8"))
    client.loop_read()
    assert got[7:] == [b"x" * 100, b"m8"]
    broker.close()
    sock.close()


def test_read_ahead_bytes_of_a_closed_socket_are_not_read_on_the_next():
    client, sock, broker, got = _reading_client()
    client._ahead = (object(), _publish_packet("t", b"stale"), 0)  # of an earlier connection
    broker.sendall(_publish_packet("t", b"fresh"))
    client.loop_read()
    assert got == [b"fresh"]
    broker.close()
    sock.close()


def test_small_queued_packets_go_out_in_one_send_and_pahos_own_completions_apart():
    import socket

    ours, broker = socket.socketpair()
    client = paho_speedups.Client(paho.CallbackAPIVersion.VERSION2, protocol=paho.MQTTv311)
    client._sock = sock = _CountingSocket(ours)
    client.on_socket_register_write = lambda c, userdata, s: None  # an external loop writes (as NetworkLoop)
    published: list[int] = []
    client.on_publish = lambda c, userdata, mid, rc, props: published.append(mid)
    acks = [bytes([0x40, 2, 0, i]) for i in range(1, 4)]
    for i, ack in enumerate(acks, start=1):
        client._packet_queue(paho.PUBACK, ack, i, 0)
    qos0 = _publish_packet("t", b"q0")
    info = paho.MQTTMessageInfo(9)
    client._packet_queue(paho.PUBLISH, qos0, 9, 0, info)  # its callback fires once written
    client._packet_queue(paho.PUBACK, acks[0], 1, 0)
    assert client.loop_write() == paho.MQTT_ERR_SUCCESS
    assert sock.sends == [b"".join(acks), qos0, acks[0]]
    assert published == [9] and info.is_published()
    assert broker.recv(1024) == b"".join(acks) + qos0 + acks[0]
    broker.close()
    ours.close()


@pytest.mark.parametrize("protocol, ack", [(paho.MQTTv5, b"\x40\x02\x00\x07"), (paho.MQTTv311, b"\x40\x02\x00\x07"),
                                           (paho.MQTTv5, b"\x40\x03\x00\x07\x10")],
                         ids=["v5", "3.1.1", "v5-reason-code"])
def test_a_puback_completes_its_publish_as_pahos_own_does(protocol, ack):
    import socket

    def told(client_class) -> tuple:
        ours, broker = socket.socketpair()
        ours.setblocking(False)
        client = client_class(paho.CallbackAPIVersion.VERSION2, protocol=protocol)
        client._sock = ours
        told: list[tuple] = []
        client.on_publish = lambda c, userdata, mid, rc, props: told.append(
            (mid, rc.value, rc.getName(), rc.packetType, props.packetType, props.json()))
        message = paho.MQTTMessage(mid=7, topic=b"t")
        message.qos, message.info = 1, paho.MQTTMessageInfo(7)
        client._out_messages[7] = message
        client._inflight_messages = 1
        broker.sendall(ack + ack)  # the second: an ack of nothing in flight, ignored
        assert client.loop_read() == paho.MQTT_ERR_SUCCESS
        assert not client._out_messages and message.info.is_published() and client._inflight_messages == 0
        ours.close()
        broker.close()
        return tuple(told)

    assert told(paho_speedups.Client) == told(paho.Client)
    assert len(told(paho_speedups.Client)) == 1


def _fixed_header(first: int, body: bytes) -> bytes:
    """``body`` behind a fixed header: its first byte and its remaining length (1 to 4 bytes)."""
    length, n = bytearray(), len(body)
    while True:
        length.append((n & 0x7F) | (0x80 if n > 0x7F else 0))
        n >>= 7
        if not n:
            return bytes([first]) + bytes(length) + body


def _publishes(protocol: int) -> bytes:
    """PUBLISH packets of every kind a client takes: QoS 1 (short and past 127 bytes, a resent
    one), QoS 0, retained, and in v5 one with properties."""
    def publish(first: int, topic: bytes, payload: bytes, mid: int | None = None, props: bytes = b"\x00") -> bytes:
        body = struct.pack("!H", len(topic)) + topic + (b"" if mid is None else struct.pack("!H", mid))
        return _fixed_header(first, body + (props if protocol == paho.MQTTv5 else b"") + payload)

    packets = [publish(0x32, b"tb/v1/run/up/1", b"update", 1), publish(0x32, b"tb/v1/run/up/2", b"u" * 300, 2),
               publish(0x3A, b"tb/v1/run/up/1", b"again", 1), publish(0x30, b"tb/v1/run/bcast", b"qos 0"),
               publish(0x33, b"tb/v1/run/status/4", b"online", 3)]
    if protocol == paho.MQTTv5:
        packets.append(publish(0x32, b"tb/v1/run/up/5", b"with properties", 4, _with_properties()))
    return b"".join(packets)


@pytest.mark.parametrize("protocol", [paho.MQTTv311, paho.MQTTv5], ids=["3.1.1", "v5"])
@pytest.mark.parametrize("debug", [False, True], ids=["quiet", "debug-log"])
def test_publishes_are_told_and_acknowledged_as_pahos_own_do(protocol, debug):
    import logging
    import socket

    def told(client_class) -> tuple[list[tuple], bytes, list[str]]:
        ours, broker = socket.socketpair()
        ours.setblocking(False)
        client = client_class(paho.CallbackAPIVersion.VERSION2, protocol=protocol)
        client._sock = ours
        lines: list[str] = []
        if debug:
            client.on_log = lambda c, userdata, level, line: lines.append(line)
        got: list[tuple] = []
        client.on_message = lambda c, userdata, m: got.append(
            (m.topic, m.payload, m.qos, m.dup, m.retain, m.mid, m.properties and m.properties.json()))
        broker.sendall(_publishes(protocol))
        for _ in range(8):  # paho's reads a packet at each
            assert client.loop_read() == paho.MQTT_ERR_SUCCESS
        client.loop_write()
        broker.setblocking(False)
        acks = broker.recv(1 << 16)  # what it acknowledged, in order
        ours.close()
        broker.close()
        return got, acks, lines

    logging.getLogger("paho-test").setLevel(logging.DEBUG)
    got, acks, lines = told(paho_speedups.Client)
    assert (got, acks, lines) == told(paho.Client)
    assert len(got) == 5 + (protocol == paho.MQTTv5) and len(acks) == 4 * (4 + (protocol == paho.MQTTv5))
    assert bool(lines) == debug


def test_a_malformed_publish_is_a_protocol_error_as_in_paho():
    import socket

    for client_class in (paho_speedups.Client, paho.Client):
        ours, broker = socket.socketpair()
        ours.setblocking(False)
        client = client_class(paho.CallbackAPIVersion.VERSION2, protocol=paho.MQTTv311)
        client._sock = ours
        client.on_message = lambda c, userdata, m: pytest.fail("a malformed PUBLISH was told")
        broker.sendall(_fixed_header(0x32, b"\x00\x00\x00\x01payload"))  # QoS 1 with no topic
        assert client.loop_read() == paho.MQTT_ERR_PROTOCOL, client_class
        ours.close()
        broker.close()


def test_a_remaining_length_of_several_bytes_split_across_reads_is_read_whole():
    client, sock, broker, got = _reading_client()
    big = _publish_packet_long("t", b"y" * 20000)
    broker.sendall(big[:2])  # the first byte and one of the length's three
    client.loop_read()
    broker.sendall(big[2:] + _publish_packet("t", b"after"))
    while len(got) < 2:
        client.loop_read()
    assert got == [b"y" * 20000, b"after"]
    broker.close()
    sock.close()


def _publish_packet_long(topic: str, payload: bytes) -> bytes:
    """A whole 3.1.1 PUBLISH at QoS 0 of any length."""
    return _fixed_header(0x30, struct.pack("!H", len(topic)) + topic.encode() + payload)


@pytest.mark.parametrize("protocol", [paho.MQTTv311, paho.MQTTv5], ids=["3.1.1", "v5"])
def test_on_publish_received_is_told_what_on_message_would_be_and_the_rest_goes_to_on_message(protocol):
    """With ``on_publish_received`` set, each plain QoS 1 PUBLISH is told as (topic, payload) bytes
    and acknowledged as before; the others (QoS 0, retained, v5 properties) still reach
    ``on_message``; a per-topic callback turns the hook off (paho's routing decides)."""
    import socket

    def read(with_filter: bool) -> tuple[list, list, bytes]:
        ours, broker = socket.socketpair()
        ours.setblocking(False)
        client = paho_speedups.Client(paho.CallbackAPIVersion.VERSION2, protocol=protocol)
        client._sock = ours
        raw: list[tuple] = []
        messages: list[tuple] = []
        client.on_publish_received = lambda topic, payload: raw.append((topic, payload))
        client.on_message = lambda c, userdata, m: messages.append((m.topic, m.payload, m.qos, m.retain))
        if with_filter:
            client.message_callback_add("tb/v1/run/up/9", lambda c, userdata, m: None)
        broker.sendall(_publishes(protocol))
        client.loop_read()
        client.loop_write()
        broker.setblocking(False)
        acks = broker.recv(1 << 16)
        ours.close()
        broker.close()
        return raw, messages, acks

    raw, messages, acks = read(with_filter=False)
    assert raw == [(b"tb/v1/run/up/1", b"update"), (b"tb/v1/run/up/2", b"u" * 300), (b"tb/v1/run/up/1", b"again")]
    expected = [("tb/v1/run/bcast", b"qos 0", 0, False), ("tb/v1/run/status/4", b"online", 1, True)]
    if protocol == paho.MQTTv5:
        expected.append(("tb/v1/run/up/5", b"with properties", 1, False))
    assert messages == expected
    assert len(acks) == 4 * (4 + (protocol == paho.MQTTv5))  # every QoS 1 message acknowledged
    raw, messages, filtered_acks = read(with_filter=True)
    assert not raw and len(messages) == 5 + (protocol == paho.MQTTv5) and filtered_acks == acks


def test_an_exception_of_on_publish_received_is_raised_as_pahos_on_message_one_is():
    import socket

    ours, broker = socket.socketpair()
    ours.setblocking(False)
    client = paho_speedups.Client(paho.CallbackAPIVersion.VERSION2, protocol=paho.MQTTv311)
    client._sock = ours

    def broken(topic: bytes, payload: bytes) -> None:
        raise KeyError("bug")

    client.on_publish_received = broken
    broker.sendall(_fixed_header(0x32, struct.pack("!H", 1) + b"t" + struct.pack("!H", 1) + b"x"))
    with pytest.raises(KeyError):
        client.loop_read()
    client.suppress_exceptions = True
    broker.sendall(_fixed_header(0x32, struct.pack("!H", 1) + b"t" + struct.pack("!H", 2) + b"x"))
    assert client.loop_read() == paho.MQTT_ERR_SUCCESS
    ours.close()
    broker.close()


def test_a_client_takes_a_message_from_the_hook_as_from_on_message():
    """MqttClient reads a message told by paho_speedups' hook as one paho hands on_message: the
    same inbound for a good one, rejected (counted, not raised) for a topic not in UTF-8."""
    import queue

    from testbed.mqtt import wire
    from testbed.mqtt import topics
    from testbed.mqtt.client import MqttClient

    got: queue.Queue = queue.Queue()
    client = MqttClient.for_coordinator("mqtt://127.0.0.1:1", "run", on_inbound=got.put)
    payload = wire.encode({"run": "run", "round": 1, "sender": "3", "kind": "update"})
    client._on_publish_received(topics.up("run", "3").encode(), payload)
    message = paho.MQTTMessage(mid=1, topic=topics.up("run", "4").encode())
    message.payload = wire.encode({"run": "run", "round": 1, "sender": "4", "kind": "update"})
    client._on_message(None, None, message)
    hooked, told = got.get_nowait(), got.get_nowait()
    assert (hooked.topic, hooked.kind, hooked.node, hooked.payload, hooked.message.sender) == (
        topics.up("run", "3"), topics.UP, "3", payload, "3")
    assert (told.kind, told.node, told.message.sender) == (topics.UP, "4", "4") and client.rejected == 0
    client._on_publish_received(topics.up("run", "3").encode(), payload)  # the same message again
    client._on_publish_received(b"tb/v1/run/up/\xff", payload)
    assert client.rejected == 2 and got.empty()


class _Socks:
    """A stand-in for PySocks as paho uses it (its proxy types and its default proxy), so that
    the proxy steps run whether or not PySocks is installed here."""

    HTTP, SOCKS4, SOCKS5 = 3, 1, 2

    def __init__(self, default: tuple | None):
        self._default = default

    def get_default_proxy(self) -> tuple | None:
        return self._default


_PROXY_NAMES = st.sampled_from(["mqtt_proxy", "MQTT_PROXY", "Mqtt_Proxy", "no_proxy", "NO_PROXY",
                                "http_proxy", "mqtt_proxyx", "xmqtt_proxy", "TB_UNRELATED"])
_PROXY_VALUES = st.sampled_from(["socks://10.1.2.3:1080", "http://proxy.example:3128", "ftp://x:1", "",
                                 "127.0.0.1", "*", "localhost,127.0.0.1", "not a url"])


@settings(max_examples=150, deadline=None)
@given(environment=st.dictionaries(_PROXY_NAMES, _PROXY_VALUES, max_size=4),
       explicit=st.sampled_from([None, {"proxy_type": 2, "proxy_addr": "10.9.9.9", "proxy_port": 9050}]),
       default=st.sampled_from([None, (2, "10.0.0.7", 1080, True, None, None), (7, "", 0, True, None, None)]),
       host=st.sampled_from(["127.0.0.1", "localhost", "broker.example"]),
       socks_installed=st.booleans())
def test_the_proxy_a_client_connects_through_is_pahos_own(environment, explicit, default, host, socks_installed):
    """Whatever the environment names (mqtt_proxy in any case, no_proxy, other proxies), a proxy
    set on the client, PySocks' default proxy, or no PySocks: the proxy is the one paho's own
    client finds (paho's environment step is skipped only where it would find none)."""
    with pytest.MonkeyPatch.context() as patch:
        for name in [n for n in os.environ if n.lower().endswith("_proxy")]:
            patch.delenv(name)
        for name, value in environment.items():
            patch.setenv(name, value)
        patch.setattr(paho, "socks", _Socks(default) if socks_installed else None)
        ours = paho_speedups.Client(paho.CallbackAPIVersion.VERSION2)
        ours._host = host
        if explicit is not None:
            ours._proxy = explicit
        theirs = paho.Client(paho.CallbackAPIVersion.VERSION2)
        theirs._host, theirs._proxy = host, ours._proxy
        assert ours._get_proxy() == theirs._get_proxy()


@pytest.mark.parametrize("bind", [None, ("127.0.0.1", 0)], ids=["unbound", "bound"])
def test_a_client_connects_unbound_unless_asked_to_bind(monkeypatch, bind):
    """paho binds every client's socket to ("", 0) before it connects (the bind() path's search
    for a port: seconds of kernel time over 10,000 clients); the speedups' client connects unbound,
    as any client does, and binds only where a source address was asked for (paho's own path)."""
    made = []

    def create_connection(address, timeout=None, source_address=None):
        made.append((address, timeout, source_address))
        return "socket"

    monkeypatch.setattr(paho_speedups.socket, "create_connection", create_connection)
    monkeypatch.setattr(paho.socket, "create_connection", create_connection)
    for cls in (paho_speedups.Client, paho.Client):
        client = cls(paho.CallbackAPIVersion.VERSION2)
        client._host, client._port = "127.0.0.1", 1883
        if bind is not None:
            client._bind_address, client._bind_port = bind
        assert client._create_socket_connection() == "socket"
    ours, theirs = made
    assert theirs == (("127.0.0.1", 1883), 5.0, bind or ("", 0))  # paho's own: always a source address
    assert ours == (theirs if bind is not None else (("127.0.0.1", 1883), 5.0, None))


def _client_with_loop_thread(sock):
    """A client whose loop thread (``loop_start``) is another thread, writing to ``sock``; its
    wake-up socket pair's reading end."""
    import socket
    import threading

    client = paho_speedups.Client(paho.CallbackAPIVersion.VERSION2, protocol=paho.MQTTv311)
    wake_r, wake_w = socket.socketpair()
    wake_r.setblocking(False)
    client._sockpairR, client._sockpairW = wake_r, wake_w
    client._thread = threading.Thread(target=lambda: None)  # not this one: as loop_start's
    client._sock = sock
    return client, wake_r


def _woken(wake_r) -> bool:
    try:
        return bool(wake_r.recv(16))
    except BlockingIOError:
        return False


def test_a_thread_writes_what_it_publishes_within_written_here_and_wakes_nobody():
    """The coordinator's broadcast goes out on its own thread (written_here), not after paho's loop
    thread woke and took the interpreter; outside the block, or on the loop thread, as before."""
    import socket

    ours, broker = socket.socketpair()
    client, wake_r = _client_with_loop_thread(_CountingSocket(ours))
    packet = _publish_packet("tb/v1/r/bcast", b"round 3")
    with client.written_here():
        client._packet_queue(paho.PUBLISH, packet, 5, 1)
        assert client._out_packet and not _woken(wake_r)  # queued, written at the block's end
    assert not client._out_packet and not _woken(wake_r)
    assert broker.recv(1024) == packet
    client._packet_queue(paho.PUBLISH, packet, 6, 1)  # outside: paho's loop thread writes it
    assert _woken(wake_r) and len(client._out_packet) == 1
    for s in (ours, broker, wake_r, client._sockpairW):
        s.close()


@pytest.mark.parametrize("left", ["ssl", "disconnect", "full"])
def test_what_a_thread_cannot_safely_write_here_is_left_to_the_loop_thread(monkeypatch, left):
    """An SSL socket (one thread at a time), a DISCONNECT in the queue (its write closes the socket
    under the loop thread), and what the socket does not take now: queued, the loop thread woken."""
    import socket

    ours, broker = socket.socketpair()
    ours.setblocking(False)
    client, wake_r = _client_with_loop_thread(_CountingSocket(ours))
    if left == "ssl":
        monkeypatch.setattr(paho_speedups.ssl, "SSLSocket", _CountingSocket)
    if left == "disconnect":
        client._packet_queue(paho.DISCONNECT, b"\xe0\x00", 0, 0)
        assert _woken(wake_r)
    if left == "full":  # fill the socket's buffer first
        try:
            while True:
                ours.send(b"\0" * 65536)
        except BlockingIOError:
            pass
    with client.written_here():
        client._packet_queue(paho.PUBLISH, _publish_packet("t", b"x" * 100), 5, 1)
    assert client._out_packet and _woken(wake_r)
    for s in (ours, broker, wake_r, client._sockpairW):
        s.close()


_ACK = b"\x40\x02\x00\x07"  # a PUBACK that paho's loop thread queues


def _loop_thread_queues_an_ack(client, events: list[str]) -> None:
    """What paho's loop thread does on a message of QoS 1: it queues the acknowledgement."""
    client._packet_queue(paho.PUBACK, _ACK, 0, 0)
    events.append("queued")


def _written_here_then_the_ack(client, events: list[str], step: str, broker, sockets) -> None:
    """A publish written here while the loop thread queues an ack during ``step`` ("write", "look"):
    the ack waited for it, and then goes out after the publish, whole."""
    publish = _publish_packet("tb/v1/r/bcast", b"round 3")
    with client.written_here():
        client._packet_queue(paho.PUBLISH, publish, 5, 1)
    deadline = time.monotonic() + 5
    while "queued" not in events and time.monotonic() < deadline:
        time.sleep(0.001)
    assert events == [f"{step} begins", f"{step} ends", "queued"]
    client._packet_write()
    assert broker.recv(1024) == publish + _ACK
    for s in (*sockets, client._sockpairW):
        s.close()


def test_nothing_is_queued_while_a_thread_writes_here():
    """paho's loop thread queues an acknowledgement while the coordinator's thread is writing its
    publish (written_here): it waits until that write is done (one writer at a time, and the queue
    still while a write joins its head), and then goes out whole, after it."""
    import socket
    import threading

    ours, broker = socket.socketpair()
    events: list[str] = []

    class Slow(_CountingSocket):
        def send(self, data) -> int:
            events.append("write begins")
            queuing = threading.Thread(target=_loop_thread_queues_an_ack, args=(client, events))
            queuing.start()
            queuing.join(timeout=0.2)  # it cannot get in: it waits for the write
            events.append("write ends")
            self.send = super().send  # the loop thread's own write, later, as usual
            return super().send(data)

    client, wake_r = _client_with_loop_thread(None)
    client._sock = Slow(ours)
    _written_here_then_the_ack(client, events, "write", broker, (ours, broker, wake_r))


def test_nothing_is_queued_while_a_thread_looks_at_the_queue_before_writing_here():
    """written_here looks at the queue (a DISCONNECT in it is the loop thread's to write) under the
    same lock as a write: paho's loop thread queueing an acknowledgement meanwhile waits, instead of
    changing the queue under the look (a deque changed while it is walked raises)."""
    import collections
    import socket
    import threading

    ours, broker = socket.socketpair()
    client, wake_r = _client_with_loop_thread(ours)
    events: list[str] = []

    class Watched(collections.deque):
        def __iter__(self):
            if not events:  # the first look at the queue: the loop thread queues then
                events.append("look begins")
                queuing = threading.Thread(target=_loop_thread_queues_an_ack, args=(client, events))
                queuing.start()
                queuing.join(timeout=0.2)  # it cannot get in: it waits for the look and the write
                events.append("look ends")
            return super().__iter__()

    client._out_packet = Watched(client._out_packet)
    _written_here_then_the_ack(client, events, "look", broker, (ours, broker, wake_r))
