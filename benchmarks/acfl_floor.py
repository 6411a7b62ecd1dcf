"""The floor of the ACFL benchmark: the same math as `testbed run benchmarks/acfl.toml` as a plain
vectorised numpy loop (one generator, no ledger, no files): the Sec. V data, the coded set
(eqs. 2–4), then 1000 iterations of Bernoulli(0.2) stragglers, the devices' full-batch gradients
(eq. 7), the coded gradient (eq. 8), the adaptive weight (eqs. 42–43), eqs. (9)–(10) and the
training loss of eq. (1), as the runner evaluates it every round.

Usage: python benchmarks/acfl_floor.py
"""

import numpy as np

N, M, D, O, T, P, LR, S1, S2 = 100, 100, 10, 10, 1000, 0.2, 1e-4, 1.0, 1.0
rng = np.random.default_rng(0)
w_true = rng.uniform(0, 1 / 30, (D, O))
x = rng.uniform(-1, 1, (N, M, D))
y = x @ w_true
w = rng.uniform(0, 1 / 30, (D, O))
xt = x.transpose(0, 2, 1)
hx = (xt @ x + np.sqrt(S1) * rng.standard_normal((N, D, D))).sum(axis=0)  # eqs. (2), (4)
hy = (xt @ y + np.sqrt(S2) * rng.standard_normal((N, D, O))).sum(axis=0)  # eqs. (3), (4)
losses = np.empty(T)
for t in range(1, T + 1):
    heard = rng.random(N) >= P
    g = xt[heard] @ (x[heard] @ w - y[heard])  # eq. (7)
    beta_sq = np.einsum("mdo,mdo->m", g, g).mean()  # eq. (42)
    c_sq = np.einsum("do,do->", w, w)
    alpha = P * beta_sq / (P * beta_sq + D * S1 * c_sq * (1 - P) + S2 * O * D * (1 - P))  # eq. (43)
    g_all = alpha * (hx @ w - hy) + (1 - alpha) / (1 - P) * g.sum(axis=0)  # eqs. (8), (9)
    w = w - LR / t * g_all  # eq. (10)
    r = x @ w - y
    losses[t - 1] = 0.5 * np.einsum("nmo,nmo->", r, r)  # eq. (1)
print(f"final loss {losses[-1]:.4f}")
