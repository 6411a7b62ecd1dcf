"""Seeds by power for the DWFL reproduction (reproduce.py): the effects of interest of its paired families,
the plan (the seeds each task needs, capped by a compute budget) and what a REPORT and ``--plan-seeds``
say of it."""

from __future__ import annotations

import math

from testbed.reports.stats import MOST_SEEDS, RANK_TEST_MIN_N
from testbed.reports.verdicts import Family

#: Effect of interest of the accuracy families: one percentage point of test accuracy. The paper prints no
#: numbers (dwfl.md §6), so this is the smallest accuracy difference a reader of a comparison table acts on;
#: it is about 160 people of Adult's test set and 4 images of the digits'.
ACC_EFFECT = 0.01
#: Effect of interest of the loss families, as a share of the loss's scale: the untrained model's loss
#: ln(classes), where every curve of the paper's figures starts (ln 2 = 0.693 on Adult, ln 10 = 2.303 on
#: the digits). The claims are gaps between convergence curves drawn on that scale, and 5 % of it is about
#: the smallest gap such a figure shows: 0.035 on Adult, 0.115 on the digits.
LOSS_EFFECT_SHARE = 0.05
def figure_families(fig: str, chance: float, loss_claim: str, acc_claim: str, paired: bool = False) -> tuple[Family, Family]:
    """A figure's two families: its claims on the training loss of x̄ (the paper's metric) and on test
    accuracy (beside them: do the models learn). One family per metric, so that an effect of interest
    has one unit (the power of a paired family is computed from its differences' sd, which must share it);
    a trend family has no effect of interest (ρ has no unit the claims state; its n is the seeds)."""
    loss_effect = float(f"{LOSS_EFFECT_SHARE * math.log(1.0 / chance):.3g}")  # ln(classes): the untrained model's loss
    return (Family(f"{fig}, train loss: {loss_claim}", effect_of_interest=loss_effect if paired else None),
            Family(f"{fig}, test accuracy: {acc_claim}", effect_of_interest=ACC_EFFECT if paired else None))


def fill_both(fams: tuple[Family, Family], lines: list[str]) -> list[str]:
    """The section's lines with both families' verdicts and descriptions filled in."""
    return [fams[1].fill(fams[0].fill(x)) for x in lines]


def describe_both(fams: tuple[Family, Family]) -> str:
    """Both families' descriptions, for the section's text."""
    return f"{fams[0].description()} {fams[1].description()}"


#: The compute budget for the data of the three DWFL REPORTs together, in minutes of measured wall time (one
#: process under nice 15 on 2 cores shared with 7 other helpers): the pilot's 80 min (5 seeds each) and the
#: 50 min this session could add before its end.
BUDGET_MIN = 130.0


def plan(folders: list[tuple[str, dict[str, dict], list[Family]]], budget_min: float = BUDGET_MIN) -> list[dict]:
    """Seeds by power from each data folder's records (scenario → data file) and paired families: per
    folder, the seeds it ran, their
    measured cost (minutes per seed), each paired family's seeds needed for its effect of interest at 80 %
    power after Holm (from this data's sd; None: more than stats.MOST_SEEDS), the target max(8, the most any
    family needs), and ``chosen``, the seeds the budget affords: the seeds run are paid for first, then
    every folder is raised towards min(target, 8), cheapest per seed first, then towards its target the
    same way. A folder never plans fewer seeds than it ran. Costs are the pilot's (each data file's first
    part: the plan is made before the runs it plans, and stays what it was when they are added), so the
    budget is in the pilot's measured minutes; ``run`` is the fewest seeds of the folder's files."""
    rows = []
    for folder, records, families in folders:
        # scenario → (seeds run, the pilot's minutes per seed)
        files = {name: (len(rec["seeds"]), rec.get("wall_parts_s", [rec["wall_s"]])[0] / 60
                        / rec.get("seed_parts", [len(rec["seeds"])])[0]) for name, rec in records.items()}
        run = min(k for k, _c in files.values())
        needs = [(f.name, f.effect_of_interest, power["seeds_needed"], power["n"]) for f in families
                 if (power := f.power()) is not None and "seeds_needed" in power]
        most = max((MOST_SEEDS + 1 if need is None else need for _name, _e, need, _n in needs), default=0)
        rows.append({"folder": folder, "run": run, "needs": needs, "files": files,
                     "min_per_seed": sum(c for _k, c in files.values()),
                     "target": max(RANK_TEST_MIN_N, most), "chosen": run})
    left = budget_min - sum(k * c for r in rows for k, c in r["files"].values())
    for goal in (lambda r: min(r["target"], RANK_TEST_MIN_N), lambda r: r["target"]):
        for r in sorted(rows, key=lambda r: r["min_per_seed"]):
            while r["chosen"] < goal(r):
                step = sum(c for k, c in r["files"].values() if k <= r["chosen"])  # the files below chosen + 1
                if step > left:
                    break
                r["chosen"] += 1
                left -= step
    return rows


def need_text(need: int | None) -> str:
    """A family's seeds needed, in words."""
    return f"more than {MOST_SEEDS}" if need is None else str(need)


def seeds_paragraph(row: dict, plan: list[dict]) -> list[str]:
    """What the REPORT says of its seeds: the trends' n, each paired family's need, the target and the cap."""
    run, target, chosen = row["run"], row["target"], row["chosen"]
    needs = "; ".join(f"{name.split(':')[0]} ({effect:.3g}): {need_text(need)}" for name, effect, need, _n in row["needs"])
    costs = ", ".join(f"{r['folder']} {r['min_per_seed']:.1f}" for r in plan)
    under = [name.split(":")[0] for name, _e, need, n in row["needs"] if need is None or need > n]
    most_run = max(k for k, _c in row["files"].values())
    ran = f"{run}" if most_run == run else f"{run} to {most_run} (an extension cut short)"
    if target <= run:
        cap = "No family needs more: the count is not capped."
    else:
        cap = (f"It ran {ran}: capped by the compute budget, {BUDGET_MIN:g} min of measured wall time for the data of the "
               f"three DWFL REPORTs together (one process under `nice` on 2 cores shared with 7 other jobs; seeds are "
               f"added cheapest per seed first, every task first to the floor of {RANK_TEST_MIN_N}, then towards its "
               f"target), which at the pilot's measured minutes per seed ({costs}) affords {chosen} here"
               + (f", {chosen - run} more than ran: they did not fit the session that ran these, and `--extend` adds them."
                  if chosen > run else "."))
    trends = (f"n = {run}: Spearman's ρ within each of the {run} seeds" if most_run == run else
              "n = the seeds of their figure (above): Spearman's ρ within each seed")
    return [f"**Seeds by power.** {ran} seeds per curve. The trend verdicts (Figs. 2–4, and the accuracy against ε) have "
            f"{trends}, so seeds give them power as they do the paired ones. "
            f"Effects of interest of the paired families (Figs. 5–6), one family per metric: {ACC_EFFECT:g} test accuracy "
            f"(one percentage point), and {LOSS_EFFECT_SHARE * 100:g} % of the untrained model's loss ln(classes) in train loss "
            "(the scale the paper's convergence curves are drawn on). Seeds each family needs to detect its effect at 80 % "
            f"power after Holm, from the sd of these runs' differences (a family whose differences are all zero has no sd "
            f"and is left out): {needs or 'none'}. The task's target is max({RANK_TEST_MIN_N}, the most any family needs) = "
            f"{need_text(target) if target <= MOST_SEEDS else need_text(None)} seeds. {cap}"
            + (f" **Underpowered** here: {', '.join(under)}; an inconclusive verdict there is no evidence against its "
               "effect of interest." if under else "")
            + " `reproduce.py --plan-seeds` prints this plan from the committed data."]


def plan_table(plan: list[dict], defaults: dict[str, int]) -> str:
    """The seeds plan as a table (--plan-seeds), beside each folder's default seeds."""
    lines = [f"Seeds by power (80 % power after Holm, effects of interest: accuracy {ACC_EFFECT:g}, loss "
             f"{LOSS_EFFECT_SHARE * 100:g} % of ln(classes)); budget {BUDGET_MIN:g} min of wall time for the three tasks, "
             "at the pilot's measured minutes per seed",
             f"{'folder':<12} {'run':>4} {'min/seed':>8} {'target':>7} {'chosen':>7} {'default':>7}  seeds each paired family needs"]
    for r in plan:
        needs = "; ".join(f"{name.split(':')[0]} ({effect:.3g}): {need_text(need)}" for name, effect, need, _n in r["needs"])
        target = str(r["target"]) if r["target"] <= MOST_SEEDS else f">{MOST_SEEDS}"
        lines.append(f"{r['folder']:<12} {r['run']:>4} {r['min_per_seed']:>8.1f} {target:>7} {r['chosen']:>7} "
                     f"{defaults[r['folder']]:>7}  {needs}")
    return "\n".join(lines)
