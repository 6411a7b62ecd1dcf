"""experiments/dwfl/reproduce.py --extend: seeds added to a committed data file give what a full
regeneration gives, and an extension is refused when a committed run does not reproduce."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parents[1] / "experiments" / "dwfl"


@pytest.fixture
def reproduce(tmp_path, monkeypatch):
    """The script with a tiny sweep (one scenario of two curves, N = 10) writing under ``tmp_path``."""
    monkeypatch.syspath_prepend(str(HERE))
    sys.modules.pop("reproduce", None)
    import reproduce as module

    monkeypatch.setattr(module, "REPO", tmp_path)
    monkeypatch.setattr(module, "DATA", tmp_path / "data")
    monkeypatch.setattr(module, "sweeps", lambda eps_scale=1.0: {"fig6": [
        ("N=10", scheme, ["data.num_nodes=10", f"dwfl.scheme='{scheme}'"]) for scheme in ("ota_d2d", "ota_central")]})
    yield module
    sys.modules.pop("reproduce", None)


def _run(module, seeds: int, extend: bool = False) -> dict:
    module.run_task(argparse.Namespace(task="adult", seeds=seeds, rounds=2, jobs=1, scenarios="fig6",
                                       epsilon_scale=1.0, extend=extend))
    return json.loads((module.DATA / "adult" / "fig6.json").read_text())


def _numbers(record: dict) -> dict:
    """The record less its measured times (which no two invocations share)."""
    drop = ("wall_s", "runs_wall_s", "wall_parts_s", "seed_parts")
    return {**{k: v for k, v in record.items() if k not in drop},
            "runs": [{k: v for k, v in r.items() if k != "wall_s"} for r in record["runs"]]}


def test_extend_adds_only_the_missing_seeds_and_equals_a_full_run(reproduce, tmp_path):
    full = _run(reproduce, 3)
    (reproduce.DATA / "adult" / "fig6.json").unlink()
    import shutil

    shutil.rmtree(tmp_path / "runs")  # nothing reused: the extension runs seeds 2 only, afresh
    pilot = _run(reproduce, 2)
    shutil.rmtree(tmp_path / "runs")
    extended = _run(reproduce, 3, extend=True)
    assert _numbers(extended) == _numbers(full)
    assert extended["runs"][:2] == pilot["runs"][:2]  # the committed runs kept as they were
    assert extended["seed_parts"] == [2, 1] and len(extended["wall_parts_s"]) == 2 and extended["wall_s"] == pytest.approx(sum(extended["wall_parts_s"]))
    # only seed 2 was run by the extension (and the one run checked again, in a scratch folder)
    assert sorted(p.name.rsplit("-s", 1)[1] for p in (tmp_path / "runs").rglob("*-s*") if p.is_dir()) == ["2", "2"]


def test_extend_refuses_when_a_committed_run_does_not_reproduce(reproduce):
    _run(reproduce, 2)
    path = reproduce.DATA / "adult" / "fig6.json"
    record = json.loads(path.read_text())
    for run in record["runs"]:  # every run, so the cheapest one checked is tampered with too
        run["final_loss"] += 1e-3
    path.write_text(json.dumps(record))
    with pytest.raises(SystemExit, match="does not reproduce"):
        _run(reproduce, 3, extend=True)
    assert json.loads(path.read_text()) == record  # the file is left as it was


def test_extend_refuses_a_file_made_otherwise_or_with_nothing_to_add(reproduce):
    _run(reproduce, 2)
    with pytest.raises(SystemExit, match="adds none"):
        _run(reproduce, 2, extend=True)
    with pytest.raises(SystemExit, match="not the first of --seeds 1"):
        _run(reproduce, 1, extend=True)
    path = reproduce.DATA / "adult" / "fig6.json"
    record = json.loads(path.read_text())
    path.write_text(json.dumps({**record, "rounds": 3}))
    with pytest.raises(SystemExit, match="other settings"):
        _run(reproduce, 3, extend=True)


def test_the_seeds_defaults_are_the_plan_of_the_committed_data():
    """--plan-seeds from the committed data chooses what reproduce.SEEDS runs by default, every task at
    least the floor of 8 the budget was set for, and no task planned below the seeds it ran."""
    sys.path.insert(0, str(HERE))
    sys.modules.pop("reproduce", None)
    try:
        import reproduce

        plan = reproduce.plan_seeds()
        assert {r["folder"] for r in plan} == {"adult", "cnn", "cnn-eps10x"}
        for row in plan:
            assert row["chosen"] == reproduce.SEEDS[row["folder"]] >= min(8, row["target"])
            assert row["chosen"] >= row["run"]
        table = reproduce.plan_table(plan, reproduce.SEEDS)
        assert all(row["folder"] in table for row in plan)
    finally:
        sys.path.remove(str(HERE))
        sys.modules.pop("reproduce", None)


def test_the_seeds_paragraph_of_an_extension_cut_short(reproduce):
    """Files with different seed counts (an extension stopped between scenarios): the paragraph says so,
    gives the trends their figure's n, judges each family at its own n and says what did not run."""
    row = {"folder": "adult", "run": 5, "target": 20, "chosen": 8, "min_per_seed": 1.0,
           "files": {"fig2": (5, 0.5), "fig5": (8, 0.5)},
           "needs": [("Fig. 5, train loss: x", 0.035, 7, 8), ("Fig. 6, train loss: y", 0.035, 20, 8)]}
    import dwfl_seeds

    (text,) = dwfl_seeds.seeds_paragraph(row, [row])
    assert "5 to 8 (an extension cut short) seeds per curve" in text
    assert "n = the seeds of their figure" in text
    assert "**Underpowered** here: Fig. 6, train loss;" in text  # Fig. 5 needs 7 and has 8
    assert "3 more than ran" in text and "`--extend` adds them" in text
