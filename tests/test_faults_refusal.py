"""One node's budget refusal ends its own part, not everyone's run (issue 27: the runner stopped the
whole run on one node's word).

A node that refuses a round for its budget is taken out of the later rounds: asked nothing, so it
releases and is charged nothing more (each later round logs it as a "withdrawn" straggle); its
refusal, with the figures it gave, is in summary.json's ``refusals``; the others go on. The run
stops ("stopped_budget", ``stopped`` the last refusal) only when no node is left, or on the
coordinator's own ledger as before.

In sim (a wrapper of the in-process nodes makes node 2 refuse) for every algorithm (a withdrawn node
is a straggler of every later round: DP-PASGD, FedAvg and PADPFL aggregate the others; DWFL's other
nodes exchange among themselves and node 2 keeps its model; ACFL's coded setup upload stands in for
its gradient, as for any straggler), and over MQTT on both brokers (node 2's own agent refuses, in
the emulated hosts), with the refusal in the first, a middle and the last round.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from test_algorithm_contract import _text
from testbed.assembly.config import load_config_text, replace
from testbed.ledger.files import read_ledger
from testbed.orchestration import runner
from testbed.orchestration.runner import run_experiment
from testbed.rounds import protocol

#: The tests patch node code, which reaches emulated hosts only when they are forked (conftest).
pytestmark = pytest.mark.usefixtures("forked_hosts")

ROUNDS = 6  # every experiment of tests/test_algorithm_contract.py
WHEN = {"first": 0, "middle": 3, "last": ROUNDS - 1}
REFUSER = 2
FIGURES = ("epsilon", 9.0, 1.0)  # budget, would_be, limit: what the refusing node says


class RefusingNodes:
    """The run's in-process nodes, of which node ``n`` refuses round ``refusals[n]`` (it is not
    stepped: it releases nothing) with :data:`FIGURES`."""

    def __init__(self, inner, refusals: dict[int, int]):
        self.inner, self.refusals = inner, refusals

    @property
    def session(self):
        return self.inner.session

    def setup(self, state, asking=None):
        return self.inner.setup(state, asking)

    def round(self, state, round_index, excluded, sampled=None, meanwhile=None, asking=None):
        now = {n for n, at in self.refusals.items() if at == round_index and n not in excluded}
        outcome = self.inner.round(state, round_index, excluded | now, sampled, meanwhile, asking)
        return dataclasses.replace(outcome, straggled={n: why for n, why in outcome.straggled.items() if n not in now},
                                   refused=tuple((n, *FIGURES) for n in sorted(now)))

    def planned_release(self, node, ctx):
        return self.inner.planned_release(node, ctx)

    def deliver(self, events):
        self.inner.deliver(events)

    def close(self, status):
        return self.inner.close(status)


def _sim(monkeypatch, tmp_path, name: str, refusals: dict[int, int]):
    build = runner.build_nodes
    monkeypatch.setattr(runner, "build_nodes", lambda *a, **k: RefusingNodes(build(*a, **k), refusals))
    return run_experiment(load_config_text(_text(name)), out_dir=tmp_path / "sim", quiet=True)


def _check_withdrawn(result, refused_at: int) -> None:
    """Node REFUSER answered every round before ``refused_at``, nothing from then on (a "withdrawn"
    straggle each round after it); the others answered every round; the refusal is in the summary."""
    summary = result.summary
    assert summary["status"] == "completed" and summary["rounds"] == ROUNDS, summary.get("failure")
    assert summary["stopped"] is None
    assert summary["refusals"] == [dict(zip(("node", "round", "budget", "would_be", "limit"),
                                            (REFUSER, refused_at, *FIGURES)))]
    events = list(read_ledger(result.run_dir / "ledger.csv"))
    mine = [e for e in events if e.node == REFUSER]
    assert {e.round for e in mine if e.kind != "straggle" and getattr(e, "issuer", "node") == "node"} \
        == set(range(refused_at)) | ({-1} if any(e.round == -1 for e in mine) else set())
    assert sorted((e.round, e.reason) for e in mine if e.kind == "straggle") == \
        [(r, "withdrawn") for r in range(refused_at + 1, ROUNDS)]
    assert summary["nodes"][str(REFUSER)]["rounds_straggled"] == ROUNDS - refused_at - 1
    assert [n for n, entry in summary["nodes"].items() if n != str(REFUSER) and entry["rounds_straggled"]] == []


@pytest.mark.parametrize("when", sorted(WHEN))
@pytest.mark.parametrize("name", ["dp_pasgd", "fedavg", "dwfl", "acfl", "padpfl"])
def test_in_sim_a_refusing_node_is_taken_out_and_the_run_goes_on(name, when, monkeypatch, tmp_path):
    _check_withdrawn(_sim(monkeypatch, tmp_path, name, {REFUSER: WHEN[when]}), WHEN[when])


def test_the_run_stops_when_no_node_is_left(monkeypatch, tmp_path):
    """Node i refuses round i: after round 4 nobody is left; the last refusal is the stop."""
    result = _sim(monkeypatch, tmp_path, "dp_pasgd", {n: n for n in range(5)})
    summary = result.summary
    assert (summary["status"], summary["rounds"]) == ("stopped_budget", 4)
    assert summary["stopped"] == {"node": 4, "budget": FIGURES[0], "would_be": FIGURES[1], "limit": FIGURES[2]}
    assert [(r["node"], r["round"]) for r in summary["refusals"]] == [(n, n) for n in range(5)]


def _refusing_agents(monkeypatch, refused_at: int) -> None:
    """Node REFUSER's own agent refuses round ``refused_at`` with FIGURES (the emulated hosts are forked
    from this process: they inherit the patch); it releases and logs nothing for it."""
    from nodes.agent import NodeAgent

    admit = NodeAgent._admit

    def refusing(self, msg):
        if self.node == REFUSER and msg.kind == protocol.ROUND and msg.round == refused_at:
            return protocol.Reply(protocol.COORDINATOR, protocol.refused(
                msg.run, protocol.session_of(msg), msg.round, self.node, *FIGURES))
        return admit(self, msg)

    monkeypatch.setattr(NodeAgent, "_admit", refusing)


@pytest.mark.parametrize("when", sorted(WHEN))
def test_over_mqtt_a_refusing_node_is_taken_out_as_in_sim(when, broker, monkeypatch, tmp_path):
    """DP-PASGD over each broker: the same run as sim's with the same refusal (model and every
    node's figures), and the refusing node confirms its ledger at the stop."""
    _refusing_agents(monkeypatch, WHEN[when])
    config = replace(load_config_text(_text("dp_pasgd")), run={"mode": "mqtt"},
                     mqtt={"broker_url": broker.url, "hosts": 2})
    mq = run_experiment(config, out_dir=tmp_path / "mqtt", quiet=True)
    _check_withdrawn(mq, WHEN[when])
    assert {entry["ledger_check"] for entry in mq.summary["nodes"].values()} == {"confirmed"}
    sim = _sim(monkeypatch, tmp_path, "dp_pasgd", {REFUSER: WHEN[when]})
    np.testing.assert_allclose(np.load(mq.run_dir / "final_params.npy"), np.load(sim.run_dir / "final_params.npy"),
                               atol=1e-9)
    for node, entry in sim.summary["nodes"].items():
        for figure in ("epsilon", "rounds", "rounds_straggled", "bytes_up", "bytes_down", "local_steps"):
            assert mq.summary["nodes"][node][figure] == pytest.approx(entry[figure]), (node, figure)


@pytest.mark.parametrize("when", sorted(WHEN))
def test_over_the_air_a_refusing_node_is_taken_out(when, mosquitto_broker, monkeypatch, tmp_path):
    """DWFL over MQTT with its channel emulator: the other four exchange on; the refusing node is
    announced to the channel no more, and in the round it refused the channel stops waiting for its
    signal at once (the coordinator withdraws it): the run takes far less than that round's signal
    deadline (0.8 of a 300 s round timeout) would."""
    _refusing_agents(monkeypatch, WHEN[when])
    config = replace(load_config_text(_text("dwfl")), run={"mode": "mqtt"},
                     mqtt={"broker_url": mosquitto_broker.url, "hosts": 2, "round_timeout_s": 300.0})
    mq = run_experiment(config, out_dir=tmp_path / "mqtt", quiet=True)
    _check_withdrawn(mq, WHEN[when])
    assert mq.summary["wall_s"] < 0.8 * 300.0 / 2, mq.summary["wall_s"]
    assert {entry["ledger_check"] for entry in mq.summary["nodes"].values()} == {"confirmed"}
