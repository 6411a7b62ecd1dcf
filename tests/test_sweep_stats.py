"""A small real sweep (the quickstart in sim, a few steps, 2 grid points × 3 repeats): its
sweep_stats.csv against scipy recomputed from its sweep.csv, `testbed compare` on it, and its HTML
report's interval figures."""

import csv
import json
import re
from pathlib import Path

import numpy as np
import pytest
import scipy.stats

from testbed.cli import main
from testbed.reports.sweep_stats import stats_rows

QUICKSTART = Path(__file__).resolve().parents[1] / "experiments" / "quickstart.toml"
SMALL = ['run.mode="sim"', "data.num_nodes=4", "data.samples_per_node=100", "dp_pasgd.steps=10", "dp_pasgd.tau=5",
         "dp_pasgd.batch=20"]
FIELDS = ("test_accuracy", "validation_accuracy", "train_loss", "epsilon_max", "cost_max", "energy_j_max", "rounds",
          "tau", "steps", "sigma")


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    out = tmp_path_factory.mktemp("stats") / "sweep"
    argv = ["sweep", str(QUICKSTART), *[a for s in SMALL for a in ("--set", s)], "--grid", "dp_pasgd.lr=0.5,1.0",
            "--repeats", "3", "--workers", "2", "--out", str(out), "--quiet"]
    assert main(argv) == 0
    return out


def test_sweep_stats_are_scipys_recomputed_from_the_runs(sweep):
    runs, stats = _rows(sweep / "sweep.csv"), _rows(sweep / "sweep_stats.csv")
    assert len(runs) == 6 and [s["dp_pasgd.lr"] for s in stats] == ["0.5", "1.0"]
    assert list(stats[0])[:2] == ["dp_pasgd.lr", "n"]
    for s in stats:
        group = [r for r in runs if r["dp_pasgd.lr"] == s["dp_pasgd.lr"]]
        assert s["n"] == "3" and sorted(int(r["seed"]) for r in group) == [0, 1, 2]
        for field in FIELDS:
            x = np.array([float(r[field]) for r in group])
            mean, sd = float(s[f"{field}_mean"]), float(s[f"{field}_sd"])
            assert mean == pytest.approx(x.mean(), rel=1e-12) and sd == pytest.approx(np.std(x, ddof=1), abs=1e-12)
            low, high = float(s[f"{field}_ci_low"]), float(s[f"{field}_ci_high"])
            bca = float(s[f"{field}_bca_low"]), float(s[f"{field}_bca_high"])
            if np.ptp(x) == 0:  # a constant of the point (ε, cost, rounds...): every interval is the value
                assert (sd, low, high, *bca) == (0.0, x[0], x[0], x[0], x[0])
                continue
            ref = scipy.stats.t.interval(0.95, 2, loc=x.mean(), scale=scipy.stats.sem(x))
            assert (low, high) == pytest.approx(ref, rel=1e-12)
            boot = scipy.stats.bootstrap((x,), np.mean, method="BCa", n_resamples=9999, rng=np.random.default_rng(0))
            assert bca == pytest.approx(tuple(boot.confidence_interval), rel=1e-12)
    varied = [f for f in FIELDS if any(float(s[f"{f}_sd"]) > 0 for s in stats)]
    assert "test_accuracy" in varied and "train_loss" in varied  # the check above compared real intervals


def test_too_few_repeats_leave_the_intervals_empty():
    rows = [{"k": 1, "seed": s, "status": "completed", "test_accuracy": a, "run": f"r{s}"} for s, a in enumerate([0.5, 0.6])]
    two = stats_rows(rows, ["k"])[0]
    assert two["n"] == 2 and two["test_accuracy_ci_low"] is not None and two["test_accuracy_bca_low"] is None
    one = stats_rows(rows[:1], ["k"])[0]
    assert one["n"] == 1 and one["test_accuracy_mean"] == 0.5
    assert one["test_accuracy_sd"] is one["test_accuracy_ci_low"] is one["test_accuracy_bca_high"] is None
    rows[1]["test_accuracy"] = None  # a run without the field: the point has no statistics of it
    assert stats_rows(rows, ["k"])[0]["test_accuracy_mean"] is None


def test_compare_on_the_sweep_pairs_its_runs_by_seed(sweep, capsys):
    assert main(["compare", str(sweep), "--a", "lr=0.5", "--b", "lr=1.0", "--metric", "train_loss", "--json"]) == 0
    (result,) = json.loads(capsys.readouterr().out)
    runs = _rows(sweep / "sweep.csv")
    a = [float(r["train_loss"]) for r in sorted(runs, key=lambda r: int(r["seed"])) if r["dp_pasgd.lr"] == "0.5"]
    b = [float(r["train_loss"]) for r in sorted(runs, key=lambda r: int(r["seed"])) if r["dp_pasgd.lr"] == "1.0"]
    assert result["n"] == 3 and result["seeds"] == [0, 1, 2] and not result["higher_is_better"]
    assert result["mean"] == pytest.approx(np.mean(np.subtract(a, b)))
    assert result["p_t"] == pytest.approx(scipy.stats.ttest_rel(a, b).pvalue)
    assert result["verdict"] in ("a better", "b better", "no difference detected (n=3)")
    assert main(["compare", str(sweep), "--a", "lr=0.5", "--b", "lr=1.0"]) == 0
    assert "test_accuracy (higher is better), 3 pairs by seed" in capsys.readouterr().out


def test_html_report_of_the_sweep_draws_intervals(sweep, capsys):
    assert main(["report", str(sweep), "--html"]) == 0
    page = (sweep / "report.html").read_text()
    alts = re.findall(r'<img alt="([^"]*)"', page)
    assert alts == ["accuracy against epsilon", "accuracy against round",
                    "grid points&#x27; mean final metrics with 95% intervals",
                    "grid points&#x27; mean curves against round with 95% bands"]
    assert "<h2>Grid points (mean [95% t interval] over repeats)</h2>" in page
    stats = _rows(sweep / "sweep_stats.csv")
    assert f"{float(stats[0]['test_accuracy_mean']):.4g} [{float(stats[0]['test_accuracy_ci_low']):.4g}," in page
