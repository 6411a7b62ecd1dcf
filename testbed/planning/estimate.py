"""Estimates of the data-dependent constants of the DP-PASGD bound (12)–(13) from the data and model.

The paper says L, λ, ξ² and α "can be estimated beforehand" and reports neither the values nor how
(dp-pasgd.md §4.4, §7 item 5). The estimates here, all at the common starting point θ⁰ on the
training split, with the global loss L(θ) of eq. (4) (each node weighted 1/M):

- **α = L(θ⁰)**, the initial loss, with L* taken as 0 as the paper does ("we take the initial loss
  as the value of the initial loss gap α").
- **L** (Assumption 1), for softmax logistic regression: Böhning's bound on the softmax Hessian,
  diag(p) − ppᵀ ⪯ ½(I − 11ᵀ/C) (Böhning 1992, Ann. Inst. Stat. Math. 44), gives
  ∇²L(θ) ⪯ ½·S ⊗ (I − 11ᵀ/C) for every θ, with S = (1/M)·Σ_m (1/N_m)·X̃_mᵀX̃_m and X̃ = [X, 1] when
  the model has a bias; so L = ½·λ_max(S). This is the softmax analogue of the binary bound
  ¼·λ_max(XᵀX/N) and is attained at θ⁰ = 0 for two classes. The hinge loss (SVM) is not smooth and
  the MLP has no closed-form bound: for them L must be given (``[plan] smoothness``).
- **λ** (Assumption 2, a Polyak–Łojasiewicz inequality ½||∇L||² >= λ(L − L*)): unregularised
  logistic regression is not strongly convex, and its global PL constant can be arbitrarily small
  (one-hot features are collinear, and far from the optimum the loss is nearly linear). We take the
  PL ratio at θ⁰, λ = ||∇L(θ⁰)||² / (2·(L(θ⁰) − L*)) with L* = 0: the largest λ for which
  Assumption 2 holds at θ⁰. It is **optimistic** (Assumption 2 must hold everywhere, and the ratio
  shrinks towards the optimum), so the bound it feeds is a heuristic score for the planner, not a
  guarantee. It is at most L by smoothness. Give ``[plan] strong_convexity`` to override.
- **ξ²** (Assumption 4): the mean over nodes of the expected squared distance between a node's
  mini-batch gradient at θ⁰ and ∇L(θ⁰), computed exactly from the per-sample gradients:
  E||g(θ⁰; 𝒳_m) − ∇L(θ⁰)||² = s_m²/X·(N_m − X)/(N_m − 1) + ||∇L_m(θ⁰) − ∇L(θ⁰)||², with s_m² the
  per-sample gradient variance of node m (X drawn without replacement). The second term is the node
  drift, zero on average under the unbiasedness Assumption 3 that non-i.i.d. data breaks; it is
  included, so ξ² on Adult-1 carries the heterogeneity the theory leaves out.
- **d_eff** (optional, ``[plan] noise_dimension = "trace"``): the dimension the privacy noise is
  charged with in B (13), tr(H̄)/L from Böhning's matrix bound H̄ instead of the parameter count d
  (:func:`noise_dimension`; the paper's bound is d_eff = d).

Units: losses in nats, gradients in loss units per parameter unit; L and λ in loss units per
squared parameter unit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from testbed.data.federated import Split
from testbed.errors import UserError
from testbed.learning.models import LogisticRegression, Model

# Samples per chunk of per-sample gradients: bounds memory at CHUNK × P floats.
_CHUNK = 4096


@dataclass(frozen=True)
class Estimates:
    """The data-dependent bound constants estimated at θ⁰ (see the module docstring).

    Attributes:
        smoothness: L, or None when the model has no closed-form bound (SVM, MLP).
        strong_convexity: λ, the PL ratio at θ⁰.
        grad_variance: ξ² for the mini-batch size the estimate was made for.
        initial_gap: α = L(θ⁰) (L* = 0).
        gradient_norm: ||∇L(θ⁰)||, reported for context.
        noise_dimension: d_eff = tr(H̄)/L of :func:`noise_dimension`, or None (SVM, MLP).
    """

    smoothness: float | None
    strong_convexity: float
    grad_variance: float
    initial_gap: float
    gradient_norm: float
    noise_dimension: float | None = None


def per_sample_gradients(model: Model, params: np.ndarray, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Loss and gradient of every sample at one model, through the model's own batched code.

    Args:
        model: the model. params: (P,) one parameter vector. x: (N, d). y: (N,) int labels.
    Returns:
        loss (N,) in nats and gradients (N, P).
    """
    losses, grads = [], []
    for lo in range(0, len(y), _CHUNK):
        xs, ys = x[lo : lo + _CHUNK], y[lo : lo + _CHUNK]
        n = len(ys)
        # One "node" per sample with a batch of one: the model's vectorised node axis does the rest.
        loss, grad = model.loss_and_grad(np.repeat(params[None, :], n, axis=0), xs[:, None, :], ys[:, None],
                                         np.ones((n, 1)))
        losses.append(loss)
        grads.append(grad)
    return np.concatenate(losses), np.concatenate(grads)


def _second_moment(model: LogisticRegression, train: Split) -> np.ndarray:
    """S = (1/M)·Σ_m X̃_mᵀX̃_m/N_m, the second moment of the (bias-augmented) rows under eq. (4)."""
    x = np.hstack([train.x, np.ones((len(train.y), 1))]) if model.bias else train.x
    weights = np.repeat(1.0 / (train.sizes * len(train.sizes)), train.sizes)  # eq. (4): 1/(M·N_m) per row
    return (x * weights[:, None]).T @ x


def smoothness(model: Model, train: Split) -> float | None:
    """L = ½·λ_max((1/M)·Σ_m X̃_mᵀX̃_m/N_m) for softmax logistic regression (Böhning); None otherwise."""
    if not isinstance(model, LogisticRegression):
        return None
    return 0.5 * float(np.linalg.eigvalsh(_second_moment(model, train))[-1])


def noise_dimension(model: Model, train: Split) -> float | None:
    """d_eff = tr(H̄)/L for softmax logistic regression, H̄ = ½·S ⊗ (I − 11ᵀ/C) Böhning's matrix bound
    on the Hessian (module docstring); None for other models.

    Theorem 1 charges the noise b ~ N(0, σ²I_d) of a step through L-smoothness: E[(L/2)||ηb||²] =
    (L/2)·η²·d·σ², the term d·σ² of B (13). With the matrix bound ∇²L(θ) ⪯ H̄ for every θ the same
    step of the proof gives E[½·(ηb)ᵀH̄(ηb)] = ½·η²·σ²·tr(H̄), which is L·d_eff·σ²/2: the bound
    keeps its form with d replaced by d_eff = tr(H̄)/L = (C − 1)·tr(S)/λ_max(S) ≤ d. Noise along
    directions the loss hardly curves in (collinear one-hot columns, rare features) costs the
    loss almost nothing; for rows in the unit ball tr(S) ≤ 1, so d_eff is small when S has one
    dominant direction (Adult: about 2 of d = 172).
    """
    if not isinstance(model, LogisticRegression):
        return None
    moment = _second_moment(model, train)
    return float((model.n_classes - 1) * np.trace(moment) / np.linalg.eigvalsh(moment)[-1])


def estimate(model: Model, train: Split, params0: np.ndarray, batch: int) -> Estimates:
    """Estimate L, λ, ξ² and α at θ⁰ on ``train`` for mini-batches of ``batch`` samples.

    Args:
        model: the run's model. train: every node's training split. params0: θ⁰, shape (P,).
        batch: X, the mini-batch size per step (same on every node).

    Raises:
        UserError: if a node has fewer than ``batch`` training samples, or the gradient at θ⁰ is 0
            (θ⁰ is already a stationary point; λ cannot be estimated there).
    """
    sizes = train.sizes
    if np.any(sizes < batch):
        raise UserError(f"plan: batch {batch} is larger than a node's {int(sizes.min())} training samples")
    loss, grads = per_sample_gradients(model, params0, train.x, train.y)
    starts = train.offsets[:-1]
    node_loss = np.add.reduceat(loss, starts) / sizes
    node_grad = np.add.reduceat(grads, starts, axis=0) / sizes[:, None]  # ∇L_m(θ⁰), (M, P)
    global_grad = node_grad.mean(axis=0)  # eq. (4): equal node weights
    # s_m² = mean ||g_n||² − ||mean g_n||² per node.
    node_sq = np.add.reduceat(np.einsum("np,np->n", grads, grads), starts) / sizes
    spread = node_sq - np.einsum("mp,mp->m", node_grad, node_grad)
    finite_population = (sizes - batch) / np.maximum(sizes - 1, 1)
    drift = np.sum((node_grad - global_grad) ** 2, axis=1)
    grad_variance = float(np.mean(np.maximum(spread, 0.0) / batch * finite_population + drift))
    initial_gap = float(node_loss.mean())
    grad_sq = float(global_grad @ global_grad)
    if grad_sq == 0.0 or initial_gap == 0.0:
        raise UserError("plan: the gradient or the loss is zero at the starting point; give [plan] strong_convexity")
    return Estimates(
        smoothness=smoothness(model, train),
        strong_convexity=grad_sq / (2.0 * initial_gap),  # PL ratio at θ⁰, L* = 0
        grad_variance=grad_variance,
        initial_gap=initial_gap,
        gradient_norm=float(np.sqrt(grad_sq)),
        noise_dimension=noise_dimension(model, train),
    )
