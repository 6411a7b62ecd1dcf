"""The first round's deadline starts once the nodes are ready (issue 27: round 0 straggled while the
hosts still loaded their data and built the model, and its releases were charged but unused).

Before the first round (or the setup) the coordinator sends ``prepare``; each node builds its
experiment and answers ``ready``; the round's deadline starts when every expected node said so or
``mqtt.setup_wait_s`` passed. Here:

- over real brokers, a host whose experiment takes longer to build than a round's deadline: round 0
  no longer straggles and the run equals sim; the control (a setup wait shorter than the build)
  shows the same build does make round 0 straggle, and says so in one line;
- at the coordinator (tests/loopback_coordinator.py: its real receiving path, honest agents), a
  ready that is malformed, of another experiment or session, replayed, early (before the prepare)
  or late (after the wait) moves nothing: the node counts as ready only on its own honest ready in
  time, and the run completes with every node's updates used; Hypothesis searches the same with
  generated mutants and replays of the ready (and tests/test_trust_coordinator.py's property holds
  the ready to its invariants with the other messages).
"""

from __future__ import annotations

import functools
import logging
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loopback_coordinator import LoopbackClient, honest, loopback
from test_mqtt_runtime import _comparable, _config as _runtime_config, _metrics, _sim_twin
from test_trust_coordinator import _config as _trust_config, _mutant
from testbed.assembly import assemble
from testbed.assembly.config import replace, to_toml
from testbed.mqtt import wire
from testbed.orchestration.coordinator import MqttNodes
from testbed.orchestration.runner import load, run_experiment
from testbed.rounds import protocol
from testbed.streams.node_secret import RANDOMNESS

#: The tests patch node code, which reaches emulated hosts only when they are forked (conftest).
pytestmark = pytest.mark.usefixtures("forked_hosts")

NODES = list(range(5))  # test_trust_coordinator's experiments
NOT_READY = "not ready within"


def _slow_build(monkeypatch, delay_s: float) -> None:
    """Every emulated host's first build of the experiment takes ``delay_s`` longer (the hosts are
    forked from this process: they inherit the patch)."""
    from nodes.shared_experiment import SharedExperiment

    built = SharedExperiment._built_for

    def slow(self, key, config):
        if key not in self._built:
            time.sleep(delay_s)
        return built(self, key, config)

    monkeypatch.setattr(SharedExperiment, "_built_for", slow)


def _mqtt_config(broker_url: str, setup_wait_s: float):
    return _runtime_config(mqtt={"broker_url": broker_url, "hosts": 2, "round_timeout_s": 2.0,
                                 "setup_wait_s": setup_wait_s})


def test_a_slow_build_no_longer_makes_round_0_straggle(broker, tmp_path, monkeypatch, caplog):
    """Each host takes 3 s more than usual to build its experiment, past round 0's 2 s deadline:
    the coordinator waits for the nodes' ready, no round straggles, and the run is sim's."""
    _slow_build(monkeypatch, 3.0)
    config = _mqtt_config(broker.url, 60.0)
    with caplog.at_level(logging.INFO, logger="testbed.orchestration.coordinator"):
        mq = run_experiment(config, out_dir=tmp_path / "mqtt", quiet=True)
    assert mq.summary["status"] == "completed"
    assert [int(row["stragglers"]) for row in _metrics(mq.run_dir)] == [0] * mq.summary["rounds"]
    assert NOT_READY not in caplog.text and "node(s) ready in" in caplog.text
    sim = _sim_twin(config, tmp_path)
    np.testing.assert_allclose(np.load(mq.run_dir / "final_params.npy"), np.load(sim.run_dir / "final_params.npy"),
                               atol=1e-6)
    assert _comparable(mq.run_dir) == _comparable(sim.run_dir)


def test_control_a_short_setup_wait_lets_the_slow_build_straggle(mosquitto_broker, tmp_path, monkeypatch, caplog):
    """The control of the test above: with a setup wait shorter than the build, the same hosts miss
    round 0 (every node straggles) and the one line says which nodes were not ready."""
    _slow_build(monkeypatch, 3.0)
    with caplog.at_level(logging.WARNING, logger="testbed.orchestration.coordinator"):
        mq = run_experiment(_mqtt_config(mosquitto_broker.url, 0.2), out_dir=tmp_path / "mqtt", quiet=True)
    assert mq.summary["status"] == "completed"
    assert int(_metrics(mq.run_dir)[0]["stragglers"]) == 4
    lines = [r.getMessage() for r in caplog.records if NOT_READY in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("4 of 4 node(s)"), lines


# --------------------------------------------------------------------- the ready at the coordinator


def _loopback_run(monkeypatch, tmp_path, caplog, tamper, *, before_prepare: list | None = None):
    """A whole DP-PASGD run over the loopback coordinator (setup wait 0.3 s); ``before_prepare``:
    functions of the coordinator's client called once it connected, before anything is sent."""
    config = replace(_trust_config("dp_pasgd"), mqtt={"setup_wait_s": 0.3})
    if before_prepare:
        connect = LoopbackClient.connect

        def connected(self, *args, **kwargs):
            out = connect(self, *args, **kwargs)
            for inject in before_prepare:
                inject(self)
            return out

        monkeypatch.setattr(LoopbackClient, "connect", connected)
    with caplog.at_level(logging.INFO), loopback(monkeypatch, NODES, tamper):
        result = run_experiment(config, out_dir=tmp_path / "r", quiet=True)
    assert result.summary["status"] == "completed", result.summary.get("failure")
    assert all(node["rounds_straggled"] == 0 for node in result.summary["nodes"].values())
    return result


def _not_ready(caplog) -> str:
    lines = [r.getMessage() for r in caplog.records if NOT_READY in r.getMessage()]
    assert len(lines) <= 1, lines
    return lines[0] if lines else ""


def _ready_header(msg: wire.Message) -> dict:
    return {"run": msg.run, "round": msg.round, "sender": msg.sender, "kind": msg.kind, "meta": dict(msg.meta)}


MALFORMED = {
    "another experiment": lambda h: h["meta"].update(experiment="0" * 64),
    "an experiment that is no hash": lambda h: h["meta"].update(experiment="x" * 300),
    "an undeclared field": lambda h: h["meta"].update(extra=1),
    "round 1": lambda h: h.update(round=1),
    "another kind": lambda h: h.update(kind=protocol.LEDGER),
}


@pytest.mark.parametrize("fault", sorted(MALFORMED))
@pytest.mark.parametrize("honest_after", [False, True], ids=["alone", "then_honest"])
def test_a_malformed_ready_counts_for_nothing(fault, honest_after, monkeypatch, tmp_path, caplog):
    """Node 2's ready is replaced by a malformed one (alone: the node is not ready, the wait ends
    by its bound and the one line names it; then the honest one: the node is ready)."""

    def tamper(node, msg, reply):
        if node != 2 or msg.kind != protocol.PREPARE:
            return [(reply, 0)]
        header = _ready_header(wire.decode(reply))
        MALFORMED[fault](header)
        return [(wire.encode(header), 0)] + ([(reply, 0)] if honest_after else [])

    _loopback_run(monkeypatch, tmp_path, caplog, tamper)
    line = _not_ready(caplog)
    assert (line == "") is honest_after, line
    if not honest_after:
        assert line.startswith("1 of 5 node(s)") and ": 2;" in line
    assert "rejected" in caplog.text  # logged where it was refused (the admit, or the ready's check)


@pytest.mark.parametrize("delivery", ["twice", "late1", "late2", "lost"])
def test_a_replayed_or_late_ready_moves_nothing(delivery, monkeypatch, tmp_path, caplog):
    """Node 4's honest ready sent twice (the second is a replay: dropped), or only after the wait
    ended (with the setup or the first round, or the one after: dropped, the node was not ready
    when the first round began), or never."""

    def tamper(node, msg, reply):
        if node != 4 or msg.kind != protocol.PREPARE:
            return [(reply, 0)]
        return {"twice": [(reply, 0), (reply, 0)], "late1": [(reply, 1)], "late2": [(reply, 2)], "lost": []}[delivery]

    _loopback_run(monkeypatch, tmp_path, caplog, tamper)
    line = _not_ready(caplog)
    assert (line == "") is (delivery == "twice"), line
    if delivery == "twice":
        assert "duplicate" in caplog.text or "replay" in caplog.text
    else:
        assert ": 4;" in line
    if delivery.startswith("late"):
        assert "dropped the ready of node 4" in caplog.text


@pytest.mark.parametrize("session", ["own", "foreign"])
def test_an_early_or_foreign_ready_is_refused_before_it_moves_anything(session, monkeypatch, tmp_path, caplog):
    """A well-formed ready of node 1 arrives before the prepare was sent (with the coordinator's own
    session, or another one): refused by the coordinator's admit, it moves no replay window and
    no readiness; node 1's own ready, after the prepare, makes it ready."""

    def early(client):
        coordinator = client._admit.__self__  # the MqttNodes whose admit the client calls
        own = coordinator.session if session == "own" else "f" * 16
        client.take_sealed(f"tb/v1/{client.run}/up/1", protocol.ready(client.run, own, 1, coordinator._experiment_key))

    _loopback_run(monkeypatch, tmp_path, caplog, honest, before_prepare=[early])
    assert _not_ready(caplog) == ""
    refusals = [r.getMessage() for r in caplog.records if "rejected message from 1" in r.getMessage()]
    assert len(refusals) == 1 and ("not sent yet" in refusals[0]) is (session == "own"), refusals


# --------------------------------------------------------------- the ready, searched by Hypothesis


@functools.cache
def _prepared_parts():
    """What a coordinator is built from (the DP-PASGD experiment of the loopback tests), once."""
    config = replace(_trust_config("dp_pasgd"), mqtt={"setup_wait_s": 0.05})
    data, model = load(config)
    return config, assemble.build_algorithm(config, model, data)


@settings(max_examples=25)  # a coordinator built per example: ~0.25 s each
@given(data=st.data())
def test_a_node_is_ready_only_on_a_well_formed_ready_of_its_own(data, monkeypatch):
    """Node 2's answer to the prepare is replaced by 1-3 deliveries, each its honest ready or a
    mutant of it (any field, type, round, kind; cut or flipped bytes; test_trust_coordinator's
    mutations), or a copy of an earlier one (a replay). Whatever they are, nothing escapes the
    coordinator, the other nodes are ready, and node 2 is ready exactly when one of them is a
    ready of this session, round 0, naming this experiment and nothing else but its randomness."""
    config, algorithm = _prepared_parts()
    deliveries: list[bytes] = []

    def tamper(node, msg, reply):
        if node != 2 or msg.kind != protocol.PREPARE:
            return [(reply, 0)]
        for _ in range(data.draw(st.integers(1, 3), label="deliveries")):
            how = data.draw(st.sampled_from(["honest", "mutant", "replay"]), label="how")
            if how == "replay" and deliveries:
                deliveries.append(data.draw(st.sampled_from(deliveries), label="replayed"))
            else:
                deliveries.append(reply if how == "honest" else _mutant(data, reply))
        return [(d, 0) for d in deliveries]

    with loopback(monkeypatch, NODES, tamper):
        nodes = MqttNodes(config.mqtt, config.nodes, to_toml(config), NODES, algorithm, seed=config.run.seed,
                          quiet=True)
        try:
            assert nodes._live(frozenset()) == tuple(NODES)
            ready, session, key = set(nodes._ready), nodes.session, nodes._experiment_key
        finally:
            nodes.close("completed")

    def well_formed(payload: bytes) -> bool:
        try:
            msg = wire.decode(payload)
        except wire.WireError:
            return False
        own = {"session": session, "experiment": key}  # and which randomness, if it says
        return (msg.kind, msg.round, msg.sender) == (protocol.READY, 0, "2") and \
            msg.meta in (own, *({**own, "randomness": kind} for kind in RANDOMNESS))

    assert ready - {2} == set(NODES) - {2}
    assert (2 in ready) is any(well_formed(d) for d in deliveries)
