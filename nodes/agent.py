"""The node agent: one node's side of a run, whatever carries its messages.

It holds the node's own data (a board loads or generates only its own samples), its own ledger
(privacy is accounted where the data lives) and runs the algorithm's node step for one node — the
same function the simulator runs for all nodes at once, so both give the same numbers.

A round arrives as a wire message (testbed.protocol); :meth:`NodeAgent.handle` returns the reply
and whom it is for. The transports (the MQTT node process, the emulated node host) only move bytes.
For an over-the-air algorithm (DWFL) a round takes two messages: the round, answered with the
node's transmit signal for the channel; then what the node received, answered with its new model.

Example::

    >>> from testbed import protocol, wire
    >>> from testbed.config import load_config_text, to_toml
    >>> cfg = load_config_text("[data]\\nnum_nodes = 2\\nsamples_per_node = 40\\ndim = 3\\n"
    ...                        "[dp_pasgd]\\nsteps = 4\\ntau = 2\\nbatch = 4\\nsigma = 1.0\\n")
    >>> agent = NodeAgent(node=1)
    >>> ask = wire.decode(protocol.round_("r", "s", 0, to_toml(cfg), {"state": np.zeros(8)}))
    >>> to, payload = agent.handle(ask)
    >>> reply = wire.decode(payload)
    >>> to, reply.kind, reply.tensors["params"].shape
    ('coordinator', 'update', (8,))
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from testbed import protocol, wire
from testbed.algorithms import Algorithm, from_config
from testbed.assemble import load_data, model_for
from testbed.budgets import Budgets, budgets_from_config
from testbed.config import Config, load_config_text
from testbed.data.federated import FederatedData
from testbed.ledger import Event, LedgerWriter, NodeLedger, read_ledger

from nodes.costs import NodeCosts

log = logging.getLogger(__name__)


@dataclass
class _Experiment:
    """What a node builds once per experiment file: its data, the algorithm, its budgets."""

    config: Config
    data: FederatedData
    algorithm: Algorithm
    budgets: Budgets


@dataclass(frozen=True)
class _Transmitted:
    """An over-the-air round between the node's signal and what it receives."""

    run: str
    session: str
    round_index: int
    experiment: _Experiment
    events: list[Event]


class NodeAgent:
    """One node of a run.

    Args:
        node: the node's global id.
        data_path: where this board keeps the data file (overrides the experiment's data.path).
        state_dir: where the node keeps its ledger between restarts (one CSV per run session);
            None keeps it in memory only.
        costs: how the node's seconds and joules are charged (meter, device profile, pacing);
            default: this machine's own profile.
    """

    def __init__(self, node: int, *, data_path: str | None = None, state_dir: Path | None = None,
                 costs: NodeCosts | None = None):
        self.node = int(node)
        self.data_path = data_path
        self.state_dir = Path(state_dir) if state_dir else None
        self.costs = costs or NodeCosts()
        self._experiments: dict[str, _Experiment] = {}
        self._ledgers: dict[str, tuple[NodeLedger, LedgerWriter | None]] = {}
        self._transmitted: _Transmitted | None = None

    def handle(self, msg: wire.Message) -> protocol.Reply | None:
        """The reply to a message: to a round, an update or a refusal for the coordinator (or the
        transmit signal for the channel); to a received signal, the update; None otherwise.

        Raises:
            WireError: a malformed round, or a received signal the node did not wait for.
        """
        if msg.kind == protocol.ROUND:
            return self._round(msg)
        if msg.kind == protocol.RECEIVED:
            return self._received(msg)
        return None

    def _round(self, msg: wire.Message) -> protocol.Reply:
        session = protocol.session_of(msg)
        config_text = msg.meta.get("config")
        if session is None or not isinstance(config_text, str) or "state" not in msg.tensors:
            raise wire.WireError("bad_header", "a round needs a session, a config and a state tensor")
        exp = self._experiment(config_text)
        ledger, writer = self._ledger(msg.run, session)
        r = msg.round
        if exp.algorithm.over_the_air:
            try:
                exp.algorithm.accept_shared(r, msg.tensors)
            except ValueError as exc:
                raise wire.WireError("bad_header", str(exc)) from None
        planned = exp.algorithm.planned_events(self.node, r)
        exceeded = None if ledger.has_round(r) else exp.budgets.would_exceed(ledger, planned)
        if exceeded is not None:
            log.info("node %d refuses round %d: %s", self.node, r, exceeded)
            return protocol.Reply(protocol.COORDINATOR, protocol.refused(
                msg.run, session, r, self.node, exceeded.budget, exceeded.would_be, exceeded.limit))
        with self.costs.measure() as measured:
            out = exp.algorithm.node_step(np.array(msg.tensors["state"]), exp.data.train, [self.node], r,
                                          exp.config.run.seed)
        events = self.costs.charge(out.events[0], measured[0])
        if not ledger.has_round(r):
            # Logged before it is sent: a node killed in between over-counts, never under-counts.
            ledger.extend(events)
            if writer is not None:
                writer.write(events)
        if exp.algorithm.over_the_air:
            self._transmitted = _Transmitted(msg.run, session, r, exp, events)
            return protocol.Reply(protocol.CHANNEL, protocol.signal(msg.run, session, r, self.node, out.params[0]))
        return protocol.Reply(protocol.COORDINATOR,
                              protocol.update(msg.run, session, r, self.node, {"params": out.params[0]}, events))

    def _received(self, msg: wire.Message) -> protocol.Reply:
        sent = self._transmitted
        session = protocol.session_of(msg)
        if sent is None or (sent.run, sent.session, sent.round_index) != (msg.run, session, msg.round):
            raise wire.WireError("wrong_round", f"received signal of round {msg.round} while waiting for "
                                                f"{'nothing' if sent is None else f'round {sent.round_index}'}")
        senders = protocol.senders_of(msg)
        if self.node not in senders or "received" not in msg.tensors:
            raise wire.WireError("bad_header", "a received signal needs this node among its senders and a tensor")
        self._transmitted = None
        model = sent.experiment.algorithm.finish(np.array(msg.tensors["received"])[None], len(senders))
        return protocol.Reply(protocol.COORDINATOR, protocol.update(msg.run, sent.session, msg.round, self.node,
                                                                    {"params": model[0]}, sent.events))

    def _experiment(self, config_text: str) -> _Experiment:
        key = hashlib.sha256(config_text.encode()).hexdigest()
        if key not in self._experiments:
            config = load_config_text(config_text, source="the coordinator's experiment")
            data = load_data(config, nodes=[self.node], path=self.data_path)
            algorithm = from_config(config, model_for(config, data), data)
            self._experiments = {key: _Experiment(config, data, algorithm, budgets_from_config(config))}
        return self._experiments[key]

    def _ledger(self, run: str, session: str) -> tuple[NodeLedger, LedgerWriter | None]:
        key = f"{run}-{session}"
        if key not in self._ledgers:
            ledger, writer = NodeLedger(self.node), None
            if self.state_dir is not None:
                path = self.state_dir / f"ledger-{key}-node{self.node}.csv"
                if path.exists():
                    ledger.extend(read_ledger(path))  # a restarted node keeps what it spent
                self.state_dir.mkdir(parents=True, exist_ok=True)
                writer = LedgerWriter(path)
            self.close()  # one session at a time: a new one means the old run is over
            self._ledgers = {key: (ledger, writer)}
        return self._ledgers[key]

    def close(self) -> None:
        """Close the files of the node's ledgers."""
        for _, writer in self._ledgers.values():
            if writer is not None:
                writer.close()

    def ledger(self, run: str, session: str) -> NodeLedger:
        """This node's ledger for a run session (for reports and tests)."""
        return self._ledger(run, session)[0]
