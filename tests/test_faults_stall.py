"""Invariant 6: work is never done for a round that has closed. A host or a bridge that comes back
from a stall finds the rounds that closed meanwhile in its inbox: it runs none of them (nothing
released, nothing charged) and answers the current one; a board stalled past its bridge's wait has
the round it ran charged once, never the rounds after it; a damaged frame of an update is asked for
again before the round is given up.

The coordinator is emulated (as in tests/test_mqtt_lifecycle.py): it sends round r + 1 once round r
closed (every node answered, or, for a stalled node, its deadline passed); a stall of k rounds puts
the k rounds that closed meanwhile and the current one (or the stop) in the inbox at once."""

from __future__ import annotations

import logging
import queue
import shutil
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from firmware_bridge.agent import BridgeAgent
from firmware_bridge.virtual import HostBoard
from nodes import host
from nodes.agent import NodeAgent
from nodes.shared_experiment import SharedExperiment
from nodes.host import _loop
from nodes.round_fence import RoundFence, round_order
from testbed.algorithms.contract import RoundContext
from testbed.assembly import assemble
from testbed.assembly.assemble import load_data, model_for
from testbed.assembly.config import load_config_text, to_toml
from testbed.ledger.fields import event_from_dict
from testbed.ledger.files import read_ledger
from testbed.mqtt import wire
from testbed.mqtt import topics
from testbed.mqtt.client import Inbound
from testbed.rounds import protocol

RUN, SESSION = "stall", "s1"
ROUNDS = 12
CONFIG = to_toml(load_config_text(f"""
[data]
num_nodes = 3
samples_per_node = 60
dim = 4
[dp_pasgd]
steps = {3 * ROUNDS}
tau = 3
batch = 8
lr = 0.5
sigma = 1.0
[nodes]
mcu = [2]
"""))
THETA = np.linspace(-0.2, 0.2, 10)


def _item(raw: bytes, receiver: str) -> Inbound:
    return Inbound(topics.bcast(RUN), topics.BCAST, None, raw, wire.decode(raw), receiver)


class _Coordinator:
    """Rounds 0 .. ROUNDS-1 to ``nodes``, each once the round before closed; then the stop.

    Args:
        stall_at, stall_rounds: the host's nodes miss rounds ``stall_at .. stall_at+k-1`` (they
            close by their deadline): those and the next (or the stop) reach the host together.
        given_stalls: the stall begins while the host runs round ``stall_at`` (a bridge's board
            blocks in it), not before it arrives.
    """

    def __init__(self, inbox: queue.Queue, nodes: list[int], stall_at: int, stall_rounds: int,
                 given_stalls: bool = False):
        self.inbox, self.nodes = inbox, nodes
        self.stall_at, self.stall_rounds, self.given_stalls = stall_at, stall_rounds, given_stalls
        self.answered: dict[int, list[int]] = {n: [] for n in nodes}  # node -> rounds of its updates
        self.released: dict[int, list] = {n: [] for n in nodes}  # node -> events its updates carried
        self.current = -1

    def start(self) -> None:
        self._after(-1)

    def _send(self, first: int, current: int) -> None:
        """Rounds ``first .. current`` at once (those before ``current`` closed meanwhile); the
        stop too when ``current`` is past the last round."""
        for r in range(first, min(current, ROUNDS - 1) + 1):
            raw = protocol.round_(RUN, SESSION, r, CONFIG, self.nodes, {"model": THETA})
            for n in self.nodes:
                self.inbox.put(_item(raw, str(n)))
            self.current = r
        if current >= ROUNDS:
            raw = protocol.stop(RUN, SESSION, "completed", ROUNDS - 1)
            for n in self.nodes:
                self.inbox.put(_item(raw, str(n)))

    def _after(self, closed: int) -> None:
        """Round ``closed`` closed: the next round, or those a stall made close meanwhile."""
        end = self.stall_at + self.stall_rounds  # the current round once the stall is over
        if self.given_stalls and closed == self.stall_at:  # the stall began in round `closed`
            self._send(closed + 1, end)
        elif not self.given_stalls and closed + 1 == self.stall_at:  # missed while stalled
            self._send(self.stall_at, end)
        else:
            self._send(closed + 1, closed + 1)

    def replied(self, payload: bytes) -> None:
        msg = wire.decode(payload)
        if msg.kind == protocol.LEDGER:  # the node's answer to the stop: not a round it ran
            return
        node = int(msg.sender)
        self.answered[node].append(msg.round)
        self.released[node] += [event_from_dict(e) for e in msg.meta["events"]]
        if all(self.current in rounds for rounds in self.answered.values()):
            self._after(self.current)

    def closed(self, round_index: int) -> None:
        """A node handled ``round_index`` without an update (a straggler): its deadline closes it."""
        if round_index == self.current and not all(round_index in r for r in self.answered.values()):
            self._after(round_index)


class _Client:
    connected = True

    def __init__(self, coordinator: _Coordinator):
        self.coordinator = coordinator

    def publish(self, topic: str, payload: bytes, timeout_s: float | None = 30.0) -> None:
        self.coordinator.replied(payload)


def _answered_rounds(stall_at: int, k: int) -> list[int]:
    """The rounds a node answers: all but those that closed during its stall."""
    return [r for r in range(ROUNDS) if not stall_at <= r < stall_at + k]


def _ledger(state_dir: Path, node: int) -> list:
    return list(read_ledger(state_dir / f"ledger-{RUN}-{SESSION}-node{node}.csv"))


def _kinds_by_round(events) -> list[tuple[int, str]]:
    return sorted((e.round, e.kind) for e in events)


STALLS = {"first": lambda k: 0, "middle": lambda k: (ROUNDS - k) // 2, "last": lambda k: ROUNDS - k}


# ------------------------------------------------------------------------------------------- a host

@pytest.mark.parametrize("k", [1, 3, 8])
@pytest.mark.parametrize("where", list(STALLS))
def test_a_host_back_from_a_stall_runs_no_closed_round(tmp_path, k, where, caplog):
    """Two emulated nodes stepped together (one shared experiment): after the stall only the
    current round is run; a stall through the last round runs nothing more."""
    stall_at = STALLS[where](k)
    inbox: queue.Queue[Inbound] = queue.Queue()
    nodes = [0, 1]
    coordinator = _Coordinator(inbox, nodes, stall_at, k)
    shared = SharedExperiment(nodes)
    agents = {str(n): NodeAgent(n, state_dir=tmp_path, shared=shared) for n in nodes}
    fence = RoundFence()
    coordinator.start()
    with caplog.at_level(logging.WARNING, logger="nodes.round_fence"):
        answered = _loop(inbox, agents, {str(n): _Client(coordinator) for n in nodes}, RUN, 30.0, None,
                         rounds=fence)
    for agent in agents.values():
        agent.close()
    expected = _answered_rounds(stall_at, k)
    assert answered == len(nodes) * len(expected)
    assert fence.skipped == len(nodes) * k  # each closed round dropped, for each node
    assert len([r for r in caplog.records if "closed round" in r.getMessage()]) == 1  # one line per stall
    for n in nodes:
        assert coordinator.answered[n] == expected
        ledger = _ledger(tmp_path, n)
        assert {e.round for e in ledger} == set(expected)  # nothing charged for a closed round
        assert _kinds_by_round(ledger) == _kinds_by_round(coordinator.released[n])  # charged = released


def test_a_round_older_than_one_served_is_never_stepped(tmp_path):
    """A round that comes after a newer one was served (reordered, or re-delivered) is closed."""
    inbox: queue.Queue[Inbound] = queue.Queue()
    agent = NodeAgent(0, state_dir=tmp_path)
    replies = []

    class Client:
        connected = True

        def publish(self, topic, payload, timeout_s=None):
            if wire.decode(payload).kind == protocol.LEDGER:  # its answer to the stop
                return
            replies.append(wire.decode(payload).round)
            if len(replies) == 1:  # round 5 answered: round 4 (closed) arrives late, round 5 again
                inbox.put(_item(protocol.round_(RUN, SESSION, 4, CONFIG, [0], {"model": THETA}), "0"))
                inbox.put(_item(protocol.round_(RUN, SESSION, 5, CONFIG, [0], {"model": THETA}), "0"))
            else:
                inbox.put(_item(protocol.stop(RUN, SESSION, "completed", 5), "0"))

    inbox.put(_item(protocol.round_(RUN, SESSION, 5, CONFIG, [0], {"model": THETA}), "0"))
    fence = RoundFence()
    _loop(inbox, {"0": agent}, {"0": Client()}, RUN, 30.0, None, rounds=fence)
    agent.close()
    assert replies == [5, 5] and fence.skipped == 1  # a repeat of the current round is answered again
    assert {e.round for e in _ledger(tmp_path, 0)} == {5}


def _msg(kind: str, round_index: int, session: str = SESSION) -> bytes:
    if kind == protocol.ROUND:
        return protocol.round_(RUN, session, round_index, CONFIG, [0], {"model": THETA})
    if kind == protocol.SETUP:
        return protocol.setup(RUN, session, CONFIG, [0])
    if kind == protocol.RECEIVED:
        return protocol.received(RUN, session, round_index, [0], np.zeros(3))
    return protocol.stop(RUN, session, "completed", round_index)


@pytest.mark.parametrize("gap_s", [0.03, 0.08])
def test_a_backlog_arriving_in_two_bursts_after_a_stall_runs_no_closed_round(tmp_path, monkeypatch, gap_s):
    """The issue's case: a board SIGSTOPped through round 4, whose backlog (round 4, then round 5
    and the stop) comes off the connections in two bursts. Back from the stall, the host reads its
    inbox until it is quiet, so round 4 (closed by round 5 of the second burst) is never run."""
    monkeypatch.setattr(host, "_STALL_S", -1.0)  # every batch comes after a stall (a SIGSTOP cannot be sent to a thread)
    inbox: queue.Queue[Inbound] = queue.Queue()
    agent = NodeAgent(0, state_dir=tmp_path)
    replies = []

    class Client:
        connected = True

        def publish(self, topic, payload, timeout_s=None):
            if wire.decode(payload).kind != protocol.LEDGER:
                replies.append(wire.decode(payload).round)

    def second_burst():
        time.sleep(gap_s)
        inbox.put(_item(protocol.round_(RUN, SESSION, 5, CONFIG, [0], {"model": THETA}), "0"))
        time.sleep(gap_s)
        inbox.put(_item(protocol.stop(RUN, SESSION, "completed", 5), "0"))

    inbox.put(_item(protocol.round_(RUN, SESSION, 4, CONFIG, [0], {"model": THETA}), "0"))
    threading.Thread(target=second_burst, daemon=True).start()
    fence = RoundFence()
    host._loop(inbox, {"0": agent}, {"0": Client()}, RUN, 30.0, None, rounds=fence)
    agent.close()
    assert replies == [] and fence.skipped == 2  # rounds 4 and 5: the stop closed round 5 in the same batch
    assert not (tmp_path / f"ledger-{RUN}-{SESSION}-node0.csv").exists() or not _ledger(tmp_path, 0)


@pytest.mark.parametrize("late", [(protocol.ROUND, 4), (protocol.ROUND, 0), (protocol.SETUP, 0),
                                  (protocol.RECEIVED, 4)], ids=["round-4", "round-0", "setup", "received-4"])
def test_each_message_of_a_closed_round_is_dropped_alone_after_a_newer_one_served(late):
    """Any node's newer round closes the round for every node of the host: the coordinator sends
    round r+1 only after round r closed for all (a node not asked again included)."""
    fence = RoundFence()
    assert len(fence.current([_item(_msg(protocol.ROUND, 5), "0")])) == 1
    assert fence.current([_item(_msg(*late), "0")]) == [] and fence.skipped == 1
    assert fence.current([_item(_msg(*late), "1")]) == [] and fence.skipped == 2  # another node: closed too
    kept = [_item(_msg(protocol.ROUND, 5), "0"), _item(_msg(protocol.RECEIVED, 5), "1")]  # the current round
    assert fence.current(kept) == kept and fence.skipped == 2
    stop = _item(_msg(protocol.STOP, 5), "0")
    assert fence.current([stop]) == [stop]
    assert fence.current([_item(_msg(protocol.ROUND, 5), "1")]) == [] and fence.skipped == 3  # the stop closed it


def test_a_newer_session_closes_every_round_of_the_one_before():
    fence = RoundFence()
    old, new = _item(_msg(protocol.ROUND, 7), "0"), _item(_msg(protocol.ROUND, 2, "s2"), "0")
    assert fence.current([old, new]) == [new]  # in one batch: the older session's round is closed
    assert fence.current([_item(_msg(protocol.ROUND, 8), "1")]) == []  # and in any batch after
    assert fence.current([_item(_msg(protocol.STOP, 8), "1")]) == []  # nothing of it is served
    assert fence.skipped == 2


def test_a_session_the_host_refuses_closes_nothing():
    fence = RoundFence()
    mine = _item(_msg(protocol.ROUND, 3), "0")
    assert fence.current([mine]) == [mine]
    foreign = [_item(_msg(protocol.ROUND, 9, "other"), "0"), _item(_msg(protocol.STOP, 9, "other"), "0")]
    assert fence.current(foreign, admits=lambda session: session == SESSION) == []
    assert fence.current([mine], admits=lambda session: session == SESSION) == [mine] and fence.skipped == 0


# The backlog of a stalled host: each element (kind, round, session, node) in arrival order.
_KINDS = st.sampled_from([protocol.ROUND, protocol.ROUND, protocol.RECEIVED, protocol.SETUP, protocol.STOP])
_BACKLOG = st.lists(st.tuples(_KINDS, st.integers(0, 6), st.sampled_from(["s1", "s2", "s3"]), st.sampled_from("01")),
                    min_size=1, max_size=14)


@settings(max_examples=300, deadline=None)
@given(backlog=_BACKLOG, copies=st.lists(st.integers(1, 3), min_size=14, max_size=14),
       cut=st.integers(0, 42), fence_only=st.sampled_from([None, "s1", "s2"]))
def test_a_broadcasts_copies_are_decided_as_copies_decoded_apart(backlog, copies, cut, fence_only):
    """A broadcast read through a host's shared subscription becomes a copy per node, all one
    message object (nodes.host._copies), and the fence decides such copies once: it hands on and
    skips exactly what it does with copies each decoded apart, batch by batch, its session fence
    refusing a session or not."""
    shared, apart = [], []
    for (kind, r, session, node), n in zip(backlog, copies):
        raw = _msg(kind, r, session)
        msg = wire.decode(raw)
        for k in range(n):
            shared.append(Inbound(topics.bcast(RUN), topics.BCAST, None, raw, msg, f"{node}{k}"))
            apart.append(_item(raw, f"{node}{k}"))
    admits = None if fence_only is None else (lambda session: session == fence_only)
    handed = []
    for items in (shared, apart):
        fence, where = RoundFence(), {id(item): i for i, item in enumerate(items)}
        cut_at = min(cut, len(items))
        handed.append(([where[id(item)] for batch in (items[:cut_at], items[cut_at:])
                        for item in fence.current(batch, admits)], fence.skipped))
    assert handed[0] == handed[1]


@settings(max_examples=300, deadline=None)
@given(backlog=_BACKLOG, cuts=st.lists(st.integers(0, 14), max_size=5))
def test_no_round_closed_by_an_earlier_message_is_stepped_whatever_the_batches(backlog, cuts):
    """Invariant 6 over every split of a backlog into batches: a round message is handed on only
    if no message before it (in its batch or an earlier one) closed its round: a newer round or a
    stop of its session, or a message of a newer session; and whatever the split, the same
    messages are handed on as when the backlog comes in one batch."""
    items = [_item(_msg(kind, r, session), node) for kind, r, session, node in backlog]
    bounds = sorted({0, len(items), *[min(c, len(items)) for c in cuts]})
    fence = RoundFence()
    handed = []
    for a, b in zip(bounds, bounds[1:]):
        handed += [id(item) for item in fence.current(items[a:b])]
    whole = [id(item) for item in RoundFence().current(items)]
    assert handed == whole or _closed_later(items, handed, whole)
    sessions_seen: list[str] = []
    for i, item in enumerate(items):
        msg = item.message
        session = protocol.session_of(msg)
        if session not in sessions_seen:
            sessions_seen.append(session)
        if id(item) not in handed or msg.kind not in (protocol.ROUND, protocol.RECEIVED, protocol.SETUP):
            continue
        for earlier in items[:i]:
            e = earlier.message
            later_session = sessions_seen.index(protocol.session_of(e)) > sessions_seen.index(session)
            assert not later_session, f"stepped {msg.kind} {msg.round} of {session} after a message of a newer session"
            if protocol.session_of(e) == session:
                assert round_order(e) <= round_order(msg), f"stepped {msg.kind} {msg.round} after {e.kind} {e.round}"


def _closed_later(items, handed, whole) -> bool:
    """Split batches may hand on a message the whole backlog closes only by a message after it:
    never one the whole backlog's fence kept (the split never drops what one batch serves)."""
    return set(whole) <= set(handed)


# ------------------------------------------------------------------------------------------ a bridge

def _sim_update(cfg, r: int) -> np.ndarray:
    """What sim computes for the board's node 2 in round r from THETA."""
    data = load_data(cfg.data, cfg.run.seed)
    alg = assemble.build_algorithm(cfg, model_for(cfg.model, data, cfg.run.seed), data)
    ctx = RoundContext(r, cfg.run.seed, 3, (0, 1, 2))
    return alg.node_step({"model": np.tile(THETA, (3, 1))}, data.train, [0, 1, 2], ctx).tensors["update"][2]


needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="needs a C compiler (cc)")
WAIT_S = 0.8  # the bridge's wait for a round's update


class _Closing:
    """A bridged node whose stragglers close their round at the emulated coordinator."""

    def __init__(self, agent: BridgeAgent, coordinator: _Coordinator):
        self.agent, self.coordinator, self.node = agent, coordinator, agent.node

    def handle(self, msg: wire.Message):
        try:
            return self.agent.handle(msg)
        finally:
            if msg.kind == protocol.ROUND:
                self.coordinator.closed(msg.round)

    def close(self) -> None:
        self.agent.close()


@needs_cc
@pytest.mark.parametrize("where,k", [("first", 1), ("middle", 3), ("last", 8)])
def test_a_board_stalled_past_the_bridges_wait_runs_no_closed_round(tmp_path, where, k):
    """The board blocks at the go of round s for longer than its bridge waits: the bridge gives
    round s up (charged once: the board runs it), the k-1 rounds that close meanwhile are never
    handed to the board, and the current one is answered; a late update is not sent."""
    stall_at = STALLS[where](k)
    inbox: queue.Queue[Inbound] = queue.Queue()
    coordinator = _Coordinator(inbox, [2], stall_at, k, given_stalls=True)
    with HostBoard(profile="nrf52840", stall_at_round=stall_at, stall_s=WAIT_S + 0.4) as board:
        agent = BridgeAgent(2, board.url, state_dir=tmp_path, update_timeout_s=WAIT_S)
        fence = RoundFence()
        coordinator.start()
        _loop(inbox, {"2": _Closing(agent, coordinator)}, {"2": _Client(coordinator)}, RUN, 30.0, None,
              rounds=fence)
        agent.close()
    answered = _answered_rounds(stall_at, k)
    assert coordinator.answered[2] == answered  # round s not sent: it closed
    assert fence.skipped == min(k, ROUNDS - stall_at) - 1  # the rounds that closed during the stall
    ledger = [e for e in _ledger(tmp_path, 2) if e.round >= 0]  # round -1: provisioning
    assert {e.round for e in ledger} == set(answered) | {stall_at}  # the round it ran, charged
    given_up = [e for e in ledger if e.round == stall_at]
    assert sorted(e.kind for e in given_up) == sorted(e.kind for e in coordinator.released[2] if e.round == answered[0])
    sent = [e for e in ledger if e.round != stall_at]
    assert _kinds_by_round(sent) == _kinds_by_round(coordinator.released[2])


@needs_cc
@pytest.mark.parametrize("at_round,summary", [(0, False), (2, False), (1, True)],
                         ids=["values-first-round", "values-third-round", "summary"])
def test_a_damaged_update_frame_is_asked_for_again(tmp_path, at_round, summary):
    """One bit of the board's update flipped on the line (its values: the summary shows a part
    missing; or its summary: the line falls quiet with the values in): the bridge asks again, the
    board resends the update it holds (not recomputed) and the round is answered, charged once."""
    cfg = load_config_text(CONFIG)
    with HostBoard(damage_at_round=at_round, damage_summary=summary) as board:
        agent = BridgeAgent(2, board.url, state_dir=tmp_path)
        try:
            for r in range(at_round + 1):
                reply = agent.handle(wire.decode(protocol.round_(RUN, SESSION, r, to_toml(cfg), [0, 1, 2],
                                                                 {"model": THETA})))
                assert reply is not None and wire.decode(reply.payload).kind == protocol.UPDATE
            # the update the board sent again is the round's own (sim's emulation of the board)
            np.testing.assert_allclose(wire.decode(reply.payload).tensors["update"], _sim_update(cfg, at_round),
                                       rtol=1e-5, atol=1e-6)
            link = agent.board.link
            assert link.stats["update_asked_again"] == 1 and link.errors["bad_crc"] + link.errors["bad_cobs"] >= 1
        finally:
            agent.close()
    ledger = [e for e in _ledger(tmp_path, 2) if e.round >= 0]
    assert sorted({e.round for e in ledger}) == list(range(at_round + 1))
    assert len([e for e in ledger if e.kind == "compute"]) == at_round + 1  # each round charged once
