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
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import json
import logging
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from testbed.mqtt import wire
from testbed.rounds import protocol
from testbed.algorithms.contract import (
    SETUP_ROUND,
    Algorithm,
    NodeResult,
    OverTheAir,
    RoundContext,
    State,
    WithSetup,
    check_metrics,
    check_tensors,
    metric_specs,
    round_signal_spec,
    round_uplink_spec,
)
from testbed.accounting.budgets import BUDGET_NAME
from testbed.assembly.config import LinksSection, MqttSection, NodesSection
from testbed.checked.limits import MAX_TEXT_FILE_BYTES
from testbed.errors import ConfigError, UserError
from testbed.ledger.events import EVENT_TYPES, Event, WireEvent, with_fields
from testbed.ledger.fields import FIELD_RULES, MEASURED_FIELDS, event_within
from testbed.ledger.node import RoundSet
from testbed.mqtt import topics
from testbed.mqtt import acl, auth
from testbed.mqtt.broker import parse_broker_url
from testbed.mqtt.brokers import registry as brokers
from testbed.mqtt.client import Inbound, MqttClient
from testbed.orchestration import charging
from testbed.orchestration.channel_emulator import ChannelEmulator
from testbed.orchestration.links import LinkRounds, Links
from testbed.orchestration.measured_bounds import MeasuredBounds
from testbed.orchestration.nodes_api import Closing, RoundOutcome
from testbed.streams.node_secret import NODE_SECRET, RUN_SEED, SERVER_SECRET, NodeSecret
from testbed.util.forked import ForkedCommand, can_fork
from testbed.util.starting import CAP_S, StillWorking, process_progress
from testbed.util.userfiles import read_text

log = logging.getLogger(__name__)

_SIGNAL_SHARE = 0.8  # of an over-the-air round's deadline, for the channel to collect the signals
#: What a node may send the coordinator; anything else on its uplink is refused before it moves any state.
_FROM_NODES = frozenset({protocol.UPDATE, protocol.SETUP_UPDATE, protocol.REFUSED, protocol.LEDGER, protocol.READY})
# The replay window of the coordinator's client: a reply is charged however late (the coordinator
# itself charges a node's round once), so no round is too old for it; memory stays bounded by the
# guard's total of keys.
_WHOLE_RUN_ROUNDS = 2**62
#: Per event kind, its measured or modelled numbers (seconds, joules).
_MEASURED_NUMBERS = {kind: tuple(f.name for f in dataclasses.fields(cls)
                                 if f.name in MEASURED_FIELDS and FIELD_RULES[f.name].type is float)
                     for kind, cls in EVENT_TYPES.items()}
_REPORT_WAIT_S = 10.0  # at most, after the stop, for the nodes' ledger reports (and a round's timeout)
_REAP_INTERVAL_S = 0.1  # how often a round's collection looks for emulated hosts that died
_RECONNECT_MAX_S = 5.0  # the coordinator retries a lost broker at least this often (one client)


class MqttNodes:
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
        username, password = _credentials(m.credentials, "coordinator")
        self.keys = _run_keys(m, self.run, self.node_ids)
        # The run's own broker when none is given (mqtt.broker), stopped by close(); its registration
        # says how clients best speak to it.
        managed = brokers.choose(m.broker) if m.broker_url is None else None
        self._broker: brokers.ManagedBroker | None = None
        try:
            if links is not None and links.netns:
                self._open_links(links, managed)
            if managed is not None:
                access = _run_access(m, self.node_ids) if managed.access else None
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
                                                     on_inbound=self._on_inbound, admit=self._admit,
                                                     replay_window_rounds=_WHOLE_RUN_ROUNDS, keys=self.keys,
                                                     auth_session=self.session)
            self.client.connect(timeout_s=m.connect_timeout_s)
            if isinstance(algorithm, OverTheAir):
                user, secret = _credentials(m.credentials, topics.CHANNEL)
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
        self._hosts: list[_Host] = []
        self._channel: ChannelEmulator | None = None
        self._charges: dict[int, list[Event]] = {}  # issued by the server, not yet seen by the node
        # Every round of this session (the setup under SETUP_ROUND), for its late replies and the
        # nodes' ledger reports however late they come; the highest wire round sent so far: a node's
        # message of a later round is refused before it moves any state (_admit).
        self._rounds: dict[int, RoundContext] = {}
        self._sent_at: dict[int, float] = {}  # round -> monotonic s it was sent: its replies' window
        self._bounds = _node_bounds(mqtt, nodes, self.node_ids, algorithm)
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
        self._collecting: _Collection | None = None
        self._pending: list[Inbound] = []
        self.online: set[int] = set()
        self._arrived_s: dict[int, float] = {}  # the last round's replies: node → when it came (monotonic s)
        self._links: Links | None = None
        self._link_rounds: LinkRounds | None = None

    def _host_groups(self) -> list[list[int]]:
        """The node ids of each emulated `testbed nodes` host (not the microcontroller boards')."""
        mcu = set(self.nodes_section.mcu)
        others = [n for n in self.node_ids if n not in mcu]
        return [[int(n) for n in g] for g in np.array_split(np.array(others), max(1, min(self.mqtt.hosts, len(others))))
                if len(g)]

    def _open_links(self, links: LinksSection, managed: brokers.Registration | None) -> None:
        """Each emulated host's link (links.netns), its rate resolved (links.rate_bps), before the
        broker starts (it listens on their broker ends)."""
        if not self.mqtt.emulated:
            raise ConfigError("links.netns", "puts the emulated hosts behind links; mqtt.emulated is false")
        if managed is None or not managed.listens_beyond_loopback:
            raise ConfigError("links.netns", "needs the run's own broker listening on the links' addresses, which "
                              "mqtt.broker = \"mosquitto\" does (not an external broker_url, not the embedded broker)")
        if self.nodes_section.mcu:
            raise ConfigError("links.netns", "the microcontroller boards' bridges (nodes.mcu) are not put behind links")
        hosts = self._host_groups()
        self._links = Links.open(_host_rates(links.rate_bps, hosts, self.alg))
        self._link_rounds = LinkRounds(self._links, hosts)

    @functools.cached_property
    def _node_set(self) -> frozenset[int]:
        """The run's nodes, to look a reply's sender up in."""
        return frozenset(self.node_ids)

    def _start_hosts(self, protocol_version: str, broadcast: str, quiet: bool) -> None:
        """The emulated boards: a `testbed bridge --virtual` per microcontroller, and the other nodes
        split over ``mqtt.hosts`` `testbed nodes` processes (forked from this one where it can)."""
        m = self.mqtt
        if m.credentials:
            _check_credentials(m.credentials, self.node_ids)
        boards = [n for n in self.node_ids if n in set(self.nodes_section.mcu)]
        groups = self._host_groups()
        keys_env = self._host_keys([[n] for n in boards] + groups)
        for node in boards:  # a microcontroller board: a virtual one behind its own bridge
            cmd = ["bridge", "--virtual", self.nodes_section.mcu_board,
                   "--broker", self.url, "--run", self.run, "--node-id", str(node),
                   "--profile", self.nodes_section.mcu_profile, "--protocol", protocol_version,
                   "--max-chunk-bytes", str(m.max_chunk_bytes)]
            cmd += ["--credentials", m.credentials] if m.credentials else []
            cmd += ["--tls-ca", m.tls_ca] if m.tls_ca else []
            self._hosts.append(_Host([node], cmd, quiet, keys_env([node])))
        # Each emulated host gets its share of this machine's cores for torch (a torch model's step),
        # so that hosts do not oversubscribe them (testbed.learning.torch_models reads the variable).
        env = {"TESTBED_TORCH_THREADS": os.environ.get("TESTBED_TORCH_THREADS",
                                                       str(max(1, (os.cpu_count() or 1) // max(1, len(groups)))))}
        for index, group in enumerate(groups):
            url = self.url if self._links is None else _url_at(self.url, self._links.links[index].broker_address)
            cmd = ["nodes", "--broker", url, "--run", self.run,
                   "--ids", ",".join(str(int(n)) for n in group), "--profile", self.nodes_section.profile,
                   "--protocol", protocol_version, "--max-chunk-bytes", str(m.max_chunk_bytes),
                   "--broadcast", broadcast,
                   # This session only, and only while this process lives: a killed coordinator's
                   # hosts must not answer (nor be charged for) its resumed successor's rounds.
                   "--session", self.session, "--coordinator-pid", str(os.getpid())]
            if m.credentials:
                cmd += ["--credentials", m.credentials]
            if m.tls_ca:
                cmd += ["--tls-ca", m.tls_ca]
            if self.nodes_section.pacing:
                cmd.append("--pacing")
            env = {**env, **keys_env(group)}
            if self._links is not None:  # a new interpreter in the host's namespace (`ip netns exec` execs it)
                self._hosts.append(_Host(group, cmd, quiet, env, wrap=functools.partial(self._links.command, index)))
            else:
                self._hosts.append(_Host(group, cmd, quiet, env, fork=can_fork()))

    def _host_keys(self, groups: list[list[int]]) -> Callable[[list[int]], dict[str, str]]:
        """Each emulated host's keys file (its nodes' keys only, mode 0600 in a folder only this user
        enters, removed by close()); the environment that names it to the host (never its command
        line, which any user of the machine can read)."""
        if self.keys is None:
            return lambda group: {auth.NO_AUTH_ENV: "1"}
        self._keys_dir = Path(tempfile.mkdtemp(prefix=f"testbed-keys-{self.run}-"))
        files = {}
        for group in groups:
            path = self._keys_dir / f"keys-{group[0]}.json"
            auth.write_keys(path, self.keys.only(str(n) for n in group))
            files[tuple(group)] = str(path)
        return lambda group: {auth.KEYS_ENV: files[tuple(group)]}

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
                raise UserError("; ".join(f"the emulated host of nodes {_ids(h.node_ids)} exited "
                                          f"(status {h.proc.returncode}) before its nodes were online: "
                                          f"{h.last_error()}" for h in dead))
            if remaining <= 0 and (working is None or not working()):
                missing = sorted(wanted - self.online)
                raise UserError(f"{len(missing)} of {len(wanted)} nodes ({_ids(missing)}) are not connected to "
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
                    self._lock.wait(min(remaining, _REAP_INTERVAL_S))
                self._reap_hosts()
        finally:
            with self._lock:
                self._preparing = False
        self._key_server_noise()
        not_ready = sorted(set(live) - self._ready)
        if not_ready:
            log.warning("%d of %d node(s) not ready within %g s (mqtt.setup_wait_s): %s; asked all the same, "
                        "they straggle until they answer in time", len(not_ready), len(live),
                        self.mqtt.setup_wait_s, _ids(not_ready))
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
        sent = not expected or self._send(state, ctx)
        if meanwhile is not None:
            meanwhile()
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

    def _send(self, state: State, ctx: RoundContext) -> bool:
        """Publish the round; False when the broker did not acknowledge it (an outage)."""
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
                return False
        self._sent = {node: shared for node in ctx.expected}  # what each node got, for norm bounds
        if not own:
            charges = [e for n in ctx.expected for e in self._charges.get(n, [])]
            return self._publish(topics.bcast(self.run), protocol.round_(
                self.run, self.session, ctx.round_index, self.config_toml, ctx.expected, shared, charges),
                f"round {ctx.round_index}")
        for i, node in enumerate(ctx.expected):
            tensors = {**shared, **{k: np.ascontiguousarray(down[k][i]) for k in own}}
            self._sent[node] = tensors
            if not self._publish(topics.down(self.run, str(node)), protocol.round_(
                    self.run, self.session, ctx.round_index, self.config_toml, ctx.expected, tensors,
                    self._charges.get(node, [])), f"round {ctx.round_index}"):
                return False
        return True

    # ------------------------------------------------------------------------------ outages

    def _publish(self, topic: str, payload: bytes, what: str) -> bool:
        """Publish ``what`` (a round, the setup...), waiting at most a round's timeout for the broker's ack; False
        (an outage, counted against mqtt.outage_limit_s) when it is unreachable or did not ack."""
        if self.client.connected:
            try:
                self.client.publish(topic, payload, timeout_s=self.round_timeout_s)
            except TimeoutError as exc:
                # paho keeps the frames and resends them after a reconnect: the nodes may still
                # run this round; their replies find it (_rounds), however late.
                log.warning("%s not sent: %s", what, exc)
            else:
                self._broker_back()
                return True
        self._broker_lost()
        return False

    def _await_broker(self) -> None:
        """Before a round: if the broker is gone, wait for it up to a round's timeout (the client
        reconnects with backoff); raises past mqtt.outage_limit_s."""
        if self.client.connected:
            return
        self._broker_lost()
        deadline = time.monotonic() + self.round_timeout_s
        while not self.client.connected and (remaining := deadline - time.monotonic()) > 0:
            self._wait(min(remaining, 0.5))
        if not self.client.connected:
            self._broker_lost()

    def _broker_lost(self) -> None:
        """Note an outage; past the limit, stop the run (resumable) with one line."""
        now, limit = time.monotonic(), self.mqtt.outage_limit_s
        if self._outage_since is None:
            self._outage_since = now
            log.warning("broker %s unreachable: rounds close with stragglers until it is back, for at most "
                        "%g s (mqtt.outage_limit_s)", self.url, limit)
        elif now - self._outage_since > limit:
            raise UserError(f"broker {self.url} unreachable for {now - self._outage_since:.0f} s, past "
                            f"mqtt.outage_limit_s = {limit:g} s; once it is back, `testbed run --resume RUN_DIR` "
                            f"continues the run")

    def _broker_back(self) -> None:
        if self._outage_since is not None:
            log.warning("broker %s back after %.1f s", self.url, time.monotonic() - self._outage_since)
            self._outage_since = None

    @staticmethod
    def _unreached(ctx: RoundContext) -> tuple[dict, dict, dict[int, str], dict]:
        """The answers of a round the broker did not take: none, every expected node offline."""
        return {}, {}, {node: "offline" for node in ctx.expected}, {}

    def _collect(self, ctx: RoundContext, spec, kind: str):
        """Replies until every expected node answered, refused or left, or the deadline. A reply that
        fails the checks is logged and does not end the node's round (without the broker's ACL
        anyone could forge it); with no good reply by the deadline it is the node's straggle reason.
        The network thread takes the replies (_on_inbound); this one waits for the last, and looks
        for emulated hosts that died every _REAP_INTERVAL_S."""
        deadline = time.monotonic() + self.round_timeout_s
        with self._lock:
            metric_spec = self._metric_spec if kind == protocol.UPDATE else {}  # a setup upload reports none
            collection = self._collecting = _Collection(ctx, spec, metric_spec, kind, outstanding=set(ctx.expected))
            self._offline(set(ctx.expected) - self.online)
            self._arrived_s = collection.arrived_s
            # Replies can come between the round's publish and this line: they answer it.
            self._drain_pending()
        try:
            while True:
                with self._lock:
                    remaining = deadline - time.monotonic()
                    if not collection.outstanding or remaining <= 0:
                        break
                    self._lock.wait(min(remaining, _REAP_INTERVAL_S))
                self._reap_hosts()
        finally:
            with self._lock:
                self._collecting = None
        return collection.answers, collection.refusals, collection.reasons, collection.content_refused

    def _on_inbound(self, item: Inbound) -> None:
        """The network thread's hand-over of one message (see ``_lock``)."""
        with self._lock:
            if item.kind == topics.STATUS:
                node = topics.node_index(item.node)
                online = item.payload == topics.STATUS_ONLINE
                # Only a change wakes the waiters: a broker replays every node's retained status
                # to a new subscriber, and a wake-up per message hands the interpreter back and
                # forth between the threads (50 ms before a run of 100 nodes could start).
                if node is not None and online is not (node in self.online):
                    if online:
                        self.online.add(node)
                    else:
                        self._offline({node})
                    self._lock.notify_all()
            elif self._collecting is not None:
                self._handle(item, self._collecting)
                if not self._collecting.outstanding:
                    self._lock.notify_all()
            else:
                self._pending.append(item)
                if self._preparing:  # a ready is awaited: taken now, not at the next wake-up
                    self._drain_pending()
                    self._lock.notify_all()

    def _wait(self, timeout_s: float) -> None:
        """Up to ``timeout_s`` for a node's status to change; late messages handled meanwhile."""
        with self._lock:
            self._drain_pending()
            self._lock.wait(timeout_s)
            self._drain_pending()

    def _drain_pending(self) -> None:
        """The messages that came while no round was being collected (late replies, and the first
        replies to a round just sent), handled (lock held)."""
        pending, self._pending = self._pending, []
        for item in pending:
            self._handle(item, self._collecting)

    def _offline(self, nodes: set[int]) -> None:
        """``nodes`` left (their will, or their host died): a round being collected stops waiting
        for them (lock held)."""
        self.online -= nodes
        collection = self._collecting
        if collection is not None:
            for node in nodes & collection.outstanding:
                collection.reasons[node] = "offline"
                collection.outstanding.discard(node)

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
                log.warning("round %d: %d straggler(s): %s", ctx.round_index, len(silent), _ids(sorted(silent)))
        charged: dict[tuple[int, int], list[Event]] = {}
        # An answer's events were checked against the plan. A release without a usable answer is
        # charged the plan: a transmission heard although its update never came (the node died
        # after transmitting), or an update refused for its content (a noisy tensor was released
        # all the same, whatever its events said).
        for node in sorted(released | (set(content_refused) - set(answers))):
            charged[(node, ctx.round_index)] = answers[node][1] if node in answers else \
                content_refused.get(node) or self._planned_release(node, ctx)
            if node in wire_s and node in answers:
                charged[(node, ctx.round_index)] = [*answers[node][1], WireEvent(node, ctx.round_index, wire_s[node])]
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

    def _mark_released(self, charged: dict[tuple[int, int], list[Event]]) -> None:
        """Note what is handed to the runner as charged: a second copy of it (a redelivery, a late
        duplicate, a node's report of the same round) is never charged again."""
        for node, round_index in charged:
            self._released.setdefault(node, RoundSet()).add(round_index)

    def _already_charged(self, node: int, round_index: int) -> bool:
        return round_index in self._released.get(node, ()) or (node, round_index) in self._late

    def deliver(self, events: list[Event]) -> None:
        """Events the server issued on nodes' behalf go to each node with its next round."""
        for event in events:
            self._charges.setdefault(event.node, []).append(event)

    def _remember(self, ctx: RoundContext) -> None:
        """A round (or the setup) is about to be sent: its replies may come from now on, however late."""
        self._rounds[ctx.round_index] = ctx
        self._sent_at[ctx.round_index] = time.monotonic()
        self._open_round = max(self._open_round, ctx.round_index, 0)

    def _planned(self, node: int, ctx: RoundContext) -> list[Event]:
        if ctx.round_index == SETUP_ROUND:
            return self.alg.setup_events(node)  # type: ignore[attr-defined]
        return self.alg.planned_events(node, ctx)

    def planned_release(self, node: int, ctx: RoundContext) -> list[Event]:
        """:meth:`_planned_release`, for the runner (a node an earlier session of the run asked,
        which never answered into the ledger), under the lock the network thread notes costs under."""
        with self._lock:
            return self._planned_release(node, ctx)

    def _planned_release(self, node: int, ctx: RoundContext) -> list[Event]:
        """What a release whose own events never came (or came malformed) is charged: the plan, its
        seconds and joules the most the node reported in one such event so far (nothing known of
        them: the plan's, as a node without a meter or profile would log them)."""
        return [with_fields(e, **self._costliest[node, e.kind]) if (node, e.kind) in self._costliest else e
                for e in self._planned(node, ctx)]

    def _note_costs(self, node: int, events: list[Event]) -> None:
        """Keep the most seconds and joules ``node`` reported per event kind (lock held)."""
        for event in events:
            fields = _MEASURED_NUMBERS.get(event.kind)
            if fields:
                seen = self._costliest.setdefault((node, event.kind), dict.fromkeys(fields, 0.0))
                for name in fields:
                    value = getattr(event, name)
                    if value > seen[name]:
                        seen[name] = value

    def _check_events(self, node: int, ctx: RoundContext, msg: wire.Message) -> list[Event]:
        """The update's events, refused unless they are the round's plan in every field (node, round,
        privacy, steps, bytes, cost units...) but the finite non-negative seconds and joules the node
        measured or modelled (testbed.ledger.fields.MEASURED_FIELDS), each within its physical bound
        (testbed.orchestration.measured_bounds: the node's profile and how long its round was open)."""
        events, problems = self._bounded_events(node, ctx, msg)
        if problems:
            raise wire.WireError("bad_header", "; ".join(problems))
        return events

    def _bounded_events(self, node: int, ctx: RoundContext, msg: wire.Message) -> tuple[list[Event], list[str]]:
        """The update's events, and why any measured field is refused (beyond its rule or bound);
        WireError when they are not the plan in another field. A refused field is charged at its
        bound when the node's profile and round window give one (nothing the node could have spent
        is above it), else (the fixed caps: a day, a kilowatt, no estimate of anything) as a
        release whose events never came: the most the node reported in such an event, or the plan."""
        raw = msg.meta.get("events")
        planned = self._planned(node, ctx)
        if not isinstance(raw, list) or len(raw) != len(planned):
            kinds = [e.get("kind") if isinstance(e, dict) else e for e in raw[:10]] if isinstance(raw, list) else raw
            raise wire.WireError("bad_header", f"events {kinds!r:.200}, the plan says {[e.kind for e in planned]}")
        sent_at = self._sent_at.get(ctx.round_index)
        bounds = self._bounds.get(node, _FIXED_CAPS) if sent_at is not None else _FIXED_CAPS
        open_s = time.monotonic() - sent_at if sent_at is not None else 0.0
        derived = bounds.device is not None

        def check(values: object, want: Event) -> tuple[Event, list[str]]:
            limits = bounds.limits(want, open_s)
            return event_within(values, want, limits, None if derived else self._costliest.get((node, want.kind), {}))

        try:
            checked = [check(values, want) for values, want in zip(raw, planned)]
        except ValueError as exc:
            raise wire.WireError("bad_header", str(exc)) from None
        return [event for event, _ in checked], [why for _, problems in checked for why in problems]

    def _events_or_none(self, node: int, ctx: RoundContext, msg: wire.Message) -> tuple[list[Event] | None, list[str]]:
        """What a refused or late reply released: its events if they are the plan, a measured field
        beyond its rule or bound charged at the bound (never less than the node could have spent),
        and why; None when they are not the plan in another field."""
        try:
            events, problems = self._bounded_events(node, ctx, msg)
        except wire.WireError:
            return None, []
        if not problems:
            self._note_costs(node, events)
        return events, problems

    def _admit(self, msg: wire.Message) -> str | None:
        """What the coordinator may take from a node, checked on the network thread before the
        client moves any per-sender state (its replay window): this session's, a kind a node sends
        the coordinator, of a round already sent. Why not, or None."""
        session = protocol.session_of(msg)
        if session != self.session:
            return f"session {session!r:.24}, not this run's"
        if msg.kind not in _FROM_NODES:
            return f"a {msg.kind!r:.24} is not what a node sends the coordinator"
        if msg.round > self._open_round:
            return f"round {msg.round}, not sent yet (the last sent is {self._open_round})"
        return None

    def _handle(self, item: Inbound, collection: _Collection | None) -> None:
        """A node's message (lock held; its session, kind and round admitted by ``_admit``): a reply
        taken if it answers ``collection``, the round being collected, and passes the checks; a
        late one charged; a ledger report kept; anything else dropped."""
        msg, node = item.message, topics.node_index(item.node)
        if msg is None or node is None or node not in self._node_set:
            return
        if msg.kind == protocol.LEDGER:
            self._take_report(node, msg)
            return
        if msg.kind == protocol.READY:
            self._take_ready(node, msg)
            return
        if collection is None:
            self._maybe_late(node, msg)
            return
        ctx, answers, refusals = collection.ctx, collection.answers, collection.refusals
        wire_round = max(ctx.round_index, 0)
        if msg.round != wire_round or msg.kind not in (collection.kind, protocol.REFUSED):
            self._maybe_late(node, msg)
            return
        if node not in collection.expected:
            log.warning("dropped %s of node %d for round %d: it was not asked", msg.kind, node, wire_round)
            return
        if node in answers or node in refusals:
            log.warning("dropped a second %s of node %d for round %d", msg.kind, node, wire_round)
            return
        try:
            if msg.kind == protocol.REFUSED:
                _check_refusal(msg)
                refusals[node] = msg
                if self._channel is not None:  # it will not transmit: the channel need not wait for it
                    self._channel.withdraw(self.session, wire_round, node)
                collection.outstanding.discard(node)
                return
            problem = check_tensors(collection.spec, msg.tensors, self._sent.get(node), finite_known=True)
            if problem is not None:
                raise wire.WireError("bad_header", problem)
            events = self._check_events(node, ctx, msg)
            problem = check_metrics(collection.metric_spec, msg.meta.get("metrics", {}))
            if problem is not None:
                raise wire.WireError("bad_header", problem)
            answers[node] = ({k: msg.tensors[k] for k in collection.spec}, events, msg.meta.get("metrics", {}))
            collection.arrived_s[node] = time.monotonic()
            collection.outstanding.discard(node)
            self._note_costs(node, events)
        except wire.WireError as exc:
            collection.reasons[node] = "refused_update"
            if msg.kind != protocol.REFUSED:  # released all the same: charged unless a good one comes
                collection.content_refused[node] = self._events_or_none(node, ctx, msg)[0]
            log.warning("rejected %s of node %d for round %d: %s", msg.kind, node, wire_round, exc)

    def _maybe_late(self, node: int, msg: wire.Message) -> None:
        """A reply of an earlier round (or the setup) of this session, however late: charged once
        (released is spent), never used; its events as the node says when they are the plan, else
        the plan."""
        round_index = SETUP_ROUND if msg.kind == protocol.SETUP_UPDATE else msg.round
        ctx = self._rounds.get(round_index)
        if msg.kind not in (protocol.UPDATE, protocol.SETUP_UPDATE) or ctx is None or node not in ctx.expected:
            log.info("dropped %s of node %d for round %d: not this round", msg.kind, node, msg.round)
            return
        if (node, round_index) in self._on_ask:  # charged its plan: what it measured raises the
            self._on_ask.discard((node, round_index))  # estimate the session's end tops it up to
            self._events_or_none(node, ctx, msg)
            log.warning("late %s of node %d for round %d: not used, charged on ask already", msg.kind, node, msg.round)
            return
        if self._already_charged(node, round_index):
            log.info("dropped a late copy of node %d's %s for round %d: already charged", node, msg.kind, msg.round)
            return
        events, problems = self._events_or_none(node, ctx, msg)
        log.warning("late %s of node %d for round %d: not used, charged%s", msg.kind, node, msg.round,
                    " as planned (its events are not the plan)" if events is None
                    else f" with {'; '.join(problems)}: at the bound" if problems else "")
        self._late[(node, round_index)] = events if events is not None else self._planned_release(node, ctx)

    def _take_report(self, node: int, msg: wire.Message) -> None:
        """A node's own ledger of this session (as it left before the stop, or its answer to the
        stop), kept for :meth:`close`: merged with what it reported before (a ledger only grows;
        messages may cross)."""
        try:
            report = protocol.report_of(msg)
        except wire.WireError as exc:
            log.warning("rejected the ledger report of node %d: %s", node, exc)
            return
        known = self._reports.get(node)
        self._reports[node] = report if known is None else known.merged(report)
        if self._stopping:
            self._stop_answers.add(node)
        else:
            log.info("node %d left before the stop; its ledger report is kept", node)
        self._lock.notify_all()

    def _take_ready(self, node: int, msg: wire.Message) -> None:
        """A node's ready (lock held): noted while the prepare is awaited if it names this run's
        experiment; anything else logged and dropped (it moves nothing)."""
        try:
            key = protocol.ready_of(msg)
        except wire.WireError as exc:
            log.warning("rejected the ready of node %d: %s", node, exc)
            return
        if key != self._experiment_key:
            log.warning("rejected the ready of node %d: experiment %s…, not this run's", node, key[:12])
            return
        # A node that ever said run_seed (a restart in the other mode) keeps it: the weaker claim.
        said = protocol.randomness_of(msg)
        self._randomness[node] = RUN_SEED if RUN_SEED in (said, self._randomness.get(node)) else said
        if not self._preparing:
            log.info("dropped the ready of node %d: the first round has begun", node)
            return
        self._ready.add(node)

    def _reap_hosts(self) -> None:
        """An emulated host that died takes its nodes offline (their rounds straggle)."""
        for host in self._hosts:
            if host.proc.poll() is not None and not host.reaped:
                host.reaped = True
                log.error("the emulated host of nodes %s exited (status %s): %s", _ids(host.node_ids),
                          host.proc.returncode, host.last_error())
                with self._lock:
                    self._offline(set(host.node_ids))

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
                self._lock.wait(min(remaining, _REAP_INTERVAL_S))
            self._drain_pending()
        if missing:
            log.warning("%d node(s) did not report their ledger within %g s of the stop: %s", len(missing),
                        timeout_s, _ids(sorted(missing)))

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
        charged.update(charging.confirmed_by_node(
            {node: report.round_indices() for node, report in reports.items()},
            lambda node, r: r in self._released.get(node, ()) or (node, r) in charged,
            self._as_asked, self._planned_release, has_setup))
        with self._lock:
            self._mark_released(charged)
        return Closing(charged, {node: report.totals for node, report in reports.items()},
                       {node: frozenset(report.round_indices()) for node, report in reports.items()},
                       self.session, self.broker, randomness=dict(self._randomness),
                       server_randomness=self.server_randomness)


@dataclasses.dataclass
class _Collection:
    """A round's replies as they come: ``outstanding`` the expected nodes that neither answered, nor
    refused, nor left yet (the round is complete when it is empty)."""

    ctx: RoundContext
    spec: dict
    metric_spec: dict
    kind: str
    outstanding: set[int]
    answers: dict[int, tuple[dict, list[Event], dict]] = dataclasses.field(default_factory=dict)
    refusals: dict[int, wire.Message] = dataclasses.field(default_factory=dict)
    reasons: dict[int, str] = dataclasses.field(default_factory=dict)
    # node → the events of an update that failed the checks (None: they were not the plan either)
    content_refused: dict[int, list[Event] | None] = dataclasses.field(default_factory=dict)
    arrived_s: dict[int, float] = dataclasses.field(default_factory=dict)  # node → when its answer came (monotonic)

    @functools.cached_property
    def expected(self) -> frozenset[int]:
        """The nodes asked (``ctx.expected``), to look a reply's sender up in."""
        return frozenset(self.ctx.expected)


class _Host:
    """One `testbed ARGS` process (`nodes`, `bridge --virtual`) serving ``node_ids``, with ``env``
    added to this process's environment; a fork of this process with ``fork``
    (testbed.util.forked), else a new interpreter (its command line through ``wrap``: a link's
    namespace). Its stderr goes through a thread that passes it on
    (unless quiet) and keeps the last lines, to explain an early exit."""

    def __init__(self, node_ids: list[int], args: list[str], quiet: bool, env: dict[str, str] | None = None,
                 fork: bool = False, wrap: Callable[[list[str]], list[str]] | None = None):
        self.node_ids = node_ids
        self.reaped = False
        self.proc: subprocess.Popen | ForkedCommand
        if fork:
            self.proc = ForkedCommand(args, env, name=f"nodes {_span(node_ids)}")
        else:
            command = [sys.executable, "-m", "testbed", *args]
            self.proc = subprocess.Popen(wrap(command) if wrap else command, stdout=subprocess.DEVNULL,
                                         stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                                         errors="replace", env={**os.environ, **(env or {})})
        self._tail: collections.deque[str] = collections.deque(maxlen=20)
        self._reader = threading.Thread(target=self._read, args=(quiet,), daemon=True,
                                        name=f"node-host-{self.proc.pid}-stderr")
        self._reader.start()

    def _read(self, quiet: bool) -> None:
        assert self.proc.stderr is not None
        with self.proc.stderr:
            for line in self.proc.stderr:
                self._tail.append(line.rstrip("\n"))
                if not quiet:
                    try:
                        sys.stderr.write(line)
                        sys.stderr.flush()
                    except (OSError, ValueError):  # our own stderr is gone: keep draining the pipe
                        pass

    def last_error(self) -> str:
        """The host's error line (`testbed: ...`, else the last line it wrote) once it exited."""
        self._reader.join(timeout=2.0)  # the pipe ends with the process: everything is read
        lines = [line for line in self._tail if line.strip()]
        errors = [line.removeprefix("testbed: ") for line in lines if line.startswith("testbed: ")]
        return (errors or lines or ["no output"])[-1]

    def stop(self, timeout_s: float) -> None:
        """Wait for the host to leave (it was told to stop), terminate it if it does not."""
        try:
            self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            if timeout_s > 0:
                log.warning("the emulated host of nodes %s did not leave within %g s of the stop; terminated",
                            _ids(self.node_ids), timeout_s)
            self.proc.terminate()
            self.proc.wait(timeout=5)
        self._reader.join(timeout=2.0)


_FIXED_CAPS = MeasuredBounds()  # a node whose profile is not known here


def _node_bounds(mqtt: MqttSection, nodes: NodesSection, node_ids: Sequence[int],
                 algorithm: Algorithm) -> dict[int, MeasuredBounds]:
    """The bounds of each node's measured fields: from the profile it is emulated with here (a
    microcontroller's board profile, else ``nodes.profile``); none for nodes started elsewhere,
    whose profile the run does not declare (the fixed caps)."""
    if not mqtt.emulated:
        return {}
    board = MeasuredBounds.of_board(nodes.mcu_profile, algorithm.flops_per_step) if nodes.mcu else _FIXED_CAPS
    device = MeasuredBounds.of_profile(nodes.profile)
    return {node: board if node in set(nodes.mcu) else device for node in node_ids}


def _check_refusal(msg: wire.Message) -> None:
    """A refusal names the budget a node would break and two finite figures; WireError if not."""
    budget, figures = msg.meta.get("budget"), [msg.meta.get(k) for k in ("would_be", "limit")]
    if not isinstance(budget, str) or not BUDGET_NAME.fullmatch(budget) \
            or not all(v.__class__ in (int, float) and np.isfinite(v) for v in figures):
        raise wire.WireError("bad_header", "a refusal needs a budget name (an identifier) and finite would_be and limit")


def _fork_broker(argv: list[str], stderr_fd: int) -> ForkedCommand:
    """The run's embedded broker (its BrokerOptions' ``launch``) in a fork of this process: serving in
    0.1 s (it imports amqtt only), where a new interpreter imports the testbed first (0.35 s)."""
    return ForkedCommand(argv, name="testbed broker", stderr_fd=stderr_fd)


def _span(ids: Sequence[int]) -> str:
    """``first-last`` of consecutive ids, else the ids with commas: a host's name in ps."""
    return f"{ids[0]}-{ids[-1]}" if list(ids) == list(range(ids[0], ids[-1] + 1)) else ",".join(map(str, ids))


def _ids(ids: Sequence[int]) -> str:
    shown = ", ".join(str(n) for n in list(ids)[:10])
    return shown + (f" and {len(ids) - 10} more" if len(ids) > 10 else "")


def _check_credentials(path: str, node_ids: Sequence[int]) -> None:
    """Every emulated node needs its password in the credentials file (checked before any host
    starts, so the error names the nodes rather than a host that exited)."""
    passwords = _read_credentials(path)
    missing = [n for n in node_ids if str(n) not in passwords]
    if missing:
        raise ConfigError("mqtt.credentials", f"{path} has no password for node(s) {_ids(missing)} "
                          f"(`testbed acl --run RUN --nodes N` writes one for each of nodes 0..N-1)")


def _read_credentials(path: str) -> dict:
    try:
        passwords = json.loads(read_text(Path(path), MAX_TEXT_FILE_BYTES, "file"))
    except (UserError, ValueError) as exc:
        raise ConfigError("mqtt.credentials", f"cannot read {path}: {exc}") from None
    if not isinstance(passwords, dict):
        raise ConfigError("mqtt.credentials", f"{path} is not a credentials file of `testbed acl`")
    return passwords


def _run_access(mqtt: MqttSection, node_ids: Sequence[int]) -> acl.Access | None:
    """The users and topic rules the run's own broker enforces: the run's grants with the passwords
    of ``mqtt.credentials`` (none: anonymous clients, any topic)."""
    if mqtt.credentials is None:
        return None
    passwords = _read_credentials(mqtt.credentials)
    bad = next((user for user, pw in passwords.items()
                if not isinstance(pw, str) or not user or ":" in user or "\n" in user), None)
    if bad is not None:  # the broker's password file holds each as `user:hash`, one a line
        raise ConfigError("mqtt.credentials", f"{mqtt.credentials}: user {bad!r} has no usable password entry")
    try:
        grants = acl.run_grants(mqtt.run_id, [str(n) for n in node_ids])
    except ValueError as exc:  # a node id that is a service user's name
        raise ConfigError("mqtt.credentials", str(exc)) from None
    return acl.Access(grants, passwords)


def _run_keys(m: MqttSection, run: str, node_ids: Sequence[int]) -> auth.Keys | None:
    """The keys the coordinator shares with each node (testbed.mqtt.auth), None with
    ``mqtt.authenticate = false``. The run's emulated boards: derived from a run key made here (new
    at every session); real boards: mqtt.keys, the coordinator's keys file of `testbed provision`.
    The channel emulator, a client of this process, gets a fresh key either way."""
    if not m.authenticate:
        log.warning("messages are not authenticated (mqtt.authenticate = false): anyone on the broker its ACL "
                    "lets in can act for a node or the coordinator")
        return None
    names = [str(n) for n in node_ids]
    if m.emulated:
        keys = auth.Keys.from_run_key(run, auth.new_key(), names)
    elif m.keys is None:
        raise ConfigError("mqtt.keys", "real boards (mqtt.emulated = false) need the coordinator's keys file of "
                          "`testbed provision` (coordinator/keys.json), or mqtt.authenticate = false for a broker you "
                          "trust alone")
    else:
        keys = auth.load_keys(m.keys, run, "mqtt.keys")
        missing = [n for n in names if not keys.holds(n)]
        if missing:
            raise ConfigError("mqtt.keys", f"{m.keys} has no key for node(s) {_ids([int(n) for n in missing])}")
        keys = keys.only(names)
    return keys.with_key(topics.CHANNEL, auth.new_key())


def _credentials(path: str | None, user: str) -> tuple[str | None, str | None]:
    """(username, password) of ``user`` from a `testbed acl` credentials file, or (None, None)."""
    if path is None:
        return None, None
    passwords = _read_credentials(path)
    if user not in passwords:
        raise ConfigError("mqtt.credentials", f"{path} has no password for {user!r}")
    return user, passwords[user]


def _url_at(url: str, address: str) -> str:
    """``url`` (the run's own broker, on loopback) at ``address`` instead: a link's broker end."""
    parsed = parse_broker_url(url)
    return f"{'mqtts' if parsed.tls else 'mqtt'}://{address}:{parsed.port}"


def _host_rates(rate_bps: str | int | list[int] | None, hosts: list[list[int]], algorithm: Algorithm) -> list[int | None]:
    """Each host's link rate in bit/s (None: unshaped) from links.rate_bps: one for all, one per
    host (0: unshaped), or "channel": the algorithm's link model's rate for the host's slowest node
    (its ``link_rate_bps(nodes)``, (N,) bit/s)."""
    if rate_bps is None:
        return [None] * len(hosts)
    if isinstance(rate_bps, int):
        return [rate_bps] * len(hosts)
    if isinstance(rate_bps, list):
        if len(rate_bps) != len(hosts):
            raise ConfigError("links.rate_bps", f"lists {len(rate_bps)} rates for {len(hosts)} emulated hosts "
                              "(mqtt.hosts): one each")
        return [rate or None for rate in rate_bps]
    model = getattr(algorithm, "link_rate_bps", None)
    if model is None:
        raise ConfigError("links.rate_bps", f"\"channel\": this run's algorithm has no link model to take a rate "
                          "from; give the rate in bit/s")
    rates = np.asarray(model([n for group in hosts for n in group]), dtype=float)
    by_node = dict(zip((n for group in hosts for n in group), rates.tolist()))
    return [max(1, int(min(by_node[n] for n in group))) for group in hosts]
