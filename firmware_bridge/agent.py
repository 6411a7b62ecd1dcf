"""The bridge as a node: a board behind a serial line, presented to the run as an MQTT node.

:class:`BridgeAgent` is a :class:`nodes.agent.NodeAgent` (so the experiment, the budgets, the ledger
in the bridge's state dir and the replies are the agent's own) whose node step is done by the
board: the algorithm, built here for the planned events and the budget checks, says the board's
task (``mcu_task``), the board runs it, and the algorithm turns the board's update into the step's
result (``mcu_result``). nodes.host.serve drives it through its ``agent_factory``, so the board has
its own MQTT identity under the ACL, reconnects and all.

A board that resets, goes silent or is unplugged during a round, refuses the round, or reports a
non-finite or malformed update makes this node a straggler for that round (one error line, nothing
charged, nothing sent); at the next round the bridge reopens the line, says hello, provisions the
data again if the board lost it, and the node is back.

Example (``nodes.host.serve`` builds one per node id)::

    serve(broker, run, [3], agent_factory=lambda n: BridgeAgent(n, "/dev/ttyACM0", state_dir=d))
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from firmware_bridge import messages as m
from firmware_bridge.board import Board, BoardResult
from firmware_bridge.costs import BoardCosts
from firmware_bridge.link import BoardRefused, BoardReset, Link
from firmware_bridge.port import open_port
from firmware_bridge.profiles import load_mcu_profile
from nodes.agent import NodeAgent
from testbed import protocol, wire
from testbed.algorithms.contract import SETUP_ROUND, NodeResult, RoundContext
from testbed.algorithms.mcu_logistic import McuTask, RunsOnMcu
from testbed.data.federated import Split
from testbed.errors import UserError
from testbed.ledger import CommunicationEvent

log = logging.getLogger(__name__)


class BoardUnavailable(UserError):
    """This round cannot run on the board (the node straggles); the message says why."""


class BridgeAgent(NodeAgent):
    """One node whose step runs on a board.

    Args:
        node: the node's global id.
        url: the board's serial line (any pyserial URL).
        state_dir: where the board's ledger is kept (on the bridge host: privacy is accounted
            where the data is, and the bridge holds the data it provisions).
        profile: the board's profile (firmware_bridge/boards.toml); default: what its hello says.
        baudrate: the line's rate (ignored by pseudo-terminals and sockets).
    """

    def __init__(self, node: int, url: str, *, state_dir: Path | None = None, profile: str | None = None,
                 baudrate: int = 115200):
        super().__init__(node, state_dir=state_dir, costs=BoardCosts(profile or "rp2040"))  # type: ignore[arg-type]
        self.url, self.baudrate, self.profile = url, baudrate, profile
        self.board: Board | None = None
        self._session: tuple[str, str | None] | None = None

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
            board = Board(link)
            try:
                info = board.hello()
            except UserError:
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

    def run_on_board(self, task: McuTask, params: np.ndarray, train: Split, n_classes: int) -> BoardResult:
        """One round on the board: line, hello, data, task; BoardUnavailable if it cannot be."""
        try:
            board = self._connect()
            try:  # a boot the board announced between rounds: it lost its data, not this round
                while board.link.receive(0.0) is not None:
                    pass
            except BoardReset:
                board.dataset = 0
            sent = board.provision(train.x, train.y, n_classes)
            if sent:
                self._log_provision(sent)
            return board.run(task, params)
        except BoardRefused as exc:
            if exc.status == m.NO_DATA and self.board is not None:
                self.board.dataset = 0
            raise BoardUnavailable(f"board on {self.url}: {exc}; a straggler this round") from None
        except BoardReset:
            if self.board is not None:
                self.board.dataset = 0
            raise BoardUnavailable(f"board on {self.url} reset mid-round; a straggler this round") from None
        except UserError as exc:  # the line is gone, or the board went silent: reopen next round
            self._drop()
            raise BoardUnavailable(f"board on {self.url}: {exc}; a straggler this round") from None

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
        result = self._agent.run_on_board(task, model[0], train, task.n_classes)
        if not np.isfinite(result.update).all():
            raise BoardUnavailable(f"board on {self._agent.url} reported non-finite numbers in round "
                                   f"{ctx.round_index}; refused, a straggler this round")
        self._agent.costs.record(steps=result.steps, cycles=result.cycles,  # type: ignore[attr-defined]
                                 counter_hz=result.counter_hz, kind=result.counter_kind)
        return self._alg.mcu_result(result.update, train, node, ctx)
