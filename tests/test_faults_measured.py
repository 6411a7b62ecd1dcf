"""A measured field (seconds, joules) beyond the physical bound its node's profile and round window
give (testbed.orchestration.measured_bounds) is refused in one logged line, and the release is
still charged, at the bound: each measured field, in the first, a middle and the last round, over
MQTT through the real coordinator (tests/loopback_coordinator.py) and in sim; and, searched by
Hypothesis, any value of any measured field of any algorithm's reply.
"""

from __future__ import annotations

import itertools
import json
import logging
import math

import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from ledger_invariant import under_counts
from test_faults_ledger import DP_PASGD, _no_report_from, _rewrite, _run
from test_measured_bounds import HOSTILE
from test_trust_coordinator import CASES, _config, _rounds
from loopback_coordinator import loopback
from testbed.assembly.config import load_config_text, replace
from testbed.ledger.events import EVENT_TYPES
from testbed.ledger.fields import FIELD_RULES
from testbed.ledger.files import read_ledger
from testbed.mqtt import wire
from testbed.orchestration import coordinator
from testbed.orchestration.measured_bounds import BOUNDED_FIELDS, MeasuredBounds
from testbed.orchestration.runner import run_experiment
from testbed.rounds import protocol

NODE = 1
HOST = MeasuredBounds.of_profile("host")
_runs = itertools.count()


@pytest.fixture
def profiled(monkeypatch):
    """The coordinator knows every node's profile (as it does of the nodes it emulates): the
    loopback's agents are this machine as it is."""
    monkeypatch.setattr(coordinator, "node_bounds", lambda mqtt, nodes, node_ids, alg: dict.fromkeys(node_ids, HOST))


def _set(reply: bytes, field: str, value) -> bytes:
    """``reply`` with ``field`` of each of its events that has one set to ``value`` (a non-finite
    float, which the encoder refuses, as the bare JSON token a hostile sender can write)."""
    token = json.dumps(value) if isinstance(value, float) and not math.isfinite(value) else None
    placeholder = '"' + "X" * (len(token) - 2) + '"' if token else None  # the same length: the framing holds
    events = json.loads(json.dumps(wire.decode(reply).meta["events"]))
    for event in events:
        if field in event:
            event[field] = placeholder[1:-1] if token else value
    payload = _rewrite(reply, events=events)
    return payload.replace(placeholder.encode(), token.encode()) if token else payload


def _limits(kind: str, open_s: float) -> dict[str, float]:
    cls = EVENT_TYPES[kind]
    return HOST.limits(cls(0, 0, 0) if kind == "compute" else cls(0, 0, 0, 0), open_s)


@pytest.mark.parametrize("round_index", [0, 30, 59])
@pytest.mark.parametrize("field", list(BOUNDED_FIELDS))
def test_a_measured_field_beyond_its_bound_is_refused_in_one_line_and_charged_the_bound(
        field, round_index, profiled, tmp_path, monkeypatch, caplog):
    def tamper(sender, msg, reply):
        if sender == NODE and msg.kind == protocol.ROUND and msg.round == round_index:
            return [(_set(reply, field, 1e308), 0)]
        return [(reply, 0)]

    with caplog.at_level(logging.WARNING, logger="testbed.orchestration.coordinator"):
        result, ledgers = _run(DP_PASGD, tmp_path, monkeypatch, _no_report_from(NODE, tamper))
    assert result.summary["status"] == "completed"
    assert result.summary["nodes"][str(NODE)]["rounds_straggled"] == 1
    refusals = [r.getMessage() for r in caplog.records if "beyond its bound" in r.getMessage()]
    assert len(refusals) == 1 and f"node {NODE} for round {round_index}" in refusals[0], refusals
    charged = [getattr(e, field) for e in read_ledger(result.run_dir / "ledger.csv")
               if e.node == NODE and e.round == round_index and hasattr(e, field)]
    # at the bound: that of a reply that came at once, up to that of one a round's timeout later
    assert charged and all(min(_limits(kind, 0.0).get(field, math.inf) for kind in ("compute", "communication"))
                           <= value <= max(_limits(kind, 0.5).get(field, 0.0) for kind in ("compute", "communication"))
                           for value in charged), charged
    assert under_counts(result.summary, ledgers) == []  # the node never reported its ledger


@pytest.mark.parametrize("field", list(BOUNDED_FIELDS))
def test_a_measured_field_just_inside_its_bound_is_taken(field, profiled, tmp_path, monkeypatch):
    inside = 0.5 * min(_limits(kind, 0.0).get(field, math.inf) for kind in ("compute", "communication"))

    def tamper(sender, msg, reply):
        if sender == NODE and msg.kind == protocol.ROUND and msg.round in (0, 59):
            return [(_set(reply, field, inside), 0)]
        return [(reply, 0)]

    result, ledgers = _run(DP_PASGD, tmp_path, monkeypatch, tamper)
    assert result.summary["nodes"][str(NODE)]["rounds_straggled"] == 0
    assert inside in [getattr(e, field) for e in read_ledger(result.run_dir / "ledger.csv")
                      if e.node == NODE and e.round == 59 and hasattr(e, field)]


@pytest.mark.parametrize("algorithm", ["dp_pasgd", "fedavg", "acfl", "padpfl", "dwfl"])
@pytest.mark.parametrize("field", ["compute_s", "energy_j"])
def test_in_sim_a_cost_models_figure_beyond_its_bound_is_charged_the_bound(algorithm, field, tmp_path, monkeypatch,
                                                                          caplog):
    """Sim's costs come from the testbed's own model, through the same bounds: a figure no board
    can have spent in the round (a broken model) is logged and charged at the bound, not summed."""
    from nodes.costs import NodeCosts
    from test_algorithm_contract import _text

    charge = NodeCosts.charge_modelled
    monkeypatch.setattr(NodeCosts, "charge_modelled", lambda self, events, host_cpu_s: [
        e.__class__(**{**e.__dict__, field: 1e300}) if e.kind == "compute" else e
        for e in charge(self, events, host_cpu_s)])
    config = load_config_text(_text(algorithm))
    with caplog.at_level(logging.WARNING, logger="testbed.orchestration.sim_nodes"):
        result = run_experiment(replace(config, run={"mode": "sim"}), out_dir=tmp_path / "run", quiet=True)
    assert result.summary["status"] == "completed"
    assert any("beyond its bound" in r.getMessage() for r in caplog.records)
    figures = [n[field] for n in result.summary["nodes"].values()]
    assert all(0 < value < 1e9 for value in figures), figures
    assert "Infinity" not in (result.run_dir / "summary.json").read_text()


@pytest.mark.parametrize("name", CASES)
@settings(max_examples=6, phases=[Phase.explicit, Phase.reuse, Phase.generate])  # a whole run an example
@given(data=st.data())
def test_any_value_of_any_measured_field_is_taken_within_its_bound_else_refused_and_charged(
        name, data, profiled, monkeypatch, tmp_path):
    config, rounds = _config(name), _rounds(name)
    node = data.draw(st.sampled_from(range(5)), label="node")
    round_index = data.draw(st.sampled_from([0, rounds // 2, rounds - 1]), label="round")
    field = data.draw(st.sampled_from(list(BOUNDED_FIELDS)), label="field")
    least, most = (min(_limits(kind, at).get(field, math.inf) for kind in ("compute", "communication"))
                   for at in (0.0, 60.0))
    value = data.draw(st.one_of(HOSTILE, st.floats(), st.sampled_from(
        [0.0, least / 2, least * (1 - 1e-9), most * (1 + 1e-9), math.nextafter(most, math.inf) * 2])), label="value")
    try:
        number = FIELD_RULES[field].check(field, value)
    except ValueError:
        number = math.inf

    has_field = []

    def tamper(sender, msg, reply):
        if sender == node and msg.kind == protocol.ROUND and msg.round == round_index:
            has_field.append(any(field in e for e in wire.decode(reply).meta["events"]))
            return [(_set(reply, field, value), 0)]
        return [(reply, 0)]

    with loopback(monkeypatch, list(range(5)), tamper) as nodes:
        result = run_experiment(config, out_dir=tmp_path / f"r{next(_runs)}", quiet=True)
    summary = result.summary
    assert summary["status"] == "completed", summary.get("failure")
    assert under_counts(summary, [a.ledger(config.mqtt.run_id, nodes.session) for a in nodes.agents.values()]) == []
    assert [n for n in range(5) if n != node and summary["nodes"][str(n)]["rounds_straggled"]] == []
    if number <= least or not any(has_field):
        assert summary["nodes"][str(node)]["rounds_straggled"] == 0
    elif number > most:
        assert summary["nodes"][str(node)]["rounds_straggled"] == 1
