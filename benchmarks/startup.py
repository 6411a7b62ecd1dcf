"""Start-up benchmark (issue 44): how long a run takes from its command to round 1, and the whole
process.

Cases (each a `testbed` command, run from the repository's root, output discarded):

- ``ring``: ``testbed run benchmarks/dwfl_ring.toml --quiet`` (DWFL, 12 nodes on a ring, 30
  rounds, in one process, Rayleigh fading): start to round 1 <= 2 s;
- ``quickstart``: ``testbed run experiments/quickstart.toml --quiet``, the README's quick start
  (DP-PASGD, 16 emulated boards over MQTT, the run's own broker): start to round 1 <= 2 s;
- ``version``: ``testbed --version``: the whole process <= 0.2 s;
- ``j1``: J1 at 100 nodes x 10 rounds in sim (``benchmarks/j1.toml --set dp_pasgd.steps=100``,
  as benchmarks/flower_j1.py sizes it): information, no target.

"Start to round 1" runs from the moment the benchmark starts the process to the moment the run's
set-up ends and its rounds' clock starts (:meth:`testbed.reports.startup.Startup.done`, written
down by benchmarks/startup_probe.py, which runs the command in the child). Each figure is the
median of ``--repeats`` runs; the runs of the cases alternate (ring, quickstart, version, ring,
...) so that every case sees the same load, and the load average is printed before and after.
``--against TREE`` runs each case in this checkout and in another one (another branch's
worktree), alternately, and prints the ratio of their medians.

``--stages CASE`` times one case's stages instead (the command line's parser, reading the
experiment file, each stage of testbed.orchestration.runner, the waits of its finish, the
interpreter's exit), median over ``--repeats`` runs: docs/performance.md, "Where a run's time
goes".

The project's bytecode is compiled first (benchmarks/timing.py).

Usage: python benchmarks/startup.py [--repeats 5] [--cases ring,quickstart,version]
                                    [--against TREE] [--stages CASE]
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from timing import PACKAGES, REPO, compile_project

PROBE = Path(__file__).resolve().parent / "startup_probe.py"


@dataclass(frozen=True)
class Case:
    what: str
    args: tuple[str, ...]  # `testbed` ARGS; "{out}" is a fresh run directory
    round_1_target_s: float | None = None
    whole_target_s: float | None = None


CASES = {
    "ring": Case("DWFL, 12 nodes on a ring, sim, 30 rounds (benchmarks/dwfl_ring.toml)",
                 ("run", str(REPO / "benchmarks/dwfl_ring.toml"), "--quiet", "--out", "{out}"), round_1_target_s=2.0),
    "quickstart": Case("the quick start over MQTT (experiments/quickstart.toml, 16 boards, its own broker)",
                       ("run", str(REPO / "experiments/quickstart.toml"), "--quiet", "--out", "{out}"), round_1_target_s=2.0),
    "version": Case("testbed --version", ("--version",), whole_target_s=0.2),
    "j1": Case("J1, 100 nodes x 10 rounds, sim (information)",
               ("run", str(REPO / "benchmarks/j1.toml"), "--set", "dp_pasgd.steps=100", "--quiet", "--out", "{out}")),
}


@dataclass(frozen=True)
class Timed:
    whole_s: float
    round_1_s: float | None  # None: the command runs no round
    marks: dict | None = None  # --stages: the probe's marks and heavy imports


def run_once(case: Case, tree: Path, out: Path, stages: bool = False) -> Timed:
    """One run of ``case`` with ``tree`` on PYTHONPATH (its checkout's testbed)."""
    with tempfile.NamedTemporaryFile(suffix=".mark", delete=False) as f:
        mark = Path(f.name)
    env = {**os.environ, "PYTHONPATH": str(tree), "STARTUP_MARK": str(mark)}
    env.pop("STARTUP_STAGES", None)
    if stages:
        env["STARTUP_STAGES"] = "1"
    cmd = [sys.executable, str(PROBE), *(a.format(out=out) for a in case.args)]
    try:
        start = time.time()
        proc = subprocess.run(cmd, cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        whole = time.time() - start
        if proc.returncode != 0:
            raise SystemExit(f"failed: {' '.join(cmd)}\n{proc.stderr.decode(errors='replace')[-2000:]}")
        text = mark.read_text()
    finally:
        mark.unlink(missing_ok=True)
    if stages:
        found = json.loads(text)
        found["marks"] = [["start", start], *found["marks"], ["process gone", start + whole]]
        return Timed(whole, None, found)
    return Timed(whole, float(text) - start if text else None)


def load_average() -> str:
    one, five, fifteen = os.getloadavg()
    return f"load average {one:.2f} {five:.2f} {fifteen:.2f} ({os.cpu_count()} cores)"


def compile_tree(tree: Path) -> None:
    if tree == REPO:
        compile_project()
    else:
        for package in PACKAGES:
            compileall.compile_dir(tree / package, quiet=1)


def measure(names: list[str], trees: list[Path], repeats: int, tmp: Path) -> dict[tuple[str, Path], list[Timed]]:
    """``repeats`` runs of each case in each tree, alternated: case by case, tree by tree."""
    runs: dict[tuple[str, Path], list[Timed]] = {(n, t): [] for n in names for t in trees}
    for i in range(repeats):
        for name in names:
            for j, tree in enumerate(trees):
                runs[name, tree].append(run_once(CASES[name], tree, tmp / f"{name}-{j}-{i}"))
    return runs


def median(values: list[float | None]) -> float | None:
    return None if any(v is None for v in values) else statistics.median(values)


def against(target: float | None, value: float | None) -> str:
    if target is None or value is None:
        return ""
    return f"target <= {target:g} s, ratio {value / target:.2f} ({'met' if value <= target else 'NOT met'})"


def report(names: list[str], trees: list[Path], runs: dict[tuple[str, Path], list[Timed]]) -> None:
    for name in names:
        case = CASES[name]
        print(f"{name}: {case.what}")
        medians = {}
        for tree in trees:
            got = runs[name, tree]
            whole, first = median([t.whole_s for t in got]), median([t.round_1_s for t in got])
            medians[tree] = (whole, first)
            where = f" [{tree}]" if len(trees) > 1 else ""
            spread = f"{min(t.whole_s for t in got):.3f}-{max(t.whole_s for t in got):.3f}"
            print(f"  whole process       {whole:7.3f} s (median of {len(got)}, {spread}) "
                  f"{against(case.whole_target_s, whole)}{where}")
            if first is not None:
                print(f"  start to round 1    {first:7.3f} s (median of {len(got)}) "
                      f"{against(case.round_1_target_s, first)}{where}")
        if len(trees) == 2:
            (a_whole, a_first), (b_whole, b_first) = medians[trees[0]], medians[trees[1]]
            print(f"  this tree / the other: whole {a_whole / b_whole:.2f}"
                  + (f", start to round 1 {a_first / b_first:.2f}" if a_first is not None else ""))


def stage_table(timed: list[Timed]) -> None:
    """The intervals between consecutive marks (a stage's own when its begin and end are
    consecutive), median over the runs whose marks came in the same order as the first's."""
    names = [m[0] for m in timed[0].marks["marks"]]
    same = [t for t in timed if [m[0] for m in t.marks["marks"]] == names]
    print(f"{'':58}{'s':>8}{'from start':>12}")
    for k in range(1, len(names)):
        step = statistics.median(t.marks["marks"][k][1] - t.marks["marks"][k - 1][1] for t in same)
        since = statistics.median(t.marks["marks"][k][1] - t.marks["marks"][0][1] for t in same)
        before, after = names[k - 1], names[k]
        label = before.removesuffix(" begins") if before.endswith(" begins") and after == \
            before.removesuffix(" begins") + " ends" else f"  ({before} .. {after})"
        print(f"{label[:58]:58}{step:8.3f}{since:12.3f}")
    print(f"(median of {len(same)} runs of {len(timed)}; heavy libraries imported: "
          f"{', '.join(timed[0].marks['heavy']) or 'none'})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cases", default="ring,quickstart,version",
                        help=f"comma-separated, of {', '.join(CASES)}")
    parser.add_argument("--against", type=Path, metavar="TREE", help="another checkout to alternate with")
    parser.add_argument("--stages", choices=sorted(CASES), metavar="CASE", help="time one case's stages")
    args = parser.parse_args()
    names = [args.stages] if args.stages else [n.strip() for n in args.cases.split(",") if n.strip()]
    unknown = [n for n in names if n not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {', '.join(unknown)}; choose among {', '.join(CASES)}")
    trees = [REPO] + ([args.against.resolve()] if args.against else [])
    for tree in trees:
        compile_tree(tree)
    print(load_average())
    with tempfile.TemporaryDirectory() as tmp:
        if args.stages:
            for j, tree in enumerate(trees):
                timed = [run_once(CASES[args.stages], tree, Path(tmp) / f"stages-{j}-{i}", stages=True)
                         for i in range(args.repeats)]
                print(f"{args.stages}: {CASES[args.stages].what}" + (f" [{tree}]" if len(trees) > 1 else ""))
                stage_table(timed)
        else:
            report(names, trees, measure(names, trees, args.repeats, Path(tmp)))
    print(load_average())


if __name__ == "__main__":
    main()
