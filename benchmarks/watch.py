"""Benchmark: what watching a run costs, at 1,000 nodes.

1. The run's side: the progress line's ``update`` per round, on a terminal (rich, through a
   pseudo-terminal) and off one (plain lines), against the floor of a round: the median wall time of
   a round of the same 1,000-node sim run (metrics.csv ``wall_s``), and one redraw of the bar
   against the REFRESH_S between redraws. Each ratio must stay below 1 %.
2. The page's side: ``RunFeed.poll`` per round (reading one round's ledger and metrics rows, ε of
   the nodes that changed) and the size of the delta it sends, against the full snapshot.

Prints medians over ``--reps`` repetitions.

Run: ``.venv/bin/python benchmarks/watch.py [--nodes 1000] [--reps 5]``
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from testbed.accounting.book import LedgerBook  # noqa: E402
from testbed.accounting.budgets import Budgets  # noqa: E402
from testbed.assembly.config import load_config_text  # noqa: E402
from testbed.ledger.files import read_ledger  # noqa: E402
from testbed.orchestration.runner import run_experiment  # noqa: E402
from testbed.reports.progress import REFRESH_S, Progress  # noqa: E402
from testbed.reports.results import read_metrics  # noqa: E402
from testbed.watch.feed import RunFeed  # noqa: E402

EXPERIMENT = """
[run]
name = "bench-watch"
seed = 0
[data]
dataset = "synthetic"
num_nodes = {nodes}
samples_per_node = 20
dim = 10
[dp_pasgd]
steps = 100
tau = 5
batch = 8
lr = 0.5
sigma = 1.0
clip = true
lipschitz = 1.0
[budget]
epsilon = 100.0
cost_units = 10000.0
energy_j = 100.0
[output]
figures = false
"""


def progress_cost_s(book: LedgerBook, tty: bool, rounds: int = 2000, redraw: bool = False) -> float:
    """Seconds per Progress.update with every budget set (energy reads the book's column); with
    ``redraw``, every update redraws the bar (what the throttle allows at most every REFRESH_S)."""
    if tty:
        master, slave = os.openpty()
        stream = os.fdopen(slave, "w")
        # Read what the bar writes, as a terminal does (a full pty would block the writer).
        drain = threading.Thread(target=lambda: _drain(master), daemon=True)
        drain.start()
    else:
        stream = open(os.devnull, "w")
    progress = Progress(rounds, stream=stream, budgets=Budgets(epsilon=10.0, cost_units=1e4, bytes=1e9, energy_j=1e3))
    row = {"epsilon": 1.0, "cost_units": 10.0, "bytes_total": 1000}
    start = time.perf_counter()
    for r in range(1, rounds + 1):
        if redraw:
            progress._last_refresh = 0.0
        progress.update(r, 0.5, 1.0, row, book)
    elapsed = time.perf_counter() - start
    progress.close()
    stream.close()
    if tty:
        drain.join(timeout=5)
        os.close(master)
    return elapsed / rounds


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 65536):
            pass
    except OSError:  # the writer's side closed
        pass


def feed_per_round(run_dir: Path, live: Path) -> tuple[list[float], list[int], int]:
    """(seconds per poll, bytes per delta) replaying ``run_dir`` round by round into ``live``, and
    the snapshot's bytes at the end."""
    live.mkdir()
    (live / "config.toml").write_bytes((run_dir / "config.toml").read_bytes())
    ledger = (run_dir / "ledger.csv").read_bytes().splitlines(keepends=True)
    metrics = (run_dir / "metrics.csv").read_bytes().splitlines(keepends=True)
    by_round: dict[int, list[bytes]] = {}
    for line in ledger[1:]:
        by_round.setdefault(int(line.split(b",")[2]), []).append(line)
    (live / "ledger.csv").write_bytes(ledger[0])
    (live / "metrics.csv").write_bytes(metrics[0])
    feed = RunFeed(live)
    feed.poll()
    times, sizes = [], []
    for r, row in enumerate(metrics[1:]):
        with open(live / "ledger.csv", "ab") as f:
            f.write(b"".join(by_round.get(r, [])))
        with open(live / "metrics.csv", "ab") as f:
            f.write(row)
        start = time.perf_counter()
        delta = feed.poll()
        times.append(time.perf_counter() - start)
        sizes.append(len(json.dumps(delta, allow_nan=False)))
    return times, sizes, len(json.dumps(feed.snapshot(), allow_nan=False))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--reps", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        run_experiment(load_config_text(EXPERIMENT.format(nodes=args.nodes)), out_dir=run_dir, quiet=True)
        walls = [m["wall_s"] for m in read_metrics(run_dir)]
        round_s = statistics.median(b - a for a, b in zip(walls, walls[1:]))
        book = LedgerBook(range(args.nodes))
        book.extend(read_ledger(run_dir / "ledger.csv"))
        tty = statistics.median(progress_cost_s(book, tty=True) for _ in range(args.reps))
        plain = statistics.median(progress_cost_s(book, tty=False) for _ in range(args.reps))
        redraw = statistics.median(progress_cost_s(book, tty=True, rounds=200, redraw=True) for _ in range(args.reps))
        print(f"{args.nodes} nodes, floor: median round of the sim run {1e3 * round_s:.2f} ms")
        print(f"progress update on a terminal (rich)  {1e6 * tty:8.1f} us/round  = {100 * tty / round_s:.3f} % of a round")
        print(f"one redraw of the bar (rich; <= {1 / REFRESH_S:.0f}/s)   {1e6 * redraw:8.1f} us        "
              f"= {100 * redraw / REFRESH_S:.3f} % of the time between redraws")
        print(f"progress update in a log (plain)      {1e6 * plain:8.1f} us/round  = {100 * plain / round_s:.3f} % of a round")
        polls, sizes, snapshot = [], [], 0
        for rep in range(args.reps):
            t, s, snapshot = feed_per_round(run_dir, Path(tmp) / f"live{rep}")
            polls.append(statistics.median(t))
            sizes = s
        print(f"watch feed poll per round             {1e3 * statistics.median(polls):8.2f} ms")
        print(f"delta per round {statistics.median(sizes) / 1e3:.1f} kB, full snapshot {snapshot / 1e3:.1f} kB")
        ok = tty / round_s < 0.01 and plain / round_s < 0.01 and redraw / REFRESH_S < 0.01
        print("progress line under 1 % of a round:", "yes" if ok else "NO")


if __name__ == "__main__":
    main()
