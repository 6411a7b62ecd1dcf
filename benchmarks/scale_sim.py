"""Benchmark the scale of sim (scale issue): J1's job at 10,000 nodes, and at a million nodes
with client sampling.

1. 10,000 nodes x 10 rounds: `testbed run benchmarks/j1.toml` with data.num_nodes = 10000 and
   dp_pasgd.steps = 100 (τ = 10), data.dtype = "float32" and output.eval_nodes = 500. Targets:
   <= 30 s and <= 2 GB peak RSS.
2. 1,000,000 nodes, 100 sampled per round (client_sampling uniform, count 100), 100 rounds (J1's
   1,000 steps), lazy nodes (each round generates its sampled nodes' rows), output.eval_nodes =
   1000. Targets: <= 20 s (issue 44) and <= 2 GB peak RSS.

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

No change slows a row without saying so: with --against REV (a commit, branch or tag), jobs 1 and
2 also run from a git worktree of REV made for the call (and removed after), the two trees
alternated (this tree, REV, this tree, REV, ...: a machine whose speed drifts slows both sides
alike), each tree's own code on the same job (this tree's j1.toml); printed are each side's median
and the median of the pairs' ratios this / REV, wall and CPU, with the load average before and
after. A ratio above 1 is a slow-down to say in the commit that makes it.

Usage: python benchmarks/scale_sim.py [--repeats 3] [--only 10k|1m|files] [--plain] [--adult PATH]
                                      [--against REV]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
from pathlib import Path

from timing import REPO, compile_project, timed, worktree

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


def measured(cmd: list[str], env: dict[str, str] | None = None, tree: Path = REPO) -> tuple[float, float, float]:
    """(wall s, CPU s user + system, peak RSS in GB) of one child process run from ``tree``; the
    CPU time tells a busy shared machine (wall >> CPU) from a slow run."""
    t = timed(cmd, tree, env)
    return t.wall_s, t.cpu_s, t.peak_rss_mb * 2**20 / 1e9


def load_average() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def job(name: str, sets: list[str], repeats: int, tmp: str, wall_target: float, rss_target_gb: float,
        against: tuple[str, Path] | None = None) -> None:
    """``repeats`` runs of the job (with ``against`` = (REV, its worktree): as many of REV's,
    alternated with them), medians and ratios printed."""
    sides = [("this tree", REPO)] + ([against] if against else [])
    runs: dict[str, list[tuple[float, float, float]]] = {label: [] for label, _ in sides}
    before = load_average()
    for i in range(repeats):
        for label, tree in sides:
            args = TESTBED + ["run", str(HERE / "j1.toml"), "--quiet", "--out",
                              f"{tmp}/{i}-{len(runs[label])}-{name[:9].replace(' ', '')}-{label[:4]}"]
            for s in sets:
                args += ["--set", s]
            runs[label].append(measured(args, tree=tree))
    for label, _ in sides:
        walls, cpus, rss = ([r[k] for r in runs[label]] for k in range(3))
        wall, cpu, peak = statistics.median(walls), statistics.median(cpus), statistics.median(rss)
        print(f"{name} [{label}]: wall {wall:6.1f} s (median of {repeats}: {', '.join(f'{t:.1f}' for t in walls)})  "
              f"ratio to {wall_target:.0f} s target {wall / wall_target:.2f}")
        print(f"{' ' * len(name)}  CPU  {cpu:6.1f} s (median of {repeats}: {', '.join(f'{t:.1f}' for t in cpus)})  "
              f"ratio to {wall_target:.0f} s target {cpu / wall_target:.2f}")
        print(f"{' ' * len(name)}  peak RSS {peak:5.2f} GB (median of {repeats}: {', '.join(f'{r:.2f}' for r in rss)})  "
              f"ratio to {rss_target_gb:.0f} GB target {peak / rss_target_gb:.2f}")
    if against:
        rev = against[0]
        for k, what in ((0, "wall"), (1, "CPU")):
            ratios = [a[k] / b[k] for a, b in zip(runs["this tree"], runs[rev])]
            print(f"{' ' * len(name)}  this tree / {rev}: {what} {statistics.median(ratios):.2f} "
                  f"(median of {repeats} alternated pairs: {', '.join(f'{r:.2f}' for r in ratios)})")
    print(f"{' ' * len(name)}  {before} before, {load_average()} after")


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
    parser.add_argument("--against", metavar="REV", help="jobs 1 and 2 alternated with a git worktree of REV: the ratio")
    args = parser.parse_args()
    compile_project()
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        against = stack.enter_context(worktree(args.against, tmp)) if args.against else None
        if args.only in (None, "10k"):
            job("10,000 nodes x 10 rounds (float32, 500 evaluated)", TEN_THOUSAND + SCALE, args.repeats, tmp, 30, 2,
                against)
            if args.plain:
                job("10,000 nodes x 10 rounds (float64, all evaluated)", TEN_THOUSAND, 1, tmp, 30, 2)
        if args.only in (None, "1m"):
            job("1,000,000 nodes, 100 sampled x 100 rounds", MILLION, args.repeats, tmp, 20, 2, against)
        if args.only in (None, "files"):
            write_mnist_like(Path(tmp) / "mnist")
            files_job("mnist-like, 700 clients of 100 images, 10 sampled x 10 rounds",
                      FILES + [f"data.path='{tmp}/mnist'"], args.repeats, tmp)
            if args.adult:
                files_job("adult-2, 3,000 nodes of ~11 rows, 10 sampled x 10 rounds",
                          ADULT + [f"data.path='{args.adult}'"], args.repeats, tmp)


if __name__ == "__main__":
    main()
