"""A container of carried uplinks (testbed.mqtt.carried) is taken a step at a time over its frames
(testbed.mqtt.receiving: every seal, then every decoding, then each admitted; then the coordinator's
checks of the replies, testbed.orchestration.coordinator_inbox: every reply's tensors, then events,
then metrics), for the CPU the same code saves when run on 40 frames in a row. Each frame must be
taken or refused exactly as when its frames are taken one after another, each alone: searched by
Hypothesis with forged, altered, replayed, repeated and foreign frames beside honest ones, as a
carrier (a host) or anyone on the broker would send them."""

from __future__ import annotations

import time
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from testbed.algorithms.contract import RoundContext
from testbed.assembly import assemble
from testbed.assembly.assemble import load_data, model_for
from testbed.assembly.config import load_config
from testbed.ledger.events import with_fields
from testbed.mqtt import auth, carried, topics, wire
from testbed.mqtt.client import Inbound, MqttClient
from testbed.orchestration.coordinator import MqttNodes
from testbed.orchestration import reply_checks
from testbed.orchestration.coordinator_inbox import Collection
from testbed.rounds import protocol

RUN, SESSION, OTHER = "staged", "0123456789abcdef", "fedcba9876543210"
NODES = [str(n) for n in range(6)]


@pytest.fixture(scope="module")
def keys() -> auth.Keys:
    return auth.Keys(RUN, {p: auth.new_key() for p in NODES})


def _frame(keys: auth.Keys, node: str, round_index: int, session: str = SESSION, topic_node: str | None = None,
           key_of: str | None = None) -> bytes:
    payload = wire.encode({"run": RUN, "round": round_index, "sender": node, "kind": "update",
                           "meta": {"session": session}}, {"x": np.full(3, float(round_index))})
    signer = keys if key_of is None else auth.Keys(RUN, {node: auth.new_key()})
    return auth.seal(signer, topics.up(RUN, topic_node or node), [node], session, round_index, payload)


FRAME_KINDS = ("honest", "forged", "other_session", "renamed", "flipped", "cut", "container", "not_sealed",
               "odd_round", "copy")


def _frames(keys: auth.Keys, data) -> list[tuple[str, bytes]]:
    frames: list[tuple[str, bytes]] = []
    for _ in range(data.draw(st.integers(1, 12), label="frames")):
        node = data.draw(st.sampled_from(NODES), label="node")
        kind = data.draw(st.sampled_from(FRAME_KINDS), label="kind")
        r = data.draw(st.integers(1, 4), label="round")
        if kind == "copy" and frames:
            frames.append(frames[data.draw(st.integers(0, len(frames) - 1), label="which")])
            continue
        frame = {"forged": lambda: _frame(keys, node, r, key_of="stranger"),
                 "other_session": lambda: _frame(keys, node, r, session=OTHER),
                 "renamed": lambda: _frame(keys, node, r, topic_node=NODES[(NODES.index(node) + 1) % len(NODES)]),
                 "container": lambda: carried.pack([(node, _frame(keys, node, r))]),
                 "not_sealed": lambda: wire.encode({"run": RUN, "round": r, "sender": node, "kind": "update"}),
                 }.get(kind, lambda: _frame(keys, node, r))()
        if kind == "flipped":
            at = data.draw(st.integers(0, len(frame) - 1), label="at")
            frame = frame[:at] + bytes([frame[at] ^ 0x40]) + frame[at + 1:]
        if kind == "cut":
            frame = frame[:data.draw(st.integers(0, len(frame) - 1), label="cut")]
        frames.append((node, frame))
    return frames


def _client(keys: auth.Keys, taken: list, together: bool) -> MqttClient:
    return MqttClient.for_coordinator("mqtt://127.0.0.1:1", RUN, keys=keys, auth_session=SESSION,
                                      on_inbound=taken.append, on_inbound_all=taken.extend if together else None,
                                      admit=lambda m: "odd rounds refused" if m.round == 3 else None)


@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_a_container_is_taken_as_its_frames_one_by_one(keys, data):
    frames = _frames(keys, data)
    container = carried.pack(frames)
    together = data.draw(st.booleans(), label="handed over together")
    staged, alone = [], []
    a, b = _client(keys, staged, together), _client(keys, alone, together)
    a._take(topics.up(RUN, frames[0][0]), container)
    for node, frame in frames:  # what _take_carried did before: each frame through _take
        b._take(topics.up(RUN, node), frame, carrier=frames[0][0])
    assert [(i.topic, i.node, i.payload, i.message.msg_id) for i in staged] == \
        [(i.topic, i.node, i.payload, i.message.msg_id) for i in alone]
    assert (a.rejected, a.forged) == (b.rejected, b.forged)


# ---- the coordinator's checks of a container's replies ---------------------------------------------

@pytest.fixture(scope="module")
def alg():
    config = load_config("benchmarks/acfl.toml")
    data = load_data(config.data, 0)
    return config, assemble.build_algorithm(config, model_for(config.model, data, 0), data)


def _coordinator(alg) -> MqttNodes:
    config, algorithm = alg
    nodes = MqttNodes.__new__(MqttNodes)  # its bookkeeping only: no broker, no hosts
    nodes._init_bookkeeping(config.mqtt.model_copy(update={"run_id": "r"}), config.nodes, "", list(range(100)),
                            algorithm, seed=0)
    return nodes


REPLY_KINDS = ("honest", "big_norm", "wrong_shape", "bad_events", "slow", "bad_metrics", "no_metrics", "refused",
               "late", "not_asked", "stranger", "ready")


def _reply(nodes: MqttNodes, ctx: RoundContext, node: int, kind: str, W: np.ndarray) -> Inbound:
    r, session = ctx.round_index, nodes.session
    events = nodes.alg.planned_events(node, ctx)
    events = [with_fields(e, compute_s=1e-5, energy_j=1e-4) if e.kind == "compute" else e for e in events]
    gradient = np.full((10, 10), 0.01)
    metrics = {"samples": 100.0}
    if kind == "big_norm":
        gradient = np.full((10, 10), 1e9)
    if kind == "wrong_shape":
        gradient = np.zeros((10, 9))
    if kind == "bad_events":
        events = [with_fields(events[0], local_steps=events[0].local_steps + 1), *events[1:]]
    if kind == "slow":  # beyond its least bound: the long path, at the real window
        events = [with_fields(e, compute_s=1e6) if e.kind == "compute" else e for e in events]
    if kind == "bad_metrics":
        metrics = {"samples": -1.0}
    if kind == "no_metrics":
        metrics = {}
    payload = protocol.update("r", session, r + (kind == "late"), node, {"gradient": gradient}, events, metrics)
    if kind == "refused":
        payload = protocol.refused("r", session, r, node, "epsilon", 2.0, 1.0)
    if kind == "ready":
        payload = protocol.ready("r", session, node, "0" * 64)
    name = "x" if kind == "stranger" else str(node)
    message = wire.decode(payload)
    return Inbound.of(topics.up("r", str(node)), topics.UP, name, payload, message, None)


def _state(nodes: MqttNodes) -> tuple:
    c = nodes._collecting
    answers = {n: ({k: v.tolist() for k, v in t.items()}, [(type(e), e.__dict__) for e in ev], m)
               for n, (t, ev, m) in c.answers.items()}
    refused = {n: None if ev is None else [(type(e), e.__dict__) for e in ev] for n, ev in c.content_refused.items()}
    return answers, sorted(c.refusals), c.reasons, refused, c.outstanding, nodes._costliest, nodes._late


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_a_containers_replies_are_checked_as_one_by_one(alg, data):
    asked = tuple(sorted(data.draw(st.lists(st.integers(0, 99), min_size=1, max_size=12, unique=True), label="asked")))
    r = data.draw(st.integers(1, 50), label="round")
    items = []
    for _ in range(data.draw(st.integers(1, 10), label="replies")):
        node = data.draw(st.sampled_from(asked), label="node")
        kind = data.draw(st.sampled_from(REPLY_KINDS), label="kind")
        if kind == "not_asked":
            node = data.draw(st.integers(0, 99).filter(lambda n: n not in asked), label="other")
        items.append((node, kind))
    W = np.full((10, 10), 0.02)
    sides = []
    # One clock for both sides: a field beyond its bound is charged at the bound of the round's
    # window as it stands, which grows with the time up to a day's cap (on a machine up for less
    # than a day the two sides were charged milliseconds apart).
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(reply_checks, "time", SimpleNamespace(monotonic=lambda: 3600.0))
        for together in (True, False):
            sides.append(_one_side(alg, together, asked, r, items, W))
    assert sides[0] == sides[1]


def _one_side(alg, together: bool, asked: tuple[int, ...], r: int, items: list, W: np.ndarray) -> tuple:
    """The coordinator's state once ``items`` (node, kind) came in one container or one by one."""
    nodes = _coordinator(alg)
    ctx = RoundContext(r, 0, 100, asked)
    nodes._remember(ctx)
    nodes._sent_at[r] = 0.0
    nodes._open_round = r + 1
    nodes._sent = {n: {"W": W} for n in asked}
    spec = nodes.alg.uplink_spec()
    nodes._collecting = Collection(ctx, spec, nodes._metric_spec, protocol.UPDATE, outstanding=set(asked))
    inbound = [_reply(nodes, ctx, node, kind, W) for node, kind in items]
    if together:
        assert nodes._on_inbound_all(inbound) == 0
    else:
        for item in inbound:
            nodes._on_inbound(item)
    return _state(nodes)


def test_a_release_whose_events_are_not_the_plan_is_charged_at_its_bounds(alg):
    """An emulated node (its profile declared) whose update's events are not the plan (a forger of
    its own figures, or a bug) released all the same: it is charged the plan, its seconds and joules
    at their bounds for the round's window as it stood when the reply came (above anything it could
    have spent), never below the most it reported before; in its round, and when late."""
    nodes = _coordinator(alg)
    asked, W = (3, 4), np.full((10, 10), 0.02)

    def open_round(r: int) -> RoundContext:
        ctx = RoundContext(r, 0, 100, asked)
        nodes._remember(ctx)
        nodes._open_round, nodes._sent = r + 1, {n: {"W": W} for n in asked}
        nodes._sent_at[r] = time.monotonic() - 2.0  # open two seconds when the replies come
        nodes._collecting = Collection(ctx, nodes.alg.uplink_spec(), nodes._metric_spec, protocol.UPDATE,
                                       outstanding=set(asked))
        return ctx

    ctx = open_round(1)
    nodes._on_inbound(_reply(nodes, ctx, 3, "honest", W))  # node 4 says nothing in round 1
    ctx = open_round(2)
    nodes._on_inbound(_reply(nodes, ctx, 3, "bad_events", W))
    nodes._on_inbound(_reply(nodes, RoundContext(1, 0, 100, asked), 4, "bad_events", W))  # round 1's, late
    bounds = nodes._bounds[3]
    assert bounds.device is not None
    for charged, planned in ((nodes._collecting.content_refused[3], nodes.alg.planned_events(3, ctx)),
                             (nodes._late[(4, 1)], nodes.alg.planned_events(4, RoundContext(1, 0, 100, asked)))):
        assert [e.kind for e in charged] == [e.kind for e in planned]
        for event, plan in zip(charged, planned):
            least = bounds.limits(plan, 2.0)  # the window was at least two seconds open
            assert least == {} or all(getattr(event, name) >= bound for name, bound in least.items()), event
            assert all(getattr(event, name) == getattr(plan, name) for name in ("node", "round", "kind")
                       if hasattr(plan, name))
    compute = [e for e in nodes._collecting.content_refused[3] if e.kind == "compute"]
    assert compute and compute[0].compute_s >= 2.0 and compute[0].energy_j >= nodes._costliest[3, "compute"]["energy_j"]
