pytest_plugins = ["conftest_mqtt", "conftest_firmware"]

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
ADULT = REPO.parent / "shared" / "datasets" / "adult" / "adult.data"


@pytest.fixture
def small_config_text():
    """A fast DP-PASGD experiment: 4 synthetic nodes, no figures."""
    return """
[run]
name = "t"
seed = 1
[data]
dataset = "synthetic"
num_nodes = 4
samples_per_node = 80
dim = 8
[dp_pasgd]
steps = 20
tau = 5
batch = 8
lr = 0.5
sigma = 1.0
lipschitz = 1.0
[output]
figures = false
"""


@pytest.fixture
def small_config_file(tmp_path, small_config_text):
    path = tmp_path / "exp.toml"
    path.write_text(small_config_text)
    return path
