"""Invariant 1 across `testbed run --resume`, the gaps issue 27 left (each in sim, with the kill's
checkpoint mark after round 1 or after round 3):

- a node an earlier session asked in a round BEFORE the mark, that straggled (a deadline) and whose
  late reply never reached the ledger (a kill of the coordinator loses it), is charged the round's
  plan at the resume, once (beside its deadline row, no second straggle); a node the round did not ask is not;
- a round re-run after the resume is spent twice: each session that asked it computed and sent it,
  so its compute and communication are charged for each (the killed session's from its rows past
  the mark, or the plan when they were lost), its release (privacy) once;
- a node's budget refusal is kept in refusals.csv: the resume asks the node nothing more (a
  "withdrawn" straggle each round), charges it nothing for the round it refused, and the summary's
  ``refusals`` keeps it; `testbed run`'s table, the HTML report and the watch page show it where
  they show stragglers.
"""

from __future__ import annotations

import dataclasses
import math
from html import escape
import shutil
import tempfile
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from testbed.accounting.budgets import Exceeded
from testbed.assembly.config import load_config_text
from testbed.cli.run import format_summary
from testbed.errors import UserError
from testbed.ledger.files import LedgerWriter, read_ledger
from testbed.orchestration import runner
from testbed.orchestration.runner import run_experiment
from testbed.reports.asked import read_asked
from testbed.reports.html import write_report
from testbed.reports.refusals import RefusalLog, read_refusals
from testbed.reports.results import read_checkpoint, read_summary
from testbed.watch.feed import RunFeed

from run_dir_cases import is_top_up, is_top_up_event, ledger_rows, missed_twice, run_killed, snapshot, under_counted
from test_faults_refusal import RefusingNodes
from test_faults_resume_asked import CONFIG
from test_trust_run_dir import BYTE_DAMAGES, _resume as _resume_cli

NODES = (0, 1, 2)
STRAGGLER = 1
#: killed while saving this checkpoint: the mark is after round KILLED_AT - 1, whose rows lie past it
KILLED_AT = {"mark_after_round_1": 2, "mark_after_round_3": 4}


class ScriptedNodes(RefusingNodes):
    """The run's in-process nodes, of which ``deadline`` ((node, round)) is asked and misses the
    deadline, and ``refuses`` ((node, round)) is asked and refuses for its epsilon budget: as over
    MQTT, both are recorded as asked (asked.csv) and neither releases anything."""

    def __init__(self, inner, deadline: tuple[int, int] | None = None, refuses: tuple[int, int] | None = None):
        super().__init__(inner, dict([refuses]) if refuses else {})
        self.deadline = deadline

    def round(self, state, round_index, excluded, sampled=None, meanwhile=None, asking=None):
        late = {n for n, r in [self.deadline] if r == round_index and n not in excluded} if self.deadline else set()
        now = late | {n for n, at in self.refusals.items() if at == round_index and n not in excluded}

        def asking_all(ctx):  # the missing nodes were asked too
            asking(dataclasses.replace(ctx, expected=tuple(sorted({*ctx.expected, *now}))))

        outcome = super().round(state, round_index, excluded | late, sampled, meanwhile,
                                asking_all if asking is not None else None)
        asked = dataclasses.replace(outcome.ctx, expected=tuple(sorted({*outcome.ctx.expected, *late})))
        return dataclasses.replace(outcome, ctx=asked, straggled={**outcome.straggled, **dict.fromkeys(late, "deadline")})


def _scripted(monkeypatch, **script):
    build = runner.build_nodes
    monkeypatch.setattr(runner, "build_nodes", lambda *a, **k: ScriptedNodes(build(*a, **k), **script))


def _resume(run_dir: Path) -> dict:
    config = load_config_text((run_dir / "config.toml").read_text())
    return run_experiment(config, out_dir=run_dir, quiet=True, resume=True).summary


def _rows_of(run_dir: Path, node: int, round_index: int) -> Counter:
    return Counter((e.kind, getattr(e, "reason", None)) for e in read_ledger(run_dir / "ledger.csv")
                   if e.node == node and e.round == round_index and not is_top_up_event(e))


@pytest.fixture(scope="module")
def full(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("spend") / "full"
    run_experiment(load_config_text(CONFIG), out_dir=d, quiet=True)
    return d


# --- 1. a straggler's late reply to a round before the mark, lost by the kill -------------------

@pytest.mark.parametrize("timing", KILLED_AT)
def test_a_late_reply_to_a_round_before_the_mark_lost_by_the_kill_is_charged_the_plan(full, tmp_path, monkeypatch,
                                                                                      timing):
    """Charged before asked: the straggler's round is charged its plan when it closes, before the
    kill; the resume charges it no second time."""
    killed_at = KILLED_AT[timing]
    straggled_round = killed_at - 2  # the last round before the mark
    d = tmp_path / "run"
    with monkeypatch.context() as mp:
        _scripted(mp, deadline=(STRAGGLER, straggled_round))
        run_killed(load_config_text(CONFIG), d, killed_at)
    # The kill leaves the mark after round killed_at - 1, unless the session's end charged
    # something, which saves the checkpoint again over the rounds done: the straggler's plan,
    # charged at an estimate when its round closed, topped up to a costlier compute the session
    # measured later (charging._estimates_topped_up, which depends on measured seconds: seen when
    # this ran after tests/test_scale_sim.py).
    topped_up = any(is_top_up_event(e) for e in read_ledger(d / "ledger.csv"))
    assert read_checkpoint(d).rounds_done == (killed_at if topped_up else killed_at - 1)
    # The plan, once, beside the round's deadline row: as if its reply had come.
    as_asked = Counter({("straggle", "deadline"): 1, ("compute", None): 1, ("communication", None): 1,
                        ("privacy", None): 1})
    assert _rows_of(d, STRAGGLER, straggled_round) == as_asked

    summary = _resume(d)

    assert summary["status"] == "completed"
    assert _rows_of(d, STRAGGLER, straggled_round) == as_asked
    assert summary["nodes"][str(STRAGGLER)]["epsilon"] == pytest.approx(
        read_summary(full)["nodes"][str(STRAGGLER)]["epsilon"])
    assert not under_counted(d, ledger_rows(full))
    assert not missed_twice(d)
    # The annotation is not a second missed round.
    assert summary["nodes"][str(STRAGGLER)]["rounds_straggled"] == 1
    # A second resume (the finished run) charges it no second time.
    before = ledger_rows(d)
    _resume(d)
    assert ledger_rows(d) == before


@pytest.mark.parametrize("timing", KILLED_AT)
def test_control_a_straggler_the_round_never_asked_is_not_charged(full, tmp_path, monkeypatch, timing):
    """The same straggle as an emulated straggler (never asked: not in asked.csv) is charged nothing
    at the resume: what charges the plan is the record that the node was asked."""
    killed_at = KILLED_AT[timing]
    straggled_round = killed_at - 2
    d = tmp_path / "run"
    real_round = runner.emulated_stragglers

    def straggling(config, algorithm, round_index, node_ids, draws=None):
        extra = {STRAGGLER} if round_index == straggled_round else set()
        return real_round(config, algorithm, round_index, node_ids, draws) | extra

    with monkeypatch.context() as mp:
        mp.setattr(runner, "emulated_stragglers", straggling)
        run_killed(load_config_text(CONFIG), d, killed_at)
    asked = read_asked(d / "asked.csv", NODES, 10)
    assert STRAGGLER not in next(a.nodes for a in asked if a.round == straggled_round)
    _resume(d)
    assert _rows_of(d, STRAGGLER, straggled_round) == Counter({("straggle", "emulated"): 1})


# --- 2. a re-run round's seconds, joules and bytes are spent twice ------------------------------

@pytest.mark.parametrize("rows_past_mark", ["kept", "lost"])
@pytest.mark.parametrize("timing", KILLED_AT)
def test_a_round_run_again_is_charged_its_compute_and_communication_twice_its_release_once(
        full, tmp_path, timing, rows_past_mark):
    killed_at = KILLED_AT[timing]
    rerun = killed_at - 1
    d = tmp_path / "run"
    run_killed(load_config_text(CONFIG), d, killed_at)
    if rows_past_mark == "lost":  # the killed coordinator never logged the round's replies
        mark = read_checkpoint(d).ledger_mark
        with open(d / "ledger.csv", "r+b") as f:
            f.truncate(mark.size_bytes)

    summary = _resume(d)

    extra = Counter(ledger_rows(d)) - Counter(ledger_rows(full))
    assert not under_counted(d, ledger_rows(full))
    assert not missed_twice(d)
    # Exactly one more compute and one more communication row per node, of the re-run round (and
    # the seconds and joules that topped an estimate of the killed session's spend up at the end).
    top_ups = [row for row in extra if is_top_up(row)]
    assert all(row[2] == rerun for row in top_ups) and (rows_past_mark == "lost" or not top_ups)
    extra = Counter({row: n for row, n in extra.items() if not is_top_up(row)})
    assert sorted((kind, node, r) for (kind, node, r, *_), n in extra.items() for _ in range(n)) == \
        sorted((kind, n, rerun) for n in NODES for kind in ("communication", "compute"))
    full_summary = read_summary(full)
    for n in map(str, NODES):
        assert summary["nodes"][n]["epsilon"] == pytest.approx(full_summary["nodes"][n]["epsilon"])
        assert summary["nodes"][n]["bytes_up"] > full_summary["nodes"][n]["bytes_up"]
        assert summary["nodes"][n]["local_steps"] > full_summary["nodes"][n]["local_steps"]


@pytest.mark.parametrize("timing", KILLED_AT)
def test_a_node_that_straggles_the_round_run_again_in_both_sessions_missed_it_once(full, tmp_path, monkeypatch,
                                                                                  timing):
    """Its deadline row of the killed session lies past the mark; the resumed session asks it again,
    it misses the deadline again and nothing of it reached the ledger (its plan is charged): one
    straggle row for the round, whatever reason each session gave, and ``rounds_straggled`` 1."""
    rerun = KILLED_AT[timing] - 1
    d = tmp_path / "run"
    with monkeypatch.context() as mp:
        _scripted(mp, deadline=(STRAGGLER, rerun))
        run_killed(load_config_text(CONFIG), d, KILLED_AT[timing])
        assert _rows_of(d, STRAGGLER, rerun)[("straggle", "deadline")] == 1
        summary = _resume(d)
    rows = _rows_of(d, STRAGGLER, rerun)
    assert sum(n for (kind, _), n in rows.items() if kind == "straggle") == 1, rows
    assert rows[("privacy", None)] == 1  # its plan, as for a reply the kill may have lost
    assert summary["nodes"][str(STRAGGLER)]["rounds_straggled"] == 1
    assert not under_counted(d, ledger_rows(full))
    assert not missed_twice(d)


# --- 3. a refusal is kept across --resume --------------------------------------------------------

@pytest.mark.parametrize("refused_at", ["before_the_mark", "in_the_round_run_again"])
@pytest.mark.parametrize("timing", KILLED_AT)
def test_a_refusal_is_kept_across_the_resume_and_the_node_is_asked_nothing_more(full, tmp_path, monkeypatch, timing,
                                                                                refused_at):
    killed_at = KILLED_AT[timing]
    refused_round = killed_at - 2 if refused_at == "before_the_mark" else killed_at - 1
    d = tmp_path / "run"
    with monkeypatch.context() as mp:
        _scripted(mp, refuses=(STRAGGLER, refused_round))
        run_killed(load_config_text(CONFIG), d, killed_at)
    kept = read_refusals(d / "refusals.csv", NODES, 10)
    assert [(r.round, r.node, r.budget) for r in kept] == [(refused_round, STRAGGLER, "epsilon")]
    sessions = {a.session for a in read_asked(d / "asked.csv", NODES, 10)}

    summary = _resume(d)  # the node's own code would answer: only the record keeps it out

    assert summary["status"] == "completed"
    assert summary["refusals"] == [{"node": STRAGGLER, "round": refused_round, "budget": "epsilon",
                                    "would_be": 9.0, "limit": 1.0}]
    resumed = [a for a in read_asked(d / "asked.csv", NODES, 10) if a.session not in sessions]
    assert resumed and all(STRAGGLER not in a.nodes for a in resumed)
    events = list(read_ledger(d / "ledger.csv"))
    assert not [e for e in events if e.node == STRAGGLER and e.round >= refused_round and e.kind != "straggle"]
    rerun_rounds = range(killed_at - 1, 5)
    assert {e.round for e in events if e.node == STRAGGLER and getattr(e, "reason", None) == "withdrawn"} >= \
        set(rerun_rounds) - {refused_round}
    assert summary["nodes"][str(STRAGGLER)]["epsilon"] < read_summary(full)["nodes"][str(STRAGGLER)]["epsilon"]


# --- refusals.csv read back: checked like every run file ------------------------------------------

_CELL = st.sampled_from(["0", "1", "2", "3", "99", "-1", "1e308", "1e309", "nan", "inf", "-inf", "2.5", "", "x",
                         "epsilon", "energy_j", "a" * 70, str(2**70), "5e-324", "0x10", "1_0", " 1"])


@given(lines=st.lists(st.lists(_CELL, min_size=0, max_size=6).map(",".join), max_size=5),
       cut=st.booleans())
def test_refusals_read_back_are_refusals_of_the_run_or_a_one_line_refusal(tmp_path_factory, lines, cut):
    """Whatever refusals.csv holds: a list of refusals of the run's nodes and rounds, each figure
    finite and each node once, or a one-line UserError naming the file (never another exception)."""
    path = tmp_path_factory.mktemp("refusals") / "refusals.csv"
    text = "round,node,budget,would_be,limit\n" + "".join(f"{line}\n" for line in lines)
    path.write_text(text[:-1] if cut and lines else text)
    try:
        refusals = read_refusals(path, NODES, 4)
    except UserError as exc:
        assert "refusals.csv" in str(exc) and "\n" not in str(exc)
        return
    assert len({r.node for r in refusals}) == len(refusals)
    for r in refusals:
        assert r.node in NODES and 0 <= r.round <= 4 and math.isfinite(r.would_be) and math.isfinite(r.limit)


@given(refusals=st.lists(st.tuples(st.integers(0, 4), st.sampled_from(NODES), st.sampled_from(["epsilon", "energy_j"]),
                                   st.floats(allow_nan=False, allow_infinity=False),
                                   st.floats(allow_nan=False, allow_infinity=False)),
                         max_size=3, unique_by=lambda r: r[1]))
def test_refusals_written_are_read_back_as_written(tmp_path_factory, refusals):
    path = tmp_path_factory.mktemp("refusals") / "refusals.csv"
    log = RefusalLog(path)
    for round_index, node, budget, would_be, limit in refusals:
        log.append(round_index, Exceeded(node, budget, would_be, limit))
    log.close()
    assert [(r.round, r.node, r.budget, r.would_be, r.limit) for r in read_refusals(path, NODES, 4)] == refusals


@pytest.fixture(scope="module")
def refused_killed(tmp_path_factory) -> Path:
    """A run killed with its mark after round 3, node 1 having refused round 2."""
    d = tmp_path_factory.mktemp("refused") / "killed"
    with pytest.MonkeyPatch.context() as mp:
        _scripted(mp, refuses=(STRAGGLER, 2))
        run_killed(load_config_text(CONFIG), d, KILLED_AT["mark_after_round_3"])
    return d


@given(data=st.data())
def test_a_damaged_refusals_file_is_refused_in_one_line_or_the_resume_completes(refused_killed, data):
    """refusals.csv damaged as test_trust_run_dir damages every run file: `testbed run --resume`
    refuses in one line naming it (nothing changed) or completes (a refusal it lost only asks the
    node again: nothing is under-counted)."""
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp) / "run"
        shutil.copytree(refused_killed, d)
        damaged = BYTE_DAMAGES[data.draw(st.sampled_from(sorted(BYTE_DAMAGES)), label="damage")](
            data, (d / "refusals.csv").read_bytes())
        if damaged is None:
            (d / "refusals.csv").unlink()
        else:
            (d / "refusals.csv").write_bytes(damaged)
        before = snapshot(d)
        rc, err = _resume_cli(d)
        assert "Traceback" not in err, err
        if rc != 0:
            assert rc == 2 and "\n" not in err and err.startswith("testbed: ") and "refusals.csv" in err, err
            assert snapshot(d) == before
            return
        assert read_summary(d)["status"] == "completed"


# --- 4. where stragglers are shown, refusals are too ----------------------------------------------

@pytest.mark.parametrize("timing", KILLED_AT)
def test_the_summary_table_the_html_report_and_the_watch_page_show_the_refusal(tmp_path, monkeypatch, timing):
    """After the resume: `testbed run`'s table, the HTML report's facts and node table, and the watch
    page's node row and run info name node 1's refusal (its round counted from 1, as progress is)."""
    killed_at = KILLED_AT[timing]
    refused_round = killed_at - 2
    d = tmp_path / "run"
    with monkeypatch.context() as mp:
        _scripted(mp, refuses=(STRAGGLER, refused_round))
        run_killed(load_config_text(CONFIG), d, killed_at)
    summary = _resume(d)
    shown = f"node {STRAGGLER} in round {refused_round + 1} (epsilon 9 > 1)"
    assert f"refusals     1 node(s) refused a round for their own budget, asked nothing more: {shown}" in \
        format_summary(summary).splitlines()
    html = write_report(d).read_text()
    assert ">refused</th>" in html and f"<td>round {refused_round + 1}</td>" in html and escape(shown) in html
    feed = RunFeed(d)
    feed.poll()
    snap = feed.snapshot()
    rows = {row["id"]: row for row in snap["nodes"]}
    assert rows[STRAGGLER]["refused_round"] == refused_round + 1
    assert all(rows[n]["refused_round"] is None for n in NODES if n != STRAGGLER)
    assert snap["run"]["refusals"] == 1 and snap["run"]["error"] is None


@pytest.mark.parametrize("damage", ["node_of_another_run", "huge"])
def test_the_watch_page_names_a_damaged_refusals_file_and_shows_no_refusal(refused_killed, tmp_path, damage):
    d = tmp_path / "run"
    shutil.copytree(refused_killed, d)
    if damage == "huge":
        with open(d / "refusals.csv", "a") as f:
            f.write("2,0,epsilon,9.0,1.0\n" * 1000)
    else:
        (d / "refusals.csv").write_text("round,node,budget,would_be,limit\n2,7,epsilon,9.0,1.0\n")
    feed = RunFeed(d)
    feed.poll()
    snap = feed.snapshot()
    assert "refusals.csv" in snap["run"]["errors"] and snap["run"]["refusals"] == 0
    assert all(row["refused_round"] is None for row in snap["nodes"])


# --- 5. a node's report covers every session of the run it kept -------------------------------

def _write_ledger(path, events) -> None:
    writer = LedgerWriter(path)
    writer.write(events)
    writer.close()


@pytest.mark.parametrize("cut", [False, True])
def test_a_nodes_report_totals_every_session_of_the_run_the_stop_names(tmp_path, cut):
    """A killed session's spend the coordinator never heard is in the node's report at the stop:
    its totals merge the state directory's ledgers of the sessions the stop names (spend per
    session, each release once), and leave out another run of the same id (a session the stop
    does not name), other nodes and a last line cut by the kill."""
    from nodes.agent import NodeAgent
    from testbed.ledger.events import ComputeEvent, GaussianEvent
    from testbed.mqtt import wire
    from testbed.rounds import protocol

    def spent(node, joules):
        return [ComputeEvent(node=node, round=0, local_steps=1, energy_j=joules),
                GaussianEvent(node=node, round=0, sigma=1.0, sensitivity=0.1, count=1)]

    killed, same_id_other_run, now = "a" * 16, "b" * 16, "d" * 16
    _write_ledger(tmp_path / f"ledger-run-{killed}-node3.csv", spent(3, 5.0))
    _write_ledger(tmp_path / f"ledger-run-{same_id_other_run}-node3.csv", spent(3, 100.0))
    _write_ledger(tmp_path / f"ledger-run-{killed}-node4.csv", spent(4, 100.0))
    if cut:
        with open(tmp_path / f"ledger-run-{killed}-node3.csv", "a") as f:
            f.write("compute,3,1")  # the kill cut the row it was writing: never released
    agent = NodeAgent(3, state_dir=tmp_path)
    ledger, writer = agent._ledger("run", now)
    events = spent(3, 1.0)
    ledger.extend(events)
    writer.write(events)
    stop = wire.decode(protocol.stop("run", now, "completed", 0, earlier_sessions=[killed]))
    totals = protocol.report_of(wire.decode(agent.handle(stop).payload)).totals
    alone = protocol.report_of(wire.decode(agent.handle(
        wire.decode(protocol.stop("run", now, "completed", 0))).payload)).totals
    agent.close()
    assert totals.energy_j == pytest.approx(6.0)  # both sessions' compute
    assert totals.local_steps == 2
    assert alone.energy_j == pytest.approx(1.0)  # a stop naming no earlier session: this one's


@given(names=st.lists(st.text(max_size=20), max_size=5))
def test_a_stop_names_only_ids_as_earlier_sessions(names):
    from testbed.mqtt import wire
    from testbed.rounds import protocol

    msg = wire.decode(protocol.stop("run", "a" * 16, "completed", 0, earlier_sessions=names))
    if all(wire.ID_PATTERN.fullmatch(n) for n in names):
        assert protocol.earlier_sessions_of(msg) == tuple(names)
    else:
        with pytest.raises(wire.WireError):
            protocol.earlier_sessions_of(msg)


def test_a_node_without_a_state_directory_reports_its_session():
    from nodes.agent import NodeAgent
    from testbed.ledger.events import ComputeEvent

    agent = NodeAgent(0)
    ledger, _ = agent._ledger("run", "e" * 16)
    ledger.extend([ComputeEvent(node=0, round=0, local_steps=1, energy_j=2.0)])
    assert agent._run_totals("run", "e" * 16, ledger, ["a" * 16]).energy_j == 2.0
