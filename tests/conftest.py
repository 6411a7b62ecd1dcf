pytest_plugins = ["conftest_mqtt", "conftest_firmware"]

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# Property-based tests (Hypothesis) at the trust boundaries: no deadline (a 2-core machine under a
# full suite times a single example anywhere from 1 to 100 ms), and a fixed number of examples so
# CI's time is bounded; `HYPOTHESIS_PROFILE=thorough` for a long local search. The examples
# database (.hypothesis/) stays out of git.
settings.register_profile("ci", max_examples=60, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
settings.register_profile("thorough", max_examples=2000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

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
