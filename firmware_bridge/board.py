"""The protocol a board offers: who it is, its data, and a round's node step.

:class:`Board` runs the exchanges of docs/serial-protocol.md over a :class:`~firmware_bridge.link.Link`:
a hello (the version handshake), provisioning (the node's training rows, once per boot), and a round
(the task and the model in, the update and the cycles it took out). Everything the board sends is
checked before it is used: shapes, the CRC over the update, finiteness. A round's update that
comes incomplete or damaged is asked for again (the round's go repeated: the board sends the same
update, not recomputed) before the round is given up. The update frames of any round the board
sends are noted in :attr:`Board.released` (a board that was stalled answers a round the bridge gave
up on; its bridge charges it).

Example (with a virtual board, see firmware_bridge.virtual)::

    board = Board(Link(open_port(url)))
    hello = board.hello()
    board.provision(x, y, classes=2)         # (n, d) features, (n,) labels
    result = board.run(task, theta)          # McuTask, (P,) model → BoardResult
"""

from __future__ import annotations

import collections
import logging
import secrets
import struct
import time
import zlib
from dataclasses import dataclass

import numpy as np

from firmware_bridge import messages as m
from firmware_bridge.framing import VERSION, Frame
from firmware_bridge.link import BoardGone, BoardRefused, BoardReset, Link
from testbed.algorithms.contract import McuTask

log = logging.getLogger(__name__)


class BoardMismatch(BoardGone):
    """The board speaks another protocol version or number format, or cannot hold the task."""


@dataclass(frozen=True)
class BoardResult:
    """One round on the board.

    Attributes:
        update: (P,) float32, the node's new model.
        steps: local steps it ran. cycles: counts of its counter over them.
        counter_hz, counter_kind: as its hello said.
        wall_s: the round's wall time seen by the bridge (sending the model to the last update byte).
    """

    update: np.ndarray
    steps: int
    cycles: int
    counter_hz: int
    counter_kind: str
    wall_s: float


def _crc_f32(values: np.ndarray) -> int:
    return zlib.crc32(np.asarray(values, "<f4").tobytes())


#: Rounds remembered in Board.released (a board holds one round at a time; a few cover a stall).
_RELEASED_KEPT = 8


class Board:
    """One board on one link.

    Args:
        link: the driver.
        update_timeout_s: how long a round's update may take after its go is acknowledged.

    Attributes:
        released: round → its ``update done`` (None if only values came) for every round whose
            update frames the board sent on this line, the last few; the bridge takes them
            (:meth:`take_released`) and charges those it did not use.
        running: the round whose go the board acknowledged (it runs the round) and whose update
            :meth:`run` did not return; None otherwise.
    """

    def __init__(self, link: Link, update_timeout_s: float = 30.0):
        self.link = link
        self.update_timeout_s = update_timeout_s
        self.info: m.Hello | None = None
        self.dataset = 0  # the data the board holds (0: none)
        self.released: collections.OrderedDict[int, m.UpdateDone | None] = collections.OrderedDict()
        self.running: int | None = None

    def aside(self, frame: Frame | None) -> None:
        """Note a frame that came outside the exchange it belongs to: an update is evidence that
        the board released its round (anything else is dropped)."""
        if frame is None or frame.type != m.UPDATE:
            return
        part = self._parsed(m.parse_update, frame.payload)
        if part is not None:
            self._released(part)

    def _released(self, part: m.UpdateValues | m.UpdateDone) -> None:
        done = part if isinstance(part, m.UpdateDone) else self.released.get(part.round_index)
        self.released[part.round_index] = done
        self.released.move_to_end(part.round_index)
        while len(self.released) > _RELEASED_KEPT:
            self.released.popitem(last=False)

    def take_released(self) -> dict[int, m.UpdateDone | None]:
        """:attr:`released`, emptied."""
        taken = dict(self.released)
        self.released.clear()
        return taken

    def hello(self, attempts: int = 3) -> m.Hello:
        """Ask who the board is; check it speaks our protocol and numbers; take its window.

        Raises:
            BoardMismatch: another protocol version or number format.
            BoardGone: no answer.
        """
        for _ in range(attempts):
            nonce = secrets.randbits(32) | 1
            self.link.write_frame(m.HELLO, m.hello_request(nonce))
            deadline = time.monotonic() + self.link.ack_timeout_s
            while True:
                try:
                    frame = self.link.receive(max(0.0, deadline - time.monotonic()))
                except BoardReset:  # it booted just now (QEMU starts on connect): ours is next
                    self.dataset = 0
                    continue
                if frame is None:
                    break
                if frame.type != m.HELLO:
                    self.aside(frame)
                    continue
                info = self._parsed(m.parse_hello, frame.payload)
                if info is None:
                    continue
                if info.nonce == nonce:
                    return self._accept(info)
        raise BoardGone(f"no hello from the board after {attempts} tries")

    def _accept(self, info: m.Hello) -> m.Hello:
        if info.protocol != VERSION:
            raise BoardMismatch(f"the board speaks protocol {info.protocol}, this bridge {VERSION}")
        if info.number_format != m.FORMAT_F32LE:
            raise BoardMismatch(f"the board's number format {info.number_format} is not IEEE binary32 LE")
        self.info, self.dataset = info, info.dataset
        self.link.configure(info)
        return info

    def provision(self, x: np.ndarray, y: np.ndarray, classes: int) -> int:
        """Load the node's rows into the board (skipped when it holds them already); returns the
        bytes sent on the line (0 when skipped).

        Args:
            x: (n, d) features (rounded to float32). y: (n,) labels in [0, classes).
            classes: C, the model's classes.
        """
        info = self._info()
        x32 = np.ascontiguousarray(x, dtype="<f4")
        labels = np.asarray(y)
        n, d = x32.shape
        if n == 0 or labels.min() < 0 or labels.max() >= classes:
            raise BoardMismatch(f"the node's labels are not in [0, {classes})")
        if n > info.max_rows or d > info.max_features or classes > info.max_classes:
            raise BoardMismatch(f"the board holds {info.max_rows} rows of {info.max_features} features and "
                                f"{info.max_classes} classes; the node has {n} × {d}, {classes} classes")
        rows = m.rows_bytes(x32, labels.astype(np.uint8))
        dataset = (zlib.crc32(struct.pack("<HBB", n, d, classes) + rows) & 0x7FFFFFFF) | 1
        if self.dataset == dataset:
            return 0
        before = self.link.stats["bytes_out"]
        per = (info.max_payload - 5) // (4 * d + 1)
        self.link.send(m.PROVISION, [m.provision_begin(dataset, n, d, classes)], "provisioning")
        self.link.send(m.PROVISION, [m.provision_rows(i, x32[i : i + per], labels[i : i + per].astype(np.uint8))
                                     for i in range(0, n, per)], "provisioning")
        self.link.send(m.PROVISION, [m.provision_commit(zlib.crc32(rows))], "provisioning")
        self.dataset = dataset
        return self.link.stats["bytes_out"] - before

    def run(self, task: McuTask, params: np.ndarray) -> BoardResult:
        """One round: the task and the model in, the update out. An update that comes incomplete
        (a damaged frame dropped on the line, or the line quiet with part of it missing) is asked
        for again, up to the link's ``retries`` times.

        Raises:
            BoardRefused: the board refused the task (e.g. status no_data after a reset).
            BoardReset: the board booted during the round.
            BoardGone: the line failed, no complete update came within ``update_timeout_s`` (and
                the asks again), or the update's summary contradicts the task.
        """
        info = self._info()
        theta = np.asarray(params, dtype="<f4")
        p = len(theta)
        start = time.monotonic()
        per = (info.max_payload - 5) // 4
        go = m.round_go(_crc_f32(theta))
        self.link.send(m.ROUND, [m.round_begin(task.round_index, task.seed, task.node, self.dataset, task.tau,
                                               task.batch, task.lr, task.sigma, p)], "the round")
        self.link.send(m.ROUND, [m.round_model(i, theta[i : i + per]) for i in range(0, p, per)], "the model")
        self.running = None
        asked, dropped, coming = 0, self.link.dropped, False  # frames dropped since the go: maybe the update's
        self.link.send(m.ROUND, [go], "the round's go")
        self.running = task.round_index
        update = np.full(p, np.nan, dtype=np.float32)
        seen = np.zeros(p, dtype=bool)
        deadline = time.monotonic() + self.update_timeout_s
        while True:
            # Once the update is coming (a part of it came, or a frame was dropped since the go),
            # a quiet line means the rest was lost: waited for an ack's time, not the whole step's.
            now = time.monotonic()
            wait = deadline - now
            if coming or self.link.dropped > dropped:
                wait = min(wait, self.link.ack_timeout_s)
            frame = self.link.receive(max(0.0, wait))
            if frame is None:
                if time.monotonic() >= deadline or asked >= self.link.retries or not (
                        coming or self.link.dropped > dropped):
                    raise BoardGone(f"no complete update of round {task.round_index} within "
                                    f"{self.update_timeout_s:g} s ({asked} asked again)")
                asked, dropped = self._ask_again(task, go, asked)
                continue
            if frame.type == m.ERROR:
                code, text = m.parse_text(frame.payload)
                raise BoardRefused(code, f"round {task.round_index} ({text})")
            if frame.type != m.UPDATE:
                continue
            part = self._parsed(m.parse_update, frame.payload)
            if part is None:
                continue
            self._released(part)
            if part.round_index != task.round_index:
                continue  # an earlier round's update (a stalled board's): noted as released
            coming = True
            if isinstance(part, m.UpdateValues):
                end = part.first + len(part.values)
                if end > p:
                    self.link.errors["bad_payload"] += 1
                    continue
                update[part.first : end], seen[part.first : end] = part.values, True
                continue
            if part.params != p or part.steps != task.tau:
                self.link.errors["bad_update"] += 1
                raise BoardGone(f"round {task.round_index}: the update's summary says {part.steps} steps of "
                                f"{part.params} values, the task {task.tau} of {p}")
            if not seen.all() or part.crc != _crc_f32(update):
                if asked >= self.link.retries:
                    self.link.errors["bad_update"] += 1
                    raise BoardGone(f"round {task.round_index}: the update does not match its summary "
                                    f"after {asked} asks again")
                asked, dropped = self._ask_again(task, go, asked)
                continue
            self.running = None
            return BoardResult(update, part.steps, part.cycles, info.counter_hz, info.counter_kind,
                               time.monotonic() - start)

    def _ask_again(self, task: McuTask, go: bytes, asked: int) -> tuple[int, int]:
        """Ask for the round's update again (its go repeated: the board resends the update it
        holds, not recomputed); the asks so far and the link's dropped frames now."""
        log.warning("round %d: the board's update came incomplete or damaged; asking for it again", task.round_index)
        self.link.stats["update_asked_again"] += 1
        try:
            self.link.send(m.ROUND, [go], "the round's go (again)")
        except BoardGone:  # no ack: the board may still be running the step (garbage on the line
            pass  # looked like a lost update); the update's deadline decides, a lost line fails the next read
        return asked + 1, self.link.dropped

    def _parsed(self, parse, payload: bytes):
        """``parse(payload)``, or None for a payload it refuses (counted and logged: a board's
        garbage never ends the exchange, it is skipped like a frame of another type)."""
        try:
            return parse(payload)
        except m.BadPayload as exc:
            self.link.errors["bad_payload"] += 1
            log.warning("board: %s", exc)
            return None

    def _info(self) -> m.Hello:
        if self.info is None:
            raise BoardGone("the board has not said hello")
        return self.info


__all__ = ["Board", "BoardResult", "BoardGone", "BoardMismatch", "BoardRefused", "BoardReset"]
