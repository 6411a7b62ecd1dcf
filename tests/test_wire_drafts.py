"""wire.drafts, a host's replies to one round drafted together: each row's draft is the one
wire.draft makes of it alone (same checks, same errors, same bytes but its message id), and
protocol.update_drafts is update_draft of each node. Generated rows look for the case where the
shared checks of the first row would let another row's own fault through."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from testbed.ledger.events import CommunicationEvent, ComputeEvent
from testbed.mqtt import wire
from testbed.rounds import protocol

HEADER = {"run": "r1", "round": 3, "kind": "update"}

# What may differ between rows: a sender (an id, or not), a meta (JSON, or not), values (finite, or
# not); each row's own faults one in four, so that rows after a first one that drafts have them.
node_ids = st.integers(0, 10**6).map(str)
senders = st.one_of(node_ids, node_ids, node_ids, st.sampled_from(["", "a b", "é", "x" * 65]))
json_metas = st.dictionaries(st.sampled_from(["session", "x", "events"]),
                             st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=5),
                                       st.lists(st.integers(-5, 5), max_size=3)), max_size=3)
metas = st.one_of(json_metas, json_metas, json_metas,
                  st.sampled_from([{"x": float("nan")}, {"x": float("inf")}, {1: "int key"}]))
# Non-finite values as often as finite ones: a row of them after a first row that drafts is the case.
values = st.one_of(st.floats(-1e3, 1e3), st.sampled_from([float("nan"), float("inf"), -float("inf"), 1e300]))
dtypes = st.sampled_from(["<f8", ">f8", "<f4", ">c16", "<i8", "bool", "<u8"])


@st.composite
def batches(draw):
    rows = draw(st.integers(1, 5))
    shape = tuple(draw(st.lists(st.integers(1, 3), max_size=2)))
    tensors = {}
    for name in draw(st.lists(st.sampled_from(["g", "h", "w"]), unique=True, max_size=2)):
        dtype = np.dtype(draw(dtypes))
        flat = draw(st.lists(values, min_size=rows * int(np.prod(shape)), max_size=rows * int(np.prod(shape))))
        with np.errstate(all="ignore"):
            tensors[name] = np.array(flat, dtype=np.float64).astype(dtype, casting="unsafe").reshape((rows, *shape))
    return [(draw(senders), draw(metas)) for _ in range(rows)], tensors


def _alone(sender, meta, tensors, i, msg_id):
    """What wire.draft makes of row ``i`` alone: its draft, or its WireError."""
    try:
        return wire.draft({**HEADER, "sender": sender, "meta": meta, "msg_id": msg_id},
                          {name: a[i] for name, a in tensors.items()})
    except wire.WireError as exc:
        return exc


@settings(max_examples=300)
@given(batches())
def test_each_row_is_what_draft_makes_of_it_alone(batch):
    rows, tensors = batch
    together = wire.drafts(HEADER, rows, tensors)
    assert len(together) == len(rows)
    for i, ((sender, meta), got) in enumerate(zip(rows, together)):
        want = _alone(sender, meta, tensors, i, got.fields["id"] if isinstance(got, wire.Draft) else None)
        if isinstance(want, wire.WireError):
            assert isinstance(got, wire.WireError) and (got.code, str(got)) == (want.code, str(want))
            continue
        assert isinstance(got, wire.Draft), got
        assert got.fields == want.fields and got.meta == want.meta and got.meta_json == want.meta_json
        assert got.parts == want.parts and got.layout == want.layout
        assert got.encode() == want.encode()


def test_every_row_has_a_fresh_message_id():
    rows = [(str(n), {"session": "s"}) for n in range(50)]
    ids = [d.fields["id"] for d in wire.drafts(HEADER, rows, {"g": np.zeros((50, 2))})]
    assert len(set(ids)) == 50


def test_a_fault_shared_by_every_row_is_every_rows_error():
    out = wire.drafts({**HEADER, "run": "not an id"}, [("1", {}), ("2", {})], {"g": np.zeros((2, 1))})
    assert [e.code for e in out] == ["bad_header", "bad_header"]
    out = wire.drafts(HEADER, [("1", {}), ("2", {})], {"g": np.zeros((2, 1), dtype=np.uint64)})
    assert [e.code for e in out] == ["dtype", "dtype"]


def test_only_the_non_finite_row_is_refused():
    g = np.zeros((3, 2))
    g[1, 0] = np.nan
    out = wire.drafts(HEADER, [("1", {}), ("2", {}), ("3", {})], {"g": g})
    assert isinstance(out[0], wire.Draft) and isinstance(out[2], wire.Draft)
    assert out[1].code == "non_finite"


@pytest.mark.parametrize("key", ["sender", "meta", "msg_id"])
def test_a_rows_own_field_in_the_shared_header_is_a_bug(key):
    with pytest.raises(ValueError, match="each row has its own"):
        wire.drafts({**HEADER, key: "x"}, [("1", {})], {})


def test_update_drafts_is_update_draft_of_each_node():
    events = [[ComputeEvent(n, 4, local_steps=2, compute_s=0.5 * n, energy_j=0.1, measured=True),
               CommunicationEvent(n, 4, bytes_up=32, bytes_down=32, cost_units=1.0)] for n in (7, 8, 9)]
    tensors, metrics = {"W": np.arange(12.0).reshape(3, 2, 2)}, {"samples": np.array([10.0, 20.0, 30.0])}
    together = protocol.update_drafts("r1", "s1", 4, [7, 8, 9], tensors, events, metrics)
    for i, (node, got) in enumerate(zip((7, 8, 9), together)):
        alone = protocol.update_draft("r1", "s1", 4, node, {"W": tensors["W"][i]}, events[i],
                                      {"samples": float(metrics["samples"][i])})
        alone = dataclasses.replace(alone, fields={**alone.fields, "id": got.fields["id"]})
        assert got.encode() == alone.encode()
