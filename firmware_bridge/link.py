"""The driver: frames over a serial line with credit-based flow control, acknowledgements,
timeouts and retries.

The board announces in its hello how many frames its receive buffer holds (its credits); the link
never has more frames unacknowledged than that, so a small RX buffer never overruns. Every frame to
the board is acknowledged (with a status); one that is not within the timeout, or that the board
reports damaged, is sent again with everything after it (go-back-N). Every bridge → board message
is idempotent (rows and model values carry their offsets, a round's "go" recomputes the same
numbers from the counter-based generator), so a repeated frame changes nothing.

What the board sends besides acks (hellos, updates) is queued for :meth:`Link.receive`; its logs
and error reports are logged here. A hello with nonce 0 means the board just booted: the link
raises :class:`BoardReset` wherever it is.

Example::

    >>> from firmware_bridge.port import open_port
    >>> link = Link(open_port("loop://"))
    >>> link.decoder.feed(b"garbage\\x00"), dict(link.decoder.errors)
    ([], {'bad_cobs': 1})
"""

from __future__ import annotations

import collections
import logging
import time
from collections import Counter

import serial

from firmware_bridge import messages as m
from firmware_bridge.framing import Frame, FrameDecoder, encode_frame
from testbed.errors import UserError

log = logging.getLogger(__name__)


class BoardGone(UserError):
    """The line failed (unplugged, closed) or the board stopped answering."""


class BoardReset(UserError):
    """The board announced a boot: everything it held (data, the round) is gone."""


class BoardRefused(UserError):
    """The board refused a frame; ``status`` is its code (messages.STATUS_NAMES)."""

    def __init__(self, status: int, what: str):
        super().__init__(f"the board refused {what}: {m.STATUS_NAMES.get(status, status)}")
        self.status = status


class Link:
    """Frames to and from one board.

    Args:
        port: an open pyserial port (firmware_bridge.port.open_port).
        ack_timeout_s: how long a frame may wait for its ack, besides its time on the line.
        retries: sends of one frame before the board is given up.
    """

    def __init__(self, port: serial.SerialBase, ack_timeout_s: float = 1.0, retries: int = 4):
        self.port = port
        self.ack_timeout_s, self.retries = ack_timeout_s, retries
        self.decoder = FrameDecoder()
        self.credits = 1  # until a hello says more
        self.max_payload = 64
        self._seq = 0
        self._inbox: collections.deque[Frame] = collections.deque()
        self.stats: Counter[str] = Counter()

    @property
    def errors(self) -> Counter[str]:
        """Frames dropped by reason: the decoder's (bad_crc, oversize...) and bad_payload, unknown_type."""
        return self.decoder.errors

    @property
    def dropped(self) -> int:
        """Frames from the board dropped so far, whatever the reason (damaged on the line, or not
        parsing): a rise while an update is coming means a part of it may be lost."""
        return sum(self.decoder.errors.values())

    def configure(self, hello: m.Hello) -> None:
        """Take the window and payload limit a board announced."""
        self.credits, self.max_payload = hello.rx_credits, hello.max_payload

    def _byte_s(self) -> float:
        baud = getattr(self.port, "baudrate", None) or 115200
        return 10.0 / baud  # 8N1: ten bits a byte

    def _write(self, data: bytes) -> None:
        try:
            self.port.write(data)
        except (serial.SerialException, OSError) as exc:
            raise BoardGone(f"serial line lost: {exc}") from None
        self.stats["bytes_out"] += len(data)

    def _read(self) -> None:
        try:
            data = self.port.read(max(1, self.port.in_waiting or 0))
        except (serial.SerialException, OSError) as exc:
            raise BoardGone(f"serial line lost: {exc}") from None
        if data:
            self.stats["bytes_in"] += len(data)
            for frame in self.decoder.feed(data):
                self._take(frame)

    def _take(self, frame: Frame) -> None:
        """Sort a checked frame: acks and hellos to the inbox, logs and errors to the log."""
        if frame.type == m.LOG or frame.type == m.ERROR:
            try:
                code, text = m.parse_text(frame.payload)
            except m.BadPayload as exc:
                self.errors["bad_payload"] += 1
                log.warning("board: %s", exc)
                return
            if frame.type == m.LOG:
                log.info("board log: %s", text)
            else:
                self.stats[f"board_error_{m.STATUS_NAMES.get(code, code)}"] += 1
                log.warning("board reports %s: %s", m.STATUS_NAMES.get(code, code), text)
                self._inbox.append(frame)
            return
        if frame.type not in m.TYPE_NAMES:
            self.errors["unknown_type"] += 1
            log.warning("board sent a frame of unknown type %d; dropped", frame.type)
            return
        if frame.type == m.HELLO and _nonce(frame) == 0:
            self._inbox.clear()
            raise BoardReset("the board restarted (it announced a boot)")
        self._inbox.append(frame)

    def receive(self, timeout_s: float) -> Frame | None:
        """The next frame the board sent (not an ack), or None after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while True:
            for i, frame in enumerate(self._inbox):
                if frame.type != m.ACK:
                    del self._inbox[i]
                    return frame
            if time.monotonic() >= deadline:
                return None
            self._read()

    def write_frame(self, kind: int, payload: bytes) -> None:
        """One frame, not waiting for an ack (a hello request is answered by a hello)."""
        self._write(encode_frame(Frame(kind, self._seq, payload)))
        self._seq = (self._seq + 1) & 0xFF

    def send(self, kind: int, payloads: list[bytes], what: str) -> None:
        """Send one frame per payload and wait for every ack, at most ``credits`` outstanding.

        Raises:
            BoardRefused: the board acknowledged a frame with an error status.
            BoardGone: a frame went unacknowledged ``retries`` times, or the line failed.
            BoardReset: the board booted meanwhile.
        """
        frames = [Frame(kind, (self._seq + i) & 0xFF, p) for i, p in enumerate(payloads)]
        self._seq = (self._seq + len(frames)) & 0xFF
        acked, sent, timeouts, damaged = 0, 0, 0, 0
        while acked < len(frames):
            while sent < len(frames) and sent - acked < self.credits:
                self._write(encode_frame(frames[sent]))
                sent += 1
            wire_s = sum(len(f.payload) + 16 for f in frames[acked:sent]) * self._byte_s()
            outcome = self._await_ack(frames[acked].seq, time.monotonic() + self.ack_timeout_s + wire_s)
            if isinstance(outcome, m.Ack):
                if outcome.status != 0:
                    raise BoardRefused(outcome.status, what)
                acked, timeouts = acked + 1, 0
                continue
            # lost (a timeout) or reported damaged (an error report, which may also concern earlier
            # garbage on the line): go back to the first unacknowledged frame
            self.stats["retries"] += 1
            timeouts += outcome == "timeout"
            damaged += outcome == "damaged"
            if timeouts >= self.retries or damaged >= 4 * self.retries:
                raise BoardGone(f"no ack from the board for {what} after {timeouts + damaged + 1} tries")
            sent = acked

    def _await_ack(self, seq: int, deadline: float) -> m.Ack | str:
        """The ack of frame ``seq``, or "damaged" (the board reported a damaged frame), or "timeout"."""
        while time.monotonic() < deadline:
            for i, frame in enumerate(self._inbox):
                if frame.type == m.ERROR:  # the board saw a damaged frame: resend now
                    del self._inbox[i]
                    return "damaged"
                if frame.type != m.ACK:
                    continue
                del self._inbox[i]
                try:
                    ack = m.parse_ack(frame.payload)
                except m.BadPayload as exc:
                    self.errors["bad_payload"] += 1
                    log.warning("board: %s", exc)
                    break
                if ack.seq == seq:
                    return ack
                break  # an ack of an earlier, repeated frame: stale
            else:
                self._read()
        return "timeout"

    def close(self) -> None:
        try:
            self.port.close()
        except (serial.SerialException, OSError):
            pass  # a line that is gone is closed


def _nonce(frame: Frame) -> int | None:
    """The nonce of a hello frame (None when it does not parse: the board layer reports that)."""
    try:
        return m.parse_hello(frame.payload).nonce
    except m.BadPayload:
        return None
