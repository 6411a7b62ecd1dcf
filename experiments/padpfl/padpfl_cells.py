"""The shared pieces of experiments/padpfl's REPORT: the effect of interest of each kind of family
(issue 41) and why, and the helpers that turn the parts' runs into numbers and table cells (means with
intervals, ε columns, "learns" verdicts, filled family placeholders, wall times)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from testbed.reports.stats import majority_flag, t_interval
from testbed.reports.verdicts import Family, Pending, Verdict

#: The weights of the scenarios' MLP 64-32-10.
WEIGHTS = 64 * 32 + 32 + 32 * 10 + 10

# The effect of interest of each kind of family (issue 41: seeds by power), the smallest mean paired
# difference its claims are about, in their unit. A family holds claims of one unit only (so the paper's
# claims, judged by loss and by accuracy, are two families per scenario): its power is computed from the
# median sd of its claims' differences, which means nothing across units.
#: "Learns": accuracy minus the majority share of the test rows. 0.1 (ten points): a model that learns these
#: ten classes beats the majority share by far more (the non-private runs by 0.6 to 0.75), so a run that
#: cannot be shown 0.1 above it does not learn in any sense that matters, and at chance a verdict must be
#: able to rule out that much.
EFFECT_LEARNS = 0.10
#: A difference in test accuracy between two settings (impact factors, lr, rules, the cost of privacy): two
#: percentage points, the smallest gap a user choosing between the settings would act on (the paper's
#: figures separate impact assignments by a few points; the digits' test rows resolve 1/300).
EFFECT_ACCURACY = 0.02
#: A difference in final training loss (nats): 0.05, about 5 % of the non-private final loss here (1.0 to
#: 1.3), the order of the gaps between the paper's loss curves it calls better and worse.
EFFECT_LOSS = 0.05


def values(runs: Sequence[dict], key: str) -> dict[int, float]:
    """seed → the run's value of ``key`` (a final metric, or the mean of a curve when ``key`` ends
    in ``_curve``)."""
    return {r["seed"]: float(np.mean(r[key])) for r in runs}


def mean_ci(xs: Sequence[float], digits: int, majority: Sequence[float] | None = None) -> str:
    """"mean [low, high]" (95 % t interval) in fixed point; an accuracy with the seeds' majority shares is
    flagged where its interval holds or lies below the largest (testbed.reports.stats.majority_flag)."""
    s = t_interval(list(xs))
    flag = "" if majority is None else majority_flag(list(xs), max(majority))
    return f"{float(s.mean):.{digits}f} [{float(s.ci_low):.{digits}f}, {float(s.ci_high):.{digits}f}]{flag}"


def learns(fam: Family, runs: Sequence[dict], majority: Sequence[float]) -> Pending:
    """Test accuracy above the majority share of the same seed's test rows (paired by seed), a claim of ``fam``."""
    return fam.paired(values(runs, "test_accuracy"), {r["seed"]: majority[r["seed"]] for r in runs}, "a>b")


def learns_by_label(name: str, variants: dict[str, dict], majority: Sequence[float]) -> dict[str, Verdict]:
    """Every run's "learns" verdict of a table, one family (closed): label → verdict."""
    fam = Family(f"{name}: each run above the majority share", effect_of_interest=EFFECT_LEARNS)
    judged = {label: learns(fam, variant["runs"], majority) for label, variant in variants.items()}
    fam.close()
    return {label: v.verdict for label, v in judged.items()}


def eps_text(runs: Sequence[dict]) -> str:
    """The largest ε over the runs' nodes: the ledger's (zCDP, worst observer), by observer, and
    the tight (RDP) one; "not private" without noise."""
    if any(r["epsilon"] is None for r in runs):
        return "not private | – | –"
    worst = max(r["epsilon"] for r in runs)
    server = max(r["by_observer"]["server"] for r in runs)
    public = max(r["by_observer"]["public"] for r in runs)
    return f"{worst:.3g} | {server:.3g} / {public:.3g} | {max(r['epsilon_tight'] for r in runs):.3g}"


def filled(lines: list[str], *families: Family) -> list[str]:
    """``lines`` with the families' placeholders replaced, each family filled once (its description's
    power is computed at every fill)."""
    text = "\n".join(lines)
    for fam in families:
        text = fam.fill(text)
    return text.split("\n")


def verdict_row(fam: Family, what: str, a: list[dict], b: list[dict], key: str, claimed: str) -> str:
    return f"  - {what}: {fam.paired(values(a, key), values(b, key), claimed).markdown()}"


def wall(record: dict) -> str:
    return f"{record['wall_time_s']:.0f} s"


def cell(name: str) -> str:
    """A family's name in a markdown table's cell (the rules' names hold " | ")."""
    return name.replace(" | ", " / ")
