"""Serial frames at the bridge are a trust boundary: whatever the line brings (arbitrary bytes,
truncated, duplicated, reordered or damaged frames, wrong lengths and CRCs, huge length fields,
updates of another round, non-finite numbers) the framing drops each bad frame by reason in
bounded memory and still takes the honest frames after it, the board layer either returns the
board's honest update or gives the round up with one line (a UserError), and the bridge's ledger
never charges less than what the board released.

The board here is a Python model of the firmware's protocol (FakeBoard) behind a fake serial port,
so the line's faults are generated, not hand-picked; tests/test_faults_stall.py runs the real
firmware."""

from __future__ import annotations

import functools
import struct
import time
import zlib

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from firmware_bridge import agent as agent_module
from firmware_bridge import messages as m
from firmware_bridge.agent import BoardUnavailable, BridgeAgent
from firmware_bridge.board import Board, BoardResult
from firmware_bridge.framing import HEADER, MAX_PAYLOAD, VERSION, Frame, FrameDecoder, cobs_encode, encode_frame, max_encoded
from firmware_bridge.link import Link
from testbed.algorithms.contract import McuTask
from testbed.assembly.config import load_config_text, to_toml
from testbed.errors import UserError
from testbed.mqtt import wire
from testbed.rounds import protocol

MAX_BOARD_PAYLOAD = 64  # small frames: an update of P = 10 values takes two values frames and a summary
ACK_TIMEOUT_S = 0.03
UPDATE_TIMEOUT_S = 0.3


def _raw_frame(kind: int, seq: int, payload: bytes, length: int | None = None, version: int = VERSION) -> bytes:
    """A frame whose header may lie about its length (with a CRC that holds over what is sent)."""
    body = HEADER.pack(version, kind, seq & 0xFF, 0, len(payload) if length is None else length) + payload
    return cobs_encode(body + struct.pack("<I", zlib.crc32(body))) + b"\x00"


def _hello(nonce: int, dataset: int = 0) -> bytes:
    fixed = struct.pack("<BBBBBBHHBBHIBII", VERSION, 1, 0, 0, m.FORMAT_F32LE, 2, MAX_BOARD_PAYLOAD, 200, 8, 4, 16,
                        1_000_000, 0, nonce, dataset)
    return fixed + bytes([4]) + b"fake" + bytes([6]) + b"rp2040"


def _update_frames(round_index: int, values: np.ndarray, tau: int, steps: int | None = None,
                   params: int | None = None) -> list[bytes]:
    """The payloads of a round's update: values frames, then the summary."""
    values = np.asarray(values, "<f4")
    per = (MAX_BOARD_PAYLOAD - 9) // 4
    out = [struct.pack("<BIHH", 0, round_index, i, len(values[i:i + per])) + values[i:i + per].tobytes()
           for i in range(0, len(values), per)]
    out.append(struct.pack("<BIHQHI", 1, round_index, tau if steps is None else steps, 12345,
                           len(values) if params is None else params, zlib.crc32(values.tobytes())))
    return out


def _honest_update(theta: np.ndarray) -> np.ndarray:
    return (np.asarray(theta, np.float32) * np.float32(0.5) + np.float32(0.01)).astype(np.float32)


class FakeBoard:
    """A board in Python behind a fake serial port: hello, provisioning and a round as the firmware
    does them; the first update of each round goes through ``line`` (the line's faults: a function
    of the round, the honest update's payloads and the task → the bytes the bridge reads), a
    repeated go resends the honest update.

    Attributes:
        ran: the rounds whose update the board sent (released), in order.
    """

    baudrate = 1_000_000

    def __init__(self, line, step_s: float = 0.0):
        self.line, self.step_s = line, step_s
        self.decoder = FrameDecoder()
        self.out = bytearray()
        self.busy_until = 0.0  # running a step: it reads nothing (what comes waits) and sends nothing
        self.held, self.after_step = bytearray(), bytearray()
        self.noise_at_go = b""  # bytes on the line as the step starts (after the go's ack)
        self.seq = 0
        self.task: tuple[int, int, int] | None = None  # round, tau, params
        self.theta = np.zeros(0, np.float32)
        self.done: dict[int, np.ndarray] = {}
        self.ran: list[int] = []

    # ---------------------------------------------------------------- the port's side
    @property
    def in_waiting(self) -> int:
        return len(self.out)

    def read(self, size: int = 1) -> bytes:
        if self.busy_until and time.monotonic() >= self.busy_until:  # the step is over
            self.busy_until = 0.0
            self.out += self.after_step
            self.after_step.clear()
            held, self.held = bytes(self.held), bytearray()
            self.write(held)
        chunk = bytes(self.out[:size])
        del self.out[:size]
        if not chunk:
            time.sleep(0.001)  # a port's read timeout, briefly
        return chunk

    def write(self, data: bytes) -> int:
        if self.busy_until:
            self.held += data
            return len(data)
        for frame in self.decoder.feed(data):
            self._handle(frame)
        return len(data)

    def close(self) -> None:
        pass

    # ---------------------------------------------------------------- the board's side
    def _send(self, kind: int, payload: bytes) -> None:
        self.out += encode_frame(Frame(kind, self.seq, payload))
        self.seq = (self.seq + 1) & 0xFF

    def _handle(self, frame: Frame) -> None:
        p = frame.payload
        if frame.type == m.HELLO:
            self._send(m.HELLO, _hello(struct.unpack("<BI", p)[1]))
            return
        self._send(m.ACK, bytes([frame.seq, 0]))
        if frame.type != m.ROUND:
            return
        if p[0] == 0:
            r, tau, params = struct.unpack_from("<I", p, 1)[0], struct.unpack_from("<H", p, 21)[0], \
                struct.unpack_from("<H", p, 33)[0]
            self.task, self.theta = (r, tau, params), np.zeros(params, np.float32)
        elif p[0] == 1:
            first, count = struct.unpack_from("<HH", p, 1)
            self.theta[first:first + count] = np.frombuffer(p, "<f4", count, 5)
        elif p[0] == 2 and self.task is not None:
            r, tau, _ = self.task
            repeat = r in self.done
            update = self.done.setdefault(r, _honest_update(self.theta))
            self.ran.append(r)
            payloads = _update_frames(r, update, tau)
            if repeat:  # asked again: the same update, honestly
                for payload in payloads:
                    self._send(m.UPDATE, payload)
            elif self.step_s:
                self.out += self.noise_at_go
                self.busy_until = time.monotonic() + self.step_s
                self.after_step += self.line(r, payloads, tau, self)
            else:
                self.out += self.line(r, payloads, tau, self)


# --------------------------------------------------------------------------- the line's faults

@st.composite
def _faulty_line(draw):
    """A function giving the bytes of a round's first update on a faulty line."""
    ops = draw(st.lists(st.sampled_from(["drop", "dup", "swap", "flip", "cut", "garbage", "other_round",
                                         "nonfinite", "length", "huge_length", "oversize", "version", "unknown",
                                         "log", "lie_steps", "lie_params", "late"]), max_size=4))
    picks = draw(st.lists(st.integers(0, 1 << 16), min_size=8, max_size=8))
    noise = draw(st.binary(max_size=300))
    value = draw(st.sampled_from([np.nan, np.inf, -np.inf, 3.4e38]))

    def line(r: int, payloads: list[bytes], tau: int, board: FakeBoard) -> bytes:
        payloads = list(payloads)
        frames = [encode_frame(Frame(m.UPDATE, i, p)) for i, p in enumerate(payloads)]
        extra: list[bytes] = []
        for op, pick in zip(ops, picks):
            i = pick % len(frames)
            if op == "drop" and len(frames) > 1:
                del frames[i]
            elif op == "dup":
                frames.insert(i, frames[i])
            elif op == "swap":
                j = (pick // 7) % len(frames)
                frames[i], frames[j] = frames[j], frames[i]
            elif op == "flip" and len(frames[i]) > 1:
                raw = bytearray(frames[i])
                k = (pick // 3) % (len(raw) - 1)
                raw[k] = raw[k] ^ 0x01 if raw[k] != 0x01 else 0x03
                frames[i] = bytes(raw)
            elif op == "cut":
                frames[i] = frames[i][: (pick // 5) % len(frames[i])] + b"\x00"
            elif op == "garbage":
                extra.append(noise + (b"\x00" if pick % 2 else b""))
            elif op == "other_round":
                payload = bytearray(payloads[i % len(payloads)])
                struct.pack_into("<I", payload, 1, r + 1 + pick % 3)
                frames.insert(i, encode_frame(Frame(m.UPDATE, 99, bytes(payload))))
            elif op == "nonfinite":
                values = _honest_update(board.theta)
                values[pick % len(values)] = value
                board.done[r] = values  # what the board holds (and resends) is its own
                frames = [encode_frame(Frame(m.UPDATE, k, p)) for k, p in enumerate(_update_frames(r, values, tau))]
            elif op == "length":
                frames[i] = _raw_frame(m.UPDATE, 7, payloads[i % len(payloads)], length=pick % 300)
            elif op == "huge_length":
                frames[i] = _raw_frame(m.UPDATE, 7, payloads[i % len(payloads)], length=0xFFFF)
            elif op == "oversize":
                extra.append(_raw_frame(m.UPDATE, 7, bytes(MAX_PAYLOAD + 1 + pick % 100)))
            elif op == "version":
                frames.insert(i, _raw_frame(m.UPDATE, 7, payloads[i % len(payloads)], version=2))
            elif op == "unknown":
                frames.insert(i, encode_frame(Frame(0x40 + pick % 64, 7, noise[:40])))
            elif op == "log":
                frames.insert(i, encode_frame(Frame(m.LOG, 7, b"\x01" + noise[:40])))
            elif op == "lie_steps":
                frames[-1] = encode_frame(Frame(m.UPDATE, 8, _update_frames(r, board.done[r], tau, steps=tau + 1)[-1]))
            elif op == "lie_params":
                frames[-1] = encode_frame(Frame(m.UPDATE, 8, _update_frames(r, board.done[r], tau,
                                                                            params=len(board.theta) + 1)[-1]))
            elif op == "late" and r > 0:
                frames[:0] = [encode_frame(Frame(m.UPDATE, 6, p)) for p in _update_frames(r - 1, board.theta, tau)]
        return b"".join(extra) + b"".join(frames)

    return line


# --------------------------------------------------------------------------- the framing

@given(st.lists(st.binary(max_size=600), max_size=6), st.lists(st.binary(max_size=200), min_size=1, max_size=4))
def test_any_bytes_then_honest_frames_decode_in_bounded_memory(garbage, payloads):
    decoder = FrameDecoder(max_payload=256)
    honest = [Frame(m.UPDATE, i, p) for i, p in enumerate(payloads)]
    for chunk in garbage:
        decoder.feed(chunk)  # never raises
        assert len(decoder._buf) <= max_encoded(256)
    got = decoder.feed(b"\x00" + b"".join(encode_frame(f) for f in honest))
    assert got[-len(honest):] == honest  # garbage may only add frames that pass a CRC-32: practically never
    assert len(got) == len(honest)


@given(st.binary(min_size=1, max_size=400), st.integers(0, 0xFFFF), st.integers(0, 255))
def test_a_frame_with_a_lying_length_or_version_is_dropped_by_reason(payload, length, version):
    decoder = FrameDecoder()
    raw = _raw_frame(m.UPDATE, 1, payload, length=length, version=version)
    honest = encode_frame(Frame(m.ACK, 2, b"\x02\x00"))
    frames = decoder.feed(raw + honest)
    lied = length != len(payload) or version != VERSION
    assert frames[-1] == Frame(m.ACK, 2, b"\x02\x00") and len(frames) == (1 if lied else 2)
    if lied:
        assert sum(decoder.errors.values()) == 1


@given(st.sampled_from([m.parse_hello, m.parse_ack, m.parse_update, m.parse_text]), st.binary(max_size=120))
def test_every_board_payload_parses_or_is_refused_in_one_line(parse, payload):
    try:
        parse(payload)
    except m.BadPayload as exc:
        assert "\n" not in str(exc)


# --------------------------------------------------------------------------- the board layer

TASK = McuTask(seed=1, node=1, round_index=4, tau=3, batch=4, lr=0.5, sigma=1.0, n_classes=2)
THETA = np.linspace(-0.2, 0.2, 10)


def _board(line, step_s: float = 0.0, update_timeout_s: float = UPDATE_TIMEOUT_S) -> tuple[Board, FakeBoard]:
    fake = FakeBoard(line, step_s)
    board = Board(Link(fake, ack_timeout_s=ACK_TIMEOUT_S), update_timeout_s=update_timeout_s)  # type: ignore[arg-type]
    board.hello()
    return board, fake


@given(_faulty_line())
def test_the_board_layer_returns_the_boards_update_or_gives_the_round_up_in_one_line(line):
    board, fake = _board(line)
    try:
        result = board.run(TASK, THETA)
    except UserError as exc:
        assert "\n" not in str(exc)
        assert board.running == TASK.round_index  # the go was taken: its bridge charges the round
        return
    finally:
        assert len(board.link.decoder._buf) <= max_encoded(MAX_PAYLOAD)
        assert len(board.released) <= 8
    assert isinstance(result, BoardResult) and board.running is None
    np.testing.assert_array_equal(result.update, fake.done[TASK.round_index])  # what the board holds, exactly
    assert result.steps == TASK.tau


def test_a_line_that_drops_the_summary_asks_again_and_gets_the_update():
    def line(r, payloads, tau, board):
        return b"".join(encode_frame(Frame(m.UPDATE, i, p)) for i, p in enumerate(payloads[:-1]))

    board, fake = _board(line)
    result = board.run(TASK, THETA)
    np.testing.assert_array_equal(result.update, _honest_update(THETA))
    assert board.link.stats["update_asked_again"] == 1 and fake.ran == [TASK.round_index] * 2


def test_garbage_while_a_slow_board_runs_its_step_does_not_lose_the_round():
    """A damaged frame before the update looks like a lost update: the bridge asks again, the board
    (busy with its step, longer than the link's retries) does not acknowledge; its update still
    counts when it comes within the round's wait."""
    def line(r, payloads, tau, board):
        return b"".join(encode_frame(Frame(m.UPDATE, i, p)) for i, p in enumerate(payloads))

    board, fake = _board(line, step_s=0.4, update_timeout_s=2.0)
    fake.noise_at_go = b"\x05\x01garbage\x00"  # damaged on the line just after the go's ack
    result = board.run(TASK, THETA)
    np.testing.assert_array_equal(result.update, _honest_update(THETA))
    assert board.link.stats["update_asked_again"] >= 1 and board.link.stats["retries"] >= 1


# --------------------------------------------------------------------------- the bridge's ledger

CONFIG = to_toml(load_config_text("[data]\nnum_nodes = 3\nsamples_per_node = 60\ndim = 4\n"
                                  "[dp_pasgd]\nsteps = 30\ntau = 3\nbatch = 8\nlr = 0.5\nsigma = 1.0\n[nodes]\nmcu = [1]\n"))


@functools.cache
def _round(r: int) -> wire.Message:
    return wire.decode(protocol.round_("serial", "s1", r, CONFIG, [0, 1, 2], {"model": THETA}))


@given(st.lists(_faulty_line(), min_size=1, max_size=3))
def test_the_bridges_ledger_charges_every_round_the_board_released(monkeypatch, lines):
    """Rounds 0, 1, ... each on a faulty line: whatever the bridge made of each (an update sent, or
    a straggler), every round the board ran is charged once in the board's ledger, and no round it
    did not run."""
    rounds = iter(lines)
    fake = FakeBoard(lambda *args: next(current)(*args))
    current = iter([])
    monkeypatch.setattr(agent_module, "open_port", lambda url, baudrate: fake)
    monkeypatch.setattr(agent_module, "Link", functools.partial(Link, ack_timeout_s=ACK_TIMEOUT_S))
    agent = BridgeAgent(1, "fake://", update_timeout_s=UPDATE_TIMEOUT_S)
    sent = []
    for r, line in enumerate(rounds):
        current = iter([line])
        try:
            reply = agent.handle(_round(r))
        except BoardUnavailable as exc:
            assert "\n" not in str(exc)
        else:
            assert reply is not None
            sent.append(wire.decode(reply.payload).round)
    ledger = agent.ledger("serial", "s1")
    charged = {r for r in range(len(lines)) if ledger.has_round(r)}
    assert set(fake.ran) <= charged and set(sent) <= charged
    assert charged <= set(fake.ran)  # nothing the board did not run
    assert ledger.totals.local_steps == 3 * len(charged)  # each charged once
    agent.close()
