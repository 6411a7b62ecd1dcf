"""At most one release per (node, round, session), by construction (issue 39): the node's own
write-ahead ledger gates its step. A second ask of a round it released in the session (a duplicate,
a replay, a forgery carrying another model, a coordinator asking again) gets the same reply bytes
again, or nothing once the node restarted; never a second computation, whose noise, drawn from
the round's stream, would be the first one's and cancel out of their difference. Every release is
in the node's ledger file before it is sent. Across sessions (a resumed coordinator) a round is
computed again only on the input it was released on (nodes.release_record): the same release."""

from __future__ import annotations

import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
from hypothesis import given, settings, strategies as st

import nodes.agent as agent_module
from nodes.agent import NodeAgent, step_nodes
from nodes.shared_experiment import SharedExperiment
from testbed.assembly.config import load_config_text, to_toml
from testbed.ledger.events import GaussianEvent
from testbed.ledger.fields import event_from_dict
from testbed.ledger.files import read_ledger
from testbed.mqtt import wire
from testbed.rounds import protocol

RUN = "r"
SESSIONS = ("a" * 16, "b" * 16)
DP_PASGD = to_toml(load_config_text("[data]\nnum_nodes = 2\nsamples_per_node = 40\ndim = 3\n"
                                    "[dp_pasgd]\nsteps = 8\ntau = 2\nbatch = 4\nsigma = 1.0\n"))
ACFL = to_toml(load_config_text(
    '[run]\nalgorithm = "acfl"\nseed = 3\n[data]\ndataset = "regression"\nnum_nodes = 2\nsamples_per_node = 20\n'
    'dim = 3\noutputs = 2\n[model]\nkind = "linear"\nbias = false\n[acfl]\niterations = 4\n'))
SETUP = -1


def _ask(config: str, session: str, round_index: int, variant: int) -> wire.Message:
    """Round ``round_index`` (SETUP: the setup) of ``session``; ``variant`` > 0 is a forgery of it
    carrying another model."""
    if round_index == SETUP:
        return wire.decode(protocol.setup(RUN, session, config, [0, 1]))
    if config == ACFL:
        tensors = {"W": np.full((3, 2), 0.1 * variant)}
    else:
        tensors = {"model": np.full(8, 0.1 * variant)}
    return wire.decode(protocol.round_(RUN, session, round_index, config, [0, 1], tensors))


def _privacy_rows(path: Path, round_index: int) -> int:
    return sum(1 for e in read_ledger(path) if isinstance(e, GaussianEvent) and e.round == round_index) \
        if path.exists() else 0


#: One message of the sequence: (session, round or SETUP, variant); several gathered together
#: (a host steps what arrived together, nodes.agent.step_nodes); or "restart" (the node process
#: killed and started again on its state directory).
ASK = st.tuples(st.sampled_from(SESSIONS), st.integers(SETUP, 3), st.integers(0, 2))
#: What a host gathers together is of one session (nodes.round_fence drops an older one's).
TOGETHER = st.tuples(st.sampled_from(SESSIONS), st.lists(st.tuples(st.integers(SETUP, 3), st.integers(0, 2)),
                                                         min_size=2, max_size=3)).map(
    lambda t: [(t[0], r, v) for r, v in t[1]])
ACTIONS = st.one_of(st.just("restart"), ASK, TOGETHER)


@settings(max_examples=60, deadline=None)
@given(actions=st.lists(ACTIONS, min_size=1, max_size=25), acfl=st.booleans())
def test_any_sequence_of_asks_computes_each_round_once_per_session_and_logs_it_before_sending(actions, acfl):
    config = ACFL if acfl else DP_PASGD
    with tempfile.TemporaryDirectory() as tmp, _counting_steps() as computed:
        state_dir = Path(tmp)
        agent = NodeAgent(1, state_dir=state_dir)
        first_reply: dict[tuple[str, int], bytes] = {}
        released: dict[int, bytes] = {}  # round → the tensors of its release, in any session
        for action in actions:
            if action == "restart":
                agent.close()
                agent = NodeAgent(1, state_dir=state_dir)
                continue
            asks = [a for a in (action if isinstance(action, list) else [action]) if acfl or a[1] != SETUP]
            # (DP-PASGD has no setup: a setup for it is a bad message, tested elsewhere.)
            if not asks:
                continue
            outcomes = step_nodes([agent] * len(asks), [_ask(config, *a) for a in asks]) if isinstance(action, list) \
                else [agent.handle(_ask(config, *asks[0]))]
            for (session, r, _), reply in zip(asks, outcomes):
                assert not isinstance(reply, Exception), reply
                assert computed[session, r] <= 1, f"round {r} of session {session[:1]} computed twice"
                _check_reply(agent, state_dir, first_reply, session, r, reply, acfl)
                if reply is not None and wire.decode(reply.payload).kind != protocol.REFUSED:
                    assert released.setdefault(r, _tensor_bytes(reply)) == _tensor_bytes(reply), \
                        f"round {r} released two different values across sessions"
        agent.close()
    for r, inputs in computed.inputs.items():
        assert len(inputs) == 1, f"round {r} computed on {len(inputs)} different inputs across sessions"


def _tensor_bytes(reply) -> bytes:
    """What a reply releases: its tensors' bytes (its events' measured seconds differ by session)."""
    tensors = wire.decode(reply.payload).tensors
    return b"".join(name.encode() + np.ascontiguousarray(tensors[name]).tobytes() for name in sorted(tensors))


def _check_reply(agent: NodeAgent, state_dir: Path, first_reply: dict, session: str, r: int, reply, acfl: bool) -> None:
    """Any reply for (session, round) is the first one, byte for byte, logged on disk before it was sent, once."""
    if reply is None:
        return
    payload = wire.decode(reply.payload)
    if payload.kind == protocol.REFUSED:
        return
    assert first_reply.setdefault((session, r), reply.payload) == reply.payload
    path = state_dir / f"ledger-{RUN}-{session}-node1.csv"
    assert agent.ledger(RUN, session).has_round(r)
    if not acfl or r != SETUP:  # ACFL's setup is mutual-information DP, its rounds' privacy rows
        assert _privacy_rows(path, r) == sum(isinstance(e, GaussianEvent)
                                             for e in (event_from_dict(e) for e in payload.meta["events"]))


class _counting_steps:
    """Within: (session, round) → how many times a node computed it (nodes.agent._step_together);
    patched by hand, not by pytest's monkeypatch, which Hypothesis would share between examples."""

    def __enter__(self) -> Counter:
        self.computed: Counter = Counter()
        self.computed.inputs = {}  # round → the input digests it was computed on, in any session
        self.original = agent_module._step_together
        computed, original = self.computed, self.original

        def counted(agents, admitted):
            for a in admitted:
                computed[a.session, a.ctx.round_index] += 1
                computed.inputs.setdefault(a.ctx.round_index, set()).add(a.digest)
            return original(agents, admitted)

        agent_module._step_together = counted
        return self.computed

    def __exit__(self, *exc) -> None:
        agent_module._step_together = self.original


def test_a_forged_second_ask_gets_the_first_reply_and_no_second_draw():
    with _counting_steps() as computed:
        agent = NodeAgent(1)
        first = agent.handle(_ask(DP_PASGD, SESSIONS[0], 2, 0))
        again = agent.handle(_ask(DP_PASGD, SESSIONS[0], 2, 1))  # another model: a forgery or a replay
    assert first is not None and again is not None and again.payload == first.payload
    assert computed == Counter({(SESSIONS[0], 2): 1})
    logged = agent.ledger(RUN, SESSIONS[0])
    assert sum(logged.privacy.values()) == sum(e.count for e in _events(first) if isinstance(e, GaussianEvent))


def test_a_restarted_node_answers_nothing_for_a_round_its_ledger_holds(tmp_path):
    with _counting_steps() as computed:
        agent = NodeAgent(1, state_dir=tmp_path)
        assert agent.handle(_ask(DP_PASGD, SESSIONS[0], 0, 0)) is not None
        agent.close()  # killed after logging (the file is on disk), before or after sending
        restarted = NodeAgent(1, state_dir=tmp_path)
        assert restarted.handle(_ask(DP_PASGD, SESSIONS[0], 0, 0)) is None
        assert restarted.handle(_ask(DP_PASGD, SESSIONS[0], 1, 0)) is not None  # the next round goes on
    assert computed == Counter({(SESSIONS[0], 0): 1, (SESSIONS[0], 1): 1})


def test_a_resumed_coordinators_new_session_gets_a_fresh_release_logged_under_it(tmp_path):
    """A resumed coordinator re-runs a round under a new session: a release of that session,
    computed and logged (and so charged) there."""
    with _counting_steps() as computed:
        agent = NodeAgent(1, state_dir=tmp_path)
        agent.handle(_ask(DP_PASGD, SESSIONS[0], 0, 0))
        agent.handle(_ask(DP_PASGD, SESSIONS[1], 0, 0))
    assert computed == Counter({(SESSIONS[0], 0): 1, (SESSIONS[1], 0): 1})
    for session in SESSIONS:
        assert _privacy_rows(tmp_path / f"ledger-{RUN}-{session}-node1.csv", 0) == 1


def _events(reply) -> list:
    return [event_from_dict(e) for e in wire.decode(reply.payload).meta["events"]]


DWFL = to_toml(load_config_text(
    '[run]\nalgorithm = "dwfl"\nseed = 5\n[data]\nnum_nodes = 2\nsamples_per_node = 30\ndim = 3\n'
    '[dwfl]\nrounds = 4\nbatch = 4\nlr = 0.3\nepsilon = 0.5\nfading = "none"\ncoherence_rounds = 1\nc_scale = 0.7\n'
    '[privacy]\ndelta = 1e-5\n'))


def test_over_the_air_a_second_ask_gets_the_same_signal_and_a_second_received_the_same_update():
    """An over-the-air round takes two messages (the round: the transmit signal; what the node
    received: its update): asked again at either, the node sends what it sent, computing nothing."""
    with _counting_steps() as computed:
        agent = NodeAgent(1)
        alg = agent._experiment(DWFL).algorithm
        downlink = {k: np.full(s.shape, 0.1 + 0.05j if s.dtype == "complex128" else 0.1)
                    for k, s in alg.downlink_spec().items()}

        def ask(model: float) -> wire.Message:
            tensors = {k: v * model for k, v in downlink.items()}
            return wire.decode(protocol.round_(RUN, SESSIONS[0], 1, DWFL, [0, 1], tensors))

        signal = agent.handle(ask(1.0))
        assert signal is not None and signal.to == protocol.CHANNEL
        assert agent.handle(ask(2.0)).payload == signal.payload  # a forged second round: the same signal
        heard = np.full(alg.channel.signal_spec().shape, 0.01)
        received = wire.decode(protocol.received(RUN, SESSIONS[0], 1, [0, 1], heard))
        update = agent.handle(received)
        assert update is not None and update.to == protocol.COORDINATOR
        again = wire.decode(protocol.received(RUN, SESSIONS[0], 1, [0, 1], heard * 3))
        assert agent.handle(again).payload == update.payload
        assert agent.handle(ask(1.0)).payload == signal.payload
    assert computed == Counter({(SESSIONS[0], 1): 1})


def test_two_copies_of_a_round_gathered_together_step_once_and_get_the_same_reply():
    """A host gathers what arrived together and steps it at once (nodes.agent.step_nodes): a
    duplicate beside the first copy is admitted before the first is logged, and gets its reply."""
    with _counting_steps() as computed:
        shared = SharedExperiment([0, 1])
        agent, other = NodeAgent(1, shared=shared), NodeAgent(0, shared=shared)
        ask = _ask(DP_PASGD, SESSIONS[0], 2, 0)
        forged = _ask(DP_PASGD, SESSIONS[0], 2, 1)
        outcomes = step_nodes([agent, other, agent], [ask, ask, forged])
    assert computed == Counter({(SESSIONS[0], 2): 2})  # node 1 once, node 0 once
    assert outcomes[0].payload == outcomes[2].payload != outcomes[1].payload


def _resume_as_the_server(agent: NodeAgent, caplog) -> None:
    """The server resumes round 2 under a new session: on another model it gets nothing (and the
    node says why); on the model the round was released on, the same release again."""
    first = agent.handle(_ask(DP_PASGD, SESSIONS[0], 2, 0))
    assert first is not None
    with caplog.at_level("WARNING", logger="nodes.release_record"):
        assert agent.handle(_ask(DP_PASGD, SESSIONS[1], 2, 1)) is None
    assert [r.levelname for r in caplog.records if "a different model than the one released on" in r.message] \
        == ["WARNING"]
    assert "round 2" in caplog.records[-1].message
    again = agent.handle(_ask(DP_PASGD, SESSIONS[1], 2, 0))
    assert again is not None and _tensor_bytes(again) == _tensor_bytes(first)


def test_a_server_resuming_with_another_model_gets_nothing_and_with_the_same_model_the_same_release(tmp_path, caplog):
    with _counting_steps() as computed:
        agent = NodeAgent(1, state_dir=tmp_path)
        _resume_as_the_server(agent, caplog)
        agent.close()
        # The record is on disk before the release: the node restarted still refuses another model.
        restarted = NodeAgent(1, state_dir=tmp_path)
        assert restarted.handle(_ask(DP_PASGD, "c" * 16, 2, 2)) is None
        assert restarted.releases.refused == 1
        restarted.close()
    assert computed.inputs.keys() == {2} and len(computed.inputs[2]) == 1
    [record] = tmp_path.glob(f"releases-{RUN}-*-node1.txt")  # the run's experiment's record (nodes.agent._scope)
    assert record.read_text().count("\n") == 1


def test_a_node_without_a_state_directory_keeps_the_record_for_its_process(caplog):
    agent = NodeAgent(1)
    _resume_as_the_server(agent, caplog)
    assert agent.releases.refused == 1


def test_a_record_cut_by_a_kill_leaves_the_cut_line_out_and_a_damaged_one_releases_nothing(tmp_path):
    agent = NodeAgent(1, state_dir=tmp_path)
    assert agent.handle(_ask(DP_PASGD, SESSIONS[0], 0, 0)) is not None
    agent.close()
    [path] = tmp_path.glob(f"releases-{RUN}-*-node1.txt")
    with path.open("a") as f:
        f.write("round 1 abc")  # killed while recording round 1: never released
    restarted = NodeAgent(1, state_dir=tmp_path)
    assert restarted.handle(_ask(DP_PASGD, SESSIONS[1], 1, 2)) is not None
    restarted.close()
    path.write_text("round 0 not-a-digest\n")
    damaged = NodeAgent(1, state_dir=tmp_path)
    assert damaged.handle(_ask(DP_PASGD, "c" * 16, 3, 0)) is None
    damaged.close()


def test_over_the_air_a_resumed_session_gets_its_update_only_on_the_signal_it_was_released_on():
    agent = NodeAgent(1)
    alg = agent._experiment(DWFL).algorithm
    downlink = {k: np.full(s.shape, 0.1 + 0.05j if s.dtype == "complex128" else 0.1)
                for k, s in alg.downlink_spec().items()}
    heard = np.full(alg.channel.signal_spec().shape, 0.01)
    updates = {}
    for session, scale in ((SESSIONS[0], 1.0), (SESSIONS[1], 3.0), (SESSIONS[1], 1.0)):
        signal = agent.handle(wire.decode(protocol.round_(RUN, session, 1, DWFL, [0, 1], downlink)))
        assert signal is not None and signal.to == protocol.CHANNEL
        update = agent.handle(wire.decode(protocol.received(RUN, session, 1, [0, 1], heard * scale)))
        updates[session, scale] = None if update is None else _tensor_bytes(update)
    assert updates[SESSIONS[1], 3.0] is None  # another signal heard: its update would share the noise
    assert updates[SESSIONS[1], 1.0] == updates[SESSIONS[0], 1.0]
