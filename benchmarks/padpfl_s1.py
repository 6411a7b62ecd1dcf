"""Benchmark: PADPFL scenario 1 in sim mode (60 clients × 30 rounds, MLP 64-64-10 ReLU, 10 FedProx
steps of 32 per round, clipping, client and server noise, impact ratios 0-1-2) against its floor.

1. Whole-process wall time of `testbed run benchmarks/padpfl_s1.toml` (ledger, metrics, summary,
   figures and the tight accountant included), median of --repeats runs;
2. the floor: the same math as a plain vectorised numpy loop (``--floor``: this file run as a
   script; one generator, no ledger, files or figures), the 60 clients stepped at once.

Target: ratio <= 1.5. Usage: python benchmarks/padpfl_s1.py [--repeats 3]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
from pathlib import Path

from timing import compile_project, timed

HERE = Path(__file__).resolve().parent


def floor(nodes: int = 60, rounds: int = 30, steps: int = 10, batch: int = 32, dim: int = 64, hidden: int = 64,
          classes: int = 10, samples: int = 188, lr: float = 0.02, mu: float = 0.01, clip: float = 10.0,
          uploads: int = 5, epsilon: float = 5.0, delta: float = 0.01) -> None:
    """The same math, plain numpy: FedProx on a stacked ReLU MLP, clip, eq. (8), eq. (11), eq. (13)."""
    import numpy as np

    rng = np.random.default_rng(0)
    n_train, n_test = (8 * samples) // 10, samples // 10
    w_true = rng.standard_normal((dim, classes)) * 8.0
    x = rng.standard_normal((nodes, samples, dim))
    x /= np.linalg.norm(x, axis=-1, keepdims=True)
    y = (x @ w_true + rng.gumbel(size=(nodes, samples, classes))).argmax(-1)
    x_tr, y_tr, x_te, y_te = x[:, :n_train], y[:, :n_train], x[:, n_train:n_train + n_test], y[:, n_train:n_train + n_test]
    p = np.repeat([0.0, 1.0, 2.0], nodes // 3)
    p /= p.sum()
    c = math.sqrt(2 * math.log(1.25 / delta))
    sigma_c = 2 * clip * uploads * c / (n_train * epsilon)
    q, pmax = float(p @ p), float(p.max())
    sigma_s = 2 * clip * c * math.sqrt(max(rounds**2 * pmax**2 - uploads**2 * q, 0.0)) / (n_train * epsilon)
    sizes = [dim * hidden, hidden, hidden * classes, classes]
    ends = np.cumsum(sizes)
    n_params = int(ends[-1])
    lim1, lim2 = math.sqrt(6 / (dim + hidden)), math.sqrt(6 / (hidden + classes))
    g = np.zeros(n_params)
    g[:ends[0]] = rng.uniform(-lim1, lim1, dim * hidden)
    g[ends[1]:ends[2]] = rng.uniform(-lim2, lim2, hidden * classes)
    ax = np.arange(nodes)[:, None]

    def split(v):
        lead = v.shape[:-1]
        return (v[..., :ends[0]].reshape(*lead, dim, hidden), v[..., ends[0]:ends[1]],
                v[..., ends[1]:ends[2]].reshape(*lead, hidden, classes), v[..., ends[2]:])

    for _ in range(rounds):
        start = np.repeat(g[None], nodes, axis=0)
        local = start.copy()
        idx = np.argpartition(rng.random((nodes, steps, n_train)), batch - 1, axis=-1)[..., :batch]
        for s in range(steps):
            xb, yb = x_tr[ax, idx[:, s]], y_tr[ax, idx[:, s]]
            w1, b1, w2, b2 = split(local)
            hid = np.maximum(xb @ w1 + b1[:, None], 0.0)
            z = hid @ w2 + b2[:, None]
            z -= z.max(-1, keepdims=True)
            pr = np.exp(z)
            pr /= pr.sum(-1, keepdims=True)
            pr[ax, np.arange(batch)[None], yb] -= 1.0
            pr /= batch
            back = (pr @ w2.transpose(0, 2, 1)) * (hid > 0)
            grad = np.concatenate([(xb.transpose(0, 2, 1) @ back).reshape(nodes, -1), back.sum(1),
                                   (hid.transpose(0, 2, 1) @ pr).reshape(nodes, -1), pr.sum(1)], axis=1)
            local -= lr * (grad + mu * (local - start))
        local /= np.maximum(1.0, np.linalg.norm(local, axis=1) / clip)[:, None]
        local += sigma_c * rng.standard_normal(local.shape)
        g = p @ local + sigma_s * rng.standard_normal(n_params)
        w1, b1, w2, b2 = split(g)
        z = np.maximum(x_tr @ w1 + b1, 0.0) @ w2 + b2
        z -= z.max(-1, keepdims=True)
        loss = float(-(np.take_along_axis(z, y_tr[..., None], -1)[..., 0] - np.log(np.exp(z).sum(-1))).mean())
        acc = float(((np.maximum(x_te @ w1 + b1, 0.0) @ w2 + b2).argmax(-1) == y_te).mean())
    print(f"floor: final train loss {loss:.4f}, test accuracy {acc:.4f}")


def _wall_cpu(cmd: list[str]) -> tuple[float, float]:
    t = timed(cmd)
    return t.wall_s, t.cpu_s


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--floor", action="store_true", help="run the floor only (what the benchmark times)")
    args = parser.parse_args()
    if args.floor:
        floor()
        return
    lean = ["--set", "output.figures=false", "--set", 'privacy.tight_accountant="none"']
    rows: dict[str, list[tuple[float, float]]] = {"testbed run": [], "testbed run, lean": [], "numpy floor": []}
    compile_project()
    with tempfile.TemporaryDirectory() as tmp:
        run = [sys.executable, "-W", "ignore", "-m", "testbed", "run", str(HERE / "padpfl_s1.toml"), "--quiet"]
        for i in range(args.repeats):  # interleaved, so a busy machine slows all alike
            rows["testbed run"].append(_wall_cpu(run + ["--out", f"{tmp}/run{i}"]))
            rows["testbed run, lean"].append(_wall_cpu(run + ["--out", f"{tmp}/lean{i}"] + lean))
            rows["numpy floor"].append(_wall_cpu([sys.executable, str(Path(__file__)), "--floor"]))
    med = {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for k, v in rows.items()}
    floor_wall, floor_cpu = med["numpy floor"]
    print(f"PADPFL scenario 1, 60 clients x 30 rounds, sim; whole process, median of {args.repeats}")
    print(f"{'':24}{'wall s':>8}{'cpu s':>8}{'ratio wall':>12}{'ratio cpu':>11}")
    for name, (wall, cpu) in med.items():
        print(f"{name:24}{wall:8.2f}{cpu:8.2f}{wall / floor_wall:12.2f}{cpu / floor_cpu:11.2f}")
    print("floor: the same math as a plain vectorised numpy loop (no ledger, files, figures); target ratio <= 1.5")
    print("lean: output.figures = false, privacy.tight_accountant = \"none\"")


if __name__ == "__main__":
    main()
