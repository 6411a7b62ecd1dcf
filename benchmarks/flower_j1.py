"""Benchmark (issue 14's table): job J1 on the testbed against the same job on Flower's simulation.

J1: DP-PASGD logistic regression, d = 100, τ = 10 noisy SGD steps (batch 32, lr 0.5, Gaussian
noise σ = 1 on each step's gradient) on each node's 400 training samples (of 500), averaging and an
evaluation of the global model every round. Two sizes: 100 nodes × 10 rounds and 1,000 nodes ×
5 rounds. Whole-process wall time, median of --repeats runs, of

- `testbed run benchmarks/j1.toml --set data.num_nodes=N --set dp_pasgd.steps=10·R` in sim,
- the same with `--mode mqtt` (every node an emulated board on its own MQTT connection, embedded
  broker; 1,000 nodes on two host processes, as benchmarks/j1_mqtt.py runs them),
- this script's Flower job (`--flower N R`): one NumPyClient per node whose fit() runs the floor's
  τ steps (benchmarks/j1_floor.py) on its own data in numpy, FedAvg with equal weights, the floor's
  evaluation on the server each round (benchmarks/flower_harness.py).

The data is the floor's synthetic draw; each client draws its batches and noise from its own
generator (seeded by round and node), so every node does the same work as in the testbed.
Targets (testbed / Flower, issue 44): sim <= 0.05 at both sizes; MQTT <= 0.10 at both sizes.

Flower runs in its own venv (the `flower-bench` extra: flwr 1.4x pins ray and typer against the
coordinator's amqtt), named by --flower-python or FLOWER_PYTHON (default: .venv-flower/bin/python
when it exists, else this Python); the Flower side needs numpy and flwr only, not the testbed. The
testbed side runs with this script's own Python. `make bench-flower` makes .venv-flower and runs it.

Usage: python benchmarks/flower_j1.py [--repeats 3] [--only sim] [--sizes 100x10] [--flower-python PATH]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from flower_harness import median_wall, print_ratios, run_flower, testbed_run  # noqa: E402
from j1 import HERE, compile_project  # noqa: E402
from j1_floor import draw_round, evaluate, local_steps, synthetic_data  # noqa: E402

TAU, BATCH, DIM, SAMPLES, LR, SIGMA = 10, 32, 100, 500, 0.5, 1.0
#: (nodes, rounds) → targets of testbed / Flower for sim and MQTT.
SIZES = {(100, 10): {"testbed sim": 0.05, "testbed mqtt": 0.10}, (1000, 5): {"testbed sim": 0.05, "testbed mqtt": 0.10}}
FLOWER_VENV_PYTHON = HERE.parent / ".venv-flower" / "bin" / "python"


def flower_python(given: str | None) -> str:
    """The Python whose venv has flwr[simulation]: ``given``, else FLOWER_PYTHON, else
    .venv-flower's (``make bench-flower``) when it exists, else this one."""
    chosen = given or os.environ.get("FLOWER_PYTHON")
    if chosen:
        return chosen
    return str(FLOWER_VENV_PYTHON) if FLOWER_VENV_PYTHON.exists() else sys.executable


def dp_pasgd_client(node: int, shared: dict[str, np.ndarray]):
    """The Flower client of node ``node``: fit() runs J1's τ noisy steps on the node's own data."""
    from flwr.client import NumPyClient

    x_train, y_train = shared["x_train"][node][None], shared["y_train"][node][None]

    class DpPasgdClient(NumPyClient):
        def fit(self, parameters: list[np.ndarray], config: dict) -> tuple[list[np.ndarray], int, dict]:
            rng = np.random.default_rng([int(config["round"]), node])
            idx, noise = draw_round(rng, 1, TAU, x_train.shape[1], BATCH, DIM, SIGMA)
            local = parameters[0][None].copy()
            local_steps(local, x_train, y_train, idx, noise, LR)
            return [local[0]], x_train.shape[1], {}

    return DpPasgdClient()


def flower_job(nodes: int, rounds: int) -> None:
    """J1 on Flower's simulation: ``nodes`` clients, ``rounds`` rounds."""
    x_train, y_train, x_test, y_test = synthetic_data(np.random.default_rng(0), nodes, SAMPLES, DIM)

    def server_evaluate(_round: int, arrays: list[np.ndarray]) -> tuple[float, dict]:
        loss, acc = evaluate(arrays[0], x_train, y_train, x_test, y_test)
        return loss, {"accuracy": acc}

    loss, metrics = run_flower(dp_pasgd_client, nodes, rounds, [np.zeros((DIM + 1, 2))], server_evaluate,
                   {"x_train": x_train, "y_train": y_train})
    print(f"flower: final train loss {loss:.4f}, test accuracy {metrics['accuracy']:.4f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--flower", nargs=2, type=int, metavar=("NODES", "ROUNDS"),
                        help="run only the Flower job in this process (what the benchmark times)")
    parser.add_argument("--flower-python", help="the Python of the venv with flwr[simulation] "
                        "(default: $FLOWER_PYTHON, else .venv-flower/bin/python, else this one)")
    parser.add_argument("--only", choices=("sim", "mqtt"), help="time the testbed in this mode only")
    parser.add_argument("--sizes", nargs="+", choices=[f"{n}x{r}" for n, r in SIZES],
                        default=[f"{n}x{r}" for n, r in SIZES], help="the sizes to run (NODESxROUNDS)")
    args = parser.parse_args()
    if args.flower:
        flower_job(*args.flower)
        return
    flower = flower_python(args.flower_python)
    version = subprocess.run([flower, "-c", "import flwr; print(flwr.__version__)"], capture_output=True, text=True)
    if version.returncode != 0:
        raise SystemExit(f"no flwr in {flower}: make bench-flower (or set FLOWER_PYTHON) makes a venv with it")
    print(f"Flower {version.stdout.strip()} ({flower}); J1 (d = {DIM}, tau = {TAU}, batch {BATCH}, "
          f"{SAMPLES} samples per node); load average {', '.join(f'{x:.2f}' for x in os.getloadavg())}")
    modes = ("sim", "mqtt") if args.only is None else (args.only,)
    compile_project()
    with tempfile.TemporaryDirectory() as tmp:
        for (nodes, rounds), all_targets in SIZES.items():
            if f"{nodes}x{rounds}" not in args.sizes:
                continue
            sets = [f"data.num_nodes={nodes}", f"dp_pasgd.steps={TAU * rounds}"]
            hosts = [f"mqtt.hosts={1 if nodes <= 100 else 2}", "mqtt.connect_timeout_s=300"]
            commands = {
                "testbed sim": lambda i: testbed_run(HERE / "j1.toml", f"{tmp}/sim-{nodes}-{i}", *sets, mode="sim"),
                "testbed mqtt": lambda i: testbed_run(HERE / "j1.toml", f"{tmp}/mqtt-{nodes}-{i}", *sets, *hosts,
                                                      mode="mqtt"),
                "flower": lambda i: [flower, __file__, "--flower", str(nodes), str(rounds)],
            }
            commands = {name: cmd for name, cmd in commands.items() if name == "flower" or name.split()[1] in modes}
            targets = {name: t for name, t in all_targets.items() if name in commands}
            runs = median_wall(commands, args.repeats)
            print_ratios(f"J1 {nodes} nodes x {rounds} rounds (load average now "
                         f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}):", runs, "flower", targets)


if __name__ == "__main__":
    main()
