"""The typed messages of the serial protocol (docs/serial-protocol.md): how each payload is laid
out, built for the board and checked from it. Every parser takes a board's payload, which is
outside input: it checks the length and ranges and raises :class:`BadPayload` (one line) on
anything else, before a value is used.

Example::

    >>> ack = parse_ack(bytes([5, 0]))
    >>> ack.seq, ack.status, STATUS_NAMES[8]
    (5, 0, 'no_data')
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import numpy as np

from firmware_bridge.framing import VERSION

HELLO, PROVISION, ROUND, UPDATE, LOG, ERROR, ACK = 1, 2, 3, 4, 5, 6, 7
TYPE_NAMES = {HELLO: "hello", PROVISION: "provision", ROUND: "round", UPDATE: "update", LOG: "log",
              ERROR: "error", ACK: "ack"}
STATUS_NAMES = {0: "ok", 1: "bad_crc", 2: "bad_version", 3: "oversize", 4: "truncated", 5: "bad_payload",
                6: "unknown_type", 7: "too_large", 8: "no_data", 9: "bad_data", 10: "no_round", 11: "bad_model"}
NO_DATA = 8
#: Number formats a board may announce.
FORMAT_F32LE = 1
#: How a board counts its steps: a core cycle counter, a timer, a virtual board's host clock or an
#: emulator's timer (the last two are not a real board's time).
COUNTER_KINDS = {0: "cycles", 1: "timer", 2: "host", 3: "emulated"}
#: The dataset id a board with its own data (the firmware's data hook) announces.
OWN_DATA = 0xFFFFFFFF


class BadPayload(ValueError):
    """A board's payload that does not parse; the message says what is wrong."""


@dataclass(frozen=True)
class Hello:
    """What a board says of itself (its answer to a hello, or unasked after a reset: nonce 0).

    Attributes:
        protocol, firmware: protocol version and firmware (major, minor, patch).
        number_format: 1 = IEEE 754 binary32, little-endian.
        rx_credits: frames the board's receive buffer holds (the bridge's window).
        max_payload: largest payload it takes, bytes.
        max_rows, max_features, max_classes, max_batch: what its RAM holds.
        counter_hz, counter_kind: its step counter's rate and kind ("cycles", "timer", "host").
        nonce: the bridge's hello this answers (0: sent at boot).
        dataset: the data it holds (0: none; OWN_DATA: its own, from the data hook).
        board_id, profile: a stable id, and its device profile's name.
    """

    protocol: int
    firmware: tuple[int, int, int]
    number_format: int
    rx_credits: int
    max_payload: int
    max_rows: int
    max_features: int
    max_classes: int
    max_batch: int
    counter_hz: int
    counter_kind: str
    nonce: int
    dataset: int
    board_id: str
    profile: str


_HELLO = struct.Struct("<BBBBBBHHBBHIBII")


def parse_hello(p: bytes) -> Hello:
    if len(p) < _HELLO.size + 2:
        raise BadPayload(f"hello of {len(p)} bytes")
    (proto, major, minor, patch, fmt, credits, max_payload, rows, feats, classes, batch, hz, kind, nonce,
     dataset) = _HELLO.unpack_from(p)
    board_id, rest = _text(p[_HELLO.size :], "board id")
    profile, rest = _text(rest, "profile")
    if rest:
        raise BadPayload(f"hello with {len(rest)} trailing bytes")
    if credits < 1 or max_payload < 64 or hz < 1 or kind not in COUNTER_KINDS:
        raise BadPayload(f"hello with credits {credits}, max payload {max_payload}, counter {hz} Hz kind {kind}")
    return Hello(proto, (major, minor, patch), fmt, credits, max_payload, rows, feats, classes, batch, hz,
                 COUNTER_KINDS[kind], nonce, dataset, board_id, profile)


def _text(p: bytes, what: str) -> tuple[str, bytes]:
    if not p or len(p) < 1 + p[0]:
        raise BadPayload(f"hello: {what} cut short")
    raw = p[1 : 1 + p[0]]
    if not all(0x20 < b < 0x7F for b in raw):
        raise BadPayload(f"hello: {what} is not printable ASCII")
    return raw.decode("ascii"), p[1 + p[0] :]


def hello_request(nonce: int) -> bytes:
    """Bridge → board: who are you (answered with a Hello carrying ``nonce``, 1 .. 2³²−1)."""
    return struct.pack("<BI", VERSION, nonce)


def provision_begin(dataset: int, rows: int, features: int, classes: int) -> bytes:
    return struct.pack("<BIHBB", 0, dataset, rows, features, classes)


def provision_rows(first: int, x: np.ndarray, y: np.ndarray) -> bytes:
    """Rows ``first ..`` of the data: each row its features (float32 LE) then its label (u8)."""
    return struct.pack("<BHH", 1, first, len(x)) + rows_bytes(x, y)


def rows_bytes(x: np.ndarray, y: np.ndarray) -> bytes:
    """The rows as the board stores them and as the commit's CRC covers them."""
    row = np.dtype([("x", "<f4", (x.shape[1],)), ("y", "u1")])
    packed = np.empty(len(x), dtype=row)
    packed["x"], packed["y"] = x, y
    return packed.tobytes()


def provision_commit(crc: int) -> bytes:
    return struct.pack("<BI", 2, crc)


def round_begin(round_index: int, seed: int, node: int, dataset: int, tau: int, batch: int, lr: float,
                sigma: float, params: int) -> bytes:
    return struct.pack("<BIQIIHHffH", 0, round_index, seed, node, dataset, tau, batch, lr, sigma, params)


def round_model(first: int, values: np.ndarray) -> bytes:
    return struct.pack("<BHH", 1, first, len(values)) + np.asarray(values, "<f4").tobytes()


def round_go(crc: int) -> bytes:
    return struct.pack("<BI", 2, crc)


@dataclass(frozen=True)
class Ack:
    """The board took frame ``seq`` (status 0) or refused it (a STATUS_NAMES code)."""

    seq: int
    status: int


def parse_ack(p: bytes) -> Ack:
    if len(p) != 2:
        raise BadPayload(f"ack of {len(p)} bytes")
    if p[1] not in STATUS_NAMES:
        raise BadPayload(f"ack with unknown status {p[1]}")
    return Ack(p[0], p[1])


@dataclass(frozen=True)
class UpdateValues:
    """Update values ``first .. first+len(values)-1`` of round ``round_index``."""

    round_index: int
    first: int
    values: np.ndarray


@dataclass(frozen=True)
class UpdateDone:
    """The end of round ``round_index``'s update: ``steps`` steps in ``cycles`` counts."""

    round_index: int
    steps: int
    cycles: int
    params: int
    crc: int


_VALUES = struct.Struct("<BIHH")
_DONE = struct.Struct("<BIHQHI")


def parse_update(p: bytes) -> UpdateValues | UpdateDone:
    if p[:1] == b"\x00":
        if len(p) < _VALUES.size or (len(p) - _VALUES.size) % 4:
            raise BadPayload(f"update values of {len(p)} bytes")
        _, r, first, count = _VALUES.unpack_from(p)
        if len(p) != _VALUES.size + 4 * count:
            raise BadPayload(f"update values: {count} values in {len(p) - _VALUES.size} bytes")
        return UpdateValues(r, first, np.frombuffer(p, "<f4", count, _VALUES.size).astype(np.float32))
    if p[:1] == b"\x01":
        if len(p) != _DONE.size:
            raise BadPayload(f"update done of {len(p)} bytes")
        _, r, steps, cycles, params, crc = _DONE.unpack(p)
        return UpdateDone(r, steps, cycles, params, crc)
    raise BadPayload(f"update of unknown kind {p[:1].hex() or 'empty'}")


def parse_text(p: bytes) -> tuple[int, str]:
    """An error's code or a log's level, and its text (non-printable bytes escaped)."""
    if not p:
        raise BadPayload("empty error or log")
    return p[0], p[1:].decode("ascii", "backslashreplace")

