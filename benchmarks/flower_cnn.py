"""Benchmark (issue 17): the digits CNN job on the testbed against the same job on Flower's simulation.

The job (benchmarks/digits_cnn.toml): 100 nodes × 10 rounds × 10 local SGD steps (lr 0.1) of the
small CNN of testbed.learning.torch_models on the 8×8 digits, a batch being a node's 13 training images,
averaging and an evaluation of the global model every round. Whole-process wall time, median of
--repeats runs, of

- `testbed run benchmarks/digits_cnn.toml` (sim: all nodes' steps vmapped in one process),
- this script's Flower job (`--flower`): one NumPyClient per node training the same torch network
  with a plain loop over its steps (one torch thread per client, so Ray's actors, one per core, do
  not fight over cores), FedAvg with equal weights, the global model evaluated on the server each
  round (benchmarks/flower_harness.py). Its data is the testbed run's own (testbed's loader).

Target: testbed <= 0.2 × Flower.

Usage: python benchmarks/flower_cnn.py [--repeats 3]   (needs `pip install -e '.[flower-bench]'`)
"""

from __future__ import annotations

import argparse
import functools
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from flower_harness import median_wall, print_ratios, run_flower, testbed_run  # noqa: E402
from j1 import HERE  # noqa: E402

JOB = HERE / "digits_cnn.toml"


def cnn_client(node: int, shared: dict[str, np.ndarray], *, tau: int, batch: int, lr: float, n_classes: int):
    """The Flower client of node ``node``: fit() runs tau SGD steps (batch, lr) of the CNN on its own
    training images (shared: the train split's x, y and offsets)."""
    import torch
    from flwr.client import NumPyClient

    from testbed.learning.torch_models import build_network

    torch.set_num_threads(1)
    lo, hi = shared["offsets"][node], shared["offsets"][node + 1]
    x, y = torch.from_numpy(shared["x"][lo:hi].astype(np.float32)), torch.from_numpy(shared["y"][lo:hi])
    net = build_network("cnn", x.shape[1], n_classes)

    class CnnClient(NumPyClient):
        def fit(self, parameters: list[np.ndarray], config: dict) -> tuple[list[np.ndarray], int, dict]:
            net.load_state_dict({k: torch.from_numpy(a) for k, a in zip(net.state_dict(), parameters)})
            rng = np.random.default_rng([int(config["round"]), node])
            for _ in range(tau):
                idx = torch.from_numpy(rng.choice(len(y), batch, replace=False))
                net.zero_grad(set_to_none=True)
                torch.nn.functional.cross_entropy(net(x[idx]), y[idx]).backward()
                with torch.no_grad():
                    for p in net.parameters():
                        p -= lr * p.grad
            return [v.detach().numpy() for v in net.state_dict().values()], len(y), {}

    return CnnClient()


def flower_job() -> None:
    """The job of JOB on Flower's simulation, on the data `testbed run JOB` loads."""
    import torch

    from testbed.assembly.assemble import load_data
    from testbed.assembly.config import load_config
    from testbed.learning.torch_models import build_network

    config = load_config(JOB)
    data = load_data(config.data, config.run.seed)
    a = config.dp_pasgd
    torch.manual_seed(config.run.seed)
    net = build_network("cnn", data.dim, data.n_classes)
    train_x, train_y = torch.from_numpy(data.train.x.astype(np.float32)), torch.from_numpy(data.train.y)
    test_x, test_y = torch.from_numpy(data.test.x.astype(np.float32)), torch.from_numpy(data.test.y)

    def server_evaluate(_round: int, arrays: list[np.ndarray]) -> tuple[float, dict]:
        net.load_state_dict({k: torch.from_numpy(v) for k, v in zip(net.state_dict(), arrays)})
        with torch.no_grad():
            loss = float(torch.nn.functional.cross_entropy(net(train_x), train_y))
            acc = float((net(test_x).argmax(-1) == test_y).double().mean())
        return loss, {"accuracy": acc}

    shared = {"x": data.train.x, "y": data.train.y, "offsets": data.train.offsets}
    client = functools.partial(cnn_client, tau=a.tau, batch=a.batch, lr=a.lr, n_classes=data.n_classes)
    loss, metrics = run_flower(client, data.num_nodes, a.steps // a.tau, [v.numpy() for v in net.state_dict().values()],
                   server_evaluate, shared)
    print(f"flower: final train loss {loss:.4f}, test accuracy {metrics['accuracy']:.4f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--flower", action="store_true", help="run only the Flower job in this process")
    args = parser.parse_args()
    if args.flower:
        flower_job()
        return
    import flwr
    import torch

    print(f"Flower {flwr.__version__}, torch {torch.__version__}; {JOB.name}")
    with tempfile.TemporaryDirectory() as tmp:
        runs = median_wall({"testbed run": lambda i: testbed_run(JOB, f"{tmp}/cnn-{i}"),
                            "flower": lambda i: [sys.executable, __file__, "--flower"]}, args.repeats)
    print_ratios("digits CNN, 100 nodes x 10 rounds x 10 local steps:", runs, "flower", {"testbed run": 0.2})


if __name__ == "__main__":
    main()
