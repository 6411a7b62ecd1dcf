"""The figures of the DWFL reproduction (reproduce.py): a scenario's loss curves, or accuracy against ε."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from testbed.reports.stats import t_interval


def plot(name: str, sc, path: Path, title: str) -> None:
    """The scenario's figure: mean loss of x̄ against round with a 95 % band per curve, one panel per
    panel; for the ε curve, test accuracy against ε with interval bars and the majority share. ``sc`` is
    reproduce.Scenario (its panels, curve names and runs); the figure goes to ``path``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rec = sc.record
    panels = sc.panels()
    if name == "eps":
        figure, ax = plt.subplots(figsize=(5, 3.2))
        panel = panels[0]
        eps = [float(c.split("=")[1]) for c in sc.names(panel)]
        stats = [t_interval([r["final_acc"] for r in sc.runs(panel, c).values()]) for c in sc.names(panel)]
        mean = np.array([float(s.mean) for s in stats])
        err = np.array([[float(s.mean - s.ci_low) for s in stats], [float(s.ci_high - s.mean) for s in stats]])
        ax.errorbar(eps, mean, yerr=err, marker="o", capsize=3, lw=1.2, label="test accuracy of x̄ (95% CI)")
        runs = [r for c in sc.names(panel) for r in sc.runs(panel, c).values()]
        ax.axhline(max(r["majority"] for r in runs), ls="--", color="gray", lw=1, label="majority share")
        ax.set_xscale("log")
        ax.set_xlabel("ε per round (paper's eq. 11)", fontsize=8)
        ax.set_ylabel("test accuracy", fontsize=8)
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=7)
    else:
        cols = 2
        rows = -(-len(panels) // cols)
        figure, axes = plt.subplots(rows, cols, figsize=(9, 2.9 * rows), squeeze=False)
        for ax, panel in zip(axes.flat, panels):
            for c in sc.names(panel):
                curves = np.array([r["loss"] for r in sc.runs(panel, c).values()])
                s = t_interval(curves.T)
                x = np.arange(1, curves.shape[1] + 1) * rec["curve_every"]
                ax.plot(x, s.mean, label=c, lw=1.2)
                ax.fill_between(x, s.ci_low, s.ci_high, alpha=0.2)
            ax.set_title(panel, fontsize=9)
            ax.set_xlabel("round", fontsize=8)
            ax.set_ylabel("train loss of x̄", fontsize=8)
            ax.tick_params(labelsize=7)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        for ax in list(axes.flat)[len(panels):]:
            ax.axis("off")
    figure.suptitle(title + " (mean over seeds, 95% CI)", fontsize=10)
    figure.tight_layout()
    figure.savefig(path, dpi=72, metadata={"Software": None})
    plt.close(figure)
