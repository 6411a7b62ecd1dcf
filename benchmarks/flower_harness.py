"""What the Flower comparisons (benchmarks/flower_j1.py, benchmarks/flower_cnn.py) share: running a
job on Flower's Ray-based simulation runtime, and timing whole processes against `testbed run`.

Flower (``pip install -e '.[flower-bench]'``) is an optional benchmark extra, never a dependency
of the testbed: only these benchmarks import it.

A job on Flower: one ``NumPyClient`` per node (built by ``make_client(node, shared)`` in a Ray
actor, one actor per core), FedAvg over all nodes every round with equal weights (every client
reports the same example count), and ``evaluate(round, params)`` of the global model on the server
each round, as the testbed evaluates it. The nodes' data goes once into Ray's object store
(``shared``: name → array); the actors read it zero-copy, so no client pays for a pickled copy.
"""

from __future__ import annotations

import logging
import os
import statistics
import sys
from pathlib import Path
from typing import Any, Callable

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from j1 import TESTBED, timed  # noqa: E402


def run_flower(make_client: Callable[[int, dict[str, np.ndarray]], Any], num_nodes: int, rounds: int,
               initial: list[np.ndarray], evaluate: Callable[[int, list[np.ndarray]], tuple[float, dict]],
               shared: dict[str, np.ndarray]) -> tuple[float, dict]:
    """Run ``rounds`` rounds of FedAvg over ``num_nodes`` Flower clients in Flower's simulation.

    make_client(node, shared) -> flwr NumPyClient: node in [0, num_nodes), shared the arrays of
    ``shared`` (read-only views of Ray's object store). initial: the global model's arrays. evaluate:
    Flower's centralised ``evaluate_fn`` (round, arrays) -> (loss, metrics), on the server each round.
    Returns the last round's evaluation.
    """
    import ray
    from flwr.client import ClientApp
    from flwr.common import Context, ndarrays_to_parameters
    from flwr.server import ServerApp, ServerAppComponents, ServerConfig
    from flwr.common.logger import FLOWER_LOGGER
    from flwr.server.strategy import FedAvg
    from flwr.simulation import run_simulation

    FLOWER_LOGGER.setLevel(logging.WARNING)  # not a line per round on the benchmark's terminal

    # As Flower's own ray.init: the actors import the benchmarks' modules from the driver's sys.path.
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False, logging_level="ERROR",
             runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(sys.path)}})
    # Contiguous: Ray hands a C-contiguous array to the actors zero-copy; a strided one (a slice of
    # the nodes' samples) it would copy into every client (0.2 s at 1,000 nodes).
    refs = {name: ray.put(np.ascontiguousarray(array)) for name, array in shared.items()}
    evaluated: list[tuple[float, dict]] = []  # the ServerApp runs in this process

    def client_fn(context: Context) -> Any:
        arrays = {name: ray.get(ref) for name, ref in refs.items()}
        return make_client(int(context.node_config["partition-id"]), arrays).to_client()

    def server_evaluate(round_index: int, arrays: list[np.ndarray], _config: dict) -> tuple[float, dict]:
        evaluated.append(evaluate(round_index, arrays))
        return evaluated[-1]

    def server_fn(context: Context) -> ServerAppComponents:
        strategy = FedAvg(fraction_fit=1.0, fraction_evaluate=0.0, min_fit_clients=num_nodes,
                          min_available_clients=num_nodes, initial_parameters=ndarrays_to_parameters(initial),
                          on_fit_config_fn=lambda r: {"round": r},
                          evaluate_fn=server_evaluate)
        return ServerAppComponents(strategy=strategy, config=ServerConfig(num_rounds=rounds))

    run_simulation(server_app=ServerApp(server_fn=server_fn), client_app=ClientApp(client_fn=client_fn),
                   num_supernodes=num_nodes, backend_config={"client_resources": {"num_cpus": 1, "num_gpus": 0.0}})
    if len(evaluated) != rounds + 1:  # round 0 (the initial model) and every round
        raise SystemExit(f"Flower's simulation evaluated {len(evaluated)} times, not {rounds + 1}")
    return evaluated[-1]


def testbed_run(job: Path, out: str, *sets: str, mode: str | None = None) -> list[str]:
    """The command `testbed run job --quiet --out out [--mode mode] --set s...`."""
    cmd = TESTBED + ["run", str(job), "--quiet", "--out", out] + (["--mode", mode] if mode else [])
    for s in sets:
        cmd += ["--set", s]
    return cmd


def median_wall(cmds: dict[str, Callable[[int], list[str]]], repeats: int) -> dict[str, list[float]]:
    """Wall seconds of each command (cmds: name → the command of repeat i), ``repeats`` times,
    interleaved so that a busy machine slows all alike."""
    runs: dict[str, list[float]] = {name: [] for name in cmds}
    for i in range(repeats):
        for name, cmd in cmds.items():
            runs[name].append(timed(cmd(i)).wall_s)
    return runs


def print_ratios(job: str, runs: dict[str, list[float]], flower: str, targets: dict[str, float]) -> None:
    """Print each run's median and, for each name of ``targets``, its ratio to ``flower``'s median."""
    med = {name: statistics.median(ts) for name, ts in runs.items()}
    print(job)
    for name, ts in runs.items():
        print(f"  {name:22s} {med[name]:7.2f} s  (median of {len(ts)}: {', '.join(f'{t:.2f}' for t in ts)})")
    for name, target in targets.items():
        ratio = med[name] / med[flower]
        print(f"  {name} / {flower}: {ratio:.3f}  (target <= {target})  {'OK' if ratio <= target else 'MISSED'}")
