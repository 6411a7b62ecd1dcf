"""Benchmark: the digits CNN job (100 nodes × 10 rounds × 10 local steps, batch 32, averaging after
each round) on testbed.learning.torch_models' vectorised step, against its floor.

1. testbed: ``TorchModel("cnn", 64, 10).loss_and_grad`` (what DP-PASGD, DWFL and PADPFL call): all
   100 nodes in one step of the node-folded network (grouped convolutions, batched matrix products,
   one autograd pass), parameters as the algorithms hold them (float64 numpy, a leading node axis);
2. the floor it must beat: a Python loop over 100 ``torch.nn.Module`` copies of the same network,
   autograd and an in-place SGD step each (how a per-client simulation runs it). Target: >= 5x faster;
3. clipped: the same job with per-sample gradients clipped at C = 1. Target: <= 1.5x the unclipped job.

Images: the 8×8 digits scikit-learn ships (1,797 of them; 100 nodes × 32 need drawing with
replacement, which changes nothing of the arithmetic), scaled as the loaders scale them. Each figure
is the median of --repeats runs of the whole job, the three interleaved so that a busy machine
slows them alike (the loop, Python-bound, suffers most from a loaded machine). --threads sets
torch's threads for all three (torch's default is one per core); on a loaded machine give 1: with
more threads than free cores every parallel kernel waits for a descheduled OpenMP thread, and the
wall times scatter by 10x. The CPU seconds printed beside them are steadier there. Flower's simulation
of the job, against `testbed run`: benchmarks/flower_cnn.py (the optional extra flower-bench).

Usage: python benchmarks/torch_models.py [--repeats 5] [--nodes 100] [--threads N]
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time

import numpy as np

ROUNDS, STEPS, BATCH, LR, CLIP = 10, 10, 32, 0.1, 1.0


def _digits(nodes: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(nodes, ROUNDS·STEPS, BATCH, 64) images scaled into the unit ball, and their labels."""
    from testbed.data.images import _pool

    x_pool, y_pool, top = _pool("digits", None)
    idx = np.random.default_rng(seed).integers(0, len(y_pool), (nodes, ROUNDS * STEPS, BATCH))
    return x_pool[idx] / (top * 8.0), y_pool[idx]  # pixels in [0, 1], rows divided by sqrt(64)


def testbed_job(x: np.ndarray, y: np.ndarray, clip: float | None) -> tuple[float, float]:
    """The job on TorchModel's step of all nodes at once: (wall, CPU) seconds."""
    from testbed.learning.torch_models import TorchModel

    model = TorchModel("cnn", 64, 10)
    nodes = x.shape[0]
    theta = model.init(np.random.default_rng(0))
    weights = np.full((nodes, BATCH), 1.0 / BATCH)
    start, cpu = time.perf_counter(), time.process_time()
    for r in range(ROUNDS):
        params = np.repeat(theta[None], nodes, axis=0)
        for s in range(STEPS):
            k = r * STEPS + s
            _, grad = model.loss_and_grad(params, x[:, k], y[:, k], weights, clip)
            params -= LR * grad
        theta = params.mean(axis=0)
    return time.perf_counter() - start, time.process_time() - cpu


def loop_job(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """The job as a Python loop over one torch module per node (the floor): (wall, CPU) seconds."""
    import torch

    from testbed.learning.torch_models import build_network

    nodes = x.shape[0]
    global_net = build_network("cnn", 64, 10)
    nets = [copy.deepcopy(global_net) for _ in range(nodes)]
    xs, ys = torch.from_numpy(x.astype(np.float32)), torch.from_numpy(y)
    loss_fn = torch.nn.functional.cross_entropy
    start, cpu = time.perf_counter(), time.process_time()
    for r in range(ROUNDS):
        for net in nets:
            net.load_state_dict(global_net.state_dict())
        for s in range(STEPS):
            k = r * STEPS + s
            for m, net in enumerate(nets):
                net.zero_grad(set_to_none=True)
                loss_fn(net(xs[m, k]), ys[m, k]).backward()
                with torch.no_grad():
                    for p in net.parameters():
                        p -= LR * p.grad
        with torch.no_grad():
            for name, p in global_net.named_parameters():
                p.copy_(torch.stack([dict(net.named_parameters())[name] for net in nets]).mean(dim=0))
    return time.perf_counter() - start, time.process_time() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's, one per core)")
    args = parser.parse_args()
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)

    x, y = _digits(args.nodes)
    from testbed.learning.torch_models import TorchModel

    model = TorchModel("cnn", 64, 10)  # warm-up: torch's first calls build their kernels' caches
    params = np.repeat(model.init(np.random.default_rng(0))[None], args.nodes, axis=0)
    for clip in (None, CLIP):
        model.loss_and_grad(params, x[:, 0], y[:, 0], np.full((args.nodes, BATCH), 1.0 / BATCH), clip)
    runs: dict[str, list[tuple[float, float]]] = {"testbed": [], "loop": [], "clipped": []}
    for _ in range(args.repeats):  # interleaved, so a busy machine slows all three alike
        runs["testbed"].append(testbed_job(x, y, None))
        runs["loop"].append(loop_job(x, y))
        runs["clipped"].append(testbed_job(x, y, CLIP))
    med = {k: statistics.median(wall for wall, _ in v) for k, v in runs.items()}
    cpu = {k: statistics.median(c for _, c in v) for k, v in runs.items()}
    steps = ROUNDS * STEPS
    print(f"digits CNN job: {args.nodes} nodes x {ROUNDS} rounds x {STEPS} local steps, batch {BATCH}; "
          f"torch {torch.__version__}, {torch.get_num_threads()} threads; median of {args.repeats}; "
          f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    for key, label in (("testbed", "all nodes at once (testbed)"), ("loop", "Python loop over nodes (floor)"),
                       ("clipped", "testbed, per-sample clipped")):
        print(f"  {label:34s} {med[key]:7.2f} s  ({1e3 * med[key] / steps:6.1f} ms per step; CPU {cpu[key]:6.2f} s)")
    speedup = med["loop"] / med["testbed"]
    clip_cost = med["clipped"] / med["testbed"]
    print(f"  loop / testbed     = {speedup:5.2f}x  (target >= 5x)   {'OK' if speedup >= 5 else 'MISSED'}")
    print(f"  clipped / testbed  = {clip_cost:5.2f}x  (target <= 1.5x) {'OK' if clip_cost <= 1.5 else 'MISSED'}")
    print(f"  in CPU seconds (all threads; steadier on a shared machine): loop / testbed = "
          f"{cpu['loop'] / cpu['testbed']:.2f}x, clipped / testbed = {cpu['clipped'] / cpu['testbed']:.2f}x")


if __name__ == "__main__":
    main()
