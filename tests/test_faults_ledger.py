"""Released is charged, whatever the timing or the content; nothing a node sends moves another's
state or crashes the coordinator. Each class of fault in two or more variations (timing, field),
on whole MQTT runs through the real coordinator and honest in-process agents
(tests/loopback_coordinator.py); tests/test_trust_coordinator.py searches the same space at random.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from ledger_invariant import FIGURES, PLANNED, under_counts
from loopback_coordinator import loopback
from testbed.assembly.config import load_config_text
from testbed.ledger.events import GaussianEvent, MutualInfoEvent
from testbed.ledger.files import read_ledger
from testbed.mqtt import wire
from testbed.mqtt import topics
from testbed.orchestration.runner import run_experiment
from testbed.rounds import protocol

NODES = list(range(4))
BASE = """
[run]
name = "faults"
seed = 3
mode = "mqtt"
[data]
dataset = "synthetic"
num_nodes = 4
samples_per_node = 40
dim = 4
[output]
figures = false
[privacy]
tight_accountant = "none"
[mqtt]
broker_url = "mqtt://127.0.0.1:1"
emulated = false
round_timeout_s = 0.2
"""
#: 60 rounds of DP-PASGD: a reply can come 50 rounds late.
DP_PASGD = BASE + "[dp_pasgd]\nsteps = 120\ntau = 2\nbatch = 4\nlr = 0.5\nsigma = 1.0\n"
ACFL = BASE.replace('mode = "mqtt"', 'mode = "mqtt"\nalgorithm = "acfl"') + '[model]\nkind = "linear"\n[acfl]\niterations = 4\nlr = 0.01\nsigma1_sq = 0.5\nsigma2_sq = 0.5\n'


def _run(text: str, tmp_path, monkeypatch, tamper):
    config = load_config_text(text)
    with loopback(monkeypatch, NODES, tamper) as nodes:
        result = run_experiment(config, out_dir=tmp_path / "run", quiet=True)
    ledgers = [agent.ledger(config.mqtt.run_id, nodes.session) for agent in nodes.agents.values()]
    return result, ledgers


def _charged_rounds(run_dir, node: int, kind: type = GaussianEvent) -> list[int]:
    return sorted(e.round for e in read_ledger(run_dir / "ledger.csv") if isinstance(e, kind) and e.node == node)


def _rewrite(payload: bytes, **meta) -> bytes:
    """``payload`` with some of its header's meta fields replaced (tensors kept)."""
    msg = wire.decode(payload)
    header = {"run": msg.run, "round": msg.round, "sender": msg.sender, "kind": msg.kind,
              "meta": {**json.loads(json.dumps(msg.meta)), **meta}}
    return wire.encode(header, {k: np.array(v) for k, v in msg.tensors.items()})


def _no_report_from(node: int, tamper):
    """``tamper``, and ``node`` never reports its ledger: what it released must be charged without it."""
    def wrapped(sender, msg, reply):
        if sender == node and msg.kind == protocol.STOP:
            return []
        return tamper(sender, msg, reply)
    return wrapped


@pytest.mark.parametrize("late_by", [1, 8, 50, None])  # None: after the last round, at the stop
@pytest.mark.parametrize("round_index", [0, 5])
def test_a_late_update_is_charged_once_however_late(late_by, round_index, tmp_path, monkeypatch):
    def tamper(sender, msg, reply):
        if sender == 2 and msg.kind == protocol.ROUND and msg.round == round_index:
            # late, and a second copy a round later (a redelivery): charged once
            return [(reply, late_by), (reply, None if late_by is None else late_by + 1)]
        return [(reply, 0)]

    result, ledgers = _run(DP_PASGD, tmp_path, monkeypatch, _no_report_from(2, tamper))
    assert result.summary["status"] == "completed"
    assert under_counts(result.summary, ledgers) == []
    assert _charged_rounds(result.run_dir, 2) == list(range(60))  # once each, the late one included
    assert result.summary["nodes"]["2"]["ledger_check"] == "unconfirmed"
    assert result.summary["nodes"]["0"]["ledger_check"] == "confirmed"


@pytest.mark.parametrize("round_index", [0, 30, 59])
def test_an_update_lost_on_the_way_is_charged_from_the_nodes_own_ledger(round_index, tmp_path, monkeypatch):
    def tamper(sender, msg, reply):
        lost = sender == 1 and msg.kind == protocol.ROUND and msg.round == round_index
        return [] if lost else [(reply, 0)]

    result, ledgers = _run(DP_PASGD, tmp_path, monkeypatch, tamper)
    assert under_counts(result.summary, ledgers) == []
    assert _charged_rounds(result.run_dir, 1) == list(range(60))
    assert result.summary["nodes"]["1"]["rounds_straggled"] == 1


@pytest.mark.parametrize("field", ["events", "metrics", "tensor"])
@pytest.mark.parametrize("round_index", [0, 59])
def test_an_update_refused_for_its_content_is_charged_the_plan(field, round_index, tmp_path, monkeypatch):
    """The node released a noisy tensor; its message fails the checks; it never reports its ledger."""
    def tamper(sender, msg, reply):
        if sender != 3 or msg.kind != protocol.ROUND or msg.round != round_index:
            return [(reply, 0)]
        if field == "tensor":
            honest = wire.decode(reply)
            bad = {"update": np.array(honest.tensors["update"]) + 1e6}
            return [(wire.encode({"run": honest.run, "round": honest.round, "sender": honest.sender,
                                  "kind": honest.kind, "meta": json.loads(json.dumps(honest.meta))}, bad), 0)]
        return [(_rewrite(reply, **{field: [] if field == "events" else {"samples": -150}}), 0)]

    result, ledgers = _run(DP_PASGD, tmp_path, monkeypatch, _no_report_from(3, tamper))
    # Events that are not the plan say nothing of the seconds and joules. These nodes run elsewhere
    # (no profile of theirs declared, so nothing bounds what they measure): those are the node's
    # costliest round so far, an estimate (none before the first round; and under its last round's
    # figures when that round was its slowest), and its figures stand unconfirmed. An emulated
    # node's are charged at the bounds of its window (test_a_release_whose_events_are_not_the_plan_
    # is_charged_at_its_bounds).
    unknown_costs = field == "events"
    assert under_counts(result.summary, ledgers, PLANNED if unknown_costs else FIGURES) == []
    assert round_index in _charged_rounds(result.run_dir, 3)
    if unknown_costs:
        assert result.summary["nodes"]["3"]["ledger_check"] == "unconfirmed"


@pytest.mark.parametrize("metrics", [{}, {"samples": 40.0, "weight": 1.0}, {"samples": 1e9}, {"samples": 0.5},
                                     {"samples": 2**70}, {"samples": "40"}, {"other": 40.0}])
def test_each_undeclared_or_out_of_range_metric_is_refused_not_a_crash(metrics, tmp_path, monkeypatch):
    def tamper(sender, msg, reply):
        if sender == 0 and msg.kind == protocol.ROUND and msg.round in (0, 1):
            return [(_rewrite(reply, metrics=metrics), 0)]
        return [(reply, 0)]

    result, ledgers = _run(DP_PASGD, tmp_path, monkeypatch, tamper)
    assert result.summary["status"] == "completed"
    assert result.summary["nodes"]["0"]["rounds_straggled"] == 2  # refused, twice
    assert all(result.summary["nodes"][str(n)]["rounds_straggled"] == 0 for n in (1, 2, 3))
    assert under_counts(result.summary, ledgers) == []


@pytest.mark.parametrize("value", [1.7e308, 1e300, 86_401.0])
@pytest.mark.parametrize("field", ["compute_s", "airtime_s", "energy_j"])
def test_a_measured_field_beyond_its_physical_bound_is_refused(field, value, tmp_path, monkeypatch):
    def tamper(sender, msg, reply):
        if sender == 1 and msg.kind == protocol.ROUND and msg.round == 4:
            events = json.loads(json.dumps(wire.decode(reply).meta["events"]))
            for event in events:
                if field in event:
                    event[field] = value
            return [(_rewrite(reply, events=events), 0)]
        return [(reply, 0)]

    result, ledgers = _run(DP_PASGD, tmp_path, monkeypatch, tamper)
    text = (result.run_dir / "summary.json").read_text()
    assert "Infinity" not in text and "NaN" not in text
    assert result.summary["nodes"]["1"].get(field, 0.0) < 1e6  # the summary lists no airtime
    assert under_counts(result.summary, ledgers) == []


@pytest.mark.parametrize("shift", [1, 2**20])
@pytest.mark.parametrize("kind", [protocol.UPDATE, protocol.LEDGER])
def test_a_forged_message_of_a_round_not_yet_sent_moves_no_state(shift, kind, tmp_path, monkeypatch):
    """Before: a forged update of round r + 2**20 moved the sender's replay window past every real
    round, and its real updates were refused for the rest of the run (released, never charged)."""
    def tamper(sender, msg, reply):
        if sender == 2 and msg.kind == protocol.ROUND and msg.round == 3:
            honest = wire.decode(reply)
            forged = wire.encode({"run": honest.run, "round": honest.round + shift, "sender": "2", "kind": kind,
                                  "meta": json.loads(json.dumps(honest.meta))},
                                 {k: np.array(v) for k, v in honest.tensors.items()})
            return [(forged, 0), (reply, 0)]
        return [(reply, 0)]

    result, ledgers = _run(DP_PASGD, tmp_path, monkeypatch, tamper)
    assert result.summary["nodes"]["2"]["rounds_straggled"] == 0
    assert _charged_rounds(result.run_dir, 2) == list(range(60))
    assert under_counts(result.summary, ledgers) == []


@pytest.mark.parametrize("payload", [b"garbage", b"", b"OFFLINE", b"offline\x00"])
@pytest.mark.parametrize("round_index", [0, 30])
def test_a_status_other_than_online_or_offline_changes_nothing(payload, round_index, tmp_path, monkeypatch):
    def tamper(sender, msg, reply):
        if sender == 0 and msg.kind == protocol.ROUND and msg.round == round_index:
            nodes.client.take_sealed(topics.status(nodes.client.run, "1"), payload)
        return [(reply, 0)]

    config = load_config_text(DP_PASGD)
    with loopback(monkeypatch, NODES, tamper) as nodes:
        result = run_experiment(config, out_dir=tmp_path / "run", quiet=True)
    assert result.summary["nodes"]["1"]["rounds_straggled"] == 0
    assert nodes.client.rejected >= 1


@pytest.mark.parametrize("meta", [{"budget": "epsilon", "would_be": "inf", "limit": 1.0},
                                  {"budget": "epsilon", "would_be": 2.0, "limit": None},
                                  {"budget": "x" * 1000, "would_be": 2.0, "limit": 1.0},
                                  {"budget": 3, "would_be": 2.0, "limit": 1.0}])
def test_a_malformed_refusal_neither_stops_the_run_nor_crashes(meta, tmp_path, monkeypatch):
    def tamper(sender, msg, reply):
        if sender == 3 and msg.kind == protocol.ROUND and msg.round == 2:
            honest = wire.decode(reply)
            return [(wire.encode({"run": honest.run, "round": honest.round, "sender": "3", "kind": protocol.REFUSED,
                                  "meta": {"session": protocol.session_of(honest), **meta}}), 0), (reply, 0)]
        return [(reply, 0)]

    result, _ = _run(DP_PASGD, tmp_path, monkeypatch, tamper)
    assert result.summary["status"] == "completed"
    assert result.summary["nodes"]["3"]["rounds_straggled"] == 0


@pytest.mark.parametrize("late_by", [1, None])
def test_a_late_setup_upload_is_charged_to_the_mutual_information_ledger(late_by, tmp_path, monkeypatch):
    def tamper(sender, msg, reply):
        if sender == 0 and msg.kind == protocol.SETUP:
            return [(reply, late_by)]
        return [(reply, 0)]

    result, ledgers = _run(ACFL, tmp_path, monkeypatch, _no_report_from(0, tamper))
    assert _charged_rounds(result.run_dir, 0, MutualInfoEvent) == [-1]
    nats = {n: result.summary["nodes"][str(n)]["mi_epsilon_nats"] for n in NODES}
    assert nats[0] == nats[1] > 0 and not math.isinf(nats[0])
    assert under_counts(result.summary, ledgers) == []
