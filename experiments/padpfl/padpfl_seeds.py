"""Seeds by power for experiments/padpfl (issue 41): each part's seeds planned from the committed data
(:func:`plan_from`, capped by what every part can run within the compute budget at its pilot's wall time
per seed), the REPORT's section of them and the per-family table ``reproduce.py --plan-seeds`` prints.

Not testbed/reports/seed_plan.py's plan, though it agrees on the seeds wanted (max of the floor 8 and every
family's seeds needed): that one caps each scenario by a budget of its own in seeds and never plans fewer
seeds than are committed, this one shares one budget in minutes between the parts, each part costed at its
pilot's wall time per seed, and plans min(wanted, cap) (on the committed data, part learns: 9 here, the 10
committed there, which would change the REPORT); its table is per scenario, this one's per family."""

from __future__ import annotations

from collections.abc import Sequence

from padpfl_cells import EFFECT_ACCURACY, EFFECT_LEARNS, EFFECT_LOSS, cell
from testbed.reports.stats import MOST_SEEDS
from testbed.reports.verdicts import Family


def seeds_section(data: dict, plan: dict[str, dict]) -> list[str]:
    """Seeds by power: each part's seeds against the plan made from these data, and the families that stay
    underpowered."""
    cap = next(iter(plan.values()))["cap"]
    out = ["## Seeds by power", "",
           "Each family states its effect of interest (padpfl_cells.py says why each: "
           f"{EFFECT_LEARNS:g} above the majority share for \"learns\", {EFFECT_ACCURACY:g} of test accuracy, "
           f"{EFFECT_LOSS:g} nats of training loss) and the seeds that detect it at 80 % power after Holm from the sd "
           "of its differences. A part is run at max(8, its families' seeds needed), capped at "
           f"{cap} seeds: what every part can run within the compute budget "
           "(reproduce.py's COMPUTE_BUDGET_MIN, at the wall time per seed of each part's pilot, its first batch of "
           "seeds). Planned from these data "
           "(`reproduce.py --plan-seeds` prints it per family); seeds are added to a committed part, never rerun.", "",
           "| part | seeds run | wanted (max of 8 and seeds needed) | planned (capped) | underpowered families at the seeds run |",
           "|---|---|---|---|---|"]
    for part, p in plan.items():
        if part not in data:
            continue
        n = data[part]["seeds"]
        short = [name for name, pw in p["families"] if pw and "effect_of_interest" in pw
                 and (pw["seeds_needed"] is None or pw["seeds_needed"] > n)]
        wanted = f"more than {MOST_SEEDS}" if p["wanted"] > MOST_SEEDS else str(p["wanted"])
        out.append(f"| {part} | {n} | {wanted} | {p['seeds']} | {'; '.join(map(cell, short)) if short else 'none'} |")
    behind = [part for part, p in plan.items() if part in data and data[part]["seeds"] < p["seeds"]]
    out += ["", ("Parts run with fewer seeds than planned (the session's time ran out; the seeds run column says "
                 "how many, 5 being the pilot's), whose underpowered families' inconclusive verdicts are no "
                 f"evidence of no effect: {', '.join(behind)}." if behind else
                 "Every part runs its planned seeds; a family underpowered there needs more seeds than the budget "
                 "allows, and its inconclusive verdicts are no evidence of no effect."), ""]
    return out


def plan_from(data: dict[str, dict], families: dict[str, list[Family]], parts: Sequence[str], min_seeds: int,
              budget_min: float) -> dict[str, dict]:
    """part → {"seeds": planned, "wanted": max(min_seeds, every family's seeds needed), "families": [(name,
    power record)], "per_seed_s": the pilot's wall time per seed}: seeds by power from the committed data
    alone, each capped at ``cap`` = the seeds every part with data can run within ``budget_min`` minutes at
    the wall time per seed of its pilot, the first batch of seeds it was run with (parts without data:
    ``min_seeds``, their cost not yet known). The pilot's, not the mean over batches: a cap that fell as seeds
    were added would never be reached."""
    per_seed = {p: pilot_seconds_per_seed(data[p]) for p in parts if p in data}
    cap = int(budget_min * 60 // sum(per_seed.values())) if per_seed else min_seeds
    plan = {}
    for part in parts:
        if part not in data:
            plan[part] = {"seeds": min_seeds, "wanted": min_seeds, "families": [], "per_seed_s": None, "cap": cap}
            continue
        powers = [(f.name, f.power()) for f in families.get(part, [])]
        needed = [pw.get("seeds_needed") for _, pw in powers if pw and "effect_of_interest" in pw]
        wanted = max([min_seeds] + [MOST_SEEDS + 1 if n is None else n for n in needed])
        plan[part] = {"seeds": min(wanted, cap), "wanted": wanted, "families": powers,
                      "per_seed_s": per_seed[part], "cap": cap}
    return plan


def pilot_seconds_per_seed(record: dict) -> float:
    """The wall time per seed of a part's first batch of seeds (its whole record's before batches were kept)."""
    first = (record.get("batches") or [{"seeds": record["seeds"], "wall_time_s": record["wall_time_s"]}])[0]
    return first["wall_time_s"] / first["seeds"]


def plan_table(data: dict[str, dict], plan: dict[str, dict], min_seeds: int, budget_min: float) -> str:
    """``plan`` (:func:`plan_from`'s, made with ``min_seeds`` and ``budget_min``) as a markdown table per
    family (reproduce.py --plan-seeds)."""
    cap = next(iter(plan.values()))["cap"] if plan else min_seeds
    out = [f"Seeds by power from data/ (committed): per part max({min_seeds}, every family's seeds needed), capped "
           f"at {cap} seeds, what every part with data can run within the compute budget of {budget_min:g} min at "
           "its pilot's wall time per seed (its first batch of seeds).", "",
           "| part | family | effect of interest | n committed | sd of the differences | seeds needed | part's seeds "
           "(planned) | underpowered at the plan |", "|---|---|---|---|---|---|---|---|"]
    for part, p in plan.items():
        have = data[part]["seeds"] if part in data else 0
        if not p["families"]:
            out.append(f"| {part} | (no data) | – | {have} | – | – | {p['seeds']} | – |")
        for name, pw in p["families"]:
            if not pw or "effect_of_interest" not in pw:
                out.append(f"| {part} | {cell(name)} | none (no paired claim) | {have} | – | – | {p['seeds']} | – |")
                continue
            needed = pw["seeds_needed"]
            short = needed is None or needed > p["seeds"]
            out.append(f"| {part} | {cell(name)} | {pw['effect_of_interest']:.3g} | {pw['n']} | {pw['sd']:.3g} | "
                       f"{'more than ' + str(MOST_SEEDS) if needed is None else needed} | {p['seeds']} | "
                       f"{'**yes**' if short else 'no'} |")
    total = sum((p["per_seed_s"] or 0) * p["seeds"] for p in plan.values())
    out += ["", f"Planned compute at the pilots' wall times per seed: {total / 60:.1f} min (parts without data not "
            "counted)."]
    return "\n".join(out)
