"""Per-node work split over two threads (testbed.util.parallel) gives the values one thread gives:
each node draws from its own stream, whatever thread runs it."""

from __future__ import annotations

import numpy as np
import pytest

import testbed.util.parallel as parallel
from testbed.algorithms.batches import uniform_batches
from testbed.assembly.config import load_config_text
from testbed.data.synthetic import make_logistic
from testbed.orchestration.runner import run_experiment

SMALL = """
[data]
num_nodes = 9
samples_per_node = 60
dim = 7
[dp_pasgd]
steps = 6
tau = 3
batch = 8
sigma = 1.0
[output]
figures = false
[privacy]
tight_accountant = "none"
"""


def _everything(tmp_path, name: str) -> tuple[np.ndarray, ...]:
    """A data set, a round's batches and a short run's final model."""
    data = make_logistic(num_nodes=9, samples_per_node=60, dim=7, seed=3)
    batches = uniform_batches(data.train, list(range(9)), round_index=2, seed=3, steps=4, batch=8)
    result = run_experiment(load_config_text(SMALL), out_dir=tmp_path / name, quiet=True)
    return data.train.x, data.train.y, batches, np.load(result.run_dir / "final_params.npy")


def test_data_batches_and_a_run_do_not_depend_on_the_threads(tmp_path, monkeypatch):
    monkeypatch.setattr(parallel.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(parallel, "MIN_NUMBERS", 10**18)  # one thread
    single = _everything(tmp_path, "one")
    monkeypatch.setattr(parallel, "MIN_NUMBERS", 0)  # two threads, whatever the size
    for a, b in zip(single, _everything(tmp_path, "two")):
        np.testing.assert_array_equal(a, b)


def test_an_error_in_either_half_reaches_the_caller_after_both_halves_ended(monkeypatch):
    monkeypatch.setattr(parallel.os, "cpu_count", lambda: 2)
    done = []

    def work(lo, hi):
        if lo == 0:
            raise ValueError("first half")
        done.append((lo, hi))

    with pytest.raises(ValueError, match="first half"):
        parallel.split_work(4, work, numbers=10**9)
    assert done == [(2, 4)]
