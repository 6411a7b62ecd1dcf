"""The ACFL benchmark's statistic (benchmarks/acfl.py): each MQTT run against the sim runs that
bracket it, so that a drift of the machine's speed does not set a fast sim against a slow MQTT run."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from acfl import bracketed_ratios, own_brackets  # noqa: E402


def test_a_linear_drift_cancels():
    # The machine slows down linearly: every run takes 10% longer than the one before it, and an
    # MQTT run always costs 4 sim runs of its moment.
    speed = [1.0 + 0.1 * k for k in range(7)]  # sim, MQTT, sim, MQTT, sim, MQTT, sim
    sim = [0.8 * speed[k] for k in (0, 2, 4, 6)]
    mqtt = [4 * 0.8 * speed[k] for k in (1, 3, 5)]
    assert bracketed_ratios(sim, mqtt) == pytest.approx([4.0, 4.0, 4.0], abs=1e-12)


def test_each_mqtt_run_needs_a_sim_run_on_both_sides():
    with pytest.raises(ValueError, match="2 MQTT runs need 3 sim runs"):
        bracketed_ratios([1.0, 1.0], [4.0, 4.0])


def test_against_each_side_is_bracketed_by_its_own_sim_runs():
    """--against REV: this tree's sim, MQTT, sim, then REV's; a side's ratios use its own sims, and
    the same linear drift cancels."""
    speed = [1.0 + 0.1 * k for k in range(12)]  # two pairs of (sim, MQTT, sim) per side, alternated
    this = ([0.8 * speed[k] for k in (0, 2, 6, 8)], [4 * 0.8 * speed[k] for k in (1, 7)])
    rev = ([0.8 * speed[k] for k in (3, 5, 9, 11)], [5 * 0.8 * speed[k] for k in (4, 10)])
    assert own_brackets(*this) == pytest.approx([4.0, 4.0], abs=1e-12)
    assert own_brackets(*rev) == pytest.approx([5.0, 5.0], abs=1e-12)
    with pytest.raises(ValueError, match="2 MQTT runs need 4 sim runs of their own"):
        own_brackets([1.0, 1.0, 1.0], [4.0, 4.0])
