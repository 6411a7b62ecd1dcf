"""Frames on the serial line: COBS byte stuffing, a 0x00 delimiter and a CRC-32.

A frame's body (before stuffing) is::

    version u8 | type u8 | seq u8 | reserved u8 | length u16 LE | payload[length] | crc32 u32 LE

with the CRC (zlib's) over everything before it. COBS removes every 0x00 from the body, so a
0x00 always ends a frame: a receiver that lost its place (garbage, a cut frame) resynchronises at
the next one. :class:`FrameDecoder` never raises on what the line brings: each bad frame is
counted by reason and dropped.

Example::

    >>> raw = encode_frame(Frame(type=7, seq=3, payload=b"\\x03\\x00"))
    >>> raw[-1], FrameDecoder().feed(b"\\x17garbage\\x00" + raw)
    (0, [Frame(type=7, seq=3, payload=b'\\x03\\x00', version=1)])
"""

from __future__ import annotations

import struct
import zlib
from collections import Counter
from dataclasses import dataclass

#: The protocol version this bridge speaks (the first byte of every frame).
VERSION = 1
HEADER = struct.Struct("<BBBBH")
CRC_BYTES = 4
#: Largest payload the bridge accepts from a board, bytes (a board announces its own maximum).
MAX_PAYLOAD = 4096


@dataclass(frozen=True)
class Frame:
    """One checked frame: its type, sequence number (mod 256) and payload."""

    type: int
    seq: int
    payload: bytes
    version: int = VERSION


def cobs_encode(data: bytes) -> bytes:
    """COBS (Cheshire & Baker): ``data`` without any 0x00, one byte longer per 254 (plus one)."""
    out = bytearray([0])
    code_at, code = 0, 1
    for byte in data:
        if byte == 0:
            out[code_at] = code
            code_at, code = len(out), 1
            out.append(0)
            continue
        out.append(byte)
        code += 1
        if code == 0xFF:
            out[code_at] = code
            code_at, code = len(out), 1
            out.append(0)
    out[code_at] = code
    return bytes(out)


def cobs_decode(data: bytes) -> bytes:
    """The inverse of :func:`cobs_encode`; ValueError on a malformed input."""
    out = bytearray()
    i = 0
    while i < len(data):
        code = data[i]
        if code == 0 or i + code > len(data):
            raise ValueError("malformed COBS")
        block = data[i + 1 : i + code]
        if 0 in block:
            raise ValueError("malformed COBS")
        out += block
        i += code
        if code != 0xFF and i < len(data):
            out.append(0)
    return bytes(out)


def encode_frame(frame: Frame) -> bytes:
    """The bytes that carry ``frame`` on the line, delimiter included."""
    if len(frame.payload) > 0xFFFF:
        raise ValueError(f"a payload of {len(frame.payload)} bytes does not fit a frame")
    body = HEADER.pack(frame.version, frame.type, frame.seq & 0xFF, 0, len(frame.payload)) + frame.payload
    return cobs_encode(body + struct.pack("<I", zlib.crc32(body))) + b"\x00"


def max_encoded(payload: int) -> int:
    """Bytes on the line of a frame with a ``payload``-byte payload, delimiter included."""
    body = HEADER.size + payload + CRC_BYTES
    return body + body // 254 + 2


class FrameDecoder:
    """Turns the bytes of a serial line into checked frames.

    Args:
        max_payload: larger frames are dropped as ``oversize`` without being buffered.

    Attributes:
        errors: reason → frames dropped (``bad_cobs``, ``truncated``, ``bad_length``, ``bad_crc``,
            ``bad_version``, ``oversize``).
    """

    def __init__(self, max_payload: int = MAX_PAYLOAD):
        self._limit = max_encoded(max_payload)
        self._buf = bytearray()
        self._dropping = False
        self.errors: Counter[str] = Counter()
        self.frames = 0

    def feed(self, data: bytes) -> list[Frame]:
        """The frames ``data`` completes (in order); what is left waits for the next call."""
        frames = []
        for chunk in _split_keep(data):
            if chunk == b"\x00":
                if not self._dropping and self._buf:
                    frame = self._frame(bytes(self._buf))
                    if frame is not None:
                        frames.append(frame)
                self._buf.clear()
                self._dropping = False
                continue
            if self._dropping:
                continue
            self._buf += chunk
            if len(self._buf) > self._limit:
                self.errors["oversize"] += 1
                self._buf.clear()
                self._dropping = True
        return frames

    def _frame(self, raw: bytes) -> Frame | None:
        try:
            body = cobs_decode(raw)
        except ValueError:
            self.errors["bad_cobs"] += 1
            return None
        if len(body) < HEADER.size + CRC_BYTES:
            self.errors["truncated"] += 1
            return None
        version, kind, seq, _, length = HEADER.unpack_from(body)
        if HEADER.size + length + CRC_BYTES != len(body):
            self.errors["bad_length"] += 1
            return None
        (crc,) = struct.unpack_from("<I", body, len(body) - CRC_BYTES)
        if zlib.crc32(body[:-CRC_BYTES]) != crc:
            self.errors["bad_crc"] += 1
            return None
        if version != VERSION:  # checked after the CRC: a damaged frame is not a new version
            self.errors["bad_version"] += 1
            return None
        self.frames += 1
        return Frame(kind, seq, body[HEADER.size : HEADER.size + length], version)


def _split_keep(data: bytes) -> list[bytes]:
    """``data`` cut before and after every 0x00, the delimiters kept as their own pieces."""
    pieces = []
    for i, part in enumerate(data.split(b"\x00")):
        if i:
            pieces.append(b"\x00")
        if part:
            pieces.append(part)
    return pieces
