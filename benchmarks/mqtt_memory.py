"""Memory of a long MQTT run (hardening issue): is the RSS of the coordinator and of each emulated
node host flat after a warm-up?

Runs `testbed run` (the coordinator, its own process) in mqtt mode over Mosquitto (an external
broker, so its memory is not the coordinator's; the embedded broker is a thread of the coordinator)
with a tiny model (synthetic data, dim 4, 10 samples per node, DP-PASGD with one local step per
round), samples the resident set size of the coordinator and of every host it started every
--every rounds, and prints for each process the median over --windows windows (after the warm-up)
of the least-squares slope of RSS against rounds, in KB per round, and PASS/FAIL against
--threshold-kb.

Usage: python benchmarks/mqtt_memory.py [--nodes 1000] [--rounds 1000] [--hosts 2] [--every 10]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from testbed.mqtt.brokers.mosquitto import MosquittoBroker  # noqa: E402
from testbed.mqtt.embedded_broker import EmbeddedBroker  # noqa: E402

CONFIG = """
[run]
name = "memory"
seed = 0
mode = "mqtt"
[data]
num_nodes = {nodes}
samples_per_node = 10
dim = 4
[dp_pasgd]
steps = {rounds}
tau = 1
batch = 4
lr = 0.1
sigma = 1.0
clip = true
lipschitz = 1.0
[privacy]
tight_accountant = "none"
[mqtt]
broker_url = "{url}"
hosts = {hosts}
round_timeout_s = {timeout}
connect_timeout_s = 600.0
[output]
figures = false
"""


def rss_kb(pid: int) -> float | None:
    """Resident set size of ``pid`` in KB (psutil if installed, else /proc/PID/status VmRSS);
    None once the process is gone."""
    try:
        import psutil
    except ImportError:
        psutil = None
    if psutil is not None:
        try:
            return psutil.Process(pid).memory_info().rss / 1024
        except psutil.NoSuchProcess:
            return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return float(line.split()[1])
    except OSError:
        return None
    return None


def host_pids(coordinator: int) -> list[int]:
    """The `testbed nodes` processes the coordinator started (its children)."""
    pids = []
    for path in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(path.read_text().rsplit(")", 1)[1].split()[1])
            if ppid == coordinator and b"nodes" in (path.parent / "cmdline").read_bytes():
                pids.append(int(path.parent.name))
        except (OSError, ValueError, IndexError):
            continue
    return sorted(pids)


def rounds_done(run_dir: Path) -> int:
    """Rows of metrics.csv (one per completed round)."""
    try:
        with open(run_dir / "metrics.csv", "rb") as f:
            return max(0, sum(1 for _ in f) - 1)
    except OSError:
        return 0


@dataclass
class Series:
    """RSS samples of one process: (round, KB)."""

    name: str
    rounds: list[int] = field(default_factory=list)
    kb: list[float] = field(default_factory=list)

    def add(self, round_index: int, kb: float | None) -> None:
        if kb is not None and (not self.rounds or round_index > self.rounds[-1]):
            self.rounds.append(round_index)
            self.kb.append(kb)

    def slopes(self, warmup: int, windows: int) -> list[float]:
        """Least-squares slope (KB/round) of each of ``windows`` equal windows after round ``warmup``."""
        r = np.array(self.rounds, dtype=float)
        kb = np.array(self.kb)
        keep = r >= warmup
        out = []
        for part_r, part_kb in zip(np.array_split(r[keep], windows), np.array_split(kb[keep], windows)):
            if len(part_r) >= 2 and np.ptp(part_r) > 0:
                out.append(float(np.polyfit(part_r, part_kb, 1)[0]))
        return out


def sample(proc: subprocess.Popen, run_dir: Path, every: int, total: int) -> tuple[list[Series], float]:
    """Sample the coordinator and its hosts every ``every`` rounds until the run ends; (series,
    seconds from the first round to the last)."""
    coordinator = Series("coordinator")
    hosts: dict[int, Series] = {}
    next_at, first_at = 0, None
    while proc.poll() is None:
        done = rounds_done(run_dir)
        if done >= next_at:
            first_at = first_at or (time.monotonic() if done else None)
            coordinator.add(done, rss_kb(proc.pid))
            for i, pid in enumerate(host_pids(proc.pid)):
                hosts.setdefault(pid, Series(f"host {len(hosts) + 1} (pid {pid})")).add(done, rss_kb(pid))
            next_at = done + every
            if done >= total:
                break
        time.sleep(0.02)
    return [coordinator, *hosts.values()], time.monotonic() - (first_at or time.monotonic())


def report(series: list[Series], warmup: int, windows: int, threshold_kb: float) -> bool:
    """Print each process's slope after the warm-up; True if all are under the threshold."""
    ok = True
    for s in series:
        slopes = s.slopes(warmup, windows)
        if not slopes:
            print(f"{s.name:28s} too few samples after round {warmup} ({len(s.rounds)} in all)")
            ok = False
            continue
        median = statistics.median(slopes)
        passed = median < threshold_kb
        ok &= passed
        print(f"{s.name:28s} RSS {s.kb[0] / 1024:7.1f} -> {s.kb[-1] / 1024:7.1f} MB; after round {warmup}: "
              f"median slope {median:+7.3f} KB/round (windows: {', '.join(f'{x:+.2f}' for x in slopes)}) "
              f"{'PASS' if passed else 'FAIL'} (< {threshold_kb:g})")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=1000)
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--every", type=int, default=10, help="sample every this many rounds")
    parser.add_argument("--warmup", type=float, default=0.2, help="share of the rounds left out as warm-up")
    parser.add_argument("--windows", type=int, default=4, help="post-warm-up windows, one slope each")
    parser.add_argument("--threshold-kb", type=float, default=1.0, help="pass: median slope below this, KB/round")
    parser.add_argument("--round-timeout", type=float, default=10.0, help="mqtt.round_timeout_s")
    parser.add_argument("--embedded", action="store_true",
                        help="the embedded broker (a thread of the coordinator: its memory counts there)")
    args = parser.parse_args()
    if not args.embedded and shutil.which("mosquitto") is None:
        print("mosquitto not on PATH: install it, or pass --embedded")
        return 2
    with tempfile.TemporaryDirectory() as tmp, \
            (EmbeddedBroker() if args.embedded else MosquittoBroker()) as broker:
        exp, run_dir = Path(tmp) / "exp.toml", Path(tmp) / "run"
        exp.write_text(CONFIG.format(nodes=args.nodes, rounds=args.rounds, hosts=args.hosts, url=broker.url,
                                     timeout=args.round_timeout))
        started = time.monotonic()
        proc = subprocess.Popen([sys.executable, "-m", "testbed", "run", str(exp), "--out", str(run_dir),
                                 "--quiet"], cwd=REPO, stderr=subprocess.PIPE, text=True)
        series, rounds_s = sample(proc, run_dir, args.every, args.rounds)
        _, err = proc.communicate(timeout=600)
        wall = time.monotonic() - started
        done = rounds_done(run_dir)
    print(f"mqtt memory: {args.nodes} nodes, {done} of {args.rounds} rounds, {args.hosts} host(s), "
          f"{'embedded broker' if args.embedded else 'Mosquitto'}; {wall:.0f} s "
          f"({rounds_s / max(done, 1):.3f} s/round), exit {proc.returncode}")
    if proc.returncode != 0:
        print("the run failed: " + (err.strip().splitlines() or ["no output"])[-1])
    warmup = int(args.warmup * args.rounds)
    ok = report(series, warmup, args.windows, args.threshold_kb) and proc.returncode == 0 and done == args.rounds
    print("overall: " + ("PASS" if ok else "FAIL") + f" (flat: median slope < {args.threshold_kb:g} KB/round "
                                                     f"after the first {warmup} rounds)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
