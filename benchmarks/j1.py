"""Benchmark J1 (core issue): DP-PASGD in sim mode against its floor, and memory at 1,000 nodes.

1. Whole-process wall time of `testbed run benchmarks/j1.toml` (100 nodes, 100 rounds, τ = 10,
   batch 32, d = 100, 500 samples per node; ledger, metrics, summary and figures included), median
   of --repeats runs, next to the floor `benchmarks/j1_floor.py`: the same math as a plain
   vectorised numpy loop. Targets: ratio <= 2 (contract issue), <= 1.5 (scale issue). The
   project's bytecode is compiled first (benchmarks/timing.py says why).
2. Peak RSS of the same job at 1,000 nodes and 20 rounds. Target: <= 1 GB.

Usage: python benchmarks/j1.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from timing import compile_project, timed

HERE = Path(__file__).resolve().parent
TESTBED = [sys.executable, "-m", "testbed"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    compile_project()
    with tempfile.TemporaryDirectory() as tmp:
        ours, floor = [], []
        for i in range(args.repeats):  # interleaved, so a busy machine slows both alike
            ours.append(timed(TESTBED + ["run", str(HERE / "j1.toml"), "--quiet", "--out", f"{tmp}/j1-{i}"]).wall_s)
            floor.append(timed([sys.executable, str(HERE / "j1_floor.py")]).wall_s)
        t_ours, t_floor = statistics.median(ours), statistics.median(floor)
        print(f"J1 sim, 100 nodes x 100 rounds: testbed run {t_ours:.2f} s (median of {args.repeats}: "
              f"{', '.join(f'{t:.2f}' for t in ours)})")
        print(f"J1 floor (plain numpy loop):                 {t_floor:.2f} s (median of {args.repeats}: "
              f"{', '.join(f'{t:.2f}' for t in floor)})")
        print(f"J1 ratio testbed/floor: {t_ours / t_floor:.2f}  (targets: <= 2.0, contract issue; <= 1.5, scale issue)")

        run = timed(TESTBED + ["run", str(HERE / "j1.toml"), "--quiet", "--out", f"{tmp}/j1-1000",
                                     "--set", "data.num_nodes=1000", "--set", "dp_pasgd.steps=200"])
        print(f"J1 1,000 nodes x 20 rounds: peak RSS {run.peak_rss_mb:.0f} MB (target <= 1024 MB), wall {run.wall_s:.2f} s")


if __name__ == "__main__":
    main()
