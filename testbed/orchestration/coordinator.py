"""The coordinator's side of an MQTT run: starts (or finds) the broker and the nodes, sends each
round, collects the replies until every expected node answered or the round's deadline passed.

What each node receives is what the algorithm's ``downlink`` declares: once on the broadcast topic
when every node gets the same tensors, else on each node's own downlink with its own rows; the
coordinator never indexes the algorithm's state. Every reply is checked against what the algorithm
declares before it is used: the uplink tensors (names, shapes, dtypes, finiteness, a norm bound
where the algorithm knows one) and the events (those the round's plan says, nothing less); a reply
that fails is that node's straggle for the round, logged with its reason.

A node that misses the deadline, goes offline (its last will), or sends what fails the checks is a
straggler for that round; it rejoins with the next round, which carries everything it needs. An
emulated straggler (the ``[stragglers]`` model) is not asked, so it costs no wall time. Replies
from another session or a second copy of one node's reply are logged and dropped; a reply of an
earlier round that arrives late is still charged (released is spent), at warning level.

A broker outage does not end the run at once: while no publish is acknowledged, each round waits
up to its timeout for the broker, then closes with every expected node straggling ("offline"); no
publish waits longer than a round's timeout. Past ``mqtt.outage_limit_s`` without the broker the
run stops with one line (failed; ``testbed run --resume`` continues it). A round whose publish was
not acknowledged may still reach the nodes when the broker is back (the client resends it): its
replies are charged as late ones, however many rounds later.

Over-the-air algorithms put a channel emulator (testbed.orchestration.channel_emulator, a client of its own
started here and built from the algorithm's channel half) between the nodes; it tells the
coordinator which nodes really transmitted, and each of them is charged for its release.

:class:`MqttNodes` is this module's rounds (prepare, setup, round, outcome, close) made of parts
that each do one job: the emulated hosts (testbed.orchestration.emulated_hosts), the broker
outage rule (broker_outages), the network thread's inbox (coordinator_inbox), the checks of what
a node sends and the plan a silent release is charged (reply_checks); who may speak on the broker
is run_access's, what a round's releases are charged charging's.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import secrets
import shutil
import threading
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from testbed.algorithms.contract import (
    SETUP_ROUND,
    Algorithm,
    NodeResult,
    OverTheAir,
    RoundContext,
    State,
    WithSetup,
    metric_specs,
    round_signal_spec,
    round_uplink_spec,
)
from testbed.assembly.config import LinksSection, MqttSection, NodesSection
from testbed.errors import UserError
from testbed.ledger.events import Event
from testbed.ledger.node import RoundSet
from testbed.mqtt import wire
from testbed.mqtt import auth, topics
from testbed.mqtt.broker import parse_broker_url
from testbed.mqtt.brokers import registry as brokers
from testbed.mqtt.client import Inbound, MqttClient
from testbed.orchestration import charging
from testbed.orchestration.broker_outages import BrokerOutages
from testbed.orchestration.channel_emulator import ChannelEmulator
from testbed.orchestration.coordinator_inbox import REAP_INTERVAL_S, Collection, Inbox
from testbed.orchestration.emulated_hosts import EmulatedHosts, Host
from testbed.orchestration.links import LinkRounds, Links
from testbed.orchestration.nodes_api import Closing, RoundOutcome
from testbed.orchestration.reply_checks import ReplyChecks, node_bounds
from testbed.orchestration.run_access import broker_access, run_keys, user_credentials
from testbed.rounds import protocol
from testbed.streams.node_secret import NODE_SECRET, RUN_SEED, SERVER_SECRET, NodeSecret
from testbed.util.forked import ForkedCommand, can_fork
from testbed.util.oneline import shown_ids
from testbed.util.starting import CAP_S, StillWorking, process_progress

log = logging.getLogger(__name__)

_SIGNAL_SHARE = 0.8  # of an over-the-air round's deadline, for the channel to collect the signals
# The replay window of the coordinator's client: a reply is charged however late (the coordinator
# itself charges a node's round once), so no round is too old for it; memory stays bounded by the
# guard's total of keys.
_WHOLE_RUN_ROUNDS = 2**62
_REPORT_WAIT_S = 10.0  # at most, after the stop, for the nodes' ledger reports (and a round's timeout)
_RECONNECT_MAX_S = 5.0  # the coordinator retries a lost broker at least this often (one client)


def _acked() -> bool:
    """A round's publishes, each acknowledged already (what :meth:`MqttNodes._send` returns)."""
    return True


def _unacked() -> bool:
    """A round's publish the broker did not acknowledge (an outage)."""
    return False


class MqttNodes(EmulatedHosts, BrokerOutages, ReplyChecks, Inbox):
    """The nodes of a run, reached over MQTT.

    Args:
        mqtt: the ``[mqtt]`` section (how to reach the broker and the nodes).
        nodes: the ``[nodes]`` section (the emulated boards' profile and pacing).
        config_toml: the resolved experiment file every round carries.
        node_ids: the run's nodes.
        algorithm: the run's algorithm (what to send, what to expect back).
        seed: the run's seed.
        quiet: no broker/host chatter on stderr.
        links: the ``[links]`` section: each emulated host behind a link of its own
            (testbed.orchestration.links), timed each round (:class:`LinkRounds`).
        server_secret: gives the coordinator's secret (the run directory's, testbed.streams.node_secret.
            SERVER_KEY_FILE), asked once the prepare is over if a node's ready said it has a
            secret of its own: the server's private draws (RoundContext.server_secret) are then
            keyed by it for the session. None, or no node with a secret: the run seed's, as in sim.
    """

    def __init__(self, mqtt: MqttSection, nodes: NodesSection, config_toml: str, node_ids: Sequence[int],
                 algorithm: Algorithm, *, seed: int, quiet: bool = False, links: LinksSection | None = None,
                 server_secret: Callable[[], NodeSecret] | None = None):
        self._init_bookkeeping(mqtt, nodes, config_toml, node_ids, algorithm, seed)
        self._make_server_secret = server_secret
        m = mqtt
        # Read first: a credentials file refused after the broker started would leave it running.
        username, password = user_credentials(m.credentials, "coordinator")
        self.keys = run_keys(m, self.run, self.node_ids)
        # The run's own broker when none is given (mqtt.broker), stopped by close(); its registration
        # says how clients best speak to it.
        managed = brokers.choose(m.broker) if m.broker_url is None else None
        self._broker: brokers.ManagedBroker | None = None
        try:
            if links is not None and links.netns:
                self._open_links(links, managed)
            if managed is not None:
                access = broker_access(m, self.node_ids) if managed.access else None
                also = tuple(link.broker_address for link in self._links.links) if self._links else ()
                self._broker = managed.make(brokers.BrokerOptions(
                    nodes=len(self.node_ids), access=access, launch=_fork_broker if can_fork() else None,
                    also_listen=also)).start()
        except BaseException:
            if self._links is not None:
                self._links.close()
            raise
        self.url = self._broker.url if self._broker else m.broker_url
        #: What summary.json says of the broker: its kind ("external": the one mqtt.broker_url names)
        #: and its URL without credentials.
        self.broker = {"kind": managed.name if managed else "external", "url": str(parse_broker_url(self.url))}
        try:
            version = managed.protocol if managed and m.protocol == "auto" else m.protocol
            broadcast = managed.broadcast if managed and m.broadcast == "auto" else m.broadcast
            self.client = MqttClient.for_coordinator(self.url, self.run, username=username, password=password,
                                                     tls_ca=m.tls_ca, max_chunk_bytes=m.max_chunk_bytes,
                                                     protocol=version, reconnect_max_s=_RECONNECT_MAX_S,
                                                     on_inbound=self._on_inbound, on_inbound_all=self._on_inbound_all, admit=self._admit,
                                                     replay_window_rounds=_WHOLE_RUN_ROUNDS, keys=self.keys,
                                                     auth_session=self.session)
            self.client.connect(timeout_s=m.connect_timeout_s)
            if isinstance(algorithm, OverTheAir):
                user, secret = user_credentials(m.credentials, topics.CHANNEL)
                self._channel = ChannelEmulator(self.url, self.run, session=self.session, nodes=self.node_ids,
                                                signal_spec=algorithm.channel.signal_spec(),
                                                connect_timeout_s=m.connect_timeout_s,
                                                username=user, password=secret, tls_ca=m.tls_ca,
                                                max_chunk_bytes=m.max_chunk_bytes, protocol=version,
                                                keys=self.keys, auth_session=self.session)
            if m.emulated:  # after subscribing: RabbitMQ may miss a retained status sent just before
                self._start_hosts(self.client.protocol or version, broadcast, quiet)
            self._wait_online(m.connect_timeout_s)
        except BaseException:
            self.close("failed")
            raise

    def _init_bookkeeping(self, mqtt: MqttSection, nodes: NodesSection, config_toml: str,
                          node_ids: Sequence[int], algorithm: Algorithm, seed: int) -> None:
        """Everything but the broker, the client and the hosts: what a round's messages are checked
        and collected against (a test of that bookkeeping builds this part alone)."""
        m = self.mqtt = mqtt
        self.nodes_section = nodes
        self.config_toml = config_toml
        self.node_ids = list(node_ids)
        self.alg, self.seed = algorithm, seed
        self.run = wire.check_id(m.run_id, "mqtt.run_id")
        self.session = secrets.token_hex(8)
        self.keys: auth.Keys | None = None  # the message keys shared with each node (testbed.mqtt.auth)
        self._keys_dir: Path | None = None  # the emulated hosts' keys files, removed by close()
        self.earlier_sessions: tuple[str, ...] = ()  # a resumed run's (the runner's asked.csv): named in the stop
        self.round_timeout_s = m.round_timeout_s
        self._hosts: list[Host] = []
        self._channel: ChannelEmulator | None = None
        self._charges: dict[int, list[Event]] = {}  # issued by the server, not yet seen by the node
        # Every round of this session (the setup under SETUP_ROUND), for its late replies and the
        # nodes' ledger reports however late they come; the highest wire round sent so far: a node's
        # message of a later round is refused before it moves any state (_admit).
        self._rounds: dict[int, RoundContext] = {}
        self._sent_at: dict[int, float] = {}  # round -> monotonic s it was sent: its replies' window
        self._bounds = node_bounds(mqtt, nodes, self.node_ids, algorithm)
        self._open_round = -1
        self._late: dict[tuple[int, int], list[Event]] = {}  # charged, not yet handed to the runner
        self._released: dict[int, RoundSet] = {}  # node -> rounds of this session already charged
        # (node, round) charged its plan on ask: a late reply's measured costs still raise the estimate.
        self._on_ask: set[tuple[int, int]] = set()
        self._reports: dict[int, protocol.LedgerReport] = {}  # node -> its own ledger (as it left, at the stop)
        self._randomness: dict[int, str] = {}  # node -> what keys its private draws, as its readys said
        self._make_server_secret: Callable[[], NodeSecret] | None = None
        self._server_secret: NodeSecret | None = None  # keys the server's private draws (see _prepare)
        self._stopping = False  # the stop is (about to be) sent: a report from now on answers it
        self._stop_answers: set[int] = set()  # the nodes that reported since
        self._sent: dict[int, dict[str, np.ndarray]] = {}  # this round's downlink rows, by node
        self._metric_spec = metric_specs(algorithm)
        # (node, event kind) → the most seconds and joules the node reported in one such event: what
        # a release whose own events never came is charged for them (towards more spend).
        self._costliest: dict[tuple[int, str], dict[str, float]] = {}
        self._outage_since: float | None = None  # monotonic s of the first unacknowledged publish
        # The prepare (before the first round or setup): the experiment's key the nodes' ready must
        # name, the nodes that said so while it was awaited, whether it is being awaited, whether sent.
        self._experiment_key = protocol.experiment_key(config_toml)
        self._ready: set[int] = set()
        self._preparing = False
        self._prepared = False
        # The client's network thread hands every message over under this lock (_on_inbound): a
        # node's status and a reply to the round being collected are taken there and then, without
        # waking this thread per message; anything else waits in _pending for this thread.
        self._lock = threading.Condition()
        self._collecting: Collection | None = None
        self._pending: list[Inbound] = []
        self.online: set[int] = set()
        self._arrived_s: dict[int, float] = {}  # the last round's replies: node → when it came (monotonic s)
        self._links: Links | None = None
        self._link_rounds: LinkRounds | None = None

    @functools.cached_property
    def _node_set(self) -> frozenset[int]:
        """The run's nodes, to look a reply's sender up in."""
        return frozenset(self.node_ids)

    @property
    def authentication(self) -> dict:
        """What summary.json says of the messages' authentication: on or off, where the keys came
        from, and how many received frames did not authenticate (dropped, never parsed)."""
        client = getattr(self, "client", None)
        forged = (client.forged if client is not None else 0) + (self._channel.client.forged if self._channel else 0)
        if self.keys is None:
            return {"enabled": False, "statement": "not authenticated (mqtt.authenticate = false): anyone on the "
                                                   "broker its ACL lets in can act for a node or the coordinator"}
        return {"enabled": True, "mac": "HMAC-SHA256-128, per node and session",
                "keys": "provisioned" if self.mqtt.keys else "run", "forged_dropped": forged}

    def _wait_online(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        wanted = self._node_set
        # Emulated hosts still at work (importing, connecting: CPU time) are waited for past the
        # deadline, up to a cap: on a loaded machine their start takes longer (testbed.util.starting).
        working = StillWorking(process_progress(*(h.proc.pid for h in self._hosts)),
                               cap_s=max(CAP_S, timeout_s)) if self._hosts else None
        while not wanted <= self.online:
            remaining = deadline - time.monotonic()
            dead = [h for h in self._hosts if h.proc.poll() is not None]
            if dead:
                # The host's own last words say which node and why (refused credentials, a bad
                # CA, a missing data file...): pass them on instead of a bare "exited".
                raise UserError("; ".join(f"the emulated host of nodes {shown_ids(h.node_ids)} exited "
                                          f"(status {h.proc.returncode}) before its nodes were online: "
                                          f"{h.last_error()}" for h in dead))
            if remaining <= 0 and (working is None or not working()):
                missing = sorted(wanted - self.online)
                raise UserError(f"{len(missing)} of {len(wanted)} nodes ({shown_ids(missing)}) are not connected to "
                                f"{self.url}: not online within {timeout_s:g} s"
                                f"{f' (their emulated hosts: {working.why()})' if working is not None else ''}; start them with "
                                f"`testbed node --broker {self.url} --run {self.run} --node-id ID`")
            self._wait(min(max(remaining, 0.05), 0.5))

    # ------------------------------------------------------------------------------------- rounds

    def _live(self, excluded: frozenset[int]) -> tuple[int, ...]:
        """Wait for a quorum of nodes online (at most a round's timeout); the online nodes less
        ``excluded``."""
        self._await_broker()
        quorum = min(self.mqtt.quorum, len(self.node_ids))
        deadline = time.monotonic() + self.round_timeout_s
        while len(self.online & self._node_set) < quorum and (remaining := deadline - time.monotonic()) > 0:
            self._wait(min(remaining, 0.5))
        self._reap_hosts()
        if self._hosts and all(h.reaped for h in self._hosts):
            raise UserError(f"every emulated host exited; the last said: {self._hosts[-1].last_error()}")
        live = self.online & self._node_set
        if not live and (not self.client.connected or self._outage_since is not None):
            # The broker sends the nodes' wills as it goes down, before our own connection drops:
            # an outage, not dead nodes; the round closes with every node offline.
            self._broker_lost()
            return ()
        if not live:  # a run whose nodes all died is not completed by rounds nobody plays
            raise UserError(f"none of the {len(self.node_ids)} nodes is online on {self.url} "
                            f"(waited {self.round_timeout_s:g} s for them)")
        if not self._prepared:
            self._prepare(tuple(sorted(live)))
            live = self.online & self._node_set
        return tuple(sorted(live - excluded))

    def _prepare(self, live: tuple[int, ...]) -> None:
        """Once per session, before its first round or setup: ask the ``live`` nodes to build the
        experiment and wait until each said ``ready``, went offline, or ``mqtt.setup_wait_s``
        passed, so that the first round's deadline does not run while they load data and build the
        model. A node not ready by then is asked all the same (one line says which): it straggles
        as a late node does, its late reply charged."""
        self._prepared = True
        self._open_round = max(self._open_round, 0)  # a ready (wire round 0) is admitted from now on
        started = time.monotonic()
        with self._lock:
            self._preparing = True
            self._drain_pending()  # from now on the network thread hands readies over at once
        try:
            if not self._publish(topics.bcast(self.run), protocol.prepare(self.run, self.session, self.config_toml,
                                                                          live), "the prepare"):
                return  # the broker is gone: the first round meets the outage as any round does
            deadline = started + self.mqtt.setup_wait_s
            while True:
                with self._lock:
                    waiting = (set(live) & self.online) - self._ready
                    remaining = deadline - time.monotonic()
                    if not waiting or remaining <= 0:
                        break
                    self._lock.wait(min(remaining, REAP_INTERVAL_S))
                self._reap_hosts()
        finally:
            with self._lock:
                self._preparing = False
        self._key_server_noise()
        not_ready = sorted(set(live) - self._ready)
        if not_ready:
            log.warning("%d of %d node(s) not ready within %g s (mqtt.setup_wait_s): %s; asked all the same, "
                        "they straggle until they answer in time", len(not_ready), len(live),
                        self.mqtt.setup_wait_s, shown_ids(not_ready))
        else:
            log.info("%d node(s) ready in %.1f s", len(live), time.monotonic() - started)

    def _key_server_noise(self) -> None:
        """Once the prepare is over: the server's noise keyed by the coordinator's secret for the
        session if a node said it has a secret (the public reads the seed in every round's
        experiment, and would subtract run-seed noise from a broadcast); else the run seed's, so
        an all-emulated run is sim's bit for bit."""
        with self._lock:  # the network thread notes readys
            secret_nodes = NODE_SECRET in self._randomness.values()
        if self._make_server_secret is not None and secret_nodes:
            self._server_secret = self._make_server_secret()
            log.info("the server's noise is keyed by its own secret: a node has a secret")

    @property
    def server_randomness(self) -> str:
        """What keys the server's private draws: SERVER_SECRET or RUN_SEED."""
        return RUN_SEED if self._server_secret is None else SERVER_SECRET

    def setup(self, state: State, asking: Callable[[RoundContext], None] | None = None) -> RoundOutcome:
        """The algorithm's one-time setup on every online node; ``asking(ctx)`` before it is sent."""
        alg = self.alg
        assert isinstance(alg, WithSetup)
        expected = self._live(frozenset())
        if not expected:
            raise UserError(f"broker {self.url} unreachable during the setup phase; once it is back, "
                            f"`testbed run --resume RUN_DIR` starts the run again")
        ctx = RoundContext(SETUP_ROUND, self.seed, len(self.node_ids), expected, server_secret=self._server_secret)
        self._remember(ctx)
        if asking is not None:
            asking(ctx)
        if self._publish(topics.bcast(self.run), protocol.setup(self.run, self.session, self.config_toml, expected),
                         "the setup"):
            answers, refusals, reasons, refused = self._collect(ctx, alg.setup_spec(), protocol.SETUP_UPDATE)
        else:
            answers, refusals, reasons, refused = self._unreached(ctx)
        return self._outcome(ctx, alg.setup_spec(), answers, refusals, reasons, frozenset(), None, refused, {})

    def round(self, state: State, round_index: int, excluded: frozenset[int],
              sampled: tuple[int, ...] | None = None, meanwhile: Callable[[], None] | None = None,
              asking: Callable[[RoundContext], None] | None = None) -> RoundOutcome:
        """Send round ``round_index`` from ``state`` to the online ``sampled`` nodes (None: all)
        less ``excluded`` (emulated stragglers), ``asking(ctx)`` first; ``meanwhile()`` while they
        step; their replies, checked (those that come meanwhile wait in the network thread's hand-over)."""
        alg = self.alg
        expected = self._live(excluded)
        if sampled is not None:
            chosen = set(sampled)
            expected = tuple(n for n in expected if n in chosen)
        ctx = RoundContext(round_index, self.seed, len(self.node_ids), expected, sampled=sampled,
                           server_secret=self._server_secret)
        self._remember(ctx)
        if self._link_rounds is not None:
            self._link_rounds.start()
        if asking is not None and expected:
            asking(ctx)
        acked = self._send(state, ctx) if expected else None
        if meanwhile is not None:
            meanwhile()
        sent = acked is None or acked()
        spec = round_uplink_spec(alg, state, ctx)  # with the round's own bounds where they depend on it
        if sent:
            answers, refusals, reasons, refused = self._collect(ctx, spec, protocol.UPDATE)
        else:
            answers, refusals, reasons, refused = self._unreached(ctx)
        heard = None
        if self._channel is not None:
            heard = self._channel.close_round(self.session, round_index)
        wire_s: dict[int, float] = {}
        if self._link_rounds is not None and sent:
            talk = {node: [e for e in events if e.kind == "communication"] for node, (_, events, _) in answers.items()}
            wire_s = self._link_rounds.end(round_index, self._arrived_s,
                                           {node: sum(e.airtime_s for e in comm) for node, comm in talk.items()},
                                           {node: sum(e.bytes_up + e.bytes_down for e in comm)
                                            for node, comm in talk.items()})
        return self._outcome(ctx, spec, answers, refusals, reasons, excluded, heard, refused, wire_s)

    def _send(self, state: State, ctx: RoundContext) -> Callable[[], bool]:
        """Publish the round; what it returns awaits the broker's acknowledgement of the last
        publish: False when the broker did not acknowledge one (an outage)."""
        alg = self.alg
        spec = alg.downlink_spec()
        down = alg.downlink(state, ctx, ctx.expected)
        shared = {k: np.ascontiguousarray(down[k][0]) for k, s in spec.items() if not s.per_node}
        own = [k for k, s in spec.items() if s.per_node]
        if isinstance(alg, OverTheAir):
            assert self._channel is not None
            if not self._publish(topics.chan(self.run), protocol.transmit(
                    self.run, self.session, ctx.round_index, self.config_toml, ctx.expected,
                    _SIGNAL_SHARE * self.round_timeout_s, round_signal_spec(alg.channel, state, ctx),
                    alg.channel_tensors(ctx)), f"round {ctx.round_index}"):
                return _unacked
        self._sent = {node: shared for node in ctx.expected}  # what each node got, for norm bounds
        if not own:
            charges = [e for n in ctx.expected for e in self._charges.get(n, [])]
            return self._publish_then(topics.bcast(self.run), protocol.round_(
                self.run, self.session, ctx.round_index, self.config_toml, ctx.expected, shared, charges),
                f"round {ctx.round_index}")
        for i, node in enumerate(ctx.expected):
            tensors = {**shared, **{k: np.ascontiguousarray(down[k][i]) for k in own}}
            self._sent[node] = tensors
            if not self._publish(topics.down(self.run, str(node)), protocol.round_(
                    self.run, self.session, ctx.round_index, self.config_toml, ctx.expected, tensors,
                    self._charges.get(node, [])), f"round {ctx.round_index}"):
                return _unacked
        return _acked

    # ------------------------------------------------------------------------------ outages

    def _outcome(self, ctx: RoundContext, spec, answers, refusals, reasons, excluded, heard,
                 content_refused: dict[int, list[Event] | None], wire_s: dict[int, float]) -> RoundOutcome:
        """The round's outcome from what was collected; ``wire_s``: an answered node's share of
        its host's seconds on its link (links.netns), charged beside its own events as a WireEvent."""
        ids = tuple(sorted(answers))
        released = set(ids) if heard is None else set(heard)
        closed = ctx.closed(sorted(released))
        straggled = {n: "emulated" for n in excluded}
        for node in ctx.absent:  # not asked: offline when the round began (a dead host's nodes)
            straggled.setdefault(node, "offline")
        for node in ctx.expected:
            if node not in answers and node not in refusals:
                straggled[node] = reasons.get(node, "deadline")
        if straggled:
            silent = [n for n, why in straggled.items() if why != "emulated"]
            if silent:
                log.warning("round %d: %d straggler(s): %s", ctx.round_index, len(silent), shown_ids(sorted(silent)))
        charged = charging.released(ctx, answers, released, content_refused, wire_s, self._planned_release)
        with self._lock:  # the network thread adds late replies and reads what was charged
            late, self._late = self._late, {}
            for key, events in late.items():
                charged.setdefault(key, events)
            # Charged before asked: a node asked that sent nothing usable may have released (killed after
            # logging, its update late or lost): charged the plan now; its late reply then finds it charged.
            on_ask = charging.unanswered(ctx, {n for n, r in charged if r == ctx.round_index}, set(refusals),
                                         lambda left: [self._already_charged(n, ctx.round_index) for n in left],
                                         over_the_air=heard is not None)
            charged.update(charging.on_ask(self._planned_release, ctx, on_ask, "sent no usable reply"))
            self._on_ask.update((n, ctx.round_index) for n in on_ask)
            self._mark_released(charged)
        for node in ids:  # the node saw its round message: it has the charges it carried
            self._charges.pop(node, None)
        result = NodeResult(
            node_ids=ids,
            tensors={name: np.stack([answers[n][0][name] for n in ids]) if ids else np.zeros((0,) + s.shape)
                     for name, s in spec.items()},
            # Every answer carries exactly the declared metrics (_handle): stacked by name.
            metrics={name: np.array([answers[n][2][name] for n in ids], dtype=np.float64)
                     for name in (answers[ids[0]][2] if ids else {})},
            events=[answers[n][1] for n in ids])
        refused = tuple((n, m.meta["budget"], float(m.meta["would_be"]), float(m.meta["limit"]))
                        for n, m in sorted(refusals.items()))
        return RoundOutcome(result, closed, charged, straggled, refused, on_ask=tuple(on_ask))

    def deliver(self, events: list[Event]) -> None:
        """Events the server issued on nodes' behalf go to each node with its next round."""
        for event in events:
            self._charges.setdefault(event.node, []).append(event)

    def _remember(self, ctx: RoundContext) -> None:
        """A round (or the setup) is about to be sent: its replies may come from now on, however late."""
        self._rounds[ctx.round_index] = ctx
        self._sent_at[ctx.round_index] = time.monotonic()
        self._open_round = max(self._open_round, ctx.round_index, 0)

    def close(self, status: str) -> Closing:
        """Tell the nodes the run is over and wait (at most a round's timeout) for every online
        node's own ledger of the session, late replies taken meanwhile; then wait for the emulated
        hosts and stop the run's own broker. What the nodes released but never delivered, charged."""
        client = getattr(self, "client", None)
        told = False
        with self._lock:
            self._stopping = True
        try:
            if client is not None and client.connected:
                client.publish(topics.bcast(self.run), protocol.stop(self.run, self.session, status,
                                                                     max(self._open_round, 0), self.earlier_sessions),
                               timeout_s=5)
                told = True
        except (TimeoutError, UserError) as exc:
            log.warning("could not broadcast stop: %s", exc)
        if told:
            self._await_reports(min(self.round_timeout_s, _REPORT_WAIT_S))
        closing = self._closing()
        for host in self._hosts:
            host.stop(timeout_s=10 if told else 0)  # a host that cannot hear the stop is not waited for
        if self._channel is not None:
            self._channel.close()
        if client is not None:
            client.close()
        if self._broker is not None:
            self._broker.stop()
        if self._keys_dir is not None:
            shutil.rmtree(self._keys_dir, ignore_errors=True)
        closing = dataclasses.replace(closing, authentication=self.authentication)
        if self._links is not None:
            closing = dataclasses.replace(closing, links=self._link_rounds.summary() if self._link_rounds else None)
            self._links.close()
        return closing

    def _await_reports(self, timeout_s: float) -> None:
        """Up to ``timeout_s`` for the ledger report of every node online (a node gone does not
        answer; what it delivered before is charged, what it did not is beyond anyone's reach)."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            while (missing := (self.online & self._node_set) - self._stop_answers) \
                    and (remaining := deadline - time.monotonic()) > 0:
                self._drain_pending()
                self._lock.wait(min(remaining, REAP_INTERVAL_S))
            self._drain_pending()
        if missing:
            log.warning("%d node(s) did not report their ledger within %g s of the stop: %s", len(missing),
                        timeout_s, shown_ids(sorted(missing)))

    def _as_asked(self, node: int, round_index: int) -> RoundContext:
        """Round ``round_index`` as this session asked ``node`` in it; one it did not ask the node in,
        as if the node had taken part alone."""
        ctx = self._rounds.get(round_index)
        return ctx if ctx is not None and node in ctx.expected else \
            RoundContext(round_index, self.seed, len(self.node_ids), (node,))

    def _closing(self) -> Closing:
        """What the run's end charges: late replies not yet handed over, and every round a node's own
        ledger logged that the coordinator never charged (a reply lost, refused by a replay window,
        or sent after the last round), at the plan of that round (the node's events are the plan in
        every field that is not measured; a report's totals cover the measured ones)."""
        with self._lock:
            charged, self._late = self._late, {}
            reports = dict(self._reports)
        has_setup = isinstance(self.alg, WithSetup) and self.alg.has_setup
        # The rounds a report logged that nothing charged yet: interval against interval (a lookup
        # per node and round was 10 ms of a 100-node, 100-round run's end).
        charged.update(charging.confirmed_by_node(
            {node: self._released.get(node, RoundSet()).missing(report.rounds) for node, report in reports.items()},
            lambda node, r: (node, r) in charged, self._as_asked, self._planned_release, has_setup))
        with self._lock:
            self._mark_released(charged)
        return Closing(charged, {node: report.totals for node, report in reports.items()},
                       {node: frozenset(report.round_indices()) for node, report in reports.items()},
                       self.session, self.broker, randomness=dict(self._randomness),
                       server_randomness=self.server_randomness)


def _fork_broker(argv: list[str], stderr_fd: int) -> ForkedCommand:
    """The run's embedded broker (its BrokerOptions' ``launch``) in a fork of this process: serving in
    0.1 s (it imports amqtt only), where a new interpreter imports the testbed first (0.35 s)."""
    return ForkedCommand(argv, name="testbed broker", stderr_fd=stderr_fd)


