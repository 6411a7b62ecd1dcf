"""Reproduce the experiments of DP-PASGD (Hu et al., arXiv 2003.12705, §8) on Adult-1 and Adult-2.

    python experiments/dp_pasgd/reproduce.py [--only e1 e2 ...] [--out runs/dp-pasgd-reproduce] [--workers 1]
    python experiments/dp_pasgd/reproduce.py --report-only

Each scenario runs through the sweep engine (testbed.orchestration.sweep, local processes; the sweep
folder keeps finished runs, so a rerun only runs what is missing) and writes its compact results to
data/<scenario>.json (experiments/dp_pasgd/results_data.py); REPORT.md and the figures are then
generated from data/ alone, which is all ``--report-only`` does. c1 = 100, c2 = 1, δ = 1e-4.
Vehicle-1/-2 run too when vehicle.mat is found under $TESTBED_DATA; otherwise they are skipped with
a note. Settings shared by every run: base.toml (why each was chosen is written there).

- e1 (Fig. 2): accuracy against resource cost up to C = 1000 at ε = 10, DP-PASGD (τ = 10, K = 90)
  against DP-SGD (τ = 1, K = 9), 10 seeds.
- e2 (Fig. 3): grid over τ ∈ E2_TAUS for C_th ∈ {500, 1000}, ε_th ∈ {1, 2, 4, 10}, 5 seeds. The
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

The bound constants L, λ, ξ², α are estimated once per dataset (seed 0, testbed.planning.estimate)
and written into [plan] of every run, so e2's markers, e3's runs and e4's map use the same ones.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))

from results_data import by_seed, mean_ci, read, runs_wall_s, write  # noqa: E402

from testbed.assembly.assemble import load_data, model_for  # noqa: E402
from testbed.assembly.config import Config, load_config, replace  # noqa: E402
from testbed.errors import DataError  # noqa: E402
from testbed.learning.models import LogisticRegression  # noqa: E402
from testbed.orchestration.sweep import Point, run_sweep  # noqa: E402
from testbed.planning.dp_pasgd import lr_tau_cap  # noqa: E402
from testbed.planning.estimate import noise_dimension, smoothness  # noqa: E402
from testbed.planning.resolve import make_plan, plan_inputs  # noqa: E402
from testbed.reports.results import read_metrics  # noqa: E402
from testbed.reports.stats import t_interval  # noqa: E402
from testbed.reports.verdicts import RULE, Family, Pending, Verdict, fill_all, recording, write_report  # noqa: E402

#: What each dataset changes in base.toml. Adult-1's smallest device has 40 training samples.
DATASETS: dict[str, dict[str, dict[str, Any]]] = {
    "adult-1": {"data": {"dataset": "adult-1"}, "dp_pasgd": {"batch": 32}},
    "adult-2": {"data": {"dataset": "adult-2"}, "dp_pasgd": {"batch": 512}},
    "vehicle-1": {"data": {"dataset": "vehicle-1", "scaling": "pooled"}, "model": {"kind": "svm"}, "dp_pasgd": {"batch": 512}},
    "vehicle-2": {"data": {"dataset": "vehicle-2", "scaling": "pooled"}, "model": {"kind": "svm"}, "dp_pasgd": {"batch": 512}},
}
#: Data sets skipped with a note when their file is missing (vehicle.mat has no download source).
OPTIONAL = ("vehicle-1", "vehicle-2")
E1_SEEDS = range(10)
E2_SEEDS = range(5)
E3_SEEDS = range(10)
LEARNS_SEEDS = range(10)
E2_BUDGETS = (500.0, 1000.0)
E2_TAUS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 15, 20)
EPSILONS = (1.0, 2.0, 4.0, 10.0)
E3_COSTS = tuple(float(c) for c in range(200, 1001, 100))
E3_EPSILONS = tuple(float(e) for e in range(1, 11))
E3_COST_SETTINGS = (200.0, 500.0, 800.0, 1000.0)
LEARNS_EPSILONS = (1.0, 2.0, 4.0, 10.0)
#: ε_th of learns.toml: the paper's largest privacy budget (E1 and the top of its ε_th range).
LEARNS_EPSILON = 10.0
CONSTANTS = ("smoothness", "strong_convexity", "grad_variance", "initial_gap")
E1_SCHEMES = {"DP-PASGD (τ=10, K=90)": (10, 90), "DP-SGD (τ=1, K=9)": (1, 9)}
#: What data/ keeps of a run of the planned design (τ, K, σ: the plan; ε: the ledger's spend).
PLANNED = ("seed", "tau", "steps", "sigma", "test_accuracy", "train_loss", "epsilon_max")


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


def group(rows: Iterable[dict], *keys: str) -> dict[tuple, list[dict]]:
    out: dict[tuple, list[dict]] = defaultdict(list)
    for r in rows:
        out[tuple(r[k] for k in keys)].append(r)
    return dict(out)


def mean(values: Iterable[float]) -> float:
    return float(np.mean(list(values)))


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


def run_e2(datasets: dict[str, Dataset], out: Path, workers: int) -> None:
    rows, wall = [], 0.0
    for name, ds in datasets.items():
        points = [Point((("budget.cost_units", c), ("dp_pasgd.epsilon", e), ("dp_pasgd.tau", t), ("dp_pasgd.steps", r * t)), s)
                  for c in E2_BUDGETS for e in EPSILONS for t in E2_TAUS for r in e2_rounds(c, t) for s in E2_SEEDS]
        folder = out / "e2" / name
        swept = run_sweep(ds.base, points, folder, workers=workers, quiet=True)
        wall += runs_wall_s(folder, swept)
        rows += [{"dataset": name, "cost": r["budget.cost_units"], "epsilon": r["dp_pasgd.epsilon"], **r} for r in swept]
    write("e2", ("dataset", "cost", "epsilon", "tau", "steps", "seed", "test_accuracy", "validation_accuracy", "train_loss"),
          rows, wall)


def e3_settings() -> list[tuple[float, float]]:
    pairs = {(c, e) for c in E3_COSTS for e in EPSILONS} | {(c, e) for c in E3_COST_SETTINGS for e in E3_EPSILONS}
    return sorted(pairs)


def _planned_runs(configs: dict[str, Config], settings: list[tuple[float, float]], seeds: range, out: Path,
                  workers: int) -> tuple[list[dict], float]:
    """Runs of dp_pasgd.tau = "plan" for each dataset's config at each (C_th, ε_th) and seed."""
    rows, wall = [], 0.0
    for name, config in configs.items():
        config = replace(config, dp_pasgd={"tau": "plan", "epsilon": 10.0}, budget={"cost_units": 1000.0})
        points = [Point((("budget.cost_units", c), ("dp_pasgd.epsilon", e)), s) for c, e in settings for s in seeds]
        folder = out / name
        swept = run_sweep(config, points, folder, workers=workers, quiet=True)
        wall += runs_wall_s(folder, swept)
        rows += [{"dataset": name, "cost": r["budget.cost_units"], "epsilon": r["dp_pasgd.epsilon"],
                  **{k: r[k] for k in PLANNED}} for r in swept]
    return rows, wall


def run_e3(datasets: dict[str, Dataset], out: Path, workers: int) -> None:
    rows, wall = _planned_runs({n: ds.base for n, ds in datasets.items()}, e3_settings(), E3_SEEDS, out / "e3", workers)
    write("e3", ("dataset", "cost", "epsilon", *PLANNED), rows, wall)


def run_planfit(datasets: dict[str, Dataset], out: Path, workers: int) -> None:
    settings = [(c, e) for c in E2_BUDGETS for e in EPSILONS]
    rows, wall = _planned_runs({n: fitted(ds) for n, ds in datasets.items()}, settings, E2_SEEDS, out / "planfit", workers)
    write("planfit", ("dataset", "cost", "epsilon", *PLANNED), rows, wall,
          noise_dimension={n: ds.info["noise_dimension"] for n, ds in datasets.items()})


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

def grid_choice(rows: list[dict]) -> tuple[int, int]:
    """(τ*, K*) of one budget case: per τ the K of the best mean validation accuracy, then the τ of
    the best mean validation accuracy at its K (ties: the smaller K and τ)."""
    best: dict[int, tuple[int, float]] = {}
    for (tau,), tau_rows in sorted(group(rows, "tau").items()):
        by_k = sorted(group(tau_rows, "steps").items())
        (k,), k_rows = max(by_k, key=lambda kv: mean(r["validation_accuracy"] for r in kv[1]))
        best[tau] = (k, mean(r["validation_accuracy"] for r in k_rows))
    tau = max(best, key=lambda t: best[t][1])
    return tau, best[tau][0]


def seed_tau_star(rows: list[dict]) -> dict[int, int]:
    """seed → τ* chosen on that seed's validation accuracy alone (the same rule as grid_choice)."""
    return {seed: grid_choice(seed_rows)[0] for (seed,), seed_rows in group(rows, "seed").items()}


# --- figures ------------------------------------------------------------------------------------------

def _band(ax, xs, runs: list[list[float]], label: str, **style) -> None:
    """Mean over runs (one list per run, aligned with xs) with its 95 % t band."""
    s = t_interval(np.array(runs).T)
    line, = ax.plot(xs, s.mean, label=label, **style)
    if len(runs) > 1:
        ax.fill_between(xs, s.ci_low, s.ci_high, color=line.get_color(), alpha=0.2)


def draw_figures(t: dict[str, Any]) -> None:
    e1, e2, e3, e4 = t["e1"], t["e2"], t["e3"], t["e4"]
    names = list(e4.extra["info"])
    fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 3.2), squeeze=False)
    for ax, name in zip(axes[0], names):
        for label, (tau, _k) in E1_SCHEMES.items():
            curve = e1.extra["curves"][name][str(tau)]
            runs = list(curve["accuracy"].values())
            n = min(len(r) for r in runs)
            _band(ax, curve["cost"][:n], [r[:n] for r in runs], label, marker="o", ms=3)
        ax.axhline(e4.extra["info"][name]["majority"], color="grey", ls=":", label="majority class")
        ax.set(title=f"{name}: ε = 10, C ≤ 1000", xlabel="resource cost (c1=100, c2=1)", ylabel="test accuracy", xlim=(0, 1000))
        ax.legend(fontsize=7)
    _save(fig, "fig_e1.png")
    fig, axes = plt.subplots(len(names), len(E2_BUDGETS), figsize=(9, 3.2 * len(names)), squeeze=False)
    for i, name in enumerate(names):
        for j, c in enumerate(E2_BUDGETS):
            ax = axes[i][j]
            for e in EPSILONS:
                case = [r for r in e2.rows if r["dataset"] == name and r["cost"] == c and r["epsilon"] == e]
                ks = {tau: grid_choice(rs)[1] for (tau,), rs in group(case, "tau").items()}
                taus = sorted(ks)
                runs = [[by_seed(case, "test_accuracy", tau=tau, steps=ks[tau])[s] for tau in taus] for s in E2_SEEDS]
                _band(ax, taus, runs, f"ε = {e:g}")
            ax.axhline(e4.extra["info"][name]["majority"], color="grey", ls=":")
            ax.set(title=f"{name}, C_th = {c:g} (K tuned per τ)", xlabel="τ", ylabel="test accuracy")
            ax.legend(fontsize=7)
    _save(fig, "fig_e2.png")
    for fname, xs, settings, fixed, x_label, key in (
        ("fig_e3_cost.png", E3_COSTS, EPSILONS, "ε = {:g}", "resource budget C_th", lambda x, s: (x, s)),
        ("fig_e3_privacy.png", E3_EPSILONS, E3_COST_SETTINGS, "C_th = {:g}", "privacy budget ε_th", lambda x, s: (s, x)),
    ):
        fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 3.2), squeeze=False)
        for ax, name in zip(axes[0], names):
            cells = group([r for r in e3.rows if r["dataset"] == name], "cost", "epsilon")
            for s in settings:
                runs = [[by_seed(cells[key(x, s)], "test_accuracy")[seed] for x in xs] for seed in E3_SEEDS]
                _band(ax, xs, runs, fixed.format(s), marker="o", ms=3)
            ax.axhline(e4.extra["info"][name]["majority"], color="grey", ls=":")
            ax.set(title=f"{name}: planned design", xlabel=x_label, ylabel="test accuracy")
            ax.legend(fontsize=7)
        _save(fig, fname)
    fig, axes = plt.subplots(1, len(names), figsize=(4.4 * len(names), 3.4), squeeze=False)
    for ax, name in zip(axes[0], names):
        grid = e4.extra["maps"][name]["corrected"]
        im = ax.imshow(grid, origin="lower", aspect="auto", cmap="viridis",
                       extent=(E3_COSTS[0] - 50, E3_COSTS[-1] + 50, 0.5, 10.5))
        ax.set(title=f"{name}: planned τ*", xlabel="C_th", ylabel="ε_th")
        fig.colorbar(im, ax=ax)
    _save(fig, "fig_e4.png")
    learns = t["learns"]
    fig, ax = plt.subplots(figsize=(4.4, 3.2))
    eps = sorted({r["epsilon"] for r in learns.rows})
    s = [t_interval([r["test_accuracy"] for r in learns.rows if r["epsilon"] == e]) for e in eps]
    ax.errorbar(eps, [float(x.mean) for x in s], yerr=[[float(x.mean - x.ci_low) for x in s], [float(x.ci_high - x.mean) for x in s]],
                marker="o", capsize=3, label="DP-PASGD (learns.toml)")
    ax.axhline(learns.extra["majority"], color="grey", ls=":", label="majority class")
    ax.axhline(learns.extra["chance"], color="grey", ls="--", label="chance")
    ax.set(title="MNIST (5k): accuracy against ε_th", xlabel="ε_th (δ = 1e-4)", ylabel="test accuracy", xscale="log", ylim=(0, 1))
    ax.legend(fontsize=7)
    _save(fig, "fig_learns.png")


def _save(fig, name: str) -> None:
    fig.tight_layout()
    fig.savefig(HERE / name, dpi=80)
    plt.close(fig)


# --- report -------------------------------------------------------------------------------------------

def v(verdict: Verdict | Pending) -> str:
    return verdict.markdown()


def words(verdicts: Iterable[Verdict | Pending]) -> str:
    """How many verdicts of each word, e.g. "3 shown, 5 inconclusive" (their families closed)."""
    counts: dict[str, int] = defaultdict(int)
    for x in verdicts:
        counts[x.word] += 1
    return ", ".join(f"{n} {w}" for w, n in sorted(counts.items()))


def report(t: dict[str, Any]) -> str:
    e1, e2, e3, e4, fit, learns = (t[k] for k in ("e1", "e2", "e3", "e4", "planfit", "learns"))
    info = e4.extra["info"]
    names = list(info)
    L: list[str] = []
    add = L.append
    families: list[Family] = []

    def family(name: str) -> Family:
        families.append(Family(name))
        return families[-1]

    walls = {"e1": e1.wall_s, "e2": e2.wall_s, "e3": e3.wall_s, "e4": e4.wall_s, "planfit": fit.wall_s, "learns": learns.wall_s}
    add("# DP-PASGD (Hu et al.) §8 reproduced on Adult\n")
    add("Generated by `experiments/dp_pasgd/reproduce.py` from `data/*.json` (`--report-only` rewrites this file "
        "from them); do not edit by hand. The metric is the test accuracy averaged over devices (the paper's); "
        "c1 = 100, c2 = 1, δ = 1e-4, zCDP accounting of eq. (9) with the corrected σ root. E1–E3 with a CNN on "
        "the 8×8 digits: `REPORT-cnn.md`.\n")
    add(RULE + " Accuracies are given as mean [95 % t interval] over seeds.\n")
    majorities = ", ".join(f"{n} {info[n]['majority']:.4f}" for n in names)
    share = {n: info[n]["majority"] for n in names}  # the flags' majority share per dataset
    add(f"**Chance and majority.** Two classes: chance is 0.5; always guessing the majority class (income ≤ 50K) "
        f"scores {majorities} (device-averaged, seed 0's split). An accuracy at the majority share shows nothing "
        "about learning or convergence, and many designs below sit there: every accuracy cell whose 95 % interval "
        "holds the majority share is flagged ⚑ at majority (⚑ below majority where it lies below).\n")
    add("**Compute.** Measured wall time of the runs, one worker on this 2-core machine (the sum of the runs' own "
        "measured times, recorded in each scenario's data file): "
        + ", ".join(f"{k} {w:.0f} s" for k, w in walls.items()) + f"; **{sum(walls.values()) / 60:.1f} min** in all "
        "(measured while other jobs shared the two cores, which the runs' own times include). "
        f"Seeds: e1 {len(E1_SEEDS)}, e2 {len(E2_SEEDS)} (its {len(e2.rows)} runs are most of the compute; 10 seeds "
        f"would double it), e3 {len(E3_SEEDS)}, planfit {len(E2_SEEDS)} (the seeds of e2 it is paired with), learns "
        f"{len(LEARNS_SEEDS)} at ε_th = {LEARNS_EPSILON:g} and 5 at each other ε_th.\n")
    for name in e4.extra["skipped"]:
        add(f"- {name}: skipped — vehicle.mat (the Vehicle Sensor data set as packaged for MOCHA) was not found "
            "under $TESTBED_DATA and has no download source.")
    add("\n## Set-up\n")
    add("Settings (why: `base.toml`): softmax logistic regression without bias on the one-hot categorical "
        "features (d = 172), η = 1, batch 512 on Adult-2 and 32 on Adult-1 (its smallest device, Preschool, has 40 "
        "training samples), uniform mini-batches, no clipping (G = √2 is the model's bound on unit-ball data). "
        "Bound constants estimated at θ⁰ = 0 on seed 0's training split (`testbed.planning.estimate`: L by "
        "Böhning's bound, λ = the PL ratio at θ⁰ — optimistic, since unregularised logistic regression is not "
        "strongly convex —, ξ² exact for the batch size including the node drift, α = L(θ⁰)); d_eff = tr(H̄)/L is "
        "the improved noise dimension of the planner section below:\n")
    add("| dataset | L | λ | ξ² | α | d | d_eff | M | G | majority share |")
    add("|---|---|---|---|---|---|---|---|---|---|")
    for name in names:
        c, i = info[name]["constants"], info[name]
        add(f"| {name} | {c['smoothness']:.4g} | {c['strong_convexity']:.4g} | {c['grad_variance']:.4g} | "
            f"{c['initial_gap']:.4g} | {i['d']} | {i['noise_dimension']:.3g} | {i['M']} | {i['G']:.4g} | {i['majority']:.4f} |")
    caps = ", ".join(f"{n}: τ ≤ {info[n]['tau_cap']}" for n in names)
    add(f"\nThe lr condition (21e) ηL + η²L²τ(τ−1) ≤ 1 of Theorem 1 caps the planner's τ ({caps}).\n")
    add(f"E2's grid: τ ∈ {{{', '.join(map(str, E2_TAUS))}}}; the paper's \"K from 200 to C_th/(c1/τ+c2)\" is empty "
        "under its own costs (at most 166 steps fit in C_th = 1000), so K takes two values per τ, the most whole "
        "rounds R = ⌊C_th/(c1+c2τ)⌋ and ⌈R/2⌉ rounds. K per τ, then τ*, are chosen on the mean validation accuracy "
        "as the paper tunes on validation (ties go to the smaller K and τ: many designs stay at the majority class); "
        "every verdict is on the test accuracy, so the choice and the claim do not share their noise.\n")

    add("## E1 — resource efficiency (Fig. 2, `fig_e1.png`)\n")
    add("> \"for all of the data distribution cases, DP-PASGD always achieves higher accuracy than DP-SGD\"\n")
    add("| dataset | DP-PASGD τ=10, K=90 | DP-SGD τ=1, K=9 | verdict (a = DP-PASGD, b = DP-SGD) | ε spent (max) | cost (max) |")
    add("|---|---|---|---|---|---|")
    e1_verdicts = []
    f_e1 = family("E1: DP-PASGD above DP-SGD, per dataset")
    for name in names:
        rows = [r for r in e1.rows if r["dataset"] == name]
        a, b = by_seed(rows, "test_accuracy", tau=10), by_seed(rows, "test_accuracy", tau=1)
        e1_verdicts.append(f_e1.paired(a, b, "a>b"))
        add(f"| {name} | {mean_ci(list(a.values()), majority=share[name])} | {mean_ci(list(b.values()), majority=share[name])} | {v(e1_verdicts[-1])} | "
            f"{max(r['epsilon_max'] for r in rows):.3g} | {max(r['cost_max'] for r in rows):g} |")
    f_e1.close()
    add(f"\n{f_e1.description()} Verdicts: {words(e1_verdicts)} of {len(names)} datasets. DP-SGD's 9 steps leave the model at the majority "
        "class; on Adult-1 DP-PASGD's 90 noisy steps (batch 32) do not get above it either.\n")

    add("## E2 — the grid's τ* (Fig. 3, `fig_e2.png`)\n")
    add("> \"there exists an optimal aggregation period τ* that maximizes the learning performance under the privacy "
        "and resource budgets\"\n")
    add(f"Per budget case: τ* (and its K) chosen on validation, its test accuracy, and paired verdicts of τ* against "
        f"the grid's ends τ = 1 and τ = {E2_TAUS[-1]} (claim: τ* beats both; an interior optimum needs both shown).\n")
    add(f"| dataset | C_th | ε_th | τ*, K* | acc at τ* | acc at τ = 1 | τ* vs τ = 1 | τ* vs τ = {E2_TAUS[-1]} |")
    add("|---|---|---|---|---|---|---|---|")
    f_e2 = family("E2: τ* against the grid's ends, every case")
    e2_ends: list[dict] = []
    choices: dict[tuple, tuple[int, int]] = {}
    cases = group(e2.rows, "dataset", "cost", "epsilon")
    for name in names:
        for c in E2_BUDGETS:
            for e in EPSILONS:
                rows = cases[(name, c, e)]
                tau, k = choices[(name, c, e)] = grid_choice(rows)
                ends = {}
                for end in (E2_TAUS[0], E2_TAUS[-1]):
                    if end == tau:
                        ends[end] = "τ* is this end"
                        continue
                    k_end = grid_choice([r for r in rows if r["tau"] == end])[1]
                    ends[end] = f_e2.paired(by_seed(rows, "test_accuracy", tau=tau, steps=k),
                                            by_seed(rows, "test_accuracy", tau=end, steps=k_end), "a>b")
                e2_ends.append(ends)
                k1 = grid_choice([r for r in rows if r["tau"] == 1])[1]
                add(f"| {name} | {c:g} | {e:g} | {tau}, {k} | {mean_ci(list(by_seed(rows, 'test_accuracy', tau=tau, steps=k).values()), majority=share[name])} | "
                    f"{mean_ci(list(by_seed(rows, 'test_accuracy', tau=1, steps=k1).values()), majority=share[name])} | "
                    + " | ".join(x if isinstance(x, str) else v(x) for x in ends.values()) + " |")
    f_e2.close()
    interior = [all(isinstance(x, Pending) and x.word == "shown" for x in ends.values()) for ends in e2_ends]
    at_end = {n: [choices[(n, c, e)][0] for c in E2_BUDGETS for e in EPSILONS] for n in names}
    add(f"\n{f_e2.description()} Verdict: an interior optimum (τ* beats both ends, each paired comparison shown) in **{sum(interior)} of "
        f"{len(interior)}** cases. τ* is chosen on validation from {len(E2_TAUS)} values and judged on test, so the "
        "comparisons against the ends are not inflated by the choice; where τ* is an end, the claim fails for that case. "
        "τ* is the grid's largest τ in " + ", ".join(f"{at_end[n].count(E2_TAUS[-1])} of {len(at_end[n])} cases on {n}"
                                                      for n in names)
        + " (the paper's grid also ends at τ = 20), and τ = 1 in "
        + ", ".join(f"{at_end[n].count(E2_TAUS[0])} on {n}" for n in names) + ".\n")
    tau_eps, tau_cost = [], []
    f_eps, f_cost = family("E2: τ* rises with ε_th"), family("E2: τ* falls with C_th")
    for name in names:
        for c in E2_BUDGETS:
            xs, ys, seeds = [], [], []
            for e in EPSILONS:
                for seed, tau in seed_tau_star(cases[(name, c, e)]).items():
                    xs.append(e)
                    ys.append(tau)
                    seeds.append(seed)
            tau_eps.append((name, c, f_eps.trend(xs, ys, "increasing", units=xs, cluster=seeds)))
        for e in EPSILONS:
            xs, ys, seeds = [], [], []
            for c in E2_BUDGETS:
                for seed, tau in seed_tau_star(cases[(name, c, e)]).items():
                    xs.append(c)
                    ys.append(tau)
                    seeds.append(seed)
            tau_cost.append((name, e, f_cost.trend(xs, ys, "decreasing", units=xs, cluster=seeds)))
    add("> \"when the privacy budget ε_th increases from 1 to 10, the optimal value of τ* would almost always increase\"\n")
    add("τ* per seed (chosen on that seed's validation accuracy) against ε_th ∈ {1, 2, 4, 10}, per dataset and C_th "
        f"(the runs repeat each ε_th over the seeds: ρ within each seed, n = seeds). {f_eps.description()}\n")
    add("| dataset | C_th | verdict |")
    add("|---|---|---|")
    for name, c, x in tau_eps:
        add(f"| {name} | {c:g} | {v(x)} |")
    add("\n> \"when the resource budget C_th changes from 500 to 1000, the optimal value of τ* would almost always decrease\"\n")
    add(f"{f_cost.description()}\n")
    add("| dataset | ε_th | verdict (τ* per seed against C_th ∈ {500, 1000}) |")
    add("|---|---|---|")
    for name, e, x in tau_cost:
        add(f"| {name} | {e:g} | {v(x)} |")
    add("")

    add("## The planner against the grid (Fig. 3's stars; issue 29)\n")
    add("> \"the value of τ found by our proposed approach … is very close to the optimal one obtained by the grid "
        "search under all cases\"\n")
    add("The planned design (τ, K, σ) at the same budgets, run on the same seeds as the grid (0–4; e3's and "
        "planfit's runs), against the grid's best (τ*, K*) chosen on validation. *Lands*: the plan's mean test accuracy "
        "is at or above the lower end of the grid best's 95 % interval. The verdict is the paired comparison "
        "a = grid best, b = plan on the claim \"a > b\": **shown** means the plan is detectably worse (the paper's "
        "claim fails there), **inconclusive** that no difference is detected.\n")
    add("Two sets of constants: the paper's bound (noise charged with d = 172 parameters) and the improved estimate "
        "of its noise dimension, d_eff = tr(H̄)/L (`[plan] noise_dimension = \"trace\"`, "
        "`testbed.planning.estimate.noise_dimension`). Theorem 1 charges each step's noise b ~ N(0, σ²I) through "
        "L-smoothness, (L/2)·η²·E||b||² = (L/2)·η²·d·σ²; with Böhning's matrix bound ∇²L ⪯ H̄ = ½·S ⊗ (I − 11ᵀ/C), "
        "valid at every θ, the same step is ½·η²·σ²·tr(H̄) = (L/2)·η²·d_eff·σ². Rows in the unit ball give "
        "tr(S) ≤ 1, and on Adult S has one dominant direction, so d_eff ≈ 2: the paper's d overstates the noise's "
        "cost " + ", ".join(f"{info[n]['d'] / info[n]['noise_dimension']:.0f}-fold on {n}" for n in names)
        + ", which is why its plans stop after a handful of steps.\n")
    add("| dataset | C_th | ε_th | grid best τ*, K*: acc | plan (d): τ, K, σ: acc | lands | grid − plan (d) | "
        "plan (d_eff): τ, K, σ: acc | lands | grid − plan (d_eff) | grid best with τ ≤ cap: τ, K: acc |")
    add("|---|---|---|---|---|---|---|---|---|---|---|")
    e3_cells = group([r for r in e3.rows if r["seed"] in E2_SEEDS], "dataset", "cost", "epsilon")
    fit_cells = group(fit.rows, "dataset", "cost", "epsilon")
    lands: dict[str, dict[str, int]] = {n: {"d": 0, "d_eff": 0} for n in names}
    shortfall: dict[str, list[float]] = {n: [] for n in names}
    capped_gap: dict[str, list[float]] = {n: [] for n in names}
    out_of_reach: dict[str, int] = {n: 0 for n in names}  # cases where even the best τ ≤ cap misses the interval
    fit_at_cap: dict[str, int] = {n: 0 for n in names}  # cases where the d_eff plan lands in the capped best's interval
    above_majority: dict[str, int] = {n: 0 for n in names}  # cases where the grid best detectably beats the majority share
    plan_verdicts: dict[str, list[Pending]] = {"d": [], "d_eff": []}
    f_plan = family("the planner against the grid's best, every case and both constants")
    for name in names:
        cap = info[name]["tau_cap"]
        for c in E2_BUDGETS:
            for e in EPSILONS:
                tau, k = choices[(name, c, e)]
                case = cases[(name, c, e)]
                grid = by_seed(case, "test_accuracy", tau=tau, steps=k)
                low = float(t_interval(list(grid.values())).ci_low)
                above_majority[name] += low > info[name]["majority"]
                cells = [f"| {name} | {c:g} | {e:g} | {tau}, {k}: {mean_ci(list(grid.values()), majority=share[name])}"]
                for label, source in (("d", e3_cells), ("d_eff", fit_cells)):
                    rows = source[(name, c, e)]
                    plan = by_seed(rows, "test_accuracy")
                    verdict = f_plan.paired(grid, plan, "a>b")
                    plan_verdicts[label].append(verdict)
                    ok = mean(plan.values()) >= low
                    lands[name][label] += ok
                    if label == "d_eff":
                        shortfall[name].append(low - mean(plan.values()))
                    r0 = rows[0]
                    cells.append(f"{r0['tau']}, {r0['steps']}, {r0['sigma']:.3g}: {mean_ci(list(plan.values()), majority=share[name])} | "
                                 f"{'yes' if ok else 'no'} | {v(verdict)}")
                tau_c, k_c = grid_choice([r for r in case if r["tau"] <= cap])
                capped = by_seed(case, "test_accuracy", tau=tau_c, steps=k_c)
                capped_gap[name].append(mean(grid.values()) - mean(capped.values()))
                out_of_reach[name] += mean(capped.values()) < low
                fit_at_cap[name] += mean(by_seed(fit_cells[(name, c, e)], "test_accuracy").values()) >= float(
                    t_interval(list(capped.values())).ci_low)
                cells.append(f"{tau_c}, {k_c}: {mean_ci(list(capped.values()), majority=share[name])}")
                add(" | ".join(cells) + " |")
    n_cases = len(E2_BUDGETS) * len(EPSILONS)
    add("\nLands within the grid best's interval: " + "; ".join(
        f"{n}: {lands[n]['d']} of {n_cases} with d, {lands[n]['d_eff']} of {n_cases} with d_eff" for n in names) + ".")
    f_plan.close()
    add(f"{f_plan.description()} Paired verdicts (grid best > plan): with d {words(plan_verdicts['d'])}; with d_eff {words(plan_verdicts['d_eff'])}.\n")
    add("By how much, and why the plan cannot land everywhere: the largest gap between the lower end of the grid "
        "best's interval and the d_eff plan's mean is " + ", ".join(f"{max(shortfall[n]):+.4f} on {n}" for n in names)
        + ". The improved constant moves the plans to longer runs and larger τ, up to the cap of the lr condition "
        "(21e) of Theorem 1 (ηL ≈ 0.25 with η = 1: τ ≤ " + ", ".join(f"{info[n]['tau_cap']} on {n}" for n in names)
        + "). That cap is no estimate: it is the theorem's own condition with L the exact curvature at θ⁰ (Böhning's "
        "bound is attained there). The last column is the best any plan obeying it could do, the grid's best design "
        "with τ ≤ cap (chosen on validation); the grid's overall best beats it by "
        + ", ".join(f"{mean(capped_gap[n]):+.4f} on average (max {max(capped_gap[n]):+.4f}) on {n}" for n in names)
        + ". Its mean lies below the lower end of the grid best's interval in " + ", ".join(
            f"{out_of_reach[n]} of {n_cases} cases on {n}" for n in names)
        + ": there no choice of L, λ, ξ², α or d_eff can make a plan of Theorem 1 land, because the grid's best "
        "design needs τ beyond the cap. Within the cap, the d_eff plan lands in the interval of the capped best in "
        + ", ".join(f"{fit_at_cap[n]} of {n_cases} cases on {n}" for n in names) + ". The grid best's interval lies "
        "above the majority share in " + ", ".join(f"{above_majority[n]} of {n_cases} cases on {n}" for n in names)
        + ": elsewhere no design is detectably better than always guessing the majority class, and a plan that lands "
        "there shows nothing.\n")

    add("## Selection on held-out seeds (cross-fitted; issue 41)\n")
    add("τ* and the grid's best are chosen on validation accuracy of the same trained models whose test accuracy "
        "then judges them, and the two correlate over seeds, so an in-sample choice is judged with its own luck "
        "(winner's curse). Cross-fitted: for each seed, (τ*, K*) is chosen on the mean validation accuracy of the "
        "other seeds (and each end's K likewise), and only the held-out seed's test accuracy of that choice "
        "counts; the verdicts pair these held-out accuracies by seed.\n")
    f_cross = family("cross-fitted: τ* against the ends, and the grid's best against the plans, every case")
    add(f"{f_cross.description()}\n")
    add(f"| dataset | C_th | ε_th | τ* per held-out seed | acc (cross-fitted) | vs τ = 1 | vs τ = {E2_TAUS[-1]} | "
        "vs plan (d) | vs plan (d_eff) |")
    add("|---|---|---|---|---|---|---|---|---|")
    cross: dict[str, list[Pending]] = {"ends": [], "plans": []}
    for name in names:
        for c in E2_BUDGETS:
            for e in EPSILONS:
                case = cases[(name, c, e)]
                seeds = sorted({r["seed"] for r in case})
                picked, held = {}, {}
                ends: dict[int, dict[int, float]] = {end: {} for end in (E2_TAUS[0], E2_TAUS[-1])}
                for s_out in seeds:
                    train = [r for r in case if r["seed"] != s_out]
                    picked[s_out] = grid_choice(train)
                    held[s_out] = by_seed(case, "test_accuracy", tau=picked[s_out][0], steps=picked[s_out][1])[s_out]
                    for end in ends:
                        k_end = grid_choice([r for r in train if r["tau"] == end])[1]
                        ends[end][s_out] = by_seed(case, "test_accuracy", tau=end, steps=k_end)[s_out]
                versus_ends = [f_cross.paired(held, ends[end], "a>b") for end in ends]
                versus_plans = [f_cross.paired(held, by_seed(source[(name, c, e)], "test_accuracy"), "a>b")
                                for source in (e3_cells, fit_cells)]
                cross["ends"] += versus_ends
                cross["plans"] += versus_plans
                add(f"| {name} | {c:g} | {e:g} | {', '.join(str(picked[x][0]) for x in seeds)} | "
                    f"{mean_ci(list(held.values()), majority=share[name])} | "
                    + " | ".join(v(x) for x in versus_ends + versus_plans) + " |")
    f_cross.close()
    in_sample_ends = [x for ends in e2_ends for x in ends.values() if isinstance(x, Pending)]
    add(f"\nShown in sample against cross-fitted: τ* above an end {words(in_sample_ends)} (E2's table, where τ* = "
        f"an end is no claim) against {words(cross['ends'])} cross-fitted; the grid's best above a plan "
        f"{words(plan_verdicts['d'] + plan_verdicts['d_eff'])} in sample against {words(cross['plans'])} "
        "cross-fitted. docs/statistics.md explains the cross-fitting with the Adult-1 numbers.\n")

    add("## E3 — trade-offs (Figs. 4–5, `fig_e3_cost.png`, `fig_e3_privacy.png`)\n")
    add("> \"higher resource budget generally implies higher testing accuracy\"\n")
    add(f"Planned design (paper's constants), accuracy against C_th ∈ {{200, ..., 1000}} over {len(E3_SEEDS)} seeds; "
        "and the grid's best design at C_th = 1000 against 500 (paired by seed, a = 1000):\n")
    add("| dataset | ε_th | planned (τ, K) at 200 → 1000 | acc at 200 | acc at 1000 | trend (planned) | grid best 500 → 1000 |")
    add("|---|---|---|---|---|---|---|")
    e3_cells_all = group(e3.rows, "dataset", "cost", "epsilon")
    cost_trends: dict[tuple, Pending] = {}
    f_e3c = family("E3: accuracy rises with C_th (planned trend and grid best), per dataset and ε_th")
    for name in names:
        for e in EPSILONS:
            rows = [r for c in E3_COSTS for r in e3_cells_all[(name, c, e)]]
            cost_trends[(name, e)] = f_e3c.trend([r["cost"] for r in rows], [r["test_accuracy"] for r in rows],
                                                 "increasing", units=[r["cost"] for r in rows],
                                                 cluster=[r["seed"] for r in rows])
            lo, hi = e3_cells_all[(name, 200.0, e)], e3_cells_all[(name, 1000.0, e)]
            grid = {c: by_seed(cases[(name, c, e)], "test_accuracy", **dict(zip(("tau", "steps"), choices[(name, c, e)])))
                    for c in E2_BUDGETS}
            add(f"| {name} | {e:g} | ({lo[0]['tau']}, {lo[0]['steps']}) → ({hi[0]['tau']}, {hi[0]['steps']}) | "
                f"{mean_ci([r['test_accuracy'] for r in lo], majority=share[name])} | {mean_ci([r['test_accuracy'] for r in hi], majority=share[name])} | "
                f"{v(cost_trends[(name, e)])} | {v(f_e3c.paired(grid[1000.0], grid[500.0], 'a>b'))} |")
    add(f"\n{f_e3c.description()} The trend pools the runs of each C_th over the seeds (ρ within each seed, n = seeds). The planned designs make few steps, so most stay at the majority share whatever the budget; the grid's best "
        "design is where the budget can show.\n")
    add("> \"for the Adult-2, Vehicle-1, and Vehicle-2 cases, the testing accuracy does not significantly increase when "
        "more resources are allocated, especially when the privacy budget is low\"\n")
    add("A claim of no effect: an **inconclusive** trend above agrees with it only as far as the interval is narrow, "
        "and not at all where the model stays at the majority share. "
        + "; ".join(f"{n} at ε_th = 1: {v(cost_trends[(n, 1.0)])}" for n in names) + ".\n")
    add("> \"higher privacy budget usually leads to higher testing accuracy due to the decreased noise magnitude\"\n")
    add("| dataset | C_th | acc at ε_th = 1 | acc at ε_th = 10 | trend over ε_th 1..10 (planned) |")
    add("|---|---|---|---|---|")
    gains: dict[str, dict[tuple, float]] = {n: {} for n in names}
    f_e3e = family("E3: accuracy rises with ε_th (planned), per dataset and C_th")
    for name in names:
        for c in E3_COST_SETTINGS:
            rows = [r for e in E3_EPSILONS for r in e3_cells_all[(name, c, e)]]
            lo, hi = by_seed(e3_cells_all[(name, c, 1.0)], "test_accuracy"), by_seed(e3_cells_all[(name, c, 10.0)], "test_accuracy")
            gains[name].update({(c, s): hi[s] - lo[s] for s in lo})
            add(f"| {name} | {c:g} | {mean_ci(list(lo.values()), majority=share[name])} | {mean_ci(list(hi.values()), majority=share[name])} | "
                f"{v(f_e3e.trend([r['epsilon'] for r in rows], [r['test_accuracy'] for r in rows], 'increasing', units=[r['epsilon'] for r in rows], cluster=[r['seed'] for r in rows]))} |")
    f_e3g = family("E3: the grid's best rises with ε_th, per dataset and C_th")
    add(f"\n{f_e3e.description()} (runs of each ε_th over the seeds: ρ within each seed, n = seeds.)\n")
    add("The grid's best design over ε_th ∈ {1, 2, 4, 10} (each ε_th's best design, its runs; ρ within each "
        f"seed, n = seeds). {f_e3g.description()}\n")
    add("| dataset | C_th | verdict |")
    add("|---|---|---|")
    for name in names:
        for c in E2_BUDGETS:
            xs, ys, seeds = [], [], []
            for e in EPSILONS:
                tau, k = choices[(name, c, e)]
                for r in cases[(name, c, e)]:
                    if r["tau"] == tau and r["steps"] == k:
                        xs.append(e)
                        ys.append(r["test_accuracy"])
                        seeds.append(r["seed"])
            add(f"| {name} | {c:g} | {v(f_e3g.trend(xs, ys, 'increasing', units=xs, cluster=seeds))} |")
    add("")
    if "adult-1" in names and "adult-2" in names:
        add("> \"for the Adult-1 case, the impact of the privacy budget is less significant … because its model turns out "
            "to be more sensitive to the resource budget\"\n")
        f_gain = family("E3: Adult-2's gain from ε_th = 1 to 10 above Adult-1's")
        per_seed = {n: {s: mean(g for (c, s2), g in gains[n].items() if s2 == s) for s in {s for _, s in gains[n]}}
                    for n in ("adult-1", "adult-2")}
        g = f_gain.paired(per_seed["adult-2"], per_seed["adult-1"], "a>b")
        add(f"The gain of the planned design from ε_th = 1 to 10, Adult-2's against Adult-1's, averaged per seed over "
            f"C_th ∈ {{200, 500, 800, 1000}} and paired by seed (a seed's runs at the four C_th share its luck: the seed "
            f"is the unit): {v(g)} (a = Adult-2). Adult-1 runs with batch 32, so its noise "
            "σ ∝ 1/X is 16× Adult-2's.\n")

    add("## E4 — planned τ against the budgets (Fig. 6, `fig_e4.png`)\n")
    add("The planner is deterministic given the constants: these verdicts rank the map's points (9 C_th × 10 ε_th), "
        "there is no seed noise in them.\n")
    maps = e4.extra["maps"]
    for name in names:
        m = maps[name]
        rng = {k: (min(min(r) for r in g), max(max(r) for r in g)) for k, g in m.items()}
        add(f"- {name}: planned τ ranges {rng['corrected'][0]}..{rng['corrected'][1]} (corrected σ), "
            f"{rng['paper_literal'][0]}..{rng['paper_literal'][1]} with the paper-literal σ of eq. (23), "
            f"{rng['d_eff'][0]}..{rng['d_eff'][1]} with d_eff; τ at (C_th = 1000, ε_th = 1) = {m['corrected'][0][-1]}, "
            f"at (C_th = 200, ε_th = 10) = {m['corrected'][-1][0]}.")
    add("\n> \"When the resource budget is large and privacy budget is small, DP-PASGD chooses a smaller τ … when the "
        "resource budget is small and privacy budget is large, DP-PASGD chooses a larger τ\"\n")
    f_e4 = family("E4: the planned τ against ε_th and C_th, per dataset and constants")
    add(f"Each point (C_th, ε_th) of the map is one unit. {f_e4.description()}\n")
    add("| dataset | constants | τ against ε_th (increasing) | τ against C_th (decreasing) |")
    add("|---|---|---|---|")
    for name in names:
        for label, key in (("paper's d", "corrected"), ("d_eff", "d_eff")):
            grid = maps[name][key]
            eps = [e for e in E3_EPSILONS for _ in E3_COSTS]
            costs = [c for _ in E3_EPSILONS for c in E3_COSTS]
            taus = [tau for row in grid for tau in row]
            points = list(zip(eps, costs))
            add(f"| {name} | {label} | {v(f_e4.trend(eps, taus, 'increasing', units=points))} | "
                f"{v(f_e4.trend(costs, taus, 'decreasing', units=points))} |")
    add("\nA constant map has no ranking: its verdict is inconclusive with an undefined (nan) ρ.\n")

    add("## A private model that learns: MNIST at the paper's ε (`learns.toml`, `fig_learns.png`)\n")
    lrows = learns.rows
    at = [r for r in lrows if r["epsilon"] == LEARNS_EPSILON]
    add(f"On Adult the logistic model stays near the majority share at every ε_th of the paper. The same algorithm on "
        f"real images does learn at the paper's ε_th = {LEARNS_EPSILON:g}: `learns.toml` (why each setting: the file) "
        "trains DP-PASGD's logistic regression on the 5,000-image MNIST subset (`mnist-5k`) over 2 devices of 2,500 "
        "images (2,000 for training each), with batches of 2,000 so that the sensitivity 2G/X of eq. (9) is small, "
        "η = 30 on unit-ball rows, τ = 10, K = 100.\n")
    add("| ε_th | n | test accuracy | ε spent (ledger, max) | σ |")
    add("|---|---|---|---|---|")
    for e in sorted({r["epsilon"] for r in lrows}):
        rs = [r for r in lrows if r["epsilon"] == e]
        add(f"| {e:g} | {len(rs)} | {mean_ci([r['test_accuracy'] for r in rs], majority=learns.extra['majority'])} | {max(r['epsilon_max'] for r in rs):.4g} | "
            f"{rs[0]['sigma']:.4g} |")
    walls_run = list(learns.extra["run_wall_s"].values())
    add(f"\nChance is {learns.extra['chance']:.2f}, the majority share {learns.extra['majority']:.4f}. At ε_th = "
        f"{LEARNS_EPSILON:g} the mean accuracy {mean_ci([r['test_accuracy'] for r in at], majority=learns.extra['majority'])} lies far above both; one run "
        f"takes {min(walls_run):.1f}–{max(walls_run):.1f} s (sim, one worker). The curve over ε_th shows where "
        "learning begins: every ε_th of the paper's range learns here.\n")

    add("## Caveats\n")
    add("- The paper reports no η, batch size or bound constants; ours are chosen and estimated as above, and its τ* values "
        "(visible only in its figures, which the text lacks) cannot be compared number for number.\n"
        "- The planner optimises the bound (21a), not accuracy; with the paper's d the noise term dominates and it "
        "prefers short runs (K well below the budget).\n"
        "- λ is the PL ratio at θ⁰, an optimistic stand-in: the theory's strong convexity does not hold for unregularised "
        "logistic regression (dp-pasgd.md §7 item 11).\n")
    return fill_all("\n".join(L) + "\n", families)


SCENARIOS: dict[str, Callable] = {"e1": run_e1, "e2": run_e2, "e3": run_e3, "planfit": run_planfit}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "dp-pasgd-reproduce", help="the sweeps' folder")
    parser.add_argument("--workers", type=int, default=1, help="parallel runs (default 1)")
    parser.add_argument("--only", nargs="+", choices=[*SCENARIOS, "e4", "learns"], help="run only these scenarios")
    parser.add_argument("--report-only", action="store_true", help="rewrite REPORT.md and the figures from data/ alone")
    args = parser.parse_args(argv)
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
            if key == "e4":
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
