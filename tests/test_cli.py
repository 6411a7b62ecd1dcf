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


def test_the_program_leaves_at_once_but_under_a_profiler(tmp_path):
    """`python -m testbed` ends by os._exit once all is written (no teardown), with main()'s code;
    under cProfile it ends as the interpreter does, so the profile is written."""
    bad = tmp_path / "bad.toml"
    bad.write_text("[dp_pasgd]\nsteps = 7\ntau = 2\n")
    profile = tmp_path / "run.prof"
    for prefix, code in (([], 2), (["-m", "cProfile", "-o", str(profile)], 0)):  # cProfile drops SystemExit's code
        proc = subprocess.run([sys.executable, *prefix, "-m", "testbed", "run", str(bad)], capture_output=True,
                              text=True, cwd=REPO)
        assert proc.returncode == code and proc.stderr.startswith("testbed: config error: dp_pasgd.steps")
    assert profile.stat().st_size > 0


def _command_parsers():
    """(words, parser) of every command and of every algorithm's sub-command."""
    import argparse

    from testbed.cli import build_parser

    def walk(parser, words):
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if words:
            yield words, parser
        for action in subs:
            for name, child in action.choices.items():
                yield from walk(child, words + [name])

    return list(walk(build_parser(), []))


@pytest.mark.parametrize("words,parser", _command_parsers(), ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_every_command_help_ends_with_examples_that_parse(words, parser):
    import shlex

    from testbed.cli import build_parser

    text = parser.format_help()
    assert "\nexamples:\n" in text, f"testbed {' '.join(words)} --help shows no example"
    examples = [line.strip() for line in text.split("\nexamples:\n", 1)[1].splitlines() if line.startswith("  testbed ")]
    assert examples
    for example in examples:
        argv = shlex.split(example)[1:]
        assert argv[:len(words)] == words, example
        build_parser(argv[0]).parse_args(argv)  # a UserError (one line) or SystemExit fails the test


INTERNAL = [("node", "--crash-at-round", ["--crash-at-round", "3", "--broker", "mqtt://h:1", "--node-id", "0"]),
            ("node", "--crash-after-reply", ["--crash-after-reply", "--broker", "mqtt://h:1", "--node-id", "0"]),
            ("nodes", "--session", ["--session", "s1", "--count", "2", "--broker", "mqtt://h:1"]),
            ("nodes", "--coordinator-pid", ["--coordinator-pid", "1", "--count", "2", "--broker", "mqtt://h:1"]),
            ("broker", "--parent-pid", ["--parent-pid", "1"])]


@pytest.mark.parametrize("command,flag,argv", INTERNAL, ids=[f"{c} {f}" for c, f, _ in INTERNAL])
def test_internal_flags_are_hidden_from_help_and_still_accepted(command, flag, argv):
    from testbed.cli import build_parser

    parser = build_parser(command)
    sub = parser._subparsers._group_actions[0].choices[command]
    assert flag not in sub.format_help()
    args = parser.parse_args([command, *argv])
    assert getattr(args, flag.lstrip("-").replace("-", "_")) not in (None, False)


@pytest.mark.parametrize("argv", [["--version"], ["--version", "run"]])
def test_version_is_the_packages_one_version(argv, capsys):
    """`testbed --version` says testbed.__version__, which pyproject.toml's dynamic version reads (a
    built wheel's metadata says the same: tests/test_publish.py)."""
    import tomllib

    from testbed import __version__

    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 0
    assert capsys.readouterr().out.strip() == f"testbed {__version__}"
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "version" not in project["project"] and project["project"]["dynamic"] == ["version"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "testbed.__version__"}


@pytest.mark.parametrize("module,extra", [("torch", "torch"), ("sionna", "channel")])
def test_a_missing_package_names_the_extra_that_installs_only_what_is_needed(module, extra):
    # A CNN needs PyTorch alone: [torch], not [channel] with Sionna.
    import tomllib

    from testbed.util.extras import missing_package_message

    message = missing_package_message(ModuleNotFoundError(f"No module named '{module}'", name=module))
    assert message.endswith(f"pip install 'dpfl-testbed[{extra}]'")
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    torch = [r for r in extras["channel"] if r.startswith("torch")]
    assert extras["torch"] == torch  # the same range as the channel extra's
    assert "torch" in extras["all"][0]
