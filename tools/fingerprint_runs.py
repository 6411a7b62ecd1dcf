"""Fingerprints of short runs of every paper's experiment, for a refactor that must not change results.

Runs the quickstart (sim and MQTT) and one short sim run of each algorithm, and prints one line per
run: a sha256 of its final parameters, its ledger.csv and its metrics.csv, leaving out what is
measured (seconds, joules, wall time), which differs from run to run. Run it before and after a
change and diff the two outputs: empty means bit-identical results.

    $ python tools/fingerprint_runs.py > before.txt   # on the old revision
    $ python tools/fingerprint_runs.py | diff before.txt -

Adult-based experiments read adult.data through $TESTBED_DATA (see testbed.data.adult).
"""

from __future__ import annotations

import csv
import hashlib
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

RUNS: dict[str, list[str]] = {
    "quickstart-sim": ["experiments/quickstart.toml", "--mode", "sim"],
    "quickstart-mqtt": ["experiments/quickstart.toml", "--mode", "mqtt"],
    "dp_pasgd": ["experiments/dp_pasgd/base.toml", "--mode", "sim", "--set", 'data.dataset="synthetic"',
                 "--set", "dp_pasgd.steps=20", "--set", "dp_pasgd.tau=5"],
    "dwfl": ["experiments/dwfl/base.toml", "--mode", "sim", "--set", "dwfl.rounds=5"],
    "acfl": ["experiments/acfl/base.toml", "--mode", "sim", "--set", "acfl.iterations=20"],
    "padpfl": ["experiments/padpfl/s1.toml", "--mode", "sim", "--set", "padpfl.rounds=6"],
    "fedavg": ["experiments/quickstart.toml", "--mode", "sim", "--set", 'run.algorithm="fedavg"'],
    "mcu": ["experiments/mcu_quickstart.toml", "--mode", "sim"],
}


def fingerprint(run_dir: Path) -> str:
    """sha256 (16 hex digits) of a run's final parameters and its CSVs without measured columns."""
    digest = hashlib.sha256()
    params = run_dir / "final_params.npy"
    if params.exists():
        digest.update(np.load(params, allow_pickle=False).tobytes())
    for name in ("metrics.csv", "ledger.csv"):
        with open(run_dir / name, newline="") as f:
            for row in csv.DictReader(f):
                kept = sorted((k, v) for k, v in row.items() if not k.endswith(("_s", "_j")))
                digest.update(repr(kept).encode())
    return digest.hexdigest()[:16]


def main() -> int:
    root = Path(__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory() as tmp:
        for name, args in RUNS.items():
            out = Path(tmp) / name
            done = subprocess.run([sys.executable, "-m", "testbed", "run", *args, "--quiet", "--out", str(out)],
                                  cwd=root, capture_output=True, text=True)
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            print(f"{name} {fingerprint(out) if done.returncode == 0 else 'FAILED: ' + last}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
