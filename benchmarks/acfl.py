"""ACFL benchmark (issue 11): the paper's Sec. V setting in sim against its floor, and over MQTT.

1. Whole-process time of `testbed run benchmarks/acfl.toml` (N = 100, m = 100, d = o = 10, 1000
   iterations, Bernoulli p = 0.2; ledger, metrics, checkpoints and summary included), median of
   --repeats, next to `benchmarks/acfl_floor.py`, the same math as a plain numpy loop. Target ≤ 1.5×.
2. The same with 100 emulated nodes over MQTT (--hosts processes) for 100 iterations, against
   sim for the same 100 iterations, each MQTT run on the broker it starts itself: the default
   (``mqtt.broker = "auto"``: Mosquitto where it is installed, its start and stop in the run's
   time) and the embedded amqtt broker (``mqtt.broker = "embedded"``, printed as information).
   Target ≤ 3× on the default broker (issue 44). The CPU line says what bounds it: the MQTT run's CPU
   seconds over this machine's cores is the least wall time it could take.

   Each MQTT run is bracketed by two sim runs (sim, MQTT, sim, MQTT, ..., sim: --repeats MQTT
   runs, one sim run more) and compared with their mean; the target is judged on the median of
   these bracketed ratios. Why: this machine's speed drifts by up to 2x over tens of seconds (the
   same sim run took 0.58 s and 1.36 s within one benchmark), and a sim run is mostly the
   interpreter's start and imports, which a fast phase shortens more than the MQTT run: the ratio
   of the two medians could set a sim run of a fast phase against MQTT runs of a slow one (5.87x
   from three sim/MQTT pairs whose own ratios were 4.1, 6.3 and 3.7). A bracket cancels a drift
   that is linear over its three runs. The ratio of the medians is printed too.

   With ``--against REV`` (a commit, branch or tag) part 2 also runs from a git worktree of REV
   made for the call (and removed after), the two trees alternated (this tree's MQTT run, then
   REV's, ...), each MQTT run bracketed by sim runs of its own tree: printed are each side's
   median bracketed ratio and the median of the pairs' ratios of the MQTT runs, this / REV. A
   change to how a round is sent or taken says so against the code before it in one sitting; the
   two runs of a pair are seconds apart, the rows of this machine's table are not.

Wall seconds and CPU seconds (user + system of the process and its children) are both printed:
on a loaded host wall time is noisy, CPU time less so (a drift of the machine's speed moves both); the runs of each comparison alternate (sim,
MQTT, sim, MQTT...) so that both see the same load, and the load average is printed with them.
``--out-root`` puts the run directories there (e.g. /dev/shm: no fsync cost for the per-round
checkpoint).

Usage: python benchmarks/acfl.py [--repeats 3] [--hosts 2] [--out-root DIR] [--skip-mqtt | --only-mqtt]
                                [--brokers auto,embedded] [--against REV]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

from timing import REPO, Timing, compile_project, timed, worktree

HERE = Path(__file__).resolve().parent
TESTBED = [sys.executable, "-m", "testbed"]
CONFIG = str(HERE / "acfl.toml")


def median_pair(runs: list) -> tuple[float, float]:
    """(median wall s, median CPU s) of timing.Timing runs."""
    return statistics.median(r.wall_s for r in runs), statistics.median(r.cpu_s for r in runs)


def bracketed_ratios(sim_s: list[float], mqtt_s: list[float]) -> list[float]:
    """``mqtt_s[i]`` over the mean of ``sim_s[i]`` and ``sim_s[i + 1]``, the sim runs just before
    and after it (``len(sim_s) == len(mqtt_s) + 1``).

    >>> bracketed_ratios([1.0, 0.6, 0.8], [4.0, 3.5])
    [5.0, 5.0]
    """
    if len(sim_s) != len(mqtt_s) + 1:
        raise ValueError(f"{len(mqtt_s)} MQTT runs need {len(mqtt_s) + 1} sim runs around them, got {len(sim_s)}")
    return [m / ((before + after) / 2) for m, before, after in zip(mqtt_s, sim_s, sim_s[1:])]


def own_brackets(sim_s: list[float], mqtt_s: list[float]) -> list[float]:
    """``mqtt_s[k]`` over the mean of ``sim_s[2k]`` and ``sim_s[2k + 1]``: each MQTT run between two
    sim runs of its own tree (``--against``, whose sides alternate: sim, MQTT, sim of one tree,
    then of the other).

    >>> own_brackets([1.0, 0.6, 0.5, 0.7], [4.0, 3.0])
    [5.0, 5.0]
    """
    if len(sim_s) != 2 * len(mqtt_s):
        raise ValueError(f"{len(mqtt_s)} MQTT runs need {2 * len(mqtt_s)} sim runs of their own, got {len(sim_s)}")
    return [r for k, m in enumerate(mqtt_s) for r in bracketed_ratios(sim_s[2 * k:2 * k + 2], [m])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--hosts", type=int, default=2, help="emulated host processes over MQTT")
    parser.add_argument("--out-root", help="where run directories go (default: a temporary directory)")
    parts = parser.add_mutually_exclusive_group()
    parts.add_argument("--skip-mqtt", action="store_true", help="part 1 only")
    parts.add_argument("--only-mqtt", action="store_true", help="part 2 only")
    parser.add_argument("--brokers", default="auto,embedded",
                        help="mqtt.broker of part 2's runs, comma separated (auto: the default, which the "
                             "target is judged on; embedded, mosquitto)")
    parser.add_argument("--against", metavar="REV",
                        help="part 2 alternated with a git worktree of REV: the ratio this / REV")
    args = parser.parse_args()
    compile_project()
    with tempfile.TemporaryDirectory(dir=args.out_root) as tmp, contextlib.ExitStack() as stack:
        if not args.only_mqtt:
            ours, floor = [], []
            for i in range(args.repeats):
                ours.append(timed(TESTBED + ["run", CONFIG, "--quiet", "--out", f"{tmp}/sim-{i}"]))
                floor.append(timed([sys.executable, str(HERE / "acfl_floor.py")]))
            (w_ours, c_ours), (w_floor, c_floor) = median_pair(ours), median_pair(floor)
            print(f"ACFL sim, Sec. V, 100 nodes x 1000 iterations: testbed run {w_ours:.2f} s wall, {c_ours:.2f} s CPU "
                  f"(median of {args.repeats}; {load()})")
            print(f"ACFL floor (plain numpy loop):                        {w_floor:.2f} s wall, {c_floor:.2f} s CPU")
            print(f"ACFL ratio testbed/floor: {w_ours / w_floor:.2f} wall, {c_ours / c_floor:.2f} CPU  (target <= 1.5)")
        if args.skip_mqtt:
            return
        sides = [("this tree", REPO)]
        if args.against:
            sides.append(stack.enter_context(worktree(args.against, tmp)))
        for broker in args.brokers.split(","):
            mqtt_part(broker, sides, args.repeats, args.hosts, tmp)


def mqtt_part(broker: str, sides: list[tuple[str, Path]], repeats: int, hosts: int, tmp: str) -> None:
    """Part 2 on ``broker``: ``repeats`` MQTT runs of each side ((label, tree): this tree first),
    the sides alternated, each MQTT run bracketed by two sim runs of its own tree; the ratios printed."""
    short = ["--set", "acfl.iterations=100"]
    sim: dict[str, list[Timing]] = {label: [] for label, _ in sides}
    mqtt: dict[str, list[Timing]] = {label: [] for label, _ in sides}

    def run(label: str, tree: Path, mode: str) -> Timing:
        out = f"{tmp}/{mode}-{broker}-{label[:4]}-{len(sim[label]) + len(mqtt[label])}"
        extra = [] if mode == "sim" else ["--mode", "mqtt", "--set", f"mqtt.hosts={hosts}",
                                          "--set", f"mqtt.broker={broker!r}"]
        return timed(TESTBED + ["run", CONFIG, "--quiet", "--out", out] + extra + short, tree)  # one job: this tree's

    for i in range(repeats):
        for label, tree in sides:
            if i == 0 or len(sides) > 1:  # one side alone: each sim run closes one bracket and opens the next
                sim[label].append(run(label, tree, "sim"))
            mqtt[label].append(run(label, tree, "mqtt"))
            sim[label].append(run(label, tree, "sim"))
    first = sides[0][0]
    ran = json.loads(Path(f"{tmp}/mqtt-{broker}-{first[:4]}-1/summary.json").read_text())["broker"]["kind"]
    name = f"{broker} broker ({ran})" if broker != ran else f"{broker} broker"
    target = "target <= 3" if broker == "auto" else "information; the target is the default broker's"
    cores = os.cpu_count() or 1
    for label, _ in sides:
        side = "" if len(sides) == 1 else f" [{label}]"
        (w_sim, c_sim), (w_mqtt, c_mqtt) = median_pair(sim[label]), median_pair(mqtt[label])
        sims, mqtts = [t.wall_s for t in sim[label]], [t.wall_s for t in mqtt[label]]
        bracketed = bracketed_ratios(sims, mqtts) if len(sides) == 1 else own_brackets(sims, mqtts)
        print(f"ACFL 100 iterations, {name}{side} (median of {repeats}; {load()}): sim {w_sim:.2f} s wall, "
              f"{c_sim:.2f} s CPU; MQTT (100 emulated nodes on {hosts} hosts) {w_mqtt:.2f} s wall, "
              f"{c_mqtt:.2f} s CPU (the broker's own included)")
        print(f"  runs, wall s: sim {', '.join(f'{t.wall_s:.2f}' for t in sim[label])}; "
              f"MQTT {', '.join(f'{t.wall_s:.2f}' for t in mqtt[label])}")
        print(f"  MQTT CPU over {cores} cores: {c_mqtt / cores:.2f} s, {c_mqtt / cores / w_sim:.2f}x sim's wall "
              f"(no wall time below it on this machine)")
        print(f"  bracketed ratios, each MQTT run over the mean of the sim runs before and after it: "
              f"{', '.join(f'{r:.2f}' for r in bracketed)}")
        print(f"ACFL ratio MQTT/sim, {name}{side}: {statistics.median(bracketed):.2f} wall (median of the "
              f"bracketed ratios; {target}); ratio of the medians {w_mqtt / w_sim:.2f} wall, "
              f"{c_mqtt / c_sim:.2f} CPU")
    if len(sides) > 1:
        rev = sides[1][0]
        ratios = [a.wall_s / b.wall_s for a, b in zip(mqtt[first], mqtt[rev])]
        print(f"  MQTT runs, this tree / {rev}: {statistics.median(ratios):.3f} wall (median of {repeats} "
              f"alternated pairs: {', '.join(f'{r:.3f}' for r in ratios)}); above 1 is a slow-down")


def load() -> str:
    """This machine's load average over the last 1, 5 and 15 minutes, and its cores."""
    one, five, fifteen = os.getloadavg()
    return f"load {one:.1f} {five:.1f} {fifteen:.1f} on {os.cpu_count()} cores"


if __name__ == "__main__":
    main()
