"""The floor of job J1: the same math as `testbed run benchmarks/j1.toml`, as a plain vectorised
numpy loop with one random generator and nothing else (no ledger, budgets, files or figures).

Per round: τ steps of eq. (7a) on all nodes at once (uniform batches without replacement, Gaussian
noise), the average of eq. (7b), then the training loss and test accuracy of the averaged model.
Run as a script, so its whole-process wall time is comparable with `testbed run`'s.
"""

import sys

import numpy as np


def main(nodes: int = 100, rounds: int = 100, tau: int = 10, batch: int = 32, dim: int = 100,
         samples: int = 500, lr: float = 0.5, sigma: float = 1.0) -> float:
    rng = np.random.default_rng(0)
    n_classes, n_train = 2, int(0.8 * samples)
    # Data: unit-sphere features and softmax labels, as the synthetic task.
    w_true = rng.standard_normal((dim, n_classes)) * 8.0
    x = rng.standard_normal((nodes, samples, dim))
    x /= np.linalg.norm(x, axis=-1, keepdims=True)
    logits = x @ w_true
    p1 = 1.0 / (1.0 + np.exp(logits[..., 0] - logits[..., 1]))
    y = (rng.random((nodes, samples)) < p1).astype(np.int64)
    x_train, y_train = x[:, :n_train], y[:, :n_train]
    x_test, y_test = x[:, n_train:n_train + samples // 10], y[:, n_train:n_train + samples // 10]
    node_axis = np.arange(nodes)[:, None]

    params = np.zeros((dim + 1, n_classes))  # W and bias, as the testbed's logistic model
    loss = 0.0
    for _ in range(rounds):
        local = np.repeat(params[None], nodes, axis=0)
        keys = rng.random((nodes, tau, n_train))
        idx = np.argpartition(keys, batch - 1, axis=-1)[..., :batch]
        noise = rng.standard_normal((nodes, tau, dim + 1, n_classes)) * sigma
        for step in range(tau):
            xb = x_train[node_axis, idx[:, step]]
            yb = y_train[node_axis, idx[:, step]]
            z = xb @ local[:, :dim] + local[:, dim][:, None, :]
            z -= z.max(axis=-1, keepdims=True)
            p = np.exp(z)
            p /= p.sum(axis=-1, keepdims=True)
            p[node_axis, np.arange(batch)[None, :], yb] -= 1.0
            p /= batch
            grad = np.concatenate([xb.transpose(0, 2, 1) @ p, p.sum(axis=1)[:, None, :]], axis=1)
            local -= lr * (grad + noise[:, step])
        params = local.mean(axis=0)
        z = x_train @ params[:dim] + params[dim]
        z -= z.max(axis=-1, keepdims=True)
        log_p = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
        loss = float(-np.take_along_axis(log_p, y_train[..., None], axis=-1).mean())
        acc = float(((x_test @ params[:dim] + params[dim]).argmax(-1) == y_test).mean())
    print(f"floor: final train loss {loss:.4f}, test accuracy {acc:.4f}")
    return loss


if __name__ == "__main__":
    main(*[int(a) for a in sys.argv[1:3]])
