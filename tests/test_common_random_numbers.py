"""Common random numbers (docs/statistics.md): runs of one seed whose settings differ in a learning
rate, a noise scale or a budget share their data, initial model, batches and noise draws, so a
paired comparison by seed measures the setting; the settings the docs say break the pairing do."""

import numpy as np
import pytest

from testbed.algorithms.batches import uniform_batches
from testbed.assembly.config import load_config_text, replace
from testbed.orchestration.runner import load, run_experiment
from testbed.streams.rng import GLOBAL, Purpose, stream


def _draws(config, round_index=1):
    """What a run of ``config`` draws before learning: training rows, initial model, and the
    mini-batches of round ``round_index``."""
    data, model = load(config)
    params0 = model.init(stream(config.run.seed, GLOBAL, -1, Purpose.INIT))
    batches = uniform_batches(data.train, list(data.node_ids), round_index, config.run.seed,
                              config.dp_pasgd.tau, config.dp_pasgd.batch)
    return data.train.x, data.train.y, params0, batches


@pytest.fixture
def base(small_config_text):
    return load_config_text(small_config_text)


@pytest.mark.parametrize("change", [{"dp_pasgd": {"lr": 0.05}}, {"dp_pasgd": {"sigma": 3.0}},
                                    {"budget": {"epsilon": 2.0}}, {"privacy": {"delta": 1e-3}}])
def test_settings_that_keep_the_draws(base, change):
    for a, b in zip(_draws(base), _draws(replace(base, **change))):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("change", [{"data": {"samples_per_node": 60}}, {"data": {"num_nodes": 3}}])
def test_data_size_or_nodes_break_the_data_and_batches(base, change):
    x, y, _, batches = _draws(base)
    x2, y2, _, batches2 = _draws(replace(base, **change))
    rows = min(len(x), len(x2))
    assert x.shape != x2.shape or not np.array_equal(x[:rows], x2[:rows])
    assert batches.shape != batches2.shape or not np.array_equal(batches, batches2)


def test_tau_breaks_the_batches_and_a_smaller_batch_is_nested_in_a_larger(base):
    # Step s of a run draws row s mod τ of round s // τ's keys: steps 5-9 are round 1's first five
    # rows at τ = 5, round 0's last five at τ = 10 (the first τ steps are common).
    _, _, _, five = _draws(base, round_index=1)
    _, _, _, ten = _draws(replace(base, dp_pasgd={"tau": 10, "steps": 20}), round_index=0)
    assert not np.array_equal(five, ten[:, 5:])
    assert np.array_equal(_draws(base, round_index=0)[3], ten[:, :5])
    _, _, _, small = _draws(replace(base, dp_pasgd={"batch": 4}))
    assert all(set(s) <= set(f) for s, f in zip(small.reshape(-1, 4).tolist(), five.reshape(-1, 8).tolist()))


def _final_params(config, tmp_path, name):
    config = replace(config, privacy={"tight_accountant": "none"})
    return np.load(run_experiment(config, out_dir=tmp_path / name, quiet=True).run_dir / "final_params.npy")


def test_a_nudged_learning_rate_or_noise_scale_nudges_the_run(base, tmp_path):
    """Every draw of a run is shared when lr or σ change: a run with them changed by 1e-9 ends 1e-9
    away from the run without, not a fresh draw away (as one with another seed does)."""
    reference = _final_params(base, tmp_path, "ref")
    other_seed = _final_params(replace(base, run={"seed": 2}), tmp_path, "seed")
    assert np.abs(other_seed - reference).max() > 1e-3
    for key, value in (("lr", 0.5 + 1e-9), ("sigma", 1.0 + 1e-9)):
        nudged = _final_params(replace(base, dp_pasgd={key: value}), tmp_path, key)
        assert np.abs(nudged - reference).max() < 1e-6, key
