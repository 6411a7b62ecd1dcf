"""The small things that cost a newcomer minutes (issue 43, part 6), each shown as they would
meet it: round numbers that agree, a `testbed nodes` that says what it does, a pipe closed early."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def _testbed(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "testbed", *args], cwd=REPO, **kw)


@pytest.fixture
def runs_dir(tmp_path, small_config_text):
    from testbed.assembly.config import load_config_text
    from testbed.orchestration.runner import run_experiment

    for name in ("a", "b"):
        run_experiment(load_config_text(small_config_text), out_dir=tmp_path / "runs" / name, quiet=True)
    return tmp_path / "runs"


@pytest.mark.parametrize("args", [["runs", "{runs}"], ["runs", "{runs}", "--json"], ["--help"], ["run", "--help"],
                                  ["report", "{runs}/a"], ["schema"]])
def test_a_reader_that_leaves_early_ends_the_command_quietly(args, runs_dir):
    """`testbed runs | head`: the reader closed the pipe; the command stops as a Unix tool does (no
    BrokenPipeError traceback), whatever command printed."""
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line
    try:
        done = subprocess.run([sys.executable, "-m", "testbed", *(a.format(runs=runs_dir) for a in args)], cwd=REPO,
                              stdout=write, stderr=subprocess.PIPE, text=True, timeout=120)
    finally:
        os.close(write)
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr
    assert done.returncode in (0, 128 + signal.SIGPIPE), done.stderr


def test_a_host_of_emulated_nodes_says_what_it_is_doing(embedded_broker, board_keys):
    host = _testbed("nodes", "--count", "3", "--first-id", "4", "--broker", embedded_broker.url, "--run", "newcomer",
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        said = [host.stdout.readline() for _ in range(3)]
    finally:
        host.send_signal(signal.SIGTERM)
        host.communicate(timeout=60)
    said = [line.split(" ", 1)[1].rstrip("\n") for line in said]  # without the time stamp
    assert said[0] == f"host of nodes 4..6 (3): connecting to {embedded_broker.url}"
    assert said[1].startswith(f"host of nodes 4..6 (3): connected to {embedded_broker.url} in ")
    assert said[2] == "host of nodes 4..6 (3): waiting for a run (run id newcomer)"


def test_a_host_started_quiet_or_by_its_coordinator_says_nothing():
    import argparse

    from testbed.cli.node import _state_lines

    ask = lambda **kw: argparse.Namespace(**{"quiet": False, "coordinator_pid": None, "command": "nodes", **kw})
    assert _state_lines(ask(quiet=True), [0, 1]) is None
    assert _state_lines(ask(coordinator_pid=1), [0, 1]) is None
    assert _state_lines(ask(), [3, 9]).who == "host of nodes 3, 9 (2)"
    assert _state_lines(ask(command="node"), [3]).who == "node 3"


def test_a_sweep_prints_each_runs_own_time(small_config_text, tmp_path, capsys):
    """Not the seconds since the sweep began: the run's own set-up and rounds, as its summary has them."""
    import json
    import re

    from testbed.assembly.config import load_config_text
    from testbed.orchestration.sweep import grid_points, run_sweep

    rows = run_sweep(load_config_text(small_config_text), grid_points({"dp_pasgd.tau": [2, 5]}, 1, 0), tmp_path / "s",
                     workers=1)
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("[")]
    assert len(said) == 2
    for line in said:
        name = line.split("] ", 1)[1].split(":", 1)[0]
        summary = json.loads((tmp_path / "s" / name / "summary.json").read_text())
        seconds = re.search(r"\(([\d.]+) s: set-up ([\d.]+) s, rounds ([\d.]+) s\)$", line)
        assert seconds is not None, line
        assert [float(x) for x in seconds.groups()] == [
            round(summary["setup_s"] + summary["wall_s"], 1), round(summary["setup_s"], 1), round(summary["wall_s"], 1)]
    assert len(rows) == 2


GOSSIP = """
[run]
name = "g"
algorithm = "gossip"
seed = 3
[data]
dataset = "synthetic"
num_nodes = 5
samples_per_node = 40
dim = 4
[gossip]
rounds = 3
batch = 8
lr = 0.2
epsilon = 1.0
fading = "none"
[topology]
kind = "ring"
"""


@pytest.mark.parametrize("algorithm", ["dp_pasgd", "gossip"])
def test_accuracy_against_cost_is_never_a_vertical_line(algorithm, small_config_text, tmp_path):
    """DP-PASGD spends cost units: the panel's x. Gossip has none (its cost units stay 0, every point
    on one vertical line): the bytes it sent are the x, on the watch page and in the run's figure."""
    from testbed.assembly.config import load_config_text
    from testbed.orchestration.runner import run_experiment
    from testbed.reports.cost_axis import cost_axis
    from testbed.watch.feed import RunFeed

    text = small_config_text if algorithm == "dp_pasgd" else GOSSIP + "[output]\nfigures = true\n"
    result = run_experiment(load_config_text(text), out_dir=tmp_path / "r", quiet=True)
    feed = RunFeed(result.run_dir)
    feed.poll()
    snap = feed.snapshot()
    axis = snap["run"]["cost_axis"]
    expected = "cost_units" if algorithm == "dp_pasgd" else "bytes_total"
    assert axis["key"] == expected and axis == cost_axis(snap["metrics"])
    xs = [m[expected] for m in snap["metrics"]]
    assert len(set(xs)) == len(xs) and xs == sorted(xs)  # a spread of x, one per round
    if algorithm == "gossip":
        assert all(m["cost_units"] == 0 for m in snap["metrics"])
        assert (result.run_dir / "figures" / "cost.png").is_file()


def test_a_run_spending_nothing_has_no_cost_panel_and_says_why():
    from testbed.reports.cost_axis import NONE, cost_axis

    assert cost_axis([{"round": 1, "cost_units": 0.0, "bytes_total": 0}]) is None
    assert "no cost units" in NONE and "no bytes" in NONE


def test_the_api_compares_as_testbed_compare_does(tmp_path, capsys):
    """testbed.compare and Sweep.compare read the same engine as `testbed compare`: the same JSON."""
    import json

    import testbed
    from testbed.cli import main

    sweep = testbed.sweep({"run": {"name": "t", "seed": 1},
                                                 "data": {"dataset": "synthetic", "num_nodes": 4, "samples_per_node": 80, "dim": 8},
                                                 "dp_pasgd": {"steps": 20, "tau": 5, "batch": 8, "lr": 0.5, "sigma": 1.0},
                                                 "privacy": {"tight_accountant": "none"}, "output": {"figures": False}},
                          grid={"dp_pasgd.tau": [2, 5]}, repeats=3, out=tmp_path / "s")
    capsys.readouterr()
    assert main(["compare", str(tmp_path / "s"), "--a", "tau=2", "--b", "tau=5", "--metric", "test_accuracy",
                 "--metric", "train_loss", "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)
    api = [c.as_dict() for c in sweep.compare({"tau": 2}, {"tau": 5}, metrics=["test_accuracy", "train_loss"])]
    assert json.loads(json.dumps(api)) == cli and len(cli) == 2
    again = testbed.compare(tmp_path / "s", {"dp_pasgd.tau": 2}, [{"dp_pasgd.tau": 5}], metrics=["test_accuracy", "train_loss"])
    assert [c.as_dict() for c in again] == api
    assert "run" in sweep.table.columns and sweep.run(sweep.table["run"][0]).summary["seed"] == 1
