"""The hooks an algorithm registers for the command line and the live view (Registration's
``privacy_cli``, ``plan_cli``, ``calibration_step``, ``channel_view``, ``graph_view``): `testbed privacy`,
`testbed plan`, `testbed calibrate`, `testbed topology` and the watch page take every algorithm from the registry, so a
new algorithm's hook shows there with no edit outside its own module."""

from __future__ import annotations

import argparse
import dataclasses

import numpy as np
import pytest

from testbed.algorithms import registry
from testbed.algorithms.registry import Command
from testbed.assembly.config import load_config_text
from testbed.cli import build_parser, main
from testbed.cli.algorithm_commands import command_name
from testbed.orchestration.runner import run_experiment
from testbed.watch.feed import RunFeed


def _subcommands(command: str) -> list[str]:
    """The sub-commands of `testbed COMMAND`, in --help's order."""
    def sub_of(parser: argparse.ArgumentParser) -> argparse._SubParsersAction:
        return next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))

    return list(sub_of(sub_of(build_parser(command)).choices[command]).choices)


def _with(monkeypatch: pytest.MonkeyPatch, name: str, **hooks) -> None:
    """The registry as it is, with algorithm ``name`` (an existing one's registration, renamed)
    registering ``hooks``."""
    found = registry.registrations()
    reg = dataclasses.replace(found.get(name, found["fedavg"]), name=name, **hooks)
    monkeypatch.setattr(registry, "registrations", lambda: dict(sorted({**found, name: reg}.items())))


def test_the_papers_calculators_and_planners_are_the_registered_ones():
    calculators = ["acfl", "dp-pasgd", "dwfl", "padpfl"]
    assert [command_name(reg.name) for reg in registry.offering("privacy_cli")] == calculators
    assert _subcommands("plan") == ["acfl", "dp-pasgd"] == [command_name(reg.name) for reg in registry.offering("plan_cli")]
    # `testbed privacy` has every algorithm's statement (DP-PASGD's board variant after it), calculators included.
    # (a plugin's algorithm, registered by name among them, is left out here)
    built_in = {command_name(s.name) for s in registry.privacy_statements(plugins=False)}
    assert [c for c in _subcommands("privacy") if c in built_in] == \
        ["acfl", "dp-pasgd", "mcu-logistic", "dpsgd", "dwfl", "fedavg", "fedprox", "gossip", "padpfl"]
    assert set(calculators) <= set(_subcommands("privacy"))


@pytest.mark.parametrize("command, hook", [("privacy", "privacy_cli"), ("plan", "plan_cli")])
@pytest.mark.parametrize("name", ["new_algorithm", "zeta"])
def test_a_registered_command_is_on_the_command_line(monkeypatch, capsys, command, hook, name):
    ran = []

    def arguments(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--count", type=int, required=True)

    def run(args: argparse.Namespace) -> int:
        ran.append((args.algorithm, args.count))
        return 0

    _with(monkeypatch, name, **{hook: Command(help="a new algorithm's", arguments=arguments, run=run)})
    assert command_name(name) in _subcommands(command)
    assert main([command, command_name(name), "--count", "3"]) == 0
    assert ran == [(command_name(name), 3)]
    assert main([command, command_name(name)]) == 2  # its arguments are checked as the others' are
    assert f"testbed: {command} {command_name(name)}: the following arguments are required: --count" in \
        capsys.readouterr().err


def test_an_algorithm_without_the_hook_has_no_sub_command(monkeypatch, capsys):
    """No planner: no `testbed plan fedavg`. No calculator: `testbed privacy fedavg` is its
    statement alone, and calculator arguments are refused; neither a calculator nor a statement:
    no sub-command."""
    assert command_name("fedavg") not in _subcommands("plan")
    assert main(["privacy", "fedavg"]) == 0 and "FedAvg" in capsys.readouterr().out
    assert main(["privacy", "fedavg", "--steps", "3"]) == 2
    _with(monkeypatch, "zeta", privacy_statements=())
    assert "zeta" not in _subcommands("privacy")


class _View:
    """A channel that changes every second round: node k's gain is (k + 1)(r + 1), its SNR 100."""

    def block_of(self, round_index: int) -> int:
        return round_index // 2

    def links(self, round_index: int) -> tuple[np.ndarray, np.ndarray]:
        return np.arange(1.0, 5.0) * (round_index + 1), np.full(4, 100.0)


@pytest.fixture
def dp_pasgd_run(tmp_path, small_config_text):
    return run_experiment(load_config_text(small_config_text), out_dir=tmp_path / "run", quiet=True)


def _nodes(run_dir) -> tuple[list[dict], RunFeed]:
    feed = RunFeed(run_dir)
    feed.poll()
    return feed.snapshot()["nodes"], feed


def test_the_watch_page_draws_the_channel_an_algorithm_registers(dp_pasgd_run, monkeypatch):
    nodes, _ = _nodes(dp_pasgd_run.run_dir)
    assert [(n["gain"], n["snr_db"]) for n in nodes] == [(None, None)] * 4  # DP-PASGD has no channel
    _with(monkeypatch, "dp_pasgd", channel_view=lambda sections, num_nodes, seed: _View())
    nodes, feed = _nodes(dp_pasgd_run.run_dir)
    last = feed.current_round()
    assert last == 3
    assert [n["gain"] for n in nodes] == [(k + 1.0) * (last + 1) for k in range(4)]
    assert [n["snr_db"] for n in nodes] == pytest.approx([20.0] * 4)


def test_a_channel_view_that_cannot_be_built_is_one_line_and_the_run_is_shown(dp_pasgd_run, monkeypatch):
    def refuse(sections, num_nodes, seed):
        raise ValueError("no such\nradio")

    _with(monkeypatch, "dp_pasgd", channel_view=refuse)
    nodes, feed = _nodes(dp_pasgd_run.run_dir)
    assert feed.problems["config.toml"][0] == "the radio: no such radio"
    assert len(nodes) == 4 and all(n["gain"] is None for n in nodes)
    assert len(feed.metrics) == 4


class _Graph:
    """A graph that changes every third round: a star around node (block mod 4), nodes on a line."""

    def block_of(self, round_index: int) -> int:
        return round_index // 3

    def edges(self, round_index: int) -> np.ndarray:
        hub = self.block_of(round_index) % 4
        return np.array([sorted((hub, k)) for k in range(4) if k != hub])

    def positions(self, round_index: int) -> np.ndarray:
        return np.column_stack([np.arange(4.0), np.zeros(4)])


def test_the_watch_page_draws_the_graph_an_algorithm_registers(dp_pasgd_run, monkeypatch):
    assert _nodes(dp_pasgd_run.run_dir)[1].snapshot()["graph"] is None  # DP-PASGD has no graph
    _with(monkeypatch, "dp_pasgd", graph_view=lambda sections, num_nodes, seed: _Graph())
    _, feed = _nodes(dp_pasgd_run.run_dir)
    graph = feed.snapshot()["graph"]
    assert feed.current_round() == 3 and graph["block"] == 1 and graph["round"] == 4
    assert graph["edges"] == [[0, 1], [1, 2], [1, 3]]
    assert graph["positions"] == [[0.0, 0.0], [1.0, 0.0], [2.0, 0.0], [3.0, 0.0]]


def test_topology_show_refuses_a_graph_that_is_not_a_topologys(tmp_path, capsys, small_config_file, monkeypatch):
    assert main(["topology", "show", str(small_config_file)]) == 2
    assert "dp_pasgd is not a decentralised algorithm" in capsys.readouterr().err
    _with(monkeypatch, "dp_pasgd", graph_view=lambda sections, num_nodes, seed: _Graph())
    assert main(["topology", "show", str(small_config_file)]) == 2
    assert "not a [topology] graph" in capsys.readouterr().err


def test_calibrate_times_the_one_registered_local_step(monkeypatch):
    from testbed.cli.calibrate import _calibrated_step

    assert [reg.name for reg in registry.offering("calibration_step")] == ["dp_pasgd"]
    assert _calibrated_step() is registry.get("dp_pasgd").calibration_step
    _with(monkeypatch, "zeta", calibration_step=lambda model, data, batch: None)
    with pytest.raises(RuntimeError, match="dp_pasgd.*zeta"):
        _calibrated_step()
