"""Carried uplinks: one MQTT message in which one node's connection carries the sealed uplink frames
of several nodes of its host (a round's replies), instead of one message per node.

Each carried frame is exactly what its node would have published on its own ``up/{node}`` topic:
sealed by that node with its own key for that topic (testbed.mqtt.auth), so the receiver opens
it as if it had come there (``Receiving._take``): a frame that does not verify for the node it
names is dropped before it is parsed, and the others are taken; the replay window, the session
fence and every check after them see each frame as its own. The container itself is framing only
(it proves nothing and moves no state): a receiver takes it only when it authenticates frames,
since the broker's ACL then no longer says who wrote each reply, and the seals do.

What it saves: a host of 50 nodes publishes one message a round instead of 50, and reads one
acknowledgement; the broker routes one; the coordinator's MQTT client reads one packet
(docs/performance.md, "ACFL over MQTT").

Layout (integers little-endian)::

    0   4 bytes   magic b"TBB1"
    4   uint16    count of frames (1..MAX_FRAMES)
    per frame:    uint8 L, the node id (L bytes), uint32 N, the sealed frame (N bytes)

Example::

    >>> payload = pack([("3", b"TBA1..."), ("4", b"TBA1...")])
    >>> is_carried(payload), unpack(payload, max_bytes=1 << 20)
    (True, [('3', b'TBA1...'), ('4', b'TBA1...')])
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Protocol

from testbed.mqtt import shared_header, topics, wire
from testbed.mqtt.wire import ID_PATTERN, WireError

MAGIC = b"TBB1"
MAX_FRAMES = 4096  # frames in one container: more than a host serves in a round, far fewer than a flood
_HEAD = struct.Struct("<4sH")
_LENGTH = struct.Struct("<I")


def is_carried(payload: bytes) -> bool:
    """Whether ``payload`` is a container of carried frames (else a frame of its own)."""
    return payload[:4] == MAGIC


def size(node: str, frame: bytes) -> int:
    """Bytes ``frame`` of ``node`` adds to a container."""
    return 1 + len(node) + _LENGTH.size + len(frame)


def pack(frames: Sequence[tuple[str, bytes]]) -> bytes:
    """The container of ``frames`` ((node id, its sealed frame), 1..MAX_FRAMES of them)."""
    if not 0 < len(frames) <= MAX_FRAMES:
        raise ValueError(f"a container carries 1 to {MAX_FRAMES} frames, not {len(frames)}")
    parts = [_HEAD.pack(MAGIC, len(frames))]
    for node, frame in frames:
        raw = node.encode()
        parts += [bytes((len(raw),)), raw, _LENGTH.pack(len(frame)), frame]
    return b"".join(parts)


def unpack(payload: bytes, *, max_bytes: int) -> list[tuple[str, bytes]]:
    """The (node id, frame) pairs of a container; WireError ``bad_batch`` (or ``oversized``) unless
    it is well formed: its count, every id a node id, every length within it, nothing after."""
    if len(payload) > max_bytes:
        raise WireError("oversized", f"a container of {len(payload)} bytes, limit {max_bytes}")
    if len(payload) < _HEAD.size:
        raise WireError("bad_batch", "a container shorter than its header")
    _, count = _HEAD.unpack_from(payload)
    if not 0 < count <= MAX_FRAMES:
        raise WireError("bad_batch", f"a container of {count} frames (1 to {MAX_FRAMES})")
    frames, at, end = [], _HEAD.size, len(payload)
    for _ in range(count):
        if at >= end:
            raise WireError("bad_batch", "a container cut short")
        length = payload[at]
        start = at + 1 + length + _LENGTH.size
        if start > end:
            raise WireError("bad_batch", "a container cut short")
        try:
            node = payload[at + 1:at + 1 + length].decode("ascii")
        except UnicodeDecodeError:
            node = ""
        if not ID_PATTERN.fullmatch(node):
            raise WireError("bad_batch", f"a carried frame of {payload[at + 1:at + 1 + length]!r:.80}, not a node id")
        (size_,) = _LENGTH.unpack_from(payload, start - _LENGTH.size)
        if start + size_ > end:
            raise WireError("bad_batch", "a container cut short")
        frames.append((node, payload[start:start + size_]))
        at = start + size_
    if at != end:
        raise WireError("bad_batch", f"{end - at} bytes after a container's last frame")
    return frames


class Carrier:
    """A host's uplinks of one wake-up, published together (:meth:`add`, then :meth:`flush`):

    - drafts (wire.Draft: a round's updates) that share a run, round, kind, session and tensor
      specs go as rows under one header (testbed.mqtt.shared_header), each tagged by its own
      node's client, in containers of at most ``max_bytes``;
    - everything else (a draft alone, one too large for a row, a payload of bytes) is sealed by its
      node's client and carried in containers of frames of at most ``max_bytes``;

    each container on the connection of its first node (whose ACL grants it that uplink), in the
    order they were added. A container of one frame is that frame, on its own node's uplink.
    Fire-and-forget, as a host's replies are."""

    def __init__(self, run: str, max_bytes: int):
        self.run = run
        self.max_bytes = max_bytes
        self._added: list[tuple[str, bytes | wire.Draft, _Publisher]] = []

    def add(self, client: _Publisher, node: str, payload: bytes | wire.Draft) -> None:
        """Node ``node``'s ``payload`` for its uplink, to be sealed or tagged by its ``client``."""
        self._added.append((node, payload, client))

    def __enter__(self) -> Carrier:
        return self

    def __exit__(self, *exc: object) -> None:
        """Out of a ``with``: :meth:`flush` (what was added is sent, an interruption or not)."""
        self.flush()

    def flush(self) -> None:
        """Publish what was added (and forget it)."""
        added, self._added = self._added, []
        # Groups in the order of their first item: the rows of each shared header (with each row's
        # size), and the frames (everything else) under the key None.
        groups: dict[tuple | None, list[tuple[str, bytes | wire.Draft, _Publisher, int]]] = {}
        overheads: dict[tuple, int] = {}  # a shared header's container's bytes besides its rows
        for node, payload, client in added:
            key = shared_header.shared_key(payload) if isinstance(payload, wire.Draft) else None
            size_ = 0
            if key is not None:
                if key not in overheads:
                    overheads[key] = shared_header.overhead(payload)  # type: ignore[arg-type]
                size_ = shared_header.row_size(payload)  # type: ignore[arg-type]
                if overheads[key] + size_ > self.max_bytes:
                    key = None  # too large for a row: sealed (and chunked) as a message of its own
            groups.setdefault(key, []).append((node, payload, client, size_))
        for key, items in groups.items():
            if key is not None and len(items) > 1:
                self._publish_rows(items, overheads[key])  # type: ignore[arg-type]
            else:
                self._publish_frames([(node, frame, client) for node, payload, client, _ in items
                                      for frame in client.sealed(topics.up(self.run, node), _bytes(payload))])

    def _publish_rows(self, items: list[tuple[str, wire.Draft, _Publisher, int]], overhead: int) -> None:
        clients = {node: client for node, _, client, _ in items}

        def tag(node: str, session: str, digest: bytes) -> bytes:
            return clients[node].row_tag(node, session, digest)

        group: list[wire.Draft] = []
        first = items[0]
        used = overhead
        for item in items:
            if group and (used + item[3] > self.max_bytes or len(group) == shared_header.MAX_ROWS):
                self._publish_container(first, shared_header.pack(group, tag))
                group, first, used = [], item, overhead
            group.append(item[1])
            used += item[3]
        self._publish_container(first, shared_header.pack(group, tag))

    def _publish_frames(self, frames: list[tuple[str, bytes, _Publisher]]) -> None:
        group: list[tuple[str, bytes, _Publisher]] = []
        used = _HEAD.size
        for item in frames:
            if group and (used + size(item[0], item[1]) > self.max_bytes or len(group) == MAX_FRAMES):
                self._publish_container(group[0], pack([(n, f) for n, f, _ in group]) if len(group) > 1 else group[0][1])
                group, used = [], _HEAD.size
            group.append(item)
            used += size(item[0], item[1])
        if group:
            self._publish_container(group[0], pack([(n, f) for n, f, _ in group]) if len(group) > 1 else group[0][1])

    def _publish_container(self, first: tuple, payload: bytes) -> None:
        """``payload`` on the uplink of the node ``first`` names (its first field), by its client (its third)."""
        node, client = first[0], first[2]
        client.publish_frames(topics.up(self.run, node), [payload])


def _bytes(payload: bytes | wire.Draft) -> bytes:
    return payload if isinstance(payload, bytes) else payload.encode()


class _Publisher(Protocol):
    """What :class:`Carrier` needs of an MQTT client (testbed.mqtt.client.MqttClient)."""

    def sealed(self, topic: str, payload: bytes) -> list[bytes]: ...

    def row_tag(self, node: str, session: str, digest: bytes) -> bytes: ...

    def publish_frames(self, topic: str, frames: Sequence[bytes]) -> None: ...
