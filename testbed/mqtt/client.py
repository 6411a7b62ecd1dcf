"""A thin synchronous MQTT client for nodes and the coordinator, over paho-mqtt 2.x.

What it adds to paho:
- a raw probe connection first (testbed.mqtt.probe), so that an untrusted, expired or wrong-name
  certificate, mqtt:// to a TLS port or mqtts:// to a plain one is one line at once, not a timeout;
- MQTT v5, or 3.1.1 when the probe shows the broker refuses v5 (amqtt 0.12) or closes a v5 CONNECT
  without a CONNACK (RabbitMQ's MQTT plugin);
- client ids with 64 random bits, so no other client can guess one and take the session over on a
  broker that does not bind client ids to usernames (Mosquitto with `use_username_as_clientid`,
  as `testbed acl` configures it, replaces them by the username anyway);
- QoS 1 everywhere; `publish` blocks until the broker acknowledged every frame;
- a retained `online` on the status topic at each (re)connect and a retained `offline` last will;
- automatic reconnect with exponential backoff, resubscribing at each reconnect;
- transparent chunking of payloads above `max_chunk_bytes` and reassembly on receipt;
- validation of every received wire message (run, sender = the topic's node, shapes, dtypes,
  finiteness, size, replays): bad ones are logged with the sender id and dropped, never raised
  in the network thread;
- end-to-end authentication with per-node keys (testbed.mqtt.auth), when given ``keys``: every
  frame it publishes is sealed (HMAC-SHA256 over topic, session, round and payload), every frame
  it receives is verified before it is parsed, buffered or moves any state, and one that fails is
  counted (``forged``) and logged at a bounded rate;
- a thread-safe inbox read with `receive(timeout_s)`, or a handler called as messages come;
- optionally one shared network thread for many clients (`NetworkLoop`), for hosts of hundreds.

What it does with a received message is testbed.mqtt.receiving's; many clients connected and
publishing at once, testbed.mqtt.client_batches'.
"""

from __future__ import annotations

import collections
import functools
import logging
import queue
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import paho.mqtt.client as paho
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode

from testbed.errors import ConfigError, UserError
from testbed.mqtt import wire
from testbed.mqtt import auth, chunks, paho_speedups, probe, replay, topics
from testbed.mqtt.broker import BrokerUrl, parse_broker_url
from testbed.mqtt.network_loop import NetworkLoop
from testbed.mqtt.receiving import Inbound, Receiving

log = logging.getLogger(__name__)
_paho_log = logging.getLogger("testbed.mqtt.paho")
# paho 2.2 logs "Client is not connected" at ERROR on every pass of its loop between a dropped
# socket and the reconnect, including after a clean disconnect; we log connection losses ourselves.
_paho_log.addFilter(lambda record: not record.getMessage().startswith("Client is not connected"))

QOS = 1
#: The longest will payload MQTT can carry (a two-byte length in CONNECT, both versions).
MAX_WILL_BYTES = 65_535
_MAX_FRAMES = 16384  # per publish, and acks remembered
PROTOCOLS = ("auto", "5", "3.1.1")


def new_client_id(run: str, who: str) -> str:
    """`tb-{run}-{who}-{16 hex}`: readable in a broker's log, and 64 random bits that nobody can
    guess (a client connecting with another's id takes its session over where the broker does not
    bind ids to usernames)."""
    return f"tb-{run}-{who}-{secrets.token_hex(8)}"


class BrokerRefused(UserError):
    """The broker refused a connection, subscription or publish (credentials or ACL)."""


class MqttClient(Receiving):
    """Synchronous MQTT client; use `for_node` / `for_coordinator` for the standard wiring.

    Args:
        url: broker URL (`mqtt[s]://[user:pass@]host:port`).
        client_id: MQTT client id, unique per broker (a second connection with the same id takes
            the first one over); the constructors draw one with `new_client_id`. A broker with
            `use_username_as_clientid` replaces it by the username.
        run: run id; received messages of other runs are rejected.
        subscriptions: topic filters, (re)subscribed at every connect.
        status_topic: where `online` is published (retained) on connect and `offline` is the last
            will; None for neither.
        coordinator_id: sender id expected on down and bcast topics.
        username, password: credentials (override those in the URL).
        tls_ca: CA file for mqtts:// (None: system CAs); refused with mqtt://, which would run in
            cleartext.
        protocol: "auto" (v5 if the broker speaks it, else 3.1.1), "5" or "3.1.1".
        keepalive_s: MQTT keepalive in seconds; the broker declares a silent client dead after
            1.5 times this and publishes its will.
        max_chunk_bytes: payloads longer than this travel as chunks of at most this many bytes.
        max_message_bytes: largest payload accepted from the network, in bytes.
        reconnect_min_s, reconnect_max_s: backoff between reconnect attempts (doubling).
        session_expiry_s: how long the broker keeps subscriptions and queued QoS 1 messages of a
            disconnected client (v5 session expiry; on 3.1.1 any value > 0 means a persistent
            session); 0 for a clean session at every connect.
        inbox: a queue to put received messages in, shared by several clients (an emulated node
            host serves many nodes from one thread); default: a queue of this client's own.
        owner: who this client speaks for (a node id), copied into every Inbound's `receiver`.
        network: a NetworkLoop shared with other clients to run this one's socket; default: a
            paho network thread of its own (fine for a few clients per process, not hundreds).
        on_inbound: called on the network thread with each received message, instead of putting it
            in the inbox (then `receive` has nothing): a receiver that handles messages as they come
            saves a hand-over between threads per message. It must not block.
        on_inbound_all: with ``on_inbound``, called instead of it with the messages of one container
            of carried uplinks (testbed.mqtt.carried), in order: taken together, not one by one.
        replay_window_rounds: how many of a sender's latest rounds the replay guard remembers; a
            message of an older round is refused as a replay (replay.ReplayGuard). A receiver that
            dedupes by meaning itself (the coordinator charges a node's round once, however late)
            passes a window as long as a run, so that no late reply is lost to it.
        admit: called on the network thread with each decoded wire message before any per-sender
            state (the replay window) moves: the receiver's own declaration of what it may take
            (its session, the rounds it has open); a reason (str) refuses the message, counted
            and logged like any other rejection, and it changes nothing. None admits everything
            that decodes.
        on_connection: called on the network thread with False when an established connection is
            lost (reconnecting) and True when it is back; not for the first connect, nor a close.
            It must not block.
        keys: the keys this client shares with its peers (testbed.mqtt.auth): a node's own, the
            coordinator's every node's and the channel's; None sends and takes frames unsealed
            (a run with ``mqtt.authenticate = false``).
        auth_session: the session this client's statuses and will are sealed for ("" where it is
            not known at connect: a board), and, when not "", the only session whose frames it
            takes (another's are dropped before they are buffered).
        unverified_statuses: without ``keys``, read a sealed status's value without verifying it
            (a display that holds no key, `testbed watch`; never a party of the run).
    """

    def __init__(self, url: str, *, client_id: str, run: str, subscriptions: Sequence[str] = (),
                 status_topic: str | None = None, coordinator_id: str = "coordinator",
                 username: str | None = None, password: str | None = None,
                 tls_ca: str | Path | None = None, protocol: str = "auto", keepalive_s: int = 30,
                 max_chunk_bytes: int = 256 * 1024, max_message_bytes: int = wire.DEFAULT_MAX_BYTES,
                 reconnect_min_s: float = 0.25, reconnect_max_s: float = 30.0,
                 session_expiry_s: int = 300, inbox: queue.Queue | None = None, owner: str | None = None,
                 network: NetworkLoop | None = None, on_inbound: Callable[[Inbound], None] | None = None,
                 on_inbound_all: Callable[[list[Inbound]], None] | None = None,
                 admit: Callable[[wire.Message], str | None] | None = None, replay_window_rounds: int = 16,
                 on_connection: Callable[[bool], None] | None = None, keys: auth.Keys | None = None,
                 auth_session: str = "", unverified_statuses: bool = False):
        if protocol not in PROTOCOLS:
            raise ConfigError("mqtt.protocol", f"must be one of {', '.join(PROTOCOLS)}, got {protocol!r}")
        if max_chunk_bytes <= chunks.CHUNK_HEADER_BYTES:
            raise ValueError(f"max_chunk_bytes must exceed {chunks.CHUNK_HEADER_BYTES}")
        self.url: BrokerUrl = parse_broker_url(url)
        probe.check_tls_ca_use(url, None if tls_ca is None else str(tls_ca))
        self.client_id = client_id
        self.run = wire.check_id(run, "run id")
        self.subscriptions = list(subscriptions)
        self.status_topic = status_topic
        self.coordinator_id = coordinator_id
        self._username = username if username is not None else self.url.username
        self._password = password if password is not None else self.url.password
        self._tls_ca = str(tls_ca) if tls_ca is not None else None
        self._protocol_choice = protocol
        self._keepalive_s = keepalive_s
        self.max_chunk_bytes = max_chunk_bytes
        self._max_message_bytes = max_message_bytes
        self._reconnect = (reconnect_min_s, reconnect_max_s)
        self._session_expiry_s = session_expiry_s

        self._inbox: queue.Queue[Inbound] = inbox if inbox is not None else queue.Queue()
        self._deliver: Callable[[Inbound], None] = on_inbound if on_inbound is not None else self._inbox.put
        self._deliver_all = on_inbound_all if on_inbound is not None else None
        self.owner = owner
        self._network = network
        self._reassembler = chunks.Reassembler(max_message_bytes=max_message_bytes)
        self._replay = replay.ReplayGuard(window_rounds=replay_window_rounds)
        self._admit = admit
        self._on_connection = on_connection
        self._was_connected = False  # once connected, a later connect is a reconnect
        self._lock = threading.Condition()
        self._paho: paho.Client | None = None
        self._connack: ReasonCode | None = None
        self._sub_mid: int | None = None
        self._sub_failures: list[str] | None = None
        # mid -> None (acknowledged) or the broker's refusal, until the publish waiting for it takes
        # it; mids nobody waits for (fire-and-forget, timed out) are dropped when acknowledged.
        # Never the ReasonCode itself: each carries a ~1 KB dict of its own, and keeping the last
        # acks of every node's client grew a host by a kilobyte per node per round.
        self._acked: dict[int, str | None] = {}
        self._unwatched: collections.OrderedDict[int, None] = collections.OrderedDict()
        self.protocol: str | None = None  # "5" or "3.1.1" once connected
        self.connected = False
        self.rejected = 0  # received messages dropped by validation
        self._keys = keys
        self._auth_session = auth_session
        self._unverified_statuses = unverified_statuses and keys is None
        self._epoch = auth.new_epoch()  # of the connection the will below is for (statuses)
        self._will_too_long = False  # said once
        self._epochs = auth.StatusEpochs()
        self._forged = auth.RejectLog(client_id)

    @functools.cached_property
    def _nodes_only(self) -> list[str]:
        """Every node's key id held (a coordinator's broadcast is sealed for them): made when first
        sealed for, not for each of a host's 1,000 node clients (a list of its 1,000 ids each)."""
        return [p for p in self._keys.principals() if p != topics.CHANNEL] if self._keys is not None else []

    def _readers(self, t: topics.Topic) -> list[str]:
        """Whose tags a frame on topic ``t`` carries (auth.readers); every node's on the broadcast only."""
        assert self._keys is not None
        return auth.readers(t.kind, t.node, self._keys, self._nodes_only if t.kind == topics.BCAST else ())

    @property
    def forged(self) -> int:
        """Received frames dropped because they did not authenticate."""
        return self._forged.count

    @property
    def authenticated(self) -> bool:
        """Whether frames are sealed and verified (testbed.mqtt.auth)."""
        return self._keys is not None

    def row_tag(self, node: str, session: str, digest: bytes) -> bytes:
        """``node``'s tag over a row's ``digest`` (testbed.mqtt.shared_header), with this client's
        key; ValueError where it does not authenticate."""
        if self._keys is None:
            raise ValueError(f"{self.client_id} does not authenticate: it tags no row")
        return auth.tag(self._keys, node, session, digest)

    # ---- construction helpers ------------------------------------------------------------

    @classmethod
    def for_node(cls, url: str, run: str, node: str, **kwargs: Any) -> MqttClient:
        """A node's client: id `tb-{run}-{node}-{random}`, subscribed to its downlink, the broadcast
        and the coordinator status (unless ``subscriptions`` says otherwise); status topic
        `status/{node}`."""
        kwargs.setdefault("subscriptions", topics.node_subscriptions(run, node))
        kwargs.setdefault("client_id", new_client_id(run, node))
        return cls(url, run=run, status_topic=topics.status(run, node), owner=node, **kwargs)

    @classmethod
    def for_channel(cls, url: str, run: str, **kwargs: Any) -> MqttClient:
        """The channel emulator's client: id `tb-{run}-channel-{random}`, subscribed to the
        coordinator's round notices, every transmit signal and every status; status topic
        `status/channel`."""
        kwargs.setdefault("client_id", new_client_id(run, topics.CHANNEL))
        return cls(url, run=run, subscriptions=topics.channel_subscriptions(run),
                   status_topic=topics.status(run, topics.CHANNEL), owner=topics.CHANNEL, **kwargs)

    @classmethod
    def for_coordinator(cls, url: str, run: str, coordinator_id: str = "coordinator",
                        **kwargs: Any) -> MqttClient:
        """The coordinator's client: id `tb-{run}-{coordinator_id}-{random}`, subscribed to every
        uplink and node status; status topic `coord`."""
        kwargs.setdefault("subscriptions", topics.coordinator_subscriptions(run))
        kwargs.setdefault("client_id", new_client_id(run, coordinator_id))
        return cls(url, run=run, status_topic=topics.coord(run), coordinator_id=coordinator_id, **kwargs)

    # ---- connection -----------------------------------------------------------------------

    def _make_paho(self, protocol: str) -> paho.Client:
        v5 = protocol == "5"
        # paho's client with the speed layer where the installed paho holds what it relies on
        c = paho_speedups.client_class()(paho.CallbackAPIVersion.VERSION2, client_id=self.client_id,
                                         protocol=paho.MQTTv5 if v5 else paho.MQTTv311,
                                         clean_session=None if v5 else self._session_expiry_s == 0)
        c.enable_logger(_paho_log)
        if self._username is not None:
            c.username_pw_set(self._username, self._password)
        if self.url.tls:
            c.tls_set_context(probe.tls_context(self._tls_ca))  # loaded and checked by the probe
        c.reconnect_delay_set(*self._reconnect)  # type: ignore[arg-type]  # floats work
        self._set_will(c)
        c.on_connect = self._on_connect
        c.on_disconnect = self._on_disconnect
        c.on_subscribe = self._on_subscribe
        c.on_publish = self._on_publish
        c.on_message = self._on_message
        if isinstance(c, paho_speedups.Client):
            c.on_publish_received = self._on_publish_received
        return c

    def _start_attempt(self, protocol: str) -> None:
        """Start the paho client with `protocol` (its CONNACK is awaited by :meth:`_finish_connect`)."""
        with self._lock:
            self._connack, self._sub_mid, self._sub_failures = None, None, None
        c = self._paho = self._make_paho(protocol)
        props = None
        if protocol == "5":
            props = Properties(PacketTypes.CONNECT)
            props.SessionExpiryInterval = self._session_expiry_s
        # clean_start: a fresh session at the first connect, resumed across reconnects.
        clean_start = paho.MQTT_CLEAN_START_FIRST_ONLY if protocol == "5" else True
        if self._network is not None:
            self._network.add(c, self.url.host, self.url.port, keepalive_s=self._keepalive_s,
                              reconnect_min_s=self._reconnect[0], reconnect_max_s=self._reconnect[1],
                              properties=props, clean_start=clean_start)
        else:
            c.connect_async(self.url.host, self.url.port, keepalive=self._keepalive_s, properties=props,
                            clean_start=clean_start)
            c.loop_start()

    def _disconnect_properties(self) -> Properties | None:
        """What the DISCONNECT carries. The session ends with the client (MQTT 5): a broker would
        otherwise keep it for session_expiry_s, queueing whatever its subscriptions match (the next
        run on the same run id: one copy of every broadcast per node of each run before). A new
        client starts a fresh session anyway (clean start at its first connect)."""
        if self.protocol != "5":
            return None
        props = Properties(PacketTypes.DISCONNECT)
        props.SessionExpiryInterval = 0
        return props

    def connect(self, timeout_s: float = 10.0, *, probe_first: bool = True) -> MqttClient:
        """Connect, subscribe, publish `online`; block until all of it is acknowledged.

        Keeps retrying an unreachable broker until `timeout_s`. Afterwards paho reconnects by
        itself whenever the connection drops.

        Args:
            timeout_s: how long to wait for the broker, in seconds.
            probe_first: open the raw probe connection first (clear TLS and version errors). A
                host whose first node's client probed the same broker passes False with the
                version it learnt (``protocol`` "5" or "3.1.1"): each further node then costs one
                connection, not two (a probe left in TIME_WAIT holds an ephemeral port for 60 s).

        Raises:
            UserError: broker not reachable in time (saying what the last attempt saw); at once, a
                certificate that does not verify, a TLS/plain mismatch, an unreadable tls_ca.
            BrokerRefused: bad credentials, or a subscription refused by the ACL.
        """
        if self._paho is None:
            self._finish_connect(self._start_connect(timeout_s, probe_first))
        return self

    def _start_connect(self, timeout_s: float, probe_first: bool) -> Connecting:
        """The first half of :meth:`connect`: the probe (if asked for) and the paho client started."""
        deadline = time.monotonic() + timeout_s
        if probe_first or self._protocol_choice == "auto":
            protocol = probe.negotiate(self.url, tls_ca=self._tls_ca, protocol=self._protocol_choice,
                                       client_id=f"{self.client_id}-probe", username=self._username,
                                       password=self._password, deadline=deadline, timeout_s=timeout_s).protocol
        else:
            protocol = self._protocol_choice
        self._start_attempt(protocol)
        return Connecting(protocol, deadline, timeout_s)

    def _finish_connect(self, started: Connecting) -> None:
        """The second half of :meth:`connect`: the CONNACK and the subscriptions' SUBACK, awaited."""
        protocol, deadline, timeout_s = started
        with self._lock:
            self._lock.wait_for(lambda: self._connack is not None, max(0.0, deadline - time.monotonic()))
            code = self._connack
        if code is None or code.is_failure:
            _shut_down([self])
            if code is None:
                raise UserError(f"broker {self.url} not reachable within {timeout_s:g} s")
            raise BrokerRefused(f"broker {self.url} refused client {self.client_id!r} (MQTT {protocol}): {code}")
        self.protocol = protocol
        with self._lock:
            done = self._lock.wait_for(lambda: self._sub_failures is not None,
                                       max(0.0, deadline - time.monotonic()))
            failures = self._sub_failures
        if not done:
            self.close()
            raise UserError(f"broker {self.url} did not acknowledge subscriptions within {timeout_s:g} s")
        if failures:
            self.close()
            raise BrokerRefused(f"broker {self.url} refused subscriptions of {self.client_id!r}: {'; '.join(failures)}")

    def close(self, timeout_s: float = 5.0) -> None:
        """Publish `offline` (a clean disconnect sends no will), disconnect, stop the thread."""
        close_all([self], timeout_s)

    def __enter__(self) -> MqttClient:
        return self.connect()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- paho callbacks (network thread: log, never raise) ---------------------------------

    def _on_connect(self, client: paho.Client, userdata: Any, flags: Any, code: ReasonCode,
                    properties: Any) -> None:
        if code.is_failure:
            log.warning("%s: broker %s refused connection: %s", self.client_id, self.url, code)
        else:
            sock = client.socket()
            if isinstance(sock, socket.socket) and sock.family in (socket.AF_INET, socket.AF_INET6):
                # Small QoS-1 packets and their acks must not wait out Nagle and delayed ACKs
                # (40 ms each on Linux): a round trip is otherwise ~90 ms on loopback.
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.connected = True
            if self._was_connected and self._on_connection is not None:
                self._on_connection(True)
            self._was_connected = True
            mid = None
            if self.subscriptions:
                _, mid = client.subscribe([(t, QOS) for t in self.subscriptions])
            status = None
            if self.status_topic:
                status = client.publish(self.status_topic, self._status(topics.STATUS_ONLINE), qos=QOS,
                                        retain=True).mid
            with self._lock:
                if status is not None:
                    self._unwatch([status])
                self._sub_mid = mid
                if mid is None:
                    self._sub_failures = []
        with self._lock:
            self._connack = code
            self._lock.notify_all()

    def _on_disconnect(self, client: paho.Client, userdata: Any, flags: Any, code: ReasonCode,
                       properties: Any) -> None:
        if self.connected:
            log.warning("%s: lost connection to %s (%s); reconnecting", self.client_id, self.url, code)
            if self._on_connection is not None:
                self._on_connection(False)
        self.connected = False
        if self.status_topic and self._keys is not None:
            # The next connection's will and online are of a new epoch: this one's will, which the
            # broker may have published, cannot be replayed against it.
            self._epoch = auth.new_epoch()
            self._set_will(client)

    def _set_will(self, client: paho.Client) -> None:
        """The connection's last will: ``offline`` on the status topic, sealed for its readers. A
        coordinator's is sealed for every node (a tag each): past ~3,100 nodes it is longer than
        MQTT lets a will be, and the connection has none (paho's CONNECT would fail on it): its
        emulated hosts watch its process instead; real boards do not hear of an unclean end."""
        if not self.status_topic:
            return
        will = self._status(topics.STATUS_OFFLINE)
        if len(will) > MAX_WILL_BYTES:
            if not self._will_too_long:
                self._will_too_long = True
                log.warning("%s: no last will: sealed for %d readers it is %d bytes, more than MQTT's %d",
                            self.client_id, len(self._keys.principals()) if self._keys else 0, len(will),
                            MAX_WILL_BYTES)
            client.will_clear()
            return
        client.will_set(self.status_topic, will, qos=QOS, retain=True)

    def _tell_coordinator(self) -> None:
        """A coordinator's new connection: a board (its statuses carry no session) says again that
        it is online, for this connection's epoch. Its retained status may be a will of an earlier
        connection that someone replayed before this coordinator subscribed (it verifies; only its
        epoch is old): the coordinator takes the newer epoch's. A client of one session needs none
        (its statuses do not verify in another session)."""
        c = self._paho
        if c is None or not self.connected or self._auth_session or self.status_topic is None:
            return
        mid = c.publish(self.status_topic, self._status(topics.STATUS_ONLINE), qos=QOS, retain=True).mid
        with self._lock:
            self._unwatch([mid])

    def _status(self, value: bytes) -> bytes:
        """A status payload as published: sealed for this connection's epoch when authenticated."""
        if self._keys is None or self.status_topic is None:
            return value
        t = topics.parse(self.status_topic)
        return auth.seal(self._keys, self.status_topic, self._readers(t),
                         self._auth_session, self._epoch, value)

    def _frames(self, topic: str, payload: bytes) -> list[bytes]:
        """What goes on the wire for ``payload`` on ``topic``: itself or its chunk frames, each sealed
        (when authenticated) with the message's session and round, all within ``max_chunk_bytes``."""
        if self._keys is None:
            return [payload] if len(payload) <= self.max_chunk_bytes else chunks.chunk(payload, self.max_chunk_bytes)
        if topic == self.status_topic:
            return [self._status(payload)]
        t = topics.parse(topic)
        session, round_index = wire.session_and_round(payload)
        principals = self._readers(t)
        room = self.max_chunk_bytes - auth.overhead(principals, session)
        if room <= chunks.CHUNK_HEADER_BYTES:
            raise ValueError(f"max_chunk_bytes {self.max_chunk_bytes} leaves no room beside the seal of "
                             f"{len(principals)} reader(s) on {topic}")
        frames = [payload] if len(payload) <= room else chunks.chunk(payload, room)
        return [auth.seal(self._keys, topic, principals, session, round_index, frame) for frame in frames]

    def _on_subscribe(self, client: paho.Client, userdata: Any, mid: int, codes: list[ReasonCode],
                      properties: Any) -> None:
        failures = [f"{t}: {c}" for t, c in zip(self.subscriptions, codes) if c.is_failure]
        for failure in failures:
            log.error("%s: subscription refused: %s", self.client_id, failure)
        with self._lock:
            if mid == self._sub_mid:
                self._sub_failures = failures
                self._lock.notify_all()

    def _on_publish(self, client: paho.Client, userdata: Any, mid: int, code: ReasonCode,
                    properties: Any) -> None:
        if code.is_failure:
            log.error("%s: broker refused publish (mid %d): %s", self.client_id, mid, code)
        with self._lock:
            if self._unwatched.pop(mid, False) is None:
                return  # nobody waits for it: keeping it would only grow
            self._acked[mid] = str(code) if code.is_failure else None
            self._lock.notify_all()

    def _unwatch(self, mids: Sequence[int]) -> None:
        """Nobody will wait for these publishes' acks (call with the lock held): drop any that came,
        and those still to come. Bounded below the 65535 message ids (an ack lost with a broker
        restart never comes), so a reused id never meets a stale mark."""
        for mid in mids:
            if self._acked.pop(mid, False) is False:
                self._unwatched[mid] = None
        while len(self._unwatched) > _MAX_FRAMES:
            self._unwatched.popitem(last=False)

    # ---- data -----------------------------------------------------------------------------

    def publish(self, topic: str, payload: bytes, *, retain: bool = False,
                timeout_s: float | None = 30.0) -> None:
        """Publish at QoS 1, chunked if longer than `max_chunk_bytes`.

        Args:
            topic: a concrete topic (see `testbed.mqtt.topics`).
            payload: bytes (an encoded wire message, or a status string).
            retain: retain on the broker (not allowed for chunked payloads).
            timeout_s: wait this long for the broker's acknowledgements; None returns at once (paho
                still delivers, resending after a reconnect).

        Raises:
            TimeoutError: not all frames acknowledged in time (they stay queued in paho).
            BrokerRefused: an MQTT v5 broker refused the publish (ACL). A 3.1.1 broker cannot say
                so: it acknowledges and drops the message.
        """
        self._await_acks(topic, self._send(topic, payload, retain), timeout_s)

    def publish_then(self, topic: str, payload: bytes, *, timeout_s: float = 30.0) -> Callable[[], None]:
        """:meth:`publish` in two halves: the frames handed to paho (and the socket) now; the call
        returned awaits the broker's acknowledgements, at most until ``timeout_s`` from now, and
        raises as :meth:`publish` does. Between the two the caller works while the broker answers
        (the coordinator reports a round while its next round's broadcast is acknowledged)."""
        mids = self._send(topic, payload, False)
        deadline = time.monotonic() + timeout_s
        return lambda: self._await_acks(topic, mids, max(0.0, deadline - time.monotonic()))

    def sealed(self, topic: str, payload: bytes) -> list[bytes]:
        """The frames :meth:`publish` would put on the wire for ``payload`` on ``topic`` (sealed
        with this client's key where it authenticates, chunked where long): what another of its
        host's clients may carry (testbed.mqtt.carried)."""
        return self._frames(topic, payload)

    def publish_frames(self, topic: str, frames: Sequence[bytes]) -> None:
        """Publish ``frames`` as they are (a container of carried uplinks: neither sealed nor
        chunked here) at QoS 1, not awaiting the broker's acknowledgements, as a host's replies."""
        mids = self._send(topic, b"", False, list(frames))
        with self._lock:
            self._unwatch(mids)

    def _send(self, topic: str, payload: bytes, retain: bool, frames: list[bytes] | None = None) -> list[int]:
        """The first half of :meth:`publish`: the frames handed to paho; their message ids."""
        c = self._paho
        if c is None:
            raise RuntimeError(f"{self.client_id}: publish before connect()")
        if frames is None:
            frames = self._frames(topic, payload)
        if len(frames) > _MAX_FRAMES:
            raise ValueError(f"{len(payload)} bytes in chunks of {self.max_chunk_bytes} is over {_MAX_FRAMES} frames")
        if retain and len(frames) > 1:
            raise ValueError(f"cannot retain a chunked payload ({len(payload)} bytes) on {topic}")
        mids = []
        with paho_speedups.written_here(c):  # by this thread, not paho's loop thread woken for it
            for frame in frames:
                info = c.publish(topic, frame, qos=QOS, retain=retain)
                if info.rc not in (paho.MQTT_ERR_SUCCESS, paho.MQTT_ERR_NO_CONN):  # NO_CONN: queued
                    raise RuntimeError(f"{self.client_id}: publish to {topic} failed: {paho.error_string(info.rc)}")
                mids.append(info.mid)
        if self._network is not None:
            self._network.flush(c)
        return mids

    def _await_acks(self, topic: str, mids: list[int], timeout_s: float | None) -> None:
        """The second half of :meth:`publish`: its acknowledgements, awaited (or not, with None)."""
        with self._lock:
            if timeout_s is None:
                self._unwatch(mids)
                return
            if not self._lock.wait_for(lambda: all(m in self._acked for m in mids), timeout_s):
                self._unwatch(mids)
                raise TimeoutError(f"{self.client_id}: publish to {topic} not acknowledged within {timeout_s:g} s")
            refused = [code for code in (self._acked.pop(m) for m in mids) if code is not None]
        if refused:
            raise BrokerRefused(f"broker {self.url} refused publish by {self.client_id!r} to {topic}: {refused[0]}")

    def receive(self, timeout_s: float | None = None) -> Inbound | None:
        """The next received message, waiting up to `timeout_s` seconds (None: forever);
        None on timeout."""
        try:
            return self._inbox.get(timeout=timeout_s)
        except queue.Empty:
            return None


class Connecting(NamedTuple):
    """A connect started (:meth:`MqttClient._start_connect`): its protocol and its deadline."""

    protocol: str
    deadline: float  # time.monotonic()
    timeout_s: float


def close_all(clients: Iterable[MqttClient], timeout_s: float = 5.0) -> None:
    """:meth:`MqttClient.close` of each of ``clients``, together: every `offline` status is
    published before any acknowledgement is awaited, and the clients of one network loop are
    disconnected on one wake-up of it, before any socket's close is awaited. An emulated host's 50
    nodes, closed each on its own thread, took 80 ms; ``timeout_s`` bounds the acks in all."""
    clients = [client for client in clients if client._paho is not None]
    deadline = time.monotonic() + timeout_s
    sent, refused = [], {}
    for client in clients:
        if client.status_topic and client.connected:
            try:
                sent.append((client, client._send(client.status_topic, topics.STATUS_OFFLINE, retain=True)))
            except RuntimeError as exc:  # paho did not take it: raised below, as close() does
                refused[client] = exc
    for client, mids in sent:
        try:
            client._await_acks(client.status_topic, mids, max(0.0, deadline - time.monotonic()))
        except (TimeoutError, BrokerRefused) as exc:
            log.warning("%s: could not publish offline status: %s", client.client_id, exc)
    # A client whose status paho did not take is not disconnected cleanly: its will says offline.
    _shut_down([client for client in clients if client not in refused])
    if refused:
        raise next(iter(refused.values()))


def _shut_down(clients: list[MqttClient]) -> None:
    """Disconnect ``clients`` (a clean DISCONNECT: no will) and forget their paho clients; those of
    one network loop (and protocol) at once, each other one with its own thread stopped."""
    together: dict[tuple[NetworkLoop, str | None], list[MqttClient]] = {}
    for client in clients:
        client.connected = False  # first, so on_disconnect does not report a lost connection
        if client._paho is None:
            continue
        if client._network is None:
            client._paho.disconnect(properties=client._disconnect_properties())
            client._paho.loop_stop()
            client._paho = None
        else:
            together.setdefault((client._network, client.protocol), []).append(client)
    for (network, _), group in together.items():
        network.remove_all([client._paho for client in group], properties=group[0]._disconnect_properties())
        for client in group:
            client._paho = None
