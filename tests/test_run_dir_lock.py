"""One writer per run directory (testbed.util.dirlock): a run or a resume holds an OS file lock on its
directory; a second writer is refused in one line naming the holder's pid and changes nothing; a
lock left by a killed process, or kept by a child it forked, never blocks the next resume.

The holder is a real `testbed run --resume` in another process, paused (it waits for a line on its
stdin) once it holds the lock: before its first round, or after the first round it ran and
checkpointed. Waiting is event-driven: the holder says "locked" when it is, and the test waits for
that line, then for the process to end.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

from testbed.assembly.config import load_config_text
from testbed.cli import main
from testbed.errors import UserError
from testbed.orchestration.runner import run_experiment
from testbed.reports.results import RunDirectory, read_summary
from testbed.util.dirlock import LOCK_NAME, DirectoryLock, holder_pid

from run_dir_cases import ledger_rows, run_killed, snapshot, spent_once

CONFIG = """
[run]
name = "lock"
seed = 5
[data]
dataset = "synthetic"
num_nodes = 3
samples_per_node = 20
dim = 4
[dp_pasgd]
steps = 16
tau = 2
batch = 4
lr = 0.5
sigma = 1.0
clip = true           # G = 1 below the logistic model's own bound 2: held by clipping (issue 39)
lipschitz = 1.0
[privacy]
tight_accountant = "none"
[output]
figures = false
checkpoint_every = 1
"""
ROUNDS, KILLED_AT = 8, 3

# A `testbed run --resume RUN_DIR` that stops once it holds the lock (argv: RUN_DIR, where), says
# "locked <pid>" and waits for a line on stdin. where: "before_rounds", or "after_a_round" (its
# first round run, charged and checkpointed).
HOLDER = textwrap.dedent("""
    import os, sys
    from testbed.cli import main
    from testbed.orchestration import runner
    from testbed.reports.results import RunDirectory

    run_dir, where = sys.argv[1], sys.argv[2]

    def pause():
        print("locked", os.getpid(), flush=True)
        sys.stdin.readline()

    if where == "before_rounds":
        real_rounds = runner.run_rounds
        def run_rounds(*args, **kwargs):
            pause()
            return real_rounds(*args, **kwargs)
        runner.run_rounds = run_rounds
    else:
        real_save = RunDirectory.save_checkpoint
        def save_checkpoint(self, *args, **kwargs):
            real_save(self, *args, **kwargs)
            if not getattr(self, "paused", False):
                self.paused = True
                pause()
        RunDirectory.save_checkpoint = save_checkpoint
    sys.exit(main(["run", "--resume", run_dir, "--quiet"]))
""")

# Holds RUN_DIR's lock (argv: RUN_DIR, how), forks a child that sleeps, says "locked <pid> <child
# pid>" and sleeps. how: "os.fork", "multiprocessing" (a fork-context Process), or "leaky" (the
# control: the descriptor hidden from testbed.util.dirlock's fork hook, so the child keeps the lock).
FORKING_HOLDER = textwrap.dedent("""
    import multiprocessing, os, sys, time
    from testbed.util import dirlock

    run_dir, how = sys.argv[1], sys.argv[2]
    lock = dirlock.DirectoryLock(run_dir)
    if how == "leaky":
        dirlock._held.discard(lock._fd)
    # The child says it runs (its fork hooks, which close the lock's descriptor, ran before) only
    # then is the holder ready: else a kill right after the fork could race the child's hooks.
    started_r, started_w = os.pipe()

    def child_body():
        os.write(started_w, b"x")
        time.sleep(600)

    if how == "multiprocessing":
        child = multiprocessing.get_context("fork").Process(target=child_body)
        child.start()
        child_pid = child.pid
    else:
        child_pid = os.fork()
        if child_pid == 0:
            child_body()
            os._exit(0)
    os.read(started_r, 1)
    print("locked", os.getpid(), child_pid, flush=True)
    time.sleep(600)
""")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """The uninterrupted run ("full") and one killed while checkpointing round KILLED_AT ("killed")."""
    base = tmp_path_factory.mktemp("runs")
    config = load_config_text(CONFIG)
    run_experiment(config, out_dir=base / "full", quiet=True)
    run_killed(config, base / "killed", KILLED_AT)
    return {"full": base / "full", "killed": base / "killed"}


@pytest.fixture
def killed(runs, tmp_path) -> Path:
    """A copy of the killed run, to resume."""
    d = tmp_path / "run"
    shutil.copytree(runs["killed"], d)
    return d


class Holder:
    """A process started from ``source`` that holds the lock of a run directory once it printed
    "locked PID [CHILD_PID]"."""

    def __init__(self, source: str, *args: str):
        self.proc = subprocess.Popen([sys.executable, "-c", source, *map(str, args)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline().split()  # blocks until the holder has the lock (or died)
        if not line or line[0] != "locked":
            self.proc.kill()
            raise AssertionError(f"the holder did not take the lock: {self.proc.communicate()[1][-2000:]}")
        self.pid = int(line[1])
        self.child_pid = int(line[2]) if len(line) > 2 else None

    def go_on(self) -> tuple[int, str]:
        """Let a paused resume finish; its exit code and stderr."""
        _, err = self.proc.communicate("\n", timeout=120)
        return self.proc.returncode, err

    def kill(self) -> None:
        self.proc.kill()  # SIGKILL: nothing of the process runs again, the kernel drops its locks
        self.proc.wait(timeout=60)  # not its pipes: a child it forked may hold them open
        for pipe in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            pipe.close()


def _resume(run_dir: Path, capsys) -> tuple[int, str]:
    capsys.readouterr()
    rc = main(["run", "--resume", str(run_dir), "--quiet"])
    return rc, capsys.readouterr().err.strip()


def _assert_refused_naming(rc: int, err: str, pid: int) -> None:
    assert rc == 2, err
    assert "\n" not in err and err.startswith("testbed: ") and "Traceback" not in err, err
    assert f"(pid {pid})" in err and "being written by another process" in err, err


@pytest.mark.parametrize("where", ["before_rounds", "after_a_round"])
def test_a_second_resume_is_refused_naming_the_first_and_the_ledger_is_not_doubled(killed, runs, where, capsys):
    first = Holder(HOLDER, killed, where)
    try:
        assert holder_pid(killed) == first.pid
        before = snapshot(killed)
        rc, err = _resume(killed, capsys)
        _assert_refused_naming(rc, err, first.pid)
        assert snapshot(killed) == before  # the refused resume changed nothing
    finally:
        rc, err = first.go_on()
    assert rc == 0, err
    assert spent_once(ledger_rows(killed)) == ledger_rows(runs["full"])  # each release charged once
    assert holder_pid(killed) is None  # released: the lock file is empty again
    rc, err = _resume(killed, capsys)  # the finished run resumes (no round to run) once it is free
    assert rc == 0, err
    assert spent_once(ledger_rows(killed)) == ledger_rows(runs["full"])


@pytest.mark.parametrize("where", ["before_rounds", "after_a_round"])
def test_a_killed_holders_lock_never_blocks_the_resume(killed, runs, where, capsys):
    first = Holder(HOLDER, killed, where)
    first.kill()
    assert holder_pid(killed) == first.pid  # its pid is still written: a stale lock file
    rc, err = _resume(killed, capsys)
    assert rc == 0, err
    assert spent_once(ledger_rows(killed)) == ledger_rows(runs["full"])
    s = read_summary(killed)
    assert (s["status"], s["rounds"]) == ("completed", ROUNDS)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("how", ["os.fork", "multiprocessing", "leaky"])
def test_a_forked_child_does_not_keep_the_lock_of_its_dead_parent(killed, how):
    holder = Holder(FORKING_HOLDER, killed, how)
    try:
        with pytest.raises(UserError, match=f"pid {holder.pid}"):
            DirectoryLock(killed)
        holder.kill()
        assert _alive(holder.child_pid)  # the child outlives its parent, as a stuck host would
        if how == "leaky":  # the control: a child that shares the descriptor keeps the lock
            with pytest.raises(UserError, match="being written by another process"):
                DirectoryLock(killed)
        else:
            with DirectoryLock(killed):
                pass
    finally:
        if _alive(holder.child_pid):
            os.kill(holder.child_pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while True:  # the child (not ours to reap) is gone once its lock is: then the control's is free
        try:
            DirectoryLock(killed).release()
            break
        except UserError:
            assert time.monotonic() < deadline, "the lock outlived every process that held it"
            time.sleep(0.05)


def test_writers_of_a_held_run_directory_are_refused_naming_the_pid(runs, tmp_path, capsys):
    """A new run into the directory, `testbed report` and `report --html`: each refused in one line
    while this process holds the lock, and each works once it is released."""
    d = tmp_path / "run"
    shutil.copytree(runs["full"], d)
    experiment = tmp_path / "exp.toml"
    experiment.write_text(CONFIG)
    lock = DirectoryLock(d)
    before = snapshot(d)
    for argv in (["run", str(experiment), "--out", str(d), "--quiet"], ["report", str(d)],
                 ["report", str(d), "--html"], ["run", "--resume", str(d), "--quiet"]):
        capsys.readouterr()
        rc = main(argv)
        _assert_refused_naming(rc, capsys.readouterr().err.strip(), os.getpid())
    assert snapshot(d) == before
    lock.release()
    assert main(["report", str(d)]) == 0
    assert main(["report", str(d), "--html"]) == 0
    assert (d / "report.html").exists() and holder_pid(d) is None


def test_a_failure_after_the_directory_is_opened_releases_its_lock(tmp_path, monkeypatch):
    """In one process (the Python API), a run that fails after it opened its directory leaves it
    free: its resume in the same process is not refused."""
    import testbed.orchestration.runner as runner

    def broken(run):
        raise RuntimeError("evaluation broke")

    monkeypatch.setattr(runner, "evaluate_run", broken)
    config = load_config_text(CONFIG)
    with pytest.raises(RuntimeError, match="evaluation broke"):
        run_experiment(config, out_dir=tmp_path / "run", quiet=True)
    assert holder_pid(tmp_path / "run") is None
    DirectoryLock(tmp_path / "run").release()


def test_two_sweeps_into_one_folder_one_refused_and_a_sweep_of_two_runs_works(tmp_path, capsys):
    from testbed.orchestration.sweep import grid_points, run_sweep

    base = load_config_text(CONFIG)
    points = grid_points({"dp_pasgd.tau": [2, 4]}, repeats=1, base_seed=0)
    out = tmp_path / "sweep"
    out.mkdir()
    with DirectoryLock(out, "sweep folder"):
        with pytest.raises(UserError, match=f"pid {os.getpid()}.*one writer per sweep folder"):
            run_sweep(base, points, out, workers=2, quiet=True)
    assert not (out / "sweep.csv").exists()
    rows = run_sweep(base, points, out, workers=2, quiet=True)  # two runs in two worker processes
    assert [r["status"] for r in rows] == ["completed", "completed"]
    for p in points:
        tau = dict(p.values)["dp_pasgd.tau"]
        assert read_summary(out / p.name)["rounds"] == 16 // tau  # dp_pasgd.steps / tau
        assert holder_pid(out / p.name) is None
    assert holder_pid(out) is None


def test_a_sweep_does_not_clear_a_point_that_a_resume_holds(runs, tmp_path):
    from testbed.orchestration.sweep import Point, run_sweep

    base = load_config_text(CONFIG)
    point = Point((("dp_pasgd.tau", 2),), 0)
    shutil.copytree(runs["killed"], tmp_path / point.name)  # unfinished: the sweep would clear it
    before = snapshot(tmp_path / point.name)
    with DirectoryLock(tmp_path / point.name):
        with pytest.raises(UserError, match=f"pid {os.getpid()}"):
            run_sweep(base, [point], tmp_path, workers=1, quiet=True)
    assert snapshot(tmp_path / point.name) == before


# --- the lock file itself: garbage in it, or something else in its place -----------------------

@given(content=st.binary(max_size=80) | st.integers(-2**70, 2**70).map(lambda n: f" {n}\n".encode())
       | st.sampled_from([b"0\n", b"00012\n", b"1" * 33, b"12\x00", "１２".encode(), b"12 34\n"]))
def test_any_lock_file_content_is_read_safely(tmp_path_factory, content):
    """Whatever the lock file holds, a refused writer says one line (the pid only when the file is
    exactly one), and a free lock is taken whatever it holds, and left empty."""
    d = tmp_path_factory.mktemp("garbage")
    (d / LOCK_NAME).write_bytes(content)
    fd = os.open(d / LOCK_NAME, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held by another open file description
        with pytest.raises(UserError) as refused:
            DirectoryLock(d)
        message = str(refused.value)
        assert "\n" not in message and "being written by another process (pid " in message
        text = content.strip()  # ASCII whitespace only, as the reader does
        if text.isdigit() and 0 < int(text) < 2**31 and not text.startswith(b"0") and len(content) <= 32:
            assert f"(pid {int(text)})" in message
        else:
            assert "(pid unknown)" in message
    finally:
        os.close(fd)
    with DirectoryLock(d):
        assert holder_pid(d) == os.getpid()
    assert (d / LOCK_NAME).read_bytes() == b""


@pytest.mark.parametrize("kind", ["directory", "symlink", "fifo"])
def test_a_lock_file_that_is_not_a_regular_file_is_refused_in_one_line(tmp_path, kind):
    target = tmp_path / "elsewhere"
    target.write_text("")
    lock = tmp_path / LOCK_NAME
    {"directory": lambda: lock.mkdir(), "symlink": lambda: lock.symlink_to(target),
     "fifo": lambda: os.mkfifo(lock)}[kind]()
    with pytest.raises(UserError) as refused:
        DirectoryLock(tmp_path)
    assert "\n" not in str(refused.value) and LOCK_NAME in str(refused.value)
    assert target.read_text() == ""  # a symlink's target is never written


def test_a_file_system_without_locks_is_refused_in_one_line(tmp_path, monkeypatch):
    def no_locks(fd, op):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with pytest.raises(UserError, match="cannot lock the run directory .*No locks available"):
        RunDirectory(tmp_path / "run")
