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
import runs are those of the emulated arm64 board: its Python, numpy and `dpfl-testbed[node]` as pip
installed them on Debian bookworm aarch64. Their imports are the board's; their RSS is given twice:
qemu-user's process (the guest's pages plus qemu's translator, code buffer and tables: an upper
bound), and the guest's own (:func:`guest_rss_mb`: the resident pages of the mappings the guest's
/proc/self/maps lists, sampled every --guest-sample-s by a thread in the guest; the 64 MB target is
judged on this one; docs/boards.md says what it does not show: a spike between samples, pages
qemu keeps that a Pi would give back); their seconds are EMULATED: qemu on this machine, not a
Pi's CPU, and include the sampler's reads.

Usage: python benchmarks/node_footprint.py [--repeats 5] [--nodes 3] [--board DIR [--guest-sample-s 0.1]]
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
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


#: Run in the board before the measured code: a thread that writes the guest's own memory map
#: (/proc/self/maps, which qemu-user answers with the guest's mappings only) to the inherited file
#: descriptor argv[1] every argv[2] seconds and once at exit, each followed by a NUL.
GUEST_SAMPLE_S = 0.1
GUEST_SAMPLER = """import atexit, os, sys, threading, time
_fd, _every_s = int(sys.argv.pop(1)), float(sys.argv.pop(1))
_lock = threading.Lock()
def _dump():
    with _lock, open('/proc/self/maps', 'rb') as f:
        os.write(_fd, f.read() + b'\\0')
def _loop():
    while True:
        _dump()
        time.sleep(_every_s)
threading.Thread(target=_loop, daemon=True).start()
atexit.register(_dump)
"""
#: ``testbed`` as the board's console script runs it, after GUEST_SAMPLER.
GUEST_TESTBED = "from testbed.cli import main\nsys.argv[0] = 'testbed'\nsys.exit(main())\n"


def _ranges(maps: str) -> list[tuple[int, int]]:
    """The address ranges of a /proc/PID/maps or smaps text's mappings."""
    out = []
    for line in maps.splitlines():
        head = line.split(" ", 1)[0]
        if "-" in head and ":" not in head:
            lo, _, hi = head.partition("-")
            try:
                out.append((int(lo, 16), int(hi, 16)))
            except ValueError:
                continue
    return out


def guest_rss_mb(guest_maps: str, host_smaps: str) -> float:
    """MB resident of the host mappings (qemu's /proc/PID/smaps) that lie in the guest's own
    mappings (``guest_maps``: the guest's /proc/self/maps). qemu-user here runs the aarch64 guest at
    guest_base 0 (the guest's addresses are the host's: see docs/boards.md), so the guest's pages are
    exactly those mappings; qemu's own (its binary, its heap, its translated-code buffer, its
    allocations) lie outside them. A host mapping that overlaps a guest one only in part counts whole.

    Raises:
        ValueError: the guest's lowest mapping is at no host address (another guest_base: nothing to
            tell apart)."""
    guest = sorted(_ranges(guest_maps))
    # The lowest guest mapping, the interpreter's binary, is never unmapped: at a host address only
    # with guest_base 0 (others may come and go between the guest's map and the host's smaps).
    if not guest or not any(lo <= guest[0][0] < hi for lo, hi in _ranges(host_smaps)):
        raise ValueError("the guest's mappings are not at the host's addresses (qemu's guest_base is not 0): "
                         "the guest's pages cannot be told from qemu's")
    total_kb, current = 0, None
    for line in host_smaps.splitlines():
        span = _ranges(line)
        if span:
            lo, hi = span[0]
            current = any(g_lo < hi and lo < g_hi for g_lo, g_hi in guest)
        elif current and line.startswith("Rss:"):
            total_kb += int(line.split()[1])
    return total_kb / 1024


class GuestRss:
    """The guest's resident MB of one qemu-user process, sampled: each map the guest's
    GUEST_SAMPLER writes to :attr:`write_fd` is met with the host's smaps of ``pid`` read at once.
    ``peak_mb`` is the largest sample (a spike between two samples, ``every_s`` apart, is
    missed), ``last_mb`` the last one taken while the process lived."""

    def __init__(self, every_s: float = GUEST_SAMPLE_S) -> None:
        self.every_s = every_s
        self._read_fd, self.write_fd = os.pipe()
        self.pid = 0
        self.peak_mb = self.last_mb = float("nan")
        self.samples = 0
        self.error: str | None = None
        self._thread = threading.Thread(target=self._read, daemon=True)

    def argv(self) -> list[str]:
        """GUEST_SAMPLER's arguments: the descriptor to write to, the seconds between samples."""
        return [str(self.write_fd), str(self.every_s)]

    def start(self, pid: int) -> None:
        """Sample process ``pid`` (started with :attr:`write_fd` passed and closed here after)."""
        self.pid = pid
        os.close(self.write_fd)
        self._thread.start()

    def _read(self) -> None:
        buf = b""
        with os.fdopen(self._read_fd, "rb", buffering=0) as pipe:
            while chunk := pipe.read(1 << 16):
                buf += chunk
                *maps, buf = buf.split(b"\0")
                if not maps:
                    continue
                try:
                    smaps = Path(f"/proc/{self.pid}/smaps").read_text()
                except OSError:  # gone since its last map
                    continue
                if not smaps:
                    continue
                try:
                    mb = guest_rss_mb(maps[-1].decode(), smaps)
                except ValueError as exc:
                    if self.samples == 0:  # the first: this qemu's guest cannot be told from it
                        self.error = str(exc)
                        return
                    continue  # a later one: the process exiting, its mappings going
                self.last_mb = mb
                self.peak_mb = mb if self.samples == 0 else max(self.peak_mb, mb)
                self.samples += 1

    def wait(self) -> None:
        """Until the process's last map is read; SystemExit if its figure cannot be had."""
        self._thread.join(timeout=30)
        if self.error is not None or self.samples == 0:
            raise SystemExit(f"the guest's memory of process {self.pid}: {self.error or 'no sample'}")


def in_board(board: Path | None, command: list[str], cwd: Path | None = None) -> list[str]:
    """``command`` as this machine runs it, or in the board ``board`` (its own `python`/`testbed`)."""
    if board is None:
        return [sys.executable, *command[1:]] if command[0] == "python" else [sys.executable, "-m", *command]
    from testbed.orchestration.board_image import run_argv

    return run_argv(board, command, cwd=cwd)


def import_run(code: str, board: Path | None, sample_s: float = GUEST_SAMPLE_S) -> tuple[float, float, float | None]:
    """(wall seconds, peak RSS in MB, the guest's peak MB or None off the board) of a fresh
    interpreter running ``code`` (start-up included); the guest sampled every ``sample_s``."""
    guest = GuestRss(sample_s) if board is not None else None
    command = ["python", "-c", code] if guest is None else ["python", "-c", GUEST_SAMPLER + code, *guest.argv()]
    start = time.perf_counter()
    p = subprocess.Popen(in_board(board, command), cwd=REPO, pass_fds=() if guest is None else (guest.write_fd,))
    if guest is not None:
        guest.start(p.pid)
    _, status, usage = os.wait4(p.pid, 0)
    seconds = time.perf_counter() - start
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise SystemExit(f"python -c {code!r} exited with status {p.returncode}")
    if guest is not None:
        guest.wait()
    return seconds, usage.ru_maxrss / 1024, None if guest is None else guest.peak_mb


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
             board: Path | None, sample_s: float = GUEST_SAMPLE_S
             ) -> tuple[float, float, float, float | None, float | None]:
    """(largest peak RSS, largest idle RSS in MB, largest CPU seconds, and on a board the largest
    guest peak and idle MB, else None) of ``nodes`` `testbed node` processes (in ``board`` when
    given; the guest sampled every ``sample_s``) serving one run of ``total`` nodes."""
    from testbed.mqtt import auth

    # The nodes' message keys, as `testbed provision` writes them (the board reads the same path)
    keys = auth.write_keys(tmp / "keys.json", auth.Keys("footprint", {str(n): auth.new_key() for n in range(total)}))
    with broker() as url:
        rest = subprocess.Popen([sys.executable, "-m", "testbed", "nodes", "--broker", url, "--ids",
                                 ",".join(str(n) for n in range(nodes, total)), "--keys", str(keys)],
                                cwd=REPO, stderr=subprocess.DEVNULL)
        procs, guests = [], []
        for n in range(nodes):
            args = ["node", "--broker", url, "--node-id", str(n), "--meter", "model", "--profile", "pi-zero-2w",
                    "--state-dir", str(tmp / "state"), "--keys", str(keys), "--verbose"]
            guest = GuestRss(sample_s) if board is not None else None
            command = ["testbed", *args] if guest is None else \
                ["python", "-c", GUEST_SAMPLER + GUEST_TESTBED, *guest.argv(), *args]
            procs.append(subprocess.Popen(in_board(board, command, cwd=tmp), cwd=REPO, stderr=subprocess.PIPE,
                                          text=True, pass_fds=() if guest is None else (guest.write_fd,)))
            if guest is not None:
                guest.start(procs[-1].pid)
                guests.append(guest)
        idle, guest_idle, drains = [], [], []
        for p, guest in zip(procs, guests or [None] * len(procs)):  # connected: "serving ..." once online
            for line in p.stderr:
                if "serving" in line:
                    break
            drains.append(threading.Thread(target=collections.deque, args=(p.stderr, 0), daemon=True))
            drains[-1].start()  # --verbose logs every round: a pipe nobody reads would block the node
            idle.append(_vm_rss_mb(p.pid))
            if guest is not None:
                time.sleep(2 * sample_s)  # a sample taken since
                guest_idle.append(guest.last_mb)
        args = [sys.executable, "-m", "testbed", "run", str(experiment), "--quiet", "--out", str(tmp / "run")]
        slow = ["mqtt.round_timeout_s=120", "mqtt.connect_timeout_s=180"] if board is not None else []
        for s in sets + slow + ["run.mode='mqtt'", f"mqtt.broker_url='{url}'", "mqtt.emulated=false", f"mqtt.keys='{keys}'",
                                f"mqtt.quorum={nodes}", "output.figures=false"]:
            args += ["--set", s]
        subprocess.run(args, cwd=REPO, check=True, stdout=subprocess.DEVNULL)
        rest.wait(timeout=60)
        peaks, cpus = [], []
        for p, drain in zip(procs, drains):
            _, status, usage = os.wait4(p.pid, 0)
            drain.join(timeout=10)  # the pipe closes with the process
            p.stderr.close()
            p.returncode = os.waitstatus_to_exitcode(status)
            if p.returncode != 0:
                raise SystemExit(f"node {procs.index(p)} exited with status {p.returncode}")
            peaks.append(usage.ru_maxrss / 1024)
            cpus.append(usage.ru_utime + usage.ru_stime)
    for guest in guests:
        guest.wait()
    if not guests:
        return max(peaks), max(idle), max(cpus), None, None
    return max(peaks), max(idle), max(cpus), max(g.peak_mb for g in guests), max(guest_idle)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--nodes", type=int, default=3, help="real node processes per run")
    parser.add_argument("--board", type=Path, help="run the nodes in this emulated board (testbed board build)")
    parser.add_argument("--guest-sample-s", type=float, default=GUEST_SAMPLE_S,
                        help="seconds between samples of a board process's own memory")
    args = parser.parse_args()
    board = args.board.resolve() if args.board else None
    where = (f"on the emulated arm64 board {board} (seconds EMULATED by qemu-user on this machine, not a Pi's; "
             "qemu's RSS includes its own memory; the guest's is its own mappings' resident pages, sampled every "
             f"{args.guest_sample_s:g} s)") if board else "on this machine"
    print(f"node footprint {where}")

    floor = [import_run("pass", board, args.guest_sample_s) for _ in range(args.repeats)]
    imports = [import_run(IMPORTS, board, args.guest_sample_s) for _ in range(args.repeats)]
    f, i = (statistics.median(s for s, _, _ in runs) for runs in (floor, imports))
    f_mb, i_mb = (statistics.median(mb for _, mb, _ in runs) for runs in (floor, imports))
    guest_imports = ""
    if board is not None:
        f_g, i_g = (statistics.median(g for _, _, g in runs) for runs in (floor, imports))
        guest_imports = (f" (qemu-user's process); the guest's own peak {i_g:.1f} MB, bare interpreter {f_g:.1f} MB "
                         f"(medians of {args.repeats}: {', '.join(f'{g:.1f}' for _, _, g in imports)})")
    print(f"import time of the node agent: {i:.3f} s with interpreter start-up (median of {args.repeats}); "
          f"bare interpreter {f:.3f} s; node imports {i - f:.3f} s, ratio to the bare interpreter {i / f:.1f}; "
          f"peak RSS after the imports {i_mb:.1f} MB, bare interpreter {f_mb:.1f} MB{guest_imports}")

    cases = [("DP-PASGD, quickstart model", REPO / "experiments" / "quickstart.toml", [], 16, True),
             ("DWFL, quickstart model", REPO / "experiments" / "quickstart.toml", DWFL_QUICKSTART, 16, True)]
    data = os.environ.get("TESTBED_DATA")
    if data and (Path(data) / "adult" / "adult.data").exists():
        cases.append(("DWFL, Adult-2 (info)", REPO / "experiments" / "dwfl" / "base.toml",
                      ["dwfl.rounds=3", "mqtt.round_timeout_s=120"], 10, False))
    else:
        print("DWFL on Adult-2: skipped ($TESTBED_DATA/adult/adult.data not found)")
    for name, experiment, sets, total, targeted in cases:
        runs = []
        for r in range(args.repeats):
            with tempfile.TemporaryDirectory() as tmp:
                runs.append(node_run(experiment, sets, args.nodes, total, Path(tmp), board, args.guest_sample_s))
        peaks, idles, cpus, guest_peaks, guest_idles = (list(column) for column in zip(*runs))
        peak = statistics.median(peaks)
        # On a board the target is the guest's own: qemu's RSS holds its translator and tables too.
        judged = statistics.median(guest_peaks) if board is not None else peak
        verdict = (f"ratio to the {TARGET_MB:.0f} MB target {judged / TARGET_MB:.2f} "
                   f"({'met' if judged <= TARGET_MB else 'NOT met'})") if targeted else "no target"
        guest = "" if board is None else (
            f" (qemu-user's process); the guest's own peak {judged:.1f} MB (median of {args.repeats}: "
            f"{', '.join(f'{g:.1f}' for g in guest_peaks)}), connected and idle {statistics.median(guest_idles):.1f} MB")
        print(f"peak RSS of a node, {name}: {peak:.1f} MB (median of {args.repeats}: "
              f"{', '.join(f'{p:.1f}' for p in peaks)}); connected and idle {statistics.median(idles):.1f} MB{guest}; "
              f"{verdict}; CPU time of a node {statistics.median(cpus):.1f} s{' (emulated)' if board else ''}")

if __name__ == "__main__":
    main()
