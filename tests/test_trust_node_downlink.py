"""The node agent's downlink is a trust boundary: an honest round, setup, received signal or stop
(testbed.rounds.protocol) with any field mutated (kind, round, run, session, expected nodes, experiment
text, server charges, senders, tensors: dropped, added, renamed, retyped, reshaped, scaled) and fed
to NodeAgent.handle either raises wire.WireError (one line in the transport's log) or is answered
as its kind says; no other exception escapes, and a refused message leaves the node's ledger as it
was (charges are taken only from a valid round of the current session)."""

from __future__ import annotations

import copy
import functools
import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from nodes.agent import NodeAgent, step_nodes
from testbed.assembly import assemble
from testbed.assembly.assemble import load_data, model_for
from testbed.assembly.config import load_config_text, to_toml
from testbed.ledger.events import GaussianEvent
from testbed.mqtt import wire
from testbed.rounds import protocol

RUN, SESSION, NODE = "trust", "s1", 1
EXPECTED = [0, 1, 2]
CONFIGS = {
    "dp_pasgd": '[run]\nseed = 2\n[data]\nnum_nodes = 3\nsamples_per_node = 30\ndim = 3\n'
                '[dp_pasgd]\nsteps = 40\ntau = 2\nbatch = 4\nsigma = 1.0\n[budget]\nepsilon = 1e6\n',
    "acfl": '[run]\nalgorithm = "acfl"\nseed = 3\n[data]\ndataset = "regression"\nnum_nodes = 3\n'
            'samples_per_node = 20\ndim = 3\noutputs = 2\n[model]\nkind = "linear"\nbias = false\n'
            '[acfl]\niterations = 20\n',
    "dwfl": '[run]\nalgorithm = "dwfl"\nseed = 5\n[data]\nnum_nodes = 3\nsamples_per_node = 30\ndim = 3\n'
            '[dwfl]\nrounds = 20\nbatch = 4\nlr = 0.3\nepsilon = 0.5\nfading = "none"\n'
            'coherence_rounds = 1\nc_scale = 0.7\n[privacy]\ndelta = 1e-5\n',
}
ROUND = 3


@functools.cache
def _toml(name: str) -> str:
    return to_toml(load_config_text(CONFIGS[name]))


@functools.cache
def _algorithm(name: str):
    cfg = load_config_text(_toml(name))
    data = load_data(cfg.data, cfg.run.seed)
    return assemble.build_algorithm(cfg, model_for(cfg.model, data, cfg.run.seed), data)


def _downlink(name: str, round_index: int = ROUND) -> dict[str, np.ndarray]:
    """Honest-looking downlink tensors of the algorithm's declaration."""
    alg = _algorithm(name)
    rng = np.random.default_rng(round_index)
    out = {}
    for key, spec in alg.downlink_spec().items():
        value = rng.normal(scale=0.1, size=spec.shape)
        out[key] = (value + 1j * rng.normal(scale=0.1, size=spec.shape) + 1.0) if spec.dtype == "complex128" else value
    return out


def _charge(round_index: int) -> GaussianEvent:
    """Server-side noise issued on the node's behalf in an earlier round."""
    return GaussianEvent(NODE, round_index, sigma=2.0, sensitivity=0.1, count=1, issuer="server")


def _round_header(name: str) -> tuple[dict, dict[str, np.ndarray]]:
    msg = wire.decode(protocol.round_(RUN, SESSION, ROUND, _toml(name), EXPECTED, _downlink(name), [_charge(1)]))
    return _header(msg), dict(msg.tensors)


def _header(msg: wire.Message) -> dict:
    return {"run": msg.run, "round": msg.round, "sender": msg.sender, "kind": msg.kind, "meta": copy.deepcopy(msg.meta)}


def _honest(base: str) -> tuple[str, dict, dict[str, np.ndarray]]:
    """(algorithm, header, tensors) of an honest message of ``base``."""
    if base == "dp_pasgd-round":
        return ("dp_pasgd", *_round_header("dp_pasgd"))
    if base == "acfl-round":
        return ("acfl", *_round_header("acfl"))
    if base == "acfl-setup":
        return "acfl", _header(wire.decode(protocol.setup(RUN, SESSION, _toml("acfl"), EXPECTED))), {}
    if base == "dwfl-received":
        signal = np.full(_algorithm("dwfl").channel.signal_spec().shape, 0.01)
        return "dwfl", _header(wire.decode(protocol.received(RUN, SESSION, ROUND, EXPECTED, signal))), {"received": signal}
    return "dp_pasgd", _header(wire.decode(protocol.stop(RUN, SESSION, "completed", ROUND))), {}


BASES = ["dp_pasgd-round", "acfl-round", "acfl-setup", "dwfl-received", "stop"]
KINDS = [protocol.ROUND, protocol.SETUP, protocol.RECEIVED, protocol.STOP, protocol.UPDATE, protocol.TRANSMIT,
         protocol.SIGNAL, "x"]
ID = st.from_regex(re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,8}"), fullmatch=True)
NUMBER = st.one_of(st.integers(-(2**70), 2**70), st.floats(allow_nan=False, allow_infinity=False),
                   st.sampled_from([0, -1, 1e308, 1e-308, 2**63, -(2**63), 2**64]))
JSON = st.recursive(st.one_of(st.none(), st.booleans(), NUMBER, st.text(max_size=12)),
                    lambda inner: st.one_of(st.lists(inner, max_size=4),
                                            st.dictionaries(st.text(max_size=6), inner, max_size=4)),
                    max_leaves=12)
NODE_IDS = st.lists(st.one_of(st.integers(-3, 2**40), st.booleans(), st.sampled_from([0, 1, 2, 1, 1])), max_size=6)


TOML_VALUES = ["0", "-1", "1e308", "nan", "inf", "2e19", "1e-308", "true", "[]", '"x"']


@st.composite
def _config_text(draw, text: str) -> object:
    """The experiment text cut, with a value replaced, garbled, or not a string at all."""
    how = draw(st.sampled_from(["cut", "value", "garble", "other"]))
    if how == "cut":
        return text[: draw(st.integers(0, len(text)))]
    if how == "value":
        lines = text.splitlines()
        numbered = [i for i, line in enumerate(lines) if " = " in line] or [0]
        i = draw(st.sampled_from(numbered))
        key = lines[i].split(" = ")[0]
        lines[i] = f"{key} = {draw(st.sampled_from(TOML_VALUES))}"
        return "\n".join(lines)
    if how == "garble":
        return draw(st.text(max_size=40))
    return draw(JSON)


@st.composite
def _charges(draw, honest: list) -> list:
    """The server charges: one field of the honest one replaced, or anything."""
    if draw(st.booleans()) or not honest:
        return draw(st.lists(JSON, max_size=3))
    event = dict(honest[0])
    key = draw(st.sampled_from(sorted(event) + ["extra"]))
    event[key] = draw(st.one_of(JSON, st.sampled_from([NODE, 0, ROUND, ROUND + 5, -1, -2, "server", "node", "gaussian",
                                                       "compute"])))
    return draw(st.sampled_from([[event], [event, event], honest + [event]]))


@st.composite
def _tensors(draw, tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    tensors = dict(tensors)
    how = draw(st.sampled_from(["drop", "add", "rename", "dtype", "shape", "scale", "empty"]))
    names = sorted(tensors)
    if how == "add" or not names:
        tensors[draw(st.sampled_from(["extra", "model", "W", "received", "channel_h"]))] = np.zeros(
            draw(st.lists(st.integers(0, 5), max_size=3)))
        return tensors
    name = draw(st.sampled_from(names))
    value = tensors.pop(name)
    if how == "drop":
        return tensors
    if how == "rename":
        tensors[draw(st.sampled_from(["extra", "model", "W", "received", "channel_h"]))] = value
    elif how == "dtype":
        tensors[name] = value.real.astype(draw(st.sampled_from(["float32", "float16", "int64", "int8", "complex128",
                                                                "uint8"])))
    elif how == "shape":
        flat = value.reshape(-1)
        size = draw(st.integers(0, flat.size + 3))
        tensors[name] = np.resize(flat, size).reshape(draw(st.sampled_from([(size,), (1, size), (size, 1)])))
    elif how == "scale":
        tensors[name] = value * draw(st.sampled_from([1e300, -1e300, 1e6, 0.0, 1e-300]))
    else:
        tensors[name] = value.reshape(-1)[:0]
    return tensors


@st.composite
def _mutated(draw) -> tuple[str, str, dict, dict[str, np.ndarray]]:
    """(base, algorithm, header, tensors) of an honest message with one field mutated."""
    base = draw(st.sampled_from(BASES))
    algorithm, header, tensors = _honest(base)
    meta = header["meta"]
    field = draw(st.sampled_from(["kind", "round", "run", "session", "expected", "config", "charges", "senders",
                                  "tensors", "meta-drop", "meta-extra"]))
    if field == "kind":
        header["kind"] = draw(st.sampled_from(KINDS))
    elif field == "round":
        header["round"] = draw(st.one_of(st.integers(0, 2**62), st.sampled_from([0, 1, ROUND - 1, ROUND + 1])))
    elif field == "run":
        header["run"] = draw(ID)
    elif field == "session":
        meta["session"] = draw(st.one_of(JSON, ID))
    elif field in ("expected", "senders"):
        meta[field] = draw(st.one_of(NODE_IDS, JSON))
    elif field == "config":
        meta["config"] = draw(_config_text(meta.get("config") or _toml(algorithm)))
    elif field == "charges":
        meta["charges"] = draw(_charges(meta.get("charges", [])))
    elif field == "tensors":
        tensors = draw(_tensors(tensors))
    elif field == "meta-drop" and meta:
        meta.pop(draw(st.sampled_from(sorted(meta))))
    else:
        meta[draw(st.text(min_size=1, max_size=8))] = draw(JSON)
    return base, algorithm, header, tensors


def _decoded(header: dict, tensors: dict[str, np.ndarray]) -> wire.Message | None:
    """What the transport hands the node (None: the wire refuses it before the node sees it)."""
    try:
        return wire.decode(wire.encode(header, tensors))
    except wire.WireError:
        return None


class _Node:
    """One agent per example (a node computes a round once per session, so an agent that released
    the honest round in an earlier example would not step it again), whose experiment is built
    once per algorithm (that takes a while); each example starts with an honest round of the
    session so the ledger holds something."""

    def __init__(self):
        self.experiments: dict[str, dict] = {}

    def prepared(self, algorithm: str, base: str) -> NodeAgent:
        agent = NodeAgent(NODE)
        if algorithm not in self.experiments:
            agent._experiment(_toml(algorithm))
            self.experiments[algorithm] = agent._experiments
        agent._experiments = dict(self.experiments[algorithm])
        if base.endswith("-setup"):
            return agent
        honest = wire.decode(protocol.round_(RUN, SESSION, ROUND, _toml(algorithm), EXPECTED, _downlink(algorithm),
                                             [_charge(1)]))
        reply = agent.handle(honest)  # an over-the-air round: the signal; the received signal finishes it
        assert reply is not None
        return agent


NODES = _Node()


def _snapshot(agent: NodeAgent) -> tuple:
    """What the node's ledger of the session holds: totals, privacy tallies, rounds charged."""
    ledger = agent.ledger(RUN, SESSION)
    return (repr(ledger.totals), dict(ledger.privacy), {k: dict(v) for k, v in ledger.by_observer.items()},
            copy.deepcopy(ledger.rounds_logged.intervals), copy.deepcopy(ledger.server_rounds.intervals))


ANSWERS = {protocol.ROUND: {protocol.UPDATE, protocol.REFUSED, protocol.SIGNAL},
           protocol.SETUP: {protocol.SETUP_UPDATE, protocol.REFUSED}, protocol.RECEIVED: {protocol.UPDATE},
           protocol.STOP: {protocol.LEDGER}}


def _check_answer(msg: wire.Message, reply: protocol.Reply | None) -> None:
    """A reply is what ``msg``'s kind asks for, from this node, of its round and session."""
    if reply is None:
        return
    assert msg.kind in ANSWERS, f"a {msg.kind} was answered"
    answer = wire.decode(reply.payload)
    assert answer.kind in ANSWERS[msg.kind] and answer.sender == str(NODE)
    round_index = 0 if msg.kind == protocol.SETUP else msg.round  # a setup is answered as wire round 0
    assert (answer.run, answer.round, protocol.session_of(answer)) == (msg.run, round_index, protocol.session_of(msg))
    assert reply.to == (protocol.CHANNEL if answer.kind == protocol.SIGNAL else protocol.COORDINATOR)


@given(_mutated())
def test_a_mutated_downlink_is_refused_as_one_wire_error_or_answered(case):
    base, algorithm, header, tensors = case
    msg = _decoded(header, tensors)
    if msg is None:
        return  # refused by the transport's own checks: the node never sees it
    agent = NODES.prepared(algorithm, base)
    before = _snapshot(agent)
    try:
        reply = agent.handle(msg)
    except wire.WireError as exc:
        assert "\n" not in str(exc)
        if exc.code != "non_finite":  # else the step ran and its own output was refused: charged, not sent
            assert _snapshot(agent) == before, f"a refused {msg.kind} changed the ledger: {exc}"
        return
    _check_answer(msg, reply)


@given(_mutated())
def test_a_hosts_stacked_step_refuses_a_mutated_copy_for_its_node_alone(case):
    """step_nodes hands each node's refusal back as that node's outcome (the host logs it)."""
    base, algorithm, header, tensors = case
    msg = _decoded(header, tensors)
    if msg is None or msg.kind not in (protocol.ROUND, protocol.SETUP):
        return
    agent = NODES.prepared(algorithm, base)
    before = _snapshot(agent)
    (outcome,) = step_nodes([agent], [msg])
    if isinstance(outcome, Exception):
        assert isinstance(outcome, wire.WireError), repr(outcome)
        if outcome.code != "non_finite":
            assert _snapshot(agent) == before
        return
    _check_answer(msg, outcome)


@pytest.mark.parametrize("base", BASES)
def test_the_honest_message_of_each_base_is_answered(base):
    algorithm, header, tensors = _honest(base)
    msg = _decoded(header, tensors)
    assert msg is not None
    agent = NodeAgent(NODE)
    if base == "dwfl-received":  # the round first: the node waits for what it receives
        agent.handle(wire.decode(protocol.round_(RUN, SESSION, ROUND, _toml("dwfl"), EXPECTED, _downlink("dwfl"))))
    reply = agent.handle(msg)
    _check_answer(msg, reply)
    assert (reply is None) is False  # a stop is answered too: the node's ledger report
    if base == "dp_pasgd-round":
        ledger = agent.ledger(RUN, SESSION)
        assert ledger.has_server_events(1) and ledger.has_round(ROUND)  # the charge taken, the round charged


@given(session=st.text(max_size=80))
def test_a_session_that_is_not_an_id_is_no_session(session):
    """A session names the node's ledger files: one that is not an id (a path, an empty string,
    anything but wire.ID_PATTERN) is no session, so no file is ever made of it."""
    from testbed.mqtt import wire
    from testbed.rounds import protocol

    msg = wire.decode(protocol.prepare("run", session, "", [0]))
    expected = session if wire.ID_PATTERN.fullmatch(session) else None
    assert protocol.session_of(msg) == expected
    assert "/" not in (protocol.session_of(msg) or "") and ".." != protocol.session_of(msg)
