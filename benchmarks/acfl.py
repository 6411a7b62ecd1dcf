"""ACFL benchmark (issue 11): the paper's Sec. V setting in sim against its floor, and over MQTT.

1. Whole-process time of `testbed run benchmarks/acfl.toml` (N = 100, m = 100, d = o = 10, 1000
   iterations, Bernoulli p = 0.2; ledger, metrics, checkpoints and summary included), median of
   --repeats, next to `benchmarks/acfl_floor.py`, the same math as a plain numpy loop. Target ≤ 1.5×.
2. The same with 100 emulated nodes over MQTT (embedded broker, --hosts processes) for 100
   iterations, against sim for the same 100 iterations. Target ≤ 5×.

Wall seconds and CPU seconds (user + system of the process and its children) are both printed:
on a loaded host wall time is noisy, CPU time is not. ``--out-root`` puts the run directories
there (e.g. /dev/shm: no fsync cost for the per-round checkpoint).

Usage: python benchmarks/acfl.py [--repeats 3] [--hosts 2] [--out-root DIR] [--skip-mqtt]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TESTBED = [sys.executable, "-m", "testbed"]
CONFIG = str(HERE / "acfl.toml")


def timed(cmd: list[str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of the child and its descendants) of one child process."""
    before = os.times()
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, cwd=HERE.parent)
    if proc.wait() != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}")
    wall = time.perf_counter() - start
    after = os.times()
    return wall, (after.children_user - before.children_user) + (after.children_system - before.children_system)


def median_pair(runs: list[tuple[float, float]]) -> tuple[float, float]:
    return statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--hosts", type=int, default=2, help="emulated host processes over MQTT")
    parser.add_argument("--out-root", help="where run directories go (default: a temporary directory)")
    parser.add_argument("--skip-mqtt", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.out_root) as tmp:
        ours = [timed(TESTBED + ["run", CONFIG, "--quiet", "--out", f"{tmp}/sim-{i}"]) for i in range(args.repeats)]
        floor = [timed([sys.executable, str(HERE / "acfl_floor.py")]) for _ in range(args.repeats)]
        (w_ours, c_ours), (w_floor, c_floor) = median_pair(ours), median_pair(floor)
        print(f"ACFL sim, Sec. V, 100 nodes x 1000 iterations: testbed run {w_ours:.2f} s wall, {c_ours:.2f} s CPU "
              f"(median of {args.repeats})")
        print(f"ACFL floor (plain numpy loop):                        {w_floor:.2f} s wall, {c_floor:.2f} s CPU")
        print(f"ACFL ratio testbed/floor: {w_ours / w_floor:.2f} wall, {c_ours / c_floor:.2f} CPU  (target <= 1.5)")
        if args.skip_mqtt:
            return
        short = ["--set", "acfl.iterations=100"]
        sim = [timed(TESTBED + ["run", CONFIG, "--quiet", "--out", f"{tmp}/sim100-{i}"] + short)
               for i in range(args.repeats)]
        mqtt = [timed(TESTBED + ["run", CONFIG, "--quiet", "--mode", "mqtt", "--out", f"{tmp}/mqtt-{i}",
                                 "--set", f"mqtt.hosts={args.hosts}"] + short) for i in range(args.repeats)]
        (w_sim, _), (w_mqtt, c_mqtt) = median_pair(sim), median_pair(mqtt)
        print(f"ACFL 100 iterations: sim {w_sim:.2f} s wall; MQTT (embedded broker, 100 emulated nodes on "
              f"{args.hosts} hosts) {w_mqtt:.2f} s wall, {c_mqtt:.2f} s CPU")
        print(f"ACFL ratio MQTT/sim: {w_mqtt / w_sim:.2f} wall  (target <= 5)")


if __name__ == "__main__":
    main()
