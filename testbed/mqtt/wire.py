"""The wire format: one message = a small JSON header plus the raw bytes of named numpy tensors.

Pure codec, no MQTT and no I/O, so it runs unchanged on a board. Layout of one message (all integers
little-endian; offsets in bytes from the start of the payload)::

    0   4 bytes   magic b"TBWM"
    4   uint32    header length H
    8   H bytes   header, UTF-8 JSON (see `encode` for the keys)
    ..  zero padding to the next multiple of 8
    ..  tensor 0: its bytes, little-endian, C order; zero padding to the next multiple of 8
    ..  tensor 1 ...                                  (same order as header["tensors"])

Tensor offsets are implied by the header (each starts 8-byte aligned), so `decode` can hand out
zero-copy, aligned, read-only `np.frombuffer` views into the payload. The payload must end exactly
after the last tensor's padding.

Every validation failure raises `WireError` with a short machine-readable `code` and a readable
reason; receivers log and drop the message, they never crash on it. Chunking of large payloads and the
replay guard belong to the MQTT transport (testbed.mqtt.chunks, testbed.mqtt.replay).
docs/wire-protocol.md is the normative description.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import os
import re
import struct
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from testbed.util.frozen import frozen

try:  # the JSON codec of the MQTT extras: a header in 3 µs where the standard library takes 15
    import orjson
except ImportError:  # a core install (sim) or a board without its wheel: the standard library's
    orjson = None

#: Header schema version written by `encode`; `decode` accepts only versions in SUPPORTED_SCHEMAS.
SCHEMA_VERSION = 1
SUPPORTED_SCHEMAS = frozenset({1})

MESSAGE_MAGIC = b"TBWM"

#: Default cap on a whole message (header and tensors), in bytes: 64 MiB, i.e. 8e6 float64 values.
DEFAULT_MAX_BYTES = 64 * 2**20
#: Cap on the JSON header, in bytes; a header is a few hundred bytes, this only bounds parsing work.
MAX_HEADER_BYTES = 64 * 2**10
MAX_TENSORS = 1024
MAX_NDIM = 32

#: Dtypes a receiver accepts unless told otherwise. Complex types carry OTA transmit signals.
DEFAULT_ALLOWED_DTYPES: tuple[str, ...] = (
    "float16", "float32", "float64", "complex64", "complex128",
    "int8", "int16", "int32", "int64", "uint8",
)

_DEFAULT_DTYPE_NAMES = frozenset(np.dtype(d).name for d in DEFAULT_ALLOWED_DTYPES)

#: Run, node and kind ids: safe in MQTT topics, ACL files and file names (no '/', '+', '#', spaces).
ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")

_ALIGN = 8
_PREFIX = struct.Struct("<4sI")  # magic, header length
_MSG_ID = re.compile(r"[0-9a-f]{32}")
_HEADER_KEYS = frozenset({"v", "run", "round", "sender", "kind", "id", "tensors", "meta"})
_ENCODE_KEYS = frozenset({"run", "round", "sender", "kind", "msg_id", "meta"})
_SPEC_KEYS = frozenset({"name", "dtype", "shape"})


class WireError(ValueError):
    """A payload that fails validation.

    Attributes:
        code: short stable name of the failure, one of: oversized, truncated, bad_magic, bad_json,
            bad_header, schema, wrong_run, wrong_round, wrong_sender, dtype, size_mismatch,
            non_finite, replay, bad_chunk, bad_status (a status payload other than online/offline),
            not_admitted (refused by the receiver's own declaration: another session, a round it
            has not opened), forged (a frame whose seal does not verify: testbed.mqtt.auth).
        reason: human-readable detail.
    """

    def __init__(self, code: str, reason: str):
        self.code = code
        self.reason = reason
        super().__init__(f"{code}: {reason}")


@dataclasses.dataclass(frozen=True, eq=False)
class Message:
    """One decoded message.

    Attributes:
        schema: header schema version.
        run: run id.
        round: round index (>= 0).
        sender: id of the node (or coordinator) that wrote it.
        kind: what the message is ("update", "model", ...), an id chosen by the algorithm layer.
        msg_id: 32 hex characters, unique per message; duplicates are replays.
        meta: free-form JSON object.
        tensors: name -> array, in header order. Arrays decoded from a payload are read-only views
            into it (copy before modifying).
        size_bytes: length of the encoded payload in bytes (for the ledger's byte counts).
    """

    schema: int
    run: str
    round: int
    sender: str
    kind: str
    msg_id: str
    meta: dict[str, Any]
    tensors: dict[str, np.ndarray]
    size_bytes: int


# Message ids drawn ahead, _IDS_PER_DRAW at a time: os.urandom releases the GIL around its system
# call, and on an emulated host (a reply per node and round) the network thread takes the GIL at
# each one; a reply's id took 10-12 µs of the host's round in place of 0.5 (ACFL over MQTT, 100
# nodes on 2 hosts). A child of fork() must not hand out the ids its parent will: it drops them.
_IDS_PER_DRAW = 256
_drawn_ids: list[str] = []
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_drawn_ids.clear)


def new_msg_id() -> str:
    """A fresh random message id: 32 lowercase hex characters (128 random bits from os.urandom)."""
    try:
        return _drawn_ids.pop()  # atomic: two threads never get the same id
    except IndexError:
        text = os.urandom(16 * _IDS_PER_DRAW).hex()
        _drawn_ids.extend(text[i:i + 32] for i in range(32, len(text), 32))
        return text[:32]


def check_id(value: object, what: str) -> str:
    """Return `value` if it is a valid run/node/kind id (see ID_PATTERN), else raise WireError."""
    if type(value) is str and value in _VALID_IDS:  # every message names a run, sender and kind seen before
        return value
    if not isinstance(value, str) or not ID_PATTERN.fullmatch(value):
        raise WireError("bad_header", f"{what} must match {ID_PATTERN.pattern}, got {value!r}")
    if len(_VALID_IDS) < _VALID_IDS_KEPT:
        _VALID_IDS.add(value)
    return value


#: Ids that matched ID_PATTERN, up to _VALID_IDS_KEPT of them (a run's nodes, kinds and run ids).
_VALID_IDS: set[str] = set()
_VALID_IDS_KEPT = 1 << 16


def _pad(n: int) -> int:
    return -n % _ALIGN


def dtype_names(allowed: Iterable[str | np.dtype | type]) -> frozenset[str]:
    if allowed is DEFAULT_ALLOWED_DTYPES:  # every message but a few tests': named once
        return _DEFAULT_DTYPE_NAMES
    return frozenset(np.dtype(d).name for d in allowed)


@functools.lru_cache(maxsize=64)
def _little_endian(name: str) -> np.dtype:
    """The little-endian dtype of an allowed dtype name (parsed once per name)."""
    return np.dtype(name).newbyteorder("<")


@functools.lru_cache(maxsize=64)
def _name_of(dtype: np.dtype) -> str:
    """``dtype.name`` (numpy works it out in Python at each call: 5 µs a tensor)."""
    return dtype.name


def check_finite(name: str, arr: np.ndarray) -> None:
    if arr.dtype.kind not in "fc" or not arr.size:
        return
    # A finite sum of squares has no NaN or infinity among its values (a NaN makes it NaN, an
    # infinity infinite; squares never cancel): one dot product (BLAS, no floating-point warnings)
    # where isfinite and all take two calls. One that is not finite (one of them, or large values
    # whose squares overflow) is decided by the values themselves.
    if arr.dtype in _DOT_DTYPES and math.isfinite(abs(np.vdot(arr, arr))):
        return
    if not np.isfinite(arr).all():
        raise WireError("non_finite", f"tensor {name!r} has NaN or infinite values")


#: Whether an array of a dtype of this byte order holds its values little-endian as they are
#: ("=": native, "|": one byte).
_LITTLE_ENDIAN = {"<": True, ">": False, "|": True, "=": sys.byteorder == "little"}

_DOT_DTYPES = frozenset(np.dtype(name) for name in ("float32", "float64", "complex64", "complex128"))


def encode(header: Mapping[str, Any], tensors: Mapping[str, np.ndarray] | None = None, *,
           allowed_dtypes: Iterable[str | np.dtype | type] = DEFAULT_ALLOWED_DTYPES) -> bytes:
    """Encode one message: ``draft(header, tensors).encode()``.

    Args:
        header: keys `run` (id), `round` (int >= 0), `sender` (id), `kind` (id), and optionally
            `meta` (JSON-serialisable dict, default {}) and `msg_id` (32 hex chars, default fresh).
        tensors: name -> array of any shape; any byte order or memory layout (converted to
            little-endian C order). Names are non-empty strings, at most 128 characters.
        allowed_dtypes: dtypes the sender may use (same default as `decode`).

    Returns:
        The payload bytes (layout in the module docstring); size is about 8 bytes per float64
        value plus a few hundred bytes of header.

    Raises:
        WireError: unknown or invalid header field, disallowed dtype, or non-finite values (caught
            at the sender, where the bug is).
    """
    return draft(header, tensors, allowed_dtypes=allowed_dtypes).encode()


@dataclasses.dataclass(frozen=True, eq=False)
class Draft:
    """One message checked and fixed but not yet laid out: what :func:`encode` writes, kept apart
    so that a sender may also send it another way (testbed.mqtt.shared_header: a row of a
    container whose header several messages share). Its :meth:`encode` is the same bytes every
    time (its message id is fixed), so a message sent again is the same message.

    Attributes:
        fields: the header but its meta (``v``, ``run``, ``round``, ``sender``, ``kind``, ``id``,
            ``tensors``: the specs), checked.
        meta: the header's meta, and ``meta_json`` its JSON text (what the header carries).
        parts: each tensor's bytes, little-endian, C order, in the specs' order (copies: what the
            arrays hold later changes nothing).
        layout: the specs as (name, dtype name, shape) tuples: equal for drafts of equal specs.
    """

    fields: dict[str, Any]
    meta: dict[str, Any]
    meta_json: bytes
    parts: tuple[bytes, ...]
    layout: tuple[tuple[str, str, tuple[int, ...]], ...]

    def encode(self) -> bytes:
        """The message's bytes (layout in the module docstring)."""
        # The header is the fields' compact JSON with the meta's text as its last member: the
        # same text either codec writes for the whole header, without writing the meta again.
        head = b"".join((header_json(self.fields)[:-1], b',"meta":', self.meta_json, b"}"))
        chunks: list[bytes] = [_PREFIX.pack(MESSAGE_MAGIC, len(head)), head, bytes(_pad(_PREFIX.size + len(head)))]
        for part in self.parts:
            chunks += [part, bytes(_pad(len(part)))]
        return b"".join(chunks)


def draft(header: Mapping[str, Any], tensors: Mapping[str, np.ndarray] | None = None, *,
          allowed_dtypes: Iterable[str | np.dtype | type] = DEFAULT_ALLOWED_DTYPES) -> Draft:
    """One message checked as :func:`encode` checks it (same arguments, same WireErrors), not laid out."""
    if not header.keys() <= _ENCODE_KEYS:
        raise WireError("bad_header", f"unknown header fields {sorted(header.keys() - _ENCODE_KEYS)}")
    tensors = tensors or {}
    if len(tensors) > MAX_TENSORS:
        raise WireError("bad_header", f"{len(tensors)} tensors, at most {MAX_TENSORS}")
    allowed = dtype_names(allowed_dtypes)
    specs, parts, layout = [], [], []
    for name, value in tensors.items():
        if not isinstance(name, str) or not 0 < len(name) <= 128:
            raise WireError("bad_header", f"tensor name must be a str of 1..128 chars, got {name!r}")
        arr = np.asarray(value)
        if arr.ndim > MAX_NDIM:
            raise WireError("bad_header", f"tensor {name!r} has {arr.ndim} dimensions, at most {MAX_NDIM}")
        dtype_name = _name_of(arr.dtype)
        if dtype_name not in allowed:
            raise WireError("dtype", f"tensor {name!r} has dtype {dtype_name}, allowed {sorted(allowed)}")
        check_finite(name, arr)
        specs.append({"name": name, "dtype": dtype_name, "shape": list(arr.shape)})
        layout.append((name, dtype_name, arr.shape))
        # One copy: little-endian, C order (tobytes writes C order whatever the layout).
        parts.append((arr if _LITTLE_ENDIAN.get(arr.dtype.byteorder) else arr.astype(_little_endian(dtype_name))).tobytes())
    fields = {
        "v": SCHEMA_VERSION,
        "run": header.get("run"),
        "round": header.get("round"),
        "sender": header.get("sender"),
        "kind": header.get("kind"),
        "id": header.get("msg_id") or new_msg_id(),
        "tensors": specs,
        "meta": dict(header.get("meta") or {}),
    }
    _check_envelope(fields)  # the tensor specs were built above from arrays: valid as they are
    meta = fields.pop("meta")
    return _drafted(fields, meta, tuple(parts), tuple(layout))


def _drafted(fields: dict[str, Any], meta: dict[str, Any], parts: tuple[bytes, ...],
             layout: tuple[tuple[str, str, tuple[int, ...]], ...]) -> Draft:
    """The draft of checked ``fields`` (its meta apart) and ``meta``, once the meta is JSON."""
    try:
        meta_json = header_json(meta)
    except (TypeError, ValueError) as exc:
        raise WireError("bad_header", f"header is not JSON-serialisable: {exc}") from None
    return frozen(Draft, {"fields": fields, "meta": meta, "meta_json": meta_json, "parts": parts, "layout": layout})


def drafts(header: Mapping[str, Any], rows: Sequence[tuple[str, Mapping[str, Any]]],
           tensors: Mapping[str, np.ndarray], *,
           allowed_dtypes: Iterable[str | np.dtype | type] = DEFAULT_ALLOWED_DTYPES) -> list[Draft | WireError]:
    """:func:`draft` of one message per row of ``rows`` ((sender, meta)), each with ``header``'s run,
    round and kind and its row of every stacked tensor (``tensors[name][i]`` is row ``i``'s): the
    messages of several senders alike but for their sender, meta and values (a host's replies to
    one round). What they share (the header, the tensors' names, dtypes and shapes) is checked on
    the first row that drafts, a row's own (its values' finiteness, its sender, its meta) on each;
    a row that fails is its WireError, the others are drafted. Each draft is the one :func:`draft`
    makes of its row (same checks, same errors, same bytes but its fresh message id), at a third
    of the cost a row: one finiteness check over the stack, one copy to little-endian.

    Example::

        >>> out = drafts({"run": "r", "round": 1, "kind": "update"},
        ...              [("3", {"session": "s"}), ("4", {"session": "s"})], {"g": np.ones((2, 3))})
        >>> [(d.fields["sender"], d.parts[0] == np.ones(3).tobytes()) for d in out]
        [('3', True), ('4', True)]
    """
    if "msg_id" in header or "sender" in header or "meta" in header:
        raise ValueError("drafts: each row has its own sender, meta and message id; the header has none of them")
    stacked = {name: np.asarray(value) for name, value in tensors.items()}
    out: list[Draft | WireError | None] = [None] * len(rows)
    shared: Draft | None = None  # the first row drafted as draft() does: every shared check passed
    for i, (sender, meta) in enumerate(rows):
        try:
            shared = draft({**header, "sender": sender, "meta": meta}, {n: a[i] for n, a in stacked.items()},
                           allowed_dtypes=allowed_dtypes)
        except WireError as exc:
            out[i] = exc
            continue
        out[i] = shared
        break
    if shared is None:
        return out  # type: ignore[return-value]  # every row refused
    # Each array as little-endian once (draft copies each row so); its finiteness at once: a stack
    # whose values are all finite has only finite rows, else each row is looked at.
    little = {name: a if _LITTLE_ENDIAN.get(a.dtype.byteorder) else a.astype(_little_endian(_name_of(a.dtype)))
              for name, a in stacked.items()}
    finite = {name: _all_finite(a) for name, a in stacked.items()}
    for i in range(i + 1, len(rows)):
        sender, meta = rows[i]
        try:
            for name, a in stacked.items():
                if not finite[name]:
                    check_finite(name, a[i])
            fields = {**shared.fields, "sender": sender, "id": new_msg_id()}
            check_id(sender, "sender")
            out[i] = _drafted(fields, dict(meta or {}), tuple(a[i].tobytes() for a in little.values()), shared.layout)
        except WireError as exc:
            out[i] = exc
    return out  # type: ignore[return-value]


def _all_finite(arr: np.ndarray) -> bool:
    """Whether every value of ``arr`` is finite (what :func:`check_finite` checks, at once)."""
    try:
        check_finite("", arr)
    except WireError:
        return False
    return True


#: orjson writes only what the standard library's encoder does (no dataclass, datetime, or subclass
#: of str, int, dict or list of its own; those take the standard library's path and its errors).
_ORJSON_OPTIONS = 0 if orjson is None else \
    orjson.OPT_PASSTHROUGH_DATACLASS | orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_PASSTHROUGH_SUBCLASS


def header_json(fields: Mapping[str, Any]) -> bytes:
    """``fields`` as compact JSON; ValueError for NaN or an infinity, TypeError for what JSON cannot hold."""
    if orjson is not None:
        try:
            head = orjson.dumps(fields, option=_ORJSON_OPTIONS)
        except TypeError:  # e.g. int keys, which the standard library writes as strings
            pass
        else:
            if b"null" not in head:  # orjson writes NaN and the infinities as null: refused below
                return head
    return json.dumps(fields, separators=(",", ":"), allow_nan=False).encode()


def parse_header(raw: bytes) -> Any:
    """The JSON value of ``raw``; json.JSONDecodeError (or UnicodeDecodeError) unless it is UTF-8 JSON
    without NaN or infinities (neither codec takes them)."""
    if orjson is not None:
        return orjson.loads(raw)  # its JSONDecodeError is json's
    return json.loads(raw.decode(), parse_constant=_refuse_constant, parse_float=_finite_float)


def _refuse_constant(name: str) -> float:
    raise json.JSONDecodeError(f"{name} is not JSON", name, 0)


def _finite_float(text: str) -> float:
    value = float(text)
    if math.isinf(value):  # e.g. 1e999
        raise json.JSONDecodeError("number is infinite as a double", text, 0)
    return value


def _check_envelope(h: Mapping[str, Any]) -> None:
    """Validate the header's fields but its tensor specs: ids, round, message id, meta."""
    check_id(h["run"], "run")
    check_id(h["sender"], "sender")
    check_id(h["kind"], "kind")
    rnd = h["round"]
    if not isinstance(rnd, int) or isinstance(rnd, bool) or rnd < 0:
        raise WireError("bad_header", f"round must be an int >= 0, got {rnd!r}")
    if not isinstance(h["id"], str) or not _MSG_ID.fullmatch(h["id"]):
        raise WireError("bad_header", f"id must be 32 lowercase hex characters, got {h['id']!r}")
    if not isinstance(h["meta"], dict):
        raise WireError("bad_header", "meta must be a JSON object")


def _check_tensor_specs(specs: Any) -> None:
    """Validate the header's tensor specs: a list of at most MAX_TENSORS {name, dtype, shape}."""
    if not isinstance(specs, list) or len(specs) > MAX_TENSORS:
        raise WireError("bad_header", f"tensors must be a list of at most {MAX_TENSORS} specs")
    names = set()
    for spec in specs:
        if not isinstance(spec, dict) or spec.keys() != _SPEC_KEYS:
            raise WireError("bad_header", f"tensor spec must have exactly name, dtype, shape: {spec!r}")
        name, shape = spec["name"], spec["shape"]
        if not isinstance(name, str) or not 0 < len(name) <= 128 or name in names:
            raise WireError("bad_header", f"tensor name must be a unique str of 1..128 chars: {name!r}")
        names.add(name)
        if not isinstance(spec["dtype"], str):
            raise WireError("bad_header", f"tensor {name!r}: dtype must be a string")
        if (not isinstance(shape, list) or len(shape) > MAX_NDIM
                or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
            raise WireError("bad_header", f"tensor {name!r}: shape must be a list of ints >= 0: {shape!r}")


def check_expected(msg: Message, *, run: str | None = None, round: int | None = None,
                   sender: str | None = None) -> None:
    """Raise WireError (wrong_run / wrong_round / wrong_sender) if `msg` is not what the caller
    expects; a None expectation is not checked. `decode` calls it; a receiver that decoded early
    (the MQTT client does) calls it again with the round it is waiting for."""
    expect(msg.run, msg.round, msg.sender, run=run, round=round, sender=sender)


def expect(got_run: str, got_round: int, got_sender: str, *, run: str | None, round: int | None,
            sender: str | None) -> None:
    if run is not None and got_run != run:
        raise WireError("wrong_run", f"message is for run {got_run!r}, expected {run!r}")
    if round is not None and got_round != round:
        raise WireError("wrong_round", f"message is for round {got_round}, expected {round}")
    if sender is not None and got_sender != sender:
        raise WireError("wrong_sender", f"message claims sender {got_sender!r}, expected {sender!r}")


def session_and_round(payload: bytes) -> tuple[str, int]:
    """The session (``meta["session"]``, "" if none) and round a payload's header names, read without
    decoding its tensors: what the MQTT transport seals a message's frames with (testbed.mqtt.auth).
    ("", 0) for bytes that are not a message (the receiver refuses them when it decodes them)."""
    try:
        magic, head_len = _PREFIX.unpack_from(payload)
        if magic != MESSAGE_MAGIC or head_len > MAX_HEADER_BYTES:
            return "", 0
        h = parse_header(payload[_PREFIX.size:_PREFIX.size + head_len])
        session, rnd = h["meta"].get("session", ""), h["round"]
    except (struct.error, ValueError, UnicodeDecodeError, TypeError, KeyError, AttributeError):
        return "", 0
    if not isinstance(session, str) or not isinstance(rnd, int) or isinstance(rnd, bool) or not 0 <= rnd < 2**64:
        return "", 0
    return (session if ID_PATTERN.fullmatch(session) else ""), rnd


def decode(payload: bytes | bytearray | memoryview, *, expect_run: str | None = None,
           expect_round: int | None = None, expect_sender: str | None = None,
           max_bytes: int = DEFAULT_MAX_BYTES,
           allowed_dtypes: Iterable[str | np.dtype | type] = DEFAULT_ALLOWED_DTYPES) -> Message:
    """Decode and validate one message.

    Args:
        payload: bytes produced by `encode` (after reassembly if it was chunked).
        expect_run, expect_round, expect_sender: what the receiver expects; None skips the check.
            The sender expectation comes from the transport (the node id in the topic), so a node
            cannot publish in someone else's name.
        max_bytes: largest accepted payload, in bytes.
        allowed_dtypes: dtypes accepted in tensors.

    Returns:
        The Message; its tensors are zero-copy read-only views into `payload` (a copy is made only
        if `payload` is a mutable buffer, so later writes to it cannot change a validated tensor).

    Raises:
        WireError: with `code` naming the first failed check, checked cheapest first.
    """
    size = len(payload)
    if size > max_bytes:
        raise WireError("oversized", f"payload is {size} bytes, limit {max_bytes}")
    if not isinstance(payload, bytes):
        payload = bytes(payload)
    if size < _PREFIX.size:
        raise WireError("truncated", f"payload is {size} bytes, shorter than the {_PREFIX.size}-byte prefix")
    magic, head_len = _PREFIX.unpack_from(payload)
    if magic != MESSAGE_MAGIC:
        raise WireError("bad_magic", f"payload starts with {magic!r}, expected {MESSAGE_MAGIC!r}")
    if head_len > MAX_HEADER_BYTES:
        raise WireError("oversized", f"header is {head_len} bytes, limit {MAX_HEADER_BYTES}")
    body = _PREFIX.size + head_len
    if size < body:
        raise WireError("truncated", f"payload is {size} bytes, header ends at byte {body}")
    try:
        h = parse_header(payload[_PREFIX.size:body])
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WireError("bad_json", f"header is not valid JSON: {exc}") from None
    if not isinstance(h, dict):
        raise WireError("bad_json", "header is not a JSON object")
    if type(h.get("v")) is not int or h["v"] not in SUPPORTED_SCHEMAS:  # True == 1.0 == 1 in a set
        raise WireError("schema", f"schema version {h.get('v')!r} not supported "
                                  f"(supported {sorted(SUPPORTED_SCHEMAS)})")
    if h.keys() != _HEADER_KEYS:
        raise WireError("bad_header", f"header keys {sorted(h)} differ from {sorted(_HEADER_KEYS)}")
    _check_envelope(h)
    specs = h["tensors"]
    key = _specs_key(specs)
    known = _LAYOUTS.get(key) if key is not None else None
    if known is None:  # specs of the same text passed this check before
        _check_tensor_specs(specs)
    expect(h["run"], h["round"], h["sender"], run=expect_run, round=expect_round, sender=expect_sender)

    allowed = dtype_names(allowed_dtypes)
    start = body + _pad(body)
    if known is not None and known.dtypes <= allowed and start + known.nbytes == size:
        tensors = {}
        for name, dtype, count, at, shape in known.tensors:
            arr = np.frombuffer(payload, dtype=dtype, count=count, offset=start + at).reshape(shape)
            check_finite(name, arr)
            tensors[name] = arr
        return _message(h, tensors, size)
    offset = start
    layout = []
    for name, dtype, count, shape in tensor_layout(specs, allowed, checked=True):
        nbytes = count * dtype.itemsize
        layout.append((name, dtype, count, offset, shape))
        offset += nbytes + _pad(nbytes)
        if offset > size:
            raise WireError("size_mismatch", f"tensor {name!r} ends past the payload's {size} bytes")
    if offset != size:
        raise WireError("size_mismatch", f"payload is {size} bytes, header describes {offset}")
    if key is not None:
        _remember_layout(key, layout, start, size)
    tensors = {}
    for name, dtype, count, at, shape in layout:
        arr = np.frombuffer(payload, dtype=dtype, count=count, offset=at).reshape(shape)
        check_finite(name, arr)
        tensors[name] = arr
    return _message(h, tensors, size)


def tensor_layout(specs: Any, allowed: frozenset[str], *,
                  checked: bool = False) -> list[tuple[str, np.dtype, int, tuple[int, ...]]]:
    """(name, little-endian dtype, element count, shape) of each tensor spec, in order; WireError
    unless the specs are valid (``_check_tensor_specs``, skipped when the caller ``checked`` them
    and for specs whose text passed it before: :data:`_LAYOUTS`) and each dtype is in ``allowed``."""
    if not checked:
        key = _specs_key(specs)
        if key is None or key not in _LAYOUTS:
            _check_tensor_specs(specs)
    layout = []
    for spec in specs:
        if spec["dtype"] not in allowed:
            raise WireError("dtype", f"tensor {spec['name']!r} has dtype {spec['dtype']!r}, allowed {sorted(allowed)}")
        count = 1
        for d in spec["shape"]:
            count *= d  # Python ints: no overflow from a hostile shape
        layout.append((spec["name"], _little_endian(spec["dtype"]), count, tuple(spec["shape"])))
    return layout


def _message(h: dict[str, Any], tensors: dict[str, np.ndarray], size: int) -> Message:
    return frozen(Message, {"schema": h["v"], "run": h["run"], "round": h["round"], "sender": h["sender"],
                            "kind": h["kind"], "msg_id": h["id"], "meta": h["meta"], "tensors": tensors,
                            "size_bytes": size})


class _Layout(NamedTuple):
    """Where the tensors of a header's specs lie, as :func:`decode` worked it out for them once."""

    dtypes: frozenset[str]  # the dtype names the specs use
    tensors: tuple[tuple[str, np.dtype, int, int, tuple[int, ...]], ...]  # name, dtype, count, offset, shape
    nbytes: int  # from the first tensor to the payload's end, padding included


#: The tensor layouts of headers decoded in this process, by the text of their tensor specs: a
#: run's messages of a kind all carry the same specs (every update of a round: a node's gradient of
#: one shape), checked and laid out once instead of once a message (3 µs of 10 in a decode). The
#: text is orjson's, exact in every JSON type (10 and 10.0, 1 and true differ in it), so a spec
#: found here passed _check_tensor_specs as it is; its dtypes and sizes are still checked against
#: each message's own allowed dtypes and length, and anything else takes the full path.
_LAYOUTS: dict[bytes, _Layout] = {}
_LAYOUTS_KEPT = 64


def _specs_key(specs: Any) -> bytes | None:
    """The exact text of parsed tensor specs, or None (no orjson; an integer beyond 64 bits)."""
    if orjson is None:
        return None
    try:
        return orjson.dumps(specs)
    except TypeError:  # orjson.JSONEncodeError: a number it does not write
        return None


def _remember_layout(key: bytes, layout: list[tuple[str, np.dtype, int, int, tuple[int, ...]]], start: int,
                     size: int) -> None:
    if len(_LAYOUTS) >= _LAYOUTS_KEPT:  # specs that change every message: forget, stay bounded
        _LAYOUTS.clear()
    _LAYOUTS[key] = _Layout(frozenset(_name_of(dtype) for _, dtype, _, _, _ in layout),
                            tuple((name, dtype, count, at - start, shape) for name, dtype, count, at, shape in layout),
                            size - start)
