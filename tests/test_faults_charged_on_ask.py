"""Charged before asked (issue 39, part 3): whatever point of a round a node or the coordinator is
killed at, or however late a last update comes, the summary never shows a node below its own
ledger, and it says per node whose word its figures stand on.

Whole MQTT runs through the real coordinator and honest in-process agents (tests/
loopback_coordinator.py). A node killed at a point of a round stops answering from there (its
ledger kept as it was); a coordinator killed at a point of a round is a forked child process
that ends with os._exit (no finally, no summary: a kill -9), resumed in this process by
`run_experiment(resume=True)` against the same nodes' ledger files.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from ledger_invariant import FIGURES, PLANNED, under_counts
from loopback_coordinator import loopback
from nodes.agent import NodeAgent
from testbed.assembly.config import load_config_text
from testbed.ledger.files import read_whole_rows
from testbed.ledger.node import merge_sessions
from testbed.orchestration import charging
from testbed.orchestration.charging import CONFIRMED, ON_ASK
from testbed.orchestration.runner import run_experiment
from testbed.reports.asked import AskedLog
from testbed.reports.results import RunDirectory, read_summary
from testbed.rounds import protocol

NODES = list(range(4))
BASE = """
[run]
name = "ask"
seed = 3
mode = "mqtt"
[data]
dataset = "synthetic"
num_nodes = 4
samples_per_node = 40
dim = 4
[output]
figures = false
checkpoint_every = 1
[privacy]
tight_accountant = "none"
[mqtt]
broker_url = "mqtt://127.0.0.1:1"
emulated = false
round_timeout_s = 0.2
"""
DP_PASGD = BASE + "[dp_pasgd]\nsteps = 12\ntau = 2\nbatch = 4\nlr = 0.5\nsigma = 1.0\n"  # 6 rounds
ACFL = BASE.replace('mode = "mqtt"', 'mode = "mqtt"\nalgorithm = "acfl"') + \
    '[model]\nkind = "linear"\n[acfl]\niterations = 4\nlr = 0.01\nsigma1_sq = 0.5\nsigma2_sq = 0.5\n'
CONFIGS = {"dp_pasgd": (DP_PASGD, 6), "acfl": (ACFL, 4)}
SETUP = -1


def _dead_after(node: int, round_index: int, sent: bool, nodes):
    """A tamper: ``node`` is killed in ``round_index`` (SETUP: its setup) after logging its release,
    before (``sent`` False) or after its reply left; it answers nothing more, the stop included."""
    def tamper(sender, msg, reply):
        if sender != node:
            return [(reply, 0)]
        asked = SETUP if msg.kind == protocol.SETUP else msg.round
        if msg.kind in (protocol.ROUND, protocol.SETUP) and asked == round_index:
            nodes.agents[node].handle = lambda _msg: None  # dead from here on: its ledger as it left it
            return [(reply, 0)] if sent else []
        return [(reply, 0)]
    return tamper


def _late_past_the_stop(node: int, round_index: int, report: bool):
    """A tamper: ``node``'s reply of ``round_index`` reaches the broker after the coordinator's
    stop wait (never, for the coordinator); its report at the stop comes or not."""
    def tamper(sender, msg, reply):
        if sender == node and msg.kind == protocol.STOP and not report:
            return []
        asked = SETUP if msg.kind == protocol.SETUP else msg.round
        if sender == node and msg.kind in (protocol.ROUND, protocol.SETUP) and asked == round_index:
            return []
        return [(reply, 0)]
    return tamper


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(algorithm=st.sampled_from(sorted(CONFIGS)), node=st.sampled_from(NODES), where=st.integers(0, 10),
       fault=st.sampled_from(["killed_before_send", "killed_after_send", "late_reported", "late_unreported"]))
def test_a_node_killed_or_late_at_any_round_is_never_charged_below_its_own_ledger(algorithm, node, where, fault,
                                                                                  tmp_path_factory, monkeypatch):
    text, rounds = CONFIGS[algorithm]
    first = SETUP if algorithm == "acfl" else 0
    round_index = first + where % (rounds - first)
    config = load_config_text(text)
    out = tmp_path_factory.mktemp("run")
    with monkeypatch.context() as patch:
        with loopback(patch, NODES, lambda *a: [(a[2], 0)]) as nodes:
            if fault.startswith("killed"):
                nodes.tamper = _dead_after(node, round_index, fault == "killed_after_send", nodes)
            else:
                nodes.tamper = _late_past_the_stop(node, round_index, fault == "late_reported")
            result = run_experiment(config, out_dir=out / "run", quiet=True)
        ledgers = [agent.ledger(config.mqtt.run_id, nodes.session) for agent in nodes.agents.values()]
    summary = result.summary
    # Rounds it never confirmed stand on the coordinator's word: the one lost, and those after its death.
    confirmed = fault == "late_reported" or (fault == "killed_after_send" and round_index == rounds - 1)
    # ε and every figure the plan fixes, always; the seconds and joules a node measured in a round
    # it never told of are the coordinator's estimate (its costliest round told), unless it confirms.
    assert under_counts(summary, ledgers, FIGURES if confirmed else PLANNED) == []
    assert under_counts(summary, [led for led in ledgers if led.node != node]) == []
    assert summary["nodes"][str(node)]["source"] == (CONFIRMED if confirmed else ON_ASK)
    assert all(summary["nodes"][str(n)]["source"] == CONFIRMED for n in NODES if n != node)


# ------------------------------------------------------------------------------ the coordinator is killed

#: The points of a round the coordinator can be killed at, in order: the ask written ahead
#: (asked.csv), a node's release logged (before its reply reached the coordinator), the replies
#: received (before the round is charged), the round charged (before its checkpoint), the checkpoint.
POINTS = ("asked", "logged", "received", "charged", "checkpoint")


def _killed_coordinator(text: str, run_dir: Path, state_dir: Path, round_index: int, point: str) -> int:
    """Run ``text`` in a forked child that os._exit(9)s at ``point`` of ``round_index``; its exit status."""
    pid = os.fork()
    if pid:
        return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    try:  # the child: never returns
        _run_and_die(text, run_dir, state_dir, round_index, point)
        os._exit(0)
    except BaseException:  # noqa: BLE001  anything else is the test's failure, said by the status
        import traceback

        traceback.print_exc()
        os._exit(3)


def _run_and_die(text: str, run_dir: Path, state_dir: Path, round_index: int, point: str) -> None:
    pytest_monkeypatch = pytest.MonkeyPatch()

    def die() -> None:
        os._exit(9)

    def at(r: int, where: str) -> None:
        if (r, where) == (round_index, point):
            die()

    append = AskedLog.append
    pytest_monkeypatch.setattr(AskedLog, "append", lambda self, session, r, nodes: (append(self, session, r, nodes),
                                                                                   at(r, "asked")))
    charge = charging.charge_round

    def charged(run, outcome, ledger_file, nodes_):
        at(outcome.ctx.round_index, "received")
        charge(run, outcome, ledger_file, nodes_)
        at(outcome.ctx.round_index, "charged")

    pytest_monkeypatch.setattr(charging, "charge_round", charged)
    save = RunDirectory.save_checkpoint

    def saved(self, rounds_done, *args, **kwargs):
        save(self, rounds_done, *args, **kwargs)
        at(rounds_done - 1 if rounds_done > 0 else SETUP, "checkpoint")  # the round it is the checkpoint of

    pytest_monkeypatch.setattr(RunDirectory, "save_checkpoint", saved)

    def tamper(sender, msg, reply):
        asked = SETUP if msg.kind == protocol.SETUP else msg.round
        if msg.kind in (protocol.ROUND, protocol.SETUP) and sender == max(NODES):
            at(asked, "logged")  # every node has logged its release by now, none reached the coordinator
        return [(reply, 0)]

    with loopback(pytest_monkeypatch, NODES, tamper) as nodes:
        for node in NODES:
            nodes.agents[node] = NodeAgent(node, state_dir=state_dir)
        run_experiment(load_config_text(text), out_dir=run_dir, quiet=True)


def _own_ledgers(state_dir: Path, run_id: str):
    """Each node's own ledger over every session it kept (as a node reports its run's totals)."""
    return [merge_sessions(node, [read_whole_rows(p) for p in sorted(state_dir.glob(f"ledger-{run_id}-*-node{node}.csv"))])
            for node in NODES]


@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(algorithm=st.sampled_from(sorted(CONFIGS)), where=st.integers(0, 10), point=st.sampled_from(POINTS))
def test_a_coordinator_killed_at_any_point_of_a_round_resumes_charging_every_release(algorithm, where, point,
                                                                                    tmp_path_factory, monkeypatch):
    text, rounds = CONFIGS[algorithm]
    first = SETUP if algorithm == "acfl" else 0
    round_index = first + where % (rounds - first)
    tmp = tmp_path_factory.mktemp("killed")
    run_dir, state_dir = tmp / "run", tmp / "nodes"
    status = _killed_coordinator(text, run_dir, state_dir, round_index, point)
    assert status == 9, f"the coordinator was not killed at {point} of round {round_index} (status {status})"
    config = load_config_text(text)
    with monkeypatch.context() as patch:
        with loopback(patch, NODES, lambda *a: [(a[2], 0)]) as nodes:
            for node in NODES:
                nodes.agents[node] = NodeAgent(node, state_dir=state_dir)
            result = run_experiment(config, out_dir=run_dir, quiet=True, resume=True)
        # A resume asks a round again on the input it was released on (nodes.release_record).
        assert [nodes.agents[n].releases.refused for n in NODES] == [0] * len(NODES)
    summary = read_summary(result.run_dir)
    assert summary["status"] == "completed" and summary["rounds"] == rounds
    assert under_counts(summary, _own_ledgers(state_dir, config.mqtt.run_id)) == []


def test_a_resume_asking_a_node_a_round_on_another_model_finishes_with_that_node_charged_on_ask(tmp_path, monkeypatch):
    """Node 2 released round 2 in the killed session on another input than the resumed session
    asks it on (its record says so, as after a straggler that changed the aggregate): it answers
    nothing, straggling that round, and the run still completes, never below its own ledger."""
    run_dir, state_dir = tmp_path / "run", tmp_path / "nodes"
    assert _killed_coordinator(DP_PASGD, run_dir, state_dir, 2, "logged") == 9
    config = load_config_text(DP_PASGD)
    [record] = state_dir.glob(f"releases-{config.mqtt.run_id}-*-node2.txt")  # the run's experiment's record
    lines = record.read_text().splitlines()
    assert lines[-1].startswith("round 2 ")
    record.write_text("\n".join([*lines[:-1], "round 2 " + "0" * 64]) + "\n")
    with monkeypatch.context() as patch:
        with loopback(patch, NODES, lambda *a: [(a[2], 0)]) as nodes:
            for node in NODES:
                nodes.agents[node] = NodeAgent(node, state_dir=state_dir)
            result = run_experiment(config, out_dir=run_dir, quiet=True, resume=True)
        assert [nodes.agents[n].releases.refused for n in NODES] == [0, 0, 1, 0]
    summary = read_summary(result.run_dir)
    assert summary["status"] == "completed" and summary["rounds"] == 6
    assert under_counts(summary, _own_ledgers(state_dir, config.mqtt.run_id)) == []


def test_a_run_killed_before_its_first_checkpoint_resumes_from_round_0_and_a_fresh_run_says_so(tmp_path, monkeypatch):
    """ACFL's setup upload: the coordinator killed after the nodes logged it, before any checkpoint."""
    run_dir, state_dir = tmp_path / "run", tmp_path / "nodes"
    assert _killed_coordinator(ACFL, run_dir, state_dir, SETUP, "logged") == 9
    assert not (run_dir / "checkpoint.npz").exists()
    config = load_config_text(ACFL)
    with pytest.raises(Exception, match="--resume starts it again from round 0"):
        run_experiment(config, out_dir=run_dir, quiet=True)
    with monkeypatch.context() as patch:
        with loopback(patch, NODES, lambda *a: [(a[2], 0)]) as nodes:
            for node in NODES:
                nodes.agents[node] = NodeAgent(node, state_dir=state_dir)
            result = run_experiment(config, out_dir=run_dir, quiet=True, resume=True)
    assert result.summary["status"] == "completed"
    assert len(result.summary["sessions"]) == 2
    assert under_counts(result.summary, _own_ledgers(state_dir, config.mqtt.run_id)) == []
