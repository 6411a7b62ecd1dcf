"""Benchmark the scale of sim (scale issue): J1's job at 10,000 nodes, and at a million nodes
with client sampling.

1. 10,000 nodes x 10 rounds: `testbed run benchmarks/j1.toml` with data.num_nodes = 10000 and
   dp_pasgd.steps = 100 (τ = 10), data.dtype = "float32" and output.eval_nodes = 500. Targets:
   <= 30 s and <= 2 GB peak RSS.
2. 1,000,000 nodes, 100 sampled per round (client_sampling uniform, count 100), 100 rounds (J1's
   1,000 steps), lazy nodes (each round generates its sampled nodes' rows), output.eval_nodes =
   1000. Targets: <= 60 s and <= 2 GB peak RSS.

3. A file-based set with lazy nodes: MNIST's four IDX files written with 70,000 random images to a
   temporary folder (the loader's own format, 55 MB of pixels), over 700 clients of 100 images
   (439 MB of float64 rows), 10 sampled per round, 10 rounds, output.eval_nodes = 50. Lazily (the
   federation written once to the cache, then memory-mapped: testbed.data.mapped) against eagerly
   (the same run with testbed.assembly.assemble.holds_lazily patched to hold every node's rows); the first
   lazy run, which writes the cache, is shown apart; no figures (their process would count). Floor: the eager run's peak RSS; the ratio is
   lazy / eager. With --adult, the same on Adult-2 over 3,000 nodes (22 MB of rows: too small to
   show much beside the interpreter, hence the image-like set).

Whole process (start-up, data, rounds, ledger, summary, figures, tight accountant), median of
--repeats runs, with the CPU time (user + system) beside the wall time, for a shared machine; peak RSS is ru_maxrss of the run's process (its children, the figures and the
tight accountant, are separate processes with their own). GB = 10^9 bytes. With --plain, job 1
also runs as J1 has it (float64, every node evaluated) for comparison.

Usage: python benchmarks/scale_sim.py [--repeats 3] [--only 10k|1m|files] [--plain] [--adult PATH]
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


FILES = ["data.dataset='mnist'", "data.num_nodes=700", "data.samples_per_node=100", "dp_pasgd.steps=100",
         "client_sampling.method='uniform'", "client_sampling.count=10", "output.eval_nodes=50",
         "output.figures=false"]
ADULT = ["data.dataset='adult-2'", "data.num_nodes=3000", "dp_pasgd.steps=100", "dp_pasgd.batch=4",
         "client_sampling.method='uniform'", "client_sampling.count=10", "output.eval_nodes=50",
         "output.figures=false"]
#: The CLI with every node's rows held (holds_lazily off): the eager path of the same run.
EAGER = [sys.executable, "-c", "import sys, testbed.assembly.assemble as a; a.holds_lazily = lambda config: False; "
                               "from testbed.cli import main; sys.exit(main())"]


def measured(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, float, float]:
    """(wall s, CPU s user + system, peak RSS in GB) of one child process; the CPU time tells a
    busy shared machine (wall >> CPU) from a slow run."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, cwd=HERE.parent, env=env)
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


def write_mnist_like(folder: Path, seed: int = 0) -> None:
    """MNIST's four uncompressed IDX files (60,000 + 10,000 images), random pixels and labels,
    written in blocks: a child's ru_maxrss starts from this process's RSS when it forks."""
    import numpy as np

    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for stem, count in (("train", 60000), ("t10k", 10000)):
        with open(folder / f"{stem}-images-idx3-ubyte", "wb") as f:
            f.write(bytes([0, 0, 8, 3]) + b"".join(v.to_bytes(4, "big") for v in (count, 28, 28)))
            for _ in range(count // 1000):
                f.write(rng.integers(0, 256, (1000, 28, 28), dtype=np.uint8).tobytes())
        (folder / f"{stem}-labels-idx1-ubyte").write_bytes(
            bytes([0, 0, 8, 1]) + count.to_bytes(4, "big") + rng.integers(0, 10, count, dtype=np.uint8).tobytes())


def files_job(label: str, sets: list[str], repeats: int, tmp: str) -> None:
    """Job 3: peak RSS of a sampled run on a file-based set lazily (memory-mapped) against eagerly."""
    env = dict(os.environ, TESTBED_CACHE=f"{tmp}/cache")

    def run(cli: list[str], name: str) -> tuple[float, float, float]:
        args = cli + ["run", str(HERE / "j1.toml"), "--quiet", "--out", f"{tmp}/{label[:5]}-{name}"]
        for s in sets:
            args += ["--set", s]
        return measured(args, env)

    first = run(TESTBED, "first")
    print(f"{label}: first lazy run (writes the cache): wall {first[0]:.1f} s, peak RSS {first[2]:.3f} GB")
    lazy, eager = [], []
    for i in range(repeats):
        lazy.append(run(TESTBED, f"lazy{i}"))
        eager.append(run(EAGER, f"eager{i}"))
    for name, runs in (("lazy (memory-mapped)", lazy), ("eager (every row held)", eager)):
        wall, peak = statistics.median(r[0] for r in runs), statistics.median(r[2] for r in runs)
        print(f"  {name:23s} wall {wall:5.1f} s  peak RSS {peak:6.3f} GB (median of {repeats}: "
              f"{', '.join(f'{r[2]:.3f}' for r in runs)})")
    ratio = statistics.median(r[2] for r in lazy) / statistics.median(r[2] for r in eager)
    print(f"  peak RSS ratio lazy / eager (the floor) {ratio:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", choices=("10k", "1m", "files"))
    parser.add_argument("--adult", metavar="PATH", help="adult.data or its folder: job 3 on Adult-2 too")
    parser.add_argument("--plain", action="store_true", help="also job 1 as J1 has it: float64, every node evaluated")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        if args.only in (None, "10k"):
            job("10,000 nodes x 10 rounds (float32, 500 evaluated)", TEN_THOUSAND + SCALE, args.repeats, tmp, 30, 2)
            if args.plain:
                job("10,000 nodes x 10 rounds (float64, all evaluated)", TEN_THOUSAND, 1, tmp, 30, 2)
        if args.only in (None, "1m"):
            job("1,000,000 nodes, 100 sampled x 100 rounds", MILLION, args.repeats, tmp, 60, 2)
        if args.only in (None, "files"):
            write_mnist_like(Path(tmp) / "mnist")
            files_job("mnist-like, 700 clients of 100 images, 10 sampled x 10 rounds",
                      FILES + [f"data.path='{tmp}/mnist'"], args.repeats, tmp)
            if args.adult:
                files_job("adult-2, 3,000 nodes of ~11 rows, 10 sampled x 10 rounds",
                          ADULT + [f"data.path='{args.adult}'"], args.repeats, tmp)


if __name__ == "__main__":
    main()
