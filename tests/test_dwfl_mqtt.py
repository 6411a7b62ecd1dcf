"""DWFL over MQTT with the channel emulator between the nodes: the same numbers as sim mode, on
both brokers, and a node that dies mid-round is a silent sender the others average without."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import numpy as np
import pytest

from testbed.assembly.config import load_config_text, replace
from testbed.ledger.files import read_ledger
from testbed.orchestration.runner import run_experiment
from testbed.reports.results import read_checkpoint

from conftest import REPO
from conftest_mqtt import with_board_keys
from test_mqtt_runtime import _comparable, _metrics, run_with_node_crash

EXPERIMENT = """
[run]
name = "dwfl-mqtt"
algorithm = "dwfl"
seed = 5
mode = "mqtt"
[data]
dataset = "synthetic"
num_nodes = 4
samples_per_node = 60
dim = 6
[dwfl]
rounds = 4
batch = 8
lr = 0.3
epsilon = 0.5
fading = "rayleigh"
coherence_rounds = 1
c_scale = 0.7
[privacy]
delta = 1e-5
[mqtt]
round_timeout_s = 20.0
connect_timeout_s = 30.0
[output]
figures = false
"""


def _config(**sections):
    if "mqtt" in sections:
        sections["mqtt"] = with_board_keys(sections["mqtt"])
    return replace(load_config_text(EXPERIMENT), **sections)


@pytest.fixture(autouse=True)
def _keys(board_keys) -> str:
    """The message keys of the boards these tests start (conftest_mqtt.board_keys)."""
    return board_keys


def _node_models(run_dir) -> np.ndarray:
    """(N, P) every node's own model after the last round (the checkpointed state)."""
    return read_checkpoint(run_dir).state["models"]


#: On graphs (issue 32): a ring, and the graph the radio gives (4 nodes in a 10 m square, range
#: about 7 m at -30 dB: a node may hear no one; walking, redrawn every 2 rounds) with separate
#: links weighted Metropolis–Hastings.
RING = {"kind": "ring"}
RADIO_GRAPH = {"kind": "random_geometric", "snr_threshold_db": -30.0, "allow_disconnected": True,
               "coherence_rounds": 2, "speed_mps": 3.0,
               "mixing": "metropolis_hastings"}


@pytest.mark.parametrize("dwfl,topology", [({"variant": "A"}, {}), ({"variant": "B", "scheme": "orthogonal_d2d"}, {}),
                                           ({"variant": "B", "scheme": "ota_central", "init": "common"}, {}),
                                           ({"variant": "A"}, RING),
                                           ({"variant": "B", "scheme": "orthogonal_d2d", "area_m": 10.0}, RADIO_GRAPH)],
                         ids=["ota_d2d-A", "orthogonal-B", "central", "ring-ota_d2d-A", "radio-graph-orthogonal-MH"])
def test_sim_and_mqtt_give_the_same_models_and_ledger(broker, tmp_path, dwfl, topology):
    config = _config(mqtt={"broker_url": broker.url}, dwfl=dwfl, **({"topology": topology} if topology else {}))
    mq = run_experiment(config, out_dir=tmp_path / "mqtt", quiet=True)
    sim = run_experiment(replace(config, run={"mode": "sim"}), out_dir=tmp_path / "sim", quiet=True)
    assert mq.summary["status"] == sim.summary["status"] == "completed" and mq.summary["rounds"] == 4
    np.testing.assert_allclose(np.load(mq.run_dir / "final_params.npy"), np.load(sim.run_dir / "final_params.npy"),
                               atol=1e-6)
    # every node's own model, not only their average
    np.testing.assert_allclose(_node_models(mq.run_dir), _node_models(sim.run_dir), atol=1e-6)
    assert _comparable(mq.run_dir) == _comparable(sim.run_dir)


def test_node_killed_mid_round_is_a_silent_sender(mosquitto_broker, tmp_path):
    url = mosquitto_broker.url
    config = _config(mqtt={"broker_url": url, "emulated": False, "round_timeout_s": 15.0, "quorum": 3},
                     dwfl={"rounds": 5})
    r = run_with_node_crash(config, url, tmp_path, rejoin=False)
    assert r.summary["status"] == "completed" and r.summary["rounds"] == 5
    rows = _metrics(r.run_dir)
    assert [int(row["stragglers"]) for row in rows] == [0, 0, 1, 1, 1]
    events = list(read_ledger(r.run_dir / "ledger.csv"))
    assert {e.round for e in events if e.node == 3 and e.kind != "straggle"} == {0, 1}
    assert {e.round for e in events if e.node == 0} == {0, 1, 2, 3, 4}
    assert np.isfinite(_node_models(r.run_dir)).all()
    # Round 2 planned four senders and heard three: each survivor is charged what it really
    # released (eq. 10 over the three), never the plan's less.
    _assert_charged_as_heard(config, events, r, round_index=2, senders=[0, 1, 2])


def test_node_killed_after_transmitting_is_charged_for_its_release(mosquitto_broker, tmp_path):
    """Node 3 transmits in round 2, then loses power before its update: the others heard it, so its
    release is charged (the plan: every node did transmit) though its update never came."""
    url = mosquitto_broker.url
    config = _config(mqtt={"broker_url": url, "emulated": False, "round_timeout_s": 15.0, "quorum": 3},
                     dwfl={"rounds": 4})
    r = run_with_node_crash(config, url, tmp_path, rejoin=False, after_reply=True)
    assert r.summary["status"] == "completed"
    events = list(read_ledger(r.run_dir / "ledger.csv"))
    of_3 = [e for e in events if e.node == 3]
    assert {e.round for e in of_3 if e.kind == "privacy"} == {0, 1, 2}
    assert [(e.round, e.reason) for e in of_3 if e.kind == "straggle"][0][0] == 2
    _assert_charged_as_heard(config, events, r, round_index=2, senders=[0, 1, 2, 3])
    assert r.summary["nodes"]["3"]["epsilon"] > 0


def _assert_charged_as_heard(config, events, result, round_index, senders):
    from testbed.assembly import assemble
    from testbed.orchestration.runner import load
    from testbed.privacy.accountants import epsilon, tally_of

    cfg = replace(config, run={"mode": "sim"})
    data, model = load(cfg)
    alg = assemble.build_algorithm(cfg, model, data)
    heard = alg.privacy_sigma(round_index, senders)
    for node in senders:
        charged = [e for e in events if e.node == node and e.round == round_index and e.kind == "privacy"]
        truth = [dataclasses.replace(charged[0], sigma=float(heard[node]), issuer="node")]
        got, want = epsilon("zcdp", tally_of(charged), 1e-5), epsilon("zcdp", tally_of(truth), 1e-5)
        assert got == pytest.approx(want, rel=1e-9) and got >= want * (1 - 1e-12), (node, charged)



BOARD = """
import sys
import numpy as np
from nodes.agent import NodeAgent
from testbed.assembly.config import load_config_text, to_toml
from testbed.mqtt import wire
from testbed.rounds import protocol

config = load_config_text(sys.stdin.read())
h = np.array([0.9 + 0.2j, 1.1 - 0.4j, 0.5 + 0.5j, 1.3 + 0.1j])
ask = wire.decode(protocol.round_("r", "s", 0, to_toml(config), [0, 1, 2, 3], {"model": np.zeros(14), "channel_h": h}))
to, payload = NodeAgent(node=2).handle(ask)
signal = wire.decode(payload)
print(to, signal.kind, signal.tensors["signal"].shape, "sionna" in sys.modules, "torch" in sys.modules)
"""


def test_a_board_runs_dwfl_without_sionna():
    """A board gets each round's channel from the coordinator: Rayleigh fading and 3GPP path loss
    need Sionna (and torch) only where the channel is drawn."""
    done = subprocess.run([sys.executable, "-c", BOARD], input=EXPERIMENT.replace('fading = "rayleigh"',
                          'fading = "rayleigh"\npathloss = "umi"'), capture_output=True, text=True, cwd=REPO,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["channel", "signal", "(14,)", "False", "False"]
