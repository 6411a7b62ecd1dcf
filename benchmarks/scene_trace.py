"""Ray-tracing time of one coherence block against N (issue 45): every node a transmitter and a
receiver in one PathSolver call (channel.scene.trace_links), in Sionna RT's street canyon.

For each N (4, 16, 64 by default) the nodes stand on the canyon's open ground (a fixed generator);
one trace is timed --repeats times, the sizes taken in turn (4, 16, 64, 4, 16, 64, ...) so that
every size sees the same load, and the median printed with the time per link (N² − N links; the
solver's work grows with N sources × N targets) and the ratio to the anchor, the smallest N. The
first trace of a process compiles the solver's kernels (Dr.Jit caches them on disk): an untimed
trace at the smallest N runs first. A cached read of the largest trace (channel.scene.cached_trace:
what every later run of the geometry pays) is timed too. The load average is printed with the figures.

Usage: python benchmarks/scene_trace.py [--nodes 4,16,64] [--repeats 3] [--samples 100000] [--depth 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import numpy as np

from channel.scene import SceneSpec, cached_trace, trace_links
from channel.scene.geometry import positions_in_open_space


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="4,16,64", help="the N to time, comma separated")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--samples", type=int, default=100_000, help="rays per node (samples_per_source)")
    parser.add_argument("--depth", type=int, default=3, help="max_depth")
    args = parser.parse_args()
    sizes = sorted(int(n) for n in args.nodes.split(","))
    spec = SceneSpec("simple_street_canyon", carrier_hz=3.5e9, max_depth=args.depth, samples_per_source=args.samples)
    positions = {n: positions_in_open_space(spec, n, np.random.default_rng(n)) for n in sizes}
    trace_links(spec, positions[sizes[0]])  # compiles the kernels
    seconds: dict[int, list[float]] = {n: [] for n in sizes}
    for _ in range(args.repeats):
        for n in sizes:
            start = time.perf_counter()
            trace_links(spec, positions[n])
            seconds[n].append(time.perf_counter() - start)
    print(f"street canyon, max_depth {args.depth}, {args.samples} rays per node, one Dr.Jit thread; "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    anchor = statistics.median(seconds[sizes[0]])
    print(f"{'N':>5} {'links':>6} {'median s':>9} {'ms per link':>12} {'x N=' + str(sizes[0]):>8}   runs")
    for n in sizes:
        med = statistics.median(seconds[n])
        links = n * (n - 1)
        print(f"{n:>5} {links:>6} {med:>9.3f} {1e3 * med / links:>12.3f} {med / anchor:>8.2f}   "
              + " ".join(f"{s:.3f}" for s in seconds[n]))
    with tempfile.TemporaryDirectory() as cache:
        n = sizes[-1]
        cached_trace(spec, positions[n], cache)
        reads = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            cached_trace(spec, positions[n], cache)
            reads.append(time.perf_counter() - start)
    print(f"cached read of the N = {n} block: median {1e3 * statistics.median(reads):.2f} ms "
          f"({statistics.median(seconds[n]) / statistics.median(reads):.0f}x faster than tracing it)")


if __name__ == "__main__":
    main()
