"""Benchmark robust aggregation (docs/robust-aggregation.md).

**The algorithm grid** (the default; ``benchmarks/robust_attacks.py`` is its harness): every
averaging algorithm (FedAvg, DP-PASGD, PADPFL, gossip, D-PSGD) × each of its rules × each attack
(reversal and sign flip at 0.99 of the declared bound, "a little is enough", inner-product
manipulation; identical and diverse attackers; a lying quality score for PADPFL) × 10 % and 30 %
hostile nodes, over ``--seeds`` seeds, in sim on 10 nodes of synthetic data. For each cell: the
change of the test accuracy from the clean model's (the paper's rule, no attack, the same seed),
its mean and 95 % paired t interval over the seeds (testbed.reports.stats.paired), and the
distance of the model from the clean one, its mean and t interval. The tables are written into docs/robust-aggregation.md
between its markers (``--write``), with which rule holds per algorithm: every attack at the share
leaves the mean accuracy within :data:`HOLDS` of the clean model's.

    nice -n 10 python benchmarks/robust_aggregation.py --seeds 5 --write docs/robust-aggregation.md

**The rules alone** (``--rules``): how far hostile nodes whose updates pass the norm bound move
the aggregate under each server rule, and what each rule costs.

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

Usage: python benchmarks/robust_aggregation.py --rules [--runs 5] [--nodes 100] [--params 1000]
       [--time-nodes 100 1000] [--time-params 10000]
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from testbed.algorithms.aggregate import Aggregation
from testbed.algorithms.aggregations.registry import names as rule_names
from testbed.reports.stats import paired, t_interval
from testbed.util.threads import limit_blas_threads

sys.path.insert(0, str(Path(__file__).resolve().parent))
import robust_attacks as attacks  # noqa: E402

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
            for rule in rule_names() for attack, share, defended in CASES}


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


#: A rule holds at a share when no attack at it takes the mean accuracy further than this below the clean model's.
HOLDS = 0.05
BEGIN, END = "<!-- robust-grid:begin -->", "<!-- robust-grid:end -->"


def grid(seeds: int, algorithms: tuple[str, ...] = attacks.ALGORITHMS) -> dict[tuple, list[tuple[float, float, float]]]:
    """(algorithm, rule, attack or "clean", share) → per seed (accuracy, clean accuracy, distance
    from the clean model)."""
    out: dict[tuple, list[tuple[float, float, float]]] = {}
    for algorithm in algorithms:
        for seed in range(seeds):
            loaded: dict = {}
            clean = attacks.run_case(algorithm, "mean", None, 0.0, seed, loaded)
            for rule in attacks.rules_of(algorithm):
                own = attacks.run_case(algorithm, rule, None, attacks.SHARES[0], seed, loaded)
                out.setdefault((algorithm, rule, "clean", 0.0), []).append(
                    (own.accuracy, clean.accuracy, attacks.distance(own.model, clean.model)))
                for attack in attacks.attacks_of(algorithm):
                    for share in attacks.SHARES:
                        hit = attacks.run_case(algorithm, rule, attack, share, seed, loaded)
                        out.setdefault((algorithm, rule, attack, share), []).append(
                            (hit.accuracy, clean.accuracy, attacks.distance(hit.model, clean.model)))
    return out


def _cell(values: list[tuple[float, float, float]]) -> str:
    """Accuracy change from the clean model, mean [paired 95 % interval] over the seeds; then the
    distance from the clean model, mean [95 % t interval]."""
    acc, base, dist = (np.array(v) for v in zip(*values))
    d, far = paired(acc, base), t_interval(dist)
    return (f"{d.mean:+.2f} [{d.ci_low:+.2f}, {d.ci_high:+.2f}] · "
            f"{float(far.mean):.2g} [{max(float(far.ci_low), 0.0):.2g}, {float(far.ci_high):.2g}]")


def holding(results: dict, algorithm: str, share: float) -> list[str]:
    """The rules of ``algorithm`` under which no attack at ``share`` lowers the mean accuracy by more than HOLDS."""
    return [rule for rule in attacks.rules_of(algorithm)
            if all(np.mean([a - b for a, b, _ in results[algorithm, rule, attack, share]]) >= -HOLDS
                   for attack in attacks.attacks_of(algorithm))]


def tables(results: dict, seeds: int, seconds: float) -> str:
    """The markdown of the grid: a summary, then one table per algorithm."""
    lines = [f"Generated by `nice -n 10 python benchmarks/robust_aggregation.py --seeds {seeds} --write "
             f"docs/robust-aggregation.md` ({seconds / 60:.1f} min on the shared 2-core machine).", "",
             "| algorithm | clean accuracy | rules that hold at 10 % | at 30 % |", "|---|---|---|---|"]
    algorithms = sorted({k[0] for k in results}, key=attacks.ALGORITHMS.index)
    for algorithm in algorithms:
        base = np.mean([b for _, b, _ in results[algorithm, "mean", "clean", 0.0]])
        ten, thirty = (", ".join(f"`{r}`" for r in holding(results, algorithm, s)) or "none" for s in attacks.SHARES)
        lines.append(f"| {algorithm} | {base:.3f} | {ten} | {thirty} |")
    for algorithm in algorithms:
        columns = [("clean", 0.0)] + [(a, s) for a in attacks.attacks_of(algorithm) for s in attacks.SHARES]
        lines += ["", f"**{algorithm}** (accuracy change [95 % interval] · distance from the clean model [95 % "
                      f"interval])", "",
                  "| rule | " + " | ".join(a if a == "clean" else f"{a} {s:.0%}" for a, s in columns) + " |",
                  "|---" * (len(columns) + 1) + "|"]
        for rule in attacks.rules_of(algorithm):
            lines.append(f"| `{rule}` | " + " | ".join(_cell(results[algorithm, rule, a, s]) for a, s in columns) + " |")
    return "\n".join(lines)


def write_between_markers(path: Path, text: str) -> None:
    """Replace what lies between the markers of ``path`` with ``text``."""
    doc = path.read_text()
    if BEGIN not in doc or END not in doc:
        raise SystemExit(f"{path}: no {BEGIN} ... {END} markers to write between")
    pattern = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    path.write_text(pattern.sub(lambda _: f"{BEGIN}\n{text}\n{END}", doc))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rules", action="store_true", help="the rules alone on synthetic rows, and their time")
    parser.add_argument("--seeds", type=int, default=5, help="grid: seeds per cell (paired over them)")
    parser.add_argument("--algorithms", nargs="+", default=list(attacks.ALGORITHMS), choices=attacks.ALGORITHMS)
    parser.add_argument("--write", type=Path, help="grid: write the tables into this file between its markers")
    parser.add_argument("--runs", type=int, default=5, help="rules: seeds (displacement) and calls (time); the median")
    parser.add_argument("--nodes", type=int, default=100, help="rules: N of the displacement figures")
    parser.add_argument("--params", type=int, default=1000, help="rules: P of the displacement figures")
    parser.add_argument("--time-nodes", type=int, nargs="+", default=[100, 1000])
    parser.add_argument("--time-params", type=int, default=10_000)
    args = parser.parse_args(argv)
    limit_blas_threads(1)
    if args.rules:
        rules_only(args)
        return
    if args.seeds < 2:
        parser.error("--seeds: a paired interval needs at least 2")
    start = time.perf_counter()
    results = grid(args.seeds, tuple(args.algorithms))
    text = tables(results, args.seeds, time.perf_counter() - start)
    print(text)
    if args.write:
        write_between_markers(args.write, text)


def rules_only(args: argparse.Namespace) -> None:
    """The displacement and time of each rule on synthetic rows (no algorithm)."""
    moved = displacements(args.nodes, args.params, args.runs)
    print(f"displacement ||aggregate - honest mean|| / median honest norm, N = {args.nodes}, P = {args.params}, "
          f"median of {args.runs} seeds")
    print(f"{'rule':<14}" + "".join((f"{attack} {share:.0%}" if share else attack).rjust(13)
                                    for attack, share, _ in CASES))
    for rule in rule_names():
        print(f"{rule:<14}" + "".join(f"{moved[rule, attack, share]:13.3f}" for attack, share, _ in CASES))

    print(f"\nseconds per aggregation, P = {args.time_params}, median of {args.runs} calls (ratio to the mean)")
    print(f"{'rule':<14}" + "".join(f"N = {n}".rjust(22) for n in args.time_nodes))
    floors = {n: seconds_per_aggregation("mean", n, args.time_params, args.runs) for n in args.time_nodes}
    for rule in rule_names():
        cells = []
        for n in args.time_nodes:
            s = floors[n] if rule == "mean" else seconds_per_aggregation(rule, n, args.time_params, args.runs)
            cells.append(f"{s:.4f} s ({s / floors[n]:5.1f}x)".rjust(22))
        print(f"{rule:<14}" + "".join(cells))


if __name__ == "__main__":
    main()
