"""Every ledger event field checked against its range (ledger.csv rows and events off the wire),
accountants that never raise on an absurd σ, the ledger writer's running digest, and a NodeLedger
that keeps totals, not events."""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from testbed.ledger.events import (EVENT_TYPES, ComputeEvent, CommunicationEvent, GaussianEvent, MutualInfoEvent,
                                   with_fields)
from testbed.ledger.fields import FIELD_RULES, MEASURED_FIELDS, event_as_planned, event_from_dict, event_to_dict
from testbed.ledger.files import LEDGER_COLUMNS, LedgerWriter, read_ledger
from testbed.ledger.node import NodeLedger, RoundSet
from testbed.privacy.accountants import epsilon
from testbed.privacy.accountants.zcdp import gaussian_rho, rho_to_epsilon

from conftest import require_module

GOOD = {
    "compute": event_to_dict(ComputeEvent(node=1, round=2, local_steps=5, cost_units=5.0, compute_s=0.1,
                                          energy_j=0.2)),
    "communication": event_to_dict(CommunicationEvent(node=1, round=2, bytes_up=100, bytes_down=100,
                                                      cost_units=1.0, airtime_s=0.01, energy_j=0.1)),
    "privacy": event_to_dict(GaussianEvent(node=1, round=2, sigma=1.0, sensitivity=0.25, count=5,
                                           sampling="poisson", sampling_rate=0.1, adjacency="add_remove")),
}

# (field, hostile value): each must be refused with a ValueError naming the field.
HOSTILE = [
    ("node", -1), ("node", True), ("node", 1.5), ("node", "1.5"), ("node", "1e3"), ("node", 2**70),
    ("node", None), ("node", [1]), ("round", -3), ("round", "x"),
    ("local_steps", -1), ("local_steps", False),
    ("cost_units", -96400.0), ("cost_units", "-96400"), ("cost_units", math.nan), ("cost_units", math.inf),
    ("cost_units", "nan"), ("cost_units", "inf"), ("cost_units", True), ("cost_units", {"a": 1}),
    ("compute_s", -0.1), ("compute_s", "1" * 400), ("energy_j", -1e-9), ("energy_j", -math.inf),
    ("airtime_s", math.nan), ("bytes_up", -1), ("bytes_up", 1.0), ("bytes_down", "-5"),
    ("measured", 1), ("measured", "yes"), ("measured", None),
    ("sigma", -1.0), ("sigma", math.nan), ("sigma", math.inf), ("sigma", 1e300), ("sigma", "1e300"),
    ("sensitivity", 0.0), ("sensitivity", -0.5), ("sensitivity", math.inf), ("sensitivity", 1e300),
    ("count", 0), ("count", -5), ("count", True), ("count", 2.0),
    ("sampling_rate", 0.0), ("sampling_rate", 1.5), ("sampling_rate", -0.1), ("sampling_rate", math.nan),
    ("adjacency", "replace_two"), ("adjacency", 1), ("sampling", "sometimes"), ("sampling", None),
]


def _kind_of(field: str) -> str:
    return next(k for k, cls in EVENT_TYPES.items() if field in {f.name for f in dataclasses.fields(cls)})


@pytest.mark.parametrize("field,value", HOSTILE, ids=[f"{f}={v!r}"[:40] for f, v in HOSTILE])
def test_hostile_field_is_refused_naming_it(field, value):
    event = dict(GOOD[_kind_of(field)], **{field: value})
    with pytest.raises(ValueError, match=field) as info:
        event_from_dict(event)
    assert "\n" not in str(info.value) and len(str(info.value)) < 200


@pytest.mark.parametrize("hostile", [
    None, [], "compute", 5, {}, {"kind": "bribe"}, {"kind": ["compute"]},
    dict(GOOD["compute"], extra_field=1),  # an unknown field
    dict(GOOD["compute"], sigma=1.0),  # another kind's field, not empty
    {k: v for k, v in GOOD["privacy"].items() if k != "sigma"},  # a missing field
])
def test_hostile_event_dict_is_refused(hostile):
    with pytest.raises(ValueError):
        event_from_dict(hostile)


PLANS = [event_from_dict(good) for good in GOOD.values()] + [MutualInfoEvent(node=1, round=-1, epsilon_nats=10.05)]


@pytest.mark.parametrize("planned", PLANS, ids=[e.kind for e in PLANS])
def test_a_node_event_is_its_plan_but_for_what_the_node_measures(planned):
    measured = {name: (True if name == "measured" else 0.75) for name in MEASURED_FIELDS
                if hasattr(planned, name)}
    event = event_as_planned(dict(event_to_dict(planned), **measured), planned)
    assert event == dataclasses.replace(planned, **measured)
    for name in (f.name for f in dataclasses.fields(planned)):
        if name in MEASURED_FIELDS:
            with pytest.raises(ValueError, match=name):  # the rules still hold: finite, >= 0, a bool
                event_as_planned(dict(event_to_dict(planned), **{name: -1.0 if name != "measured" else 1}), planned)
            continue
        value = getattr(planned, name)
        other = (value + 1 if isinstance(value, (int, float)) and not isinstance(value, bool)
                 else "add_remove" if value != "add_remove" else "replace_one")
        with pytest.raises(ValueError, match=f"{name} = .*the plan says"):
            event_as_planned(dict(event_to_dict(planned), **{name: other}), planned)


@pytest.mark.parametrize("value, taken", [(0.0, 0.0), (2.5e-3, 2.5e-3), (3, 3.0), (-0.0, 0.0), (float("nan"), None),
                                          (float("inf"), None), (-1e-300, None), (True, None), ("0.5", 0.5)])
def test_a_measured_seconds_or_joules_value_is_taken_as_its_rule_takes_it(value, taken):
    """The inline check of a measured value (a float from zero up) takes what the field's rule takes,
    converted as the rule converts it, and refuses what it refuses."""
    planned = ComputeEvent(node=0, round=2, local_steps=1)
    raw = dict(event_to_dict(planned), compute_s=value)
    if taken is None:
        with pytest.raises(ValueError, match="compute_s"):
            event_as_planned(raw, planned)
        return
    got = event_as_planned(raw, planned).compute_s
    assert got == taken and type(got) is float


@pytest.mark.parametrize("event", PLANS, ids=[e.kind for e in PLANS])
def test_with_fields_is_dataclasses_replace(event):
    cls = type(event)
    assert not hasattr(cls, "__post_init__") and not hasattr(cls, "__slots__")  # what with_fields relies on
    for name in (f.name for f in dataclasses.fields(cls)):
        value = getattr(event, name)
        other = not value if isinstance(value, bool) else value * 2 + 1 if isinstance(value, (int, float)) else value
        changes = {"node": 7, name: other}
        changed = with_fields(event, **changes)
        assert changed == dataclasses.replace(event, **changes) and type(changed) is cls
        assert hash(changed) == hash(dataclasses.replace(event, **changes))
        with pytest.raises(dataclasses.FrozenInstanceError):
            changed.node = 8
    assert with_fields(event) == event and with_fields(event) is not event
    with pytest.raises(TypeError, match="no field 'colour'"):
        with_fields(event, colour="red")


def test_a_bool_is_not_the_int_the_plan_says():
    planned = dataclasses.replace(event_from_dict(GOOD["privacy"]), count=1)
    with pytest.raises(ValueError, match="count = True"):
        event_as_planned(dict(event_to_dict(planned), count=True), planned)  # True == 1 in Python


def test_a_lower_mutual_information_than_planned_is_refused():
    planned = MutualInfoEvent(node=3, round=-1, epsilon_nats=10.05)
    with pytest.raises(ValueError, match="epsilon_nats = 0.1, the plan says 10.05"):
        event_as_planned(dict(event_to_dict(planned), epsilon_nats=0.1), planned)


@pytest.mark.parametrize("hostile", [
    None, [], {"kind": "compute"}, dict(GOOD["privacy"], kind="compute"),
    dict(GOOD["privacy"], extra_field=1), {k: v for k, v in GOOD["privacy"].items() if k != "sigma"},
])
def test_a_node_event_of_another_shape_than_its_plan_is_refused(hostile):
    with pytest.raises(ValueError) as info:
        event_as_planned(hostile, event_from_dict(GOOD["privacy"]))
    assert "\n" not in str(info.value) and len(str(info.value)) < 300


def test_good_events_round_trip_through_dicts_and_csv_strings():
    for good in GOOD.values():
        event = event_from_dict(good)
        assert event_to_dict(event) == good
        as_csv = {k: str(v) for k, v in good.items()}  # a ledger.csv row is all strings
        assert event_from_dict(as_csv) == event
    assert event_from_dict(dict(GOOD["privacy"], sigma=0.0)).sigma == 0.0  # no noise: allowed, ε = inf
    assert event_from_dict(dict(GOOD["compute"], node=np.int64(3))).node == 3


def test_every_field_of_every_event_kind_has_a_rule_of_its_type():
    for cls in EVENT_TYPES.values():
        for f in dataclasses.fields(cls):
            assert f.name in FIELD_RULES, f"{cls.__name__}.{f.name} has no rule"
            assert FIELD_RULES[f.name].type.__name__ == (f.type if isinstance(f.type, str) else f.type.__name__)


def test_read_ledger_names_the_bad_line(tmp_path):
    path = tmp_path / "ledger.csv"
    w = LedgerWriter(path)
    w.write([ComputeEvent(node=0, round=0, local_steps=1)])
    w.close()
    row = ["compute", "0", "1", "1", "-96400.0", "0.0", "0.0", "False"]
    path.write_text(path.read_text() + ",".join(row + [""] * (len(LEDGER_COLUMNS) - len(row))) + "\r\n")
    with pytest.raises(ValueError, match="line 3.*cost_units"):
        list(read_ledger(path))
    path.write_text(path.read_text()[:-3])  # cut mid-line
    with pytest.raises(ValueError, match="cut"):
        list(read_ledger(path))


@pytest.mark.parametrize("sigma,expected", [(1e300, 0.0), (1e200, 0.0), (math.inf, 0.0), (0.0, math.inf),
                                            (-1.0, math.inf), (math.nan, math.inf)])
def test_accountants_never_raise_on_an_absurd_sigma(sigma, expected):
    tally = Counter({(sigma, 0.0625, "replace_one", "none", 1.0): 10})
    assert epsilon("zcdp", tally, 1e-5) == pytest.approx(expected, abs=1e-30)
    assert gaussian_rho(1e300, 1e-300) == math.inf and rho_to_epsilon(math.nan, 1e-5) == math.inf


@pytest.mark.parametrize("kind", ["rdp", "pld"])
def test_tight_accountants_take_a_huge_sigma_as_no_loss(kind):
    require_module("dp_accounting", "accounting")
    tally = Counter({(1e300, 0.0625, "replace_one", "none", 1.0): 10})
    assert epsilon(kind, tally, 1e-5) == pytest.approx(0.0, abs=1e-6)


def test_writer_mark_is_the_digest_of_the_file_and_survives_reopening(tmp_path):
    path = tmp_path / "ledger.csv"
    w = LedgerWriter(path)
    w.write([ComputeEvent(node=n, round=0, local_steps=1) for n in range(3)])
    w.write([])
    m1 = w.mark()
    w.close()
    data = path.read_bytes()
    assert (m1.rows, m1.size_bytes, m1.sha256) == (3, len(data), hashlib.sha256(data).hexdigest())
    w = LedgerWriter(path)  # a resumed run carries the digest on
    w.write([ComputeEvent(node=0, round=1, local_steps=1)])
    m2 = w.mark()
    assert m2.rows == 4 and m2.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()


def test_node_ledger_keeps_no_events_only_totals():
    led = NodeLedger(node=0)
    for r in range(1000):
        led.extend([ComputeEvent(0, r, 2, 2.0, energy_j=float(r % 7)),
                    GaussianEvent(0, r, 1.0, 0.1, 2)])
    assert not hasattr(led, "events")
    assert led.totals.local_steps == 2000 and sum(led.privacy.values()) == 2000
    assert led.rounds_logged.intervals == [[0, 1000]] and len(led.round_energy_j) <= 4
    assert led.max_round_energy_j == 6.0
    assert led.has_round(999) and not led.has_round(1000)


def test_late_energy_of_a_folded_round_never_lowers_the_forecast():
    led = NodeLedger(node=0)
    for r in range(10):
        led.extend([ComputeEvent(0, r, 1, energy_j=1.0)])
    led.extend([CommunicationEvent(0, 0, 1, 1, energy_j=5.0)])  # round 0 is long folded
    assert led.max_round_energy_j >= 6.0


def test_round_set_matches_a_set():
    rng = np.random.default_rng(0)
    rs, ref = RoundSet(), set()
    for r in rng.integers(0, 200, 400):
        rs.add(int(r))
        ref.add(int(r))
    assert all((r in rs) == (r in ref) for r in range(-5, 210)) and len(rs) == len(ref)
    assert all(a[1] < b[0] for a, b in zip(rs.intervals, rs.intervals[1:]))  # disjoint, not touching


@given(held=st.lists(st.integers(-1, 60), max_size=40),
       cuts=st.lists(st.integers(-1, 62), max_size=12, unique=True), touching=st.booleans())
@settings(max_examples=300, deadline=None)
def test_round_set_missing_is_the_rounds_it_does_not_hold(held, cuts, touching):
    """RoundSet.missing walks two interval lists: it must name exactly the reported rounds (sorted,
    disjoint, touching intervals as a ledger report's) that a lookup per round finds missing."""
    rs = RoundSet()
    for r in held:
        rs.add(r)
    edges = sorted(cuts)
    pairs = zip(edges, edges[1:]) if touching else zip(edges[::2], edges[1::2])  # [a, b), [b, c)... or gaps
    intervals = [(a, b) for a, b in pairs if a < b]
    reported = [r for start, stop in intervals for r in range(start, stop)]
    assert list(rs.missing(intervals)) == [r for r in reported if r not in rs]
