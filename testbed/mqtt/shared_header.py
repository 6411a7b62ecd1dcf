"""Uplinks under a shared header: one MQTT message in which one node's connection carries several
nodes' messages of one run, round, kind and session with the same tensor specs (a round's updates
of a host) as rows under one header, instead of a whole sealed message each.

What it saves over carried frames (testbed.mqtt.carried): a host writes and seals, and the
coordinator opens and checks, the header's shared fields once per container rather than once per
node; the coordinator opens and decodes a row in about 70 % of a sealed message's time
(docs/performance.md, "ACFL over MQTT").

What each row proves is what a sealed frame on the node's own uplink proves: its tag is its node's,
with that node's session key (testbed.mqtt.auth), over the shared header (session included) and
the row. A row whose tag does not verify is dropped before any of it is parsed, and the others
are taken; the shared header is parsed once a row verified. The container's framing proves nothing
and moves no state: a receiver takes it only when it authenticates frames. A row decodes to exactly
the message (:class:`testbed.mqtt.wire.Message`) its node's :func:`wire.encode` of the same
:class:`wire.Draft` decodes to, but its ``size_bytes`` (the row's). Layout (integers little-endian,
offsets from the container's start)::

    0   4 bytes   magic b"TBR1"
    4   uint8     S, the session's length (1..64)
    5   S bytes   the session (ASCII, an id): every row's meta["session"], whose keys tag the rows
    ..  uint32    H, the shared header's length
    ..  H bytes   shared header: UTF-8 JSON {"v", "run", "round", "kind", "tensors"}, as in a wire
                  message's header
    ..  uint16    count of rows (1..MAX_ROWS)
    per row:      uint8 L, the node id (L bytes), uint32 N, the row's body (N bytes), its tag (16 bytes)
    a body:       the message id (16 bytes: its 32 hex digits' value), uint32 M, the meta's JSON
                  (M bytes), zero padding to a multiple of 8, then each tensor's bytes (little-endian,
                  C order) and zero padding to a multiple of 8: tensors lie 8-byte aligned

    shared = the bytes from offset 4 to the shared header's end (its session and header)
    digest = SHA-256("tb-rows-v1" | 0 | SHA-256(shared) | body)
    tag    = HMAC-SHA256(session key of the row's node, digest)[:16]

The key names the node (each node's session key is its own: testbed.mqtt.auth), so a row is
bound to its node without its topic in the digest; the domain keeps a row's digest apart from a
sealed frame's.

Example::

    >>> import functools
    >>> import numpy as np
    >>> from testbed.mqtt import auth
    >>> keys = auth.Keys("r1", {"3": bytes(32), "4": bytes([1]) * 32})
    >>> drafts = [wire.draft({"run": "r1", "round": 2, "sender": n, "kind": "update",
    ...                       "meta": {"session": "s1"}}, {"g": np.ones(2)}) for n in ("3", "4")]
    >>> payload = pack(drafts, functools.partial(auth.tag, keys))
    >>> container = unpack(payload, max_bytes=1 << 20)
    >>> [verified(keys, container, row) for row in container.rows]
    [True, True]
    >>> shared = parse_header(container, run="r1")
    >>> [(m.sender, m.round, m.tensors["g"].tolist()) for m in (decode_row(shared, r) for r in container.rows)]
    [('3', 2, [1.0, 1.0]), ('4', 2, [1.0, 1.0])]
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np

from testbed.mqtt import auth, wire
from testbed.util.frozen import frozen

MAGIC = b"TBR1"
MAX_ROWS = 4096  # rows in one container: more than a host serves in a round, far fewer than a flood
_SESSION_LENGTH = struct.Struct("<4sB")
_LENGTH = struct.Struct("<I")
_COUNT = struct.Struct("<H")
_ID_BYTES = 16
_DOMAIN = b"tb-rows-v1\x00"
_SHARED_KEYS = frozenset({"v", "run", "round", "kind", "tensors"})


def is_shared(payload: bytes) -> bool:
    """Whether ``payload`` is a container of rows under a shared header."""
    return payload[:4] == MAGIC


def shared_key(draft: wire.Draft) -> tuple | None:
    """What rows of one container have in common (drafts with equal keys may share a header), or
    None for a draft no row can carry (its meta names no session)."""
    session = draft.meta.get("session")
    if not isinstance(session, str) or not wire.ID_PATTERN.fullmatch(session):
        return None
    f = draft.fields
    return f["v"], f["run"], f["round"], f["kind"], session, draft.layout


def _shared(draft: wire.Draft) -> bytes:
    """A container's bytes from its session to its shared header's end."""
    f = draft.fields
    session = draft.meta["session"].encode()
    header = wire.header_json({"v": f["v"], "run": f["run"], "round": f["round"], "kind": f["kind"],
                               "tensors": f["tensors"]})
    return b"".join((bytes((len(session),)), session, _LENGTH.pack(len(header)), header))


def overhead(draft: wire.Draft) -> int:
    """Bytes of a container of ``draft``'s rows besides its rows."""
    return len(MAGIC) + len(_shared(draft)) + _COUNT.size


def row_size(draft: wire.Draft) -> int:
    """Bytes ``draft``'s row adds to a container, at most (its padding is at most 7 bytes a part)."""
    return (1 + len(draft.fields["sender"]) + _LENGTH.size + _ID_BYTES + _LENGTH.size + len(draft.meta_json) + 7
            + sum(len(p) + 7 for p in draft.parts) + auth.TAG_BYTES)


def _digest(shared_digest: bytes, body: bytes | memoryview) -> bytes:
    h = hashlib.sha256(_DOMAIN + shared_digest)
    h.update(body)
    return h.digest()


def pack(drafts: Sequence[wire.Draft], tag: Callable[[str, str, bytes], bytes]) -> bytes:
    """The container of ``drafts`` (1..MAX_ROWS, of equal :func:`shared_key`), each row tagged by
    ``tag(node, session, digest)`` (its sender's key: auth.tag, MqttClient.row_tag)."""
    if not 0 < len(drafts) <= MAX_ROWS:
        raise ValueError(f"a container carries 1 to {MAX_ROWS} rows, not {len(drafts)}")
    key = shared_key(drafts[0])
    if key is None or any(shared_key(d) != key for d in drafts):
        raise ValueError("rows of one container share their run, round, kind, session and tensor specs")
    shared = _shared(drafts[0])
    shared_digest = hashlib.sha256(shared).digest()
    session = drafts[0].meta["session"]
    parts: list[bytes] = [MAGIC, shared, _COUNT.pack(len(drafts))]
    at = len(MAGIC) + len(shared) + _COUNT.size
    for d in drafts:
        node = d.fields["sender"]
        raw = node.encode()
        start = at + 1 + len(raw) + _LENGTH.size  # the body's offset in the container
        meta_end = start + _ID_BYTES + _LENGTH.size + len(d.meta_json)
        body = [bytes.fromhex(d.fields["id"]), _LENGTH.pack(len(d.meta_json)), d.meta_json, bytes(-meta_end % 8)]
        for p in d.parts:
            body += [p, bytes(-len(p) % 8)]
        joined = b"".join(body)
        parts += [bytes((len(raw),)), raw, _LENGTH.pack(len(joined)), joined,
                  tag(node, session, _digest(shared_digest, joined))]
        at = start + len(joined) + auth.TAG_BYTES
    return b"".join(parts)


class Row(NamedTuple):
    """One row of a container, as framed (nothing of it verified or parsed)."""

    node: str
    start: int  # where its body starts in the container
    body: memoryview
    tag: bytes


class Container(NamedTuple):
    """A container as framed: its session, its shared header (bytes, not parsed), the SHA-256 of
    its shared part, its rows, and its bytes (the tensors are views into them)."""

    session: str
    header: bytes
    shared_digest: bytes
    rows: list[Row]
    payload: bytes


def unpack(payload: bytes, *, max_bytes: int) -> Container:
    """A container as framed; WireError ``bad_batch`` (or ``oversized``) unless it is well framed: a
    session id, its lengths within it, every row's id a node id, nothing after. Neither the header
    nor a row is parsed."""
    if len(payload) > max_bytes:
        raise wire.WireError("oversized", f"a container of {len(payload)} bytes, limit {max_bytes}")
    end = len(payload)
    if end < _SESSION_LENGTH.size:
        raise wire.WireError("bad_batch", "a container shorter than its header")
    _, s = _SESSION_LENGTH.unpack_from(payload)
    at = _SESSION_LENGTH.size + s
    try:
        session = payload[_SESSION_LENGTH.size:at].decode("ascii")
    except UnicodeDecodeError:
        session = ""
    if at + _LENGTH.size > end or not wire.ID_PATTERN.fullmatch(session):
        raise wire.WireError("bad_batch", "a container's session is cut short or not an id")
    (h,) = _LENGTH.unpack_from(payload, at)
    header_at = at + _LENGTH.size
    at = header_at + h
    if h > wire.MAX_HEADER_BYTES or at + _COUNT.size > end:
        raise wire.WireError("bad_batch", "a container's shared header is cut short or too long")
    shared_digest = hashlib.sha256(memoryview(payload)[len(MAGIC):at]).digest()
    (count,) = _COUNT.unpack_from(payload, at)
    if not 0 < count <= MAX_ROWS:
        raise wire.WireError("bad_batch", f"a container of {count} rows (1 to {MAX_ROWS})")
    at += _COUNT.size
    view = memoryview(payload)
    rows = []
    for _ in range(count):
        if at >= end:
            raise wire.WireError("bad_batch", "a container cut short")
        n = payload[at]
        start = at + 1 + n + _LENGTH.size
        if start > end:
            raise wire.WireError("bad_batch", "a container cut short")
        try:
            node = payload[at + 1:at + 1 + n].decode("ascii")
        except UnicodeDecodeError:
            node = ""
        if not wire.ID_PATTERN.fullmatch(node):
            raise wire.WireError("bad_batch", f"a row of {payload[at + 1:at + 1 + n]!r:.80}, not a node id")
        (size,) = _LENGTH.unpack_from(payload, start - _LENGTH.size)
        stop = start + size
        if stop + auth.TAG_BYTES > end:
            raise wire.WireError("bad_batch", "a container cut short")
        rows.append(Row(node, start, view[start:stop], payload[stop:stop + auth.TAG_BYTES]))
        at = stop + auth.TAG_BYTES
    if at != end:
        raise wire.WireError("bad_batch", f"{end - at} bytes after a container's last row")
    return Container(session, payload[header_at:header_at + h], shared_digest, rows, payload)


def verified(keys: auth.Keys, container: Container, row: Row) -> bool:
    """Whether ``row``'s tag verifies with its node's key of ``keys`` for the container's session
    (False if that key is not held)."""
    if not keys.holds(row.node):
        return False
    digest = _digest(container.shared_digest, row.body)
    return hmac.compare_digest(row.tag, auth.tag(keys, row.node, container.session, digest))


class Shared(NamedTuple):
    """A container's shared header, checked: its fields, and its tensors (name, little-endian
    dtype, element count, shape) in a row's order."""

    v: int
    run: str
    round: int
    kind: str
    session: str
    tensors: list[tuple[str, np.dtype, int, tuple[int, ...]]]
    payload: bytes


def parse_header(container: Container, *, run: str,
                 allowed_dtypes: Iterable[str | np.dtype | type] = wire.DEFAULT_ALLOWED_DTYPES) -> Shared:
    """A container's shared header checked as a wire message's header is, of run ``run``: WireError else."""
    try:
        h = wire.parse_header(container.header)
    except (ValueError, UnicodeDecodeError) as exc:
        raise wire.WireError("bad_json", f"shared header is not valid JSON: {exc}") from None
    if not isinstance(h, dict) or h.keys() != _SHARED_KEYS:
        raise wire.WireError("bad_header", f"a shared header has exactly the keys {sorted(_SHARED_KEYS)}")
    if type(h["v"]) is not int or h["v"] not in wire.SUPPORTED_SCHEMAS:
        raise wire.WireError("schema", f"schema version {h['v']!r} not supported")
    wire.check_id(h["run"], "run")
    wire.check_id(h["kind"], "kind")
    rnd = h["round"]
    if type(rnd) is not int or rnd < 0:
        raise wire.WireError("bad_header", f"round must be an int >= 0, got {rnd!r}")
    wire.expect(h["run"], rnd, "", run=run, round=None, sender=None)
    layout = wire.tensor_layout(h["tensors"], wire.dtype_names(allowed_dtypes))
    return Shared(h["v"], h["run"], rnd, h["kind"], container.session, layout, container.payload)


def decode_row(shared: Shared, row: Row) -> wire.Message:
    """A verified row's message under its checked shared header: WireError unless its meta is a
    JSON object naming the container's session and its tensors fill its body exactly, finite."""
    body, at = row.body, row.start
    if len(body) < _ID_BYTES + _LENGTH.size:
        raise wire.WireError("truncated", "a row shorter than its message id and meta length")
    (m,) = _LENGTH.unpack_from(body, _ID_BYTES)
    meta_at = _ID_BYTES + _LENGTH.size
    if meta_at + m > len(body):
        raise wire.WireError("truncated", "a row's meta runs past its end")
    try:
        meta = wire.parse_header(body[meta_at:meta_at + m])
    except (ValueError, UnicodeDecodeError) as exc:
        raise wire.WireError("bad_json", f"a row's meta is not valid JSON: {exc}") from None
    if not isinstance(meta, dict):
        raise wire.WireError("bad_header", "meta must be a JSON object")
    if meta.get("session") != shared.session:
        raise wire.WireError("bad_header", "a row's meta names another session than its container")
    offset = at + meta_at + m
    offset += -offset % 8
    end = at + len(body)
    tensors: dict[str, Any] = {}
    for name, dtype, count, shape in shared.tensors:
        nbytes = count * dtype.itemsize
        if offset + nbytes > end:
            raise wire.WireError("size_mismatch", f"tensor {name!r} ends past its row")
        arr = np.frombuffer(shared.payload, dtype=dtype, count=count, offset=offset).reshape(shape)
        wire.check_finite(name, arr)
        tensors[name] = arr
        offset += nbytes + (-nbytes % 8)
    if offset != end:
        raise wire.WireError("size_mismatch", f"a row of {len(body)} bytes, its header describes {offset - at}")
    return frozen(wire.Message, {"schema": shared.v, "run": shared.run, "round": shared.round, "sender": row.node,
                                 "kind": shared.kind, "msg_id": bytes(body[:_ID_BYTES]).hex(), "meta": meta,
                                 "tensors": tensors, "size_bytes": len(body) + auth.TAG_BYTES})
