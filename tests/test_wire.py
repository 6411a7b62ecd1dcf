"""Unit tests of the wire codec, replay guard and chunking (testbed/mqtt/wire.py)."""

from __future__ import annotations

import dataclasses
import json
import os
import random
import struct

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from testbed.mqtt import wire
from testbed.mqtt import chunks, replay

from conftest import require_module

HEADER = {"run": "run1", "round": 3, "sender": "node-7", "kind": "update"}


def _encode(tensors=None, **fields):
    return wire.encode({**HEADER, **fields}, tensors)


def _forge(header: dict, body: bytes = b"") -> bytes:
    """A payload with an arbitrary JSON header, bypassing encode's checks."""
    head = json.dumps(header).encode()
    prefix = struct.pack("<4sI", wire.MESSAGE_MAGIC, len(head)) + head
    return prefix + bytes(-len(prefix) % 8) + body


@pytest.fixture(params=["orjson", "stdlib"])
def codec(request, monkeypatch):
    """The header codec: orjson (the MQTT extras') or the standard library's (a core install)."""
    if request.param == "orjson":
        require_module("orjson", "node")
    else:
        monkeypatch.setattr(wire, "orjson", None)
    return request.param


def _valid_header(**changes) -> dict:
    h = {"v": 1, "run": "run1", "round": 3, "sender": "node-7", "kind": "update", "id": "0" * 32,
         "tensors": [], "meta": {}}
    h.update(changes)
    return h


def _code(payload: bytes, **kwargs) -> str:
    with pytest.raises(wire.WireError) as info:
        wire.decode(payload, **kwargs)
    assert info.value.reason  # every rejection says why
    return info.value.code


# ---- round trip ---------------------------------------------------------------------------


def test_round_trip_preserves_header_and_tensors():
    rng = np.random.default_rng(0)
    tensors = {
        "w": rng.normal(size=(3, 4)),
        "b": rng.normal(size=5).astype(np.float32),
        "idx": np.arange(7, dtype=np.int64),
        "tx": (rng.normal(size=3) + 1j * rng.normal(size=3)).astype(np.complex64),
        "scalar": np.float64(2.5),
        "empty": np.zeros((0, 3)),
        "bytes": np.arange(3, dtype=np.uint8),  # odd length: padding follows
    }
    payload = _encode(tensors, meta={"lr": 0.1, "steps": [1, 2]}, msg_id="ab" * 16)
    msg = wire.decode(payload, expect_run="run1", expect_round=3, expect_sender="node-7")
    assert (msg.schema, msg.run, msg.round, msg.sender, msg.kind) == (1, "run1", 3, "node-7", "update")
    assert msg.msg_id == "ab" * 16 and msg.meta == {"lr": 0.1, "steps": [1, 2]}
    assert msg.size_bytes == len(payload)
    assert list(msg.tensors) == list(tensors)
    for name, value in tensors.items():
        got = msg.tensors[name]
        assert got.dtype == np.asarray(value).dtype and got.shape == np.shape(value)
        np.testing.assert_array_equal(got, value)
        assert got.flags.aligned and not got.flags.writeable  # zero-copy view into the payload


def test_encode_normalises_byte_order_and_layout():
    a = np.arange(12, dtype=">f8").reshape(3, 4).T  # big-endian and not C-contiguous
    msg = wire.decode(_encode({"a": a}))
    assert msg.tensors["a"].dtype == np.dtype("<f8")
    np.testing.assert_array_equal(msg.tensors["a"], a)


def test_message_ids_are_fresh_by_default():
    assert wire.decode(_encode()).msg_id != wire.decode(_encode()).msg_id


def test_message_ids_are_unique_across_draws_threads_and_forks():
    """Ids are drawn from os.urandom ahead of use (wire._IDS_PER_DRAW a time): every id is still
    32 hex digits and never handed out twice: not past a draw's end, not to two threads, and not
    by a forked child that inherited its parent's drawn ids (an emulated host is such a child)."""
    import threading

    ids = [wire.new_msg_id() for _ in range(3 * wire._IDS_PER_DRAW + 5)]
    assert all(len(i) == 32 and int(i, 16) >= 0 and i == i.lower() for i in ids)
    from_threads: list[list[str]] = [[] for _ in range(4)]
    workers = [threading.Thread(target=lambda out=out: out.extend(wire.new_msg_id() for _ in range(2000)))
               for out in from_threads]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    ids += [i for out in from_threads for i in out]
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the ids it makes next, to the parent
        os.close(read)
        os.write(write, "".join(wire.new_msg_id() for _ in range(50)).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as child_out:
        text = child_out.read()
    os.waitpid(pid, 0)
    ids += [wire.new_msg_id() for _ in range(50)] + [text[i:i + 32] for i in range(0, len(text), 32)]
    assert len(text) == 50 * 32
    assert len(set(ids)) == len(ids)


def test_decode_copies_mutable_buffers():
    buf = bytearray(_encode({"a": np.ones(4)}))
    msg = wire.decode(buf)
    buf[-8:] = bytes(8)
    np.testing.assert_array_equal(msg.tensors["a"], np.ones(4))


def test_check_expected_after_decode():
    msg = wire.decode(_encode())
    wire.check_expected(msg, run="run1", round=3, sender="node-7")
    with pytest.raises(wire.WireError, match="wrong_round"):
        wire.check_expected(msg, round=4)


# ---- encode refuses bad input -------------------------------------------------------------


@pytest.mark.parametrize("fields, tensors, code", [
    ({"round": -1}, None, "bad_header"),
    ({"round": True}, None, "bad_header"),
    ({"sender": "a/b"}, None, "bad_header"),
    ({"run": "+"}, None, "bad_header"),
    ({"colour": "red"}, None, "bad_header"),
    ({"meta": {"x": object()}}, None, "bad_header"),
    ({"meta": {"x": float("nan")}}, None, "bad_header"),
    ({}, {"a": np.array([1.0, np.nan])}, "non_finite"),
    ({}, {"a": np.array([np.inf], dtype=np.complex128)}, "non_finite"),
    ({}, {"a": np.array(["x"])}, "dtype"),
    ({}, {"a": np.array([True])}, "dtype"),
    ({"msg_id": "ABC"}, None, "bad_header"),
    ({}, {"a": np.zeros((1,) * (wire.MAX_NDIM + 1))}, "bad_header"),
    ({}, {f"t{i}": np.zeros(1) for i in range(wire.MAX_TENSORS + 1)}, "bad_header"),
    ({}, {"": np.zeros(1)}, "bad_header"),
])
def test_encode_rejects(codec, fields, tensors, code):
    with pytest.raises(wire.WireError) as info:
        _encode(tensors, **fields)
    assert info.value.code == code


# ---- every rejection reason of decode ------------------------------------------------------


def test_rejects_truncated_and_garbage():
    good = _encode({"a": np.ones(10)})
    assert _code(b"") == "truncated"
    assert _code(good[:6]) == "truncated"
    assert _code(good[:20]) == "truncated"  # header cut
    assert _code(good[:-8]) == "size_mismatch"  # tensor cut
    assert _code(good + bytes(8)) == "size_mismatch"  # trailing bytes
    assert _code(b"GARBAGE!" * 4) == "bad_magic"
    assert _code(random.Random(1).randbytes(1000)) == "bad_magic"


def test_rejects_bad_json(codec):
    head = b"{not json"
    assert _code(struct.pack("<4sI", wire.MESSAGE_MAGIC, len(head)) + head) == "bad_json"
    head = b"\xff\xfe"
    assert _code(struct.pack("<4sI", wire.MESSAGE_MAGIC, len(head)) + head) == "bad_json"
    assert _code(_forge([1, 2])) == "bad_json"


@pytest.mark.parametrize("constant", [b"NaN", b"Infinity", b"-Infinity", b"1e999", b"-1e999"])
def test_rejects_a_header_with_nan_or_an_infinity(codec, constant):
    head = json.dumps(_valid_header(meta={"x": 0.5})).encode().replace(b"0.5", constant)
    assert _code(struct.pack("<4sI", wire.MESSAGE_MAGIC, len(head)) + head + bytes(-len(head) % 8)) == "bad_json"


@dataclasses.dataclass
class _Point:
    x: float


@pytest.mark.parametrize("meta", [{"x": float("inf")}, {"x": [1.0, -float("inf")]}, {"x": _Point(1.0)},
                                  {"x": {1, 2}}])
def test_encode_refuses_what_json_cannot_hold_with_either_codec(codec, meta):
    with pytest.raises(wire.WireError, match="not JSON-serialisable") as info:
        _encode(meta=meta)
    assert info.value.code == "bad_header"


def test_both_codecs_write_headers_the_other_reads(monkeypatch):
    require_module("orjson", "node")
    meta = {"events": [{"kind": "compute", "compute_s": 5.764135135135133e-05, "measured": False}],
            "note": "naïve ∑ \u2028", "none": None, "nested": {"a": [1, -2, 3.5e300]}, "1": 1}
    fast = _encode({"a": np.arange(3.0)}, meta=meta, msg_id="a" * 32)
    monkeypatch.setattr(wire, "orjson", None)
    slow = _encode({"a": np.arange(3.0)}, meta=meta, msg_id="a" * 32)
    assert wire.decode(fast).meta == wire.decode(slow).meta == meta
    monkeypatch.undo()
    assert wire.decode(fast).meta == wire.decode(slow).meta == meta
    assert wire.decode(_encode(meta={1: "int keys, written as strings"})).meta == {"1": "int keys, written as strings"}


@pytest.mark.parametrize("version", [0, 2, "1", 1.0, True, None])
def test_rejects_unknown_schema_version(version):
    assert _code(_forge(_valid_header(v=version))) == "schema"


@pytest.mark.parametrize("changes", [
    {"round": -2}, {"round": "3"}, {"sender": ""}, {"kind": "a b"}, {"id": "xyz"}, {"meta": []},
    {"tensors": {}}, {"tensors": [{"name": "a", "dtype": "float64"}]},
    {"tensors": [{"name": "a", "dtype": "float64", "shape": [-1]}]},
    {"tensors": [{"name": "a", "dtype": "float64", "shape": [1.5]}]},
    {"tensors": [{"name": "a", "dtype": "float64", "shape": []}] * 2},
])
def test_rejects_malformed_header(changes):
    assert _code(_forge(_valid_header(**changes))) == "bad_header"


def test_rejects_unknown_header_key():
    h = _valid_header()
    h["extra"] = 1
    assert _code(_forge(h)) == "bad_header"


def test_rejects_wrong_run_round_sender():
    good = _encode()
    assert _code(good, expect_run="run2") == "wrong_run"
    assert _code(good, expect_round=4) == "wrong_round"
    # node-8 publishing on its own topic but claiming to be node-7
    assert _code(good, expect_sender="node-8") == "wrong_sender"


def test_rejects_shape_not_matching_bytes():
    spec = {"name": "a", "dtype": "float64", "shape": [4]}
    assert _code(_forge(_valid_header(tensors=[spec]), bytes(24))) == "size_mismatch"
    assert _code(_forge(_valid_header(tensors=[spec]), bytes(40))) == "size_mismatch"
    huge = {"name": "a", "dtype": "float64", "shape": [2**40, 2**40]}  # no overflow, no allocation
    assert _code(_forge(_valid_header(tensors=[huge]), bytes(8))) == "size_mismatch"


def test_rejects_disallowed_dtype():
    payload = _encode({"a": np.ones(2, dtype=np.float32)})
    assert _code(payload, allowed_dtypes=(np.float64,)) == "dtype"
    spec = {"name": "a", "dtype": "object", "shape": [1]}
    assert _code(_forge(_valid_header(tensors=[spec]), bytes(8))) == "dtype"
    spec = {"name": "a", "dtype": 7, "shape": [1]}
    assert _code(_forge(_valid_header(tensors=[spec]), bytes(8))) == "bad_header"


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_rejects_non_finite(bad):
    spec = {"name": "a", "dtype": "float64", "shape": [3]}
    body = np.array([1.0, bad, 2.0]).tobytes()
    assert _code(_forge(_valid_header(tensors=[spec]), body)) == "non_finite"


@given(values=st.lists(st.one_of(st.floats(allow_nan=True, allow_infinity=True),
                                  st.sampled_from([1e308, -1e308, 1.7e308, np.nan, np.inf, -np.inf, 0.0, -0.0])),
                        min_size=1, max_size=40),
       dtype=st.sampled_from(["float64", "float32", "float16", "complex128"]))
def test_a_tensor_is_refused_exactly_when_one_value_is_not_finite(values, dtype):
    """Decoding refuses a tensor with a NaN or an infinity, and only then: finite values whose sum
    overflows (1e308 + 1e308) are taken (the check sums first, then looks at the values)."""
    with np.errstate(over="ignore", invalid="ignore"):
        arr = np.array(values, dtype=np.float64).astype(dtype)
    spec = {"name": "a", "dtype": dtype, "shape": [len(values)]}
    payload = _forge(_valid_header(tensors=[spec]), arr.tobytes() + bytes(-arr.nbytes % 8))
    if np.isfinite(arr).all():
        assert np.array_equal(wire.decode(payload).tensors["a"], arr)
    else:
        assert _code(payload) == "non_finite"


def test_rejects_oversized():
    payload = _encode({"a": np.ones(1000)})
    assert _code(payload, max_bytes=len(payload) - 1) == "oversized"
    wire.decode(payload, max_bytes=len(payload))
    head_len = struct.pack("<4sI", wire.MESSAGE_MAGIC, wire.MAX_HEADER_BYTES + 1)
    assert _code(head_len + bytes(16)) == "oversized"


# ---- replay ---------------------------------------------------------------------------------


def _msg(sender="n1", rnd=0, kind="update", msg_id=None):
    return wire.decode(_encode(sender=sender, round=rnd, kind=kind, msg_id=msg_id))


def test_replay_guard_rejects_duplicates_only():
    guard = replay.ReplayGuard()
    first = _msg()
    guard.check(first)
    with pytest.raises(wire.WireError) as info:
        guard.check(_msg(msg_id=first.msg_id))  # same message sent again
    assert info.value.code == "replay"
    guard.check(_msg(rnd=4, msg_id=first.msg_id))  # other round: a new key
    guard.check(_msg(kind="signal", msg_id=first.msg_id))  # other kind: a new key
    guard.check(_msg(sender="n2", msg_id=first.msg_id))  # other sender: a new key
    guard.check(_msg())
    assert len(guard) == 5


def test_replay_guard_memory_plateaus_over_rounds():
    """Keys of a sender's rounds before its window are forgotten: memory stays flat however long
    the run, and within the window every replay is still caught."""
    guard = replay.ReplayGuard(window_rounds=4)
    sent = []
    for rnd in range(200):
        for sender in ("coordinator", "n1", "n2"):
            msg = _msg(sender=sender, rnd=rnd)
            guard.check(msg)
            sent.append(msg)
        assert len(guard) <= 3 * 4
    for msg in sent[-3 * 4:]:  # the window: every key still held
        with pytest.raises(wire.WireError, match="duplicate"):
            guard.check(msg)
    for msg in sent[:-3 * 4]:  # before the window: refused as stale, not forgotten and admitted
        with pytest.raises(wire.WireError, match="before the replay window") as info:
            guard.check(msg)
        assert info.value.code == "replay"


def test_replay_guard_windows_are_per_sender():
    """A sender that jumps far ahead moves only its own window."""
    guard = replay.ReplayGuard(window_rounds=2)
    guard.check(_msg(sender="n1", rnd=10**6))
    guard.check(_msg(sender="n2", rnd=0))
    guard.check(_msg(sender="coordinator", rnd=1))
    late = _msg(sender="n1", rnd=10**6 - 1)  # out of order but inside n1's window
    guard.check(late)
    with pytest.raises(wire.WireError, match="duplicate"):
        guard.check(late)


def test_replay_guard_bounds_a_flood():
    guard = replay.ReplayGuard(max_per_round=3, max_entries=5)
    for _ in range(3):
        guard.check(_msg())
    with pytest.raises(wire.WireError, match="over 3 messages"):
        guard.check(_msg())  # a fourth distinct message of one sender's round: refused
    for sender in ("a", "b", "c"):
        guard.check(_msg(sender=sender))
    assert len(guard) <= 5  # past max_entries the oldest round of keys goes


# ---- chunking -------------------------------------------------------------------------------


def _reassemble(frames, reassembler=None, source="t"):
    r = reassembler or chunks.Reassembler()
    done = [out for f in frames if (out := r.add(f, source)) is not None]
    return done, r


@pytest.mark.parametrize("size, max_chunk", [(0, 64), (1, 64), (1000, 64), (1000, 1036), (1000, 1037), (10**6, 2**16)])
def test_chunk_round_trip(size, max_chunk):
    payload = random.Random(size).randbytes(size)
    frames = chunks.chunk(payload, max_chunk)
    assert all(len(f) <= max_chunk for f in frames) and all(chunks.is_chunk(f) for f in frames)
    assert len(frames) == max(1, -(-size // (max_chunk - chunks.CHUNK_HEADER_BYTES)))
    done, r = _reassemble(frames)
    assert done == [payload] and r.pending == 0


def test_chunks_out_of_order_with_duplicates():
    payload = random.Random(0).randbytes(5000)
    frames = chunks.chunk(payload, 500)
    shuffled = frames + frames[::2] + frames[:3]
    random.Random(1).shuffle(shuffled)
    done, r = _reassemble(shuffled)
    assert done == [payload] and r.pending == 0


def test_interleaved_chunk_sets_and_sources():
    p1, p2 = b"a" * 3000, b"b" * 3000
    f1, f2 = chunks.chunk(p1, 200), chunks.chunk(p2, 200, chunk_set_id=b"x" * 16)
    f3 = chunks.chunk(p1, 200, chunk_set_id=b"x" * 16)  # same id as f2, from another source
    r = chunks.Reassembler()
    out = []
    for a, b, c in zip(f1, f2, f3):
        out += [r.add(a, "s1"), r.add(b, "s1"), r.add(c, "s2")]
    assert [o for o in out if o is not None] == [p1, p2, p1]


def test_whole_message_survives_chunking():
    payload = _encode({"w": np.random.default_rng(0).normal(size=10_000)})
    done, _ = _reassemble(reversed(chunks.chunk(payload, 4096)))
    np.testing.assert_array_equal(wire.decode(done[0]).tensors["w"], wire.decode(payload).tensors["w"])


def test_incomplete_payloads_time_out():
    now = [0.0]
    r = chunks.Reassembler(timeout_s=10.0, clock=lambda: now[0])
    frames = chunks.chunk(b"z" * 1000, 200)
    r.add(frames[0])
    assert r.pending == 1
    now[0] = 11.0
    assert r.add(chunks.chunk(b"q", 200)[0]) == b"q"  # any add evicts what has expired
    assert r.pending == 0 and r.evicted == 1
    assert r.add(frames[1]) is None  # a late chunk starts over, it does not complete
    assert r.pending == 1


def test_pending_payloads_are_bounded():
    r = chunks.Reassembler(max_pending=3)
    for i in range(5):
        r.add(chunks.chunk(bytes(1000), 200)[0], source=f"s{i}")
    assert r.pending == 3 and r.evicted == 2


def test_late_duplicate_after_completion_is_ignored():
    frames = chunks.chunk(b"y" * 1000, 200)
    done, r = _reassemble(frames)
    assert r.add(frames[2], "t") is None and r.pending == 0


def _frame(index, count, total, data=b"", cid=b"c" * 16, magic=chunks.CHUNK_MAGIC):
    return struct.pack("<4s16sIIQ", magic, cid, index, count, total) + data


@pytest.mark.parametrize("frame, code", [
    (b"TBWC" + bytes(10), "bad_chunk"),
    (_frame(0, 1, 1, b"x", magic=b"NOPE"), "bad_chunk"),
    (_frame(0, 0, 0), "bad_chunk"),
    (_frame(2, 2, 10, b"x"), "bad_chunk"),
    (_frame(0, 1, 2**40), "oversized"),
    (_frame(0, 2**20, 2**20), "bad_chunk"),  # more chunks than max_chunks
    (_frame(0, 1, 3, b"toolong"), "bad_chunk"),
    (_frame(0, 1, 3, b"x"), "bad_chunk"),  # complete but short
])
def test_rejects_bad_chunks(frame, code):
    with pytest.raises(wire.WireError) as info:
        chunks.Reassembler(max_chunks=2**16).add(frame)
    assert info.value.code == code


def test_rejects_inconsistent_chunks():
    r = chunks.Reassembler()
    assert r.add(_frame(0, 2, 10, b"12345")) is None
    with pytest.raises(wire.WireError, match="bad_chunk"):
        r.add(_frame(1, 3, 10, b"67890"))
    assert r.pending == 0


def test_chunk_rejects_tiny_limit():
    with pytest.raises(ValueError):
        chunks.chunk(b"abc", chunks.CHUNK_HEADER_BYTES)


@pytest.mark.parametrize("bad", [["a"], {"a": 1}, 7, None, "a/b", ""])
def test_an_id_of_another_type_or_shape_is_refused_after_valid_ones_were_seen(bad):
    assert wire.check_id("node-7", "sender") == "node-7"
    assert wire.check_id("node-7", "sender") == "node-7"  # remembered
    with pytest.raises(wire.WireError, match="sender must match"):
        wire.check_id(bad, "sender")


# ---- the layouts of specs decoded before --------------------------------------------------------

_DTYPE_SIZES = {"float64": 8, "float32": 4, "int8": 1}
_VALID_SPECS = st.lists(st.fixed_dictionaries({
    "dtype": st.sampled_from(sorted(_DTYPE_SIZES)),
    "shape": st.lists(st.integers(0, 3), max_size=2)}), min_size=1, max_size=3).map(
    lambda specs: [{"name": f"t{i}", **spec} for i, spec in enumerate(specs)])


def _body_bytes(specs: list[dict]) -> int:
    """The length of the tensors ``specs`` describe, each padded to 8 bytes (wire's layout)."""
    total = 0
    for spec in specs:
        n = _DTYPE_SIZES[spec["dtype"]]
        for d in spec["shape"]:
            n *= d
        total += n + (-n % 8)
    return total


def _variant(specs: list[dict], data) -> list[dict]:
    """``specs`` with one change drawn: none, a shape entry of another JSON type (2 -> 2.0, 1 ->
    true) or value, or another dtype."""
    changed = [dict(spec, shape=list(spec["shape"])) for spec in specs]
    spec = changed[data.draw(st.integers(0, len(changed) - 1))]
    how = data.draw(st.sampled_from(["same", "float", "bool", "value", "dtype"]))
    if how in ("float", "bool", "value") and spec["shape"]:
        i = data.draw(st.integers(0, len(spec["shape"]) - 1))
        d = spec["shape"][i]
        spec["shape"][i] = float(d) if how == "float" else (d == 1 if d in (0, 1) else d) if how == "bool" else d + 1
    elif how == "dtype":
        spec["dtype"] = data.draw(st.sampled_from(sorted(set(_DTYPE_SIZES) | {"object"})))
    return changed


def _outcome(payload: bytes, allowed) -> tuple:
    """What decode makes of ``payload``: (its code and reason) or its tensors (name, dtype, shape,
    bytes)."""
    try:
        msg = wire.decode(payload, allowed_dtypes=allowed)
    except wire.WireError as exc:
        return (exc.code, exc.reason)
    return tuple((k, v.dtype.str, v.shape, v.tobytes()) for k, v in msg.tensors.items())


@given(first=_VALID_SPECS, data=st.data())
def test_a_layout_decoded_before_never_changes_a_decision(first, data):
    """A message decoded after another whose layout decode keeps is accepted or refused, with the
    same code, reason and tensors, as when it is decoded first: specs equal but for a JSON type (2
    and 2.0, 1 and true), a shape, a dtype; fewer allowed dtypes; a body longer or shorter by a
    few bytes; values that are not finite."""
    require_module("orjson", "node")
    second = _variant(first, data)
    size = (_body_bytes(second) if "object" not in {s["dtype"] for s in second}
            and all(type(d) is int for s in second for d in s["shape"]) else _body_bytes(first))
    size = max(0, size + data.draw(st.sampled_from([0, 0, 0, -8, 8, -1])))
    fill = data.draw(st.sampled_from([0, 0x3F, 0xFF]))  # 0xFF: float NaNs
    allowed = data.draw(st.sampled_from([wire.DEFAULT_ALLOWED_DTYPES, ("float64", "int8"), ("float32",)]))
    kept = _forge(_valid_header(tensors=first), bytes(_body_bytes(first)))
    payload = _forge(_valid_header(tensors=second), bytes([fill]) * size)
    wire._LAYOUTS.clear()
    fresh = _outcome(payload, allowed)
    wire._LAYOUTS.clear()
    assert wire.decode(kept).tensors.keys() == {s["name"] for s in first}  # its layout is kept now
    assert wire._LAYOUTS
    assert _outcome(payload, allowed) == fresh
    assert _outcome(payload, allowed) == fresh  # after its own layout was kept, if it had one


def test_the_layouts_kept_stay_bounded():
    require_module("orjson", "node")
    wire._LAYOUTS.clear()
    for n in range(3 * wire._LAYOUTS_KEPT):
        wire.decode(_encode({f"t{n}": np.zeros(1)}))
    assert 0 < len(wire._LAYOUTS) <= wire._LAYOUTS_KEPT
