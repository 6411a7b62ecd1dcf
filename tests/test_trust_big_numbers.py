"""A number as a file or a message gives it may be an integer of any size: JSON and TOML both read
``1`` followed by 400 zeros as an ``int``, which ``float()`` refuses with an OverflowError and numpy's
``isfinite`` with a TypeError (past 2**63 already). Every check that says "a finite number"
(testbed.util.numbers.finite_real) refuses it in one line, never raises: a node's reply metrics
and refusal figures, a transmit notice's bound, a calibration file, summary.json as `testbed runs`,
`testbed report` and the watch page read it."""

from __future__ import annotations

import json
import math
import sys
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, strategies as st

from testbed.algorithms.contract import SAMPLES_METRIC, MetricSpec, check_metrics
from testbed.errors import UserError
from testbed.mqtt import wire
from testbed.orchestration.reply_checks import check_refusal
from testbed.planning.calibration import read_calibration
from testbed.reports import runs
from testbed.reports.summary_file import _wrong_field
from testbed.rounds.protocol import signal_spec_of
from testbed.util.numbers import finite_real
from testbed.watch.checks import summary_view

HUGE = [10**400, -10**400, 2**1024, 2**64, -2**63 - 1]
#: Any number a JSON or TOML reader gives, and a few things that are not numbers.
NUMBERS = st.one_of(st.sampled_from(HUGE), st.integers(), st.floats(), st.booleans(), st.none(),
                    st.text(max_size=4), st.fractions(), st.integers(-2**62, 2**62).map(np.int64),
                    st.floats(width=32).map(np.float32))


@given(NUMBERS)
def test_finite_real_is_the_float_a_real_number_is_used_as_or_none(value):
    got = finite_real(value)
    real = not isinstance(value, (bool, str, type(None)))
    if got is None:
        if real:  # a real that does not fit a finite float64: NaN, ±inf, or past its range
            assert not (abs(value) <= sys.float_info.max)  # Python compares an int and a float exactly
        return
    assert real and type(got) is float and math.isfinite(got) and got == float(value)


def test_finite_real_of_the_edges():
    assert [finite_real(v) for v in (10**400, 2**1023, True, "1", Fraction(1, 3), np.int64(7))] == \
        [None, float(2**1023), None, None, 1 / 3, 7.0]


def _message(**meta) -> wire.Message:
    return wire.Message(schema=1, run="r", round=0, sender="node-0", kind="x", msg_id="0" * 32, meta=meta,
                        tensors={}, size_bytes=0)


@given(NUMBERS)
def test_a_reply_metric_of_any_number_is_taken_or_refused_in_one_line(value):
    for spec in (SAMPLES_METRIC, MetricSpec(), MetricSpec(low=-math.inf)):
        problem = spec.problem(value)
        assert problem is None or "\n" not in problem
        if problem is None:
            assert finite_real(value) is not None
    problem = check_metrics({"samples": SAMPLES_METRIC}, {"samples": value})
    assert problem is None or problem.startswith("metric samples: ")


@given(NUMBERS, NUMBERS)
def test_a_refusals_figures_of_any_number_are_checked_not_raised_on(would_be, limit):
    msg = _message(budget="epsilon", would_be=would_be, limit=limit)
    if finite_real(would_be) is not None and finite_real(limit) is not None \
            and would_be.__class__ in (int, float) and limit.__class__ in (int, float):
        check_refusal(msg)
    else:
        with pytest.raises(wire.WireError):
            check_refusal(msg)


@given(NUMBERS)
def test_a_transmit_notices_bound_of_any_number_is_checked_not_raised_on(bound):
    msg = _message(signal_shape=[3], signal_dtype="float64", signal_max_norm=bound)
    if bound is not None and not (bound.__class__ in (int, float) and (finite_real(bound) or 0) > 0):
        with pytest.raises(wire.WireError):
            signal_spec_of(msg)
    else:
        spec = signal_spec_of(msg)
        assert spec.max_norm is None or math.isfinite(spec.max_norm)


@pytest.mark.parametrize("value", ["9" * 400, "-" + "9" * 400, "inf", "nan"])
def test_a_calibration_constant_past_float64_is_one_line(tmp_path, value):
    path = tmp_path / "cal.toml"
    path.write_text(f"[calibration]\nprofile = 'x'\nmodel_params = 10\n[c1]\njoules = {value}\nseconds = 1.0\n"
                    "[c2]\njoules = 1.0\nseconds = 1.0\n")
    with pytest.raises(UserError, match=r"c1\.joules") as caught:
        read_calibration(path)
    assert "\n" not in str(caught.value)


@given(NUMBERS)
def test_a_summarys_numbers_of_any_size_are_read_or_refused(value):
    assert runs._number(value) == finite_real(value)
    epsilon = runs._epsilon(value)
    assert epsilon is None or epsilon == "inf" or math.isfinite(epsilon)
    problem = _wrong_field({"algorithm": "x", "mode": "sim", "seed": 0, "status": "completed", "rounds": 3,
                            "nodes": {}, "budgets": {}, "final": {"train_loss": value}})
    if value is not None:
        assert (problem is None) == (finite_real(value) is not None)
    view = summary_view({"status": "completed", "rounds": 3, "nodes": {}, "wall_s": value, "setup_s": value,
                         "stopped": {"node": 0, "budget": "epsilon", "would_be": value, "limit": value}}
                        if isinstance(value, (int, float)) and not isinstance(value, bool) else
                        {"status": "completed", "rounds": 3, "nodes": {}})
    json.dumps(view, allow_nan=False)  # what the watch page sends is valid JSON
