"""Chunking of the MQTT transport: a payload larger than a broker's message limit travels as chunk
frames, reassembled in bounded memory on the receiving side.

A chunk is its own frame (`chunk` / `Reassembler`)::

    0   4 bytes   magic b"TBWC"
    4   16 bytes  chunk-set id (random; names the payload being chunked)
    20  uint32    index (0-based)
    24  uint32    count (>= 1)
    28  uint64    total payload length in bytes
    36  ...       this chunk's slice of the payload

A malformed or inconsistent frame raises `testbed.mqtt.wire.WireError` ("bad_chunk" / "oversized").

Example::

    >>> frames = chunk(bytes(100), 60)
    >>> r = Reassembler()
    >>> [r.add(f, source="n0") for f in frames][-1] == bytes(100)
    True
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import struct
import time
from collections.abc import Callable

from testbed.mqtt.wire import DEFAULT_MAX_BYTES, WireError

log = logging.getLogger(__name__)

CHUNK_MAGIC = b"TBWC"
_CHUNK = struct.Struct("<4s16sIIQ")  # magic, chunk-set id, index, count, total length
CHUNK_HEADER_BYTES = _CHUNK.size


def is_chunk(payload: bytes) -> bool:
    """True if `payload` is a chunk frame (starts with CHUNK_MAGIC) rather than a whole message."""
    return payload[:4] == CHUNK_MAGIC


def chunk(payload: bytes, max_chunk_bytes: int, *, chunk_set_id: bytes | None = None) -> list[bytes]:
    """Split `payload` into chunk frames of at most `max_chunk_bytes` bytes each (header included).

    Args:
        payload: any bytes (normally an encoded message).
        max_chunk_bytes: cap on each frame, > CHUNK_HEADER_BYTES (36).
        chunk_set_id: 16 bytes naming this payload's chunks; random by default.

    Returns:
        ceil(len / (max_chunk_bytes - 36)) frames (one frame for an empty payload).
    """
    room = max_chunk_bytes - CHUNK_HEADER_BYTES
    if room <= 0:
        raise ValueError(f"max_chunk_bytes must exceed the {CHUNK_HEADER_BYTES}-byte chunk header")
    cid = chunk_set_id if chunk_set_id is not None else os.urandom(16)
    if len(cid) != 16:
        raise ValueError("chunk_set_id must be 16 bytes")
    total = len(payload)
    count = max(1, -(-total // room))
    view = memoryview(payload)
    return [_CHUNK.pack(CHUNK_MAGIC, cid, i, count, total) + view[i * room:(i + 1) * room]
            for i in range(count)]


@dataclasses.dataclass
class _Partial:
    count: int
    total: int
    started: float
    parts: dict[int, memoryview]
    received: int = 0


class Reassembler:
    """Collects chunk frames (any order, duplicates ignored) and returns each payload once complete.

    Memory is bounded: at most `max_pending` incomplete payloads of at most `max_message_bytes` each
    (the oldest is evicted to make room), each with at most `max_chunks` chunks, and an incomplete
    payload is evicted `timeout_s` seconds after its first chunk. Chunk sets are keyed by
    (source, chunk-set id), where the source is the transport's name for the sender (the topic), so
    one sender cannot inject chunks into another's payload; and one source holds at most
    `max_pending_per_source` incomplete payloads (its own oldest is evicted to make room), so a
    sender that floods incomplete chunk sets evicts only its own, never another sender's.
    """

    def __init__(self, *, max_message_bytes: int = DEFAULT_MAX_BYTES, max_pending: int = 64,
                 max_pending_per_source: int = 4, max_chunks: int = 65536, timeout_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic):
        self._max_bytes = max_message_bytes
        self._max_pending = max_pending
        self._per_source = max_pending_per_source
        self._max_chunks = max_chunks
        self._timeout_s = timeout_s
        self._clock = clock
        self._pending: collections.OrderedDict[tuple[str, bytes], _Partial] = collections.OrderedDict()
        # Recently completed sets, so a late duplicate chunk (QoS 1 redelivery) does not open a new
        # partial that would linger until its timeout.
        self._done: collections.OrderedDict[tuple[str, bytes], None] = collections.OrderedDict()
        self.evicted = 0  # incomplete payloads dropped (timeout or room), for diagnostics

    def add(self, frame: bytes, source: str = "") -> bytes | None:
        """Add one chunk frame from `source`.

        Returns:
            The whole payload when this frame completes it, else None (also for duplicates).

        Raises:
            WireError("bad_chunk" / "oversized"): malformed frame, or inconsistent with earlier
                frames of the same set; the set is then dropped.
        """
        now = self._clock()
        self._expire(now)
        if len(frame) < CHUNK_HEADER_BYTES:
            raise WireError("bad_chunk", f"chunk is {len(frame)} bytes, shorter than its header")
        magic, cid, index, count, total = _CHUNK.unpack_from(frame)
        if magic != CHUNK_MAGIC:
            raise WireError("bad_chunk", f"chunk starts with {magic!r}, expected {CHUNK_MAGIC!r}")
        key = (source, cid)
        if key in self._done:
            return None
        if total > self._max_bytes:
            raise WireError("oversized", f"chunked payload is {total} bytes, limit {self._max_bytes}")
        if not 0 < count <= self._max_chunks or index >= count:
            raise WireError("bad_chunk", f"chunk index {index} of count {count} (max {self._max_chunks})")
        part = self._pending.get(key)
        if part is None:
            own = [k for k in self._pending if k[0] == source]
            for old_key in own[:max(0, len(own) - self._per_source + 1)]:  # oldest first
                del self._pending[old_key]
                self._evict(old_key, f"over {self._per_source} incomplete payloads from one source")
            part = self._pending[key] = _Partial(count, total, now, {})
            while len(self._pending) > self._max_pending:
                old_key, _ = self._pending.popitem(last=False)
                self._evict(old_key, "too many incomplete payloads")
        elif (part.count, part.total) != (count, total):
            del self._pending[key]
            raise WireError("bad_chunk", f"chunk says count={count} total={total}, earlier chunks said "
                                         f"count={part.count} total={part.total}")
        if index in part.parts:
            return None
        data = memoryview(frame)[CHUNK_HEADER_BYTES:]  # no copy until the final join
        part.received += len(data)
        if part.received > total:
            del self._pending[key]
            raise WireError("bad_chunk", f"chunks carry more than the announced {total} bytes")
        part.parts[index] = data
        if len(part.parts) < count:
            return None
        del self._pending[key]
        if part.received != total:
            raise WireError("bad_chunk", f"chunks carry {part.received} bytes, announced {total}")
        self._done[key] = None
        if len(self._done) > 1024:
            self._done.popitem(last=False)
        return b"".join(part.parts[i] for i in range(count))

    def _expire(self, now: float) -> None:
        # Insertion order is start order, so expired sets are at the front.
        while self._pending:
            key, part = next(iter(self._pending.items()))
            if now - part.started < self._timeout_s:
                break
            del self._pending[key]
            self._evict(key, f"incomplete after {self._timeout_s:g} s")

    def _evict(self, key: tuple[str, bytes], why: str) -> None:
        self.evicted += 1
        log.warning("dropped chunked payload %s from %s: %s", key[1].hex(), key[0] or "?", why)

    @property
    def pending(self) -> int:
        """Number of incomplete payloads held."""
        return len(self._pending)
