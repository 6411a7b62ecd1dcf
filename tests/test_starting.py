"""Start-up deadlines wait for progress (issue 43, part 6): a live child still starting is waited
for past the old fixed 10 s (as under load ~25), a stuck one is given up after STALL_S without
CPU time, and anything at CAP_S."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from conftest import REPO
from testbed.util.starting import cpu_ticks, process_progress, thread_progress, wait_while_starting


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


def _wait(ready_at=None, alive_until=None, working=True, **kw):
    clock, ticks = Clock(), [0]

    def progress():
        if working:
            ticks[0] += 1
        return ticks[0]

    return wait_while_starting(lambda: ready_at is not None and clock.t >= ready_at,
                               lambda: alive_until is None or clock.t < alive_until, progress,
                               clock=clock, sleep=clock.sleep, poll_s=0.5, **kw)


def test_a_slow_starter_at_work_is_waited_for_past_the_old_fixed_deadline():
    waited = _wait(ready_at=45.0)  # a loaded machine: 45 s to accept connections
    assert waited.outcome == "ready" and waited.seconds == pytest.approx(45.0, abs=0.5)


def test_a_starter_without_progress_is_given_up_after_the_stall():
    waited = _wait(ready_at=1000.0, working=False, stall_s=10.0)
    assert waited.outcome == "stalled" and 10.0 < waited.seconds <= 11.0
    assert "no progress" in waited.why(10.0)


def test_a_starter_that_exits_is_said_at_once_and_the_cap_holds():
    assert _wait(ready_at=1000.0, alive_until=3.0).outcome == "exited"
    capped = _wait(ready_at=10_000.0, cap_s=120.0)
    assert capped.outcome == "cap" and 120.0 < capped.seconds <= 121.0


def test_progress_is_the_cpu_time_of_a_process_or_a_thread():
    busy = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\nwhile time.time() - t < 3: pass"])
    asleep = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        time.sleep(0.3)
        a, b = process_progress(busy.pid)(), process_progress(asleep.pid)()
        time.sleep(1.5)
        assert process_progress(busy.pid)() > a  # at work
        assert process_progress(asleep.pid)() == b  # stuck (asleep)
    finally:
        for p in (busy, asleep):
            p.kill()
            p.wait()
    assert cpu_ticks(asleep.pid) is None  # gone: unknown, never an error
    stop = threading.Event()
    spin = threading.Thread(target=lambda: [None for _ in iter(lambda: stop.is_set(), True)])
    spin.start()
    try:
        first = thread_progress(spin.native_id)()
        time.sleep(1.0)
        assert thread_progress(spin.native_id)() > first
    finally:
        stop.set()
        spin.join()


def test_the_embedded_broker_waits_for_a_slow_start(monkeypatch):
    """Its thread's start is slowed past the stall it is given, working all along: it still starts."""
    from testbed.mqtt.embedded_broker import EmbeddedBroker

    serve = EmbeddedBroker._serve

    async def slow_serve(self):
        t = time.monotonic()
        while time.monotonic() - t < 3.0:  # busy, as an import on a loaded machine
            pass
        await serve(self)

    monkeypatch.setattr(EmbeddedBroker, "_serve", slow_serve)
    broker = EmbeddedBroker(start_timeout_s=1.0)
    try:
        broker.start()
        assert broker.running
    finally:
        broker.stop()


#: A run whose emulated hosts are slowed past mqtt.connect_timeout_s: the experiment on stdin, the
#: run directory as argv[1]; prints the summary's status and rounds.
_SLOW_HOSTS_RUN = """
import sys, time
import nodes.host
from testbed.assembly.config import load_config_text
from testbed.orchestration.runner import run_experiment
from testbed.util.forked import can_fork

serve = nodes.host.serve

def slow_serve(*args, **kwargs):
    t = time.monotonic()
    while time.monotonic() - t < 4.0:
        pass
    return serve(*args, **kwargs)

nodes.host.serve = slow_serve
assert can_fork(), "this interpreter forks its hosts"
summary = run_experiment(load_config_text(sys.stdin.read()), out_dir=sys.argv[1], quiet=True).summary
print(summary["status"], summary["rounds"])
"""


def test_emulated_hosts_still_at_work_are_waited_for_past_connect_timeout(embedded_broker, tmp_path):
    """The coordinator's wait for its emulated hosts' nodes: a host slowed past mqtt.connect_timeout_s
    (busy, as a loaded machine's import is) is waited for while it works, and its nodes come online."""
    text = f"""
[run]
name = "slow"
seed = 1
mode = "mqtt"
[data]
dataset = "synthetic"
num_nodes = 2
samples_per_node = 40
dim = 4
[dp_pasgd]
steps = 4
tau = 2
batch = 8
lr = 0.5
sigma = 1.0
[mqtt]
broker_url = "{embedded_broker.url}"
connect_timeout_s = 1.0
[output]
figures = false
"""
    # Every emulated host (forked from the run's process: it inherits the patch) spins for 4 s before
    # it serves, as a loaded machine's imports do. The run is a fresh interpreter of its own: this
    # one may hold torch (an earlier test's), where hosts are new interpreters the patch never reaches.
    done = subprocess.run([sys.executable, "-c", _SLOW_HOSTS_RUN, str(tmp_path / "r")], input=text, cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["completed", "2"]
