"""The DP-PASGD reproduction's figures (fig_e1 … fig_e4, fig_learns), drawn from its data/ alone:
each curve the mean over seeds with its 95 % t band."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from pasgd_design import (  # noqa: E402
    E1_SCHEMES, E2_BUDGETS, E2_SEEDS, E3_COST_SETTINGS, E3_COSTS, E3_EPSILONS, E3_SEEDS, EPSILONS, grid_choice, group,
)
from results_data import by_seed  # noqa: E402

from testbed.reports.stats import t_interval  # noqa: E402

HERE = Path(__file__).resolve().parent


def band(ax, xs, runs: list[list[float]], label: str, **style) -> None:
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
            band(ax, curve["cost"][:n], [r[:n] for r in runs], label, marker="o", ms=3)
        ax.axhline(e4.extra["info"][name]["majority"], color="grey", ls=":", label="majority class")
        ax.set(title=f"{name}: ε = 10, C ≤ 1000", xlabel="resource cost (c1=100, c2=1)", ylabel="test accuracy", xlim=(0, 1000))
        ax.legend(fontsize=7)
    save(fig, "fig_e1.png")
    fig, axes = plt.subplots(len(names), len(E2_BUDGETS), figsize=(9, 3.2 * len(names)), squeeze=False)
    for i, name in enumerate(names):
        for j, c in enumerate(E2_BUDGETS):
            ax = axes[i][j]
            for e in EPSILONS:
                case = [r for r in e2.rows if r["dataset"] == name and r["cost"] == c and r["epsilon"] == e]
                ks = {tau: grid_choice(rs)[1] for (tau,), rs in group(case, "tau").items()}
                taus = sorted(ks)
                runs = [[by_seed(case, "test_accuracy", tau=tau, steps=ks[tau])[s] for tau in taus] for s in E2_SEEDS]
                band(ax, taus, runs, f"ε = {e:g}")
            ax.axhline(e4.extra["info"][name]["majority"], color="grey", ls=":")
            ax.set(title=f"{name}, C_th = {c:g} (K tuned per τ)", xlabel="τ", ylabel="test accuracy")
            ax.legend(fontsize=7)
    save(fig, "fig_e2.png")
    for fname, xs, settings, fixed, x_label, key in (
        ("fig_e3_cost.png", E3_COSTS, EPSILONS, "ε = {:g}", "resource budget C_th", lambda x, s: (x, s)),
        ("fig_e3_privacy.png", E3_EPSILONS, E3_COST_SETTINGS, "C_th = {:g}", "privacy budget ε_th", lambda x, s: (s, x)),
    ):
        fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 3.2), squeeze=False)
        for ax, name in zip(axes[0], names):
            cells = group([r for r in e3.rows if r["dataset"] == name], "cost", "epsilon")
            for s in settings:
                runs = [[by_seed(cells[key(x, s)], "test_accuracy")[seed] for x in xs] for seed in E3_SEEDS]
                band(ax, xs, runs, fixed.format(s), marker="o", ms=3)
            ax.axhline(e4.extra["info"][name]["majority"], color="grey", ls=":")
            ax.set(title=f"{name}: planned design", xlabel=x_label, ylabel="test accuracy")
            ax.legend(fontsize=7)
        save(fig, fname)
    fig, axes = plt.subplots(1, len(names), figsize=(4.4 * len(names), 3.4), squeeze=False)
    for ax, name in zip(axes[0], names):
        grid = e4.extra["maps"][name]["corrected"]
        im = ax.imshow(grid, origin="lower", aspect="auto", cmap="viridis",
                       extent=(E3_COSTS[0] - 50, E3_COSTS[-1] + 50, 0.5, 10.5))
        ax.set(title=f"{name}: planned τ*", xlabel="C_th", ylabel="ε_th")
        fig.colorbar(im, ax=ax)
    save(fig, "fig_e4.png")
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
    save(fig, "fig_learns.png")


def save(fig, name: str) -> None:
    fig.tight_layout()
    fig.savefig(HERE / name, dpi=80)
    plt.close(fig)
