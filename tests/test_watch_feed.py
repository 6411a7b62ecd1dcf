"""What `testbed watch`'s page is fed (testbed.watch.feed), the terminal's progress line, and
report.html: each checked against what the run itself wrote (summary.json, metrics.csv, ledger.csv)."""

from __future__ import annotations

import csv
import io
import json
import math
import re

import numpy as np
import pytest

from testbed.accounting.budgets import Budgets
from testbed.assembly.config import load_config_text, replace
from testbed.ledger.files import read_ledger
from testbed.orchestration.runner import run_experiment
from testbed.reports.html import write_report
from testbed.reports.progress import Progress, worst_budget
from testbed.watch.feed import RunFeed


@pytest.fixture
def finished_run(tmp_path, small_config_text):
    config = load_config_text(small_config_text + '\n[budget]\nepsilon = 50.0\ncost_units = 1000.0\n'
                                                  '[stragglers]\nmodel = "bernoulli"\np = 0.3\n')
    config = replace(config, dp_pasgd={"steps": 40})
    return run_experiment(config, out_dir=tmp_path / "run", quiet=True)


def test_snapshot_of_a_finished_run_is_what_the_run_wrote(finished_run):
    run_dir, summary = finished_run.run_dir, finished_run.summary
    feed = RunFeed(run_dir)
    assert feed.poll() is not None and feed.poll() is None  # nothing new: no delta
    snap = json.loads(json.dumps(feed.snapshot(), allow_nan=False))  # JSON as the page gets it
    assert snap["run"]["status"] == "completed" and snap["run"]["rounds_done"] == summary["rounds"]
    settings = summary["algorithm_settings"]
    assert snap["run"]["rounds_planned"] == settings["steps_planned"] // settings["tau"] == 8
    assert snap["budgets"]["epsilon"] == 50.0 and snap["budgets"]["cost_units"] == 1000.0
    with open(run_dir / "metrics.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [m["round"] for m in snap["metrics"]] == [float(r["round"]) for r in rows]
    assert [m["test_accuracy"] for m in snap["metrics"]] == [float(r["test_accuracy"]) for r in rows]
    assert [m["stragglers"] for m in snap["metrics"]] == [float(r["stragglers"]) for r in rows]
    assert len(snap["nodes"]) == len(summary["nodes"])
    for row in snap["nodes"]:
        node = summary["nodes"][str(row["id"])]
        assert row["epsilon"] == pytest.approx(node["epsilon"], rel=1e-12)
        assert row["epsilon_by"] == pytest.approx(node["epsilon_by_observer"], rel=1e-12)
        assert row["energy_j"] == pytest.approx(node["energy_j"], rel=1e-12)
        assert row["cost_units"] == pytest.approx(node["cost_units"], rel=1e-12)
        assert row["bytes"] == node["bytes_up"] + node["bytes_down"]
        assert (row["rounds"], row["straggled"]) == (node["rounds"], node["rounds_straggled"])
        assert row["board"] == "sim · host" and row["measured"] is False


def test_node_state_follows_the_last_round(finished_run):
    run_dir = finished_run.run_dir
    events = list(read_ledger(run_dir / "ledger.csv"))
    last = max(e.round for e in events)
    straggled = {e.node for e in events if e.kind == "straggle" and e.round == last}
    feed = RunFeed(run_dir)
    feed.poll()
    states = {row["id"]: row["state"] for row in feed.snapshot()["nodes"]}
    assert states == {n: "straggling" if n in straggled else "online" for n in states}
    assert sum(r["stragglers"] for r in feed.metrics) == sum(e.kind == "straggle" for e in events) > 0
    feed.node_status(0, online=False)  # its will on the status topic: offline now, whatever the ledger says
    delta = feed.poll()
    assert [(n["id"], n["state"]) for n in delta["nodes"]] == [(0, "offline")]


def test_deltas_carry_only_what_changed_and_never_a_cut_line(finished_run, tmp_path):
    """The run's files copied over in pieces, cut mid-line, as a live run leaves them."""
    src, live = finished_run.run_dir, tmp_path / "live"
    live.mkdir()
    (live / "config.toml").write_bytes((src / "config.toml").read_bytes())
    feed = RunFeed(live)
    first = feed.poll()
    assert first["run"]["status"] == "running" and first["metrics"] == [] and len(first["nodes"]) == 4
    ledger = (src / "ledger.csv").read_bytes().splitlines(keepends=True)
    metrics = (src / "metrics.csv").read_bytes().splitlines(keepends=True)
    round0 = [line for line in ledger[1:] if line.split(b",")[2] == b"0"]
    only_node1 = [line for line in round0 if line.split(b",")[1] == b"1"]
    with open(live / "ledger.csv", "wb") as f:
        f.write(ledger[0] + only_node1[0][:7])  # the header and a row cut short
    assert feed.poll() is None
    with open(live / "ledger.csv", "ab") as f:
        f.write(only_node1[0][7:])
    delta = feed.poll()
    assert [n["id"] for n in delta["nodes"]] == [1] and delta["nodes"][0]["cost_units"] > 0
    with open(live / "metrics.csv", "wb") as f:
        f.write(metrics[0] + metrics[1])
    delta = feed.poll()
    assert len(delta["metrics"]) == 1 and delta["nodes"] == [] and delta["run"]["rounds_done"] == 1
    assert delta["version"] > first["version"]
    (live / "metrics.csv").write_bytes(metrics[0])  # --resume dropped a row: the page starts again
    assert feed.poll() == {"reset": True, "version": feed.version}
    assert feed.snapshot()["metrics"] == []


def test_a_run_that_stops_growing_is_stalled_and_a_dead_coordinator_killed(finished_run, tmp_path):
    live = tmp_path / "live"
    live.mkdir()
    (live / "config.toml").write_bytes((finished_run.run_dir / "config.toml").read_bytes())
    now = [1000.0]
    feed = RunFeed(live, clock=lambda: now[0])
    assert feed.poll()["run"]["status"] == "running"
    now[0] += 31.0
    assert feed.poll()["run"]["status"] == "stalled"
    feed.coordinator_status(online=False)
    assert feed.poll()["run"]["status"] == "killed"


def test_a_budget_stop_names_the_node_and_the_budget(tmp_path, small_config_text):
    config = load_config_text(small_config_text + "\n[budget]\nepsilon = 1.0\n")
    result = run_experiment(config, out_dir=tmp_path / "run", quiet=True)
    assert result.summary["status"] == "stopped_budget"
    feed = RunFeed(result.run_dir)
    feed.poll()
    run = feed.snapshot()["run"]
    assert run["status"] == "stopped_budget" and run["stopped"] == result.summary["stopped"]
    assert run["stopped"]["budget"] == "epsilon"


DWFL = """
[run]
name = "w"
algorithm = "dwfl"
seed = 3
[data]
dataset = "synthetic"
num_nodes = 5
samples_per_node = 40
dim = 4
[dwfl]
rounds = 3
batch = 8
lr = 0.3
epsilon = 0.5
fading = "rayleigh"
c_scale = 0.7
[output]
figures = false
"""


def test_dwfl_gain_and_snr_are_the_runs_channel(tmp_path):
    result = run_experiment(load_config_text(DWFL), out_dir=tmp_path / "run", quiet=True)
    settings = result.summary["algorithm_settings"]  # time-invariant channel: round 0's is every round's
    feed = RunFeed(result.run_dir)
    feed.poll()
    nodes = feed.snapshot()["nodes"]
    gains = np.array(settings["gains"])
    assert [n["gain"] for n in nodes] == pytest.approx(gains.tolist(), rel=1e-12)
    snr = 10 * np.log10(gains**2 * settings["power_w"] / settings["noise_power_w"])
    assert [n["snr_db"] for n in nodes] == pytest.approx(snr.tolist(), rel=1e-12)


def test_worst_budget_is_the_largest_fraction():
    b = Budgets(epsilon=4.0, cost_units=1000.0, bytes=10_000)
    assert worst_budget(b, {"epsilon": 1.0, "cost_units": 100.0, "bytes_total": 9_000}) == ("bytes", 0.9)
    assert worst_budget(Budgets(), {"epsilon": 1.0, "cost_units": 1.0, "bytes_total": 1}) is None


def test_progress_lines_off_a_terminal():
    out = io.StringIO()
    p = Progress(20, stream=out, budgets=Budgets(epsilon=4.0))
    for r in range(1, 21):
        p.update(r, 0.5, 0.1 * r, {"epsilon": 0.1 * r, "cost_units": 0, "bytes_total": 0})
    p.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 11  # the first round, then a line per tenth of the run
    assert re.fullmatch(r"round 20/20  \S+ rounds/s  \S+s, 0\.0s left  loss 0\.5000 ε 2 budget ε 50%", lines[-1])


def test_report_html_is_self_contained(finished_run):
    path = write_report(finished_run.run_dir)
    text = path.read_text()
    assert not re.search(r"""(src|href)=["']?(https?:)?//""", text)  # no remote resource
    assert not re.search(r"<script|<link", text)
    assert text.count('src="data:image/png;base64,') == 3  # progress, cost, epsilon
    assert text.count("<tr>") >= 4 + 1  # every node's row
    for node, n in finished_run.summary["nodes"].items():
        assert f"<td>{n['cost_units']:.4g}</td>" in text


def test_report_html_of_a_sweep(tmp_path, small_config_text):
    from testbed.orchestration.sweep import grid_points, run_sweep

    base = load_config_text(small_config_text)
    rows = run_sweep(base, grid_points({"dp_pasgd.tau": [2, 5]}, repeats=1, base_seed=0), tmp_path / "sw",
                     workers=1, quiet=True)
    text = write_report(tmp_path / "sw").read_text()
    # the grid's two figures, then the means with interval bars and the curves with interval bands
    # (issue 29's sweep statistics: testbed/reports/sweep_figures.py)
    assert text.count('src="data:image/png;base64,') == 4
    for row in rows:
        assert f"<td>{row['test_accuracy']:.4g}</td>" in text
    assert not math.isnan(rows[0]["test_accuracy"])


@pytest.mark.parametrize("argv,words", [
    (["watch", "RUN", "--port", "0"], "--port: must be >= 1, got 0"),
    (["watch", "RUN", "--host", "example.org"], "--host must be an IP address"),
    (["run", "FILE", "--watch", "--port", "70000"], "--port: must be <= 65535, got 70000"),
    (["report", "RUN", "--html"], "neither summary.json"),
])
def test_watch_and_report_refuse_bad_input_in_one_line(capsys, tmp_path, small_config_file, argv, words):
    from testbed.cli import main

    argv = [str(tmp_path) if a == "RUN" else str(small_config_file) if a == "FILE" else a for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("testbed: ") and words in err and "\n" not in err


def test_watch_refuses_a_port_in_use(capsys, tmp_path):
    import socket

    from testbed.cli import main

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        assert main(["watch", str(tmp_path), "--port", str(s.getsockname()[1])]) == 2
    assert "cannot listen on 127.0.0.1:" in capsys.readouterr().err


def test_progress_bar_on_a_terminal_is_richs():
    """On a pseudo-terminal: rich's bar, redrawn in place, with the rate, time left and worst budget."""
    import os
    import threading

    import fcntl
    import struct
    import termios

    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))  # an 80-column terminal
    written = bytearray()

    def drain() -> None:
        try:
            while chunk := os.read(master, 65536):
                written.extend(chunk)
        except OSError:
            pass

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    with os.fdopen(slave, "w") as tty:
        p = Progress(3, stream=tty, budgets=Budgets(cost_units=100.0))
        for r in range(1, 4):
            p.update(r, 0.25, 0.5, {"epsilon": 0.5, "cost_units": 30.0 * r, "bytes_total": 0})
        p.close()
    reader.join(timeout=5)
    os.close(master)
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", written.decode())
    last = text.replace("\r", "\n").strip().splitlines()[-1]
    assert re.search(r"round 3/3 .* rounds/s .*left loss 0\.2500 ε 0\.5 budget cost 90%", last), last


def test_rounds_without_evaluation_have_no_accuracy(tmp_path, small_config_text):
    """output.eval_every = 2: the rounds between evaluations reach the page as nulls (gaps), not 0."""
    config = replace(load_config_text(small_config_text), output={"eval_every": 2}, dp_pasgd={"steps": 25})
    result = run_experiment(config, out_dir=tmp_path / "run", quiet=True)
    feed = RunFeed(result.run_dir)
    feed.poll()
    metrics = json.loads(json.dumps(feed.snapshot()["metrics"], allow_nan=False))
    assert [m["test_accuracy"] is None for m in metrics] == [True, False, True, False, False]
    assert metrics[-1]["test_accuracy"] == pytest.approx(result.summary["final"]["test_accuracy"], rel=1e-12)


def test_garbage_in_the_run_files_is_one_line_on_the_page_and_used_for_nothing(finished_run, tmp_path):
    """A damaged summary is not shown as the run's, a garbage ledger row charges no node, a metrics
    row that is not numbers plots nothing: each is the page's one-line error."""
    import shutil

    run_dir = tmp_path / "damaged"
    shutil.copytree(finished_run.run_dir, run_dir)
    summary = json.loads((run_dir / "summary.json").read_text())
    summary["nodes"]["0"]["epsilon"] = 0.0  # under-reported, its sha256 no longer matches
    (run_dir / "summary.json").write_text(json.dumps(summary))
    feed = RunFeed(run_dir)
    feed.poll()
    error = feed.snapshot()["run"]["error"]
    assert "summary.json: unverified" in error and "\n" not in error
    assert feed.summary is None
    before = feed.snapshot()
    with open(run_dir / "ledger.csv", "a") as f:
        f.write("privacy,0,3,garbage\r\n")
    with open(run_dir / "metrics.csv", "a") as f:
        f.write(",".join(["x"] * len(list(csv.reader(open(run_dir / "metrics.csv")))[0])) + "\r\n")
    feed.poll()
    after = feed.snapshot()
    assert "\n" not in after["run"]["error"] and after["run"]["error"] != error
    assert after["metrics"] == before["metrics"]
    assert [n["epsilon"] for n in after["nodes"]] == [n["epsilon"] for n in before["nodes"]]


# ---- a killed coordinator: seen at the next poll, its nodes shown as what they are -------------------

def _metric_rows(run_dir) -> int:
    path = run_dir / "metrics.csv"
    return max(len(path.read_text().splitlines()) - 1, 0) if path.exists() else 0


@pytest.mark.parametrize("kill_after_rows", [1, 6])
def test_a_killed_run_is_killed_at_the_next_poll_and_its_sim_nodes_offline(small_config_text, tmp_path,
                                                                            kill_after_rows):
    import os
    import signal
    import subprocess
    import sys
    import time

    from conftest import REPO

    (tmp_path / "exp.toml").write_text(small_config_text.replace("steps = 20", "steps = 200000"))
    run_dir = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "testbed", "run", str(tmp_path / "exp.toml"), "--out", str(run_dir),
                             "--quiet"], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        deadline = time.monotonic() + 60
        while _metric_rows(run_dir) < kill_after_rows and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.02)
        feed = RunFeed(run_dir)
        assert feed.poll()["run"]["status"] == "running"
        assert {row["state"] for row in feed.snapshot()["nodes"]} <= {"online", "straggling"}
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    started = time.monotonic()
    delta = feed.poll()
    assert time.monotonic() - started < 2.0
    assert delta["run"]["status"] == "killed" and not (run_dir / "summary.json").exists()
    assert len(delta["nodes"]) == 4  # every row again: the states changed
    assert {(row["state"], row["why"]) for row in delta["nodes"]} == {
        ("offline", "the run's coordinator is gone (and the nodes it ran)")}


def _copied_live(finished_run, tmp_path):
    """A run directory that looks alive: its config and logs, no summary."""
    live = tmp_path / "live"
    live.mkdir()
    for name in ("config.toml", "metrics.csv", "ledger.csv"):
        (live / name).write_bytes((finished_run.run_dir / name).read_bytes())
    return live


def _dead_pid() -> int:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(done.stdout)


@pytest.mark.parametrize("holder", ["dead", "alive", "released"])
def test_the_run_directory_lock_tells_a_killed_coordinator(finished_run, tmp_path, holder):
    from testbed.util.dirlock import DirectoryLock

    live = _copied_live(finished_run, tmp_path)
    lock = None
    if holder == "dead":
        (live / ".lock").write_text(f"{_dead_pid()}\n")  # what a SIGKILL leaves: its pid, no flock
    elif holder == "alive":
        lock = DirectoryLock(live)
    else:
        (live / ".lock").write_text("")  # a run that released it (finished, or not yet started)
    try:
        run = RunFeed(live).poll()["run"]
    finally:
        if lock is not None:
            lock.release()
    assert run["status"] == ("killed" if holder == "dead" else "running"), run


@pytest.mark.parametrize("status", [None, "online", "offline"])
def test_a_real_board_of_a_killed_run_is_what_its_status_topic_says_else_unknown(finished_run, tmp_path, status):
    # Real boards (mqtt.emulated = false) outlive their coordinator: their last round says nothing now.
    text = (finished_run.run_dir / "config.toml").read_text()
    text = text.replace('mode = "sim"', 'mode = "mqtt"').replace("emulated = true", "emulated = false")
    live = _copied_live(finished_run, tmp_path)
    (live / "config.toml").write_text(text)
    (live / ".lock").write_text(f"{_dead_pid()}\n")
    feed = RunFeed(live)
    if status is not None:
        feed.node_status(2, status == "online")
    feed.poll()
    states = {row["id"]: row["state"] for row in feed.snapshot()["nodes"]}
    assert feed.snapshot()["run"]["status"] == "killed"
    assert states[2] == (status or "unknown")
    assert {states[n] for n in (0, 1, 3)} == {"unknown"}


@pytest.mark.parametrize("where", ["a taken port", "an address not of this machine"])
def test_run_watch_refuses_a_page_that_cannot_listen_before_the_run(tmp_path, small_config_file, where):
    """`testbed run --watch` with a port another program holds, or an address this machine does not
    have: one line naming it, exit 2, before round 1 (no run directory is written)."""
    import socket
    import subprocess
    import sys

    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    host = "127.0.0.1" if where == "a taken port" else "192.0.2.1"  # TEST-NET-1: never a local address
    out = tmp_path / "run"
    try:
        done = subprocess.run([sys.executable, "-m", "testbed", "run", str(small_config_file), "--mode", "sim",
                               "--watch", "--host", host, "--port", str(port), "--out", str(out)],
                              capture_output=True, text=True, timeout=120)
    finally:
        holder.close()
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1 and lines[0].startswith("testbed: --watch: cannot listen on"), done.stderr
    assert not (out / "metrics.csv").exists()
