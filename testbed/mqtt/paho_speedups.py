"""Costs paho-mqtt 2.x pays on every packet it receives that MQTT does not ask for, removed.

:class:`Client` reads every packet the socket holds at each wake-up of its loop. paho's
``loop_read`` reads at most one packet per wake-up (it ignores its ``max_packets`` argument for
the number of messages in flight, none for a client that only receives): a select and a pass of
its loop per packet. A coordinator receives one update per node and round, all at once: ACFL's
100 emulated nodes x 100 iterations over Mosquitto took 2.36 s with paho's reads, 2.09 s with
these. And the acknowledgement of each message, queued by the loop thread itself, no longer
writes a byte to wake that (awake) thread: a system call per message, 2.07 -> 1.99 s. paho reads a
packet in three or more system calls (its first byte, each byte of its length, the rest) and
writes each queued packet in one: here a read takes what the socket holds (up to 64 KiB) and the
small packets queued together go out in one write. In that run the coordinator made 34,000 reads
and 8,500 writes; now 1,100 and 350. A packet whole in what was read is taken from there in one
step, and a QoS 1 PUBLISH without properties is told and acknowledged without paho's decoder (three
copies of the payload) and its debug line that no logger takes: 31 -> 21 µs a packet, and the
same run (100 iterations) 4.89 -> 4.44 s (median of 6 interleaved runs each).

The other is MQTT v5's. paho's ``Properties.__init__`` rebuilds two constant tables (27 property
names; 27 ids with their types, found by 27 list searches) for every packet, and
``Properties.unpack`` deletes 27 absent attributes and copies the rest of the packet before it
reads an empty property list: 12 µs of the 14 µs paho takes to decode a v5 PUBLISH (2 µs in
3.1.1), measured on this project's 2-core machine. A coordinator decodes one PUBLISH per node and round, an emulated host one PUBACK per
reply.

And at each connect paho asks urllib for the environment's proxies, two walks of every variable
(80 µs a client with 35 variables; an emulated host connects 50 to 10,000): :class:`Client` walks
the names once and skips that step where none names an MQTT proxy, the only case in which it finds
nothing (6 µs). And paho binds every socket to ("", 0) before it connects: :class:`Client` connects
unbound unless a source address was asked for (10,000 clients: the bind() path's search for a port
was most of the machine's time, see ``_create_socket_connection``).

:func:`install` makes the ``Properties`` that paho's packet decoder (``paho.mqtt._packet``)
builds a subclass that shares the tables of one instance paho built itself and reads an empty
property list of a fresh instance in one step; any other property list is paho's own code.

All of this rests on paho's private internals, declared in one table, :data:`PAHO_INTERNALS`.
:func:`client_class` checks it before the first client is made (`testbed.mqtt.fence`) and, where
the installed paho differs (pyproject.toml pins the range it was written for) or
``TESTBED_MQTT_SPEEDUPS=0``, answers paho's own client and leaves the decoder be: slower, never
different. ``tests/test_mqtt_paho_speedups.py`` checks decoded packets against paho's, and what the
client reads; ``tests/test_faults_mqtt_fence.py`` the fallback. docs/performance.md has the figures.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import ssl
import struct
import sys
import threading
from collections.abc import Callable
from typing import Any, ContextManager, Iterator

import paho.mqtt.client as paho
from paho.mqtt.client import DISCONNECT, PUBACK, PUBLISH
from paho.mqtt.enums import MQTTErrorCode
from paho.mqtt.exception import MalformedPacket
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from testbed.mqtt import fence

#: Most packets one read takes, so that a flood cannot keep the loop from its keepalive and writes.
MAX_PACKETS_PER_READ = 256
#: Bytes one read of the socket takes, at most, beyond what paho asks for.
_READ_AHEAD_BYTES = 1 << 16
#: Most bytes of queued packets one send joins (small ones: a join is a copy).
_MAX_COALESCED_BYTES = 1 << 16


class Client(paho.Client):
    """paho's client, reading every whole packet the socket holds (at most
    :data:`MAX_PACKETS_PER_READ`) each time it is readable, with one system call for as many
    packets as :data:`_READ_AHEAD_BYTES` hold; queueing what its own loop thread sends (an
    acknowledgement per message received) without waking that thread, as it is awake and writes
    before it waits again; and writing the small packets queued together in one system call."""

    #: What the last read of the socket brought beyond what paho asked for: (the socket, the
    #: bytes, where the next read starts), or None.
    _ahead: tuple[Any, bytes, int] | None = None
    #: Bytes a read of the socket asks for, at least: set by loop_read, _READ_AHEAD_BYTES for its
    #: first MAX_PACKETS_PER_READ packets, 0 past them (only what was read ahead is taken then).
    _read_ahead_bytes = 0
    #: The last read of the socket got less than it asked for: the socket held no more then.
    _drained = False
    #: Told ``(topic, payload)`` (bytes) of each QoS 1 PUBLISH the fast path takes, instead of
    #: ``on_message`` with paho's MQTTMessage, when no per-topic callback is set
    #: (``message_callback_add``); None: ``on_message``. Called as paho calls ``on_message``.
    on_publish_received: Callable[[bytes, bytes], None] | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # One writer at a time (paho's loop thread, or a thread that writes what it queued itself:
        # written_here), and no packet queued while one writes: a write joins those at the head.
        self._writing = threading.RLock()
        self._here = threading.local()  # .on: this thread writes what it queues (written_here)

    def _packet_queue(self, command: int, packet: bytes | bytearray, mid: int, qos: int,
                      info: Any = None) -> MQTTErrorCode:
        with self._writing:
            if self._thread is None or (threading.current_thread() is not self._thread
                                        and not getattr(self._here, "on", False)):
                return super()._packet_queue(command, packet, mid, qos, info)
            # The loop thread, or a thread that writes what it queues: no wake-up byte.
            wake, self._sockpairW = self._sockpairW, None  # paho writes one when it is set
            try:
                return super()._packet_queue(command, packet, mid, qos, info)
            finally:
                self._sockpairW = wake

    def _packet_write(self) -> MQTTErrorCode:
        with self._writing:
            self._coalesce_queued()
            return super()._packet_write()

    @contextlib.contextmanager
    def written_here(self) -> Iterator[None]:
        """What the calling thread publishes within is written to the socket by it, at the end, not
        by paho's own loop thread (``loop_start``) woken for it. That thread needs the interpreter,
        and a caller that goes on computing holds it until it blocks or the switch interval (5 ms)
        runs out: the coordinator's report of a round, made while the next round is out, kept that
        round's broadcast off the wire 0.6-1.2 ms on average (p90 1.3-3.9 ms), every node waiting
        for it; woken anyway, the loop thread took the interpreter at the caller's first system
        call (the caller's write then took 0.46 ms). Only on a plain socket (an SSL object takes one
        thread at a time, and the loop thread reads it), for a queue without a DISCONNECT (whose
        write closes the socket under the loop thread), and for what the socket takes now: the
        rest wakes the loop thread, which writes it, as before."""
        if self._thread is None or threading.current_thread() is self._thread:
            yield
            return
        self._here.on = True
        try:
            yield
        finally:
            self._here.on = False
            with self._writing:  # the queue looked at and written with nothing queued meanwhile
                sock = self._sock
                if sock is not None and not isinstance(sock, ssl.SSLSocket) \
                        and not any(packet["command"] & 0xF0 == DISCONNECT for packet in self._out_packet):
                    self._packet_write()  # an error leaves the packet queued: the loop thread meets it too
                left = bool(self._out_packet)
            if left:
                self._wake_loop()

    def _wake_loop(self) -> None:
        """Wake paho's loop thread (``loop_start``) to write what is queued, as paho's own queueing
        does."""
        wake = self._sockpairW
        if wake is not None:
            try:
                wake.send(b"0")
            except BlockingIOError:
                pass

    def _create_socket_connection(self) -> socket.socket:
        # paho always hands create_connection a source address, ("", 0) when none was asked for,
        # and create_connection then binds the socket to a port of the kernel's choosing before it
        # connects: a port picked without the destination, from the half of the ephemeral range
        # bind() takes, checked against every socket of the machine bound to it. 10,000 clients
        # in a row (an emulated lab) made that search most of the machine's time: 44 s of kernel
        # time and nodes that never connected within 30 s, in a run started while the last one's
        # connections were still in TIME_WAIT. Unbound, connect() picks the port for the
        # destination, as any client does; a source address asked for (connect's bind_address,
        # bind_port) and a proxy are paho's, as written.
        if self._bind_address == "" and self._bind_port == 0 and not self._get_proxy():
            return socket.create_connection((self._host, self._port), timeout=self._connect_timeout)
        return super()._create_socket_connection()

    def _get_proxy(self) -> dict[str, Any] | None:
        # paho asks urllib for the environment's proxies at every connect: proxy_bypass and
        # getproxies each walk every variable, decoding names and values (80 µs a client on this
        # project's machine with 35 variables; an emulated host connects 50 to 10,000 clients).
        # Where urllib takes proxies from the environment alone (not macOS, not Windows) and no
        # variable is named mqtt_proxy in any case, that step of paho's finds nothing: one walk of
        # the names (6 µs) decides it, and the steps before and after it are paho's, as written.
        if sys.platform in ("darwin", "win32") or _names_mqtt_proxy():
            return super()._get_proxy()
        socks = paho.socks
        if socks is None:
            return None
        if self._proxy_is_valid(self._proxy):
            return self._proxy
        default = socks.get_default_proxy()
        if self._proxy_is_valid(default):
            return dict(zip(_PROXY_KEYS, default))
        return None

    def _coalesce_queued(self) -> None:
        """Join the packets at the head of the queue that paho does nothing with once written (not
        a QoS 0 PUBLISH, whose callback fires then, nor a DISCONNECT), up to
        :data:`_MAX_COALESCED_BYTES`, into one: one send for them all, where paho makes a system
        call per packet (an acknowledgement per message received: 36 µs each on a 2-core VM)."""
        queue = self._out_packet
        if len(queue) < 2:
            return
        run, size = [], 0
        for packet in queue:
            command = packet["command"] & 0xF0
            size += packet["to_process"]
            if packet["pos"] or command == DISCONNECT or (command == PUBLISH and packet["qos"] == 0) \
                    or size > _MAX_COALESCED_BYTES:
                break
            run.append(packet)
        if len(run) < 2:
            return
        for _ in run:
            queue.popleft()
        joined = b"".join(packet["packet"] for packet in run)
        queue.appendleft({**run[0], "packet": joined, "to_process": len(joined)})

    def loop_read(self, max_packets: int = 1) -> MQTTErrorCode:
        self._read_ahead_bytes = _READ_AHEAD_BYTES
        for _ in range(MAX_PACKETS_PER_READ):
            rc = self._read_packet()
            if rc is not None:
                return rc
            # All that was read is handled and the socket held no more: the next read would only
            # fail with EAGAIN (a system call and an exception a wake-up: an emulated host's
            # sockets each wake it for one acknowledgement). What comes meanwhile wakes the loop.
            if self._drained and self._ahead is None:
                return MQTTErrorCode.MQTT_ERR_SUCCESS
        # Past the cap, only what was read ahead: the socket would not wake the loop for it.
        self._read_ahead_bytes = 0
        while self._ahead is not None and self._ahead[0] is self._sock:
            rc = self._read_packet()
            if rc is not None:
                return rc
        return MQTTErrorCode.MQTT_ERR_SUCCESS

    def _packet_read(self) -> MQTTErrorCode:
        # A packet whole in what was read ahead (nearly every one) is taken from there in one
        # step: paho reads its first byte, each byte of its length and the rest, in three or more
        # calls (7 µs a packet). A packet split across reads, or begun by paho, is paho's to read.
        if self._in_packet["command"] == 0:
            whole = self._whole_packet()
            if whole is not None:
                return self._handle_whole_packet(*whole)
        return super()._packet_read()

    def _whole_packet(self) -> tuple[int, bytes] | None:
        """(first byte, the rest past the fixed header) of the next packet if the bytes read ahead
        (reading the socket first when there are none) hold all of it, else None with the bytes
        left for paho's reading (a recv that fails is left to it as well: it says what failed)."""
        ahead = self._ahead
        if ahead is None or ahead[0] is not self._sock:
            if not self._read_ahead_bytes or self._sock is None:
                return None
            try:
                data = self._recv(self._read_ahead_bytes)
            except OSError:  # paho's read meets it again and says what it was
                return None
            if not data:
                return None
            ahead = self._ahead = (self._sock, data, 0)
        _, data, start = ahead
        size, at, length, shift = len(data), start + 1, 0, 0
        while True:  # the remaining length: 1 to 4 bytes, 7 bits each, least significant first
            if at >= size or shift > 21:  # not all here, or malformed: paho's reading says which
                return None
            byte = data[at]
            at += 1
            length |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                break
        end = at + length
        if end > size:
            return None
        self._ahead = None if end == size else (self._sock, data, end)
        return data[start], data[at:end]

    def _handle_whole_packet(self, command: int, body: bytes) -> MQTTErrorCode:
        """What paho's ``_packet_read`` does once it has read a packet: handle it, start afresh."""
        self._in_packet = {"command": command, "have_remaining": 1, "remaining_count": [], "remaining_mult": 1,
                           "remaining_length": len(body), "packet": body, "to_process": 0, "pos": 0}
        try:
            rc = self._packet_handle()
        except MalformedPacket as exc:
            self._easy_log(paho.MQTT_LOG_DEBUG, "Received malformed packet: %s", exc)
            rc = MQTTErrorCode.MQTT_ERR_PROTOCOL
        self._in_packet = {"command": 0, "have_remaining": 0, "remaining_count": [], "remaining_mult": 1,
                           "remaining_length": 0, "packet": bytearray(b""), "to_process": 0, "pos": 0}
        with self._msgtime_mutex:
            self._last_bytes_received = paho.time_func()
        return rc

    def _handle_publish(self) -> MQTTErrorCode:
        # A QoS 1 PUBLISH without properties, to a client that acknowledges it at once and logs no
        # debug lines (nearly every one a coordinator gets: an update per node and round) is told
        # and acknowledged as paho would, without its decoder's three copies of the payload and
        # its formatting of a debug line nobody reads (12 of paho's 20 µs). Anything else: paho.
        command, packet = self._in_packet["command"], self._in_packet["packet"]
        if command & 0x07 != 0x02 or self._manual_ack or self._logs_debug():
            return super()._handle_publish()
        topic_end = 2 + (packet[0] << 8 | packet[1]) if len(packet) >= 2 else 0
        at = topic_end + 2  # past the message id
        v5 = self._protocol == paho.MQTTv5
        if topic_end <= 2 or len(packet) < at + v5 or (v5 and packet[at] != 0):
            return super()._handle_publish()  # no topic, too short, or v5 properties: paho's decoder
        mid = packet[topic_end] << 8 | packet[topic_end + 1]
        told = self.on_publish_received
        if told is not None and not self._filters_callbacks():
            with self._in_callback_mutex:
                try:
                    told(packet[2:topic_end], packet[at + v5:])
                except Exception as err:  # as paho does for on_message
                    self._easy_log(paho.MQTT_LOG_ERR, "Caught exception in on_publish_received: %s", err)
                    if not self.suppress_exceptions:
                        raise
        else:
            message = paho.MQTTMessage(mid=mid, topic=packet[2:topic_end])
            message.dup = bool(command & 0x08)
            message.qos = 1
            if v5:
                message.properties = SharedTableProperties(PacketTypes.PUBLISH)
            message.payload = packet[at + v5:]
            message.timestamp = paho.time_func()
            self._handle_on_message(message)
        return self._packet_queue(PUBACK, _PUBACK.pack(PUBACK, 2, mid), mid, 1)

    def _filters_callbacks(self) -> bool:
        """Whether a per-topic callback is set (``message_callback_add``): paho's filter tree is
        not empty."""
        return bool(self._on_message_filtered._root._children)

    def _logs_debug(self) -> bool:
        """Whether paho's debug lines go anywhere (its ``on_log``, or a logger that takes DEBUG)."""
        return self.on_log is not None or (self._logger is not None and self._logger.isEnabledFor(logging.DEBUG))

    def _handle_pubackcomp(self, cmd: str) -> MQTTErrorCode:
        # A PUBACK of two bytes (its message id: success, no properties) is nearly every one a
        # client gets; paho builds a reason code (a copy of its 60-entry name table) and a property
        # list for each. Here it is told with shared ones, as paho's own decoder would make them.
        packet = self._in_packet["packet"]
        if cmd != "PUBACK" or len(packet) != 2:
            return super()._handle_pubackcomp(cmd)  # type: ignore[arg-type]
        mid = packet[0] << 8 | packet[1]
        self._easy_log(paho.MQTT_LOG_DEBUG, "Received %s (Mid: %d)", cmd, mid)
        with self._out_message_mutex:
            if mid in self._out_messages:
                return self._do_on_publish(mid, PUBACK_SUCCESS, NO_PUBACK_PROPERTIES)
        return MQTTErrorCode.MQTT_ERR_SUCCESS

    def _read_packet(self) -> MQTTErrorCode | None:
        """One packet read and handled; None to read on, else what loop_read returns."""
        if self._sock is None:
            return MQTTErrorCode.MQTT_ERR_NO_CONN
        rc = self._packet_read()
        if rc > 0:
            return self._loop_rc_handle(rc)
        if rc == MQTTErrorCode.MQTT_ERR_AGAIN:  # nothing more to read without blocking
            return MQTTErrorCode.MQTT_ERR_SUCCESS
        return None

    def _sock_recv(self, bufsize: int) -> bytes:
        # paho reads a packet in three or more reads (its first byte, each byte of its length, the
        # rest): here one system call reads what the socket holds, the reads take from it.
        ahead = self._ahead
        if ahead is not None and ahead[0] is self._sock:
            _, data, start = ahead
            end = start + bufsize
            self._ahead = None if end >= len(data) else (self._sock, data, end)
            return data[start:end]
        data = self._recv(max(bufsize, self._read_ahead_bytes))
        if len(data) <= bufsize:
            return data
        self._ahead = (self._sock, data, bufsize)
        return data[:bufsize]

    def _recv(self, asked: int) -> bytes:
        """Up to ``asked`` bytes from the socket (paho's read), noting whether it held no more."""
        data = paho.Client._sock_recv(self, asked)
        self._drained = len(data) < asked
        return data


def _names_mqtt_proxy() -> bool:
    """Whether an environment variable is named ``mqtt_proxy`` in any case (urllib's
    getproxies_environment takes any)."""
    return any(len(name) == 10 and name.lower() == b"mqtt_proxy" for name in os.environb)


#: The fields of PySocks' default proxy tuple, as paho names them.
_PROXY_KEYS = ("proxy_type", "proxy_addr", "proxy_port", "proxy_rdns", "proxy_username", "proxy_password")

#: A PUBACK packet: its first byte, its remaining length (2) and the message id.
_PUBACK = struct.Struct("!BBH")

#: What :meth:`Client._handle_pubackcomp` hands ``on_publish`` for every two-byte PUBACK: shared,
#: to be read, not changed (equal to what paho decodes from one).
PUBACK_SUCCESS = ReasonCode(PacketTypes.PUBACK)
NO_PUBACK_PROPERTIES = Properties(PacketTypes.PUBACK)

#: The attributes of a Properties paho built (its constant tables and its packet type), shared.
_TABLES: dict[str, Any] = dict(vars(Properties(PacketTypes.PUBLISH)))


class SharedTableProperties(Properties):
    """paho's ``Properties``, with its constant tables shared by every instance."""

    def __init__(self, packetType: int):  # noqa: N803  paho's name
        vars(self).update(_TABLES)
        object.__setattr__(self, "packetType", packetType)  # what paho's own __setattr__ does for it

    def unpack(self, buffer: bytes | bytearray) -> tuple[Properties, int]:
        # A property length of 0 (one byte) on an instance holding no property yet: nothing to
        # clear, nothing to read.
        if buffer[:1] == b"\x00" and len(vars(self)) == len(_TABLES):
            return self, 1
        return super().unpack(buffer)


def install() -> bool:
    """Make paho's packet decoder build :class:`SharedTableProperties`; True if it now does (not
    where another has replaced paho's ``Properties`` there). Call it where :data:`PAHO_INTERNALS`
    holds (:func:`client_class` does)."""
    from paho.mqtt import _packet

    if _packet.Properties not in (Properties, SharedTableProperties):
        return False
    _packet.Properties = SharedTableProperties
    return True


def _client() -> paho.Client:
    """A client of paho's own, never connected: what the table below probes."""
    return paho.Client(paho.CallbackAPIVersion.VERSION2)


def _queued_packet() -> dict[str, Any]:
    """What paho queues for a packet to send (a PINGREQ, on a client never connected: not sent)."""
    client = _client()
    client._packet_queue(paho.PINGREQ, b"\xc0\x00", 0, 0)
    return dict(client._out_packet[0])


_CLIENT = "paho.mqtt.client.Client"

#: Every internal of paho-mqtt this module relies on: the methods :class:`Client` overrides (their
#: parameters, and paho's own code still calling them: a read ahead that paho's ``_packet_read``
#: did not take through ``_sock_recv`` would be lost), the ones it calls, the attributes it reads
#: and sets, the packet dicts it builds, and what :func:`install` and :class:`SharedTableProperties`
#: replace and share. One entry that differs and :func:`client_class` answers paho's own client.
PAHO_INTERNALS: tuple[fence.Internal, ...] = (
    fence.parameters(f"{_CLIENT}._packet_queue", "self, command, packet, mid, qos, info=None"),
    fence.parameters(f"{_CLIENT}._packet_write", "self"),
    fence.uses(f"{_CLIENT}.loop_write", "_packet_write"),
    fence.parameters(f"{_CLIENT}.loop_read", "self, max_packets=1"),
    fence.parameters(f"{_CLIENT}._packet_read", "self"),
    fence.uses(f"{_CLIENT}._packet_read", "_sock_recv", "_packet_handle", "_in_packet", "_msgtime_mutex",
               "_last_bytes_received"),
    fence.parameters(f"{_CLIENT}._sock_recv", "self, bufsize"),
    fence.parameters(f"{_CLIENT}._handle_publish", "self"),
    fence.parameters(f"{_CLIENT}._handle_pubackcomp", "self, cmd"),
    fence.uses(f"{_CLIENT}._packet_handle", "_handle_publish", "_handle_pubackcomp"),
    fence.parameters(f"{_CLIENT}._packet_handle", "self"),
    fence.parameters(f"{_CLIENT}._loop_rc_handle", "self, rc"),
    fence.parameters(f"{_CLIENT}._easy_log", "self, level, fmt, *args"),
    fence.parameters(f"{_CLIENT}._handle_on_message", "self, message"),
    fence.parameters(f"{_CLIENT}._do_on_publish", "self, mid, reason_code, properties"),
    fence.present("paho.mqtt.client.time_func"),
    # _create_socket_connection: unbound where paho would bind to ("", 0)
    fence.parameters(f"{_CLIENT}._create_socket_connection", "self"),
    fence.uses(f"{_CLIENT}._create_socket_connection", "_get_proxy", "_host", "_port", "_bind_address",
               "_bind_port", "_connect_timeout", "create_connection"),
    fence.uses(f"{_CLIENT}._create_socket", "_create_socket_connection"),
    # _get_proxy: paho's steps (an explicit proxy, the environment's, PySocks' default), the
    # middle one skipped where no variable names an MQTT proxy.
    fence.parameters(f"{_CLIENT}._get_proxy", "self"),
    fence.uses(f"{_CLIENT}._get_proxy", "socks", "_proxy_is_valid", "_proxy", "getproxies", "proxy_bypass",
               "get_default_proxy"),
    fence.present("paho.mqtt.client.socks"),
    fence.attributes(f"{_CLIENT}()", _client, "_thread", "_sockpairW", "_sock", "_out_packet", "_in_packet",
                     "_msgtime_mutex", "_last_bytes_received", "_manual_ack", "_protocol", "_in_callback_mutex",
                     "_on_message_filtered", "_logger", "_out_message_mutex", "_out_messages",
                     "suppress_exceptions", "on_log"),
    fence.attributes(f"{_CLIENT}()._on_message_filtered._root", lambda: _client()._on_message_filtered._root,
                     "_children"),
    fence.keys(f"{_CLIENT}()._in_packet", lambda: _client()._in_packet, "command", "have_remaining",
               "remaining_count", "remaining_mult", "remaining_length", "packet", "to_process", "pos"),
    fence.keys(f"a packet {_CLIENT}._packet_queue queues", _queued_packet, "command", "mid", "qos", "pos",
               "to_process", "packet", "info"),
    fence.attributes("paho.mqtt.client.MQTTMessage()", paho.MQTTMessage, "dup", "qos", "properties", "payload",
                     "timestamp"),
    fence.present("paho.mqtt._packet.Properties"),
    fence.parameters("paho.mqtt.properties.Properties.__init__", "self, packetType"),
    fence.parameters("paho.mqtt.properties.Properties.unpack", "self, buffer"),
    fence.keys("paho.mqtt.properties.Properties(PUBLISH).__dict__", lambda: vars(Properties(PacketTypes.PUBLISH)),
               "names", "packetType", "properties", "types"),
)


def written_here(client: paho.Client) -> ContextManager[None]:
    """``client``'s :meth:`Client.written_here` (a client of paho's own loop thread: what is published
    within is written by the publishing thread); nothing for paho's plain client."""
    return client.written_here() if isinstance(client, Client) else contextlib.nullcontext()


@fence.once
def client_class() -> type[paho.Client]:
    """The class of every MQTT client of this process: :class:`Client`, with paho's decoder made to
    build :class:`SharedTableProperties` (:func:`install`), where the installed paho holds
    :data:`PAHO_INTERNALS` and ``TESTBED_MQTT_SPEEDUPS`` is not 0; else paho's own client (one
    warning names what differed). Checked at the first call."""
    fallback = "paho's plain client (slower, the same results)"
    if not (fence.wanted(__name__, fallback=fallback)
            and fence.holds(__name__, "paho-mqtt", PAHO_INTERNALS, fallback=fallback)):
        return paho.Client
    install()
    return Client
