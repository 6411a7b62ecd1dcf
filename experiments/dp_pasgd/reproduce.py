"""Reproduce the experiments of DP-PASGD (Hu et al., arXiv 2003.12705, §8) on Adult-1 and Adult-2.

    python experiments/dp_pasgd/reproduce.py [--only e1 e2 ...] [--out runs/dp-pasgd-reproduce] [--workers 1]
    python experiments/dp_pasgd/reproduce.py --plan-seeds
    python experiments/dp_pasgd/reproduce.py [--only e2 planfit] --extend [--seeds 8]
    python experiments/dp_pasgd/reproduce.py --report-only

Each scenario runs through the sweep engine (testbed.orchestration.sweep, local processes; the sweep
folder keeps finished runs, so a rerun only runs what is missing) and writes its compact results to
data/<scenario>.json (experiments/dp_pasgd/results_data.py); REPORT.md and the figures are then
generated from data/ alone, which is all ``--report-only`` does. c1 = 100, c2 = 1, δ = 1e-4.
Vehicle-1/-2 run too when vehicle.mat is found under $TESTBED_DATA; otherwise they are skipped with
a note. Settings shared by every run: base.toml (why each was chosen is written there).

- e1 (Fig. 2): accuracy against resource cost up to C = 1000 at ε = 10, DP-PASGD (τ = 10, K = 90)
  against DP-SGD (τ = 1, K = 9), 14 seeds.
- e2 (Fig. 3): grid over τ ∈ E2_TAUS for C_th ∈ {500, 1000}, ε_th ∈ {1, 2, 4, 10}, 8 seeds. The
  paper's "K from 200 to C_th/(c1/τ+c2)" is empty under its own costs (at most 166 steps fit), so K
  takes two values per τ: the most whole rounds R(τ) = ⌊C_th/(c1 + c2·τ)⌋ and ⌈R/2⌉ rounds. K and
  then τ* are chosen on the mean validation accuracy; claims are judged on the test accuracy.
- e3 (Figs. 4–5): the planned design (dp_pasgd.tau = "plan") against C_th ∈ {200, ..., 1000}
  (ε_th ∈ {1, 2, 4, 10}) and against ε_th ∈ {1, ..., 10} (C_th ∈ {200, 500, 800, 1000}), 10 seeds.
- e4 (Fig. 6): the planned τ over the (C_th, ε_th) grid; planner only. Also the data set facts
  (estimated constants, majority share) the report's set-up uses.
- planfit: the planner with the improved estimate of the bound's noise dimension, d_eff = tr(H̄)/L
  (``[plan] noise_dimension = "trace"``), run at e2's budgets and seeds, against e2's grid best.
- learns: learns.toml (DP-PASGD on MNIST images at the paper's ε_th = 10, where the private model
  learns) and the same at ε_th ∈ {1, 2, 4}: the privacy-utility curve.

Seeds by power (testbed.reports.seed_plan, docs/statistics.md): ``--plan-seeds`` prints, from the
committed data, the seeds each scenario's families need for their effect of interest at 80 % power
after Holm (at least 8, capped by pasgd_design.BUDGET); the report prints the same table.
``--extend`` adds to e2 and planfit only the seeds their data lack, after rerunning the cheapest
committed run and refusing unless it reproduces the committed row.

The bound constants L, λ, ξ², α are estimated once per dataset (seed 0, testbed.planning.estimate)
and written into [plan] of every run, so e2's markers, e3's runs and e4's map use the same ones.

The scenarios' design (data sets, seeds, grids, e2's choice of K and τ*) is pasgd_design.py, the
figures pasgd_figures.py, REPORT.md's text pasgd_report.py; this script runs and records.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))

from pasgd_design import (  # noqa: E402
    CONSTANTS, DATASETS, E1_SCHEMES, E1_SEEDS, E2_BUDGETS, E2_SEEDS, E2_TAUS, E3_COST_SETTINGS, E3_COSTS, E3_EPSILONS,
    E3_SEEDS, EPSILONS, LEARNS_EPSILON, LEARNS_EPSILONS, LEARNS_SEEDS, OPTIONAL, PLANNED,
)
from pasgd_figures import draw_figures  # noqa: E402
from pasgd_report import report, seed_plans  # noqa: E402
from results_data import DATA, compact, read, runs_wall_s, write  # noqa: E402

from testbed.assembly.assemble import load_data, model_for  # noqa: E402
from testbed.assembly.config import Config, load_config, replace  # noqa: E402
from testbed.errors import DataError  # noqa: E402
from testbed.learning.models import LogisticRegression  # noqa: E402
from testbed.orchestration.sweep import Point, run_sweep  # noqa: E402
from testbed.planning.dp_pasgd import lr_tau_cap  # noqa: E402
from testbed.planning.estimate import noise_dimension, smoothness  # noqa: E402
from testbed.planning.resolve import make_plan, plan_inputs  # noqa: E402
from testbed.reports.results import read_metrics  # noqa: E402
from testbed.reports.seed_plan import first_mismatch, plan_table  # noqa: E402
from testbed.reports.verdicts import recording, write_report  # noqa: E402


@dataclass(frozen=True)
class Dataset:
    """One dataset's base config (estimated constants in [plan]), its model and data, and facts for the report."""

    name: str
    base: Config
    model: Any
    data: Any
    info: dict[str, Any]


def majority_share(data: Any) -> float:
    """The test accuracy of always guessing the training split's most common class, averaged over
    devices as the runs' test accuracy is."""
    majority = np.bincount(data.train.y).argmax()
    bounds = data.test.offsets
    return float(np.mean([np.mean(data.test.y[a:b] == majority) for a, b in zip(bounds[:-1], bounds[1:])]))


def setup(name: str) -> Dataset | None:
    """The dataset ready to plan and run, or None when an OPTIONAL one's file is missing."""
    config = replace(load_config(HERE / "base.toml"), **DATASETS[name])
    try:
        data = load_data(config.data, config.run.seed)
    except DataError as exc:
        if name not in OPTIONAL:
            raise SystemExit(f"{name}: {exc} (set TESTBED_DATA)") from None
        print(f"{name}: skipped ({exc})", file=sys.stderr)
        return None
    model = model_for(config.model, data, config.run.seed)
    given: dict[str, Any] = {}
    if config.model.kind == "svm":
        # The hinge loss is not smooth (dp-pasgd.md §5.1): the logistic bound on the same features stands in.
        given["smoothness"] = smoothness(LogisticRegression(data.dim, 2, bias=config.model.bias), data.train)
    probe = replace(config, budget={"cost_units": 1000.0}, dp_pasgd={"epsilon": 10.0}, plan=given)
    inputs = plan_inputs(probe, model, data)
    found = {k: getattr(inputs.constants, k) for k in CONSTANTS}
    logistic = LogisticRegression(data.dim, data.n_classes, bias=config.model.bias)
    info = {"constants": found, "d": model.num_params, "M": data.num_nodes, "G": inputs.constants.lipschitz,
            "tau_cap": math.floor(lr_tau_cap(inputs.constants)), "majority": majority_share(data),
            "noise_dimension": noise_dimension(logistic, data.train)}
    return Dataset(name, replace(config, plan=found), model, data, info)


def fitted(ds: Dataset) -> Config:
    """The dataset's base config with the improved noise dimension d_eff in [plan] (planfit)."""
    return replace(ds.base, plan={**ds.info["constants"], "noise_dimension": ds.info["noise_dimension"]})


def planned(base: Config, ds: Dataset, cost: float, epsilon: float, variant: str = "corrected"):
    """The plan for (C_th, ε_th) with ``base``'s fixed constants (the one a tau = "plan" run makes)."""
    config = replace(base, budget={"cost_units": cost}, dp_pasgd={"epsilon": epsilon})
    return make_plan(plan_inputs(config, ds.model, ds.data), variant)


# --- scenarios: run, then write data/<scenario>.json ------------------------------------------------

def run_e1(datasets: dict[str, Dataset], out: Path, workers: int) -> None:
    rows, curves, wall = [], {}, 0.0
    for name, ds in datasets.items():
        config = replace(ds.base, budget={"cost_units": 1000.0}, dp_pasgd={"epsilon": 10.0})
        points = [Point((("dp_pasgd.tau", t), ("dp_pasgd.steps", k)), s) for t, k in E1_SCHEMES.values() for s in E1_SEEDS]
        folder = out / "e1" / name
        swept = run_sweep(config, points, folder, workers=workers, quiet=True)
        wall += runs_wall_s(folder, swept)
        curves[name] = {}
        for r in swept:
            rows.append({"dataset": name, "tau": r["dp_pasgd.tau"], "steps": r["dp_pasgd.steps"], **r})
            metrics = read_metrics(folder / r["run"])
            curve = curves[name].setdefault(str(r["dp_pasgd.tau"]), {"cost": [m["cost_units"] for m in metrics], "accuracy": {}})
            curve["accuracy"][str(r["seed"])] = [m["test_accuracy"] for m in metrics]
    write("e1", ("dataset", "tau", "steps", "seed", "test_accuracy", "train_loss", "epsilon_max", "cost_max"), rows, wall,
          curves=curves)


def e2_rounds(cost: float, tau: int) -> list[int]:
    most = math.floor(cost / (100.0 + tau) + 1e-9)
    return sorted({most, math.ceil(most / 2)})


E2_COLUMNS = ("dataset", "cost", "epsilon", "tau", "steps", "seed", "test_accuracy", "validation_accuracy", "train_loss")


def e2_point(cost: float, epsilon: float, tau: int, steps: int, seed: int) -> Point:
    return Point((("budget.cost_units", cost), ("dp_pasgd.epsilon", epsilon), ("dp_pasgd.tau", tau),
                  ("dp_pasgd.steps", steps)), seed)


def e2_runs(datasets: dict[str, Dataset], out: Path, workers: int, seeds: Iterable[int]) -> tuple[list[dict], float]:
    rows, wall, seeds = [], 0.0, list(seeds)
    for name, ds in datasets.items():
        points = [e2_point(c, e, t, r * t, s)
                  for c in E2_BUDGETS for e in EPSILONS for t in E2_TAUS for r in e2_rounds(c, t) for s in seeds]
        folder = out / "e2" / name
        swept = run_sweep(ds.base, points, folder, workers=workers, quiet=True)
        wall += runs_wall_s(folder, swept)
        rows += [{"dataset": name, "cost": r["budget.cost_units"], "epsilon": r["dp_pasgd.epsilon"], **r} for r in swept]
    return rows, wall


def run_e2(datasets: dict[str, Dataset], out: Path, workers: int) -> None:
    write("e2", E2_COLUMNS, *e2_runs(datasets, out, workers, E2_SEEDS))


def e3_settings() -> list[tuple[float, float]]:
    pairs = {(c, e) for c in E3_COSTS for e in EPSILONS} | {(c, e) for c in E3_COST_SETTINGS for e in E3_EPSILONS}
    return sorted(pairs)


def planned_config(config: Config) -> Config:
    """``config`` with the planner choosing τ, K and σ (dp_pasgd.tau = "plan")."""
    return replace(config, dp_pasgd={"tau": "plan", "epsilon": 10.0}, budget={"cost_units": 1000.0})


def planned_point(cost: float, epsilon: float, seed: int) -> Point:
    return Point((("budget.cost_units", cost), ("dp_pasgd.epsilon", epsilon)), seed)


def _planned_runs(configs: dict[str, Config], settings: list[tuple[float, float]], seeds: Iterable[int], out: Path,
                  workers: int) -> tuple[list[dict], float]:
    """Runs of dp_pasgd.tau = "plan" for each dataset's config at each (C_th, ε_th) and seed."""
    rows, wall, seeds = [], 0.0, list(seeds)
    for name, config in configs.items():
        config = planned_config(config)
        points = [planned_point(c, e, s) for c, e in settings for s in seeds]
        folder = out / name
        swept = run_sweep(config, points, folder, workers=workers, quiet=True)
        wall += runs_wall_s(folder, swept)
        rows += [{"dataset": name, "cost": r["budget.cost_units"], "epsilon": r["dp_pasgd.epsilon"],
                  **{k: r[k] for k in PLANNED}} for r in swept]
    return rows, wall


def run_e3(datasets: dict[str, Dataset], out: Path, workers: int) -> None:
    rows, wall = _planned_runs({n: ds.base for n, ds in datasets.items()}, e3_settings(), E3_SEEDS, out / "e3", workers)
    write("e3", ("dataset", "cost", "epsilon", *PLANNED), rows, wall)


def planfit_runs(datasets: dict[str, Dataset], out: Path, workers: int, seeds: Iterable[int]) -> tuple[list[dict], float]:
    settings = [(c, e) for c in E2_BUDGETS for e in EPSILONS]
    return _planned_runs({n: fitted(ds) for n, ds in datasets.items()}, settings, seeds, out / "planfit", workers)


def run_planfit(datasets: dict[str, Dataset], out: Path, workers: int) -> None:
    write("planfit", ("dataset", "cost", "epsilon", *PLANNED), *planfit_runs(datasets, out, workers, E2_SEEDS),
          noise_dimension={n: ds.info["noise_dimension"] for n, ds in datasets.items()})


def _rerun_row(scenario: str, datasets: dict[str, Dataset], row: dict, scratch: Path) -> dict:
    """One committed row of e2 or planfit run again (its dataset, setting and seed) in ``scratch``."""
    ds = datasets[row["dataset"]]
    if scenario == "e2":
        swept = run_sweep(ds.base, [e2_point(row["cost"], row["epsilon"], row["tau"], row["steps"], row["seed"])],
                          scratch, workers=1, quiet=True)[0]
        return {"dataset": ds.name, "cost": swept["budget.cost_units"], "epsilon": swept["dp_pasgd.epsilon"], **swept}
    swept = run_sweep(planned_config(fitted(ds)), [planned_point(row["cost"], row["epsilon"], row["seed"])], scratch,
                      workers=1, quiet=True)[0]
    return {"dataset": ds.name, "cost": swept["budget.cost_units"], "epsilon": swept["dp_pasgd.epsilon"],
            **{k: swept[k] for k in PLANNED}}


#: The scenarios ``--extend`` adds seeds to (the ones the plan asks more of): their runs at given seeds.
EXTENDABLE: dict[str, Callable[..., tuple[list[dict], float]]] = {"e2": e2_runs, "planfit": planfit_runs}


def extend(scenario: str, datasets: dict[str, Dataset], out: Path, workers: int, seeds: int) -> None:
    """Add to data/<scenario>.json only the seeds it lacks (``seeds`` in all), after rerunning its cheapest
    committed run (the fewest steps, the first seed): SystemExit (one line) unless that reproduces the
    committed row, so the extended file is what a full regeneration would give."""
    import tempfile

    table = read(scenario)
    raw = json.loads((DATA / f"{scenario}.json").read_text())
    columns = raw["columns"]
    have = sorted({r["seed"] for r in table.rows})
    if have != list(range(len(have))):
        raise SystemExit(f"{scenario}: refusing to extend: its seeds {have} are not 0, 1, ..., {len(have) - 1}")
    if seeds <= len(have):
        print(f"{scenario}: {len(have)} seeds committed, {seeds} asked: nothing to run", flush=True)
        return
    cheapest = min(table.rows, key=lambda r: (r["steps"], r["seed"]))
    with tempfile.TemporaryDirectory() as scratch:
        rerun = compact({c: _rerun_row(scenario, datasets, cheapest, Path(scratch))[c] for c in columns})
    found = first_mismatch(cheapest, rerun)
    if found:
        raise SystemExit(f"{scenario}: refusing to extend: seed {cheapest['seed']} of {cheapest['dataset']} at "
                         f"{cheapest['steps']} steps does not reproduce the committed run ({found})")
    print(f"{scenario}: seed {cheapest['seed']} of {cheapest['dataset']} at {cheapest['steps']} steps reproduces "
          "the committed run", flush=True)
    rows, wall = EXTENDABLE[scenario](datasets, out, workers, range(len(have), seeds))
    setting = columns[:columns.index("seed")]  # a full run's rows: every setting in order, its seeds within it
    position: dict[tuple, int] = {}
    for r in table.rows:
        position.setdefault(tuple(r[c] for c in setting), len(position))
    merged = sorted(table.rows + [compact({c: r[c] for c in columns}) for r in rows],
                    key=lambda r: (position[tuple(r[c] for c in setting)], r["seed"]))
    write(scenario, columns, merged, table.wall_s + wall, **table.extra)


def run_e4(datasets: dict[str, Dataset], skipped: list[str]) -> None:
    start = time.monotonic()
    maps: dict[str, dict[str, list[list[int]]]] = {}
    for name, ds in datasets.items():
        variants = {"corrected": (ds.base, "corrected"), "paper_literal": (ds.base, "paper_literal"),
                    "d_eff": (fitted(ds), "corrected")}
        maps[name] = {v: [[planned(base, ds, c, e, cal).tau for c in E3_COSTS] for e in E3_EPSILONS]
                      for v, (base, cal) in variants.items()}
    write("e4", (), [], time.monotonic() - start, maps=maps, info={n: ds.info for n, ds in datasets.items()},
          skipped=skipped)


def run_learns(out: Path, workers: int) -> None:
    config = load_config(HERE / "learns.toml")
    data = load_data(config.data, config.run.seed)
    points = [Point((("dp_pasgd.epsilon", e),), s) for e in LEARNS_EPSILONS
              for s in (LEARNS_SEEDS if e == LEARNS_EPSILON else LEARNS_SEEDS[:5])]
    folder = out / "learns"
    swept = run_sweep(config, points, folder, workers=workers, quiet=True)
    rows = [{"epsilon": r["dp_pasgd.epsilon"], **r} for r in swept]
    write("learns", ("epsilon", "seed", "test_accuracy", "validation_accuracy", "train_loss", "epsilon_max", "sigma"),
          rows, runs_wall_s(folder, swept), majority=majority_share(data), chance=1.0 / data.n_classes,
          run_wall_s={str(r["seed"]): _wall(folder, r) for r in swept if r["dp_pasgd.epsilon"] == LEARNS_EPSILON})


def _wall(folder: Path, row: dict) -> float:
    return runs_wall_s(folder, [row])


# --- the grid's design (e2): K, then τ*, chosen on validation ---------------------------------------


# --- figures ------------------------------------------------------------------------------------------


# --- report -------------------------------------------------------------------------------------------


SCENARIOS: dict[str, Callable] = {"e1": run_e1, "e2": run_e2, "e3": run_e3, "planfit": run_planfit}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "dp-pasgd-reproduce", help="the sweeps' folder")
    parser.add_argument("--workers", type=int, default=1, help="parallel runs (default 1)")
    parser.add_argument("--only", nargs="+", choices=[*SCENARIOS, "e4", "learns"], help="run only these scenarios")
    parser.add_argument("--report-only", action="store_true", help="rewrite REPORT.md and the figures from data/ alone")
    parser.add_argument("--plan-seeds", action="store_true",
                        help="print each scenario's seeds by power from the committed data; run nothing")
    parser.add_argument("--extend", action="store_true",
                        help=f"add to {' and '.join(EXTENDABLE)} only the seeds their data lack, up to --seeds (after "
                             "checking a committed run reproduces); the other scenarios are left as they are")
    parser.add_argument("--seeds", type=int, default=len(E2_SEEDS),
                        help="with --extend: the seeds e2 and planfit hold afterwards (default: E2_SEEDS)")
    args = parser.parse_args(argv)
    if args.seeds < 2:
        parser.error(f"--seeds must be at least 2 (a paired comparison needs two pairs), got {args.seeds}")
    if args.plan_seeds:
        tables = {k: read(k) for k in ("e1", "e2", "e3", "e4", "planfit", "learns")}
        with recording() as made:
            report(tables)
        print("\n".join(plan_table(seed_plans(tables, made))))
        return 0
    if not args.report_only:
        chosen = args.only or [*SCENARIOS, "e4", "learns"]
        datasets: dict[str, Dataset] = {}
        skipped: list[str] = []
        for name in DATASETS:
            ready = setup(name)
            if ready is None:
                skipped.append(name)
            else:
                datasets[name] = ready
        for key in chosen:
            start = time.monotonic()
            if args.extend:
                if key in EXTENDABLE:
                    extend(key, datasets, args.out, args.workers, args.seeds)
            elif key == "e4":
                run_e4(datasets, skipped)
            elif key == "learns":
                run_learns(args.out, args.workers)
            else:
                SCENARIOS[key](datasets, args.out, args.workers)
            print(f"{key}: {time.monotonic() - start:.0f} s", flush=True)
    tables = {k: read(k) for k in ("e1", "e2", "e3", "e4", "planfit", "learns")}
    draw_figures(tables)
    with recording() as families:
        text = report(tables)
    write_report(HERE / "REPORT.md", text, families)
    print(f"report: {HERE / 'REPORT.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
