"""Benchmark the aggregation rules (testbed.algorithms.aggregate; docs/robust-aggregation.md):
how far hostile nodes whose updates pass the norm bound move the model under each rule, and what
each rule costs.

1. **Displacement.** N nodes; each honest node sends a noised update g + σ z_i (a common signal g
   of norm 1 and Gaussian noise of norm about ``noise_ratio``, as a DP update is mostly noise); the
   declared bound is the form DP-PASGD declares, B = ||g|| + σ (sqrt(P) + 10) (testbed.algorithms.
   dp_pasgd.DpPasgd.update_norm_bound), which no honest update exceeds. 10 % and 30 % of the nodes
   are hostile and all send the same update inside B, by two attacks:

   - ``bound``: −B m/||m||, the honest mean m reversed, at the bound;
   - ``far``: the same at 10 B, what a node can send to an algorithm that declares no bound
     (FedAvg's update) or where the bound is loose;
   - ``alie``: "a little is enough" (Baruch et al., NeurIPS 2019): the honest mean minus z times
     the honest per-coordinate standard deviation, z = Φ⁻¹((N − s)/N), s = floor(N/2 + 1) − f (inside
     B here), which hides among the honest updates coordinate by coordinate.

   Printed: ||aggregate − honest mean|| / median honest norm, the median of ``--runs`` seeds, and
   the same with no hostile node ("none": the rule's own error on noisy updates, configured for
   10 %). The defender is told the share: f = the hostile count (krum, multi_krum), trim_fraction =
   the share (trimmed_mean, capped below 1/2), clip_multiple = 2 (norm_clip).
2. **Time per aggregation** for N = 100 and 1000 nodes of P = 10,000 parameters (honest rows), the
   median of ``--runs`` calls, and its ratio to the plain mean's (the floor), on one BLAS thread
   as a run has it (``run.blas_threads = 1``).

Usage: python benchmarks/robust_aggregation.py [--runs 5] [--nodes 100] [--params 1000]
       [--time-nodes 100 1000] [--time-params 10000]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from testbed.algorithms.aggregate import AGGREGATIONS, Aggregation
from testbed.util.threads import limit_blas_threads

SHARES = (0.1, 0.3)
#: (attack, hostile share, the share the defender configures for) of each column; the first, no
#: hostile node, is each rule's own error, the baseline of the others.
CASES = [("none", 0.0, SHARES[0])] + [(attack, share, share) for attack in ("bound", "far", "alie")
                                      for share in SHARES]
#: How far beyond the bound the "far" attack sends its update.
FAR = 10.0


def honest_updates(n: int, p: int, noise_ratio: float, rng: np.random.Generator) -> tuple[np.ndarray, float]:
    """(n, p) honest noised updates around the signal g (norm 1) and the declared bound B."""
    g = np.zeros(p)
    g[0] = 1.0
    sigma = noise_ratio / np.sqrt(p)
    bound = 1.0 + sigma * (np.sqrt(p) + 10.0)
    return g + sigma * rng.standard_normal((n, p)), bound


def hostile_update(honest: np.ndarray, bound: float, attack: str, n: int, f: int) -> np.ndarray:
    """The (p,) update every hostile node sends (inside the bound B but for "far")."""
    if attack in ("none", "bound", "far"):  # none: no row of it is sent
        mean = honest.mean(axis=0)
        return -(FAR if attack == "far" else 1.0) * bound * mean / np.linalg.norm(mean)
    s = n // 2 + 1 - f
    z = statistics.NormalDist().inv_cdf((n - s) / n)
    row = honest.mean(axis=0) - z * honest.std(axis=0)
    return row * min(1.0, bound / np.linalg.norm(row))


def defender(rule: str, n: int, share: float) -> Aggregation:
    """The rule as a defender who expects ``share`` of the n nodes to be hostile configures it."""
    return Aggregation(rule, trim_fraction=min(share, 0.49), byzantine_f=min(int(round(share * n)), (n - 3) // 2))


def displacement(rule: str, n: int, p: int, attack: str, share: float, defended_share: float, seed: int,
                 noise_ratio: float = 3.0) -> float:
    """||aggregate − honest mean|| / median honest norm with round(share · n) hostile nodes
    sending ``attack`` ("none": none), the rule configured for ``defended_share``."""
    rng = np.random.default_rng(seed)
    f = int(round(share * n))
    honest, bound = honest_updates(n - f, p, noise_ratio, rng)
    hostile = np.broadcast_to(hostile_update(honest, bound, attack, n, f), (f, p)) if f else np.zeros((0, p))
    rows = np.vstack([honest, hostile])[rng.permutation(n)]  # where the hostile rows sit must not matter
    out = defender(rule, n, defended_share).combine(rows, reference=np.zeros(p))
    return float(np.linalg.norm(out - honest.mean(axis=0)) / np.median(np.linalg.norm(honest, axis=1)))


def displacements(n: int, p: int, runs: int) -> dict[tuple[str, str, float], float]:
    """(rule, attack, share) of every rule and :data:`CASES` → the median displacement over
    ``runs`` seeds."""
    return {(rule, attack, share): statistics.median(displacement(rule, n, p, attack, share, defended, seed)
                                                     for seed in range(runs))
            for rule in AGGREGATIONS for attack, share, defended in CASES}


def seconds_per_aggregation(rule: str, n: int, p: int, runs: int) -> float:
    """Median wall seconds of one aggregation of n honest rows of p parameters."""
    rows, _ = honest_updates(n, p, 3.0, np.random.default_rng(0))
    aggregation, reference = defender(rule, n, SHARES[0]), np.zeros(p)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        aggregation.combine(rows, reference=reference)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="seeds (displacement) and calls (time); the median")
    parser.add_argument("--nodes", type=int, default=100, help="N of the displacement figures")
    parser.add_argument("--params", type=int, default=1000, help="P of the displacement figures")
    parser.add_argument("--time-nodes", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--time-params", type=int, default=10_000)
    args = parser.parse_args(argv)
    limit_blas_threads(1)

    moved = displacements(args.nodes, args.params, args.runs)
    print(f"displacement ||aggregate - honest mean|| / median honest norm, N = {args.nodes}, P = {args.params}, "
          f"median of {args.runs} seeds")
    print(f"{'rule':<14}" + "".join((f"{attack} {share:.0%}" if share else attack).rjust(13)
                                    for attack, share, _ in CASES))
    for rule in AGGREGATIONS:
        print(f"{rule:<14}" + "".join(f"{moved[rule, attack, share]:13.3f}" for attack, share, _ in CASES))

    print(f"\nseconds per aggregation, P = {args.time_params}, median of {args.runs} calls (ratio to the mean)")
    print(f"{'rule':<14}" + "".join(f"N = {n}".rjust(22) for n in args.time_nodes))
    floors = {n: seconds_per_aggregation("mean", n, args.time_params, args.runs) for n in args.time_nodes}
    for rule in AGGREGATIONS:
        cells = []
        for n in args.time_nodes:
            s = floors[n] if rule == "mean" else seconds_per_aggregation(rule, n, args.time_params, args.runs)
            cells.append(f"{s:.4f} s ({s / floors[n]:5.1f}x)".rjust(22))
        print(f"{rule:<14}" + "".join(cells))


if __name__ == "__main__":
    main()
