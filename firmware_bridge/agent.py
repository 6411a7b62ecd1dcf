"""The bridge as a node: a board behind a serial line, presented to the run as an MQTT node.

:class:`BridgeAgent` is a :class:`nodes.agent.NodeAgent` (so the experiment, the budgets, the ledger
in the bridge's state dir and the replies are the agent's own) whose node step is done by the
board: the algorithm, built here for the planned events and the budget checks, says the board's
task (``mcu_task``), the board runs it, and the algorithm turns the board's update into the step's
result (``mcu_result``). nodes.host.serve drives it through its ``agent_factory``, so the board has
its own MQTT identity under the ACL, reconnects and all.

A board that resets, goes silent or is unplugged during a round, refuses the round, or reports a
non-finite or malformed update makes this node a straggler for that round (one error line, nothing
sent); at the next round the bridge reopens the line, says hello, provisions the data again if the
board lost it, and the node is back. What the board ran is charged whether or not it is used: a
round whose go the board acknowledged and that the bridge gave up (a board stalled past the
bridge's wait, a damaged update asked for in vain), an update refused for its content, and the
update of any round the bridge gave it that comes late, each has the round's planned events
charged in the board's ledger, once (with the cycles the board reported when its summary came;
modelled otherwise); the update is not sent, its round has closed. A board that announces a reset
before its update lost the round: nothing charged. The host (nodes.round_fence) never hands the
board a round that has closed meanwhile.

Example (``nodes.host.serve`` builds one per node id)::

    serve(broker, run, [3], agent_factory=lambda n: BridgeAgent(n, "/dev/ttyACM0", state_dir=d))
"""

from __future__ import annotations

import collections
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from firmware_bridge import messages as m
from firmware_bridge.board import Board, BoardResult
from firmware_bridge.costs import BoardCosts
from firmware_bridge.link import BoardRefused, BoardReset, Link
from firmware_bridge.port import open_port
from nodes.agent import NodeAgent
from testbed.algorithms.contract import SETUP_ROUND, McuTask, NodeResult, RoundContext, RunsOnMcu
from testbed.data.federated import Split
from testbed.devices.profiles import load_mcu_profile
from testbed.errors import UserError
from testbed.ledger.events import CommunicationEvent, Event
from testbed.mqtt import wire
from testbed.rounds import protocol
from testbed.streams.node_secret import NodeSecret

log = logging.getLogger(__name__)

#: Rounds a bridge remembers handing its board (a board holds one round at a time).
_GIVEN_KEPT = 8


class BoardUnavailable(UserError):
    """This round cannot run on the board (the node straggles); the message says why."""


@dataclass(frozen=True)
class _Given:
    """A round handed to the board: what to charge should the board release it unused."""

    session: tuple[str, str | None]
    tau: int
    planned: list[Event]


class BridgeAgent(NodeAgent):
    """One node whose step runs on a board.

    Args:
        node: the node's global id.
        url: the board's serial line (any pyserial URL).
        state_dir: where the board's ledger is kept (on the bridge host: privacy is accounted
            where the data is, and the bridge holds the data it provisions).
        profile: the board's profile (firmware_bridge/boards.toml); default: what its hello says.
        baudrate: the line's rate (ignored by pseudo-terminals and sockets).
        update_timeout_s: how long the bridge waits for a round's update after the board took it.
        secret: the board's secret, held by its bridge host (the board's own firmware takes a 64-bit
            key): each round's Philox key is derived from it (NodeSecret.philox_seed) and sent in
            place of the run's seed; None: the run's seed (reproducible).
    """

    def __init__(self, node: int, url: str, *, state_dir: Path | None = None, profile: str | None = None,
                 baudrate: int = 115200, update_timeout_s: float = 30.0, secret: NodeSecret | None = None):
        super().__init__(node, state_dir=state_dir, costs=BoardCosts(profile or "rp2040"),  # type: ignore[arg-type]
                         secret=secret)
        self.url, self.baudrate, self.profile = url, baudrate, profile
        self.board: Board | None = None
        self.update_timeout_s = update_timeout_s
        self._session: tuple[str, str | None] | None = None
        self._given: collections.OrderedDict[int, _Given] = collections.OrderedDict()

    def _step(self, msg: wire.Message) -> protocol.Reply | None:
        self._session = (msg.run, protocol.session_of(msg))
        return super()._step(msg)

    def _experiment(self, config_text: str):
        exp = super()._experiment(config_text)
        if not isinstance(exp.algorithm, _OnBoard):
            if not isinstance(exp.algorithm, RunsOnMcu):
                raise UserError(f"algorithm {exp.config.run.algorithm} has no microcontroller node step")
            if self.node not in exp.config.nodes.mcu:
                log.warning("node %d is not in the experiment's [nodes] mcu: sim will not give its numbers",
                            self.node)
            self.costs.flops_per_step = exp.algorithm.flops_per_step  # type: ignore[attr-defined]
            exp.algorithm = _OnBoard(exp.algorithm, self)
        return exp

    # ---------------------------------------------------------------------------- the board

    def _connect(self) -> Board:
        """The board, its line opened and its hello taken if it was not."""
        if self.board is None:
            link = Link(open_port(self.url, self.baudrate))
            board = Board(link, self.update_timeout_s)
            try:
                info = board.hello()
            except UserError:
                self._charge_released(board)  # a stalled board may have answered before failing
                link.close()
                raise
            log.info("node %d: board %s, firmware %s, profile %s, %d credits, %d-byte payloads", self.node,
                     info.board_id, ".".join(map(str, info.firmware)), info.profile, info.rx_credits,
                     info.max_payload)
            if self.profile is None:  # the same costs object: a step in progress reports to it
                self.costs.profile = load_mcu_profile(info.profile)  # type: ignore[attr-defined]
            self.board = board
        return self.board

    def _drop(self) -> None:
        if self.board is not None:
            self.board.link.close()
            self.board = None

    def run_on_board(self, task: McuTask, params: np.ndarray, train: Split, n_classes: int,
                     planned: list[Event]) -> BoardResult:
        """One round on the board: line, hello, data, task; BoardUnavailable if it cannot be.
        ``planned``: the round's events, charged if the board releases the round unused."""
        self._give(task, planned)
        board: Board | None = None
        answered = False
        try:
            board = self._connect()
            try:  # a boot the board announced between rounds: it lost its data, not this round
                while (frame := board.link.receive(0.0)) is not None:
                    board.aside(frame)  # a late update of a round given up
            except BoardReset:
                board.dataset = 0
            sent = board.provision(train.x, train.y, n_classes)
            if sent:
                self._log_provision(sent)
            result = board.run(task, params)
            answered = True
            return result
        except BoardRefused as exc:
            if exc.status == m.NO_DATA and self.board is not None:
                self.board.dataset = 0
            raise BoardUnavailable(f"board on {self.url}: {exc}; a straggler this round") from None
        except BoardReset:  # it lost the round: nothing run, unless its update came (charged below)
            if self.board is not None:
                self.board.dataset = 0
                self.board.running = None
            raise BoardUnavailable(f"board on {self.url} reset mid-round; a straggler this round") from None
        except UserError as exc:  # the line is gone, or the board went silent: reopen next round
            self._drop()
            raise BoardUnavailable(f"board on {self.url}: {exc}; a straggler this round") from None
        finally:
            if board is not None:
                self._charge_released(board, answered=task.round_index if answered else None)
                if board.running == task.round_index:  # given up while the board runs it: spent
                    self.charge_unused(task.round_index, cycles=0, counter_hz=1, kind="model")

    def _give(self, task: McuTask, planned: list[Event]) -> None:
        assert self._session is not None
        self._given[task.round_index] = _Given(self._session, task.tau, list(planned))
        self._given.move_to_end(task.round_index)
        while len(self._given) > _GIVEN_KEPT:
            self._given.popitem(last=False)

    def _charge_released(self, board: Board, answered: int | None = None) -> None:
        """Charge the rounds the board released (sent update frames of) that are not ``answered``
        (the round whose update the step uses, charged when it is answered)."""
        info = board.info
        for round_index, done in board.take_released().items():
            if round_index == answered:
                continue
            if done is None or info is None:  # no report of its cycles came: modelled
                self.charge_unused(round_index, cycles=0, counter_hz=1, kind="model")
            else:
                self.charge_unused(round_index, cycles=done.cycles, counter_hz=info.counter_hz, kind=info.counter_kind)

    def charge_unused(self, round_index: int, *, cycles: int, counter_hz: int, kind: str) -> None:
        """Charge a round the board ran whose update is not sent (late, or refused for its content):
        its planned events, with the board's reported cycles (``kind`` "model": none reported, the
        task's steps modelled). Released is spent; a round already charged is not again."""
        given = self._given.get(round_index)
        if given is None or given.session != self._session:
            log.warning("node %d: the board sent an update of round %d, which this bridge did not give it in "
                        "this session; dropped", self.node, round_index)
            return
        ledger, writer = self._ledger(*given.session)
        if ledger.has_round(round_index):
            return
        measured = self.costs.measurement(  # type: ignore[attr-defined]
            steps=given.tau, cycles=cycles, counter_hz=counter_hz, kind=kind)
        self._log(ledger, writer, self.costs.charge(given.planned, measured))
        log.warning("node %d: round %d ran on the board but its update is not used: charged, not sent",
                    self.node, round_index)

    def _log_provision(self, sent_bytes: int) -> None:
        """Provisioning is setup traffic (the bridge loads the node's data): in the board's ledger
        at the setup round, on the serial line, no cost units."""
        if self._session is None:
            return
        ledger, writer = self._ledger(*self._session)
        event = CommunicationEvent(self.node, SETUP_ROUND, bytes_up=0, bytes_down=sent_bytes, measured=True)
        ledger.extend([event])
        if writer is not None:
            writer.write([event])

    def close(self) -> None:
        self._drop()
        super().close()


class _OnBoard:
    """The run's algorithm with its node step done by the board (everything else delegated)."""

    def __init__(self, algorithm: Any, agent: BridgeAgent):
        self._alg, self._agent = algorithm, agent

    def __getattr__(self, name: str) -> Any:
        return getattr(self._alg, name)

    def node_step(self, received: Mapping[str, np.ndarray], train: Split, node_ids: Sequence[int],
                  ctx: RoundContext) -> NodeResult:
        node = int(node_ids[0])
        try:
            task = self._alg.mcu_task(node, ctx)
        except ValueError as exc:
            raise UserError(str(exc)) from None
        (model,) = received.values()
        result = self._agent.run_on_board(task, model[0], train, task.n_classes,
                                          self._alg.planned_events(node, ctx))
        if not np.isfinite(result.update).all():
            self._agent.charge_unused(ctx.round_index, cycles=result.cycles, counter_hz=result.counter_hz,
                                      kind=result.counter_kind)
            raise BoardUnavailable(f"board on {self._agent.url} reported non-finite numbers in round "
                                   f"{ctx.round_index}; refused, a straggler this round")
        self._agent.costs.record(steps=result.steps, cycles=result.cycles,  # type: ignore[attr-defined]
                                 counter_hz=result.counter_hz, kind=result.counter_kind)
        return self._alg.mcu_result(result.update, train, node, ctx)
