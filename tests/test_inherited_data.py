"""testbed.assembly.inherited: a forked emulated host takes its nodes' rows from the data its
coordinator built, and they are the rows it would have made itself (sim == MQTT rests on it:
tests/test_algorithm_contract.py runs the forked hosts); any other experiment, a file of the host's
own, or a set whose few nodes' rows are not by construction theirs in the whole federation: None,
and the host loads as before."""

from __future__ import annotations

import numpy as np
import pytest

from testbed.assembly import inherited
from testbed.assembly.assemble import load_data, load_run_data
from testbed.assembly.config import load_config_text, replace

SYNTHETIC = """
[run]
name = "inherit"
seed = 3
[data]
dataset = "synthetic"
num_nodes = 7
samples_per_node = 40
dim = 5
[dp_pasgd]
steps = 4
tau = 2
batch = 4
"""


@pytest.fixture(autouse=True)
def _nothing_offered_after():
    yield
    inherited._offered = None


def _same(a, b) -> None:
    assert (a.node_ids, a.n_classes, a.name, a.node_names) == (b.node_ids, b.n_classes, b.name, b.node_names)
    for split in ("train", "test", "validation"):
        x, y = getattr(a, split), getattr(b, split)
        assert x.x.dtype == y.x.dtype
        np.testing.assert_array_equal(x.x, y.x)
        np.testing.assert_array_equal(x.y, y.y)
        np.testing.assert_array_equal(x.offsets, y.offsets)


@pytest.mark.parametrize("nodes", [[0, 1, 2], [4, 5, 6], [1, 3, 6], [5]])
def test_a_hosts_rows_of_the_offered_data_are_those_it_would_make(nodes):
    config = load_config_text(SYNTHETIC)
    inherited.offer(config, load_run_data(config))
    got = inherited.rows(config.data, config.run.seed, nodes)
    assert got is not None
    _same(got, load_data(config.data, config.run.seed, nodes=nodes))


def test_another_experiment_a_file_of_its_own_or_another_set_takes_nothing():
    config = load_config_text(SYNTHETIC)
    inherited.offer(config, load_run_data(config))
    assert inherited.rows(config.data, config.run.seed + 1, [0]) is None
    assert inherited.rows(replace(config, data={"dim": 6}).data, config.run.seed, [0]) is None
    assert inherited.rows(config.data, config.run.seed, [0], path="elsewhere.csv") is None
    assert inherited.rows(config.data, config.run.seed, [7]) is None  # not a node of the run
    # a set held whole whose nodes' rows are not made from their own streams, and a run that
    # holds only the evaluated nodes' test rows: nothing offered
    regression = replace(config, data={"dataset": "regression", "dim": 4, "outputs": 2},
                         run={"algorithm": "acfl"})
    inherited.offer(regression, load_run_data(regression))
    assert inherited.rows(regression.data, regression.run.seed, [0]) is None
    subset = replace(config, output={"eval_nodes": 2})
    inherited.offer(subset, load_run_data(subset))
    assert inherited.rows(subset.data, subset.run.seed, [0]) is None
