"""Serves nodes over MQTT: one node on a board (`testbed node`), or many emulated nodes in one
process (`testbed nodes`), each with its own MQTT connection and identity.

All clients of a host share one network thread (an epoll loop: a host of 1,000 nodes needs 1,000
sockets and no threads) and put what they receive in one inbox, read by one thread: a broadcast round
arrives once per host, through a shared subscription of its nodes' connections (the broker hands it
to one of them), and becomes one copy per node whose connection is up (the copy's ``receiver`` says
which node it is for); each node checks its own copy, the nodes that take part step together (one stacked node_step, as in sim:
:func:`nodes.agent.step_nodes`), and each reply goes out on that node's own connection, so the
broker (and its ACL) sees every node publish only under its own id.

Which coordinator a host serves (:class:`SessionFence`): a host that a coordinator started (`testbed
nodes --session S --coordinator-pid P`) serves that coordinator's session only and leaves as soon as
that process is gone; a board (`testbed node`) serves whatever session comes, since a resumed run
must reach it, but never goes back to a session once a newer one was seen. Either way a killed
coordinator's nodes do not answer its successor's rounds a second time (twice the compute and the
energy on a real board). Which rounds (:class:`nodes.round_fence.RoundFence`): only the newest round
of the newest session; a host back from a stall (a gap of :data:`_STALL_S` between two batches)
reads its inbox until it is quiet, so a backlog that comes off the connections in several bursts
is fenced as one, and runs none of the rounds that closed meanwhile.

Watching the coordinator: the host polls ``os.getppid()`` (it is the coordinator's direct child, so
its parent id changes when the coordinator dies, whatever the signal), between messages and at
least every :data:`_TICK_S`. Not ``prctl(PR_SET_PDEATHSIG)``: Linux sends that signal when the
*thread* that forked the child exits, and a coordinator may start its hosts from a worker thread
(tests, benchmarks) that ends long before the process; and it is Linux-only.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import logging
import math
import os
import queue
import resource
import secrets
import signal
import threading
import time
from pathlib import Path
from typing import Callable, Iterator, Sequence

from testbed.errors import UserError
from testbed.mqtt import wire
from testbed.mqtt import auth, probe, topics
from testbed.mqtt.carried import Carrier
from testbed.mqtt.client import Inbound, MqttClient, close_all, new_client_id
from testbed.mqtt.client_batches import connect_all, publish_all
from testbed.mqtt.network_loop import NetworkLoop
from testbed.rounds import protocol
from testbed.util.extras import missing_package_message
from testbed.util.threads import limit_blas_threads

from nodes.agent import STEPPED, NodeAgent, NodeProtocol, step_nodes
from nodes.shared_experiment import SharedExperiment
from nodes.costs import NodeCosts
from nodes.round_fence import RoundFence
from nodes.state_lines import StateLines
from testbed.streams.node_secret import NodeSecret

log = logging.getLogger(__name__)

_TICK_S = 0.5  # the host's loop wakes at least this often (coordinator watch, graces)
_GATHER_S = 0.02  # how long a round's first copy waits for the copies of the host's other nodes
_STALL_S = 1.0  # a gap this long between two batches (twice a tick) means the host was stalled
_SETTLE_S = 0.1  # after a stall, the inbox is read until it was quiet this long ...
_SETTLE_MAX_S = 2.0  # ... or for this long at most
_RETIRED_SESSIONS = 64  # sessions a board remembers as superseded
_LEAVING_REPORT_S = 5.0  # at most, for the broker's acks of the ledgers of nodes leaving before the stop


class SessionFence:
    """Which coordinator sessions a host answers.

    Args:
        only: the one session to serve (a host its coordinator started), or None: any session,
            but a session superseded by a newer one is never served again (a board).

    Each refused session is logged once, not once per message (a broadcast round reaches every node
    of a host).
    """

    def __init__(self, only: str | None = None):
        self.only = only
        self.current: str | None = only
        self._retired: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._logged: collections.OrderedDict[str, None] = collections.OrderedDict()

    def admits(self, session: str | None) -> bool:
        """Whether a message of ``session`` is served; a new session (boards only) supersedes the
        current one."""
        if session is not None and session == self.current:
            return True
        if self.only is not None:
            self._refused(session, f"this host serves session {self.only} only")
            return False
        if session is None or session in self._retired:
            self._refused(session, f"superseded by session {self.current}")
            return False
        if self.current is not None:
            log.warning("session %s supersedes session %s: the older one's rounds are ignored from now on",
                        session, self.current)
            _remember(self._retired, self.current, _RETIRED_SESSIONS)
        self.current = session
        return True

    def _refused(self, session: str | None, why: str) -> None:
        key = str(session)
        if key not in self._logged:
            log.warning("ignoring messages of coordinator session %s: %s", session, why)
            _remember(self._logged, key, _RETIRED_SESSIONS)


def _remember(seen: collections.OrderedDict[str, None], key: str, limit: int) -> None:
    seen[key] = None
    while len(seen) > limit:
        seen.popitem(last=False)


class CoordinatorWatch:
    """Whether the process that started this host is still alive.

    Args:
        pid: the coordinator's process id, or None (nothing to watch: a board).

    When this process is ``pid``'s child (the usual case), the parent id changing means the
    coordinator died (even by SIGKILL) and the host was re-parented; otherwise (started through a
    wrapper) the pid is probed with signal 0, which a recycled pid could fool.
    """

    def __init__(self, pid: int | None):
        self.pid = pid
        self._direct = pid is not None and os.getppid() == pid

    def alive(self) -> bool:
        if self.pid is None:
            return True
        if self._direct:
            return os.getppid() == self.pid
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:  # exists, owned by someone else
            return True
        return True


def serve(broker_url: str, run: str, node_ids: Sequence[int], *, data_path: str | None = None,
          state_dir: Path | None = None, costs: NodeCosts | None = None, protocol_version: str = "auto",
          coordinator_grace_s: float = 30.0, connect_timeout_s: float = 30.0,
          max_chunk_bytes: int = 256 * 1024, credentials: dict[str, str] | None = None,
          tls_ca: str | None = None, crash_at_round: int | None = None, crash_after_reply: bool = False,
          crash_after_log: bool = False,
          agent_factory: Callable[[int], NodeProtocol] | None = None, session: str | None = None,
          coordinator_pid: int | None = None, broadcast: str = "auto", states: StateLines | None = None,
          secret: NodeSecret | None = None, keys: auth.Keys | None = None) -> int:
    """Serve ``node_ids`` of run ``run`` until the coordinator says stop; returns the number of
    rounds answered.

    The host leaves on its own when the coordinator has been offline (its last will) for
    ``coordinator_grace_s`` seconds: a broker restart makes it blink offline, a killed coordinator
    stays offline and its nodes should not linger. A broker outage alone never ends it: the
    clients reconnect with backoff for as long as it lasts (whether the run survives it is the
    coordinator's call, ``mqtt.outage_limit_s``); a board used to leave after 30 s of it. ``credentials`` (node id → password, from
    `testbed acl`) log each node in under its own name, which the broker's ACL checks.
    ``crash_at_round`` emulates a board that loses power mid-round: the process exits at once,
    without a reply or a clean disconnect, when that round arrives (with ``crash_after_reply``: just
    after its first reply of that round went out, e.g. its transmit signal; with ``crash_after_log``:
    after its step logged the release, before the reply is sent). ``agent_factory`` builds the
    node for an id (default: a :class:`NodeAgent` with ``data_path``, ``state_dir`` and ``costs``);
    another kind of board (a bridged microcontroller) plugs in here. ``secret``: the board's
    (testbed.streams.node_secret), which keys its nodes' private draws; None: the run's seed does.

    ``session`` and ``coordinator_pid`` (a host its coordinator started): serve that session only,
    and leave at once when that process is gone, without a clean disconnect, so the broker
    publishes every node's last will (offline). Their lifetimes being tied, such a host outlives
    any broker outage or coordinator blink its coordinator waits out (no grace applies).

    ``broadcast``: how a host of several nodes reads the broadcast: "shared" once, through a
    shared subscription of its own (testbed.mqtt.topics); "per-node" once per node; "auto" shared
    when the broker says it serves shared subscriptions (:func:`_broadcast_group`).

    ``keys``: the nodes' message keys (testbed.mqtt.auth): every message sealed and verified with
    them; None for a coordinator with mqtt.authenticate = false.

    ``states`` (a board's `testbed node` or `testbed bridge`, unless ``--quiet``): one line per change
    of state (connecting, connected, waiting for a run, joined run R, round k done, run ended,
    reconnecting), :mod:`nodes.state_lines`.
    """
    limit_blas_threads(1)  # the hosts on a machine share its cores
    watch = CoordinatorWatch(coordinator_pid)
    if not watch.alive():  # it died while this host started: nobody to serve, no broker to wait for
        log.warning("coordinator (pid %s) of run %s is gone; not serving", coordinator_pid, run)
        return 0
    inbox: queue.Queue[Inbound] = queue.Queue()
    network = NetworkLoop()
    _allow_open_files(len(node_ids) + 64)
    costs = costs or NodeCosts()
    if agent_factory is None:
        shared = SharedExperiment(node_ids, data_path)  # the nodes' stacked steps

        def agent_factory(node: int) -> NodeProtocol:
            return NodeAgent(node, data_path=data_path, state_dir=state_dir, costs=costs, shared=shared, secret=secret)
    agents = {str(n): agent_factory(n) for n in node_ids}
    clients: dict[str, MqttClient] = {}

    try:
        names = list(agents)
        started = time.monotonic()
        if states is not None:
            states.connecting(broker_url)
        # One raw probe for the host (as the first node) learns the protocol and whether the broker
        # serves shared subscriptions, and says at once what paho would only time out on; the nodes
        # then skip it (one connection per node, not two) and connect concurrently (connect_all),
        # since a connect is mostly waiting for the broker's acks and hundreds in a row add up to
        # seconds; at most CONNECTS_IN_FLIGHT of a host's at a time.
        try:
            broker = probe.negotiate(broker_url, tls_ca=tls_ca, protocol=protocol_version,
                                     client_id=new_client_id(run, f"{names[0]}-probe"),
                                     username=names[0] if credentials is not None else None,
                                     password=credentials.get(names[0]) if credentials is not None else None,
                                     deadline=started + connect_timeout_s, timeout_s=connect_timeout_s)
        except UserError as exc:  # an untrusted certificate, a TLS/plain mismatch, no broker...
            raise UserError(f"node {names[0]}: {exc}") from None
        group = _broadcast_group(broadcast, broker, len(names))

        for name in names:
            if credentials is not None and name not in credentials:
                raise UserError(f"the credentials file has no password for node {name}")
            # The coordinator's status is the host's to watch, once: sealed for every node of the
            # run it is a tag per node long, and each of N nodes reading (and verifying) it was N²
            # (2 GB through the broker and minutes of CPU at 10,000 nodes). A host that serves any
            # session (boards) has each node read it: each says again it is online to a new one.
            watches = session is None or name == names[0]
            clients[name] = MqttClient.for_node(
                broker_url, run, name, inbox=inbox, network=network, protocol=broker.protocol,
                subscriptions=topics.node_subscriptions(run, name, group, coordinator_status=watches),
                max_chunk_bytes=max_chunk_bytes,
                username=name if credentials is not None else None,
                password=credentials[name] if credentials is not None else None, tls_ca=tls_ca,
                keys=keys, auth_session=session or "",
                on_connection=None if states is None else functools.partial(states.connection, broker_url=broker_url))
        connect_all({f"node {name}": client for name, client in clients.items()}, connect_timeout_s,
                    probe_first=False)
        log.info("serving %d node(s) of run %s on %s (connected in %.1f s)", len(clients), run, broker_url,
                 time.monotonic() - started)
        if states is not None:
            states.connected(broker_url, time.monotonic() - started)
            states.waiting(run)
        crash = None if crash_at_round is None else \
            (crash_at_round, "after_reply" if crash_after_reply else "after_log" if crash_after_log else "arrival")
        if coordinator_pid is not None:
            coordinator_grace_s = math.inf
        members = None if group is None else (lambda: [name for name, c in clients.items() if c.connected])
        # A host its coordinator started carries a round's replies in one message (testbed.mqtt.
        # carried): that coordinator takes them, each frame sealed by its own node. A container
        # holds no more than a frame may (max_chunk_bytes), nor than the coordinator takes in one
        # message (wire.DEFAULT_MAX_BYTES); a frame alone travels as before.
        carrier = Carrier(run, min(max_chunk_bytes, wire.DEFAULT_MAX_BYTES)) \
            if keys is not None and session is not None else None
        with _signals_interrupt():
            return _loop(inbox, agents, clients, run, coordinator_grace_s, crash, SessionFence(session), watch,
                         members, network, states=states, carrier=carrier)
    finally:
        if watch.alive():  # else no clean disconnect: the broker publishes each node's will at once
            # Together: each close waits for the broker's ack of its offline status and for its
            # socket to close, 50 of them in a row were a tenth of a second.
            close_all(clients.values())
        network.close()
        for agent in agents.values():
            agent.close()


@contextlib.contextmanager
def _signals_interrupt() -> Iterator[None]:
    """Within: SIGTERM (a service manager, the coordinator ending its hosts) interrupts the host as
    Ctrl-C's SIGINT does, so that its nodes report their ledgers and disconnect cleanly before the
    process ends (:func:`_loop`); only where Python delivers signals (the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, signal.default_int_handler) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _report_leaving(agents: dict[str, NodeProtocol], clients: dict[str, MqttClient], run: str,
                    stopped: set[str]) -> None:
    """Each node leaving before it answered the run's stop sends its own ledger of the session
    (:meth:`nodes.agent.NodeAgent.leaving_report`), acknowledged within :data:`_LEAVING_REPORT_S` in
    all: the coordinator keeps the most of what it charged and what the node says, and calls the
    node's figures confirmed rather than unconfirmed."""
    items = [(clients[name], topics.up(run, name), report.payload) for name, agent in agents.items()
             if name not in stopped and name in clients and clients[name].connected
             and (report := agent.leaving_report()) is not None]
    if not items:
        return
    problems = publish_all(items, _LEAVING_REPORT_S)
    log.info("%d node(s) leaving before the stop sent their ledger (%d not acknowledged)", len(items), len(problems))
    for problem in problems:
        log.warning("a leaving node's ledger report: %s", problem)


def _broadcast_group(mode: str, broker: probe.Negotiated, nodes: int) -> str | None:
    """The shared subscription group a host's ``nodes`` read the broadcast through, or None (each
    node reads its own copy). "shared": always (more than one node); "per-node": never; "auto":
    when the ``broker`` said so to the probe (an MQTT 5 CONNACK); a 3.1.1 broker cannot say,
    and one without shared subscriptions (RabbitMQ 3.x) takes ``$share/...`` for a filter nobody
    publishes on: its nodes would never hear a round. A group is this host's alone (48 random
    bits): another host's nodes are not its members."""
    if nodes < 2 or mode == "per-node" or (mode == "auto" and not broker.shared_subscriptions):
        return None
    return f"host-{secrets.token_hex(6)}"


def _allow_open_files(count: int) -> None:
    """Raise this process's soft limit on open files to ``count`` if the hard limit allows (many
    systems default to a soft limit of 1,024)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = count if hard == resource.RLIM_INFINITY else min(count, hard)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))


def _loop(inbox: queue.Queue[Inbound], agents: dict[str, NodeProtocol], clients: dict[str, MqttClient],
          run: str, grace_s: float, crash: tuple[int, str] | None, fence: SessionFence | None = None,
          watch: CoordinatorWatch | None = None, broadcast_members: Callable[[], list[str]] | None = None,
          network: NetworkLoop | None = None, rounds: RoundFence | None = None,
          states: StateLines | None = None, carrier: Carrier | None = None) -> int:
    """Serve until every node was told to stop (or the coordinator is gone, or the host is
    interrupted: Ctrl-C, SIGTERM); the rounds answered. Nodes that leave before they answered the
    stop send their own ledger first (:func:`_report_leaving`), unless the coordinator is gone.

    What arrived together is served together: the round (and setup) messages of :class:`NodeAgent`
    nodes step at once (:func:`nodes.agent.step_nodes`), everything else one message at a time, in the
    order it came. A round that has closed is never served (``rounds``: after a stall, the inbox
    holds several rounds of a node; only the newest is current). ``states`` hears of each session
    joined, round answered and the end (:mod:`nodes.state_lines`)."""
    fence = fence or SessionFence()
    rounds = rounds or RoundFence()
    watch = watch or CoordinatorWatch(None)
    answered, stopped = 0, set()
    last_gathered = time.monotonic()
    joined: str | None = None  # the session the state lines last said was joined
    carrier = carrier if crash is None else None  # an emulated crash sends each reply as it comes
    why_ended = "the coordinator ended it"
    coordinator_offline_since: float | None = None
    interrupted = False
    try:
        while len(stopped) < len(agents):
            if not watch.alive():
                log.warning("coordinator (pid %s) of run %s is gone; leaving", watch.pid, run)
                why_ended = "its coordinator is gone"
                break
            gathered = _gather(inbox, _TICK_S, agents, broadcast_members)
            if gathered and time.monotonic() - last_gathered > _STALL_S:  # back from a stall (SIGSTOP, swap,
                # a long step): the backlog may still be coming in bursts; all of it is fenced at once
                gathered += _settle(inbox, broadcast_members)
            items = rounds.current(gathered, fence.admits)
            now = last_gathered = time.monotonic()
            if coordinator_offline_since is not None and now - coordinator_offline_since > grace_s:
                log.warning("coordinator of run %s offline for %.0f s; leaving", run, grace_s)
                why_ended = f"its coordinator has been offline for {grace_s:.0f} s"
                break
            # What the items bring goes out together (a round's or a setup's replies: one wake-up of
            # the network thread, not one per node; with a carrier, one message); not with an
            # emulated crash, which waits for its reply's ack.
            with network.batch() if network is not None and crash is None else contextlib.nullcontext(), \
                    carrier or contextlib.nullcontext():  # flushed first, into the network's batch
                stepped: list[tuple[str, wire.Message]] = []
                for item in items:
                    if item.kind == topics.COORD:
                        online = item.payload == topics.STATUS_ONLINE
                        coordinator_offline_since = None if online else (coordinator_offline_since or time.monotonic())
                        continue
                    msg, name = item.message, item.receiver
                    if msg is None or name not in agents or not fence.admits(protocol.session_of(msg)):
                        continue
                    if states is not None and fence.current != joined:
                        joined = fence.current
                        states.joined(run, str(joined))
                    if msg.kind == protocol.STOP:  # answered with the node's own ledger of the session
                        stopped.add(name)
                        try:
                            report = agents[name].handle(msg)
                        except Exception as exc:  # noqa: BLE001  logged by _send as that node's failure
                            report = exc
                        _send(name, msg, report, clients, run, False, carrier=carrier)
                        continue
                    crash_now = crash is not None and msg.kind == protocol.ROUND and msg.round == crash[0]
                    if msg.kind in STEPPED and not crash_now and type(agents[name]) is NodeAgent:
                        stepped.append((name, msg))
                        continue
                    answered += _answer_steps(stepped, agents, clients, run, states, carrier)
                    stepped = []
                    if crash_now and crash[1] == "arrival":
                        log.warning("node %s: emulated crash at round %d", name, msg.round)
                        os._exit(1)
                    try:
                        outcome = agents[name].handle(msg)
                    except Exception as exc:  # noqa: BLE001  logged by _send as that node's failure
                        outcome = exc
                    if crash_now and crash[1] == "after_log":  # its release logged (on disk), never sent
                        log.warning("node %s: emulated crash after logging round %d", name, msg.round)
                        os._exit(1)
                    answered += _send(name, msg, outcome, clients, run, crash_now, states, carrier)
                answered += _answer_steps(stepped, agents, clients, run, states, carrier)
    except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (_signals_interrupt): the nodes leave, reporting first
        log.warning("interrupted; the nodes of run %s leave", run)
        why_ended, interrupted = "it was interrupted", True
    if watch.alive():  # a coordinator that is gone hears nothing
        _report_leaving(agents, clients, run, stopped)
    if states is not None:
        states.ended(run, answered, why_ended)
    if interrupted:
        raise KeyboardInterrupt
    return answered


def _answer_steps(stepped: list[tuple[str, wire.Message]], agents: dict[str, NodeProtocol],
                  clients: dict[str, MqttClient], run: str, states: StateLines | None = None,
                  carrier: Carrier | None = None) -> int:
    """Step the nodes of ``stepped`` together and send each its reply (written together with the
    rest of what the host gathered, see :func:`_loop`); the updates sent."""
    if not stepped:
        return 0
    outcomes = step_nodes([agents[name] for name, _ in stepped], [msg for _, msg in stepped])  # type: ignore[misc]
    return sum(_send(name, msg, outcome, clients, run, False, states, carrier)
               for (name, msg), outcome in zip(stepped, outcomes))


def _send(name: str, msg: wire.Message, outcome: protocol.Reply | None | Exception,
          clients: dict[str, MqttClient], run: str, crash_now: bool, states: StateLines | None = None,
          carrier: Carrier | None = None) -> int:
    """Publish node ``name``'s reply to ``msg`` on its own connection (an uplink to the coordinator:
    sealed by it, and given to ``carrier`` when there is one), or log why there is none; 1 if an
    update went to the coordinator (a round of it, not the setup, told to ``states``)."""
    if isinstance(outcome, wire.WireError):
        log.warning("node %s rejected %s of round %d: %s", name, msg.kind, msg.round, outcome)
        return 0
    if isinstance(outcome, UserError):  # e.g. the node lacks the data file: say so, keep serving
        log.error("node %s cannot run round %d: %s", name, msg.round, outcome)
        return 0
    if isinstance(outcome, ModuleNotFoundError):  # e.g. an "rdp" budget on a board without dp-accounting
        log.error("node %s cannot run round %d: %s", name, msg.round, missing_package_message(outcome) or outcome)
        return 0
    if isinstance(outcome, Exception):  # anything a message made a node's step fail on: that node
        # straggles, the host and its other nodes keep serving
        log.error("node %s failed on %s of round %d", name, msg.kind, msg.round, exc_info=outcome)
        return 0
    if outcome is None:
        return 0
    to_channel = outcome.to == protocol.CHANNEL
    # Not waiting for the broker's ack: a host answers for many nodes, and an ack awaited
    # per reply made them wait on each other (a broker round trip each, 0.3 s a round
    # for 50 nodes on a loaded host). paho resends unacked frames after a reconnect and
    # logs a broker's refusal; an emulated crash waits, so its reply is surely out.
    topic = (topics.tx if to_channel else topics.up)(run, name)
    if carrier is not None and not to_channel and not crash_now:
        carrier.add(clients[name], name, outcome.message)
    else:
        clients[name].publish(topic, outcome.payload, timeout_s=30.0 if crash_now else None)
    if crash_now:
        log.warning("node %s: emulated crash after its reply of round %d", name, msg.round)
        os._exit(1)
    if to_channel or msg.kind == protocol.PREPARE:  # a ready is no round answered
        return 0
    if states is not None and msg.kind in (protocol.ROUND, protocol.RECEIVED):  # over the air: its second half
        states.round_done(msg.round)
    return 1


def _gather(inbox: queue.Queue[Inbound], timeout_s: float, agents: dict[str, NodeProtocol],
            broadcast_members: Callable[[], list[str]] | None = None) -> list[Inbound]:
    """What the inbox holds: the first item waited for up to ``timeout_s``, then whatever else is
    there; while a round's (or setup's) copies for this host's expected nodes are still coming (each node's own
    connection delivers its own), up to :data:`_GATHER_S` more for them, so they step together.

    With ``broadcast_members`` (the host's nodes read the broadcast through one shared
    subscription), a broadcast arrives once and becomes one copy for each node it names whose
    connection is up: a node cut off from the broker would not have heard it either."""
    first = _next(inbox, timeout_s)
    if first is None:
        return []
    items: list[Inbound] = []
    expected: dict[tuple, frozenset[str]] = {}  # (session, round) -> this host's expected nodes
    waiting: dict[tuple, int] = {}  # (session, round) -> their copies still to come
    deadline = time.monotonic() + _GATHER_S
    item: Inbound | None = first
    while True:
        copies = _copies(item, broadcast_members)  # each with ``item``'s message: looked at once
        items += copies
        msg = item.message
        if msg is not None and msg.kind in STEPPED:
            key = (protocol.session_of(msg), msg.round)
            if key not in expected:
                try:
                    expected[key] = frozenset(str(n) for n in protocol.expected_of(msg)) & agents.keys()
                except wire.WireError:  # the node's own check says so; nothing to wait for
                    expected[key] = frozenset()
                waiting[key] = len(expected[key])
            mine = expected[key]
            waiting[key] -= sum(copy.receiver in mine for copy in copies)
        try:
            item = inbox.get_nowait()
        except queue.Empty:
            remaining = deadline - time.monotonic()
            if not any(left > 0 for left in waiting.values()) or remaining <= 0:
                return items
            item = _next(inbox, remaining)
            if item is None:
                return items


def _settle(inbox: queue.Queue[Inbound], broadcast_members: Callable[[], list[str]] | None = None) -> list[Inbound]:
    """What more comes into the inbox until it has been quiet for :data:`_SETTLE_S` (at most
    :data:`_SETTLE_MAX_S`): after a stall, the messages that arrived meanwhile come off the
    connections in bursts, and a round closed by a message of a later burst must not be stepped."""
    items: list[Inbound] = []
    deadline = time.monotonic() + _SETTLE_MAX_S
    while True:
        item = _next(inbox, min(_SETTLE_S, max(deadline - time.monotonic(), 0.0)))
        if item is None:
            return items
        items += _copies(item, broadcast_members)


def _copies(item: Inbound, broadcast_members: Callable[[], list[str]] | None) -> list[Inbound]:
    """``item`` for each node it is for: a broadcast read through the host's shared subscription is
    for every member; anything else, for the node whose connection it came on."""
    if broadcast_members is None or item.kind != topics.BCAST:
        return [item]
    return [Inbound.of(item.topic, item.kind, item.node, item.payload, item.message, name)
            for name in broadcast_members()]


def _next(inbox: queue.Queue[Inbound], timeout_s: float) -> Inbound | None:
    try:
        return inbox.get(timeout=timeout_s)
    except queue.Empty:
        return None
