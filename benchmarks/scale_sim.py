"""Benchmark the scale of sim (scale issue): J1's job at 10,000 nodes, and at a million nodes
with client sampling.

1. 10,000 nodes x 10 rounds: `testbed run benchmarks/j1.toml` with data.num_nodes = 10000 and
   dp_pasgd.steps = 100 (τ = 10), data.dtype = "float32" and output.eval_nodes = 500. Targets:
   <= 30 s and <= 2 GB peak RSS.
2. 1,000,000 nodes, 100 sampled per round (client_sampling uniform, count 100), 100 rounds (J1's
   1,000 steps), lazy nodes (each round generates its sampled nodes' rows), output.eval_nodes =
   1000. Targets: <= 60 s and <= 2 GB peak RSS.

Whole process (start-up, data, rounds, ledger, summary, figures, tight accountant), median of
--repeats runs, with the CPU time (user + system) beside the wall time, for a shared machine; peak RSS is ru_maxrss of the run's process (its children, the figures and the
tight accountant, are separate processes with their own). GB = 10^9 bytes. With --plain, job 1
also runs as J1 has it (float64, every node evaluated) for comparison.

Usage: python benchmarks/scale_sim.py [--repeats 3] [--only 10k|1m] [--plain]
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

TEN_THOUSAND = ["data.num_nodes=10000", "dp_pasgd.steps=100"]
SCALE = ["data.dtype='float32'", "output.eval_nodes=500"]
MILLION = ["data.num_nodes=1000000", "client_sampling.method='uniform'", "client_sampling.count=100",
           "output.eval_nodes=1000"]


def measured(cmd: list[str]) -> tuple[float, float, float]:
    """(wall s, CPU s user + system, peak RSS in GB) of one child process; the CPU time tells a
    busy shared machine (wall >> CPU) from a slow run."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, cwd=HERE.parent)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024 / 1e9


def job(name: str, sets: list[str], repeats: int, tmp: str, wall_target: float, rss_target_gb: float) -> None:
    walls, cpus, rss = [], [], []
    for i in range(repeats):
        args = TESTBED + ["run", str(HERE / "j1.toml"), "--quiet", "--out", f"{tmp}/{i}-{name[:9].replace(' ', '')}"]
        for s in sets:
            args += ["--set", s]
        wall, cpu, peak = measured(args)
        walls.append(wall)
        cpus.append(cpu)
        rss.append(peak)
    wall, cpu, peak = statistics.median(walls), statistics.median(cpus), statistics.median(rss)
    print(f"{name}: wall {wall:6.1f} s (median of {repeats}: {', '.join(f'{t:.1f}' for t in walls)})  "
          f"ratio to {wall_target:.0f} s target {wall / wall_target:.2f}")
    print(f"{' ' * len(name)}  CPU  {cpu:6.1f} s (median of {repeats}: {', '.join(f'{t:.1f}' for t in cpus)})  "
          f"ratio to {wall_target:.0f} s target {cpu / wall_target:.2f}")
    print(f"{' ' * len(name)}  peak RSS {peak:5.2f} GB (median of {repeats}: {', '.join(f'{r:.2f}' for r in rss)})  "
          f"ratio to {rss_target_gb:.0f} GB target {peak / rss_target_gb:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", choices=("10k", "1m"))
    parser.add_argument("--plain", action="store_true", help="also job 1 as J1 has it: float64, every node evaluated")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.only in (None, "10k"):
            job("10,000 nodes x 10 rounds (float32, 500 evaluated)", TEN_THOUSAND + SCALE, args.repeats, tmp, 30, 2)
            if args.plain:
                job("10,000 nodes x 10 rounds (float64, all evaluated)", TEN_THOUSAND, 1, tmp, 30, 2)
        if args.only in (None, "1m"):
            job("1,000,000 nodes, 100 sampled x 100 rounds", MILLION, args.repeats, tmp, 60, 2)


if __name__ == "__main__":
    main()
