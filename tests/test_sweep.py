"""Sweeps (testbed.orchestration.sweep, `testbed sweep`): grid, table, restart after a kill, and the Ray engine."""

import csv
import json

import pytest

from testbed.assembly.config import load_config_text
from testbed.cli import main
from testbed.errors import UserError
from testbed.orchestration.sweep import Point, grid_points, parse_grid, run_sweep

from conftest import require_module


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_parse_grid_and_points():
    grid = parse_grid(["dp_pasgd.tau=1,5", "data.dataset=adult-1,adult-2"])
    assert grid == {"dp_pasgd.tau": [1, 5], "data.dataset": ["adult-1", "adult-2"]}
    points = grid_points(grid, repeats=2, base_seed=3)
    assert len(points) == 8 and {p.seed for p in points} == {3, 4}
    assert points[0].name == "tau-1_dataset-adult-1_seed-3"
    with pytest.raises(UserError, match="run.seed"):
        grid_points({"run.seed": [1]}, 1, 0)
    with pytest.raises(UserError, match="--grid"):
        parse_grid(["dp_pasgd.tau"])


def test_local_sweep_table_and_restart(small_config_file, tmp_path, capsys):
    out = tmp_path / "sweep"
    argv = ["sweep", str(small_config_file), "--grid", "dp_pasgd.tau=2,5", "--grid", "dp_pasgd.lr=0.1,0.5",
            "--repeats", "1", "--workers", "2", "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    rows = _rows(out / "sweep.csv")
    assert len(rows) == 4 and {r["status"] for r in rows} == {"completed"}
    assert {(r["dp_pasgd.tau"], r["dp_pasgd.lr"]) for r in rows} == {("2", "0.1"), ("2", "0.5"), ("5", "0.1"), ("5", "0.5")}
    for column in ("seed", "test_accuracy", "train_loss", "epsilon_max", "cost_max"):
        assert all(r[column] != "" for r in rows)
    assert "test_accuracy" in printed and "tau-2_lr-0.1_seed-1" in {p.name for p in (out.iterdir())}

    # Kill simulation: one run lost its summary (killed mid-run), another left only a half-written folder.
    stamps = {r["run"]: (out / r["run"] / "summary.json").stat().st_mtime_ns for r in rows}
    (out / "tau-5_lr-0.5_seed-1" / "summary.json").unlink()
    assert main(argv) == 0
    log = capsys.readouterr().out
    assert "3 already finished, 1 to run" in log and "[1/1] tau-5_lr-0.5_seed-1" in log
    for name, stamp in stamps.items():
        changed = (out / name / "summary.json").stat().st_mtime_ns != stamp
        assert changed == (name == "tau-5_lr-0.5_seed-1")
    assert len(_rows(out / "sweep.csv")) == 4


def test_half_written_run_is_cleared(small_config_text, tmp_path):
    base = load_config_text(small_config_text)
    point = Point((("dp_pasgd.tau", 5),), 1)
    leftover = tmp_path / point.name
    leftover.mkdir()
    (leftover / "metrics.csv").write_text("round\n1\n")  # RunDirectory refuses a folder like this
    (leftover / "summary.json").write_text(json.dumps({"status": "failed"}))
    rows = run_sweep(base, [point], tmp_path, quiet=True)
    assert rows[0]["status"] == "completed" and rows[0]["tau"] == 5


@pytest.mark.parametrize("machine_cores, node_workers", [(4, 2), (2, 0)])
def test_jobs_run_at_once_share_the_cores(small_config_text, tmp_path, monkeypatch, machine_cores, node_workers):
    """Two jobs at once, each with node workers one per core (``run.workers = 0``): on 4 cores each
    job forks 2, on 2 cores none (one core each), never every job a worker per core of the machine."""
    monkeypatch.setattr("os.cpu_count", lambda: machine_cores)  # the pool's jobs are forks of this process
    monkeypatch.setattr("testbed.orchestration.sim_nodes.MIN_FLOPS", 1)  # every round worth workers
    monkeypatch.setattr("testbed.orchestration.sim_nodes.can_fork", lambda: True)  # no torch model here
    base = load_config_text(small_config_text)
    points = [Point((("dp_pasgd.tau", tau),), 1) for tau in (2, 5)]
    run_sweep(base, points, tmp_path, workers=2, quiet=True)
    assert [json.loads((tmp_path / p.name / "summary.json").read_text())["sim_workers"] for p in points] == \
        [node_workers, node_workers]


def test_ray_engine_tiny_grid(small_config_text, tmp_path):
    ray = require_module("ray", "ray")
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False)
    try:
        base = load_config_text(small_config_text)
        rows = run_sweep(base, grid_points({"dp_pasgd.tau": [2, 5]}, 1, 0), tmp_path / "ray", engine="ray", quiet=True)
    finally:
        ray.shutdown()
    assert [r["status"] for r in rows] == ["completed", "completed"] and (tmp_path / "ray" / "sweep.csv").exists()
