"""The coordinator's fast path for a reply's events (testbed.orchestration.reply_checks: a round
whose nodes' plans are one plan but for the node field, checked against that plan and the least
bounds) takes a reply only as the long path takes it: the plan of ``planned_events`` and
``event_within`` at the smallest window, which every later window's bounds contain. Searched by
Hypothesis over ACFL's rounds (its plans are alike) with honest and altered replies."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from testbed.algorithms.contract import RoundContext
from testbed.assembly import assemble
from testbed.assembly.assemble import load_data, model_for
from testbed.assembly.config import load_config
from testbed.ledger.events import with_fields
from testbed.ledger.fields import event_to_dict, event_within
from testbed.mqtt import wire
from testbed.orchestration.coordinator import MqttNodes
from testbed.rounds import protocol


@pytest.fixture(scope="module")
def nodes() -> MqttNodes:
    config = load_config("benchmarks/acfl.toml")
    data = load_data(config.data, 0)
    alg = assemble.build_algorithm(config, model_for(config.model, data, 0), data)
    nodes = MqttNodes.__new__(MqttNodes)  # its reply checks only: no broker, no hosts
    nodes._init_bookkeeping(config.mqtt.model_copy(update={"run_id": "r"}), config.nodes, "", list(range(100)),
                            alg, seed=0)
    return nodes


ALTERED = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(
    [0, 1, -1.0, 1e308, math.inf, True, False, None, "1", [], 2.0, 7.0, 1e-9]))


@settings(max_examples=200)
@given(round_index=st.integers(0, 1000), asked=st.lists(st.integers(0, 99), min_size=1, max_size=20, unique=True),
       data=st.data())
def test_the_fast_path_takes_a_reply_as_the_long_path_does(nodes, round_index, asked, data):
    ctx = RoundContext(round_index, 0, 100, tuple(sorted(asked)))
    nodes._remember(ctx)
    node = data.draw(st.sampled_from(asked), label="node")
    planned = nodes.alg.planned_events(node, ctx)
    raw = [{**event_to_dict(e), **({"compute_s": 1e-5, "energy_j": 1e-4} if e.kind == "compute" else {})}
           for e in planned]
    for _ in range(data.draw(st.integers(0, 2), label="alterations")):
        values = raw[data.draw(st.integers(0, len(raw) - 1), label="event")]
        name = data.draw(st.sampled_from(sorted(values)), label="field")
        values[name] = data.draw(ALTERED, label="value")
    if data.draw(st.booleans(), label="another node's plan"):
        other = data.draw(st.integers(0, 120), label="named node")
        for values in raw:
            values["node"] = other
    fast = nodes._as_planned(node, ctx, raw)
    bounds = nodes._bounds.get(node)
    long = [event_within(values, want, bounds.limits(want, 0.0)) if isinstance(values, dict) else None
            for values, want in zip(raw, planned)] if not _malformed(raw, planned) else None
    if fast is not None:
        assert long is not None and all(problems == [] for _, problems in long)
        assert [(type(e), e.__dict__) for e in fast] == [(type(e), e.__dict__) for e, _ in long]
        assert [[(k, type(v)) for k, v in e.__dict__.items()] for e in fast] == \
            [[(k, type(v)) for k, v in e.__dict__.items()] for e, _ in long]


def _malformed(raw, planned) -> bool:
    """Whether event_within raises (not the plan in a field it does not measure)."""
    try:
        for values, want in zip(raw, planned):
            event_within(values, want, {})
    except ValueError:
        return True
    return False


def test_an_honest_reply_takes_the_fast_path_and_a_setup_or_a_stranger_does_not(nodes):
    ctx = RoundContext(3, 0, 100, (1, 2, 5))
    nodes._remember(ctx)
    honest = [{**event_to_dict(e), **({"compute_s": 1e-5, "energy_j": 1e-4} if e.kind == "compute" else {})}
              for e in nodes.alg.planned_events(5, ctx)]
    events = nodes._as_planned(5, ctx, honest)
    assert events == [with_fields(e, **({"compute_s": 1e-5, "energy_j": 1e-4} if e.kind == "compute" else {}))
                      for e in nodes.alg.planned_events(5, ctx)]
    assert nodes._as_planned(4, ctx, honest) is None  # not asked this round
    assert nodes._as_planned(5, RoundContext(-1, 0, 100, (5,)), honest) is None  # the setup: its own plan
    msg = wire.decode(protocol.update("r", nodes.session, 3, 5, {"gradient": np.zeros((10, 10))}, events,
                                      metrics={"samples": 100.0}))
    assert nodes._bounded_events(5, ctx, msg) == (events, [])
