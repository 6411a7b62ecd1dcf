"""A sweep's figures with intervals, for `testbed report SWEEP_DIR --html`: each grid point's mean
final metrics with 95 % Student t interval bars, and its mean test accuracy and training loss
against round with interval bands (testbed.reports.stats.t_interval over the point's repeats).

A band covers the rounds every run of the point evaluated (a run a budget stopped early ends its
point's band there); a point of one run is drawn as a line without bars or band.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np

from testbed.reports.plots import _pyplot
from testbed.reports.results import read_metrics
from testbed.reports.stats import t_interval
from testbed.reports.sweep_stats import grid_keys, group_by_point, number

#: The final metrics drawn with interval bars, with their axis labels.
FINAL_METRICS = (("test_accuracy", "final test accuracy"), ("train_loss", "final training loss"))
#: The per-round metrics drawn with interval bands (metrics.csv columns).
ROUND_METRICS = (("test_accuracy", "test accuracy"), ("train_loss", "training loss"))
#: Past this many grid points the legend is left out (it would cover the figure).
MAX_LEGEND = 12


def point_label(keys: Sequence[str], point: tuple) -> str:
    """A grid point's label: its values, keys shortened to their last part (``tau=5 lr=0.1``)."""
    return " ".join(f"{k.split('.')[-1]}={v}" for k, v in zip(keys, point)) or "all runs"


def means_figure(rows: Sequence[dict[str, Any]]):
    """Each grid point's mean of every FINAL_METRICS field, with its 95 % interval as bars; a
    matplotlib Figure, or None when the rows have none of the fields."""
    keys = grid_keys(rows[0])
    groups = group_by_point(rows, keys)
    metrics = [(f, label) for f, label in FINAL_METRICS if any(number(r.get(f)) is not None for r in rows)]
    if not metrics:
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(metrics), figsize=(5 * len(metrics) + 1, 4.2), squeeze=False)
    fig.subplots_adjust(left=0.08, right=0.98, bottom=0.22, top=0.88, wspace=0.28)
    labels = [point_label(keys, p) for p in groups]
    for ax, (field, label) in zip(axes[0], metrics):
        for i, group in enumerate(groups.values()):
            values = [number(r.get(field)) for r in group]
            if any(v is None for v in values):
                continue
            s = t_interval(np.array(values))
            err = None if s.n < 2 else [[float(s.mean - s.ci_low)], [float(s.ci_high - s.mean)]]
            ax.errorbar([i], [float(s.mean)], yerr=err, fmt="o", capsize=4, color="tab:blue")
        ax.set_xticks(range(len(labels)), labels, rotation=30, ha="right", fontsize=8)
        ax.margins(x=0.15)
        ax.set(ylabel=label, title=f"mean {label}, 95% t interval")
        ax.grid(alpha=0.3)
    n = sorted({len(g) for g in groups.values()})
    fig.suptitle(f"grid points' means over their repeats (n = {', '.join(map(str, n))})")
    return fig


def curves_figure(folder: Path, rows: Sequence[dict[str, Any]]):
    """Each grid point's mean of every ROUND_METRICS column against round, with its 95 % interval
    as a band; a matplotlib Figure."""
    keys = grid_keys(rows[0])
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(ROUND_METRICS), figsize=(12, 4.2), squeeze=False)
    fig.subplots_adjust(left=0.07, right=0.8, bottom=0.13, top=0.88, wspace=0.25)
    for point, group in group_by_point(rows, keys).items():
        runs = [read_metrics(folder / str(r.get("run", ""))) for r in group
                if (folder / str(r.get("run", "")) / "metrics.csv").exists()]
        if not runs:
            continue
        label = point_label(keys, point)
        for ax, (column, _) in zip(axes[0], ROUND_METRICS):
            rounds, values = _common_rounds(runs, column)
            if not rounds:
                continue
            s = t_interval(values)
            line, = ax.plot(rounds, s.mean, marker=".", label=label if ax is axes[0][0] else None)
            if s.n >= 2:
                ax.fill_between(rounds, s.ci_low, s.ci_high, color=line.get_color(), alpha=0.2)
    for ax, (_, label) in zip(axes[0], ROUND_METRICS):
        ax.set(xlabel="communication round", ylabel=label, title=f"mean {label}, 95% t band")
        ax.grid(alpha=0.3)
    if len(axes[0][0].lines) <= MAX_LEGEND:
        fig.legend(*axes[0][0].get_legend_handles_labels(), fontsize=7, loc="upper left", bbox_to_anchor=(0.81, 0.88))
    return fig


def interval_figures(folder: Path, rows: Sequence[dict[str, Any]]) -> list[tuple[Any, str]]:
    """The sweep's interval figures with their alt texts: [(Figure, alt), ...]."""
    figures = [(means_figure(rows), "grid points' mean final metrics with 95% intervals"),
               (curves_figure(folder, rows), "grid points' mean curves against round with 95% bands")]
    return [(fig, alt) for fig, alt in figures if fig is not None]


def _common_rounds(runs: Sequence[list[dict[str, float]]], column: str) -> tuple[list[float], np.ndarray]:
    """The rounds at which every run has ``column``, and the values: (rounds, (rounds, runs))."""
    by_run = [{r["round"]: r[column] for r in run if column in r} for run in runs]
    rounds = sorted(set.intersection(*(set(b) for b in by_run)))
    return rounds, np.array([[b[r] for b in by_run] for r in rounds]).reshape(len(rounds), len(runs))
