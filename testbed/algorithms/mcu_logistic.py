"""The microcontroller node step of DP-PASGD on logistic regression, in numpy: what the portable C
firmware (firmware_bridge/firmware/src/step.c) computes, in the same float32 arithmetic and from the
same counter-based generator (testbed.streams.counter_rng), so sim can emulate a board's node and a test
can hold the firmware to it (docs/serial-protocol.md § "The node step").

One call is τ steps of eq. (7a) on one node, all in float32:

    for t in 0..τ−1:
        S = floyd_sample(BATCH stream, n, B)               # B distinct rows, in insertion order
        g = Σ_{s∈S} (softmax(x_s W + b) − e_{y_s}) ⊗ [x_s, 1]
        θ ← θ − η · (g · (1/B) + σ · ξ_t)                   # ξ_t: normals t·P .. t·P+P−1 of NOISE

with θ = [W (d×C, row-major), b (C)], P = dC + C. Sums may be taken in any order (the firmware adds
sample by sample): the two agree to float32 rounding, not bit for bit.

Example::

    >>> rng = np.random.default_rng(0)
    >>> x = rng.normal(size=(20, 3)).astype(np.float32) / 4; y = rng.integers(0, 2, 20)
    >>> task = McuTask(seed=1, node=0, round_index=0, tau=2, batch=4, lr=0.5, sigma=1.0, n_classes=2)
    >>> node_step(task, np.zeros(8, np.float32), x, y).dtype
    dtype('float32')
"""

from __future__ import annotations

import numpy as np

from testbed.algorithms.contract import McuTask
from testbed.streams.counter_rng import Purpose, WordStream, floyd_sample, gaussians


def batches(task: McuTask, n: int) -> list[list[int]]:
    """The τ mini-batches (node-local row indices, insertion order) of one round."""
    stream = WordStream(task.seed, task.node, task.round_index, Purpose.BATCH)
    return [floyd_sample(stream, n, task.batch) for _ in range(task.tau)]


def node_step(task: McuTask, params: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """τ noisy steps from ``params``.

    Args:
        task: the round.
        params: (P,) θ as the board received it (rounded to float32 here).
        x: (n, d) the node's training rows (rounded to float32). y: (n,) int labels in [0, C).
    Returns:
        (P,) float32, the node's update.
    """
    x32 = np.asarray(x, dtype=np.float32)
    n, d = x32.shape
    c = task.n_classes
    p = d * c + c
    theta = np.array(params, dtype=np.float32).reshape(p)
    if theta.shape != (p,):
        raise ValueError(f"{theta.shape[0]} parameters for {d} features and {c} classes")
    noise = gaussians(task.seed, task.node, task.round_index, Purpose.NOISE, task.tau * p).reshape(task.tau, p)
    lr, sigma, inv_b = np.float32(task.lr), np.float32(task.sigma), np.float32(1.0) / np.float32(task.batch)
    labels = np.asarray(y, dtype=np.int64)
    for t, rows in enumerate(batches(task, n)):
        xb = x32[rows]
        w, b = theta[: d * c].reshape(d, c), theta[d * c :]
        z = xb @ w + b
        e = np.exp(z - z.max(axis=1, keepdims=True))
        r = e / e.sum(axis=1, keepdims=True)
        r[np.arange(len(rows)), labels[rows]] -= np.float32(1.0)
        g = np.concatenate([(xb.T @ r).reshape(-1), r.sum(axis=0)])
        theta = theta - lr * (g * inv_b + sigma * noise[t])
    return theta
