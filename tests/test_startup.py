"""A start that talks (issue 43, part 5): each set-up stage is named on stderr before round 1, and
its seconds are kept out of the rounds' (metrics.csv and summary ``wall_s``; summary ``setup_s``),
so every "seconds per round" (watch page, report) is the rounds' own."""

import csv
import io
import json
import sys
import time

from testbed.assembly import assemble
from testbed.assembly.config import load_config_text
from testbed.orchestration.runner import run_experiment
from testbed.reports.startup import Startup, time_text
from testbed.watch.checks import summary_view

SLOW_S = 2.0  # a set-up stage this slow, on purpose


def test_set_up_is_said_before_round_1_and_kept_out_of_the_rounds_time(small_config_text, tmp_path, monkeypatch, capsys):
    build = assemble.build_algorithm

    def slow_build(*args, **kwargs):
        time.sleep(SLOW_S)  # as Sionna's import is, in a DWFL run
        return build(*args, **kwargs)

    monkeypatch.setattr(assemble, "build_algorithm", slow_build)
    started = time.monotonic()
    run_experiment(load_config_text(small_config_text), out_dir=tmp_path / "r")
    total = time.monotonic() - started
    err = capsys.readouterr().err
    lines = err.splitlines()
    said = [i for i, line in enumerate(lines) if line.startswith("setup: ")]
    stages = [lines[i] for i in said]
    # The slow stage is named while it runs; the quick ones say nothing.
    assert stages[0].startswith("setup: building dp_pasgd and checking its accountants"), err
    assert not any("planning" in s for s in stages[:-1]), err
    assert stages[-1].startswith("setup: done in ") and "round 1 starts" in stages[-1], err
    assert "building dp_pasgd" in stages[-1]  # the slow stage is named with its seconds
    first_round = next(i for i, line in enumerate(lines) if line.startswith("round "))
    assert max(said) < first_round  # every stage said before the first round's line

    summary = json.loads((tmp_path / "r" / "summary.json").read_text())
    with open(tmp_path / "r" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert summary["setup_s"] >= SLOW_S
    assert float(rows[0]["wall_s"]) < SLOW_S  # round 1 is not charged the set-up
    assert float(rows[-1]["wall_s"]) <= summary["wall_s"]
    assert summary["setup_s"] + summary["wall_s"] <= total
    # The watch page's card and the report read the rounds' seconds and the set-up's apart.
    view = summary_view(summary)
    assert (view["wall_s"], view["setup_s"]) == (summary["wall_s"], summary["setup_s"])
    text = time_text(summary)
    assert f"for {summary['rounds']} rounds" in text and "of set-up" in text
    from testbed.cli.run import format_summary
    from testbed.reports.html import write_report

    assert f"time         {text}" in format_summary(summary).splitlines()
    assert text in write_report(tmp_path / "r").read_text()


def test_every_stage_is_named_when_each_is_slow(small_config_text, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("testbed.reports.startup.SAY_AFTER_S", 0.0)
    run_experiment(load_config_text(small_config_text), out_dir=tmp_path / "r")
    stages = [line for line in capsys.readouterr().err.splitlines() if line.startswith("setup: ")]
    for name in ("loading the data (synthetic, 4 nodes)", "planning dp_pasgd",
                 "building dp_pasgd and checking its accountants"):
        assert any(s.startswith(f"setup: {name}") for s in stages), stages
    # The nodes' stage forks an MQTT run's hosts: no timer thread then; its seconds are in the last line.
    assert not any(s.startswith("setup: starting the nodes") for s in stages), stages


def test_a_quick_refusal_is_still_one_line(small_config_file, capsys):
    from testbed.cli import main

    assert main(["run", str(small_config_file), "--set", "dp_pasgd.batch=500"]) == 2
    assert len(capsys.readouterr().err.splitlines()) == 1


def test_quiet_says_nothing_but_still_times_the_set_up(small_config_text, tmp_path, capsys):
    run_experiment(load_config_text(small_config_text), out_dir=tmp_path / "r", quiet=True)
    assert capsys.readouterr().err == ""
    assert json.loads((tmp_path / "r" / "summary.json").read_text())["setup_s"] > 0


def test_a_stage_names_the_libraries_it_may_still_import(monkeypatch):
    out = io.StringIO()
    startup = Startup(stream=out, say_after_s=0.0)
    monkeypatch.delitem(sys.modules, "json", raising=False)
    monkeypatch.setattr("testbed.reports.startup.HEAVY", ("json",))
    with startup.stage("building x", may_import=("json",)):
        import json  # noqa: F401  what the stage loads
        time.sleep(0.2)
    assert out.getvalue() == "setup: building x (may import json on first use: seconds each)…\n"
    assert startup.imported == ["json"]
    startup.done()
    assert "imported json" in out.getvalue().splitlines()[-1]
