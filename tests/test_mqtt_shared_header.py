"""Uplinks under a shared header (testbed.mqtt.shared_header): a host's updates of a round as rows
under one header, each row tagged by its own node. A row decodes to exactly the message its
node's own frame would carry; a node that carries others' rows cannot forge, alter, rename or
replay them; a header altered fails every row; and without authentication no container is taken.
The whole path, a run over Mosquitto whose forger also sends such containers:
tests/test_mqtt_forgery.py."""

from __future__ import annotations

import dataclasses
import functools
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from testbed.mqtt import auth, carried, shared_header, topics, wire
from testbed.mqtt.client import MqttClient

RUN, SESSION = "rows", "0123456789abcdef"
NODES = ("1", "2", "3", "4")
KEYS = auth.Keys(RUN, {p: bytes([int(p)]) * 32 for p in NODES})
TAG = functools.partial(auth.tag, KEYS)

ids = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,10}", fullmatch=True)
json_values = st.recursive(st.none() | st.booleans() | st.integers(-2**53, 2**53) | st.text(max_size=8)
                           | st.floats(allow_nan=False, allow_infinity=False),
                           lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                                        max_size=3), max_leaves=8)
dtypes = st.sampled_from(["float64", "float32", "complex64", "int8", "uint8", "int32", "float16"])
shapes = st.lists(st.integers(0, 3), max_size=3).map(tuple)


def _tensor(dtype: str, shape: tuple, seed: int) -> np.ndarray:
    values = np.random.default_rng(seed).normal(size=shape) * 10
    return values.astype(dtype) if np.dtype(dtype).kind != "c" else (values + 1j * values).astype(dtype)


@st.composite
def drafts(draw) -> list[wire.Draft]:
    """Drafts of one run, round, kind and session with the same tensor specs, from distinct nodes."""
    specs = draw(st.lists(st.tuples(st.text(min_size=1, max_size=6), dtypes, shapes), max_size=3,
                          unique_by=lambda s: s[0]))
    round_index, kind = draw(st.integers(0, 2**40)), draw(ids)
    nodes = draw(st.lists(st.sampled_from(NODES), min_size=1, max_size=4, unique=True))
    out = []
    for node in nodes:
        meta = {"session": SESSION, **draw(st.dictionaries(st.text(max_size=6).filter(lambda k: k != "session"),
                                                           json_values, max_size=3))}
        tensors = {name: _tensor(dtype, shape, draw(st.integers(0, 99))) for name, dtype, shape in specs}
        out.append(wire.draft({"run": RUN, "round": round_index, "sender": node, "kind": kind, "meta": meta},
                              tensors))
    return out


def _opened(payload: bytes) -> list[wire.Message | None]:
    """Each row of a container as the coordinator reads it: its message, or None where its tag
    fails; WireError for the container."""
    container = shared_header.unpack(payload, max_bytes=1 << 20)
    verified = [shared_header.verified(KEYS, container, row) for row in container.rows]
    if not any(verified):
        return [None] * len(verified)
    shared = shared_header.parse_header(container, run=RUN)
    return [shared_header.decode_row(shared, row) if ok else None for row, ok in zip(container.rows, verified)]


def _same(a: wire.Message, b: wire.Message) -> bool:
    """Equal messages but for ``size_bytes`` (a row's is its row's)."""
    return (a.schema, a.run, a.round, a.sender, a.kind, a.msg_id, a.meta) == \
        (b.schema, b.run, b.round, b.sender, b.kind, b.msg_id, b.meta) and a.tensors.keys() == b.tensors.keys() \
        and all(a.tensors[k].dtype == b.tensors[k].dtype and a.tensors[k].shape == b.tensors[k].shape
                and a.tensors[k].tobytes() == b.tensors[k].tobytes() for k in a.tensors)


@settings(max_examples=200, deadline=None)
@given(drafts())
def test_a_row_decodes_to_the_message_its_nodes_own_frame_carries(batch):
    payload = shared_header.pack(batch, TAG)
    assert shared_header.is_shared(payload) and not carried.is_carried(payload)
    for draft, message in zip(batch, _opened(payload)):
        assert message is not None and _same(message, wire.decode(draft.encode()))
        assert all(not t.flags.writeable and t.ctypes.data % 8 == 0 for t in message.tensors.values())


@settings(max_examples=300, deadline=None)
@given(drafts(), st.data())
def test_a_cut_or_altered_container_is_refused_or_read_as_what_its_nodes_sent(batch, data):
    """One byte changed, or the container cut: refused whole (its framing or its header), or each
    row either fails its tag or is exactly what its node sent; nothing altered is ever taken."""
    payload = bytearray(shared_header.pack(batch, TAG))
    cut = data.draw(st.integers(0, len(payload)))
    at = data.draw(st.integers(0, len(payload) - 1))
    payload[at] = data.draw(st.integers(0, 255).filter(lambda b: b != payload[at]))
    sent = {d.fields["sender"]: wire.decode(d.encode()) for d in batch}
    for mutant in (bytes(payload[:cut]), bytes(payload)):
        try:
            container = shared_header.unpack(mutant, max_bytes=1 << 20)
            opened = _opened(mutant)
        except wire.WireError as exc:
            assert exc.code in ("bad_batch", "oversized", "bad_json", "bad_header", "schema", "wrong_run", "dtype")
            continue
        for row, message in zip(container.rows, opened):
            assert message is None or _same(message, sent[row.node])


def rebuilt(payload: bytes, header: bytes | None = None, session: bytes | None = None,
             rows: list[tuple[str, bytes, bytes]] | None = None) -> bytes:
    """A container's bytes with its header, session or rows (node, body, tag) replaced: what a
    carrier could send with others' rows."""
    container = shared_header.unpack(payload, max_bytes=1 << 20)
    header = container.header if header is None else header
    session = container.session.encode() if session is None else session
    rows = [(r.node, bytes(r.body), r.tag) for r in container.rows] if rows is None else rows
    parts = [shared_header.MAGIC, bytes((len(session),)), session, struct.pack("<I", len(header)), header,
             struct.pack("<H", len(rows))]
    for node, body, tag in rows:
        parts += [bytes((len(node),)), node.encode(), struct.pack("<I", len(body)), body, tag]
    return b"".join(parts)


def _update(node: str, round_index: int = 1, value: float = 0.0) -> wire.Draft:
    return wire.draft({"run": RUN, "round": round_index, "sender": node, "kind": "update",
                       "meta": {"session": SESSION, "metrics": {"samples": 1.0}}}, {"g": np.full(3, value)})


def test_a_header_or_session_altered_fails_every_row():
    payload = shared_header.pack([_update(n) for n in NODES], TAG)
    header = shared_header.unpack(payload, max_bytes=1 << 20).header
    later = header.replace(b'"round":1', b'"round":2')
    assert later != header
    assert _opened(rebuilt(payload, header=later)) == [None] * len(NODES)
    assert _opened(rebuilt(payload, session=b"f" * 16)) == [None] * len(NODES)


def _coordinator(keys: auth.Keys | None) -> tuple[MqttClient, list]:
    taken: list = []
    client = MqttClient.for_coordinator("mqtt://127.0.0.1:1", RUN, keys=keys, auth_session=SESSION,
                                        on_inbound=taken.append)
    return client, taken


def test_each_row_is_taken_as_its_own_nodes_reply():
    coordinator, taken = _coordinator(KEYS)
    batch = [_update(n) for n in NODES]
    coordinator._take(topics.up(RUN, "1"), shared_header.pack(batch, TAG))
    assert [(i.node, i.topic) for i in taken] == [(n, topics.up(RUN, n)) for n in NODES]
    assert all(_same(i.message, wire.decode(d.encode())) for i, d in zip(taken, batch))
    assert coordinator.rejected == coordinator.forged == 0


def test_a_carrier_cannot_forge_rename_alter_or_replay_another_nodes_row():
    """Node 1 carries: a row tagged with its own key in node 2's name, node 3's real row named 4,
    node 4's real row altered, and node 3's real row twice: only node 3's real one is taken, once."""
    coordinator, taken = _coordinator(KEYS)
    own = functools.partial(auth.tag, KEYS.only(["1"]))
    forged = shared_header.unpack(shared_header.pack([_update("1", value=1e3)], own), max_bytes=1 << 20).rows[0]
    real = shared_header.pack([_update("3"), _update("4")], TAG)
    three, four = shared_header.unpack(real, max_bytes=1 << 20).rows
    altered = bytearray(four.body)
    altered[-1] ^= 1
    rows = [("2", bytes(forged.body), forged.tag), ("4", bytes(three.body), three.tag),
            ("4", bytes(altered), four.tag), ("3", bytes(three.body), three.tag), ("3", bytes(three.body), three.tag)]
    coordinator._take(topics.up(RUN, "1"), rebuilt(real, rows=rows))
    assert [i.node for i in taken] == ["3"]
    assert coordinator.forged == 3  # node 1's key for node 2, node 3's row named 4, the altered one
    assert coordinator.rejected == 1  # the replay


def test_a_row_of_another_session_run_or_key_does_not_verify():
    coordinator, taken = _coordinator(KEYS)
    stranger = auth.Keys(RUN, {p: auth.new_key() for p in NODES})
    other_run = auth.Keys("other", {p: bytes([int(p)]) * 32 for p in NODES})
    for tag in (functools.partial(auth.tag, stranger), functools.partial(auth.tag, other_run)):
        coordinator._take(topics.up(RUN, "1"), shared_header.pack([_update("1"), _update("2")], tag))
    assert taken == [] and coordinator.forged == 4


def test_a_container_is_refused_whole_without_authentication_or_inside_another():
    coordinator, taken = _coordinator(None)
    coordinator._take(topics.up(RUN, "1"), shared_header.pack([_update("1"), _update("2")], TAG))
    assert taken == [] and coordinator.rejected == 1
    coordinator, taken = _coordinator(KEYS)
    inner = shared_header.pack([_update("2"), _update("3")], TAG)
    coordinator._take(topics.up(RUN, "1"), carried.pack([("2", inner), ("3", inner)]))
    assert taken == [] and coordinator.rejected == 2  # each frame a container: refused as one


def test_a_session_other_than_the_coordinators_is_not_admitted():
    coordinator, taken = _coordinator(KEYS)
    coordinator._auth_session = "f" * 16  # keys of the rows' session, a client serving another
    coordinator._take(topics.up(RUN, "1"), shared_header.pack([_update("1"), _update("2")], TAG))
    assert taken == [] and coordinator.rejected == 1


class _Node:
    """A node's client as a Carrier sees it: its frames sealed and rows tagged with its own key,
    its publishes recorded."""

    def __init__(self, name: str, sent: list):
        self.name, self.sent = name, sent

    def sealed(self, topic: str, payload: bytes) -> list[bytes]:
        session, round_index = wire.session_and_round(payload)
        return [auth.seal(KEYS, topic, [self.name], session, round_index, payload)]

    def row_tag(self, node: str, session: str, digest: bytes) -> bytes:
        assert node == self.name
        return auth.tag(KEYS, node, session, digest)

    def publish_frames(self, topic: str, frames) -> None:
        self.sent += [(self.name, topic, frame) for frame in frames]


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(NODES), st.integers(1, 3), st.integers(0, 40), st.booleans()),
                min_size=1, max_size=12),
       st.integers(300, 3000))
def test_a_carrier_sends_every_reply_once_within_its_bound_in_order_of_its_groups(items, bound):
    """Drafts of one round and specs go as rows (a group of one, or one too large for a row, as a
    sealed frame), bytes as sealed frames; every container within the bound, on the uplink of its
    first node; each reply arrives once, as the coordinator reads it, and a round's replies in the
    order they were added."""
    sent: list = []
    added = []
    with carried.Carrier(RUN, bound) as carrier:
        for node, round_index, size, as_bytes in items:
            draft = wire.draft({"run": RUN, "round": round_index, "sender": node, "kind": "update",
                                "meta": {"session": SESSION}}, {"g": np.arange(size, dtype=np.float64)})
            carrier.add(_Node(node, sent), node, draft.encode() if as_bytes else draft)
            added.append((None if as_bytes else (round_index, size), wire.decode(draft.encode())))
    coordinator, taken = _coordinator(KEYS)
    coordinator._replay = type(coordinator._replay)(max_per_round=1 << 10)
    for by, topic, payload in sent:
        assert topic == topics.up(RUN, by) and len(payload) <= max(bound, _largest_frame(payload))
        coordinator._take(topic, payload)
    got = {i.message.msg_id: i.message for i in taken}
    assert len(got) == len(taken) and sorted(got) == sorted(m.msg_id for _, m in added)
    assert all(_same(got[m.msg_id], m) for _, m in added)
    order = [i.message.msg_id for i in taken]
    for group in {g for g, _ in added}:  # the replies of one group (a header, or the frames) in order
        ids = [m.msg_id for g, m in added if g == group]
        assert ids == sorted(ids, key=order.index)


def _largest_frame(payload: bytes) -> int:
    """A message alone may be longer than a container's bound (it is chunked only past the client's)."""
    return len(payload) if not (carried.is_carried(payload) or shared_header.is_shared(payload)) else 0


@pytest.mark.parametrize("size", [0, 1, 7, 8, 9])
def test_rows_lie_8_byte_aligned_whatever_the_meta_and_id_lengths(size):
    batch = [wire.draft({"run": RUN, "round": 1, "sender": node, "kind": "update",
                         "meta": {"session": SESSION, "pad": "x" * (size + i)}}, {"g": np.ones(3), "h": np.ones(size)})
             for i, node in enumerate(NODES)]
    for message in _opened(shared_header.pack(batch, TAG)):
        assert message is not None and all(t.ctypes.data % 8 == 0 for t in message.tensors.values())


def test_a_row_its_node_tagged_is_still_refused_unless_it_is_a_message_of_the_header():
    """What a node tags is checked as its own frame would be: its meta names the container's
    session, a JSON object; its tensors fill its body exactly, finite."""
    good = _update("1")
    bad = [dataclasses.replace(good, meta_json=b'{"session":"ffffffffffffffff"}'),
           dataclasses.replace(good, meta_json=b'[1]'),
           dataclasses.replace(good, meta_json=b'{"session":'),
           dataclasses.replace(good, parts=(good.parts[0] + bytes(8),)),
           dataclasses.replace(good, parts=(good.parts[0][:16],)),
           dataclasses.replace(good, parts=(np.array([0.0, np.nan, 1.0]).tobytes(),))]
    coordinator, taken = _coordinator(KEYS)
    coordinator._take(topics.up(RUN, "2"), shared_header.pack([*bad, _update("2")], TAG))
    assert [i.node for i in taken] == ["2"]
    assert coordinator.rejected == len(bad) and coordinator.forged == 0
