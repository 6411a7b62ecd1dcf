"""`testbed runs` and `testbed report --json` read run directories from disk, which anything may have
written: every run under the folder is listed on one line (a damaged or missing summary as such,
with why), and nothing a run's files hold makes the listing fail or break its table."""

from __future__ import annotations

import json
import os
import shutil

import pytest
from hypothesis import given, strategies as st

from testbed.assembly.config import load_config_text
from testbed.cli import main
from testbed.orchestration.runner import run_experiment
from testbed.reports.summary_file import STATUSES, SUMMARY_KEYS, summary_digest
from testbed.reports.runs import format_runs, list_runs, runs_json


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """Two finished runs: one completed, one stopped by its ε budget."""
    text = """
[run]
name = "t"
seed = 1
[data]
num_nodes = 3
samples_per_node = 40
dim = 5
[dp_pasgd]
steps = 20
tau = 5
batch = 8
lr = 0.5
sigma = 1.0
clip = true           # G = 1 below the logistic model's own bound 2: held by clipping (issue 39)
lipschitz = 1.0
[output]
figures = false
"""
    root = tmp_path_factory.mktemp("finished")
    done = run_experiment(load_config_text(text), out_dir=root / "done", quiet=True)
    stopped = run_experiment(load_config_text(text + "[budget]\nepsilon = 4.0\n"), out_dir=root / "stopped", quiet=True)
    return done, stopped


@pytest.fixture
def lab(tmp_path, finished):
    """A folder of runs: the two finished ones (one inside a sweep's folder), a damaged summary,
    one with no summary (killed), one whose summary is not JSON, and folders that are not runs."""
    root = tmp_path / "runs"
    shutil.copytree(finished[0].run_dir, root / "done")
    shutil.copytree(finished[1].run_dir, root / "sweep" / "eps4")
    shutil.copytree(finished[0].run_dir, root / "tampered")
    summary = json.loads((root / "tampered" / "summary.json").read_text())
    summary["rounds"] = 99  # its sha256 no longer matches
    (root / "tampered" / "summary.json").write_text(json.dumps(summary))
    shutil.copytree(finished[0].run_dir, root / "killed")
    (root / "killed" / "summary.json").unlink()
    (root / "garbage").mkdir()
    (root / "garbage" / "summary.json").write_bytes(b"\xff\xfe not json")
    (root / "figures-only" / "figures").mkdir(parents=True)
    return root


def test_runs_lists_good_and_bad_runs_one_line_each(lab, capsys, finished):
    assert main(["runs", str(lab)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["name", "algorithm", "status", "rounds", "accuracy", "epsilon", "date"]
    by_name = {line.split()[0]: line for line in lines[1:]}
    assert set(by_name) == {"done", "sweep/eps4", "tampered", "killed", "garbage"}
    done = finished[0].summary
    assert by_name["done"].split()[1:5] == ["dp_pasgd", "completed", "4", f"{done['final']['test_accuracy']:.4f}"]
    assert f"{done['privacy']['headline']['value']:.4g}" in by_name["done"]  # the figure to quote
    assert "stopped_budget" in by_name["sweep/eps4"]
    assert "unverified" in by_name["tampered"] and "does not match its sha256" in by_name["tampered"]
    assert by_name["tampered"].split()[3:6] == ["-", "-", "-"]  # no figure of an unverified summary
    assert "damaged" in by_name["garbage"] and "summary.json: unreadable" in by_name["garbage"]
    assert "no summary (killed?)" in by_name["killed"] and by_name["killed"].split()[5] == "4"  # metrics.csv's rounds


def test_runs_json_has_the_same_runs(lab, capsys, finished):
    assert main(["runs", str(lab), "--json"]) == 0
    runs = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert set(runs) == {"done", "sweep/eps4", "tampered", "killed", "garbage"}
    done = finished[0].summary
    assert runs["done"] == {"name": "done", "path": str(lab / "done"), "algorithm": "dp_pasgd", "status": "completed",
                            "rounds": 4, "final_accuracy": done["final"]["test_accuracy"],
                            "epsilon": done["privacy"]["headline"]["value"], "date": runs["done"]["date"],
                            "problem": None, "epsilon_unit": None}
    assert runs["tampered"]["status"] == "unverified" and "sha256" in runs["tampered"]["problem"]
    assert runs["tampered"]["rounds"] is None and runs["tampered"]["final_accuracy"] is None
    assert runs["killed"]["rounds"] == 4 and runs["killed"]["problem"] is None


def test_runs_of_a_missing_folder_is_one_line(tmp_path, capsys):
    assert main(["runs", str(tmp_path / "none")]) == 2
    assert capsys.readouterr().err.strip() == f"testbed: {tmp_path / 'none'}: not a folder of runs"


def test_runs_of_a_run_directory_lists_that_run(finished, capsys):
    assert main(["runs", str(finished[0].run_dir)]) == 0
    assert capsys.readouterr().out.splitlines()[1].split()[:3] == ["done", "dp_pasgd", "completed"]


def test_a_running_runs_lock_says_running(lab, capsys):
    (lab / "killed" / ".lock").write_text(f"{os.getpid()}\n")  # a live process holds it
    assert main(["runs", str(lab)]) == 0
    assert f"running (pid {os.getpid()})" in capsys.readouterr().out


def test_report_json_prints_the_checked_summary(finished, capsys):
    assert main(["report", str(finished[0].run_dir), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads((finished[0].run_dir / "summary.json").read_text())
    assert not (finished[0].run_dir / "figures").exists()  # --json draws nothing


@pytest.mark.parametrize("damage, word", [(b"{", "damaged"), (b'{"sha256": "0"}', "unverified"), (b"[]", "damaged"),
                                         (b'{"rounds": 3}', "unverified")])
def test_report_json_of_a_damaged_summary_is_one_line(tmp_path, capsys, damage, word):
    (tmp_path / "summary.json").write_bytes(damage)
    assert main(["report", str(tmp_path), "--json"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"testbed: {tmp_path / 'summary.json'}: {word}")


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12)
names = st.text(st.characters(blacklist_characters="/\0", blacklist_categories=("Cs",)), min_size=1, max_size=12).filter(
    lambda n: n not in (".", "..") and not n.startswith(".") and len(n.encode()) < 200)


@given(fields=st.dictionaries(st.sampled_from([*SUMMARY_KEYS, "privacy", "name"]), json_values),
       signed=st.booleans(), name=names)
def test_any_summary_lists_on_one_line(tmp_path_factory, fields, signed, name):
    """Whatever a summary holds (any types where numbers belong, ∞ and NaN, a name with line breaks
    or escapes): one line in the table, valid JSON in --json, never an exception."""
    root = tmp_path_factory.mktemp("any")
    run_dir = root / name
    run_dir.mkdir()
    body = dict(fields)
    if signed:
        body["sha256"] = summary_digest(body)
    (run_dir / "summary.json").write_text(json.dumps(body))
    runs = list_runs(root)
    assert len(runs) == 1
    table = format_runs(runs).splitlines()
    assert len(table) == 2 and all(c.isprintable() for c in table[1])
    listed = json.loads(runs_json(runs))[0]
    if not signed:  # no sha256: unverified, and none of its figures is listed
        assert listed["status"] == "unverified" and "no sha256" in listed["problem"]
        assert listed["rounds"] is None and listed["final_accuracy"] is None and listed["epsilon"] is None
        return
    if not set(SUMMARY_KEYS) <= set(fields):
        assert listed["status"] == "damaged"
    if listed["status"] != "damaged":  # read: of the types and ranges a run writes
        assert listed["status"] in STATUSES and listed["problem"] is None
        assert listed["final_accuracy"] is None or 0.0 <= listed["final_accuracy"] <= 1.0
    assert listed["rounds"] is None or (isinstance(listed["rounds"], int) and listed["rounds"] >= 0)
    assert listed["epsilon"] is None or listed["epsilon"] == "inf" or isinstance(listed["epsilon"], float)


@given(blob=st.binary(max_size=200))
def test_any_bytes_as_a_summary_list_as_damaged(tmp_path_factory, blob):
    root = tmp_path_factory.mktemp("bytes")
    (root / "r").mkdir()
    (root / "r" / "summary.json").write_bytes(blob)
    [run] = list_runs(root)
    assert run.status == "damaged" and "\n" not in run.problem
