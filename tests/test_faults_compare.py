"""Bad input to `testbed compare` (and to the sweep table it reads): one line on stderr, exit 2, no
traceback, whatever is wrong; the function raises the same UserError."""

import pytest

from test_compare import write_sweep
from testbed.cli import main
from testbed.errors import UserError
from testbed.reports.compare import compare


def _refused(capsys, argv, match):
    assert main(["compare", *argv]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("testbed: ") and "Traceback" not in captured.err, captured.err
    assert match in lines[0], lines[0]
    assert captured.out == ""


@pytest.mark.parametrize("a, b, match", [
    (["nokey=1"], ["tau=5"], "--a nokey is not a grid key; the sweep's grid keys: dp_pasgd.tau, dp_pasgd.lr"),
    (["tau=1"], ["dp_pasgd.epsilon=2"], "--b dp_pasgd.epsilon is not a grid key"),
])
def test_unknown_key(tmp_path, capsys, a, b, match):
    _refused(capsys, [str(write_sweep(tmp_path / "s")), "--a", *a, "--b", *b], match)


@pytest.mark.parametrize("a, b, match", [
    (["tau=3"], ["tau=5"], "no run of this sweep has --a dp_pasgd.tau=3"),
    (["tau=1"], ["tau=5", "lr=0.7"], "no run of this sweep has --b dp_pasgd.tau=5 dp_pasgd.lr=0.7"),
    (["tau=1"], ["tau=five"], "no run of this sweep has --b dp_pasgd.tau=five"),
])
def test_no_matching_runs(tmp_path, capsys, a, b, match):
    _refused(capsys, [str(write_sweep(tmp_path / "s")), "--a", *a, "--b", *b], match)


@pytest.mark.parametrize("a, b, option", [(["tau=1"], ["tau=5", "lr=0.1"], "--a"), (["tau=1", "lr=0.5"], ["tau=5"], "--b")])
def test_a_setting_that_leaves_a_varying_key_open(tmp_path, capsys, a, b, option):
    folder = write_sweep(tmp_path / "s", lrs=(0.1, 0.5))
    _refused(capsys, [str(folder), "--a", *a, "--b", *b], f"{option} dp_pasgd.tau=")
    _refused(capsys, [str(folder), "--a", *a, "--b", *b], "matches several runs of seed 0; give dp_pasgd.lr as well")


def test_pairs_that_do_not_match(tmp_path, capsys):
    folder = write_sweep(tmp_path / "s")
    rows = (folder / "sweep.csv").read_text().splitlines()
    # Drop tau=5's run of seed 3, then tau=1's of seeds 0 and 2: the seeds no longer pair.
    kept = [r for r in rows if not r.endswith("tau-5_lr-0.1_seed-3")]
    (folder / "sweep.csv").write_text("\n".join(kept) + "\n")
    _refused(capsys, [str(folder), "--a", "tau=1", "--b", "tau=5"], "do not pair by seed: seeds [3] only in --a dp_pasgd.tau=1")
    kept = [r for r in kept if not r.endswith(("tau-1_lr-0.1_seed-0", "tau-1_lr-0.1_seed-2"))]
    (folder / "sweep.csv").write_text("\n".join(kept) + "\n")
    _refused(capsys, [str(folder), "--a", "tau=10", "--b", "tau=1"], "seeds [0, 2] only in --a dp_pasgd.tau=10")


@pytest.mark.parametrize("seeds", [(0,), (7,)])
def test_fewer_than_two_pairs(tmp_path, capsys, seeds):
    folder = write_sweep(tmp_path / "s", accuracy={1: [0.8], 5: [0.7]}, loss={1: [0.4], 5: [0.5]}, seeds=seeds)
    _refused(capsys, [str(folder), "--a", "tau=1", "--b", "tau=5"], "1 pair; a paired comparison needs n >= 2")


@pytest.mark.parametrize("argv, match", [
    (["--metric", "accuracy"], "--metric 'accuracy' is not a column of this sweep; choose one of test_accuracy"),
    (["--metric", "run"], "--metric 'run' is not a column"),
    (["--metric", "steps"], "which way is better for steps is not known; add --higher-is-better"),
    (["--metric", "validation_accuracy"], "run tau-1_lr-0.1_seed-0 has no finite validation_accuracy ('')"),
])
def test_bad_metric(tmp_path, capsys, argv, match):
    _refused(capsys, [str(write_sweep(tmp_path / "s")), "--a", "tau=1", "--b", "tau=5", *argv], match)


@pytest.mark.parametrize("argv, match", [
    (["--a", "tau=1", "--b", "tau=1"], "--a and --b are the same setting (dp_pasgd.tau=1)"),
    (["--a", "tau", "--b", "tau=1"], "--a 'tau': expected KEY=VALUE"),
    (["--a", "tau=1", "tau=5", "--b", "tau=1"], "--a tau: given twice"),
    (["--a", "tau=1"], "the following arguments are required: --b"),
    (["--a", "tau=1", "--b", "tau=5", "--higher-is-better", "--lower-is-better"], "not allowed with argument"),
])
def test_bad_settings(tmp_path, capsys, argv, match):
    _refused(capsys, [str(write_sweep(tmp_path / "s")), *argv], match)


def test_no_sweep_table_or_a_damaged_one(tmp_path, capsys):
    _refused(capsys, [str(tmp_path / "nowhere"), "--a", "tau=1", "--b", "tau=5"], "has no sweep.csv; not a sweep folder")
    folder = write_sweep(tmp_path / "s")
    text = (folder / "sweep.csv").read_text()
    (folder / "sweep.csv").write_text(text.replace(",0,completed,", ",zero,completed,", 1))
    _refused(capsys, [str(folder), "--a", "tau=1", "--b", "tau=5"], "sweep.csv: damaged: line 2: seed 'zero' is not an integer")
    (folder / "sweep.csv").write_text(text + "1,0.1,9\n")
    _refused(capsys, [str(folder), "--a", "tau=1", "--b", "tau=5"], "damaged: line 17: wrong number of cells")
    (folder / "sweep.csv").write_text(text.splitlines()[0] + "\n")
    _refused(capsys, [str(folder), "--a", "tau=1", "--b", "tau=5"], "holds no runs")
    (folder / "sweep.csv").write_bytes(b"\xff\xfe" + text.encode())
    _refused(capsys, [str(folder), "--a", "tau=1", "--b", "tau=5"], "sweep.csv: unreadable")


def test_the_function_raises_the_same_user_error(tmp_path):
    folder = write_sweep(tmp_path / "s")
    with pytest.raises(UserError, match="no run of this sweep has --b dp_pasgd.tau=7"):
        compare(folder, {"tau": 1}, {"tau": 7})
    with pytest.raises(UserError, match="no --b setting"):
        compare(folder, {"tau": 1}, [])
    with pytest.raises(UserError, match="no --metric"):
        compare(folder, {"tau": 1}, {"tau": 5}, metrics=[])


@pytest.mark.parametrize("cell, match", [("nan", "has no finite test_accuracy ('nan')"), ("-inf", "no finite"),
                                         ("1e308", "test_accuracy 1e+308 is outside [0, 1]"),
                                         ("-2e15", "outside [0, 1]"), ("-5", "test_accuracy -5 is outside [0, 1]"),
                                         ("1.0000001", "outside [0, 1]")])
def test_a_metric_that_is_not_a_usable_number(tmp_path, capsys, cell, match):
    folder = write_sweep(tmp_path / "s")
    rows = (folder / "sweep.csv").read_text().splitlines()
    # tau=1's run of seed 1: its test_accuracy cell (0.82) replaced.
    rows = [r.replace(",completed,0.82,", f",completed,{cell},") if r.endswith("tau-1_lr-0.1_seed-1") else r for r in rows]
    (folder / "sweep.csv").write_text("\n".join(rows) + "\n")
    _refused(capsys, [str(folder), "--a", "tau=1", "--b", "tau=5"], "run tau-1_lr-0.1_seed-1")
    _refused(capsys, [str(folder), "--a", "tau=1", "--b", "tau=5"], match)
