"""At chance / at majority: a run's (and a REPORT row's) accuracy against the test set's majority share
(testbed.reports.majority, testbed.reports.stats.majority_flag), in `Run` and the HTML report."""

from __future__ import annotations

import numpy as np
import pytest

import testbed
from testbed.assembly.assemble import load_data
from testbed.assembly.config import load_config
from testbed.reports.html import write_report
from testbed.reports.majority import accuracy_flag, majority_share
from testbed.reports.stats import majority_flag

TINY = {"run": {"algorithm": "dp_pasgd", "seed": 3},
        "data": {"dataset": "synthetic", "num_nodes": 4, "samples_per_node": 80, "dim": 8},
        "dp_pasgd": {"steps": 20, "tau": 5, "batch": 8, "lr": 0.5, "sigma": 1.0, "clip": True, "lipschitz": 1.0},
        "privacy": {"tight_accountant": "none"}, "output": {"figures": False}}


def test_a_rows_flag_follows_its_interval_against_the_share():
    assert majority_flag([0.80, 0.81, 0.82], 0.77) == ""
    assert majority_flag([0.76, 0.78, 0.77], 0.77) == " ⚑ at majority"
    assert majority_flag([0.70, 0.71, 0.72], 0.77) == " ⚑ below majority"
    assert majority_flag([0.70], 0.77) == " ⚑ below majority"  # one value: its own interval


def test_the_share_is_the_training_majority_classs_share_of_each_nodes_test_rows(tmp_path):
    run = testbed.run(TINY, out=tmp_path / "r")
    data = load_data(load_config(run.dir / "config.toml").data, 3)
    majority = np.bincount(data.train.y).argmax()
    o = data.test.offsets
    by_hand = np.mean([np.mean(data.test.y[a:b] == majority) for a, b in zip(o[:-1], o[1:])])
    assert run.majority_share == pytest.approx(by_hand) == majority_share(data)
    accuracy = run.summary["final"]["test_accuracy"]
    assert run.accuracy_against_majority == accuracy_flag(accuracy, by_hand) != ""
    html = write_report(run.dir).read_text()
    assert f"{by_hand:.4f}: the final accuracy is {accuracy_flag(accuracy, by_hand)}" in html


def test_a_single_runs_flag_says_it_has_no_interval():
    assert accuracy_flag(0.5, 0.6) == "at or below the majority share"
    assert accuracy_flag(0.7, 0.6) == "above the majority share (one run: no interval)"
    assert accuracy_flag(0.7, None) == ""
