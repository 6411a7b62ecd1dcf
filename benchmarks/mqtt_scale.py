"""10,000 emulated boards over Mosquitto on this machine (scale issue): J1's DP-PASGD job
(benchmarks/j1_mqtt.toml: d = 100, tau = 10, batch 32, 500 samples per node) for 3 rounds, every
node its own MQTT connection, the nodes spread over --hosts `testbed nodes` processes that the run
starts.

Prints when all nodes were connected (counted on the broker's port), each round's end, the whole
wall time, and the peak resident memory (VmHWM) of the coordinator, its accountant process, each
host and Mosquitto, each host's own (private) memory at most (a host forked from the coordinator
shares its pages; VmHWM counts them) and the machine's memory in use at most; then what bounds the
node count on this machine (open files, ephemeral ports, memory per node). Target: the 3 rounds
complete with every node connected.

Then each stage's time (set-up: the coordinator's start before the hosts; connecting: until every
node is connected; round 1, with the nodes' preparing; each later round), the whole against the
issue's target (:data:`TARGET_S`) and the coordinator's peak against :data:`TARGET_COORDINATOR_GB`,
with the load average.

Usage: python benchmarks/mqtt_scale.py [--nodes 10000] [--hosts 10] [--fraction 0.1] [--eval-nodes 1000]
[--set KEY=VALUE]
(--fraction: client sampling, that share of the nodes asked each round, uniformly without
replacement; every node stays connected and hears every round's broadcast; 1: every node asked.
--eval-nodes: output.eval_nodes, the model evaluated on that many nodes' rows, a fixed subset; 0:
every node's, which the coordinator then holds: memory that grows with N)
"""

from __future__ import annotations

import argparse
import csv
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from testbed.mqtt.brokers.mosquitto import MosquittoBroker  # noqa: E402

JOB = HERE / "j1_mqtt.toml"
TARGET_S = 30.0  # issue 44: 10,000 boards, 10 % sampled, 3 rounds
TARGET_COORDINATOR_GB = 1.5


def status_kb(pid: int, key: str) -> int | None:
    """A /proc/PID/status field in KB (VmHWM: peak resident set, VmRSS: now); None once gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def private_kb(pid: int) -> int | None:
    """The memory ``pid`` holds alone now (Private_Clean + Private_Dirty of smaps_rollup), in KB: a
    host forked from the coordinator shares the pages it did not write with it (its VmHWM counts
    them); None once gone."""
    try:
        return sum(int(line.split()[1]) for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines()
                   if line.startswith(("Private_Clean:", "Private_Dirty:")))
    except (OSError, ValueError):
        return None


def cpu_s(pid: int) -> float:
    """The CPU time (user + system) ``pid`` has used so far, in seconds; 0 once gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return 0.0


def memory_in_use_kb() -> int:
    """This machine's memory in use now (MemTotal - MemAvailable), in KB."""
    info = {line.split(":")[0]: int(line.split()[1]) for line in Path("/proc/meminfo").read_text().splitlines()}
    return info["MemTotal"] - info["MemAvailable"]


def children(pid: int) -> dict[int, str]:
    """The direct children of ``pid``: {pid: "host" | "accountant" | other command}."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
            if int(text.rsplit(")", 1)[1].split()[1]) != pid:
                continue
            name = text[text.index("(") + 1:text.rindex(")")]  # a forked host: "nodes FIRST-LAST"
            cmd = (stat.parent / "cmdline").read_bytes().split(b"\0")
        except (OSError, ValueError, IndexError):
            continue
        found[int(stat.parent.name)] = ("host" if b"nodes" in cmd or name.startswith("nodes ") else
                                        "accountant" if name.startswith("testbed epsilon")  # a forked one
                                        or any(b"accountant" in c for c in cmd) else
                                        (cmd[0] or b"?").decode(errors="replace"))
    return found


def established(port: int) -> int:
    """TCP connections in state ESTABLISHED whose local port is ``port`` (the broker's side)."""
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f)
                for line in f:
                    fields = line.split(None, 4)
                    if fields[3] == "01" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                        count += 1
        except OSError:
            continue
    return count


def rounds_done(run_dir: Path) -> list[dict]:
    try:
        with open(run_dir / "metrics.csv", newline="") as f:
            return list(csv.DictReader(f))
    except OSError:
        return []


def machine_limits(nodes: int, hosts: int) -> list[str]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    low, high = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    file_max = int(Path("/proc/sys/fs/file-max").read_text())
    return [f"open files per process: soft {soft:,}, hard {hard:,} (a host holds one socket per node: "
            f"{-(-nodes // hosts):,} here; Mosquitto holds one per node: {nodes:,})",
            f"ephemeral ports to one broker address: {high - low + 1:,} (one per node; "
            f"/proc/sys/net/ipv4/ip_local_port_range {low}-{high})",
            f"open files system-wide: {file_max:,} (two per node on loopback: both ends)"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--hosts", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--fraction", type=float, default=0.1,
                        help="client sampling: share of the nodes asked per round (1: every node, no sampling)")
    parser.add_argument("--eval-nodes", type=int, default=1_000,
                        help="output.eval_nodes: the model evaluated on this many nodes (0: every node)")
    parser.add_argument("--round-timeout", type=float, default=600.0)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="more overrides of the job, e.g. data.samples_per_node=10 to see the non-data memory")
    args = parser.parse_args()
    if shutil.which("mosquitto") is None:
        print("mosquitto not on PATH (apt-get install mosquitto)")
        return 2
    sets = [f"data.num_nodes={args.nodes}", f"dp_pasgd.steps={10 * args.rounds}", f"mqtt.hosts={args.hosts}",
            "mqtt.connect_timeout_s=1200", f"mqtt.round_timeout_s={args.round_timeout}", "output.figures=false"]
    if args.fraction < 1:
        sets += ["client_sampling.method='uniform'", f"client_sampling.fraction={args.fraction}"]
    if 0 < args.eval_nodes < args.nodes:
        sets += [f"output.eval_nodes={args.eval_nodes}"]
    sets += args.set
    with tempfile.TemporaryDirectory() as tmp, MosquittoBroker(nodes=args.nodes) as broker:
        run_dir = Path(tmp) / "run"
        cmd = [sys.executable, "-m", "testbed", "run", str(JOB), "--out", str(run_dir),
               "--set", f"mqtt.broker_url='{broker.url}'"]
        for s in sets:
            cmd += ["--set", s]
        started = time.monotonic()
        # stderr to a file, not a pipe nobody reads during the run: 10,000 nodes' warnings fill a
        # pipe's 64 KB and the coordinator would block in its logging (and miss its keepalives).
        log_path = Path(tmp) / "stderr.log"
        with open(log_path, "w") as log:
            proc = subprocess.Popen(cmd, cwd=HERE.parent, stdout=subprocess.DEVNULL, stderr=log)
        broker_pid = broker._proc.pid  # type: ignore[union-attr]
        peaks: dict[int, tuple[str, int]] = {}
        private: dict[int, int] = {}  # host pid -> its largest private memory seen, KB
        in_use_before = most_in_use = memory_in_use_kb()
        hosts_at, all_connected_at, most_connected, rounds_at = None, None, 0, []
        used: dict[int, float] = {}  # pid -> its CPU seconds at the last look
        cpu_at: dict[str, float] = {}  # stage mark -> CPU seconds of the run's processes by then
        while proc.poll() is None:
            kids = children(proc.pid)
            for pid in [proc.pid, broker_pid, *kids]:
                used[pid] = max(used.get(pid, 0.0), cpu_s(pid))
            cpu_now = sum(used.values())
            if hosts_at is None and "host" in kids.values():
                hosts_at = time.monotonic() - started
                cpu_at["hosts"] = cpu_now
                print(f"hosts started at {hosts_at:.1f} s (the coordinator's data and set-up before)", flush=True)
            for pid, kind in [(proc.pid, "coordinator"), (broker_pid, "mosquitto"), *kids.items()]:
                hwm = status_kb(pid, "VmHWM")
                if hwm is not None:
                    peaks[pid] = (kind, max(hwm, peaks.get(pid, (kind, 0))[1]))
                own = private_kb(pid) if kind == "host" else None
                if own is not None:
                    private[pid] = max(own, private.get(pid, 0))
            most_in_use = max(most_in_use, memory_in_use_kb())
            connected = established(broker.port)
            most_connected = max(most_connected, connected)
            if all_connected_at is None and connected >= args.nodes + 1:  # the nodes and the coordinator
                all_connected_at = time.monotonic() - started
                cpu_at["connected"] = cpu_now
                print(f"all {args.nodes:,} nodes connected at {all_connected_at:.1f} s "
                      f"({all_connected_at - (hosts_at or 0):.1f} s after the hosts started)", flush=True)
            for row in rounds_done(run_dir)[len(rounds_at):]:
                rounds_at.append(time.monotonic() - started)
                cpu_at[f"round {len(rounds_at)}"] = cpu_now
                print(f"round {row['round']} done at {rounds_at[-1]:.1f} s ({row['stragglers']} stragglers)",
                      flush=True)
            time.sleep(0.5)
        wall = time.monotonic() - started
        rows = rounds_done(run_dir)
        err = log_path.read_text(errors="replace")
        lost = sum("lost connection" in line for line in err.splitlines())
        broker_log = broker.log_text()
        expired = broker_log.count("has exceeded timeout")
        dropped = broker_log.count("Outgoing messages are being dropped")
    ok = proc.returncode == 0 and len(rows) == args.rounds and all_connected_at is not None
    sampled = f", {args.fraction:g} of them sampled per round" if args.fraction < 1 else ", every node every round"
    print(f"mqtt scale: {args.nodes:,} nodes on {args.hosts} hosts over Mosquitto{sampled}: {len(rows)} of "
          f"{args.rounds} rounds in {wall:.1f} s (exit {proc.returncode}); most connections at once "
          f"{most_connected:,}")
    if proc.returncode != 0:
        print("the run failed: " + (err.strip().splitlines() or ["no output"])[-1])
    stragglers = [int(row["stragglers"]) for row in rows]
    ok = ok and not any(stragglers)
    print(f"  stragglers per round: {stragglers}; connections lost (clients' logs): {lost:,}; Mosquitto: "
          f"{expired:,} keepalives expired, {dropped:,} client queues overflowed")
    hosts = sorted(private.values())
    for pid, (kind, kb) in sorted(peaks.items(), key=lambda p: p[1][0]):
        own = f"; its own (private) at most {private[pid] / 1024:8.1f} MB" if pid in private else ""
        print(f"  peak RSS {kind:12s} pid {pid:>7}: {kb / 1024:8.1f} MB{own}")
    if hosts:
        per_host = -(-args.nodes // args.hosts)
        print(f"  hosts (forked from the coordinator, sharing its pages): median private peak "
              f"{hosts[len(hosts) // 2] / 1024:.0f} MB for {per_host:,} nodes = {hosts[len(hosts) // 2] / per_host:.0f} "
              f"KB per node; total {sum(hosts) / 2**20:.2f} GB")
    print(f"  this machine: {(most_in_use - in_use_before) / 2**20:.2f} GB more memory in use at most during the run "
          f"(sampled every 0.5 s)")
    coordinator = next((kb for kind, kb in peaks.values() if kind == "coordinator"), 0)
    print(f"  coordinator: {coordinator / args.nodes:.0f} KB per node")
    evaluated = f"{args.eval_nodes:,} nodes" if 0 < args.eval_nodes < args.nodes else "every node"
    print(f"stages (load average {' '.join(f'{x:.1f}' for x in os.getloadavg())}; evaluated on {evaluated}):")
    marks = [("set-up (the coordinator's, before the hosts)", hosts_at, "hosts"),
             ("connecting", all_connected_at, "connected"),
             *((f"round {i + 1}" + (" (with the nodes' preparing)" if i == 0 else ""), at, f"round {i + 1}")
               for i, at in enumerate(rounds_at))]
    before = cpu_before = 0.0
    for name, at, key in marks:
        if at is not None:
            # CPU seconds of the coordinator, its hosts and Mosquitto: what a loaded machine stretches
            # into wall time (2 cores: at best half of it in wall time)
            print(f"  {name:45s} {at - before:6.1f} s  (at {at:.1f} s; {cpu_at[key] - cpu_before:6.1f} CPU s)")
            before, cpu_before = at, cpu_at[key]
    print(f"  {'the rest (the stop, the summary)':45s} {wall - before:6.1f} s")
    print(f"total {wall:.1f} s against the target {TARGET_S:g} s: {wall / TARGET_S:.2f} of it "
          f"({'met' if wall <= TARGET_S else 'NOT met'}); coordinator peak {coordinator / 2**20:.2f} GB against "
          f"{TARGET_COORDINATOR_GB:g} GB: {coordinator / 2**20 / TARGET_COORDINATOR_GB:.2f} of it "
          f"({'met' if coordinator / 2**20 <= TARGET_COORDINATOR_GB else 'NOT met'})")
    print("limits of this machine:")
    for line in machine_limits(args.nodes, args.hosts):
        print("  " + line)
    print("overall: " + ("PASS" if ok else "FAIL") + f" ({args.rounds} rounds complete, every node connected, "
                                                     "every node asked answered)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
