"""Message authentication (testbed.mqtt.auth) at both ends, searched by Hypothesis: frames sealed by
the coordinator, a node or the channel open for their readers only; forged (other keys, no seal),
altered (any byte flipped), truncated, extended, moved to another topic, replayed and reordered
frames of every kind are dropped at the receiving client's intake (MqttClient._take, the path every
received frame takes) before any state moves: no delivery, no replay window entry, no chunk
buffered, no status epoch, only the ``forged`` count; and the log says so at a bounded rate."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from testbed.mqtt import wire
from testbed.mqtt import auth, chunks, topics
from testbed.mqtt.client import MqttClient
from testbed.rounds import protocol

RUN, SESSION = "authrun", "0123456789abcdef"
NODES = ["0", "1", "2"]
BASE = {p: bytes([i + 1]) * 32 for i, p in enumerate(NODES + [topics.CHANNEL])}
#: What the coordinator's process holds (every node's key and the channel's), and what node 1 holds.
COORDINATOR_KEYS = auth.Keys(RUN, BASE)
NODE1_KEYS = COORDINATOR_KEYS.only(["1"])
#: Keys of someone on the broker: the right names, keys of its own.
FORGER_KEYS = auth.Keys(RUN, {p: bytes([0xEE - i]) * 32 for i, p in enumerate(NODES + [topics.CHANNEL])})

ids = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,12}", fullmatch=True)
sessions = st.one_of(st.just(""), ids)
rounds = st.integers(0, 2**64 - 1)
bodies = st.binary(max_size=300)


def _update(node: str, round_index: int, session: str = SESSION) -> bytes:
    return protocol.update(RUN, session, round_index, int(node), {"update": np.arange(3.0)}, [])


def _round(round_index: int, session: str = SESSION) -> bytes:
    return protocol.round_(RUN, session, round_index, "x = 1\n", [0, 1, 2], {"model": np.ones(3)})


def _coordinator(**kwargs) -> tuple[MqttClient, list]:
    """The coordinator's client (never connected): what it hands over is collected."""
    got: list = []
    client = MqttClient.for_coordinator("mqtt://127.0.0.1:1", RUN, keys=COORDINATOR_KEYS, auth_session=SESSION,
                                        on_inbound=got.append, replay_window_rounds=2**62, **kwargs)
    return client, got


def _node(**kwargs) -> tuple[MqttClient, list]:
    got: list = []
    client = MqttClient.for_node("mqtt://127.0.0.1:1", RUN, "1", keys=NODE1_KEYS, on_inbound=got.append, **kwargs)
    return client, got


def _state(client: MqttClient) -> tuple:
    """Everything per sender a received frame could move."""
    return (len(client._replay), client._reassembler.pending, dict(client._epochs._latest), client.rejected)


# ---------------------------------------------------------------------------------- seal and open

@given(topic_node=st.sampled_from(NODES), session=sessions, round_index=rounds, body=bodies)
def test_a_sealed_frame_opens_for_its_reader_and_says_what_was_sealed(topic_node, session, round_index, body):
    topic = topics.up(RUN, topic_node)
    frame = auth.seal(COORDINATOR_KEYS, topic, [topic_node], session, round_index, body)
    opened = auth.open_sealed(COORDINATOR_KEYS, topic, topic_node, frame)
    assert (opened.session, opened.round, opened.body) == (session, round_index, body)
    assert len(frame) == len(body) + auth.overhead([topic_node], session)
    assert auth.unverified_body(frame) == body


@given(session=sessions, round_index=rounds, body=bodies, data=st.data())
def test_any_change_to_a_frame_is_forged(session, round_index, body, data):
    topic = topics.up(RUN, "1")
    frame = auth.seal(COORDINATOR_KEYS, topic, ["1"], session, round_index, body)
    how = data.draw(st.sampled_from(["flip", "truncate", "extend", "topic", "keys", "unsealed"]))
    if how == "flip":
        at = data.draw(st.integers(0, len(frame) - 1))
        changed = bytearray(frame)
        changed[at] ^= data.draw(st.integers(1, 255))
        frame, opened_topic = bytes(changed), topic
    elif how == "truncate":
        frame, opened_topic = frame[:data.draw(st.integers(0, len(frame) - 1))], topic
    elif how == "extend":
        frame, opened_topic = frame + data.draw(st.binary(min_size=1, max_size=20)), topic
    elif how == "topic":  # node 1's frame moved to node 0's uplink, or to a downlink
        opened_topic = data.draw(st.sampled_from([topics.up(RUN, "0"), topics.down(RUN, "1"), topics.up("x", "1")]))
    elif how == "keys":  # right names, wrong keys: anyone on the broker
        frame, opened_topic = auth.seal(FORGER_KEYS, topic, ["1"], session, round_index, body), topic
    else:
        frame, opened_topic = body, topic
    with pytest.raises(auth.Forged):
        auth.open_sealed(COORDINATOR_KEYS, opened_topic, "1", frame)


@given(session=sessions, round_index=rounds, body=bodies)
def test_a_broadcast_opens_for_each_node_with_its_own_key_only(session, round_index, body):
    topic = topics.bcast(RUN)
    frame = auth.seal(COORDINATOR_KEYS, topic, NODES, session, round_index, body)
    for node in NODES:
        mine = COORDINATOR_KEYS.only([node])
        assert auth.open_sealed(mine, topic, node, frame).body == body
        with pytest.raises(auth.Forged):  # its key is not another node's
            auth.open_sealed(auth.Keys(RUN, {"2" if node != "2" else "0": mine.session_key(node, "") }), topic,
                             "2" if node != "2" else "0", frame)


@given(session=sessions, digest=st.binary(min_size=32, max_size=32), node=st.sampled_from(NODES))
def test_a_tag_is_hmac_sha256_of_the_session_key(session, digest, node):
    import hmac

    expected = hmac.digest(COORDINATOR_KEYS.session_key(node, session), digest, "sha256")[:auth.TAG_BYTES]
    assert auth.tag(COORDINATOR_KEYS, node, session, digest) == expected


def test_session_keys_differ_by_run_and_session_and_keys_never_print():
    keys = auth.Keys("r1", {"0": bytes(32)})
    assert len({keys.session_key("0", "a"), keys.session_key("0", "b"), auth.Keys("r2", {"0": bytes(32)}).session_key("0", "a")}) == 3
    assert bytes(32).hex() not in repr(keys) and "00000000" not in repr(keys)


@given(payload=st.binary(max_size=200))
def test_session_and_round_never_raise(payload):
    session, round_index = wire.session_and_round(payload)
    assert isinstance(session, str) and 0 <= round_index < 2**64


@given(round_index=st.integers(0, 2**40), session=ids)
def test_session_and_round_read_a_messages_header(round_index, session):
    assert wire.session_and_round(_update("1", round_index, session)) == (session, round_index)


# --------------------------------------------------------------------- the coordinator's intake

FORGERIES = ["unsealed", "other_keys", "flipped", "truncated", "moved", "other_session_key"]


def _forge(how: str, topic: str, principals: list[str], payload: bytes, session: str, round_index: int,
           data: st.DataObject) -> tuple[str, bytes]:
    """A forgery of a frame on ``topic``: (the topic it is sent on, its bytes)."""
    good = auth.seal(COORDINATOR_KEYS, topic, principals, session, round_index, payload)
    if how == "unsealed":
        return topic, payload
    if how == "other_keys":
        return topic, auth.seal(FORGER_KEYS, topic, principals, session, round_index, payload)
    if how == "flipped":
        changed = bytearray(good)
        changed[data.draw(st.integers(0, len(good) - 1), label="at")] ^= 0x41
        return topic, bytes(changed)
    if how == "truncated":
        return topic, good[:data.draw(st.integers(0, len(good) - 1), label="cut")]
    if how == "moved":  # a genuine frame of another node's topic
        other = topics.up(RUN, "2") if topic != topics.up(RUN, "2") else topics.up(RUN, "0")
        return other, good
    # sealed with a key of the right node for a session it claims but was never given: a run key of its own
    return topic, auth.seal(auth.Keys(RUN, {p: bytes(32) for p in principals}), topic, principals, session,
                            round_index, payload)


@settings(max_examples=150)
@given(data=st.data(), how=st.sampled_from(FORGERIES),
       kind=st.sampled_from(["update", "chunk", "online", "offline"]), round_index=st.integers(0, 50))
def test_the_coordinator_drops_a_forgery_of_any_kind_before_it_moves_anything(data, how, kind, round_index):
    client, got = _coordinator()
    node = data.draw(st.sampled_from(NODES), label="node")
    if kind in ("online", "offline"):
        topic, payload, r = topics.status(RUN, node), kind.encode(), auth.new_epoch()
    elif kind == "chunk":
        topic, payload, r = topics.up(RUN, node), chunks.chunk(_update(node, round_index), 64)[0], round_index
    else:
        topic, payload, r = topics.up(RUN, node), _update(node, round_index), round_index
    sent_on, frame = _forge(how, topic, [node], payload, SESSION, r, data)
    before = _state(client)
    client._take(sent_on, frame)
    assert got == [] and _state(client) == before and client.forged == 1


@settings(max_examples=100)
@given(data=st.data(), round_index=st.integers(0, 50))
def test_the_coordinator_takes_a_genuine_frame_once_and_a_replay_never(data, round_index):
    client, got = _coordinator()
    node = data.draw(st.sampled_from(NODES))
    topic = topics.up(RUN, node)
    frames = [auth.seal(COORDINATOR_KEYS, topic, [node], SESSION, round_index, f)
              for f in chunks.chunk(_update(node, round_index), data.draw(st.sampled_from([64, 200, 10**6])))]
    order = data.draw(st.permutations(frames))
    for frame in order:  # any order
        client._take(topic, frame)
    for frame in data.draw(st.lists(st.sampled_from(frames), max_size=4)):  # replays, any of them
        client._take(topic, frame)
    assert [(i.node, i.message.round) for i in got] == [(node, round_index)]
    assert client.forged == 0


def test_the_coordinator_drops_a_genuine_frame_of_another_session_before_it_is_buffered():
    client, got = _coordinator()
    topic = topics.up(RUN, "1")
    frame = auth.seal(COORDINATOR_KEYS, topic, ["1"], "fedcba9876543210", 3,
                      chunks.chunk(_update("1", 3, "fedcba9876543210"), 64)[0])
    client._take(topic, frame)
    assert got == [] and client._reassembler.pending == 0 and client.rejected == 1


def test_a_seal_that_disagrees_with_its_message_is_refused():
    """Only a key holder can make one (a bug, or a node lying): the seal's round and session are the message's."""
    client, got = _coordinator()
    topic = topics.up(RUN, "1")
    client._take(topic, auth.seal(COORDINATOR_KEYS, topic, ["1"], SESSION, 4, _update("1", 3)))
    assert got == [] and client.rejected == 1 and len(client._replay) == 0


# ----------------------------------------------------------------------------- statuses and wills

@settings(max_examples=150)
@given(statuses=st.lists(st.tuples(st.integers(1, 6), st.booleans()), min_size=1, max_size=12), data=st.data())
def test_statuses_in_any_order_end_at_the_newest_connection(statuses, data):
    """Genuine statuses of one node, delivered in any order with replays: the last one handed over
    says what the newest connection's said (its will, if it had one, else its online); a will of an
    earlier connection never drops the node once a newer connection's status was taken."""
    client, got = _coordinator()
    topic = topics.status(RUN, "1")
    frames = [(e, online, auth.seal(COORDINATOR_KEYS, topic, ["1"], "", e, b"online" if online else b"offline"))
              for e, online in statuses]
    delivered = data.draw(st.lists(st.sampled_from(frames), min_size=len(frames), max_size=2 * len(frames)))
    for _, _, frame in delivered:
        client._take(topic, frame)
    newest = max(e for e, _, _ in delivered)
    expected = b"offline" if any(e == newest and not online for e, online, _ in delivered) else b"online"
    assert got and got[-1].payload == expected
    assert client.forged == 0


def test_a_will_replayed_from_an_earlier_connection_does_not_drop_a_live_node():
    client, got = _coordinator()
    topic = topics.status(RUN, "1")
    old_will = auth.seal(COORDINATOR_KEYS, topic, ["1"], SESSION, auth.new_epoch(), b"offline")
    client._take(topic, old_will)
    client._take(topic, auth.seal(COORDINATOR_KEYS, topic, ["1"], SESSION, auth.new_epoch(), b"online"))
    client._take(topic, old_will)
    assert [i.payload for i in got] == [b"offline", b"online"] and client.rejected == 1


def test_a_will_of_another_session_does_not_verify_in_a_new_one():
    """A run's emulated boards have keys of a run key made for the session: last session's will is
    sealed with keys this session's coordinator does not hold."""
    client, got = _coordinator()
    last_session = auth.Keys.from_run_key(RUN, auth.new_key(), NODES)
    topic = topics.status(RUN, "1")
    client._take(topic, auth.seal(last_session, topic, ["1"], "aaaaaaaaaaaaaaaa", auth.new_epoch(), b"offline"))
    assert got == [] and client.forged == 1


def test_a_clients_will_and_online_are_sealed_for_a_new_epoch_at_each_connection():
    client = MqttClient.for_node("mqtt://127.0.0.1:1", RUN, "1", keys=NODE1_KEYS, auth_session=SESSION)
    first = client._status(topics.STATUS_OFFLINE)

    class FakePaho:
        def will_set(self, topic, payload, qos, retain):
            self.will = payload

    fake = FakePaho()
    client._on_disconnect(fake, None, None, None, None)  # a lost connection: the next one's will
    opened = [auth.open_sealed(COORDINATOR_KEYS, client.status_topic, "1", f) for f in (first, fake.will)]
    assert [o.body for o in opened] == [b"offline", b"offline"] and opened[1].round > opened[0].round
    assert {o.session for o in opened} == {SESSION}


# ------------------------------------------------------------------------------- the node's intake

NODE_TOPICS = {"down": topics.down(RUN, "1"), "bcast": topics.bcast(RUN), "coord": topics.coord(RUN)}


@settings(max_examples=150)
@given(data=st.data(), how=st.sampled_from(FORGERIES), which=st.sampled_from(sorted(NODE_TOPICS)),
       round_index=st.integers(0, 50))
def test_a_node_drops_a_forged_downlink_broadcast_stop_or_coordinator_status(data, how, which, round_index):
    client, got = _node()
    topic = NODE_TOPICS[which]
    principals = ["1"] if which == "down" else NODES
    if which == "coord":
        payload, r = b"offline", auth.new_epoch()
    else:
        payload = data.draw(st.sampled_from([_round(round_index), protocol.stop(RUN, SESSION, "failed", round_index)]))
        r = round_index
    if how == "moved":  # node 0's genuine downlink sent on node 1's
        sent_on, frame = topic, auth.seal(COORDINATOR_KEYS, topics.down(RUN, "0"), ["0"], SESSION, r, payload)
    else:
        sent_on, frame = _forge(how, topic, principals, payload, SESSION, r, data)
    before = _state(client)
    client._take(sent_on, frame)
    if how == "flipped" and got:  # only a flip in another node's tag leaves node 1's verifying: the genuine message
        assert [i.payload for i in got] == [payload] and client.forged == 0
        return
    assert got == [] and _state(client) == before and client.forged == 1


@settings(max_examples=60)
@given(round_index=st.integers(0, 50), which=st.sampled_from(["down", "bcast"]), replays=st.integers(0, 3))
def test_a_node_takes_the_coordinators_genuine_message_once(round_index, which, replays):
    client, got = _node()
    topic = NODE_TOPICS[which]
    frame = auth.seal(COORDINATOR_KEYS, topic, ["1"] if which == "down" else NODES, SESSION, round_index,
                      _round(round_index))
    for _ in range(1 + replays):
        client._take(topic, frame)
    assert [i.message.round for i in got] == [round_index] and client.forged == 0


def test_a_board_takes_any_session_but_a_host_of_one_session_only_that_one():
    board, got = _node()  # a board: no session known at connect
    host, host_got = _node(auth_session=SESSION)
    other = "fedcba9876543210"
    for client in (board, host):
        client._take(topics.bcast(RUN), auth.seal(COORDINATOR_KEYS, topics.bcast(RUN), NODES, other, 1, _round(1, other)))
    assert len(got) == 1 and host_got == [] and host.rejected == 1


# ------------------------------------------------------------------------------- bounded logging

def test_a_flood_of_forgeries_writes_a_line_per_sender_and_interval(caplog):
    now = [0.0]
    log = auth.RejectLog("c", interval_s=10.0, clock=lambda: now[0])
    caplog.set_level(logging.WARNING, logger="testbed.mqtt.auth")
    for i in range(30_000):
        log.reject(str(i % 3), "up", "not sealed")
    assert log.count == 30_000 and len(caplog.records) == 3
    now[0] = 11.0
    log.reject("0", "up", "not sealed")
    assert len(caplog.records) == 4 and "9999 more" in caplog.records[-1].getMessage()
    for i in range(10_000):  # senders beyond max_keys share one line
        log.reject(f"x{i}", "up", "not sealed")
    assert len(caplog.records) <= 4 + log.max_keys + 1


def test_a_chunk_flood_from_a_forger_buffers_nothing_and_the_node_s_update_comes_through():
    client, got = _coordinator()
    topic = topics.up(RUN, "0")
    for i in range(2000):
        client._take(topic, auth.seal(FORGER_KEYS, topic, ["0"], SESSION, 1,
                                      chunks.chunk(bytes(300), 136, chunk_set_id=i.to_bytes(16, "little"))[0]))
    assert client._reassembler.pending == 0 and client.forged == 2000
    for frame in chunks.chunk(_update("0", 1), 64):
        client._take(topic, auth.seal(COORDINATOR_KEYS, topic, ["0"], SESSION, 1, frame))
    assert [(i.node, i.message.round) for i in got] == [("0", 1)]


# ------------------------------------------------------------------- every topic kind, either end

def _channel() -> tuple[MqttClient, list]:
    got: list = []
    client = MqttClient.for_channel("mqtt://127.0.0.1:1", RUN, keys=COORDINATOR_KEYS, auth_session=SESSION,
                                    on_inbound=got.append)
    return client, got


#: kind -> (its topic, the reader's client, who tags it, what it carries at round r)
KINDS = {
    "up": (topics.up(RUN, "1"), _coordinator, ["1"], lambda r: _update("1", r)),
    "ready": (topics.up(RUN, "1"), _coordinator, ["1"], lambda r: protocol.ready(RUN, SESSION, 1, "a" * 64)),
    "status": (topics.status(RUN, "1"), _coordinator, ["1"], lambda r: b"offline"),
    "channel status": (topics.status(RUN, topics.CHANNEL), _coordinator, [topics.CHANNEL], lambda r: b"offline"),
    "tx": (topics.tx(RUN, "1"), _channel, ["1"], lambda r: protocol.signal(RUN, SESSION, r, 1, np.ones(4))),
    "chan": (topics.chan(RUN), _channel, [topics.CHANNEL], lambda r: protocol.stop(RUN, SESSION, "failed", r)),
    "down": (topics.down(RUN, "1"), _node, ["1"], lambda r: _round(r)),
    "bcast": (topics.bcast(RUN), _node, NODES, lambda r: protocol.stop(RUN, SESSION, "failed", r)),
    "coord": (topics.coord(RUN), _node, NODES + [topics.CHANNEL], lambda r: b"offline"),
    "rx": (topics.rx(RUN, "1"), _node, ["1"], lambda r: protocol.received(RUN, SESSION, r, [0, 1], np.ones(4))),
}


@settings(max_examples=300)
@given(data=st.data(), kind=st.sampled_from(sorted(KINDS)), how=st.sampled_from(FORGERIES),
       round_index=st.integers(0, 40), chunked=st.booleans())
def test_a_forgery_of_any_kind_at_either_end_moves_nothing(data, kind, how, round_index, chunked):
    topic, reader, principals, carries = KINDS[kind]
    client, got = reader()
    payload = whole = carries(round_index)
    status = payload in topics.STATUS_VALUES
    r = auth.new_epoch() if status else wire.session_and_round(payload)[1]
    if chunked and not status:
        payload = chunks.chunk(payload, 64)[data.draw(st.integers(0, 1), label="chunk")]
    if how == "moved":  # another node's genuine frame, or one of another topic
        sent_on = topic
        frame = auth.seal(COORDINATOR_KEYS, topics.up(RUN, "0"), ["0"], SESSION, r, payload)
    else:
        sent_on, frame = _forge(how, topic, principals, payload, SESSION, r, data)
    before = _state(client)
    client._take(sent_on, frame)
    if how == "flipped" and client.forged == 0:  # a flip in another reader's tag: the genuine frame, as sent
        assert len(principals) > 1 and all(i.payload == whole for i in got)
        return
    assert got == [] and _state(client) == before and client.forged == 1


@settings(max_examples=100)
@given(kind=st.sampled_from(sorted(KINDS)), round_index=st.integers(0, 40), replays=st.integers(0, 3))
def test_a_genuine_frame_of_any_kind_is_taken_once(kind, round_index, replays):
    topic, reader, principals, carries = KINDS[kind]
    client, got = reader()
    payload = carries(round_index)
    status = payload in topics.STATUS_VALUES
    frame = auth.seal(COORDINATOR_KEYS, topic, principals, SESSION,
                      auth.new_epoch() if status else wire.session_and_round(payload)[1], payload)
    for _ in range(1 + replays):
        client._take(topic, frame)
    assert len(got) == 1 and got[0].payload == payload and client.forged == 0


# ----------------------------------------------------------------------- keys files, one line each

@pytest.mark.parametrize("content, said", [
    (None, "no message keys: give --keys FILE"),
    ("not json", "cannot read it (JSONDecodeError)"),
    ('{"1": "00"}', "is not a node id with 64 hex digits"),
    ('{"2": "' + "ab" * 32 + '"}', "no key for node(s) 1"),
])
def test_a_node_without_its_key_is_one_line_that_shows_no_key(tmp_path, capsys, monkeypatch, content, said):
    from testbed.cli import main

    monkeypatch.delenv(auth.KEYS_ENV, raising=False)
    args = ["node", "--broker", "mqtt://127.0.0.1:1", "--node-id", "1", "--state-dir", str(tmp_path / "s")]
    if content is not None:
        (tmp_path / "keys.json").write_text(content)
        args += ["--keys", str(tmp_path / "keys.json")]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert said in err and "\n" not in err and "ab" * 8 not in err


def test_real_boards_without_keys_are_refused_in_one_line_before_anything_starts(tmp_path, small_config_text):
    from testbed.assembly.config import load_config_text
    from testbed.errors import ConfigError
    from testbed.orchestration.runner import run_experiment

    config = load_config_text(small_config_text.replace("[output]", '[mqtt]\nbroker_url = "mqtt://127.0.0.1:1"\n'
                                                        'emulated = false\n[output]')
                              .replace("[run]", '[run]\nmode = "mqtt"'))
    with pytest.raises(ConfigError, match="mqtt.keys: real boards"):
        run_experiment(config, out_dir=tmp_path / "run", quiet=True)


class _FakePaho:
    """What a client publishes through paho, kept."""

    def __init__(self) -> None:
        self.published: list[tuple[str, bytes, bool]] = []

    def publish(self, topic, payload, qos, retain):
        self.published.append((topic, payload, retain))
        return type("Info", (), {"mid": len(self.published), "rc": 0})()


@pytest.mark.parametrize("session", ["", SESSION])
def test_a_board_answers_a_new_coordinator_connection_with_its_current_status(session):
    """A board (statuses without a session) says `online` again, of its current epoch, when a
    coordinator's newer connection says online: that coordinator takes it over a will of the
    board's earlier connection someone replayed as the retained status. A host of one session has
    no such will to fear and says nothing."""
    client, _ = _node(auth_session=session)
    client._paho, client.connected = _FakePaho(), True
    coord = topics.coord(RUN)
    for epoch in (auth.new_epoch(), auth.new_epoch()):
        online = auth.seal(COORDINATOR_KEYS, coord, NODES + [topics.CHANNEL], SESSION, epoch, b"online")
        client._take(coord, online)
        client._take(coord, online)  # a copy: no second answer
    answers = client._paho.published
    assert len(answers) == (0 if session else 2)
    coordinator, got = _coordinator()
    replayed_will = auth.seal(COORDINATOR_KEYS, client.status_topic, ["1"], "", client._epoch - 1, b"offline")
    coordinator._take(client.status_topic, replayed_will)
    for topic, payload, retain in answers:
        assert topic == client.status_topic and retain
        coordinator._take(topic, payload)
    assert [i.payload for i in got][-1] == (b"offline" if session else b"online")
