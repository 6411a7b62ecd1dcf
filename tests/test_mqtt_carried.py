"""Carried uplinks (testbed.mqtt.carried): a host's replies of a round in one message, each frame
sealed by its own node. The coordinator's client takes each frame as if it came on its node's own
uplink: a node that carries another's frames cannot forge, alter, rename or replay them, and
without authentication no container is taken at all (the broker's ACL would no longer say who
wrote a reply). The whole path, a run over Mosquitto whose forger also sends containers:
tests/test_mqtt_forgery.py."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from testbed.mqtt import auth, carried, topics
from testbed.mqtt import wire
from testbed.mqtt.client import MqttClient

RUN, SESSION = "carry", "0123456789abcdef"
ids = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,10}", fullmatch=True)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(ids, st.binary(max_size=64)), min_size=1, max_size=20))
def test_a_container_unpacks_to_the_frames_it_was_packed_from(frames):
    payload = carried.pack(frames)
    assert carried.is_carried(payload)
    assert carried.unpack(payload, max_bytes=1 << 20) == frames


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(ids, st.binary(max_size=32)), min_size=1, max_size=5), st.data())
def test_a_cut_or_altered_container_is_refused_in_one_error_or_read_as_frames(frames, data):
    payload = bytearray(carried.pack(frames))
    cut = data.draw(st.integers(0, len(payload)))
    at = data.draw(st.integers(0, len(payload) - 1))
    payload[at] = data.draw(st.integers(0, 255))
    for mutant in (bytes(payload[:cut]), bytes(payload)):
        try:
            out = carried.unpack(mutant, max_bytes=1 << 20)
        except wire.WireError as exc:
            assert exc.code in ("bad_batch", "oversized")
        else:  # what it reads is node ids and frames within it, nothing invented
            assert all(wire.ID_PATTERN.fullmatch(n) and f in mutant for n, f in out)


def _update(node: str, round_index: int = 1) -> bytes:
    return wire.encode({"run": RUN, "round": round_index, "sender": node, "kind": "update",
                        "meta": {"session": SESSION}})


def _sealed(keys: auth.Keys, node: str, payload: bytes, topic_node: str | None = None) -> bytes:
    """``payload`` as ``node`` seals it for its uplink (or ``topic_node``'s)."""
    topic = topics.up(RUN, topic_node or node)
    session, round_index = wire.session_and_round(payload)
    return auth.seal(keys, topic, [node], session, round_index, payload)


@pytest.fixture
def keys() -> auth.Keys:
    return auth.Keys(RUN, {p: auth.new_key() for p in ("1", "2", "3")})


def _coordinator(keys: auth.Keys | None) -> tuple[MqttClient, list]:
    taken: list = []
    client = MqttClient.for_coordinator("mqtt://127.0.0.1:1", RUN, keys=keys, auth_session=SESSION,
                                        on_inbound=taken.append)
    return client, taken


def test_each_carried_frame_is_taken_as_its_own_nodes_reply(keys):
    coordinator, taken = _coordinator(keys)
    container = carried.pack([(n, _sealed(keys, n, _update(n))) for n in ("1", "2", "3")])
    coordinator._take(topics.up(RUN, "1"), container)
    assert [(i.node, i.message.sender, i.topic) for i in taken] == [(n, n, topics.up(RUN, n)) for n in ("1", "2", "3")]
    assert coordinator.rejected == coordinator.forged == 0


def test_a_carrier_cannot_forge_rename_or_replay_another_nodes_frame(keys):
    """Node 1 carries: a frame of its own key in node 2's name, node 2's real frame named node 3,
    node 3's real frame altered, and node 2's real frame twice: only node 2's real one is taken, once."""
    coordinator, taken = _coordinator(keys)
    own = keys.only(["1"])
    real2 = _sealed(keys, "2", _update("2"))
    altered3 = bytearray(_sealed(keys, "3", _update("3")))
    altered3[-1] ^= 1
    container = carried.pack([("2", _sealed(own, "1", _update("2"), topic_node="2")), ("3", real2),
                              ("3", bytes(altered3)), ("2", real2), ("2", real2)])
    coordinator._take(topics.up(RUN, "1"), container)
    assert [i.node for i in taken] == ["2"]
    assert coordinator.forged == 3  # node 1's key for node 2, node 2's frame named 3, the altered one
    assert coordinator.rejected == 1  # the replay


def test_a_container_is_refused_whole_without_authentication_or_inside_another():
    coordinator, taken = _coordinator(None)
    coordinator._take(topics.up(RUN, "1"), carried.pack([("2", _update("2"))]))
    assert taken == [] and coordinator.rejected == 1
    keys = auth.Keys(RUN, {p: auth.new_key() for p in ("1", "2")})
    coordinator, taken = _coordinator(keys)
    inner = carried.pack([("2", _sealed(keys, "2", _update("2")))])
    coordinator._take(topics.up(RUN, "1"), carried.pack([("2", inner)]))
    assert taken == [] and coordinator.rejected == 1


class _Node:
    """A node's client as a Carrier sees it: its frames sealed (here: tagged with its name), its
    publishes recorded."""

    def __init__(self, name: str, sent: list):
        self.name, self.sent = name, sent

    def sealed(self, topic: str, payload: bytes) -> list[bytes]:
        return [self.name.encode() + b":" + payload]

    def publish_frames(self, topic: str, frames) -> None:
        self.sent += [(self.name, topic, frame) for frame in frames]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 300), min_size=1, max_size=30), st.integers(400, 2000))
def test_a_carrier_sends_every_frame_once_within_its_bound_each_container_on_its_first_nodes_uplink(sizes, bound):
    sent: list = []
    carrier = carried.Carrier(RUN, bound)
    with carrier:
        for i, size in enumerate(sizes):
            node = _Node(str(i), sent)
            carrier.add(node, node.name, bytes(size))
    frames = []
    for by, topic, payload in sent:
        assert topic == topics.up(RUN, by)  # on the publishing node's own uplink
        if carried.is_carried(payload):
            inner = carried.unpack(payload, max_bytes=bound)
            assert len(inner) > 1 and inner[0][0] == by
            frames += inner
        else:  # a container of one is that frame, on its own node's uplink
            frames.append((by, payload))
    assert frames == [(str(i), f"{i}:".encode() + bytes(size)) for i, size in enumerate(sizes)]
