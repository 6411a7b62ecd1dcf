"""Benchmark J1 over MQTT (HIL-runtime issue).

1. Whole-process wall time of `testbed run benchmarks/j1_mqtt.toml` (J1, 100 emulated nodes, 10
   rounds) over the embedded broker and over Mosquitto, next to the same job in sim mode (the floor
   here), median of --repeats runs. Target: <= 5x sim. And over the embedded broker without message
   authentication (mqtt.authenticate = false): what sealing and verifying every frame costs.
2. 1,000 emulated nodes on two host processes complete 3 rounds (embedded broker and Mosquitto).
3. Peak RSS of one host process serving 100 nodes. Target: <= 1.5 GB.

Usage: python benchmarks/j1_mqtt.py [--repeats 3] [--wall-only]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from j1 import HERE, TESTBED  # noqa: E402
from timing import timed  # noqa: E402

from testbed.mqtt import auth  # noqa: E402
from testbed.mqtt.brokers.mosquitto import MosquittoBroker  # noqa: E402

JOB = str(HERE / "j1_mqtt.toml")


def run(out: str, *sets: str) -> float:
    args = TESTBED + ["run", JOB, "--quiet", "--out", out]
    for s in sets:
        args += ["--set", s]
    return timed(args).wall_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--wall-only", action="store_true", help="part 1 only (the wall times)")
    args = parser.parse_args()
    have_mosquitto = shutil.which("mosquitto") is not None
    with tempfile.TemporaryDirectory() as tmp:
        times: dict[str, list[float]] = {"sim": [], "embedded": [], "no-auth": [], "mosquitto": []}
        for i in range(args.repeats):
            times["sim"].append(run(f"{tmp}/sim-{i}", "run.mode='sim'"))
            times["embedded"].append(run(f"{tmp}/emb-{i}", "mqtt.broker='embedded'"))
            times["no-auth"].append(run(f"{tmp}/emb-noauth-{i}", "mqtt.broker='embedded'", "mqtt.authenticate=false"))
            if have_mosquitto:
                with MosquittoBroker() as broker:
                    times["mosquitto"].append(run(f"{tmp}/mos-{i}", f"mqtt.broker_url='{broker.url}'"))
        sim = statistics.median(times["sim"])
        for name, ts in times.items():
            if not ts:
                print(f"J1 mqtt {name:9s}: skipped (no mosquitto binary)")
                continue
            med = statistics.median(ts)
            print(f"J1 mqtt {name:9s}: {med:6.2f} s (median of {len(ts)}: {', '.join(f'{t:.2f}' for t in ts)})"
                  + ("" if name == "sim" else f"  ratio to sim {med / sim:.2f} (target <= 5)"))
        # the fastest of each: what a shared machine's load added least to
        sealed, unsealed = min(times["embedded"]), min(times["no-auth"])
        print(f"message authentication over the embedded broker: {sealed - unsealed:+.2f} s "
              f"({100 * (sealed / unsealed - 1):+.1f} %) of the unauthenticated run's {unsealed:.2f} s (fastest of each)")
        if args.wall_only:
            return

        # One host of 100 nodes in its own process, so its peak RSS is its own; its nodes' message
        # keys in a file, as `testbed provision` writes them.
        keys = auth.write_keys(Path(tmp) / "keys.json", auth.Keys("j1", {str(n): auth.new_key() for n in range(100)}))
        with MosquittoBroker() as broker:
            host = subprocess.Popen(TESTBED + ["nodes", "--broker", broker.url, "--count", "100", "--keys", str(keys)],
                                    stdout=subprocess.DEVNULL)
            run(f"{tmp}/host", f"mqtt.broker_url='{broker.url}'", "mqtt.emulated=false", f"mqtt.keys='{keys}'")
            _, _, usage = os.wait4(host.pid, 0)
        print(f"peak RSS of a host of 100 nodes: {usage.ru_maxrss / 1024:.0f} MB (target <= 1536 MB)")

        big = ["data.num_nodes=1000", "dp_pasgd.steps=30", "mqtt.hosts=2", "mqtt.connect_timeout_s=300"]
        brokers = [("embedded broker", None)] + ([("Mosquitto", MosquittoBroker)] if have_mosquitto else [])
        for name, broker_cls in brokers:
            out = f"{tmp}/big-{name.split()[0]}"
            try:
                if broker_cls is None:
                    wall = run(out, *big, "mqtt.broker='embedded'")
                else:
                    with broker_cls() as broker:
                        wall = run(out, *big, f"mqtt.broker_url='{broker.url}'")
                rounds = json.loads(Path(f"{out}/summary.json").read_text())["rounds"]
                print(f"1,000 emulated nodes on 2 hosts, {name}: {rounds} rounds in {wall:.1f} s")
            except SystemExit as failed:
                print(f"1,000 emulated nodes on 2 hosts, {name}: FAILED ({failed})")


if __name__ == "__main__":
    main()
