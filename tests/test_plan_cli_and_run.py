"""`testbed plan dp-pasgd`, calibration files, and ``dp_pasgd.tau = "plan"`` in a run."""

import json

import pytest

from testbed.assembly.config import load_config_text
from testbed.cli import main
from testbed.errors import ConfigError, UserError
from testbed.orchestration.runner import run_experiment
from testbed.planning.calibration import read_calibration

from conftest import REPO, adult_file

CALIBRATION = REPO / "tests" / "data" / "pi-zero-2w.calibration.toml"
SYNTHETIC = """
[data]
dataset = "synthetic"
num_nodes = 4
samples_per_node = 200
dim = 8
[model]
bias = false
[dp_pasgd]
batch = 16
lr = 0.5
[output]
figures = false
"""


def _json(capsys, argv):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture
def synthetic_file(tmp_path):
    path = tmp_path / "exp.toml"
    path.write_text(SYNTHETIC)
    return path


def test_plan_default_adult2_json_keys_and_feasible(capsys, monkeypatch):
    monkeypatch.setenv("TESTBED_DATA", str(adult_file().parent))
    out = _json(capsys, ["plan", "dp-pasgd", "--json"])
    assert {"tau", "steps", "sigma", "epsilon", "cost"} <= set(out)
    assert out["dataset"] == "adult-2" and out["c1"] == 100 and out["c2"] == 1 and out["constants"]["delta"] == 1e-4
    assert out["steps"] % out["tau"] == 0 and out["cost"] <= out["cost_budget"] == 1000
    assert out["epsilon"] <= out["epsilon_target"] * (1 + 1e-9) and out["epsilon_target"] == 10


def test_plan_prints_both_variants_labelled_with_the_epsilon_they_spend(capsys, synthetic_file):
    assert main(["plan", "dp-pasgd", str(synthetic_file), "--epsilon", "1", "--cost-budget", "1000"]) == 0
    text = capsys.readouterr().out
    literal = next(line for line in text.splitlines() if line.startswith("paper_literal:"))
    assert "NOT private at the target" in literal
    assert "(meets the target)" in next(line for line in text.splitlines() if line.startswith("corrected:"))
    for name in ("L =", "lambda =", "xi^2 =", "alpha ="):
        assert name in text
    out = _json(capsys, ["plan", "dp-pasgd", str(synthetic_file), "--epsilon", "1", "--variant", "paper_literal", "--json"])
    assert out["variant"] == "paper_literal" and out["epsilon"] > 10 * out["epsilon_target"]


def test_plan_with_given_constants_uses_them(capsys, synthetic_file):
    out = _json(capsys, ["plan", "dp-pasgd", str(synthetic_file), "--smoothness", "0.3", "--strong-convexity", "0.05",
                         "--grad-variance", "0.01", "--initial-gap", "0.7", "--json"])
    assert out["constants"]["smoothness"] == 0.3 and out["constants"]["initial_gap"] == 0.7
    assert set(out["sources"].values()) == {"given"}


def test_plan_from_calibration_file(capsys, synthetic_file):
    out = _json(capsys, ["plan", "dp-pasgd", str(synthetic_file), "--calibration", str(CALIBRATION),
                         "--cost-unit", "joules", "--cost-budget", "50", "--epsilon", "2", "--json"])
    assert (out["c1"], out["c2"], out["cost_unit"]) == (0.85, 0.012, "joules")
    assert out["cost"] == pytest.approx(0.85 * out["rounds"] + 0.012 * out["steps"]) and out["cost"] <= 50
    assert out["calibration"]["profile"] == "pi-zero-2w"
    seconds = _json(capsys, ["plan", "dp-pasgd", str(synthetic_file), "--calibration", str(CALIBRATION),
                             "--cost-unit", "seconds", "--cost-budget", "5", "--json"])
    assert (seconds["c1"], seconds["c2"]) == (0.31, 0.004)


@pytest.mark.parametrize("text,words", [
    ("[calibration]\nprofile = 'x'\nmodel_params = 10\n[c1]\njoules = 1.0\nseconds = 1.0\n", "[c2]"),
    ("[calibration]\nprofile = 'x'\nmodel_params = 10\n[c1]\njoules = -1.0\nseconds = 1.0\n[c2]\njoules = 1.0\nseconds = 1.0\n",
     "c1.joules"),
    ("[calibration]\nprofile = 'x'\nmodel_params = 0\n", "calibration.model_params"),
    ("not toml [", "not valid TOML"),
])
def test_bad_calibration_file_names_the_key(tmp_path, text, words):
    path = tmp_path / "cal.toml"
    path.write_text(text)
    with pytest.raises(UserError, match=words.replace("[", r"\[")):
        read_calibration(path)


def test_plan_cli_errors_are_one_line(capsys, synthetic_file, tmp_path):
    assert main(["plan", "dp-pasgd", str(synthetic_file), "--calibration", str(CALIBRATION)]) == 2
    assert "--cost-budget" in capsys.readouterr().err
    assert main(["plan", "dp-pasgd", str(synthetic_file), "--cost-budget", "50"]) == 2  # below c1 + c2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "c1 + c2" in err


def test_tau_plan_end_to_end(tmp_path):
    config = load_config_text(SYNTHETIC + '[budget]\ncost_units = 1000.0\nepsilon = 4.0\n',
                              ["dp_pasgd.tau='plan'"])
    summary = run_experiment(config, tmp_path / "r", quiet=True).summary
    plan = summary["plan"]
    assert plan["tau"] * plan["rounds"] == plan["steps"] == summary["algorithm_settings"]["steps_planned"]
    assert summary["rounds"] == plan["rounds"] and summary["status"] == "completed"
    assert max(n["cost_units"] for n in summary["nodes"].values()) == plan["cost"] <= 1000
    assert max(n["epsilon"] for n in summary["nodes"].values()) <= 4 * (1 + 1e-9)
    assert summary["algorithm_settings"]["sigma"] == pytest.approx(plan["sigma"])
    resolved = load_config_text((tmp_path / "r" / "config.toml").read_text())
    assert (resolved.dp_pasgd.tau, resolved.dp_pasgd.steps) == (plan["tau"], plan["steps"])


@pytest.mark.parametrize("extra,key", [
    ('[dp_pasgd]\ntau = "fast"\n', "dp_pasgd.tau"),
    ('[dp_pasgd]\ntau = "plan"\nepsilon = 1.0\n', "budget.cost_units"),
    ('[dp_pasgd]\ntau = "plan"\n[budget]\ncost_units = 500.0\n', "dp_pasgd.epsilon"),
    ('[dp_pasgd]\ntau = "plan"\nsigma = 1.0\n[budget]\ncost_units = 500.0\nepsilon = 1.0\n', "dp_pasgd.sigma"),
])
def test_tau_config_errors_name_the_key(extra, key):
    with pytest.raises(ConfigError) as info:
        load_config_text(extra)
    assert info.value.key == key


@pytest.mark.parametrize("setting, source", [('"trace"', "estimated"), ("3.5", "given")])
def test_plan_noise_dimension_from_the_file(capsys, tmp_path, setting, source):
    """[plan] noise_dimension: "trace" estimates d_eff (testbed.planning.estimate.noise_dimension), a
    number is used as given; unset, the plan charges the noise with d (no such constant)."""
    path = tmp_path / "exp.toml"
    path.write_text(SYNTHETIC + f"[plan]\nnoise_dimension = {setting}\n")
    out = _json(capsys, ["plan", "dp-pasgd", str(path), "--json"])
    assert out["sources"]["noise_dimension"] == source
    assert 0 < out["constants"]["noise_dimension"] <= out["constants"]["dimension"]
    if source == "given":
        assert out["constants"]["noise_dimension"] == 3.5
    assert main(["plan", "dp-pasgd", str(path)]) == 0
    assert f"d_eff = {out['constants']['noise_dimension']:.4g} ({source})" in capsys.readouterr().out
    path.write_text(SYNTHETIC)
    plain = _json(capsys, ["plan", "dp-pasgd", str(path), "--json"])
    assert plain["constants"]["noise_dimension"] is None and "noise_dimension" not in plain["sources"]
