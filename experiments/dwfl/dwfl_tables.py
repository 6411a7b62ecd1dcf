"""The DWFL REPORT's tables and flags (reproduce.py): a curve's mean and interval, whether it learns (its
accuracy interval above the majority share), a panel's table and what the compared curves' accuracies
say of a loss verdict. ``sc`` is reproduce.Scenario (its curve names and runs)."""

from __future__ import annotations

import numpy as np

from testbed.reports.stats import majority_flag, t_interval


def ci_text(values) -> str:
    """'mean [low, high]' of the values (95 % t interval), 4 decimals."""
    s = t_interval(list(values))
    return f"{float(s.mean):.4f} [{float(s.ci_low):.4f}, {float(s.ci_high):.4f}]"


def learns(runs: dict[int, dict]) -> bool:
    """Whether the curve's test accuracy is above its majority share: the 95 % interval's lower end above it."""
    accs = [r["final_acc"] for r in runs.values()]
    return len(accs) > 1 and float(t_interval(accs).ci_low) > max(r["majority"] for r in runs.values())


def panel_table(sc, panel: str) -> list[str]:
    """A panel's table: each curve's n, loss and accuracy with their intervals (accuracy flagged), noise and ε."""
    lines = ["| curve | n | final train loss [95% CI] | test acc [95% CI] | σ² | ε/round (max) | ε over T (RDP) | "
             "c²/σ_m² (dB) |", "|---|---|---|---|---|---|---|---|"]
    for c in sc.names(panel):
        runs = list(sc.runs(panel, c).values())
        lines.append(f"| {c} | {len(runs)} | {ci_text(r['final_loss'] for r in runs)} | {ci_text(r['final_acc'] for r in runs)}{flag(runs)} | "
                     f"{np.mean([r['sigma2'] for r in runs]):.4g} | {max(r['eps_round'] for r in runs):.3g} | "
                     f"{max(r['eps_T'] for r in runs):.3g} | {np.mean([r['snr_db'] for r in runs]):.1f} |")
    return lines


def flag(runs) -> str:
    """An accuracy cell's flag against the test set's majority share (testbed.reports.stats.majority_flag)."""
    return majority_flag([r["final_acc"] for r in runs], max(r["majority"] for r in runs))


def chance_note(sc, panel: str, curves: list[str]) -> str:
    """What the accuracies of the compared curves say about the loss verdict."""
    runs = [r for c in curves for r in sc.runs(panel, c).values()]
    chance, majority = max(r["chance"] for r in runs), max(r["majority"] for r in runs)
    learning = [c for c in curves if learns(sc.runs(panel, c))]
    share = f"chance {chance:.3f}, majority share {majority:.3f}"
    if not learning:
        return (f"  \n*No compared curve's accuracy is above the majority share ({share}): the models stay at "
                "chance/majority, so the loss verdict measures how much noise reaches x̄, not convergence; "
                "it shows nothing about convergence.*")
    return f"  \n*Above the majority share ({share}): {', '.join(learning)}.*"
