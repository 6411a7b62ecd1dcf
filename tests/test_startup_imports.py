"""A run imports the heavy libraries only where its experiment uses them (issue 44): torch and
Sionna (with mitsuba and Dr.Jit under it) took 4 of a 12-node DWFL run's 4.6 s before round 1,
though its Rayleigh fading is drawn without them (channel._torch_normal), and `testbed --version`
imported every command. Each case runs in a fresh interpreter, which reports what it imported."""

import json
import os
import subprocess
import sys

from conftest import REPO, repo_pythonpath

#: What no case below may import: seconds each at a start (mitsuba, drjit: Sionna RT's).
HEAVY = ("torch", "sionna", "mitsuba", "drjit", "tensorflow", "matplotlib")

# Runs `testbed ARGV` as the command line does (its main: the program leaves without returning),
# then prints which of HEAVY (and numpy) it imported.
CHILD = """
import json, sys
heavy = json.loads(sys.argv[2])
from testbed.cli import main
try:
    code = main(json.loads(sys.argv[1]))
except SystemExit as exit:  # argparse's --version
    code = exit.code
assert code in (0, None), code
print(json.dumps(sorted(m for m in (*heavy, "numpy") if m in sys.modules)))
"""

RING = """
[run]
name = "ring"
algorithm = "dwfl"
seed = 3
mode = "sim"
[data]
dataset = "synthetic"
num_nodes = 6
samples_per_node = 20
dim = 3
[dwfl]
rounds = 2
batch = 4
lr = 0.3
epsilon = 0.5
noise_power_w = 1e-9
fading = "rician"      # Rician's diffuse part is the Rayleigh draw
k_factor = 1.0
[topology]
kind = "ring"
[output]
figures = false
"""


def _imported(argv: list[str], watched: tuple[str, ...] = HEAVY) -> tuple[list[str], str]:
    done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(argv), json.dumps(watched)], capture_output=True,
                          text=True, cwd=REPO, env={**os.environ, "PYTHONPATH": repo_pythonpath()},
                          timeout=300)
    assert done.returncode == 0, done.stderr
    *out, imported = done.stdout.splitlines()
    return json.loads(imported), "\n".join(out)


def test_version_imports_no_command_nor_numpy():
    imported, out = _imported(["--version"])
    assert out.startswith("testbed ") and imported == []


def test_a_dwfl_ring_with_fading_imports_neither_torch_nor_sionna(tmp_path):
    experiment = tmp_path / "ring.toml"
    experiment.write_text(RING)
    imported, _ = _imported(["run", str(experiment), "--quiet", "--out", str(tmp_path / "r")])
    assert imported == ["numpy"]
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["algorithm_settings"]["fading"] == "rician"


def test_the_quick_start_in_sim_imports_none(tmp_path):
    imported, _ = _imported(["run", "experiments/quickstart.toml", "--mode", "sim", "--quiet", "--set",
                             "dp_pasgd.steps=20", "--set", "output.figures=false", "--out", str(tmp_path / "q")])
    assert imported == ["numpy"]


def test_a_sim_run_with_node_workers_leaves_numpy_ma_unimported(tmp_path):
    """np.unique imports numpy.ma (15 ms of J1's start): the rounds' bookkeeping does without it."""
    imported, _ = _imported(["run", "benchmarks/j1.toml", "--quiet", "--set", "run.workers=2", "--set",
                             "dp_pasgd.steps=30", "--set", "data.num_nodes=8", "--set", "output.figures=false",
                             "--out", str(tmp_path / "j")], watched=("numpy.ma",))
    assert imported == ["numpy"]
