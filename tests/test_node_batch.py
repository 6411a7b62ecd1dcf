"""An emulated host's stacked step (nodes.agent.step_nodes): the nodes whose round arrived step
at once, each still checking its own message, logging its own events and answering on its own."""

from __future__ import annotations

import numpy as np

from nodes.agent import NodeAgent, step_nodes
from nodes.shared_experiment import SharedExperiment
from nodes.costs import NodeCosts
from testbed.assembly.config import load_config_text, to_toml
from testbed.ledger.fields import MEASURED_FIELDS
from testbed.mqtt import wire
from testbed.rounds import protocol

CONFIG = to_toml(load_config_text(
    '[run]\nalgorithm = "acfl"\nseed = 3\n[data]\ndataset = "regression"\nnum_nodes = 4\nsamples_per_node = 20\n'
    'dim = 3\noutputs = 2\n[model]\nkind = "linear"\nbias = false\n[acfl]\niterations = 5\n'))
W = np.arange(6, dtype=np.float64).reshape(3, 2) / 10


def _host(nodes: list[int]) -> list[NodeAgent]:
    """The nodes of one emulated host: one shared experiment, one costs (nodes.host.serve)."""
    shared, costs = SharedExperiment(nodes), NodeCosts()
    return [NodeAgent(n, shared=shared, costs=costs) for n in nodes]


def _round(expected: list[int], w: np.ndarray = W) -> wire.Message:
    return wire.decode(protocol.round_("r", "s", 2, CONFIG, expected, {"W": w}))


def _gradient(reply: protocol.Reply) -> np.ndarray:
    return wire.decode(reply.payload).tensors["gradient"]


def _counting(monkeypatch, method: str) -> list[list[int]]:
    """The node ids of each call of SharedExperiment.``method`` (a stacked step)."""
    calls: list[list[int]] = []
    original = getattr(SharedExperiment, method)

    def counted(self, *args):
        calls.append(list(args[-2]))
        return original(self, *args)

    monkeypatch.setattr(SharedExperiment, method, counted)
    return calls


def test_stacked_replies_equal_one_node_at_a_time_and_each_node_logs_its_own(monkeypatch):
    msg = _round([0, 1, 3])  # node 2 is an emulated straggler this round: no reply, nothing logged
    steps = _counting(monkeypatch, "step")
    together = step_nodes(_host([0, 1, 2, 3]), [msg] * 4)
    assert steps == [[0, 1, 3]]  # one step for the three
    assert together[2] is None
    for node in (0, 1, 3):
        alone = NodeAgent(node).handle(msg)
        assert alone is not None
        reply = together[node]
        assert isinstance(reply, protocol.Reply) and reply.to == protocol.COORDINATOR
        np.testing.assert_array_equal(_gradient(reply), _gradient(alone))
        assert wire.decode(reply.payload).sender == str(node)


def test_a_node_whose_copy_fails_its_check_straggles_alone():
    agents = _host([0, 1, 2])
    bad = _round([0, 1, 2], np.zeros((3, 3)))  # not the declared (3, 2)
    outcomes = step_nodes(agents, [_round([0, 1, 2]), bad, _round([0, 1, 2])])
    assert isinstance(outcomes[1], wire.WireError) and "downlink" in str(outcomes[1])
    assert all(isinstance(outcomes[i], protocol.Reply) for i in (0, 2))
    assert not agents[1].ledger("r", "s").has_round(2) and agents[0].ledger("r", "s").has_round(2)


def test_one_broadcast_is_checked_once_for_a_hosts_nodes_and_refused_for_each(monkeypatch):
    import nodes.agent as agent_module

    checked = []
    check = agent_module.check_tensors
    monkeypatch.setattr(agent_module, "check_tensors", lambda *a: checked.append(a) or check(*a))
    agents = _host([0, 1, 2])
    msg = _round([0, 1, 2])
    assert all(isinstance(o, protocol.Reply) for o in step_nodes(agents, [msg] * 3))
    assert len(checked) == 1  # the same message object: one check, whatever the number of nodes
    bad = _round([0, 1, 2], np.zeros((3, 3)))
    assert all(isinstance(o, wire.WireError) and "downlink" in str(o) for o in step_nodes(agents, [bad] * 3))
    assert len(checked) == 2
    step_nodes(agents, [_round([0, 1, 2])] * 3)  # another message, equal or not: checked again
    assert len(checked) == 3


def test_setups_step_together_equal_one_node_at_a_time_and_each_node_logs_its_own(monkeypatch):
    setup = wire.decode(protocol.setup("r", "s", CONFIG, [0, 1, 3]))  # node 2 not asked
    steps = _counting(monkeypatch, "setup_step")
    agents = _host([0, 1, 2, 3])
    together = step_nodes(agents, [setup] * 4)
    assert steps == [[0, 1, 3]] and together[2] is None
    for node in (0, 1, 3):
        alone = NodeAgent(node).handle(setup)  # its own experiment: not a stacked step
        reply = together[node]
        assert isinstance(reply, protocol.Reply) and isinstance(alone, protocol.Reply)
        ours, theirs = wire.decode(reply.payload), wire.decode(alone.payload)
        assert ours.kind == theirs.kind == protocol.SETUP_UPDATE and ours.tensors.keys() == theirs.tensors.keys()
        for name in ours.tensors:
            np.testing.assert_array_equal(ours.tensors[name], theirs.tensors[name])
        planned = [{k: v for k, v in e.items() if k not in MEASURED_FIELDS} for e in ours.meta["events"]]
        assert planned == [{k: v for k, v in e.items() if k not in MEASURED_FIELDS} for e in theirs.meta["events"]]
        assert "mutual_info" in [e["kind"] for e in ours.meta["events"]]
        assert agents[node].ledger("r", "s").has_round(-1)
    assert len(steps) == 1 and not agents[2].ledger("r", "s").has_round(-1)
