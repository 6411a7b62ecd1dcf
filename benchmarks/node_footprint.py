"""The node agent's footprint on a board: import time and peak RSS of `testbed node`.

1. Import time: a fresh interpreter importing what `testbed node` runs (the command line, the node
   host and agent, every registered algorithm), median of --repeats; the floor is the bare
   interpreter's start-up (`python -c pass`).
2. Peak RSS (the kernel's high-water mark, from wait4) of a `testbed node` process serving a run:
   DP-PASGD on the quickstart model (experiments/quickstart.toml: 20 features, logistic, 9
   rounds) and DWFL on the same synthetic task (10 rounds); --nodes of the run's nodes are
   `testbed node` processes, the others one emulated host (`testbed nodes`), the coordinator
   `testbed run`, each its own process. Median over --repeats of the largest node's peak; also its RSS once connected (idle).
   With $TESTBED_DATA holding adult/adult.data, DWFL on Adult-2 (experiments/dwfl/base.toml, 3
   rounds) too.
   Target: <= 64 MB for the quickstart model, so a 512 MB Pi Zero 2 W runs it beside its OS.

Figures are of this machine (x86-64, CPython of the venv); a board's differ by its numpy/BLAS build.
With --board DIR (`testbed board build --arch arm64 --out DIR`, root) the node processes and the
import runs are those of the emulated arm64 board: its Python, numpy and `testbed[node]` as pip
installed them on Debian bookworm aarch64. Their imports are the board's, their RSS that of
qemu-user running them (the guest's pages plus qemu's translator: an upper bound; the bare
interpreter's is printed beside it), and their seconds are EMULATED: qemu on this machine, not a
Pi's CPU.

Usage: python benchmarks/node_footprint.py [--repeats 5] [--nodes 3] [--board DIR]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

REPO = Path(__file__).resolve().parents[1]
TARGET_MB = 64.0

IMPORTS = ("import testbed.cli, nodes.host, nodes.agent\n"
           "from testbed.algorithms import registry\n"
           "registry.registrations()\n")

DWFL_QUICKSTART = ["run.algorithm='dwfl'", "run.name='dwfl-footprint'", "dwfl.rounds=10", "dwfl.epsilon=0.5",
                   "dwfl.batch=100"]


def in_board(board: Path | None, command: list[str], cwd: Path | None = None) -> list[str]:
    """``command`` as this machine runs it, or in the board ``board`` (its own `python`/`testbed`)."""
    if board is None:
        return [sys.executable, *command[1:]] if command[0] == "python" else [sys.executable, "-m", *command]
    from testbed.orchestration.board_image import run_argv

    return run_argv(board, command, cwd=cwd)


def import_run(code: str, board: Path | None) -> tuple[float, float]:
    """(wall seconds, peak RSS in MB) of a fresh interpreter running ``code`` (start-up included)."""
    start = time.perf_counter()
    p = subprocess.Popen(in_board(board, ["python", "-c", code]), cwd=REPO)
    _, status, usage = os.wait4(p.pid, 0)
    seconds = time.perf_counter() - start
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise SystemExit(f"python -c {code!r} exited with status {p.returncode}")
    return seconds, usage.ru_maxrss / 1024


@contextmanager
def broker() -> Iterator[str]:
    """Mosquitto when installed, else the embedded broker; yields its URL."""
    from testbed.mqtt.brokers.mosquitto import MosquittoBroker
    from testbed.mqtt.embedded_broker import EmbeddedBroker

    b = MosquittoBroker() if shutil.which("mosquitto") else EmbeddedBroker()
    b.start()
    try:
        yield b.url
    finally:
        b.stop()


def _vm_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def node_run(experiment: Path, sets: list[str], nodes: int, total: int, tmp: Path,
             board: Path | None) -> tuple[float, float, float]:
    """(largest peak RSS, largest idle RSS in MB, largest CPU seconds) of ``nodes`` `testbed node`
    processes (in ``board`` when given) serving one run of ``total`` nodes."""
    with broker() as url:
        rest = subprocess.Popen([sys.executable, "-m", "testbed", "nodes", "--broker", url, "--ids",
                                 ",".join(str(n) for n in range(nodes, total))],
                                cwd=REPO, stderr=subprocess.DEVNULL)
        procs = [subprocess.Popen(in_board(board, ["testbed", "node", "--broker", url, "--node-id", str(n),
                                                   "--meter", "model", "--profile", "pi-zero-2w", "--state-dir",
                                                   str(tmp / "state"), "--verbose"], cwd=tmp),
                                  cwd=REPO, stderr=subprocess.PIPE, text=True)
                 for n in range(nodes)]
        idle = []
        for p in procs:  # connected: the host logs "serving ..." once its node is online
            for line in p.stderr:
                if "serving" in line:
                    break
            idle.append(_vm_rss_mb(p.pid))
        args = [sys.executable, "-m", "testbed", "run", str(experiment), "--quiet", "--out", str(tmp / "run")]
        slow = ["mqtt.round_timeout_s=120", "mqtt.connect_timeout_s=180"] if board is not None else []
        for s in sets + slow + ["run.mode='mqtt'", f"mqtt.broker_url='{url}'", "mqtt.emulated=false",
                                f"mqtt.quorum={nodes}", "output.figures=false"]:
            args += ["--set", s]
        subprocess.run(args, cwd=REPO, check=True, stdout=subprocess.DEVNULL)
        rest.wait(timeout=60)
        peaks, cpus = [], []
        for p in procs:
            p.stderr.close()
            _, status, usage = os.wait4(p.pid, 0)
            p.returncode = os.waitstatus_to_exitcode(status)
            if p.returncode != 0:
                raise SystemExit(f"node {procs.index(p)} exited with status {p.returncode}")
            peaks.append(usage.ru_maxrss / 1024)
            cpus.append(usage.ru_utime + usage.ru_stime)
    return max(peaks), max(idle), max(cpus)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--nodes", type=int, default=3, help="real node processes per run")
    parser.add_argument("--board", type=Path, help="run the nodes in this emulated board (testbed board build)")
    args = parser.parse_args()
    board = args.board.resolve() if args.board else None
    where = (f"on the emulated arm64 board {board} (seconds EMULATED by qemu-user on this machine, not a Pi's; "
             "RSS includes qemu's own)") if board else "on this machine"
    print(f"node footprint {where}")

    floor = [import_run("pass", board) for _ in range(args.repeats)]
    imports = [import_run(IMPORTS, board) for _ in range(args.repeats)]
    f, i = (statistics.median(s for s, _ in runs) for runs in (floor, imports))
    f_mb, i_mb = (statistics.median(mb for _, mb in runs) for runs in (floor, imports))
    print(f"import time of the node agent: {i:.3f} s with interpreter start-up (median of {args.repeats}); "
          f"bare interpreter {f:.3f} s; node imports {i - f:.3f} s, ratio to the bare interpreter {i / f:.1f}; "
          f"peak RSS after the imports {i_mb:.1f} MB, bare interpreter {f_mb:.1f} MB")

    cases = [("DP-PASGD, quickstart model", REPO / "experiments" / "quickstart.toml", [], 16, True),
             ("DWFL, quickstart model", REPO / "experiments" / "quickstart.toml", DWFL_QUICKSTART, 16, True)]
    data = os.environ.get("TESTBED_DATA")
    if data and (Path(data) / "adult" / "adult.data").exists():
        cases.append(("DWFL, Adult-2 (info)", REPO / "experiments" / "dwfl" / "base.toml",
                      ["dwfl.rounds=3", "mqtt.round_timeout_s=120"], 10, False))
    else:
        print("DWFL on Adult-2: skipped ($TESTBED_DATA/adult/adult.data not found)")
    for name, experiment, sets, total, targeted in cases:
        peaks, idles, cpus = [], [], []
        for r in range(args.repeats):
            with tempfile.TemporaryDirectory() as tmp:
                peak, idle, cpu = node_run(experiment, sets, args.nodes, total, Path(tmp), board)
            peaks.append(peak)
            idles.append(idle)
            cpus.append(cpu)
        peak = statistics.median(peaks)
        verdict = (f"ratio to the {TARGET_MB:.0f} MB target {peak / TARGET_MB:.2f} "
                   f"({'met' if peak <= TARGET_MB else 'NOT met'})") if targeted else "no target"
        print(f"peak RSS of a node, {name}: {peak:.1f} MB (median of {args.repeats}: "
              f"{', '.join(f'{p:.1f}' for p in peaks)}); connected and idle {statistics.median(idles):.1f} MB; "
              f"{verdict}; CPU time of a node {statistics.median(cpus):.1f} s{' (emulated)' if board else ''}")


if __name__ == "__main__":
    main()
