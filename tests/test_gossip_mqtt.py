"""D-PSGD and gossip over MQTT with the channel emulator between the nodes: the same numbers as sim
mode on both brokers, and a node that dies mid-round is a silent sender whose neighbours keep its
weight on their own models."""

from __future__ import annotations

import numpy as np
import pytest

from testbed.assembly.config import load_config_text, replace
from testbed.ledger.files import read_ledger
from testbed.orchestration.runner import run_experiment
from testbed.reports.results import read_checkpoint

from conftest_mqtt import with_board_keys
from test_mqtt_runtime import _comparable, _metrics, run_with_node_crash

EXPERIMENT = """
[run]
name = "baseline-mqtt"
algorithm = "{kind}"
seed = 5
mode = "mqtt"
[data]
dataset = "synthetic"
num_nodes = 4
samples_per_node = 60
dim = 6
[{kind}]
rounds = 4
batch = 8
lr = 0.3
epsilon = 0.5
fading = "rayleigh"
coherence_rounds = 1
[topology]
kind = "ring"
[privacy]
delta = 1e-5
[mqtt]
round_timeout_s = 20.0
connect_timeout_s = 30.0
[output]
figures = false
"""


def _config(kind: str, **sections):
    if "mqtt" in sections:
        sections["mqtt"] = with_board_keys(sections["mqtt"])
    return replace(load_config_text(EXPERIMENT.format(kind=kind)), **sections)


@pytest.fixture(autouse=True)
def _keys(board_keys) -> str:
    """The message keys of the boards these tests start (conftest_mqtt.board_keys)."""
    return board_keys


@pytest.mark.parametrize("kind", ["dpsgd", "gossip"])
def test_sim_and_mqtt_give_the_same_models_and_ledger(broker, tmp_path, kind):
    config = _config(kind, mqtt={"broker_url": broker.url})
    mq = run_experiment(config, out_dir=tmp_path / "mqtt", quiet=True)
    sim = run_experiment(replace(config, run={"mode": "sim"}), out_dir=tmp_path / "sim", quiet=True)
    assert mq.summary["status"] == sim.summary["status"] == "completed" and mq.summary["rounds"] == 4
    # every node's own model, not only their average
    np.testing.assert_allclose(read_checkpoint(mq.run_dir).state["models"], read_checkpoint(sim.run_dir).state["models"],
                               atol=1e-9)
    assert _comparable(mq.run_dir) == _comparable(sim.run_dir)


def test_node_killed_mid_round_is_a_silent_sender(mosquitto_broker, tmp_path):
    url = mosquitto_broker.url
    config = _config("gossip", mqtt={"broker_url": url, "emulated": False, "round_timeout_s": 15.0, "quorum": 3})
    r = run_with_node_crash(config, url, tmp_path, rejoin=False)
    assert r.summary["status"] == "completed" and r.summary["rounds"] == 4
    assert [int(row["stragglers"]) for row in _metrics(r.run_dir)] == [0, 0, 1, 1]
    events = list(read_ledger(r.run_dir / "ledger.csv"))
    assert {e.round for e in events if e.node == 3 and e.kind == "privacy"} == {0, 1}
    assert {e.round for e in events if e.node == 0 and e.kind == "privacy"} == {0, 1, 2, 3}
    models = read_checkpoint(r.run_dir).state["models"]
    assert np.isfinite(models).all()
    # Node 3 kept its model of round 1; its neighbours 0 and 2 went on without it.
    assert not np.allclose(models[0], models[3]) and not np.allclose(models[2], models[3])
