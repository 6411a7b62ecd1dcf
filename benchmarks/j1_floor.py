"""The floor of job J1: the same math as `testbed run benchmarks/j1.toml`, as a plain vectorised
numpy loop with one random generator and nothing else (no ledger, budgets, files or figures).

Per round: τ steps of eq. (7a) on all nodes at once (uniform batches without replacement, Gaussian
noise), the average of eq. (7b), then the training loss and test accuracy of the averaged model.
Run as a script, so its whole-process wall time is comparable with `testbed run`'s.
benchmarks/flower_j1.py runs the same pieces on one node per Flower client.
"""

import sys

import numpy as np


def synthetic_data(rng: np.random.Generator, nodes: int, samples: int, dim: int
                   ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x_train, y_train, x_test, y_test): (nodes, 0.8·samples, dim) and (nodes, samples/10, dim)
    unit-sphere features with softmax labels in {0, 1}, as the synthetic task draws them."""
    n_classes, n_train = 2, int(0.8 * samples)
    w_true = rng.standard_normal((dim, n_classes)) * 8.0
    x = rng.standard_normal((nodes, samples, dim))
    x /= np.linalg.norm(x, axis=-1, keepdims=True)
    logits = x @ w_true
    p1 = 1.0 / (1.0 + np.exp(logits[..., 0] - logits[..., 1]))
    y = (rng.random((nodes, samples)) < p1).astype(np.int64)
    return x[:, :n_train], y[:, :n_train], x[:, n_train:n_train + samples // 10], y[:, n_train:n_train + samples // 10]


def draw_round(rng: np.random.Generator, nodes: int, tau: int, n_train: int, batch: int, dim: int,
               sigma: float) -> tuple[np.ndarray, np.ndarray]:
    """One round's randomness: batch indices (nodes, tau, batch), uniform without replacement, and
    Gaussian noise (nodes, tau, dim + 1, 2) of standard deviation sigma."""
    keys = rng.random((nodes, tau, n_train))
    idx = np.argpartition(keys, batch - 1, axis=-1)[..., :batch]
    noise = rng.standard_normal((nodes, tau, dim + 1, 2)) * sigma
    return idx, noise


def local_steps(local: np.ndarray, x_train: np.ndarray, y_train: np.ndarray, idx: np.ndarray,
                noise: np.ndarray, lr: float) -> None:
    """τ noisy SGD steps of eq. (7a) on every node, in place: local (nodes, dim + 1, 2) holds W and
    the bias; idx and noise from :func:`draw_round`."""
    nodes, tau, batch = idx.shape
    dim = x_train.shape[-1]
    node_axis = np.arange(nodes)[:, None]
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


def evaluate(params: np.ndarray, x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray,
             y_test: np.ndarray) -> tuple[float, float]:
    """(training cross-entropy, test accuracy) of one model params (dim + 1, 2) over all nodes."""
    dim = x_train.shape[-1]
    z = x_train @ params[:dim] + params[dim]
    z -= z.max(axis=-1, keepdims=True)
    log_p = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    loss = float(-np.take_along_axis(log_p, y_train[..., None], axis=-1).mean())
    acc = float(((x_test @ params[:dim] + params[dim]).argmax(-1) == y_test).mean())
    return loss, acc


def main(nodes: int = 100, rounds: int = 100, tau: int = 10, batch: int = 32, dim: int = 100,
         samples: int = 500, lr: float = 0.5, sigma: float = 1.0) -> float:
    rng = np.random.default_rng(0)
    x_train, y_train, x_test, y_test = synthetic_data(rng, nodes, samples, dim)
    params = np.zeros((dim + 1, 2))  # W and bias, as the testbed's logistic model
    loss = acc = 0.0
    for _ in range(rounds):
        local = np.repeat(params[None], nodes, axis=0)
        idx, noise = draw_round(rng, nodes, tau, x_train.shape[1], batch, dim, sigma)
        local_steps(local, x_train, y_train, idx, noise, lr)
        params = local.mean(axis=0)
        loss, acc = evaluate(params, x_train, y_train, x_test, y_test)
    print(f"floor: final train loss {loss:.4f}, test accuracy {acc:.4f}")
    return loss


if __name__ == "__main__":
    main(*[int(a) for a in sys.argv[1:3]])
