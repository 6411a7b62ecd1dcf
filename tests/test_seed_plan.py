"""Seeds by power (testbed.reports.seed_plan) and adding seeds to a committed data file without
redoing it (experiments/topologies/reproduce.py --extend): an extended file is what a full
regeneration gives, and a committed file that does not reproduce is refused."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from testbed.reports.seed_plan import SEED_FLOOR, first_mismatch, plan, plan_table
from testbed.reports.stats import seeds_for_effect
from testbed.reports.verdicts import Family

ROOT = Path(__file__).resolve().parents[1]


def _family(name: str, sd: float, effect: float | None, n: int = 5, claims: int = 2) -> Family:
    rng = np.random.default_rng(0)
    f = Family(name, effect_of_interest=effect)
    for _ in range(claims):
        d = rng.normal(0.0, 1.0, n)
        d = (d - d.mean()) / d.std(ddof=1) * sd  # differences of exactly this sd
        f.paired(list(0.5 + d), [0.5] * n, "a>b")
    return f


def test_a_scenario_runs_its_neediest_family_s_seeds_at_least_the_floor_at_most_the_budget() -> None:
    small, large = _family("small", 0.002, 0.01), _family("large", 0.01, 0.01)
    need = seeds_for_effect(0.01, 0.01, 2)
    plans = {p.scenario: p for p in plan({"a": [small], "b": [small, large], "c": [large], "d": []},
                                         {"a": 5, "b": 5, "c": 5, "d": 10}, {"a": 20, "b": 20, "c": 9, "d": 20})}
    assert plans["a"].seeds == SEED_FLOOR and not plans["a"].underpowered  # a few seeds suffice: the floor
    assert plans["b"].seeds_needed == need and plans["b"].family == "large" and plans["b"].seeds == need
    assert plans["c"].seeds == 9 and plans["c"].underpowered and plans["c"].why == "capped by the budget"
    assert plans["d"].seeds == 10 and plans["d"].seeds_needed is None  # committed seeds are never dropped
    assert len(plan_table(list(plans.values()))) == 2 + 4


def test_an_effect_out_of_reach_is_capped_and_said() -> None:
    p = plan({"s": [_family("noisy", 1.0, 0.001)]}, {"s": 5}, {"s": 8})[0]
    assert p.out_of_reach and p.seeds == 8 and p.underpowered
    assert "more than 1000" in plan_table([p])[2]


def test_first_mismatch_names_the_first_difference_and_skips_measured_fields() -> None:
    a = {"runs": [{"acc": [0.5, 0.6], "wall_s": 1.0}], "seeds": [0, 1]}
    assert first_mismatch(a, json.loads(json.dumps(a))) is None
    assert first_mismatch(a, {"runs": [{"acc": [0.5, 0.6], "wall_s": 2.0}], "seeds": [0, 1]}, {"wall_s"}) is None
    assert first_mismatch(a, {"runs": [{"acc": [0.5, 0.7], "wall_s": 1.0}], "seeds": [0, 1]}) == \
        "runs[0].acc[1]: committed 0.6, rerun 0.7"
    assert first_mismatch(a, {"runs": [{"acc": [0.5]}], "seeds": [0, 1]}, {"wall_s"}) == \
        "runs[0].acc: committed 2 items, rerun 1"
    assert first_mismatch({"x": True}, {"x": 1}) is not None


TINY = """
[run]
name = "tiny"
algorithm = "dwfl"
seed = 0
[data]
dataset = "synthetic"
num_nodes = 4
samples_per_node = 30
dim = 4
[model]
kind = "logistic"
[dwfl]
scheme = "ota_d2d"
variant = "B"
rounds = 4
batch = 8
lr = 0.5
gmax = 0.25
epsilon = 5.0
fading = "rayleigh"
[topology]
kind = "complete"
[privacy]
delta = 1e-5
[output]
figures = false
"""


@pytest.fixture
def topologies(tmp_path, monkeypatch):
    """experiments/topologies' runs (topology_runs.py) on a tiny scenario: 4 nodes, 4 rounds, two graphs."""
    import sys

    monkeypatch.syspath_prepend(str(ROOT / "experiments/topologies"))
    spec = importlib.util.spec_from_file_location("topology_runs", ROOT / "experiments/topologies/topology_runs.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    (tmp_path / "tiny.toml").write_text(TINY)
    monkeypatch.setattr(module, "DATA", tmp_path / "data")
    monkeypatch.setattr(module, "SCENARIOS", {"tiny": ("a tiny scenario", str(tmp_path / "tiny.toml"), {})})
    monkeypatch.setattr(module, "topology_curves",
                        lambda section: {"complete": (("topology.kind", "complete"),), "ring": (("topology.kind", "ring"),)})
    return module


def _without_measured(record: dict, measured) -> dict:
    record = {k: v for k, v in record.items() if k != "runs_wall_s"}
    record["runs"] = [{k: v for k, v in r.items() if k not in measured} for r in record["runs"]]
    return record


def test_an_extended_file_is_the_full_regeneration_and_a_file_that_does_not_reproduce_is_refused(
        topologies, tmp_path, capsys) -> None:
    path = topologies.run_scenario("tiny", 2, 1, tmp_path / "full")
    full = json.loads(path.read_text())
    topologies.run_scenario("tiny", 1, 1, tmp_path / "pilot")
    topologies.extend_scenario("tiny", 2, 1, tmp_path / "more")
    extended = json.loads(path.read_text())
    assert extended["seeds"] == [0, 1] and [(r["curve"], r["seed"]) for r in extended["runs"]] == [
        ("complete", 0), ("complete", 1), ("ring", 0), ("ring", 1)]
    assert _without_measured(extended, topologies.MEASURED) == _without_measured(full, topologies.MEASURED)
    assert "reproduces the committed run" in capsys.readouterr().out

    # committed numbers the code no longer gives (a changed learner, an edited file): refused, one line
    tampered = json.loads(path.read_text())
    cheapest = min(tampered["runs"], key=lambda r: r["wall_s"])
    cheapest["final_acc"] += 0.01
    path.write_text(json.dumps(tampered))
    with pytest.raises(SystemExit) as refused:
        topologies.extend_scenario("tiny", 3, 1, tmp_path / "more")
    message = str(refused.value)
    assert "refusing to extend" in message and "final_acc" in message and "\n" not in message
    assert json.loads(path.read_text()) == tampered  # nothing written


@pytest.fixture
def acfl(tmp_path, monkeypatch):
    """experiments/acfl's runs (acfl_runs.py) writing their data to a scratch folder."""
    import sys

    monkeypatch.syspath_prepend(str(ROOT / "experiments/acfl"))
    spec = importlib.util.spec_from_file_location("acfl_runs", ROOT / "experiments/acfl/acfl_runs.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    monkeypatch.setattr(module, "DATA", tmp_path / "data")
    return module


def test_acfl_s_fig3_extended_is_its_full_regeneration_in_the_same_order(acfl) -> None:
    """Fig. 3's runs loop p outside the seeds: the added seeds' runs go where a full run puts them."""
    def compute(chosen, out):
        return acfl.timed(lambda: acfl.fig3_data(chosen, 20))

    acfl.write_data("fig3", compute(range(3), None))
    full = acfl.read_data("fig3")
    acfl.write_data("fig3", compute(range(2), None))
    merged = acfl.extend("fig3", 3, compute)
    assert [(r["p"], r["seed"]) for r in merged["runs"]] == [(r["p"], r["seed"]) for r in full["runs"]]
    assert acfl._rounded(merged) | {"wall_s": 0} == full | {"wall_s": 0}
    assert acfl.extend("fig3", 2, compute) is None  # nothing missing: nothing run

    tampered = acfl.read_data("fig3")
    tampered["runs"][0]["final_loss"] *= 1.5
    acfl.write_data("fig3", tampered)
    with pytest.raises(SystemExit, match=r"^fig3: refusing to extend: seed 0 does not reproduce .*final_loss"):
        acfl.extend("fig3", 3, compute)


@pytest.fixture
def dp_pasgd(tmp_path, monkeypatch):
    """experiments/dp_pasgd/reproduce.py on a tiny E2 grid (Adult-2, C_th = 500, ε_th = 10, τ = 1: K = 2 and 4)."""
    import sys

    monkeypatch.syspath_prepend(str(ROOT / "experiments/dp_pasgd"))
    spec = importlib.util.spec_from_file_location("dp_pasgd_reproduce", ROOT / "experiments/dp_pasgd/reproduce.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)  # its dataclasses look their module up
    spec.loader.exec_module(module)
    results_data = sys.modules["results_data"]
    for target in (module, results_data):
        monkeypatch.setattr(target, "DATA", tmp_path / "data")
    monkeypatch.setattr(module, "E2_BUDGETS", (500.0,))
    monkeypatch.setattr(module, "EPSILONS", (10.0,))
    monkeypatch.setattr(module, "E2_TAUS", (1,))
    return module


def test_dp_pasgd_s_e2_extended_is_its_full_regeneration(dp_pasgd, tmp_path, capsys) -> None:
    datasets = {"adult-2": dp_pasgd.setup("adult-2")}
    rows, wall = dp_pasgd.e2_runs(datasets, tmp_path / "full", 1, range(2))
    dp_pasgd.write("e2", dp_pasgd.E2_COLUMNS, rows, wall)
    full = dp_pasgd.read("e2").rows
    dp_pasgd.write("e2", dp_pasgd.E2_COLUMNS, *dp_pasgd.e2_runs(datasets, tmp_path / "pilot", 1, range(1)))
    dp_pasgd.extend("e2", datasets, tmp_path / "more", 1, 2)
    assert dp_pasgd.read("e2").rows == full and [(r["steps"], r["seed"]) for r in full] == [(2, 0), (2, 1), (4, 0), (4, 1)]
    assert "reproduces the committed run" in capsys.readouterr().out

    path = tmp_path / "data" / "e2.json"
    path.write_text(path.read_text().replace(str(full[0]["test_accuracy"]), str(full[0]["test_accuracy"] + 0.25), 1))
    with pytest.raises(SystemExit, match=r"^e2: refusing to extend: seed 0 of adult-2 at 2 steps does not reproduce"):
        dp_pasgd.extend("e2", datasets, tmp_path / "more", 1, 3)


def test_recordings_nest_and_an_inner_one_equal_to_its_outer_one_ends_cleanly() -> None:
    """A REPORT attributes its families to scenarios with a recording inside its own: the inner list
    starts equal to the outer one, and ending it must end the inner one, not the first equal list."""
    from testbed.reports.verdicts import recording

    with recording() as outer:
        with recording() as inner:
            f = Family("one")
        g = Family("two")
    h = Family("after")
    assert inner == [f] and outer == [f, g] and h not in outer


def _script(monkeypatch, folder: str, name: str):
    import sys

    monkeypatch.syspath_prepend(str(ROOT / "experiments" / folder))
    spec = importlib.util.spec_from_file_location(f"{folder}_{name}", ROOT / "experiments" / folder / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module


def test_the_scripts_default_seeds_are_the_plan_from_their_committed_data(monkeypatch) -> None:
    """The seeds a regeneration runs by default (topologies' and ACFL's SEEDS, DP-PASGD's E*_SEEDS) are
    the seeds --plan-seeds plans from the data committed beside them."""
    from testbed.reports.verdicts import recording

    topologies = _script(monkeypatch, "topologies", "reproduce")
    assert {p.scenario: p.seeds for p in topologies.seed_plans(topologies.load())} == topologies.SEEDS

    acfl = _script(monkeypatch, "acfl", "reproduce")
    monkeypatch.setattr(acfl, "plot_curves", lambda *args, **kwargs: None)  # the committed figures stay as they are
    assert {p.scenario: p.seeds for p in acfl.seed_plans()} == acfl.SEEDS

    dp = _script(monkeypatch, "dp_pasgd", "reproduce")
    tables = {k: dp.read(k) for k in ("e1", "e2", "e3", "e4", "planfit", "learns")}
    with recording() as made:
        dp.report(tables)
    planned = {p.scenario: p.seeds for p in dp.seed_plans(tables, made)}
    assert planned == {"e1": len(dp.E1_SEEDS), "e2": len(dp.E2_SEEDS), "e3": len(dp.E3_SEEDS),
                       "planfit": len(dp.E2_SEEDS), "learns": len(dp.LEARNS_SEEDS)}
