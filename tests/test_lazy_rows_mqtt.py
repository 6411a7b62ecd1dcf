"""Memory that follows the sampled and evaluated nodes over MQTT too (issue 44, the 10,000-board
row): with client sampling the coordinator, which steps no node, makes only the evaluated nodes'
rows (not a copy of every node's), and an emulated host makes a node's training rows when a step
first asks for them, once; the numbers stay sim's, bit for bit."""

from __future__ import annotations

import csv
import logging

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import nodes.shared_experiment as shared_module
import testbed.data.synthetic as synthetic
from nodes.agent import NodeAgent, step_nodes
from nodes.shared_experiment import SharedExperiment
from nodes.costs import NodeCosts
from testbed.assembly import assemble
from testbed.assembly.config import load_config_text, replace, to_toml
from testbed.assembly.evaluation import evaluated_node_ids
from testbed.data.lazy import KeptNodes
from testbed.mqtt import auth, wire
from testbed.mqtt.client import MAX_WILL_BYTES, MqttClient
from testbed.orchestration.runner import run_experiment
from testbed.rounds import protocol

NODES = 12
WHOLE = synthetic.make_logistic(NODES, 30, 3, seed=4)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.integers(0, NODES - 1), min_size=1, max_size=6), min_size=1, max_size=5))
def test_kept_nodes_make_each_node_once_and_give_the_generators_rows(asks):
    made: list[int] = []

    def make(ids):
        made.extend(ids)
        return synthetic.make_logistic(NODES, 30, 3, seed=4, nodes=ids, splits=("train",))

    kept = KeptNodes(make)
    for ask in asks:
        got = kept.nodes(ask)
        want = WHOLE.select(ask)
        np.testing.assert_array_equal(got.train.x, want.train.x)
        np.testing.assert_array_equal(got.train.y, want.train.y)
        np.testing.assert_array_equal(got.train.offsets, want.train.offsets)
        assert got.node_ids == tuple(ask) and got.test.sizes.sum() == 0
    assert sorted(made) == sorted(set(made)) == sorted({n for ask in asks for n in ask}) and len(kept) == len(made)


def _sampled(small_config_text: str, **output) -> object:
    config = load_config_text(small_config_text, ["data.num_nodes=16", "client_sampling.method='uniform'",
                                                  "client_sampling.fraction=0.25", "dp_pasgd.steps=10"])
    return replace(config, output=output) if output else config


def _made_here(monkeypatch) -> list[int]:
    """The node ids whose rows the synthetic generator makes in this process (not in a forked
    host, whose copy of the list is its own)."""
    made: list[int] = []
    write = synthetic._write_nodes
    monkeypatch.setattr(synthetic, "_write_nodes", lambda writer, seed, ids, *a: made.extend(ids) or
                        write(writer, seed, ids, *a))
    return made


def _metrics(run_dir) -> list[dict]:
    with open(run_dir / "metrics.csv", newline="") as f:
        return [{k: v for k, v in row.items() if k != "wall_s"} for row in csv.DictReader(f)]


@pytest.mark.parametrize("eval_nodes", [3, None])
def test_an_mqtt_coordinator_makes_only_the_evaluated_nodes_rows_and_equals_sim(small_config_text, tmp_path,
                                                                                  monkeypatch, eval_nodes):
    config = _sampled(small_config_text, eval_nodes=eval_nodes)
    sim = run_experiment(config, out_dir=tmp_path / "sim", quiet=True)
    made = _made_here(monkeypatch)
    mqtt = run_experiment(replace(config, run={"mode": "mqtt"}, mqtt={"hosts": 2}), out_dir=tmp_path / "mqtt",
                          quiet=True)
    evaluated = evaluated_node_ids(16, eval_nodes, config.run.seed)
    # Every node's rows only when every node is evaluated: memory follows the evaluation set.
    assert sorted(made) == (list(range(16)) if evaluated is None else evaluated.tolist())
    assert sim.summary["status"] == mqtt.summary["status"] == "completed"
    assert _metrics(tmp_path / "sim") == _metrics(tmp_path / "mqtt")  # the same figures, digit for digit


def test_a_lazy_hosts_nodes_make_their_rows_when_first_stepped_with_the_eager_hosts_replies(
        small_config_text, monkeypatch):
    text = to_toml(_sampled(small_config_text))
    asked: list[list[int]] = []
    load = shared_module.load_data
    monkeypatch.setattr(shared_module, "load_data", lambda d, seed, nodes=None, **kw: asked.append(list(nodes or []))
                        or load(d, seed, nodes=nodes, **kw))

    def host(lazy: bool) -> list[NodeAgent]:
        shared, costs = SharedExperiment(range(8)), NodeCosts()
        agents = [NodeAgent(n, shared=shared, costs=costs) for n in range(8)]
        monkeypatch.setattr(assemble, "holds_lazily", lambda config: lazy)
        prepare = wire.decode(protocol.prepare("r", "s", text, list(range(8))))
        assert all(agent.handle(prepare) is not None for agent in agents)  # every node built and ready
        return agents

    eager = host(False)
    asked.clear()
    lazy = host(True)
    assert asked == []  # no row made before a step asks
    model = {"model": np.linspace(-1, 1, 18)}
    for r, expected in enumerate(([2, 5], [5, 6], [1])):
        msg = wire.decode(protocol.round_("r", "s", r, text, expected, model))
        replies = step_nodes(lazy, [msg] * 8)
        for node, reply in enumerate(step_nodes(eager, [msg] * 8)):
            assert (reply is None) == (node not in expected) == (replies[node] is None)
            if reply is not None:
                for name, tensor in wire.decode(reply.payload).tensors.items():
                    np.testing.assert_array_equal(wire.decode(replies[node].payload).tensors[name], tensor)
    made = [n for call in asked for n in call]
    assert sorted(made) == [1, 2, 5, 6]  # each node's rows made once, when first stepped


@pytest.mark.parametrize("nodes", [3, 4_000])
def test_a_coordinator_of_thousands_of_nodes_connects_with_no_will_longer_than_mqtt_allows(
        mosquitto_broker, connect, run_id, caplog, nodes):
    # Sealed for every node, the coordinator's will outgrows MQTT's 65,535 bytes past ~3,100 nodes;
    # paho's CONNECT failed on it in its thread and the run waited for a connection forever.
    keys = auth.Keys.from_run_key(run_id, auth.new_key(), [str(n) for n in range(nodes)])
    client = MqttClient.for_coordinator(mosquitto_broker.url, run_id, keys=keys, auth_session="0123456789abcdef")
    with caplog.at_level(logging.WARNING, logger="testbed.mqtt.client"):
        assert connect(client, timeout_s=20).connected
    assert ("no last will" in caplog.text) == (nodes > 3_000)
    assert len(client._paho._will_payload) <= MAX_WILL_BYTES and client._paho._will == (nodes < 3_000)


def test_a_hosts_nodes_read_the_coordinators_status_through_one_of_them(small_config_text, tmp_path, monkeypatch,
                                                                        forked_hosts):
    # Sealed for every node, the status is a tag per node long: N nodes reading it were N².
    import nodes.host as host_module
    from testbed.mqtt import topics

    log = tmp_path / "subscriptions"

    class Logged(MqttClient):
        @classmethod
        def for_node(cls, url, run, node, **kwargs):
            with open(log, "a") as f:  # from the forked hosts too
                f.write(f"{node} {int(topics.coord(run) in kwargs['subscriptions'])}\n")
            return super().for_node(url, run, node, **kwargs)

    monkeypatch.setattr(host_module, "MqttClient", Logged)
    config = load_config_text(small_config_text, ["data.num_nodes=6", "run.mode='mqtt'", "mqtt.hosts=2"])
    assert run_experiment(config, out_dir=tmp_path / "r", quiet=True).summary["status"] == "completed"
    watching = dict(line.split() for line in log.read_text().splitlines())
    assert len(watching) == 6 and sorted(n for n, w in watching.items() if w == "1") == ["0", "3"]
