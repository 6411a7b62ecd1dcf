"""What an MQTT client (testbed.mqtt.client) does with each message it receives, on the network
thread: the topic's run, the frame's seal (testbed.mqtt.auth: a frame that does not authenticate
is dropped before any of it is parsed or any state moves), a status's value, the chunks
reassembled, the wire message decoded against its sender, the receiver's own ``admit``, the replay
window; then handed over as an :class:`Inbound`, else counted and logged as rejected, never raised.
:class:`Receiving` is that part of :class:`testbed.mqtt.client.MqttClient`."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable

import paho.mqtt.client as paho

from testbed.mqtt import wire
from testbed.mqtt import auth, carried, chunks, shared_header, topics
from testbed.util.frozen import frozen

# The client's one logger, whichever of its modules writes (docs/wire-protocol.md names it).
log = logging.getLogger("testbed.mqtt.client")


# The last payload decoded in this process and its message: a broadcast reaches every client of
# a host, each on its own connection, with the same bytes; the first copy is decoded and
# validated, the others (equal bytes, equal expectations) get the same read-only message. Keyed on
# equal bytes, not on one object as testbed.util.memo is: each connection reads its own copy.
_last_decoded: tuple[bytes, str, str, int, wire.Message] | None = None


def _decode(payload: bytes, run: str, sender: str, max_bytes: int) -> wire.Message:
    """``wire.decode(payload)`` expecting ``run`` and ``sender`` (WireError if it fails), reusing the
    previous result for a copy of the same payload."""
    global _last_decoded
    last = _last_decoded  # one read: other network threads may replace it meanwhile
    if last is not None and last[1] == run and last[2] == sender and last[3] == max_bytes and last[0] == payload:
        return last[4]
    message = wire.decode(payload, expect_run=run, expect_sender=sender, max_bytes=max_bytes)
    if isinstance(payload, bytes):
        _last_decoded = (payload, run, sender, max_bytes, message)
    return message



@dataclasses.dataclass(frozen=True)
class Inbound:
    """One received message.

    Attributes:
        topic: the MQTT topic it arrived on.
        kind: topics.DATA_KINDS (wire messages) or STATUS / COORD (status strings).
        node: node id from the topic (None for bcast and coord).
        payload: the (reassembled) payload bytes; b"" for a row of a container under a shared header
            (testbed.mqtt.shared_header), which has no message bytes of its own.
        message: the decoded, validated wire message for up/down/bcast; None for status kinds.
        receiver: the `owner` of the client it arrived at (the node id of a node's client), so
            clients that share one inbox can tell whose copy of a broadcast it is.
    """

    topic: str
    kind: str
    node: str | None
    payload: bytes
    message: wire.Message | None
    receiver: str | None = None

    @classmethod
    def of(cls, topic: str, kind: str, node: str | None, payload: bytes, message: wire.Message | None,
           receiver: str | None) -> Inbound:
        """``Inbound(...)`` in a quarter of its time (testbed.util.frozen): one per message received."""
        return frozen(cls, {"topic": topic, "kind": kind, "node": node, "payload": payload, "message": message,
                            "receiver": receiver})


class Receiving:
    """The receiving side of :class:`testbed.mqtt.client.MqttClient` (paho's callbacks for a
    message; its keys, replay guard, reassembler and hand-over are the client's)."""

    def _on_message(self, client: paho.Client, userdata: Any, msg: paho.MQTTMessage) -> None:
        try:
            topic = msg.topic
        except UnicodeDecodeError as exc:
            self._reject("?", "<not UTF-8>", exc)
            return
        self._take(topic, msg.payload)

    def _on_publish_received(self, topic: bytes, payload: bytes) -> None:
        """paho_speedups' ``on_publish_received``: a QoS 1 message, told without paho's MQTTMessage."""
        try:
            text = topic.decode()
        except UnicodeDecodeError as exc:
            self._reject("?", "<not UTF-8>", exc)
            return
        self._take(text, payload)

    def _take(self, topic: str, payload: bytes, carrier: str | None = None) -> None:
        """A received message: checked (topic, run, its seal, and a wire message's decoding and
        replay) and handed over, else counted and logged as rejected. A frame that does not
        authenticate is dropped first, before any of it is parsed or any state moves. A container
        of carried uplinks (testbed.mqtt.carried) is taken frame by frame, each as if it came on
        its node's own uplink (:meth:`_take_carried`), and so is each row of a container of rows
        under a shared header (:meth:`_take_rows`)."""
        sender = "?"
        try:
            t, sender = self._topic(topic)
            if t.kind == topics.UP and carried.is_carried(payload):
                self._take_carried(payload, carrier, t.node)
                return
            if t.kind == topics.UP and shared_header.is_shared(payload):
                self._take_rows(payload, carrier, t.node)
                return
            sealed = None
            if self._keys is not None:
                sealed = self._opened(topic, t, sender, payload)
                if sealed is None:
                    return
                payload = sealed.body
            if t.kind not in topics.DATA_KINDS:
                self._take_status(topic, t, sender, payload, sealed)
                return
            decoded = self._decoded(topic, sender, payload, sealed)
            if decoded is not None:
                self._deliver(self._admitted(topic, t, *decoded))
        except (wire.WireError, topics.TopicError) as exc:
            self._reject(sender, topic, exc)
        except Exception:
            self.rejected += 1
            log.exception("%s: failed to handle message from %s on %r", self.client_id, sender, topic)

    def _topic(self, topic: str) -> tuple[topics.Topic, str]:
        """The topic parsed and who may write on it; TopicError, or WireError if of another run."""
        t = topics.parse(topic)
        sender = topics.writer(t.kind, t.node, self.coordinator_id)
        if t.run != self.run:
            raise wire.WireError("wrong_run", f"topic is for run {t.run!r}, this client serves {self.run!r}")
        return t, sender

    def _opened(self, topic: str, t: topics.Topic, sender: str, payload: bytes) -> auth.Opened | None:
        """The frame's seal opened for this reader, or None (counted and logged as forged: nothing of
        it was parsed); WireError when it is sealed for another session."""
        try:
            sealed = auth.open_sealed(self._keys, topic, auth.reader_key(t.kind, t.node, self.owner) or "?", payload)
        except auth.Forged as exc:
            self._forged.reject(sender, t.kind, exc.reason)
            return None
        if self._auth_session and sealed.session not in (self._auth_session, ""):
            raise wire.WireError("not_admitted", f"sealed for session {sealed.session}, this client "
                                                 f"serves {self._auth_session}")
        return sealed

    def _take_status(self, topic: str, t: topics.Topic, sender: str, payload: bytes,
                     sealed: auth.Opened | None) -> None:
        """A status (a node's or the coordinator's), its seal opened if sealed: handed over."""
        if self._unverified_statuses:
            payload = auth.unverified_body(payload)
        # A status carries one of two declared values; anything else (garbage, an empty
        # retained message clearing the topic) says nothing about the node: never "offline".
        if payload not in topics.STATUS_VALUES:
            raise wire.WireError("bad_status", f"status payload {payload[:32]!r} is not one of "
                                               f"{sorted(topics.STATUS_VALUES)}")
        if sealed is not None:
            stale = self._epochs.take(sender, sealed.round, payload == topics.STATUS_ONLINE)
            if stale == auth.SAME:
                return  # a copy of what this writer's connection said (QoS 1, an answer below)
            if stale is not None:
                raise wire.WireError("replay", stale)
            if t.kind == topics.COORD and payload == topics.STATUS_ONLINE:
                self._tell_coordinator()
        self._deliver(Inbound.of(topic, t.kind, t.node, payload, None, self.owner))

    def _decoded(self, topic: str, sender: str, payload: bytes,
                 sealed: auth.Opened | None) -> tuple[bytes, wire.Message] | None:
        """A data frame's (payload, message): its chunks reassembled (None until the last came),
        decoded against its sender, of its seal's round and session."""
        if chunks.is_chunk(payload):
            payload = self._reassembler.add(payload, source=topic)
            if payload is None:
                return None
        message = _decode(payload, self.run, sender, self._max_message_bytes)
        if sealed is not None and (message.round != sealed.round or message.meta.get("session", "") != sealed.session):
            raise wire.WireError("bad_header", f"the message's round {message.round} and session differ from "
                                               f"its seal's ({sealed.round}, {sealed.session})")
        return payload, message

    def _admitted(self, topic: str, t: topics.Topic, payload: bytes, message: wire.Message) -> Inbound:
        """A decoded message admitted by the receiver and through the replay window, to hand over."""
        refusal = self._admit(message) if self._admit is not None else None
        if refusal is not None:
            raise wire.WireError("not_admitted", refusal)
        self._replay.check(message)  # only now: a message refused above moved no window
        return Inbound.of(topic, t.kind, t.node, payload, message, self.owner)

    def _take_carried(self, payload: bytes, carrier: str | None, by: str | None) -> None:
        """Each frame of a container that node ``by`` published, taken as if it came on its own
        node's uplink (its seal opened for that node and topic before it is parsed); WireError for
        the container. Only where frames are authenticated: without seals nothing would say who
        wrote a carried reply.

        The frames go through :meth:`_take`'s steps a step at a time (every seal, then every
        decoding, then each admitted, then all handed over, in the container's order): each frame
        is accepted or refused by the same checks as alone, and the same code run on 40 frames in
        a row costs a quarter less than each frame's whole path in turn (the interpreter's and the
        libraries' caches stay warm)."""
        self._check_container(carrier)
        # A frame's writer is the node its uplink topic names (topics.writer), as _take says of it.
        frames = [(topics.up(self.run, node), node, frame) for node, frame in
                  carried.unpack(payload, max_bytes=self._max_message_bytes)]
        opened = [self._each(self._open_carried, topic, node, topic, frame, by or "?") for topic, node, frame in frames]
        decoded = [None if o is None else self._each(self._decoded, o[0], o[2], o[0], o[2], o[3].body, o[3])
                   for o in opened]
        taken = [self._each(self._admitted, o[0], o[2], o[0], o[1], *d) for o, d in zip(opened, decoded)
                 if d is not None]
        self._hand_over([item for item in taken if item is not None], by)

    def _take_rows(self, payload: bytes, carrier: str | None, by: str | None) -> None:
        """Each row of a container of rows under a shared header (testbed.mqtt.shared_header) that
        node ``by`` published, taken as its node's frame on its own uplink would be: every row's
        tag verified before any of it is parsed (a row that does not verify is dropped, counted as
        forged), the shared header checked once a row verified (a bad one refuses the container),
        then each row decoded, admitted and handed over as :meth:`_take_carried` does; WireError
        for the container."""
        self._check_container(carrier)
        container = shared_header.unpack(payload, max_bytes=self._max_message_bytes)
        rows = []
        for row in container.rows:
            if shared_header.verified(self._keys, container, row):
                rows.append(row)
            else:
                self._forged.reject(row.node, topics.UP, f"the row's tag for {row.node!r} does not verify")
        if not rows:
            return
        if self._auth_session and container.session != self._auth_session:
            raise wire.WireError("not_admitted", f"rows of session {container.session}, this client "
                                                 f"serves {self._auth_session}")
        shared = shared_header.parse_header(container, run=self.run)
        uplinks = [(topics.up(self.run, row.node), row) for row in rows]
        decoded = [(topic, self._each(shared_header.decode_row, topic, row.node, shared, row)) for topic, row in uplinks]
        taken = [self._each(self._admitted, topic, message.sender, topic, self._topic(topic)[0], b"", message)
                 for topic, message in decoded if message is not None]
        self._hand_over([item for item in taken if item is not None], by)

    def _check_container(self, carrier: str | None) -> None:
        """WireError unless a container may be taken here: not inside another, from authenticated nodes."""
        if carrier is not None:
            raise wire.WireError("bad_batch", "a container inside a container")
        if self._keys is None:
            raise wire.WireError("bad_batch", "carried uplinks are taken only from authenticated nodes "
                                              "(mqtt.authenticate)")

    def _hand_over(self, items: list[Inbound], by: str | None) -> None:
        """The messages a container brought, handed over together (one at a time without a
        ``deliver_all``)."""
        if self._deliver_all is None:
            for item in items:
                self._each(self._deliver, item.topic, item.node, item)
        elif items:  # what failed in it is dropped as one message's failed hand-over is
            self.rejected += self._each(self._deliver_all, topics.up(self.run, by or "?"), by or "?", items) or 0

    def _open_carried(self, topic: str, frame: bytes, by: str) -> tuple | None:
        """A carried frame's first step (:meth:`_take`'s up to its seal): (topic, its Topic, its
        sender, the opened seal), or None if it was forged."""
        t, sender = self._topic(topic)
        if t.kind == topics.UP and (carried.is_carried(frame) or shared_header.is_shared(frame)):
            self._check_container(by)  # refused: a container inside a container
        sealed = self._opened(topic, t, sender, frame)
        return None if sealed is None else (topic, t, sender, sealed)

    def _each(self, step: Callable[..., Any], topic: str, sender: str, *args: Any) -> Any:
        """``step(*args)`` for one frame from ``sender`` on ``topic``, refused as :meth:`_take`
        refuses it (counted and logged): its result, or None."""
        try:
            return step(*args)
        except (wire.WireError, topics.TopicError) as exc:
            self._reject(sender, topic, exc)
        except Exception:
            self.rejected += 1
            log.exception("%s: failed to handle message from %s on %r", self.client_id, sender, topic)
        return None

    def _reject(self, sender: str, topic: str, exc: Exception) -> None:
        self.rejected += 1
        log.warning("%s: rejected message from %s on %r: %s", self.client_id, sender, topic, exc)
