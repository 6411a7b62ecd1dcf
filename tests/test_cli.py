"""The command line: every user error is one line naming the key, exit code 2, no traceback."""

import json
import subprocess
import sys

import pytest

from testbed.cli import main

from conftest import REPO


def _err(capsys, argv):
    code = main(argv)
    out = capsys.readouterr()
    return code, out.err.strip()


@pytest.mark.parametrize("override,key,words", [
    ("dp_pasgd.stepz=3", "dp_pasgd.stepz", "unknown key"),
    ("nosuch.key=1", "nosuch", "unknown section"),
    ("dp_pasgd.lr='fast'", "dp_pasgd.lr", "must be a number"),
    ("dp_pasgd.steps=2.5", "dp_pasgd.steps", "must be an integer"),
    ("dp_pasgd.epsilon=0", "dp_pasgd.epsilon", "> 0"),
    ("budget.epsilon=-1", "budget.epsilon", "> 0"),
    ("privacy.delta=1.0", "privacy.delta", "(0, 1)"),
    ("privacy.delta=0", "privacy.delta", "(0, 1)"),
    ("dp_pasgd.steps=21", "dp_pasgd.steps", "not a multiple of tau"),
    ("dp_pasgd.batch=500", "dp_pasgd.batch", "larger than node"),
    ("data.dataset='adult-1'", "data", "adult"),
    ("model.kind='forest'", "model.kind", "must be one of"),
])
def test_config_errors_name_the_key(capsys, small_config_file, tmp_path, monkeypatch, override, key, words):
    monkeypatch.setenv("TESTBED_DATA", str(tmp_path / "no-data-here"))
    monkeypatch.setenv("TESTBED_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr("testbed.data.cache.download", _no_network)
    extra = ["--set", "data.path='/nonexistent/adult.data'"] if "adult" in override else []
    code, err = _err(capsys, ["run", str(small_config_file), "--set", override, *extra, "--out", str(tmp_path / "r")])
    assert code == 2
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert key in err and words in err


def _no_network(*args, **kwargs):
    raise OSError("offline")


def test_missing_experiment_file(capsys, tmp_path):
    code, err = _err(capsys, ["run", str(tmp_path / "nope.toml")])
    assert code == 2 and "not found" in err


def test_run_with_seed_and_set(capsys, small_config_file, tmp_path):
    code = main(["run", str(small_config_file), "--seed", "7", "--set", "dp_pasgd.tau=4",
                 "--out", str(tmp_path / "r"), "--quiet"])
    assert code == 0
    s = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert s["seed"] == 7 and s["algorithm_settings"]["tau"] == 4 and s["rounds"] == 5


def test_summary_table_and_progress(capsys, small_config_file, tmp_path):
    assert main(["run", str(small_config_file), "--out", str(tmp_path / "r")]) == 0
    out = capsys.readouterr()
    assert "status       completed" in out.out and "round 4/4" in out.err


def test_refuses_to_overwrite_a_run(capsys, small_config_file, tmp_path):
    assert main(["run", str(small_config_file), "--out", str(tmp_path / "r"), "--quiet"]) == 0
    code, err = _err(capsys, ["run", str(small_config_file), "--out", str(tmp_path / "r"), "--quiet"])
    assert code == 2 and "already holds a run" in err


def test_privacy_calculator_json(capsys):
    assert main(["privacy", "dp-pasgd", "--steps", "100", "--lipschitz", "1", "--batch", "32",
                 "--delta", "1e-4", "--sigma", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["epsilon"] == pytest.approx(2.877770, abs=1e-6) and out["rho"] == pytest.approx(0.1953125)
    assert main(["privacy", "dp-pasgd", "--steps", "100", "--lipschitz", "1", "--batch", "32",
                 "--delta", "1e-4", "--epsilon", "1", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["sigma"] == pytest.approx(2.753393, abs=1e-6) and out["epsilon"] == pytest.approx(1.0)


def test_privacy_calculator_flags_the_literal_erratum(capsys):
    assert main(["privacy", "dp-pasgd", "--steps", "100", "--lipschitz", "1", "--batch", "32",
                 "--delta", "1e-4", "--epsilon", "1", "--calibration", "paper_literal"]) == 0
    out = capsys.readouterr().out
    assert "WARNING" in out and "76.6" in out


def test_privacy_calculator_bad_delta(capsys):
    code, err = _err(capsys, ["privacy", "dp-pasgd", "--steps", "1", "--lipschitz", "1", "--batch", "1",
                              "--delta", "2", "--sigma", "1"])
    assert code == 2 and "--delta" in err


def test_report_redraws(capsys, small_config_file, tmp_path):
    assert main(["run", str(small_config_file), "--out", str(tmp_path / "r"), "--quiet"]) == 0
    assert main(["report", str(tmp_path / "r")]) == 0
    assert (tmp_path / "r" / "figures" / "epsilon.png").exists()


def test_module_entry_point_prints_one_line_on_error(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[dp_pasgd]\nsteps = 7\ntau = 2\n")
    proc = subprocess.run([sys.executable, "-m", "testbed", "run", str(bad)], capture_output=True, text=True,
                          cwd=REPO)
    assert proc.returncode == 2
    assert proc.stderr.strip() == "testbed: config error: dp_pasgd.steps: K = 7 is not a multiple of tau = 2"
