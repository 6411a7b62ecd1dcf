"""Run files as someone who edits them would: a summary.json with its sha256 removed (or not
matching) is "unverified" and none of its figures is trusted (`testbed report --json` refuses it
in one line, `testbed runs` lists it without figures); a summary whose digest matches but whose
fields are impossible is damaged; JSON the testbed prints is always valid JSON (no NaN, no
Infinity), checked with a strict parser and by a grep of the sources; `testbed compare` refuses
impossible metric values and runs that did not finish, one line each."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from testbed.assembly.config import load_config_text
from testbed.cli import main
from testbed.orchestration.runner import run_experiment
from testbed.reports.summary_file import SUMMARY_KEYS, read_summary, summary_digest

from conftest import REPO
from test_compare import write_sweep

TEXT = """
[run]
name = "summaries"
algorithm = "dp_pasgd"
seed = 3
[data]
dataset = "synthetic"
num_nodes = 3
samples_per_node = 20
dim = 4
[dp_pasgd]
steps = 4
tau = 2
batch = 4
lr = 0.5
sigma = 1.0
lipschitz = 1.0
clip = true
[privacy]
tight_accountant = "none"
[output]
figures = false
"""


def strict_loads(text: str):
    """JSON as RFC 8259 has it: NaN, Infinity and -Infinity are not JSON."""
    def refuse(constant: str):
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return run_experiment(load_config_text(TEXT), out_dir=tmp_path_factory.mktemp("s") / "run", quiet=True).run_dir


def _copy(run_dir: Path, tmp_path: Path, body: dict | None = None, sign: bool = False) -> Path:
    import shutil

    target = tmp_path / "r"
    shutil.copytree(run_dir, target)
    if body is not None:
        if sign:
            body = {k: v for k, v in body.items() if k != "sha256"}
            body["sha256"] = summary_digest(body)
        (target / "summary.json").write_text(json.dumps(body))  # NaN and Infinity as Python writes them
    return target


def _one_line(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and err.startswith("testbed: "), err
    return err


def test_the_issues_unsigned_summary_is_refused_and_listed_unverified(run_dir, tmp_path, capsys):
    """sha256 removed, NaN, Infinity, "rounds": "many", accuracy -7.5: once printed by report --json, exit 0."""
    body = json.loads((run_dir / "summary.json").read_text())
    del body["sha256"]
    body.update(rounds="many", wall_s=float("nan"))
    body["final"]["test_accuracy"] = -7.5
    body["privacy"]["headline"]["value"] = float("inf")
    forged = _copy(run_dir, tmp_path, body)
    err = _one_line(capsys, ["report", str(forged), "--json"])
    assert "unverified" in err and "no sha256" in err
    assert main(["runs", str(tmp_path)]) == 0
    line = capsys.readouterr().out.splitlines()[1]
    assert line.split()[:6] == ["r", "-", "unverified", "-", "-", "-"]  # no algorithm, rounds, accuracy, ε
    assert main(["runs", str(tmp_path), "--json"]) == 0
    listed = strict_loads(capsys.readouterr().out)[0]
    assert listed["status"] == "unverified" and listed["rounds"] is listed["final_accuracy"] is listed["epsilon"] is None


@pytest.mark.parametrize("change, words", [
    (lambda b: b["final"].update(test_accuracy=-7.5), "final.test_accuracy must be in [0, 1]"),
    (lambda b: b["final"].update(test_accuracy=1.5), "final.test_accuracy must be in [0, 1]"),
    (lambda b: b["final"].update(train_loss="low"), "final.train_loss must be a finite number"),
    (lambda b: b.update(rounds="many"), "rounds must be a count"),
    (lambda b: b.update(rounds=-1), "rounds must be a count"),
    (lambda b: b.update(seed=True), "seed must be a count"),
    (lambda b: b.update(status="great"), "status must be one of"),
    (lambda b: b.update(nodes=[]), "nodes must be an object"),
])
def test_a_signed_summary_of_impossible_figures_is_damaged(run_dir, tmp_path, capsys, change, words):
    """A digest anyone can recompute is no proof: what it covers is still checked."""
    body = json.loads((run_dir / "summary.json").read_text())
    change(body)
    err = _one_line(capsys, ["report", str(_copy(run_dir, tmp_path, body, sign=True)), "--json"])
    assert "damaged" in err and words in err


def test_a_diverged_runs_summary_prints_as_valid_json(run_dir, tmp_path, capsys):
    """A NaN loss (a summary of an older testbed wrote it as NaN under its digest): null in --json."""
    body = json.loads((run_dir / "summary.json").read_text())
    body["final"]["train_loss"] = float("nan")
    signed = _copy(run_dir, tmp_path, body, sign=True)
    assert main(["report", str(signed), "--json"]) == 0
    assert strict_loads(capsys.readouterr().out)["final"]["train_loss"] is None


def test_a_summary_written_with_a_nan_is_valid_json_and_verifies(tmp_path):
    from testbed.reports.results import RunDirectory

    directory = RunDirectory(tmp_path / "w", sync=False)
    summary = {k: None for k in SUMMARY_KEYS}
    summary.update(algorithm="fedavg", mode="sim", seed=0, status="completed", rounds=1, nodes={}, budgets={},
                   final={"train_loss": float("nan"), "test_accuracy": 0.5})
    directory.write_summary(summary)
    directory.close()
    text = (tmp_path / "w" / "summary.json").read_text()
    assert strict_loads(text)["final"]["train_loss"] is None
    assert read_summary(tmp_path / "w")["final"] == {"train_loss": None, "test_accuracy": 0.5}


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.sampled_from([10**400, -10**400]) | st.floats()
    | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=10)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fields=st.fixed_dictionaries({}, optional={k: json_values for k in (*SUMMARY_KEYS, "privacy")}),
       final=st.dictionaries(st.sampled_from(["test_accuracy", "train_loss", "validation_accuracy"]),
                             st.none() | st.floats() | st.integers(-5, 5) | st.just(10**400) | st.text(max_size=3)),
       signed=st.booleans())
def test_report_json_of_any_summary_is_valid_json_or_one_line(run_dir, tmp_path_factory, capsys, fields, final, signed):
    body = json.loads((run_dir / "summary.json").read_text())
    body.update(fields)
    if isinstance(body.get("final"), dict):
        body["final"].update(final)
    target = tmp_path_factory.mktemp("any")
    if signed:
        body = {k: v for k, v in body.items() if k != "sha256"}
        body["sha256"] = summary_digest(body)
    else:
        body.pop("sha256", None)
    (target / "summary.json").write_text(json.dumps(body))
    code = main(["report", str(target), "--json"])
    out, err = capsys.readouterr()
    if code == 0:
        printed = strict_loads(out)
        assert signed
        for key in ("test_accuracy", "validation_accuracy"):
            value = printed["final"].get(key)
            assert value is None or 0.0 <= value <= 1.0
        assert isinstance(printed["rounds"], int) and printed["rounds"] >= 0
    else:
        assert code == 2 and err.count("\n") == 1 and "Traceback" not in err and out == ""


# ---------------------------------------------------------------- compare


def _edit_cell(folder: Path, run: str, column: str, value: str) -> None:
    with open(folder / "sweep.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    for row in rows:
        if row["run"] == run:
            row[column] = value
    with open(folder / "sweep.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


@pytest.mark.parametrize("status", ["failed", "", "running", "completed "])
def test_compare_refuses_a_run_that_did_not_finish(tmp_path, capsys, status):
    folder = write_sweep(tmp_path / "s")
    _edit_cell(folder, "tau-5_lr-0.1_seed-2", "status", status)
    err = _one_line(capsys, ["compare", str(folder), "--a", "tau=1", "--b", "tau=5"])
    assert "run tau-5_lr-0.1_seed-2 did not finish" in err


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(metric=st.sampled_from(["test_accuracy", "train_loss", "epsilon_max", "energy_j_max", "sigma"]),
       cell=st.floats(allow_nan=True, allow_infinity=True).map(repr) | st.text(max_size=6) | st.integers(-10, 10).map(str))
def test_compare_gives_a_verdict_only_on_possible_values(tmp_path_factory, capsys, metric, cell):
    folder = write_sweep(tmp_path_factory.mktemp("c") / "s")
    _edit_cell(folder, "tau-1_lr-0.1_seed-1", metric, cell)
    code = main(["compare", str(folder), "--a", "tau=1", "--b", "tau=5", "--metric", metric, "--higher-is-better",
                 "--json"])
    out, err = capsys.readouterr()
    try:
        x = float(cell)
    except ValueError:
        x = None
    high = 1.0 if metric == "test_accuracy" else 1e15
    possible = x is not None and 0.0 <= x <= high
    if code == 0:
        assert possible and strict_loads(out)[0]["verdict"]
    else:
        assert code == 2 and err.count("\n") == 1 and "Traceback" not in err and f"run tau-1_lr-0.1_seed-1" in err
        assert not possible


# ---------------------------------------------------------------- every JSON the testbed prints or writes

_DUMPS = re.compile(r"\bjson\.dumps?\(")


def test_every_json_dump_refuses_nan():
    """Every json.dump(s) in the sources goes through testbed.util.jsontext or says allow_nan=False;
    the few that may not (a digest, a pipe between our own processes) say why with "json-ok"."""
    offenders = []
    for package in ("testbed", "nodes", "firmware_bridge", "channel", "benchmarks", "experiments", "tools"):
        for path in sorted((REPO / package).rglob("*.py")):
            if path.name == "jsontext.py":
                continue
            lines = path.read_text().splitlines()
            for i, line in enumerate(lines):
                if not _DUMPS.search(line):
                    continue
                call = " ".join(lines[i:i + 3])  # a call's arguments may run on
                if "allow_nan=False" in call or "json-ok" in line or (i and "json-ok" in lines[i - 1]):
                    continue
                offenders.append(f"{path.relative_to(REPO)}:{i + 1}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


# ---------------------------------------------------------------- metrics.csv under the summary's digest


@pytest.mark.parametrize("edit", [
    lambda text: text[:-30] + text[-30:].replace("0", "9", 1),  # a figure of the last round changed
    lambda text: text + text.splitlines(keepends=True)[-1],  # a round appended
    lambda text: "".join(text.splitlines(keepends=True)[:-1]),  # the last round dropped
])
def test_a_finished_runs_edited_metrics_are_unverified(run_dir, tmp_path, capsys, edit):
    """The summary records metrics.csv's mark under its sha256: `testbed report` draws no figure
    from another file, and the Python API reads none."""
    import testbed

    copy = _copy(run_dir, tmp_path)
    path = copy / "metrics.csv"
    path.write_text(edit(path.read_text()))
    err = _one_line(capsys, ["report", str(copy)])
    assert "metrics.csv: unverified" in err
    assert not (copy / "figures").exists()
    with pytest.raises(Exception, match="unverified"):
        testbed.load(copy).metrics


def test_the_summary_records_its_metrics_mark(run_dir):
    summary = read_summary(run_dir)
    mark = summary["files"]["metrics.csv"]
    data = (run_dir / "metrics.csv").read_bytes()
    import hashlib

    assert mark["size_bytes"] == len(data) and mark["sha256"] == hashlib.sha256(data).hexdigest()
    assert mark["rows"] == summary["rounds"]
