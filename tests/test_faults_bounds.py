"""Issue 27's faults of invariants 2 (tensor bounds) and 5 (self-reported numbers), each in two
variations (the setup upload and a round's update; the first and the last node; early and on time):

- an ACFL node's coded upload or gradient of 1e300, or scaled by 1e6, is refused (it crashed the
  coordinator, or "completed" with a loss of 1e192);
- a PADPFL node claiming a data size of 1e9 or −150 is refused and never takes the aggregate (it
  took the whole weight, or crashed the coordinator); a quality score at the top of its range takes
  no more than the cap;
- FedAvg's sizes likewise;
- a DWFL transmit signal past the power constraint is refused, and an early one of the wrong shape
  or dtype is dropped on arrival, not only one of the wrong size.

The MQTT cases run a liar node (its host mutates its own authenticated replies) against a real
broker and check the run completes with the lie refused. DWFL's over the air are expected to fail
(strictly) until the coordinator declares each round's own bounds (round_uplink_spec and
round_signal_spec of testbed.algorithms.contract, and the notice's signal_max_norm): then they pass
and the marker goes.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time

import numpy as np
import pytest

from testbed.algorithms import RoundContext
from testbed.algorithms.contract import SETUP_ROUND, NodeResult, TensorSpec, check_tensors
from testbed.assembly.config import replace
from testbed.mqtt import wire
from testbed.orchestration.channel_emulator import ChannelEmulator, _Round
from testbed.orchestration.runner import run_experiment
from testbed.reports.results import read_metrics
from testbed.rounds import protocol

from conftest import REPO
from conftest_mqtt import with_board_keys
from test_faults_mqtt import _processes
from test_trust_bounds import built, uploads


def _lie(case: str, setup: bool, node: str, name: str, how) -> tuple[str | None, dict]:
    """check_tensors' verdict on ``node``'s (first or last) honest upload with ``name`` changed by
    ``how`` (a function of the row), and the honest rows."""
    rows_of = uploads(case, 3, 2, setup)
    spec, m, rows, reference = rows_of[0] if node == "first" else rows_of[-1]
    assert check_tensors(spec, rows, reference) is None  # the honest upload passes
    return check_tensors(spec, dict(rows, **{name: how(rows[name])}), reference), rows


def _one_entry(value: float):
    def change(row: np.ndarray) -> np.ndarray:
        out = row.copy()
        out.reshape(-1)[out.size // 2] = value
        return out
    return change


# ------------------------------------------------------------------------------------------ ACFL


@pytest.mark.parametrize("setup, node, name", [(True, "first", "HX"), (False, "last", "gradient")])
def test_an_acfl_upload_of_1e300_or_scaled_by_1e6_is_refused(setup, node, name):
    problem, _ = _lie("acfl", setup, node, name, _one_entry(1e300))
    assert problem is not None and problem.startswith(f"{name}: ")
    problem, _ = _lie("acfl", setup, node, name, lambda row: row * 1e6)
    assert problem is not None and "honest" in problem  # a bound, not a malformed tensor


@pytest.mark.parametrize("node", ["first", "last"])
def test_an_acfl_coded_label_upload_past_its_bound_is_refused(node):
    problem, _ = _lie("acfl/projection", True, node, "HY", lambda row: row * 1e6)
    assert problem is not None and problem.startswith("HY: ")


# --------------------------------------------------------------------------------- sizes (setup)


@pytest.mark.parametrize("case", ["padpfl/data_size", "fedavg"])
@pytest.mark.parametrize("node, claim", [("first", 1e9), ("last", -150.0)])
def test_a_claimed_size_of_1e9_or_minus_150_is_refused_and_takes_no_more_than_the_cap(case, node, claim):
    config, data, model, alg = built(case)
    n = data.num_nodes
    m = 0 if node == "first" else n - 1
    problem, _ = _lie(case, True, node, "samples", lambda row: np.array([claim]))
    assert problem is not None and "samples: values in" in problem
    # In sim nobody checks the wire: the setup's own intake refuses the claim (it counts as silent).
    ids = tuple(range(n))
    ctx = RoundContext(SETUP_ROUND, 4, n, ids)
    up = alg.setup_step(data.train, ids, ctx)
    up.tensors["samples"][m, 0] = claim
    state = alg.server_setup(alg.init_state(model.init(None)), up, ctx.closed(ids)).state
    full = RoundContext.everyone(0, 4, n).closed(ids)
    weights = alg.shares(state, ids) if case == "fedavg" else alg.round_weights(full, state)
    assert np.isfinite(weights).all() and weights.min() >= 0 and weights.sum() == pytest.approx(1, abs=1e-12)
    honest = data.train.sizes / data.train.sizes.sum()
    assert weights[m] <= max(honest[m], data.train.sizes.mean() / data.train.sizes.sum()) + 1e-12
    assert weights.max() <= 0.5


def test_the_cap_redistributes_a_share_above_it_in_proportion():
    config, data, model, alg = built("padpfl/data_size")
    sizes = np.array([1000.0, 10, 20, 30, 40])  # node 0's honest share would be 0.91
    state = {**alg.init_state(model.init(None)), "sizes": sizes}
    p = alg.round_weights(RoundContext.everyone(0, 4, 5).closed(range(5)), state)
    np.testing.assert_allclose(p, [0.5, 0.05, 0.1, 0.15, 0.2], rtol=1e-12)


# -------------------------------------------------------------------------------- quality scores


@pytest.mark.parametrize("liar, round_index", [(0, 0), (4, 5)])
def test_a_score_at_the_top_of_its_range_takes_no_more_than_the_cap(liar, round_index):
    config, data, model, alg = built("padpfl/quality_score")
    spec = alg.uplink_spec()["score"]
    top = spec.value_range[1]
    assert spec.problem(np.array([top])) is None and spec.problem(np.array([top + 0.01])) is not None
    state = alg.init_state(model.init(None))
    ids = tuple(range(5))
    ctx = RoundContext.everyone(round_index, 4, 5)
    out = alg.node_step(alg.downlink(state, ctx, ids), data.train, ids, ctx)
    scores = out.tensors["score"].copy()
    scores[liar] = top
    p = alg.round_weights(ctx.closed(ids), state, NodeResult(ids, {"score": scores}))
    assert p[liar] <= 0.5 + 1e-12 and p.sum() == pytest.approx(1, abs=1e-12)
    # the lie is worth no more than an honest perfect score (the server clips to [0, 1])
    scores[liar] = 1.0
    np.testing.assert_array_equal(p, alg.round_weights(ctx.closed(ids), state, NodeResult(ids, {"score": scores})))


# -------------------------------------------------------------------------------- FedAvg updates


@pytest.mark.parametrize("node, how", [("first", _one_entry(1e300)), ("last", lambda row: row * 1e6)])
def test_a_fedavg_update_past_its_step_bound_is_refused(node, how):
    problem, _ = _lie("fedavg", False, node, "update", how)
    assert problem is not None and problem.startswith("update: norm")


# ------------------------------------------------------------------------------------ DWFL signal


@pytest.mark.parametrize("node, round_index", [("first", 0), ("last", 5)])
def test_a_dwfl_signal_past_the_power_constraint_is_refused(node, round_index):
    rows_of = uploads("dwfl", 0, round_index, False)
    spec, m, rows, _ = rows_of[0] if node == "first" else rows_of[4]
    assert spec["signal"].max_norm is not None and check_tensors(spec, rows) is None
    assert check_tensors(spec, {"signal": rows["signal"] * 1e6}) is not None
    assert check_tensors(spec, {"signal": _one_entry(1e300)(rows["signal"])}) is not None


def test_the_channel_drops_an_early_signal_of_the_wrong_shape_or_dtype_and_one_past_the_bound(mosquitto_broker,
                                                                                              run_id, caplog):
    """Before any notice (early): a signal with the algorithm's entry count but another shape, or
    another dtype, is dropped on arrival (only the count was checked). On time: a signal past the
    power bound the round's notice declares is refused before it goes on the air."""
    caplog.set_level(logging.WARNING, logger="testbed.orchestration.channel_emulator")
    channel = ChannelEmulator(mosquitto_broker.url, run_id, session="s", nodes=[0, 1, 2],
                              signal_spec=TensorSpec((4,)))
    try:
        def send(node: int, round_index: int, signal: np.ndarray) -> None:
            msg = wire.decode(protocol.signal(run_id, "s", round_index, node, signal))
            with channel._lock:
                channel._signal(node, "s", msg)

        send(0, 1, np.ones((2, 2)))  # first node, right size, wrong shape
        send(2, 2, np.ones(4, dtype=np.float32))  # last node, wrong dtype
        send(1, 1, np.ones(4))  # a good one, kept
        with channel._lock:
            held = {(r, node) for (_, r), early in channel._early.items() for node in early}
            bounded = TensorSpec((4,), max_norm=10.0)
            current = _Round("s", 3, None, {}, None, bounded, {0, 2}, time.monotonic() + 60)
            channel._online = {0, 1, 2}  # the round waits for its senders: it never goes on the air here
            channel._round = current
        send(0, 3, np.full(4, 1e6))  # past the bound
        send(2, 3, np.ones(4))  # within it
        with channel._lock:
            accepted = set(current.signals)
            current.done = True
    finally:
        channel.close()
    assert held == {(1, 1)}
    assert accepted == {2}
    dropped = [r.getMessage() for r in caplog.records]
    assert any("early signal of round 1: shape (2, 2)" in line for line in dropped), dropped
    assert any("early signal of round 2: dtype float32" in line for line in dropped), dropped
    assert any("node 0's signal of round 3 refused: norm" in line for line in dropped), dropped


# ------------------------------------------------------------------------------------ over MQTT


@pytest.fixture(autouse=True)
def _keys(board_keys) -> str:
    """The message keys of the host these tests start (conftest_mqtt.board_keys)."""
    return board_keys

LIAR = r"""
import os, sys
import numpy as np
from nodes.agent import NodeAgent
from nodes.host import serve
from testbed.mqtt import wire
from testbed.mqtt import auth
from testbed.rounds import protocol

url, run, nodes, target, kind, round_index, name, value = sys.argv[1:9]
nodes, target, round_index, value = int(nodes), int(target), int(round_index), float(value)


class Liar(NodeAgent):
    # Its own authenticated reply, with one tensor changed: what a compromised node sends.
    def handle(self, msg):
        reply = super().handle(msg)
        if reply is None or msg.kind != kind or (kind != protocol.SETUP and msg.round != round_index):
            return reply
        sent = wire.decode(reply.payload)
        if name not in sent.tensors:
            return reply
        row = np.array(sent.tensors[name])
        if name == "samples":
            row[...] = value  # a claimed size
        else:
            row *= value  # a scaled upload
        payload = wire.encode({"run": sent.run, "round": sent.round, "sender": sent.sender, "kind": sent.kind,
                               "meta": sent.meta}, {**sent.tensors, name: row})
        return protocol.Reply(reply.to, payload)


serve(url, run, list(range(nodes)), agent_factory=lambda n: Liar(n) if n == target else NodeAgent(n),
      keys=auth.load_keys(os.environ[auth.KEYS_ENV], run))
"""


def _run_with_liar(config, url: str, tmp_path, node: int, kind: str, round_index: int, name: str, value: float):
    """The run of ``config`` over MQTT on ``url`` with its nodes on one host whose node ``node``
    changes ``name`` in its reply to the ``kind`` message of ``round_index`` (x ``value``, or a size)."""
    config = replace(config, run={"mode": "mqtt"},
                     mqtt=with_board_keys({"broker_url": url, "emulated": False, "round_timeout_s": 4.0}))
    host = subprocess.Popen([sys.executable, "-c", LIAR, url, config.mqtt.run_id, str(config.data.num_nodes),
                             str(node), kind, str(round_index), name, repr(value)], cwd=REPO,
                            stderr=subprocess.DEVNULL)
    with _processes(host):
        return run_experiment(config, out_dir=tmp_path / "mqtt", quiet=True)


@pytest.mark.slow
@pytest.mark.parametrize("case, node, kind, round_index, name, value", [
    ("acfl", 0, protocol.SETUP, 0, "HX", 1e6),  # the coded upload scaled: "completed" with a loss of 1e192
    ("acfl", 4, protocol.ROUND, 5, "gradient", 1e300),  # the last round's gradient: crashed the coordinator
    ("padpfl/data_size", 0, protocol.SETUP, 0, "samples", 1e9),  # took the whole weight
    ("padpfl/data_size", 4, protocol.SETUP, 0, "samples", -150.0),  # crashed the coordinator
], ids=["acfl-setup-first", "acfl-round-last", "padpfl-size-1e9-first", "padpfl-size-negative-last"])
def test_a_liar_node_over_mqtt_is_refused_and_the_run_completes(mosquitto_broker, tmp_path, caplog, case, node, kind,
                                                               round_index, name, value):
    config = built(case)[0]
    caplog.set_level(logging.WARNING, logger="testbed.orchestration.coordinator")
    result = _run_with_liar(config, mosquitto_broker.url, tmp_path, node, kind, round_index, name, value)
    assert result.summary["status"] == "completed", result.summary.get("failure")
    rejected = [r.getMessage() for r in caplog.records if r.getMessage().startswith("rejected ")]
    assert len(rejected) == 1 and f"of node {node} " in rejected[0] and f"{name}: " in rejected[0], rejected
    run_experiment(replace(config, run={"mode": "sim"}), out_dir=tmp_path / "sim", quiet=True)
    lied, honest = read_metrics(tmp_path / "mqtt")[-1], read_metrics(tmp_path / "sim")[-1]
    assert np.isfinite(lied["train_loss"]) and lied["train_loss"] <= 2 * honest["train_loss"]


@pytest.mark.slow
@pytest.mark.parametrize("node, kind, round_index, name, logger, refusal", [
    (0, protocol.ROUND, 0, "signal", "testbed.orchestration.channel_emulator", ("node 0's signal of round 0 refused: norm",)),
    (3, protocol.RECEIVED, 3, "model", "testbed.orchestration.coordinator", ("rejected update of node 3 for round 3", "model: norm")),
], ids=["signal-first-node-first-round", "model-last-node-last-round"])
def test_a_dwfl_liar_over_the_air_is_refused_and_the_run_completes(mosquitto_broker, tmp_path, caplog, node, kind,
                                                                  round_index, name, logger, refusal):
    """DWFL over MQTT with its channel emulator: a node's transmit signal scaled by 1e6 (past the
    power constraint) is refused by the channel, its reported model scaled by 1e6 by the coordinator."""
    from test_dwfl_mqtt import EXPERIMENT

    from testbed.assembly.config import load_config_text

    caplog.set_level(logging.WARNING, logger=logger)
    result = _run_with_liar(load_config_text(EXPERIMENT), mosquitto_broker.url, tmp_path, node, kind, round_index,
                            name, 1e6)
    assert result.summary["status"] == "completed", result.summary.get("failure")
    lines = [r.getMessage() for r in caplog.records if r.name == logger]
    assert any(all(part in line for part in refusal) for line in lines), lines
    assert np.isfinite(np.load(result.run_dir / "final_params.npy")).all()
    assert np.abs(np.load(result.run_dir / "final_params.npy")).max() < 1e3
