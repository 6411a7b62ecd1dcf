"""The physical bounds of a node's measured seconds and joules (testbed.orchestration.measured_bounds)
and what a value beyond one is charged (testbed.ledger.fields.event_within), searched by Hypothesis:

- an honest node's figures (its cost model's, from any CPU time its process can have had in the
  round's window; a bridged board's modelled ones; a channel model's planned ones) are within them;
- any other value of any measured field (1e308, inf, nan, negative, a string, just above or below
  the bound) is taken exactly when it is a finite number in [0, bound], else refused with one
  phrase naming the field and charged at the bound (never below the plan);
- a node whose profile is not known keeps the fixed caps of testbed.ledger.fields;
- the coordinator's fast path (planned_within against the least bounds) takes a reply's event only
  where event_within takes it as it is, at any window, and takes an honest one.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nodes.meters.clock import comm_cost, compute_cost
from testbed.devices.profiles import load_profile, mcu_profile_names, profile_names
from testbed.ledger.events import CommunicationEvent, ComputeEvent, with_fields
from testbed.ledger.fields import FIELD_RULES, MAX_EVENT_J, MEASURED_FIELDS, MAX_EVENT_S, event_to_dict, event_within, planned_within
from testbed.orchestration.measured_bounds import BOUNDED_FIELDS, SLACK_S, MeasuredBounds

PLANS = st.one_of(
    st.builds(ComputeEvent, node=st.integers(0, 99), round=st.integers(-1, 1000), local_steps=st.integers(0, 500)),
    st.builds(CommunicationEvent, node=st.integers(0, 99), round=st.integers(-1, 1000),
              bytes_up=st.integers(0, 10**8), bytes_down=st.integers(0, 10**8),
              # a channel model's planned airtime and joules (over-the-air DWFL)
              airtime_s=st.sampled_from([0.0, 1e-3, 2.5]), energy_j=st.sampled_from([0.0, 1e-2, 40.0])))
BOUNDS = st.one_of(
    st.builds(MeasuredBounds.of_profile, st.sampled_from(profile_names()), cores=st.integers(1, 64)),
    st.builds(MeasuredBounds.of_board, st.sampled_from(sorted(mcu_profile_names())), st.floats(0.0, 1e7)),
    st.just(MeasuredBounds()))
OPEN_S = st.floats(0.0, 3600.0)
HOSTILE = st.sampled_from([1e308, 1.7e308, math.inf, -math.inf, math.nan, -1.0, -1e-300, 2**70, "1", None, True,
                           [], {}])


def _fields(event) -> list[str]:
    return [name for name in BOUNDED_FIELDS if hasattr(event, name)]


@given(bounds=BOUNDS, planned=PLANS, open_s=OPEN_S, cpu_share=st.floats(0.0, 1.0))
def test_an_honest_nodes_figures_are_within_their_bounds(bounds, planned, open_s, cpu_share):
    """What a node's own cost model charges, from the CPU time its process can have had in the
    window (all its cores), is never refused: honest nodes are not straggled by their bounds."""
    limits = bounds.limits(planned, open_s)
    window_s = open_s + SLACK_S
    if bounds.device is None:
        assert limits == {name: MAX_EVENT_J if name == "energy_j" else MAX_EVENT_S for name in _fields(planned)}
        return
    if isinstance(planned, ComputeEvent):
        if bounds.board is not None:
            honest = bounds.board.measurement(steps=planned.local_steps, cycles=0, counter_hz=1, kind="model")
            seconds, joules = honest.seconds, honest.energy_j
        else:
            seconds, joules = compute_cost(cpu_share * bounds.cores * window_s, bounds.device)
        figures = {"compute_s": seconds, "energy_j": joules}
    elif planned.airtime_s or planned.energy_j:  # the channel's figures, kept as planned
        figures = {"airtime_s": planned.airtime_s, "energy_j": planned.energy_j}
    else:
        airtime_s, joules = comm_cost(planned.bytes_up, planned.bytes_down, bounds.device)
        figures = {"airtime_s": airtime_s, "energy_j": joules}
    for name, value in figures.items():
        capped = min(value, MAX_EVENT_J if name == "energy_j" else MAX_EVENT_S)  # beyond the caps: refused anyway
        assert capped <= limits[name] * (1 + 1e-12), (name, value, limits[name])


@given(bounds=BOUNDS, planned=PLANS, open_s=OPEN_S, data=st.data())
def test_a_measured_value_is_taken_within_its_bound_else_refused_and_charged_the_bound(bounds, planned, open_s, data):
    limits = bounds.limits(planned, open_s)
    name = data.draw(st.sampled_from(_fields(planned)), label="field")
    bound = limits[name]
    value = data.draw(st.one_of(HOSTILE, st.floats(allow_nan=True, allow_infinity=True),
                                st.sampled_from([bound, math.nextafter(bound, math.inf), math.nextafter(bound, 0.0),
                                                 bound * (1 + 1e-9), bound * (1 - 1e-9), 0.0])), label="value")
    values = {**event_to_dict(planned), name: value}
    event, problems = event_within(values, planned, limits)
    try:  # the field's rule (a finite number >= 0; a CSV cell's string of one), then its bound
        number = FIELD_RULES[name].check(name, value)
    except ValueError:
        number = math.inf
    if number <= bound:
        assert problems == [] and getattr(event, name) == number
    else:
        assert len(problems) == 1 and name in problems[0] and "\n" not in problems[0]
        assert getattr(event, name) == max(bound, getattr(planned, name))  # finite, never below the plan
    other = [n for n in _fields(planned) if n != name]
    assert all(getattr(event, n) == getattr(planned, n) for n in other)  # each field on its own


@given(planned=PLANS, open_s=OPEN_S, value=st.floats(min_value=0.0, max_value=1e308),
       already=st.floats(0.0, 100.0))
def test_without_a_profile_a_refused_field_is_charged_what_the_node_reported_before(planned, open_s, value, already):
    """The fixed caps (a day, a kilowatt) estimate nothing: a field beyond one is charged as a
    release whose events never came (the node's costliest such figure so far, else the plan)."""
    limits = MeasuredBounds().limits(planned, open_s)
    name = _fields(planned)[0]
    event, problems = event_within({**event_to_dict(planned), name: value}, planned, limits, {name: already})
    if value <= limits[name]:
        assert (problems, getattr(event, name)) == ([], value)
    else:
        assert getattr(event, name) == max(already, getattr(planned, name)) and len(problems) == 1


def test_the_bounds_follow_the_profile_and_the_window():
    pi = load_profile("pi-4b")
    bounds = MeasuredBounds.of_profile("pi-4b", cores=2)
    limits = bounds.limits(ComputeEvent(0, 3, local_steps=5), open_s=4.0)
    assert limits["compute_s"] == pytest.approx(pi.compute_time_factor * 2 * 5.0)
    assert limits["energy_j"] == pytest.approx((4 * pi.active_power_w + pi.radio_tx_power_w + pi.radio_rx_power_w)
                                               * limits["compute_s"])
    longer = bounds.limits(ComputeEvent(0, 3, local_steps=5), open_s=40.0)
    assert longer["compute_s"] > limits["compute_s"]
    # no window known (the round was not sent here): the fixed caps
    assert bounds.limits(ComputeEvent(0, 3, local_steps=5), open_s=math.nan) == {"compute_s": MAX_EVENT_S,
                                                                                 "energy_j": MAX_EVENT_J}


def _reply_values(planned, bounds: dict[str, tuple[float, ...]], data) -> dict:
    """``planned`` as a node's reply would carry it, one field changed the ways a reply can differ
    (a measured number at, just above or below one of its ``bounds``, or hostile; another field off the
    plan or of another JSON type), or a field missing or added, or another kind."""
    values = event_to_dict(planned)
    edit = data.draw(st.sampled_from(["measured"] * 4 + ["field"] * 2 + ["drop", "add", "kind"]), label="edit")
    if edit in ("measured", "field"):
        names = [n for n in values if n in MEASURED_FIELDS] if edit == "measured" else sorted(set(values) - {"kind"})
        name = data.draw(st.sampled_from(names), label="field")
        plan = values[name]
        near = [x for b in bounds.get(name, ()) for x in (b, math.nextafter(b, math.inf), math.nextafter(b, 0.0))]
        values[name] = data.draw(st.one_of(
            HOSTILE, st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(near + [0.0, -0.0, 0, 1]),
            st.sampled_from([int(plan), float(plan), plan + 1, "x", False] if isinstance(plan, (int, float))
                            else [plan + "x", 0, None])), label=name)
    elif edit == "drop":
        values.pop(data.draw(st.sampled_from(sorted(values)), label="dropped"))
    elif edit == "add":
        values["sigma"] = 1.0
    else:
        values["kind"] = "communication" if values["kind"] == "compute" else "compute"
    return values


@settings(max_examples=400)  # each a few microseconds: where the fast path and event_within could part
@given(bounds=BOUNDS, planned=PLANS, open_s=st.one_of(st.just(0.0), st.floats(0.0, 1e-3), OPEN_S), data=st.data())
def test_the_fast_path_takes_a_reply_only_as_event_within_takes_it(bounds, planned, open_s, data):
    """planned_within against the least bounds (a window that closes at once) returns an event only
    where event_within, at the reply's real window, returns that same event without a problem; where
    it returns None the coordinator asks event_within, so its decisions are event_within's."""
    least = bounds.least_limits(planned)
    assert least == bounds.limits(planned, 0.0)
    limits = bounds.limits(planned, open_s)
    assert all(limits[name] >= bound for name, bound in least.items())  # a bound only grows with the window
    values = _reply_values(planned, {name: (least[name], limits[name]) for name in least}, data)
    # The plan of a round planned once for all its nodes: compared for a node that is not the
    # template's (sometimes the one the reply names, sometimes not)
    node = data.draw(st.one_of(st.none(), st.just(planned.node + 1), st.integers(0, 120)), label="for node")
    if node is not None and data.draw(st.booleans(), label="reply names it"):
        values["node"] = node
    fast = planned_within(values, planned, least, node=node)
    if fast is not None:
        if node is not None:
            planned = with_fields(planned, node=node)
        event, problems = event_within(values, planned, limits)
        assert problems == []
        assert [(k, type(v), repr(v)) for k, v in fast.__dict__.items()] == \
            [(k, type(v), repr(v)) for k, v in event.__dict__.items()] and type(fast) is type(event)


@given(bounds=BOUNDS, planned=PLANS, data=st.data())
def test_the_fast_path_takes_an_honest_reply(bounds, planned, data):
    """A reply that is the plan, its measured numbers floats within their least bounds, is taken by
    the fast path (the coordinator's common case is not sent the long way)."""
    least = bounds.least_limits(planned)
    values = {**event_to_dict(planned),
              **{name: data.draw(st.floats(0.0, bound), label=name) for name, bound in least.items()},
              "measured": data.draw(st.booleans(), label="measured")}
    assert planned_within(values, planned, least) is not None
