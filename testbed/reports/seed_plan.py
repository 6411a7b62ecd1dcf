"""Seeds by power, not by floor (issue 41; docs/statistics.md, "Seeds by power").

A scenario's seed count is the largest number of seeds any family judged on its runs needs to detect
its effect of interest at 80 % power after Holm (:meth:`testbed.reports.verdicts.Family.power`, from
the sd of the committed runs: the pilot), at least :data:`SEED_FLOOR` (the fewest pairs from which a
rank test is shown, stats.RANK_TEST_MIN_N), at most the scenario's compute budget, and never fewer
than the seeds already committed (dropping runs already made only loses power). A reproduction's
``--plan-seeds`` prints :func:`plan_table` from its committed data without running anything, and its
REPORT prints the same table for the data it was generated from.

An extension (``--extend``) adds only the missing seeds to a committed data file; it first reruns one
committed run and refuses unless the rerun equals the committed record (:func:`first_mismatch`), so an
extended file is what a full regeneration would give.

Example::

    >>> from testbed.reports.verdicts import Family
    >>> f = Family("a against b", effect_of_interest=0.01)
    >>> _ = f.paired([0.80, 0.82, 0.81, 0.83, 0.80], [0.79, 0.80, 0.80, 0.82, 0.80], "a>b")
    >>> p = plan({"s": [f]}, {"s": 5}, {"s": 12})[0]
    >>> p.seeds_needed, p.seeds
    (7, 8)
    >>> first_mismatch({"acc": [0.5, 0.6], "wall_s": 3.0}, {"acc": [0.5, 0.61], "wall_s": 2.0}, ignore={"wall_s"})
    'acc[1]: committed 0.6, rerun 0.61'
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from testbed.reports.stats import MOST_SEEDS, RANK_TEST_MIN_N
from testbed.reports.verdicts import Family

#: Fewest seeds a scenario runs: the rank test is shown from this many pairs on (stats.RANK_TEST_MIN_N).
SEED_FLOOR = RANK_TEST_MIN_N


@dataclass(frozen=True)
class ScenarioPlan:
    """One scenario's seeds: how many its data hold (``seeds_run``), the most any of its families needs
    for its effect of interest (``seeds_needed``; None: more than stats.MOST_SEEDS, or no family declares
    an effect), that family's name, the compute budget (seeds) and the seeds to run (:attr:`seeds`)."""

    scenario: str
    seeds_run: int
    seeds_needed: int | None
    family: str | None
    budget: int
    out_of_reach: bool = False  # a family needs more than stats.MOST_SEEDS

    @property
    def wanted(self) -> float:
        """max(SEED_FLOOR, seeds needed) before the budget (infinite when out of reach)."""
        if self.out_of_reach:
            return float("inf")
        return SEED_FLOOR if self.seeds_needed is None else max(SEED_FLOOR, self.seeds_needed)

    @property
    def seeds(self) -> int:
        """max(SEED_FLOOR, seeds needed), capped by the budget, never below the seeds already run."""
        return max(self.seeds_run, int(min(self.budget, self.wanted)))

    @property
    def why(self) -> str:
        """Why :attr:`seeds` is what it is, in a few words."""
        if self.wanted > self.budget:
            reason = "capped by the budget"
        elif self.seeds_needed is None:
            reason = f"no family declares an effect of interest: the floor {SEED_FLOOR}"
        elif self.seeds_needed <= SEED_FLOOR:
            reason = f"the floor {SEED_FLOOR} (the rank test's minimum) covers every family"
        else:
            reason = "what its neediest family needs"
        if self.seeds_run > min(self.budget, self.wanted):
            reason += f"; the {self.seeds_run} committed are kept"
        return reason

    @property
    def underpowered(self) -> bool:
        """The data hold fewer seeds than a family needs."""
        return self.out_of_reach or (self.seeds_needed is not None and self.seeds_needed > self.seeds_run)


def plan(families: Mapping[str, Sequence[Family]], seeds_run: Mapping[str, int],
         budget: Mapping[str, int]) -> list[ScenarioPlan]:
    """Each scenario's plan (in ``seeds_run``'s order) from the families judged on its runs (a family
    judged on two scenarios' runs, paired by seed, counts for both)."""
    plans = []
    for scenario, run in seeds_run.items():
        most, family, out_of_reach = None, None, False
        for f in families.get(scenario, ()):
            power = f.power()
            if power is None or "seeds_needed" not in power:
                continue
            needed = power["seeds_needed"]
            if needed is None:
                if not out_of_reach:
                    most, family, out_of_reach = None, f.name, True
            elif not out_of_reach and (most is None or needed > most):
                most, family = needed, f.name
        plans.append(ScenarioPlan(scenario, int(run), most, family, int(budget[scenario]), out_of_reach))
    return plans


def plan_table(plans: Sequence[ScenarioPlan]) -> list[str]:
    """The plan as markdown table lines: per scenario the seeds run, needed, budget, to run, and why."""
    lines = ["| scenario | seeds run | seeds needed (family that needs the most) | budget | seeds planned | why |",
             "|---|---|---|---|---|---|"]
    for p in plans:
        needed = (f"more than {MOST_SEEDS}" if p.out_of_reach else "–" if p.seeds_needed is None
                  else str(p.seeds_needed))
        family = f" ({p.family})" if p.family else ""
        flag = " **underpowered**" if p.underpowered else ""
        lines.append(f"| {p.scenario} | {p.seeds_run}{flag} | {needed}{family} | {p.budget} | {p.seeds} | {p.why} |")
    return lines


def first_mismatch(committed: Any, rerun: Any, ignore: Collection[str] = (), path: str = "") -> str | None:
    """Where ``rerun`` first differs from ``committed`` (nested dicts, lists, numbers, strings), as
    'path: committed X, rerun Y'; None when they are equal. Keys in ``ignore`` (measured times and
    what is computed from them, which differ between any two runs) are skipped at every depth."""
    if isinstance(committed, Mapping) and isinstance(rerun, Mapping):
        for key in committed.keys() | rerun.keys():
            if key in ignore:
                continue
            where = f"{path}.{key}" if path else str(key)
            if key not in committed or key not in rerun:
                return f"{where}: only in the {'rerun' if key not in committed else 'committed run'}"
            found = first_mismatch(committed[key], rerun[key], ignore, where)
            if found:
                return found
        return None
    if isinstance(committed, (list, tuple)) and isinstance(rerun, (list, tuple)):
        if len(committed) != len(rerun):
            return f"{path}: committed {len(committed)} items, rerun {len(rerun)}"
        for i, (a, b) in enumerate(zip(committed, rerun)):
            found = first_mismatch(a, b, ignore, f"{path}[{i}]")
            if found:
                return found
        return None
    if committed == rerun and isinstance(committed, bool) == isinstance(rerun, bool):
        return None
    return f"{path}: committed {committed!r}, rerun {rerun!r}"
