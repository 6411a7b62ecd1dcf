"""testbed.util.forked: a `testbed` command in a fork of this process, as the coordinator starts its
emulated hosts: exit code, stderr, environment, name, termination, and a fresh worker pool."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testbed.util import parallel
from testbed.util.forked import ForkedCommand, helper_process

# Not can_fork(): torch, loaded by other tests in this process, is never used by these children.
pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="no fork here")


def test_a_user_error_is_the_commands_exit_code_and_stderr_line():
    child = ForkedCommand(["nodes", "--broker", "mqtt://127.0.0.1:1", "--run", "r", "--ids", "x"])
    assert child.wait(timeout=30) == 2
    with child.stderr as err:
        assert "argument --ids: must be an integer" in err.read()


def test_the_child_has_its_name_and_environment(tmp_path, monkeypatch):
    out = tmp_path / "env.txt"
    monkeypatch.setattr("testbed.cli.main", lambda argv: _write_env_and_name(out))
    child = ForkedCommand(["nodes"], {"TESTBED_TORCH_THREADS": "3"}, name="nodes 0-49")
    assert child.wait(timeout=30) == 0
    child.stderr.close()
    assert out.read_text().split("\n") == ["3", "nodes 0-49"]


def _write_env_and_name(out: Path) -> int:
    name = Path("/proc/self/comm").read_text().strip() if Path("/proc/self/comm").exists() else "nodes 0-49"
    out.write_text(f"{os.environ['TESTBED_TORCH_THREADS']}\n{name}")
    return 0


def test_terminate_ends_a_child_that_does_not_leave(monkeypatch):
    monkeypatch.setattr("testbed.cli.main", lambda argv: time.sleep(60))
    child = ForkedCommand(["nodes"])
    assert child.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        child.wait(timeout=0.05)
    child.terminate()
    assert child.wait(timeout=10) == -signal.SIGTERM
    child.terminate()  # exited: nothing to do
    child.stderr.close()


def test_an_exception_is_printed_and_exits_1(monkeypatch):
    def boom(argv):
        raise RuntimeError("the step failed")

    monkeypatch.setattr("testbed.cli.main", boom)
    child = ForkedCommand(["nodes"])
    assert child.wait(timeout=30) == 1
    with child.stderr as err:
        assert "RuntimeError: the step failed" in err.read()


def test_the_child_starts_its_own_worker_pool(monkeypatch):
    """The parent's pool thread does not exist in the child: work split there must still run."""
    import numpy as np

    out = np.zeros(4)
    parallel.split_work(4, lambda lo, hi: out.__setitem__(slice(lo, hi), 1), numbers=parallel.MIN_NUMBERS)
    assert parallel._pool is not None or (os.cpu_count() or 1) < 2

    def split(argv):
        done = np.zeros(4)
        parallel.split_work(4, lambda lo, hi: done.__setitem__(slice(lo, hi), 1), numbers=parallel.MIN_NUMBERS)
        return 0 if done.all() else 3

    monkeypatch.setattr("testbed.cli.main", split)
    child = ForkedCommand(["nodes"])
    assert child.wait(timeout=30) == 0
    child.stderr.close()


def test_what_the_parent_buffered_is_not_written_twice(capfd):
    sys.stdout.write("parent line")  # unflushed
    child = ForkedCommand(["nodes", "--ids", "x"])
    child.wait(timeout=30)
    child.stderr.close()
    sys.stdout.flush()
    assert capfd.readouterr().out.count("parent line") == 1


def test_no_fork_once_torch_is_loaded(monkeypatch):
    from testbed.util.forked import can_fork

    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert can_fork()
    monkeypatch.setitem(sys.modules, "torch", object())
    assert not can_fork()


def test_the_child_holds_none_of_the_parents_descriptors(tmp_path, monkeypatch):
    """A coordinator's MQTT connection must end with it, not live on in its hosts."""
    import socket

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    held = listener.fileno()

    def check(argv):
        try:
            os.fstat(held)
        except OSError:
            return 0
        return 3

    monkeypatch.setattr("testbed.cli.main", check)
    child = ForkedCommand(["nodes"])
    assert child.wait(timeout=30) == 0
    child.stderr.close()
    listener.close()


def test_stderr_to_a_file_and_kill_ends_a_child_that_ignores_terminate(tmp_path, monkeypatch):
    def stubborn(argv):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print("serving", file=sys.stderr, flush=True)
        time.sleep(60)

    monkeypatch.setattr("testbed.cli.main", stubborn)
    with open(tmp_path / "stderr.txt", "w+") as errors:
        child = ForkedCommand(["broker"], stderr_fd=errors.fileno())
        assert child.stderr is None
        deadline = time.monotonic() + 30
        while "serving" not in (tmp_path / "stderr.txt").read_text() and time.monotonic() < deadline:
            time.sleep(0.02)
        child.terminate()
        with pytest.raises(subprocess.TimeoutExpired):
            child.wait(timeout=0.3)
        child.kill()
        assert child.wait(timeout=10) == -signal.SIGKILL
    assert (tmp_path / "stderr.txt").read_text() == "serving\n"


def test_a_helper_reads_its_stdin_and_writes_its_stdout_over_pipes(monkeypatch):
    def echo(argv: list[str]) -> int:
        for line in sys.stdin:
            sys.stdout.write(argv[0] + line.upper())
        sys.stdout.flush()
        return 0

    monkeypatch.setattr("testbed.reports.plots.serve", echo)  # the helper the fork runs
    monkeypatch.setattr("testbed.util.forked._no_busy_threads", lambda: True)  # other tests' threads idle
    monkeypatch.setattr("testbed.util.forked.can_fork", lambda: True)  # other tests' torch unused here
    child = helper_process("testbed.reports.plots", ["x:"], name="testbed echo")
    assert isinstance(child, ForkedCommand)
    child.stdin.write("ab\ncé\n".encode())
    child.stdin.close()
    assert child.stdout.read().decode() == "x:AB\nx:CÉ\n"
    assert child.wait(timeout=30) == 0
    assert child.stderr.read() == ""
    child.stderr.close()


def test_a_helper_forked_or_in_a_new_interpreter_gives_the_same_epsilon(monkeypatch):
    from collections import Counter

    from testbed.privacy.accountants.background import BackgroundEpsilons

    tally = Counter({(1.0, 0.0625, "replace_one", "none", 1.0): 10})
    monkeypatch.setattr("testbed.util.forked._no_busy_threads", lambda: True)  # other tests' threads idle
    monkeypatch.setattr("testbed.util.forked.can_fork", lambda: True)  # other tests' torch unused here
    forked = BackgroundEpsilons("rdp", delta=1e-5)
    assert isinstance(forked._proc, ForkedCommand)
    monkeypatch.setattr("testbed.util.forked.can_fork", lambda: False)
    spawned = BackgroundEpsilons("rdp", delta=1e-5)
    assert isinstance(spawned._proc, subprocess.Popen)
    eps = forked.result([tally])
    assert eps == spawned.result([tally]) and eps[0] > 0


def test_a_helper_is_a_new_interpreter_while_another_thread_runs():
    """A thread of the parent (a broker's, a server's) may hold a lock at the fork: no fork then."""
    import threading

    stop = threading.Event()
    other = threading.Thread(target=stop.wait, name="a broker", daemon=True)
    other.start()
    try:
        child = helper_process("testbed.reports.plots", [], name="testbed figures")
        assert isinstance(child, subprocess.Popen)
        child.stdin.close()
        assert child.wait(timeout=60) == 0
        child.stdout.close()
        child.stderr.close()
    finally:
        stop.set()
        other.join()


@pytest.mark.skipif(sys.platform != "linux", reason="a thread's own niceness is Linux's")
def test_at_niceness_raises_the_calling_thread_only_and_never_lowers():
    import threading

    from testbed.util.forked import at_niceness

    before, seen = os.nice(0), []

    def background() -> None:
        at_niceness(before + 5)
        at_niceness(before + 2)  # never lowered
        seen.append(os.nice(0))

    thread = threading.Thread(target=background)
    thread.start()
    thread.join()
    assert seen == [min(19, before + 5)] and os.nice(0) == before


def _thread_nicenesses(pid: int) -> list[int]:
    """Each thread's niceness of process ``pid`` (/proc: field 19 of a task's stat)."""
    found = []
    for task in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = open(f"/proc/{pid}/task/{task}/stat").read()
        except OSError:  # the thread ended
            continue
        found.append(int(stat[stat.rindex(")") + 2:].split()[16]))
    return found


@pytest.mark.skipif(sys.platform != "linux", reason="a thread's own niceness is Linux's")
def test_the_helpers_work_in_the_background_and_draw_at_the_runs_niceness(monkeypatch):
    """While a run's rounds go, its helpers' work (the tight accountant's, the figures' import of
    matplotlib) is at BACKGROUND_NICENESS; what the run waits for at its end, the figures, at the
    run's own (the figure helper's serving thread, whose forks draw)."""
    import time

    from testbed.privacy.accountants.background import BackgroundEpsilons
    from testbed.util.forked import BACKGROUND_NICENESS

    monkeypatch.setattr("testbed.util.forked._no_busy_threads", lambda: True)  # other tests' threads idle
    monkeypatch.setattr("testbed.util.forked.can_fork", lambda: True)  # other tests' torch unused here
    base = os.nice(0)
    epsilons = BackgroundEpsilons("rdp", delta=1e-5)
    figures = helper_process("testbed.reports.plots", [], name="testbed figures")
    try:
        expected, deadline = {base, max(base, BACKGROUND_NICENESS)}, time.monotonic() + 20
        seen = set(_thread_nicenesses(figures.pid))
        while seen != expected and time.monotonic() < deadline:  # the serving thread and the warm-up's
            time.sleep(0.002)
            seen = set(_thread_nicenesses(figures.pid))
        assert seen == expected
        while set(_thread_nicenesses(epsilons._proc.pid)) != {max(base, BACKGROUND_NICENESS)}:
            assert time.monotonic() < deadline, _thread_nicenesses(epsilons._proc.pid)
            time.sleep(0.002)
    finally:
        epsilons.close()
        figures.kill()
        figures.wait()
        for pipe in (figures.stdin, figures.stdout, figures.stderr):
            pipe.close()
