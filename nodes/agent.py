"""The node agent: one node's side of a run, whatever carries its messages.

It holds the node's own data (a board loads or generates only its own samples), its own ledger
(privacy is accounted where the data lives) and runs the algorithm's node step for one node — the
same function the simulator runs for all nodes at once, so both give the same numbers. It never
names an algorithm: what it receives and sends are the tensors the algorithm declares, and every
received tensor is checked against that declaration before it is used.

A round arrives as a wire message (testbed.rounds.protocol); :meth:`NodeAgent.handle` returns the reply
and whom it is for. The transports (the MQTT node process, the emulated node host) only move bytes.
For an over-the-air algorithm a round takes two messages: the round, answered with the node's
transmit signal for the channel; then what the node received, answered with its update.

Example::

    >>> import numpy as np
    >>> from testbed.rounds import protocol
    >>> from testbed.mqtt import wire
    >>> from testbed.assembly.config import load_config_text, to_toml
    >>> cfg = load_config_text("[data]\\nnum_nodes = 2\\nsamples_per_node = 40\\ndim = 3\\n"
    ...                        "[dp_pasgd]\\nsteps = 4\\ntau = 2\\nbatch = 4\\nsigma = 1.0\\n")
    >>> agent = NodeAgent(node=1)
    >>> ask = wire.decode(protocol.round_("r", "s", 0, to_toml(cfg), [0, 1], {"model": np.zeros(8)}))
    >>> to, payload = agent.handle(ask)
    >>> reply = wire.decode(payload)
    >>> to, reply.kind, reply.tensors["update"].shape
    ('coordinator', 'update', (8,))
    >>> to, payload = agent.handle(wire.decode(protocol.stop("r", "s", "completed", 0)))
    >>> protocol.report_of(wire.decode(payload)).rounds
    ((0, 1),)
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

import numpy as np

from nodes.costs import NodeCosts, charge_by_node
from nodes.shared_experiment import SharedExperiment
from nodes.release_record import ReleaseRecord, input_digest
from testbed.assembly import assemble
from testbed.mqtt import wire
from testbed.rounds import protocol
from testbed.algorithms.contract import (
    SETUP_ROUND,
    Algorithm,
    NodeResult,
    OverTheAir,
    RoundContext,
    TensorSpec,
    WithSetup,
    check_tensors,
    received_spec,
)
from testbed.accounting.budgets import Budgets, budgets_from_config
from testbed.assembly.assemble import load_data, model_for
from testbed.assembly.config import Config, load_config_text
from testbed.data.federated import FederatedData, Split
from testbed.data.lazy import LazyFederatedData
from testbed.errors import ConfigError
from testbed.learning.models import kind_of
from testbed.ledger.events import Event
from testbed.ledger.files import LedgerWriter, read_ledger, read_whole_rows
from testbed.ledger.node import NodeLedger, Totals, merge_sessions
from testbed.streams.node_secret import NODE_SECRET, RUN_SEED, NodeSecret
from testbed.util.memo import remember_last

log = logging.getLogger(__name__)

#: The messages a node answers with a step of the algorithm (stepped together on a host).
STEPPED = frozenset({protocol.ROUND, protocol.SETUP})


class NodeProtocol(Protocol):
    """What a node host drives: one node of some kind (a Python agent, a bridged board)."""

    node: int

    def handle(self, msg: wire.Message) -> protocol.Reply | None: ...

    def leaving_report(self) -> protocol.Reply | None: ...

    def close(self) -> None: ...


@dataclass
class _Experiment:
    """What a node builds once per experiment file: its data, the algorithm, its budgets."""

    key: str  # the experiment file's sha256
    config: Config
    data: FederatedData | LazyFederatedData
    algorithm: Algorithm
    budgets: Budgets

    @functools.cached_property
    def over_the_air(self) -> bool:
        """Whether the algorithm exchanges over the air (asked once: a check against a runtime
        Protocol walks its members, and a host asks for each node every round)."""
        return isinstance(self.algorithm, OverTheAir)

    @functools.cached_property
    def downlink_spec(self) -> dict[str, TensorSpec]:
        """The algorithm's declared downlink (built once, not once per node and round)."""
        return self.algorithm.downlink_spec()


@dataclass(frozen=True)
class _Admitted:
    """A round a node takes part in, its downlink checked and within its budgets."""

    msg: wire.Message
    session: str | None
    experiment: _Experiment
    ledger: NodeLedger
    writer: LedgerWriter | None
    ctx: RoundContext
    digest: str  # of the step's input (nodes.release_record): what its release is recorded on


@dataclass(frozen=True)
class _Released:
    """The replies a node sent for the last round (or setup) it released in a session, by the kind
    of message they answered (a round or setup; an over-the-air round's received signal): what a
    second ask of that round gets again, byte for byte, instead of a second computation."""

    run: str
    session: str | None
    round_index: int
    replies: dict[str, protocol.Reply]


@dataclass(frozen=True)
class _Transmitted:
    """An over-the-air round between the node's signal and what it receives."""

    run: str
    session: str
    ctx: RoundContext
    experiment: _Experiment
    carry: dict
    events: list[Event]
    metrics: dict[str, float]


class NodeAgent:
    """One node of a run.

    Args:
        node: the node's global id.
        data_path: where this board keeps the data file (overrides the experiment's data.path).
        state_dir: where the node keeps its ledger between restarts (one CSV per run session);
            None keeps it in memory only.
        costs: how the node's seconds and joules are charged (meter, device profile, pacing);
            default: this machine's own profile.
        shared: the experiment of all the nodes of its emulated host, for their stacked steps;
            None: the node steps on its own.
        secret: the board's secret (testbed.streams.node_secret.load_or_make), which keys its private
            draws; None: an emulated node, whose draws come from the run's seed (reproducible).
            It stays in this process: the node tells the coordinator only which kind it uses.
    """

    def __init__(self, node: int, *, data_path: str | None = None, state_dir: Path | None = None,
                 costs: NodeCosts | None = None, shared: SharedExperiment | None = None,
                 secret: NodeSecret | None = None):
        self.node = int(node)
        self.secret = secret
        self.randomness = NODE_SECRET if secret is not None else RUN_SEED
        self.data_path = data_path
        self.state_dir = Path(state_dir) if state_dir else None
        self.costs = costs or NodeCosts()
        self.shared = shared
        self._experiments: dict[str, _Experiment] = {}
        self._ledgers: dict[str, tuple[NodeLedger, LedgerWriter | None]] = {}
        self._session: tuple[str, str] | None = None  # (run, session) of the ledger it keeps now
        self._transmitted: _Transmitted | None = None
        self._released: _Released | None = None
        self.releases = ReleaseRecord(self.node, self.state_dir)

    def handle(self, msg: wire.Message) -> protocol.Reply | None:
        """The reply to a message: to a round, an update or a refusal for the coordinator (or the
        transmit signal for the channel); to a received signal, the update; to a setup, the setup
        update; to a prepare, ``ready`` once the experiment is built; None otherwise (and to a round the node is not expected in).

        Raises:
            WireError: a malformed message, or a received signal the node did not wait for.
        """
        if msg.kind in STEPPED:
            return self._step(msg)
        if msg.kind == protocol.RECEIVED:
            return self._received(msg)
        if msg.kind == protocol.STOP:
            return self._report(msg)
        if msg.kind == protocol.PREPARE:
            return self._prepare(msg)
        return None

    def _prepare(self, msg: wire.Message) -> protocol.Reply | None:
        """The answer to a prepare: the experiment built (data loaded, model built), then ``ready``
        if the node is expected (an unexpected node builds it too: it may be asked later)."""
        config_text = protocol.config_of(msg)  # WireError without a session and a config
        expected = protocol.expected_of(msg)
        exp = self._experiment(config_text)
        if self.node not in expected:
            return None
        return protocol.Reply(protocol.COORDINATOR, protocol.ready(msg.run, protocol.session_of(msg), self.node,
                                                                   exp.key, self.randomness))

    def _context(self, msg: wire.Message, exp: _Experiment, round_index: int) -> RoundContext | None:
        expected = protocol.expected_of(msg)
        if self.node not in expected:
            return None  # an emulated straggler this round: it does nothing, costs nothing
        if self.secret is None:
            return _public_context(msg, round_index, exp.config.run.seed, exp.config.data.num_nodes)
        secrets = {self.node: self.secret.for_run(_scope(msg.run, exp.key))}
        return RoundContext(round_index, exp.config.run.seed, exp.config.data.num_nodes, expected, secrets=secrets)

    def _step(self, msg: wire.Message) -> protocol.Reply | None:
        outcome = step_nodes([self], [msg])[0]
        if isinstance(outcome, Exception):
            raise outcome
        return outcome

    def _admit(self, msg: wire.Message) -> _Admitted | protocol.Reply | None:
        """A round or setup checked before the step: the node's part in it (None: not expected);
        of a round, its charges and downlink against the declaration and its budgets (a refusal).
        Every check comes before the ledger is touched: a refused message charges nothing."""
        session = protocol.session_of(msg)
        exp = self._experiment(protocol.config_of(msg))
        alg = exp.algorithm
        setup = msg.kind == protocol.SETUP
        if setup and not (isinstance(alg, WithSetup) and alg.has_setup):
            raise wire.WireError("bad_header", "a setup for an algorithm without one")
        charges = [] if setup else protocol.charges_of(msg, self.node)  # a setup carries none
        r = SETUP_ROUND if setup else msg.round
        ctx = self._context(msg, exp, r)
        if ctx is not None and not setup:  # a setup has no downlink to check
            problem = _downlink_problem(msg, exp.downlink_spec)
            if problem is not None:
                raise wire.WireError("bad_header", f"round {r} downlink: {problem}")
        ledger, writer = self._ledger(msg.run, session)
        self._take_charges(charges, ledger, writer)
        if ctx is None:
            return None
        if ledger.has_round(r):  # released already in this session: never computed twice
            return self._again(msg, session, r)
        # Released in another session of the run (a resumed coordinator asks again): computed again
        # only on the input it was released on, which gives the same release again; on another
        # model, whose release would share its noise, nothing (the node straggles the round).
        digest = _input_digest(msg, r, exp.key, ctx.expected)
        if not self.releases.allows(_scope(msg.run, exp.key), msg.kind, r, digest):
            return None
        if setup:
            return _Admitted(msg, session, exp, ledger, writer, ctx, digest)
        if exp.over_the_air:
            alg.use_channel(msg.tensors, r)  # type: ignore[attr-defined]
        exceeded = None if not exp.budgets.any else \
            exp.budgets.would_exceed(ledger, alg.planned_events(self.node, ctx))
        if exceeded is not None:
            log.info("node %d refuses round %d: %s", self.node, r, exceeded)
            return protocol.Reply(protocol.COORDINATOR, protocol.refused(
                msg.run, session, r, self.node, exceeded.budget, exceeded.would_be, exceeded.limit))
        return _Admitted(msg, session, exp, ledger, writer, ctx, digest)

    def _again(self, msg: wire.Message, session: str | None, round_index: int) -> protocol.Reply | None:
        """The answer to a second ask of a round (or setup) this node released in this session (a
        duplicate, a replay, a forgery, a coordinator asking again): the reply it sent, the same
        bytes, if it was the last round it released in this process; else nothing. Never a second
        computation: its noise is drawn from the round's stream, and two releases sharing one draw
        would give away their difference unnoised (issue 39)."""
        kept = self._released
        if kept is not None and (kept.run, kept.session, kept.round_index) == (msg.run, session, round_index):
            reply = kept.replies.get(msg.kind)
            if reply is not None:
                log.info("node %d: round %d asked again: its reply sent again, not recomputed", self.node, round_index)
                return reply
        log.warning("node %d: round %d asked again, released already in this session: not answered", self.node,
                    round_index)
        return None

    def _keep(self, msg: wire.Message, session: str | None, round_index: int, reply: protocol.Reply) -> protocol.Reply:
        """``reply`` to ``msg`` (of round ``round_index``), kept for a second ask of it (:meth:`_again`)."""
        kept = self._released
        if kept is None or (kept.run, kept.session, kept.round_index) != (msg.run, session, round_index):
            kept = self._released = _Released(msg.run, session, round_index, {})
        kept.replies[msg.kind] = reply
        return reply

    def _log_release(self, admitted: _Admitted, charged: dict[int, list[Event]]) -> list[Event]:
        """A round's release recorded (write-ahead), its events (``charged``: by node, charged with
        the step's cost) logged."""
        msg, events = admitted.msg, charged[self.node]
        self.releases.record(_scope(msg.run, admitted.experiment.key), msg.kind, admitted.ctx.round_index, admitted.digest)
        return self._log(admitted.ledger, admitted.writer, events)

    def _transmit(self, admitted: _Admitted, out: NodeResult, events: list[Event]) -> protocol.Reply:
        """The reply to an admitted over-the-air round, its release logged (``events``): its row of
        ``out``'s signal to the channel, what it keeps for the channel's answer kept."""
        msg, session, r = admitted.msg, admitted.session, admitted.ctx.round_index
        i = out.node_ids.index(self.node)
        metrics = {name: float(value[i]) for name, value in out.metrics.items()}
        carry = {name: value[i:i + 1] for name, value in out.carry.items()}
        self._transmitted = _Transmitted(msg.run, session, admitted.ctx, admitted.experiment, carry, events, metrics)
        return self._keep(msg, session, r, protocol.Reply(protocol.CHANNEL, protocol.signal(
            msg.run, session, r, self.node, out.tensors["signal"][i])))

    def _received(self, msg: wire.Message) -> protocol.Reply | None:
        sent = self._transmitted
        session = protocol.session_of(msg)
        kept = self._released
        if sent is None and kept is not None and (kept.run, kept.session, kept.round_index) == (msg.run, session, msg.round):
            return self._again(msg, session, msg.round)  # its update went out already: the same bytes
        if sent is None or (sent.run, sent.session, sent.ctx.round_index) != (msg.run, session, msg.round):
            raise wire.WireError("wrong_round", f"received signal of round {msg.round} while waiting for "
                                                f"{'nothing' if sent is None else f'round {sent.ctx.round_index}'}")
        senders = protocol.senders_of(msg)
        if self.node not in senders or not set(senders) <= set(sent.ctx.expected):
            raise wire.WireError("bad_header", "a received signal needs this node among its senders, all expected")
        alg = sent.experiment.algorithm
        assert isinstance(alg, OverTheAir)
        spec = {"received": received_spec(alg.channel, sent.ctx)}
        problem = check_tensors(spec, msg.tensors)
        if problem is not None:
            raise wire.WireError("bad_header", f"received signal: {problem}")
        digest = _input_digest(msg, msg.round, sent.experiment.key, tuple(senders))
        if not self.releases.allows(_scope(msg.run, sent.experiment.key), msg.kind, msg.round, digest):
            return None  # its update was released on another signal in an earlier session
        ctx = sent.ctx.closed(senders)
        try:  # on a copy of what it carries: a refused signal leaves the node waiting for the right one
            out = alg.node_finish({k: v.copy() for k, v in sent.carry.items()}, msg.tensors["received"][None].copy(),
                                  [self.node], ctx)
        except ValueError as exc:  # e.g. fewer senders than an exchange needs
            raise wire.WireError("bad_header", f"received signal: {exc}") from None
        self._transmitted = None
        self.releases.record(_scope(msg.run, sent.experiment.key), msg.kind, msg.round, digest)
        return self._keep(msg, session, msg.round, protocol.Reply(protocol.COORDINATOR, protocol.update_draft(
            msg.run, sent.session, msg.round, self.node, out.rows(self.node), sent.events, sent.metrics)))

    def _report(self, msg: wire.Message) -> protocol.Reply:
        """The answer to a stop: this node's own ledger of the session, for the coordinator to charge
        what it released but the coordinator never received (an empty one if it took no part)."""
        session = protocol.session_of(msg)
        if session is None:
            raise wire.WireError("bad_header", "a stop needs a session")
        ledger = self._ledgers.get(f"{msg.run}-{session}", (NodeLedger(self.node), None))[0]
        earlier = protocol.earlier_sessions_of(msg)
        return protocol.Reply(protocol.COORDINATOR,
                              protocol.ledger_report(msg.run, session, msg.round, self.node, ledger,
                                                     self._run_totals(msg.run, session, ledger, earlier)))

    def leaving_report(self) -> protocol.Reply | None:
        """This node's own ledger of the session it takes part in, sent unasked when it leaves
        before the run's stop (a signal, its host shutting down): what its answer to the stop would
        say, so that the coordinator need not call its figures unconfirmed. None before it logged
        anything of a session."""
        if self._session is None:
            return None
        run, session = self._session
        ledger = self._ledgers[f"{run}-{session}"][0]
        intervals = ledger.rounds_logged.intervals
        last = intervals[-1][1] - 1 if intervals else 0  # the report's round: the last it logged
        return protocol.Reply(protocol.COORDINATOR,
                              protocol.ledger_report(run, session, max(last, 0), self.node, ledger))

    def _run_totals(self, run: str, session: str, ledger: NodeLedger, earlier: Sequence[str]) -> Totals:
        """What this node spent in this session and in the run's ``earlier`` sessions (the stop
        names them) that it kept in its state directory, merged as the coordinator charges a
        resumed run (testbed.ledger.node.merge_sessions): what a killed session spent and the
        coordinator never heard is then in the figures it raises its summary to. A run id alone
        does not tell a run's sessions from another run of the same id, hence the stop's list.
        Without a state directory or earlier sessions: this session's."""
        if self.state_dir is None or not earlier:
            return ledger.totals
        sessions = []
        for name in (*dict.fromkeys(earlier), session):
            path = self.state_dir / f"ledger-{run}-{name}-node{self.node}.csv"
            if not path.exists():
                continue
            try:
                sessions.append(read_whole_rows(path))
            except (OSError, ValueError) as exc:  # a damaged file of its own: this report without it
                log.warning("node %d: its ledger %s is unreadable (%s); reported without it", self.node, path.name, exc)
        return merge_sessions(self.node, sessions).totals if sessions else ledger.totals

    def _log(self, ledger: NodeLedger, writer: LedgerWriter | None, events: list[Event]) -> list[Event]:
        """Log the step's events before anything is sent, on disk (fsynced) when the node keeps a
        state directory: a node killed (or losing power) in between over-counts, never under-counts.
        A round is stepped once per session (:meth:`_admit`'s gate), so it is logged once."""
        ledger.extend(events)
        if writer is not None:
            writer.write(events)
            writer.mark()  # fsync: the write-ahead record outlives a power cut, not only a kill
        return events

    def _take_charges(self, charges: list[Event], ledger: NodeLedger, writer: LedgerWriter | None) -> None:
        """Events the server issued on this node's behalf since its last round (a round's checked
        ``charges``), logged once."""
        fresh = [e for e in charges if not ledger.has_server_events(e.round)]
        if fresh:
            ledger.extend(fresh)
            if writer is not None:
                writer.write(fresh)

    def _experiment(self, config_text: str) -> _Experiment:
        """The experiment a round's text describes, built once. The text is part of the message:
        one that does not make an experiment (not TOML, a key out of range, a batch larger than the
        node's data) is a bad message (WireError); a missing data file stays the node's error."""
        key = protocol.experiment_key(config_text)
        if key not in self._experiments:
            try:
                self._experiments = {key: self._build(key, config_text)}
            except ConfigError as exc:
                raise wire.WireError("bad_header", str(exc)) from None
        return self._experiments[key]

    def _build(self, key: str, config_text: str) -> _Experiment:
        if self.shared is not None:
            config = self.shared.config(key, config_text)
            data = self.shared.data_of(key, config, self.node)
        else:
            config = load_config_text(config_text, source="the coordinator's experiment")
            data = load_data(config.data, config.run.seed, nodes=[self.node], path=self.data_path)
        algorithm = assemble.build_algorithm(config, model_for(config.model, data, config.run.seed), data)
        return _Experiment(key, config, data, algorithm, budgets_from_config(config.budget, config.privacy))

    def _ledger(self, run: str, session: str | None) -> tuple[NodeLedger, LedgerWriter | None]:
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
            self._session = None if session is None else (run, session)
        return self._ledgers[key]

    def close(self) -> None:
        """Close the files of the node's ledgers."""
        for _, writer in self._ledgers.values():
            if writer is not None:
                writer.close()

    def ledger(self, run: str, session: str) -> NodeLedger:
        """This node's ledger for a run session (for reports and tests)."""
        return self._ledger(run, session)[0]


def step_nodes(agents: Sequence[NodeAgent], msgs: Sequence[wire.Message]) -> list[protocol.Reply | None | Exception]:
    """Round and setup messages (``msgs[i]`` received by ``agents[i]``, kinds in :data:`STEPPED`),
    the steps of the nodes that take part run at once: one algorithm ``node_step`` (``setup_step``)
    over their stacked rows, as in sim (the contract makes that equal to one node at a time). Each
    node still checks its own message and budgets, logs its own events and answers on its own; the
    step's measured cost is shared equally among the nodes stepped together.

    Nodes are stepped together when they share a :class:`SharedExperiment` (an emulated host's)
    and have the same experiment file, costs and round (or setup); an over-the-air round (each node's
    algorithm holds the channel it was told), a model that does not stack exactly (a torch network,
    float32: its vmapped step over M nodes rounds differently from M = 1, and sim and MQTT would
    drift apart: testbed.learning.models.ModelKind), paced boards (each
    waits its own board time) and nodes without a shared experiment step one at a time.

    Returns:
        Per message: the reply, None (no reply: a node not expected), or the exception its
        node's check or step raised (the caller logs it; that node straggles, the others answer).
    """
    outcomes: list[protocol.Reply | None | Exception] = [None] * len(msgs)
    groups: dict[tuple, list[tuple[int, NodeAgent, _Admitted]]] = {}
    # A node's second copy of a round in one batch (a duplicate the host gathered with the first) is
    # admitted before the first is logged: it gets the first one's reply, never a step of its own.
    first: dict[tuple, int] = {}
    copies: dict[int, int] = {}
    for i, (agent, msg) in enumerate(zip(agents, msgs)):
        try:
            admitted = agent._admit(msg)
        except Exception as exc:  # noqa: BLE001  handed to the caller, which logs it per node
            outcomes[i] = exc
            continue
        if not isinstance(admitted, _Admitted):
            outcomes[i] = admitted
            continue
        once = (id(agent), admitted.msg.run, admitted.session, admitted.ctx.round_index)
        if once in first:
            copies[i] = first[once]
            continue
        first[once] = i
        exp, ctx = admitted.experiment, admitted.ctx
        paced = isinstance(agent.costs, NodeCosts) and agent.costs.pacer.enabled
        alone = exp.over_the_air or not kind_of(exp.config.model.kind).stacks_exactly or paced \
            or agent.shared is None or agent.secret is not None
        key = (i,) if alone else (exp.key, id(agent.shared), id(agent.costs), admitted.msg.run, admitted.session,
                                  ctx.round_index, ctx.expected, tuple(admitted.msg.tensors))
        groups.setdefault(key, []).append((i, agent, admitted))
    for group in groups.values():
        try:
            replies = _step_together([agent for _, agent, _ in group], [admitted for _, _, admitted in group])
        except Exception as exc:  # noqa: BLE001  every node of the group failed on it
            replies = [exc] * len(group)
        for (i, _, _), reply in zip(group, replies):
            outcomes[i] = reply
    for i, j in copies.items():
        outcomes[i] = outcomes[j] if isinstance(outcomes[j], protocol.Reply) else None
    return outcomes


def _step_together(agents: list[NodeAgent], admitted: list[_Admitted]) -> list[protocol.Reply | Exception]:
    """One node_step (setup_step) for every admitted round (setup) of ``agents`` (one experiment,
    one costs, one round)."""
    first = admitted[0]
    exp, ctx, shared = first.experiment, first.ctx, agents[0].shared
    ids = [agent.node for agent in agents]
    costs = agents[0].costs
    with costs.measure() as measured:
        if first.msg.kind == protocol.SETUP:
            out = exp.algorithm.setup_step(_train(exp.data, ids), ids, ctx) if len(ids) == 1 else \
                shared.setup_step(exp.key, exp.config, ids, ctx)  # type: ignore[union-attr,attr-defined]
        else:
            received = {name: _stacked([a.msg.tensors[name] for a in admitted]) for name in first.msg.tensors}
            out = exp.algorithm.node_step(received, _train(exp.data, ids), ids, ctx) if len(ids) == 1 else \
                shared.step(exp.key, exp.config, received, ids, ctx)  # type: ignore[union-attr]
    share = whole = measured[0]
    if len(ids) > 1:
        share = dataclasses.replace(whole, seconds=whole.seconds / len(ids), energy_j=whole.energy_j / len(ids))
    # Every node's release logged, then every reply (the same code in a row); what raised is that node's.
    charged = charge_by_node(costs, out.events, out.node_ids, share)
    logged = [_or_raised(agent._log_release, a, charged) for agent, a in zip(agents, admitted)]
    if exp.over_the_air:
        return [e if isinstance(e, Exception) else _or_raised(agent._transmit, a, out, e)
                for agent, a, e in zip(agents, admitted, logged)]
    return _updates(agents, admitted, out, logged)


def _updates(agents: list[NodeAgent], admitted: list[_Admitted], out: NodeResult,
             logged: list[list[Event] | Exception]) -> list[protocol.Reply | Exception]:
    """Each node's update (or setup update) to the round its group stepped, its release logged
    (``logged``: its events, or what raised), kept for a second ask: its row of ``out``, drafted
    with the group's others (protocol.update_drafts: one check of what the rows share). A group is
    one run, session, round and kind (step_nodes)."""
    first = admitted[0]
    ok = [k for k, events in enumerate(logged) if not isinstance(events, Exception)]
    rows = [out.node_ids.index(agents[k].node) for k in ok]
    every = rows == list(range(len(out.node_ids)))  # the usual group: its rows as they are, no copy
    kind = protocol.SETUP_UPDATE if first.msg.kind == protocol.SETUP else protocol.UPDATE
    drafts = protocol.update_drafts(
        first.msg.run, first.session, first.ctx.round_index, [agents[k].node for k in ok],
        {name: value if every else value[rows] for name, value in out.tensors.items()}, [logged[k] for k in ok],
        {name: value if every else value[rows] for name, value in out.metrics.items()}, kind)
    replies: list[protocol.Reply | Exception] = list(logged)  # type: ignore[arg-type]  # the raised kept
    for k, draft in zip(ok, drafts):
        a = admitted[k]
        replies[k] = draft if isinstance(draft, Exception) else \
            agents[k]._keep(a.msg, a.session, a.ctx.round_index, protocol.Reply(protocol.COORDINATOR, draft))
    return replies


def _or_raised(fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001  that node's reply alone (e.g. a non-finite row), for the caller
        return exc


def _train(data: FederatedData | LazyFederatedData, node_ids: list[int]) -> Split:
    """The training rows of ``node_ids``: all of ``data``'s (a node's own), made (kept by its host) if lazy."""
    return data.nodes(node_ids, ("train",)).train if isinstance(data, LazyFederatedData) else data.train


@remember_last  # a host's nodes read one broadcast: one context for every node without a secret
def _public_context(msg: wire.Message, round_index: int, seed: int, num_nodes: int) -> RoundContext:
    """The round context of ``msg`` for a node whose draws the run's seed keys (no secret of its own)."""
    return RoundContext(round_index, seed, num_nodes, protocol.expected_of(msg))


@remember_last  # a host's nodes read one broadcast: checked once
def _downlink_problem(msg: wire.Message, spec: dict[str, TensorSpec]) -> str | None:
    """Why ``msg``'s tensors are not the downlink ``spec`` (an algorithm's declaration); None if they are."""
    return check_tensors(spec, msg.tensors)


def _scope(run: str, experiment_key: str) -> str:
    """What a node's releases are kept apart by: the run id and its experiment (a SHA-256 hex).
    Run ids are names a coordinator reuses (a board's second experiment may carry the same one), so
    each experiment of a run id has its own record of releases and, on a board with a secret, its
    own noise (NodeSecret.for_run): another experiment never shares a draw with this one, and within
    one a round is released on one input only (nodes.release_record)."""
    return f"{run}-{experiment_key[:32]}"


@remember_last  # a host's nodes read one broadcast: its model hashed once
def _input_digest(msg: wire.Message, round_index: int, experiment_key: str, nodes: tuple[int, ...]) -> str:
    """nodes.release_record.input_digest of ``msg`` (a round, setup or received signal)."""
    return input_digest(msg.kind, round_index, experiment_key, nodes, msg.tensors)


def _stacked(rows: list[np.ndarray]) -> np.ndarray:
    """(M, ...) of M nodes' received rows: a read-only broadcast view when every node received one
    array (a broadcast round), as sim's downlink gives."""
    if all(row is rows[0] for row in rows):
        return np.broadcast_to(rows[0], (len(rows),) + rows[0].shape)
    return np.stack(rows)

