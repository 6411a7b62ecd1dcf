"""The Python API (testbed.api): one experiment spelled as a file, a dict or a config is one config;
runs read back with integer counts; a run directory is replaced only when asked and never under a
run still writing it; sweeps read back as tables; pandas is optional; ``import testbed`` stays light."""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

import testbed
from testbed.assembly.config import load_config, load_config_text, to_toml
from testbed.errors import ConfigError, UserError
from testbed.ledger.files import read_ledger
from testbed.reports.results import INTEGER_METRICS, RunDirectory, read_metrics
from testbed.util.dirlock import DirectoryLock

from conftest import REPO

#: A run of about half a second: 4 synthetic nodes, 4 rounds, no figures, no tight accountant.
TINY = {
    "run": {"name": "tiny", "seed": 1},
    "data": {"dataset": "synthetic", "num_nodes": 4, "samples_per_node": 80, "dim": 8},
    "dp_pasgd": {"steps": 20, "tau": 5, "batch": 8, "lr": 0.5, "sigma": 1.0, "clip": True, "lipschitz": 1.0},
    "privacy": {"tight_accountant": "none"},
    "output": {"figures": False},
}
TINY_TOML = """
[run]
name = "tiny"
seed = 1
[data]
dataset = "synthetic"
num_nodes = 4
samples_per_node = 80
dim = 8
[dp_pasgd]
steps = 20
tau = 5
batch = 8
lr = 0.5
sigma = 1.0
clip = true           # G = 1 below the logistic model's own bound 2: held by clipping (issue 39)
lipschitz = 1.0
[privacy]
tight_accountant = "none"
[output]
figures = false
"""


@pytest.fixture
def tiny_file(tmp_path) -> Path:
    path = tmp_path / "tiny.toml"
    path.write_text(TINY_TOML)
    return path


def _same_run(a: testbed.Run, b: testbed.Run) -> None:
    """The same numbers (a run is deterministic given its config and seed; wall time aside)."""
    assert a.metrics.drop(columns="wall_s").equals(b.metrics.drop(columns="wall_s"))
    assert a.ledger.drop(columns=["compute_s", "energy_j"]).equals(b.ledger.drop(columns=["compute_s", "energy_j"]))


def test_a_file_a_dict_and_a_config_run_the_same_experiment(tiny_file, tmp_path):
    from_file = testbed.run(tiny_file, overrides={"dp_pasgd.tau": 4}, seed=2, out=tmp_path / "file")
    from_dict = testbed.run(TINY, overrides=["dp_pasgd.tau=4"], seed=2, out=tmp_path / "dict")
    from_config = testbed.run(load_config_text(TINY_TOML), overrides={"dp_pasgd.tau": 4}, seed=2,
                              out=tmp_path / "config")
    for run in (from_file, from_dict, from_config):
        assert run.summary["seed"] == 2 and run.summary["rounds"] == 5 and run.summary["status"] == "completed"
        assert run.dir.is_dir() and (run.dir / "summary.json").exists()
    _same_run(from_file, from_dict)
    _same_run(from_file, from_config)
    assert TINY["dp_pasgd"]["tau"] == 5  # the caller's dict is not changed


def test_metrics_and_ledger_have_integer_counts(tmp_path):
    run = testbed.run(TINY, out=tmp_path / "r")
    metrics = run.metrics
    assert metrics["round"].tolist() == [1, 2, 3, 4]
    assert all(str(metrics[c].dtype) == "int64" for c in INTEGER_METRICS)
    assert metrics["local_steps"].tolist() == [5, 10, 15, 20]
    ledger = run.ledger
    events = list(read_ledger(run.dir / "ledger.csv"))
    assert len(ledger) == len(events) == 4 * 4 * 3  # compute, communication, privacy per node and round
    assert str(ledger["round"].dtype) == "int64" and str(ledger["node"].dtype) == "int64"
    assert ledger["kind"].tolist() == [e.kind for e in events]
    compute = ledger[ledger["kind"] == "compute"]
    assert compute["local_steps"].tolist() == [e.local_steps for e in events if e.kind == "compute"]
    assert ledger[ledger["kind"] == "privacy"]["local_steps"].isna().all()  # another kind's field: missing


def test_mode_and_the_default_out(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    run = testbed.run(TINY, mode="sim", overrides={"output.dir": "elsewhere"})
    assert run.summary["mode"] == "sim"
    assert run.dir.parent == Path("elsewhere") and run.dir.name.startswith("tiny-") and run.dir.name.endswith("-s1")
    with pytest.raises(ConfigError, match="run.mode"):
        testbed.run(TINY, mode="radio", out=tmp_path / "x")


@pytest.mark.parametrize("overrides", ["dp_pasgd.tau=4", [("dp_pasgd.tau", 4)], 7])
def test_overrides_of_another_form_are_one_line(overrides, tmp_path):
    with pytest.raises(UserError, match=r"^overrides: a dict") as err:
        testbed.run(TINY, overrides=overrides, out=tmp_path / "r")
    assert "\n" not in str(err.value)
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("key", ["tau", "dp_pasgd.tau.x", ".tau", 3])
def test_an_override_key_that_is_not_section_key_is_named(key, tmp_path):
    with pytest.raises(ConfigError, match="an override key is section.key"):
        testbed.run(TINY, overrides={key: 4}, out=tmp_path / "r")


def test_an_experiment_of_another_type_is_one_line():
    with pytest.raises(UserError, match=r"^an experiment is a file's path, a dict of its tables or a config, got int$"):
        testbed.run(3)


# ---- overwrite ----------------------------------------------------------------------------------


def test_a_rerun_into_a_run_directory_is_refused_naming_the_option(tmp_path):
    first = testbed.run(TINY, out=tmp_path / "r")
    before = {p.name: p.read_bytes() for p in first.dir.iterdir() if p.is_file()}
    with pytest.raises(UserError) as err:
        testbed.run(TINY, seed=5, out=tmp_path / "r")
    assert str(err.value) == f"{tmp_path / 'r'} already holds a run; pass overwrite=True to replace it, or another out"
    assert {p.name: p.read_bytes() for p in first.dir.iterdir() if p.is_file()} == before  # untouched


@pytest.mark.parametrize("left", ["finished", "killed"])
def test_overwrite_replaces_a_run_that_is_not_running(left, tmp_path):
    out = tmp_path / "r"
    testbed.run(TINY, out=out)
    (out / "figures").mkdir()
    (out / "figures" / "old.png").write_bytes(b"old")
    if left == "killed":  # a kill before the summary: metrics and ledger only
        (out / "summary.json").unlink()
    again = testbed.run(TINY, seed=5, out=out, overwrite=True)
    assert again.summary["seed"] == 5 and again.dir == out
    assert not (out / "figures").exists()  # nothing of the old run is left
    assert read_metrics(out)[-1]["round"] == 4 and len(read_metrics(out)) == 4


def _hold_lock(directory: str, locked, release) -> None:
    with DirectoryLock(Path(directory)):
        locked.set()
        release.wait(30)


@pytest.mark.parametrize("holder", ["this process", "another process"])
def test_overwrite_refuses_a_directory_that_a_run_is_writing(holder, tmp_path):
    out = tmp_path / "r"
    testbed.run(TINY, out=out)
    before = sorted(p.name for p in out.iterdir())
    if holder == "this process":
        lock = DirectoryLock(out)
        pid, stop = str(os.getpid()), lock.release
    else:
        context = multiprocessing.get_context("spawn")
        locked, release = context.Event(), context.Event()
        child = context.Process(target=_hold_lock, args=(str(out), locked, release))
        child.start()
        assert locked.wait(30)
        pid = str(child.pid)

        def stop() -> None:
            release.set()
            child.join(30)
    try:
        with pytest.raises(UserError, match=rf"is being written by another process \(pid {pid}\)"):
            testbed.run(TINY, seed=5, out=out, overwrite=True)
    finally:
        stop()
    assert sorted(p.name for p in out.iterdir()) == before
    assert testbed.load(out).summary["seed"] == 1  # the old run, whole


def test_out_that_holds_no_run_is_used_as_it_is(tmp_path):
    out = tmp_path / "r"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    run = testbed.run(TINY, out=out, overwrite=True)
    assert (out / "notes.txt").read_text() == "mine" and run.summary["status"] == "completed"


# ---- load ---------------------------------------------------------------------------------------


def test_load_reads_back_what_run_returned(tmp_path):
    run = testbed.run(TINY, out=tmp_path / "r")
    loaded = testbed.load(str(tmp_path / "r"))
    assert loaded.summary == run.summary and loaded.dir == run.dir
    assert loaded.metrics.equals(run.metrics) and loaded.ledger.equals(run.ledger)
    assert repr(loaded) == f"Run({str(tmp_path / 'r')!r}: dp_pasgd, completed, 4 rounds)"


@pytest.mark.parametrize("damage", ["no summary", "edited summary"])
def test_load_of_a_directory_without_a_sound_summary_is_one_line(damage, tmp_path):
    run = testbed.run(TINY, out=tmp_path / "r")
    path = run.dir / "summary.json"
    if damage == "no summary":
        path.unlink()
        expected = "has no summary.json"
    else:
        body = json.loads(path.read_text())
        body["status"] = "completed" if body["status"] != "completed" else "failed"
        path.write_text(json.dumps(body))
        expected = "does not match its sha256"
    with pytest.raises(UserError, match=expected) as err:
        testbed.load(run.dir)
    assert "\n" not in str(err.value)


def test_a_damaged_ledger_is_one_line_naming_it(tmp_path):
    run = testbed.run(TINY, out=tmp_path / "r")
    with open(run.dir / "ledger.csv", "a") as f:
        f.write("compute,0,not-a-round\n")
    with pytest.raises(UserError, match=r"ledger\.csv: line 50") as err:
        testbed.load(run.dir).ledger
    assert "\n" not in str(err.value)


# ---- sweeps -------------------------------------------------------------------------------------


def test_sweep_table_and_stats(tmp_path, tiny_file):
    sweep = testbed.sweep(tiny_file, grid={"dp_pasgd.tau": [2, 5]}, repeats=2, out=tmp_path / "s",
                          overrides={"dp_pasgd.lr": 0.3}, workers=2)
    table = sweep.table
    assert len(table) == 4 and table["seed"].tolist() == [1, 2, 1, 2]
    assert table["dp_pasgd.tau"].tolist() == [2, 2, 5, 5] and table["rounds"].tolist() == [10, 10, 4, 4]
    assert str(table["seed"].dtype) == "int64" and str(table["rounds"].dtype) == "int64"
    assert set(table["status"]) == {"completed"}
    stats = sweep.stats
    assert stats["dp_pasgd.tau"].tolist() == [2, 5] and stats["n"].tolist() == [2, 2]
    for tau, group in table.groupby("dp_pasgd.tau"):
        row = stats[stats["dp_pasgd.tau"] == tau].iloc[0]
        assert row["test_accuracy_mean"] == pytest.approx(group["test_accuracy"].mean())
        assert math.isnan(row["test_accuracy_bca_low"])  # BCa needs three runs: missing, as NaN
    one = sweep.run(table["run"][0])
    assert one.summary["seed"] == 1 and load_config(one.dir / "config.toml").dp_pasgd.lr == 0.3
    with pytest.raises(UserError, match="no run 'nope'"):
        sweep.run("nope")
    again = testbed.Sweep(tmp_path / "s")
    assert again.table.equals(table) and again.stats.equals(stats)


def test_a_sweep_without_repeats_has_no_stats(tmp_path):
    sweep = testbed.sweep(TINY, grid={"dp_pasgd.lr": [0.1, 0.5]}, out=tmp_path / "s")
    assert len(sweep.table) == 2 and sweep.stats is None
    assert repr(sweep) == f"Sweep({str(tmp_path / 's')!r}: 2 runs)"


@pytest.mark.parametrize("grid,message", [
    ({}, "grid: a dict"),
    ({"dp_pasgd.tau": 5}, "grid dp_pasgd.tau: a non-empty list of values, got 5"),
    ({"dp_pasgd.tau": "25"}, "grid dp_pasgd.tau: a non-empty list"),
    ({"dp_pasgd.tau": []}, "grid dp_pasgd.tau: a non-empty list"),
    ({"tau": [1, 2]}, "an override key is section.key"),
    ({"dp_pasgd.tau": [1, 0]}, "dp_pasgd.tau: must be > 0"),
])
def test_a_bad_grid_is_one_line_before_any_run(grid, message, tmp_path):
    with pytest.raises(UserError, match=message) as err:
        testbed.sweep(TINY, grid=grid, out=tmp_path / "s")
    assert "\n" not in str(err.value)
    assert not list(tmp_path.glob("s/*/metrics.csv"))


@pytest.mark.parametrize("repeats,message", [(0, r"^repeats must be >= 1, got 0$"),
                                             (2**63, r"^repeats 9223372036854775808: seeds from run.seed 1 would pass")])
def test_repeats_out_of_range_are_refused_in_the_apis_words(repeats, message, tmp_path):
    with pytest.raises(UserError, match=message):
        testbed.sweep(TINY, grid={"dp_pasgd.tau": [2]}, repeats=repeats, out=tmp_path / "s")


# ---- pandas is optional -------------------------------------------------------------------------


@pytest.mark.parametrize("table", ["Run.metrics", "Run.ledger", "Sweep.table"])
def test_without_pandas_a_table_is_one_line_naming_the_extra(table, tmp_path, monkeypatch):
    run = testbed.run(TINY, out=tmp_path / "r")
    sweep = testbed.sweep(TINY, grid={"dp_pasgd.tau": [5]}, out=tmp_path / "s")
    monkeypatch.setitem(sys.modules, "pandas", None)  # as if it were not installed: import fails
    owner = sweep if table.startswith("Sweep") else testbed.load(run.dir)
    with pytest.raises(UserError) as err:
        getattr(owner, table.split(".")[1])
    assert str(err.value) == f"{table} needs pandas, which is not installed: pip install 'dpfl-testbed[analysis]'"
    assert testbed.load(run.dir).summary["status"] == "completed"  # the summary needs no pandas


def test_import_testbed_imports_no_api_pandas_or_pydantic():
    probe = ("import sys, testbed\n"
             "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pandas', 'pydantic', 'numpy')"
             " or m.startswith(('testbed.api', 'testbed.orchestration'))))\n"
             "print(testbed.run.__module__, testbed.Sweep.__name__, 'load' in dir(testbed))\n")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.splitlines() == ["[]", "testbed.api Sweep True"]
    with pytest.raises(AttributeError, match="has no attribute 'nothing'"):
        testbed.nothing  # noqa: B018


# ---- properties ---------------------------------------------------------------------------------

_values = st.fixed_dictionaries({
    "dp_pasgd.tau": st.sampled_from([1, 2, 4, 5, 10, 20]),  # divides dp_pasgd.steps = 20
    "dp_pasgd.lr": st.floats(1e-3, 10.0, allow_nan=False),
    "data.num_nodes": st.integers(1, 64),
    "run.name": st.from_regex(r"[a-z][a-z0-9_-]{0,15}", fullmatch=True),
})


@given(values=_values, seed=st.integers(0, 2**63 - 1), mode=st.sampled_from(["sim", "mqtt"]))
def test_one_experiment_in_three_spellings_is_one_config(values, seed, mode):
    """A file with --set strings, a dict with a dict of overrides and a config with them give the
    same config (its TOML), with mode and seed applied last."""
    from testbed.assembly.experiment import experiment_config

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "e.toml"
        path.write_text(TINY_TOML)
        strings = [f"{k}={json.dumps(v)}" for k, v in values.items()]
        expected = load_config(path, [*strings, f"run.mode={json.dumps(mode)}", f"run.seed={seed}"])
        for spelled in (experiment_config(path, strings, mode=mode, seed=seed),
                        experiment_config(TINY, values, mode=mode, seed=seed),
                        experiment_config(load_config_text(TINY_TOML), values, mode=mode, seed=seed),
                        experiment_config(TINY, {**values, "run.mode": "sim" if mode == "mqtt" else "mqtt",
                                                 "run.seed": 0}, mode=mode, seed=seed)):
            assert to_toml(spelled) == to_toml(expected)
            assert spelled.run.seed == seed and spelled.run.mode == mode


_metric_rows = st.lists(st.fixed_dictionaries({
    "round": st.integers(0, 10**6), "local_steps": st.integers(0, 10**9),
    "train_loss": st.floats(allow_nan=False, allow_infinity=False, width=64), "test_accuracy": st.floats(0, 1),
    "cost_units": st.floats(0, 1e12), "epsilon": st.floats(0, 1e6), "bytes_total": st.integers(0, 2**62),
    "stragglers": st.integers(0, 10**6), "wall_s": st.floats(0, 1e6)}), min_size=1, max_size=5)


@given(rows=_metric_rows)
def test_metrics_read_back_with_integer_counts_and_the_same_values(rows):
    """Whatever rounds a run writes, metrics.csv reads back the same numbers, the counts as ints
    (never 3.0, however large: a float would round 2**62 + 1)."""
    with tempfile.TemporaryDirectory() as folder:
        directory = RunDirectory(Path(folder) / "r", sync=False)
        for row in rows:
            directory.append_metrics(row)
        directory.close()
        back = read_metrics(Path(folder) / "r")
    assert back == rows
    assert all(type(r[c]) is int for r in back for c in INTEGER_METRICS)


@pytest.mark.parametrize("cell", ["3.0", "1e3", "x", "3.5"])
def test_a_count_that_is_not_an_integer_is_a_damaged_metrics_file(cell, tmp_path):
    run = testbed.run(TINY, out=tmp_path / "r")
    path = run.dir / "metrics.csv"
    lines = path.read_text().splitlines(keepends=True)
    lines[2] = cell + lines[2][lines[2].index(","):]
    path.write_text("".join(lines))
    with pytest.raises(UserError, match=r"metrics\.csv: unverified"):  # not the file its summary covers
        testbed.load(run.dir).metrics
    from testbed.reports.results import read_metrics

    (run.dir / "summary.json").unlink()  # a killed run's metrics: nothing to check against, but its cells
    with pytest.raises(UserError, match=r"metrics\.csv: damaged") as err:
        read_metrics(run.dir)
    assert "\n" not in str(err.value)


def test_the_ledger_frame_holds_every_field_of_every_event(tmp_path):
    """Every event's fields are its row's cells (another kind's missing), in the file's order."""
    run = testbed.run(TINY, out=tmp_path / "r", overrides={"stragglers.model": "bernoulli", "stragglers.p": 0.3})
    pd = pytest.importorskip("pandas")
    frame = run.ledger
    events = list(read_ledger(run.dir / "ledger.csv"))
    assert "straggle" in set(frame["kind"]) and len(frame) == len(events)
    for row, event in zip(frame.to_dict("records"), events):
        fields = {k: v for k, v in vars(event).items()}
        assert {k: row[k] for k in fields} == fields
        assert all(pd.isna(row[k]) for k in row if k not in fields and k != "kind")


def _write_csv(path: Path, rows: list[list[str]]) -> None:
    import csv

    with open(path, "w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows(rows)


@given(cell=st.one_of(st.text(max_size=25), st.integers(0, 10**25).map(str)),
       table=st.sampled_from(["sweep.csv", "sweep_stats.csv"]))
def test_a_seed_or_count_cell_is_an_integer_or_the_table_is_refused_in_one_line(cell, table):
    """sweep.csv's seed and sweep_stats.csv's n: ASCII digits (not "²", which str.isdigit takes),
    read as ints; anything else is one line naming the file, never a traceback."""
    import re

    with tempfile.TemporaryDirectory() as folder:
        runs = [["dp_pasgd.tau", "seed", "status", "test_accuracy", "run"], ["5", "0", "completed", "0.5", "tau-5_seed-0"]]
        stats = [["dp_pasgd.tau", "n", "test_accuracy_mean"], ["5", "2", "0.5"]]
        (runs if table == "sweep.csv" else stats)[1][1] = cell
        _write_csv(Path(folder) / "sweep.csv", runs)
        _write_csv(Path(folder) / "sweep_stats.csv", stats)
        if re.fullmatch(r"[0-9]{1,20}", cell):
            sweep = testbed.Sweep(folder)
            if table == "sweep.csv":
                assert sweep.table["seed"][0] == int(cell)
            elif int(cell) > 1:
                assert sweep.stats["n"][0] == int(cell)
            else:  # no grid point of more than one run
                assert sweep.stats is None
        else:
            with pytest.raises(UserError, match=rf"{table}: damaged") as err:
                testbed.Sweep(folder).stats
            assert "\n" not in str(err.value)


def test_a_dict_of_read_only_tables_is_an_experiment_and_a_table_that_is_not_is_named(tmp_path):
    from types import MappingProxyType

    from testbed.assembly.experiment import experiment_config

    frozen = MappingProxyType({name: MappingProxyType(table) for name, table in TINY.items()})
    assert to_toml(experiment_config(frozen)) == to_toml(experiment_config(TINY))
    with pytest.raises(ConfigError, match=r"^config error: data: must be a table \(\[data\]\)$"):
        experiment_config({**TINY, "data": 3})
    with pytest.raises(ConfigError, match=r"^config error: mqtt.run_id: must match"):
        experiment_config({**TINY, "mqtt": {"run_id": "a/b"}})
