"""benchmarks/startup.py's figures are the run's own: "start to round 1" is the moment the run's
set-up ends (Startup.done, marked by benchmarks/startup_probe.py in the child), inside the
process's life, after everything the set-up did and before the rounds' files; --stages times
the runner's stages in their order."""

import csv
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from startup import REPO, Case, run_once  # noqa: E402

SMALL = ("run", str(REPO / "experiments/quickstart.toml"), "--mode", "sim", "--quiet", "--set", "dp_pasgd.steps=20",
         "--set", "output.figures=false", "--set", "privacy.tight_accountant='none'", "--out", "{out}")


def test_round_1_is_marked_between_the_set_up_and_the_rounds(tmp_path):
    before = time.time()
    timed = run_once(Case("small", SMALL), REPO, tmp_path / "r")
    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert 0 < timed.round_1_s < timed.whole_s <= time.time() - before
    # The set-up the run counted itself (from its start inside the process) ends at the mark.
    assert summary["setup_s"] < timed.round_1_s
    with open(tmp_path / "r" / "metrics.csv") as f:
        rounds = list(csv.DictReader(f))
    assert len(rounds) == 2 and timed.round_1_s + float(rounds[-1]["wall_s"]) < timed.whole_s


def test_stages_come_in_order_and_name_the_heavy_imports(tmp_path):
    timed = run_once(Case("small", SMALL), REPO, tmp_path / "r", stages=True)
    names = [name for name, _ in timed.marks["marks"]]
    at = [t for _, t in timed.marks["marks"]]
    assert at == sorted(at) and names[0] == "start" and names[-1] == "process gone"
    order = ["runner.load begins", "runner.load ends", "round 1 begins", "runner.run_rounds ends",
             "runner.finish begins", "exit"]
    assert [n for n in names if n in order] == order
    assert "torch" not in timed.marks["heavy"] and "pydantic" in timed.marks["heavy"]
