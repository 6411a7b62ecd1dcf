"""experiments/padpfl's seeds by power (issue 41): the plan printed from the committed data, and the
refusal to add seeds to a part whose committed runs the code no longer makes."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "experiments" / "padpfl"


@pytest.fixture()
def padpfl(monkeypatch):
    monkeypatch.syspath_prepend(str(FOLDER))
    import make_report
    import reproduce

    return reproduce, make_report


def test_the_plan_is_max_of_eight_and_every_familys_seeds_needed_capped_by_the_budget(padpfl) -> None:
    reproduce, make_report = padpfl
    data = reproduce.load_data()
    plan = make_report.seed_plan(data, list(reproduce.PARTS), reproduce.MIN_SEEDS, reproduce.COMPUTE_BUDGET_MIN)
    first = [(r.get("batches") or [r])[0] for r in data.values()]  # each part's pilot, its first batch of seeds
    per_seed = sum(b["wall_time_s"] / b["seeds"] for b in first)
    cap = int(reproduce.COMPUTE_BUDGET_MIN * 60 // per_seed)
    assert set(plan) == set(reproduce.PARTS)
    for part, p in plan.items():
        assert p["cap"] == cap
        needed = [pw["seeds_needed"] for _, pw in p["families"] if pw and "effect_of_interest" in pw]
        assert p["wanted"] == max([reproduce.MIN_SEEDS] + [make_report.MOST_SEEDS + 1 if n is None else n for n in needed])
        assert p["seeds"] == min(p["wanted"], cap)
        # every family with a paired claim states an effect of interest
        assert all("effect_of_interest" in pw for _, pw in p["families"] if pw), part


def test_plan_seeds_prints_every_part_from_the_committed_data() -> None:
    done = subprocess.run([sys.executable, "experiments/padpfl/reproduce.py", "--plan-seeds"], cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ") and not line.startswith("| part")]
    parts = {json.loads((FOLDER / "data" / f).read_text())["part"] for f in (FOLDER / "data").iterdir()}
    assert {row.split(" | ")[0].removeprefix("| ") for row in rows} == parts
    assert "compute budget" in done.stdout


def test_seeds_are_not_added_to_a_part_whose_committed_seed_does_not_reproduce(padpfl) -> None:
    reproduce, _ = padpfl
    committed = json.loads((FOLDER / "data" / "sound.json").read_text())
    tampered = copy.deepcopy(committed)
    first = next(iter(tampered["variants"].values()))
    first["runs"][-1]["test_accuracy"] = round(first["runs"][-1]["test_accuracy"] + 0.01, 6)
    with pytest.raises(SystemExit, match="does not reproduce its committed record"):
        reproduce.check_committed("sound", tampered)


def test_recordings_nest_and_each_block_leaves_its_own_list() -> None:
    """make_report notes which part made each family by a block inside the REPORT's own: the inner
    block's list starts equal to the outer one's (both empty), and each must leave only itself."""
    from testbed.reports.verdicts import Family, recording

    with recording() as outer:
        with recording() as inner:
            pass
        with recording() as inner:
            fam = Family("nested")
        assert outer == inner == [fam]
        after = Family("outer only")
    assert outer == [fam, after] and inner == [fam]
    with recording() as alone:
        pass
    assert alone == []
