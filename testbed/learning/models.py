"""Models as pure functions of a flat parameter vector, vectorised over a leading node axis.

Every model keeps its parameters in one flat float64 vector of length P, so an algorithm can stack
the models of M nodes as an (M, P) array and noise, average or transmit them without knowing their
structure. Per-sample gradients of all three models are sums of outer products, so their norms (for
clipping) come without materialising an (M, B, P) array.

Inputs are assumed in the unit ball (||x||_2 <= 1, the data loaders guarantee it); each model
states the per-sample gradient bound G it guarantees there (``lipschitz_bound``), the sensitivity
DP-PASGD's accountant needs (dp-pasgd.md §7 item 6).

The kinds ``[model] kind`` may name are the registry :func:`kinds` (a :class:`ModelKind` each: its
builder and what the node host needs to know of it); the config's choices, :func:`build_model` and
the node host read it.

Example::

    >>> m = LogisticRegression(dim=3, n_classes=2)
    >>> params = np.zeros((4, m.num_params))          # 4 nodes
    >>> x = np.full((4, 5, 3), 0.5); y = np.zeros((4, 5), dtype=np.int64)
    >>> w = np.full((4, 5), 1 / 5)                   # mean over a batch of 5
    >>> loss, grad = m.loss_and_grad(params, x, y, w)
    >>> loss.shape, grad.shape
    ((4,), (4, 8))
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Union

import numpy as np

from testbed.streams.rng import GLOBAL, Purpose, stream

if TYPE_CHECKING:
    from testbed.learning.torch_models import TorchModel


def _loss_and_correct(logits_t: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Cross-entropy log Σ exp(l) − l_y and whether argmax l = y, per sample.

    Args:
        logits_t: (C, N) class-major logits: reducing over a short leading axis is a few passes
            over contiguous rows, twice as fast for J1's (2, 40000) as over a trailing axis of 2.
        y: (N,) int labels.
    Returns:
        loss (N,), correct (N,) bool.
    """
    top = logits_t.max(axis=0)
    total = np.exp(logits_t - top).sum(axis=0)
    logit_y = np.take_along_axis(logits_t, y[None], axis=0)[0]
    return np.log(total) + top - logit_y, _argmax_is(logits_t, y)


def _argmax_is(logits_t: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``logits_t.argmax(axis=0) == y``; for two classes as one comparison of the rows, five times
    faster than argmax over an axis of 2 (J1's evaluation, every round), with argmax's own answer
    on a tie (the first) and on NaN (the first NaN)."""
    if logits_t.shape[0] != 2:
        return logits_t.argmax(axis=0) == y
    first, second = logits_t
    second_wins = second > first
    nans = np.isnan(second)
    if nans.any():
        second_wins |= nans & ~np.isnan(first)
    return np.where(second_wins, y == 1, y == 0)


def _softmax_residual(logits: np.ndarray, y: np.ndarray, with_loss: bool = True) -> tuple[np.ndarray | None, np.ndarray]:
    """Cross-entropy per sample and its gradient w.r.t. the logits, p − e_y.

    Args:
        logits: (..., C), overwritten (the residual is computed in its memory). y: (...) int labels.
        with_loss: False: no loss (a training step needs only the residual): None in its place.
    Returns:
        loss (...) or None, residual (..., C).
    """
    logits -= logits.max(axis=-1, keepdims=True)  # shifted; in place: the same numbers, one array fewer
    at_y = y[..., None]
    loss = None
    if with_loss:
        logit_y = np.take_along_axis(logits, at_y, axis=-1)[..., 0]
    p = np.exp(logits, out=logits)
    total = p.sum(axis=-1, keepdims=True)
    p /= total
    if with_loss:
        loss = np.log(total[..., 0]) - logit_y
    np.put_along_axis(p, at_y, np.take_along_axis(p, at_y, axis=-1) - 1.0, axis=-1)
    return loss, p


def _clip_scale(sq_norms: np.ndarray, clip_norm: float | None) -> np.ndarray | float:
    """Per-sample factor min(1, G/||g_n||) that clips each per-sample gradient at G."""
    if clip_norm is None:
        return 1.0
    norms = np.sqrt(sq_norms)
    return np.minimum(1.0, clip_norm / np.maximum(norms, 1e-300))


@dataclass(frozen=True)
class LogisticRegression:
    """Multinomial logistic regression, softmax cross-entropy loss.

    Parameters: W (d × C) then b (C) if ``bias``. Per-sample gradient (p − e_y) ⊗ [x, 1] has norm
    ||p − e_y||·sqrt(||x||² + 1) <= sqrt(2)·sqrt(2) = 2 with a bias, sqrt(2) without.
    """

    dim: int
    n_classes: int
    bias: bool = True

    name = "logistic"

    @property
    def num_params(self) -> int:
        return self.dim * self.n_classes + (self.n_classes if self.bias else 0)

    @property
    def lipschitz_bound(self) -> float:
        return math.sqrt(2.0) * math.sqrt(2.0 if self.bias else 1.0)

    def init(self, rng: np.random.Generator) -> np.ndarray:
        """Zeros (the loss is convex; a common θ⁰ is all DP-PASGD asks). Shape (P,)."""
        return np.zeros(self.num_params)

    def _split(self, params: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        lead = params.shape[:-1]
        w = params[..., : self.dim * self.n_classes].reshape(*lead, self.dim, self.n_classes)
        b = params[..., self.dim * self.n_classes :] if self.bias else None
        return w, b

    def logits(self, params: np.ndarray, x: np.ndarray) -> np.ndarray:
        """params (M, P), x (M, B, d) → (M, B, C); or params (P,), x (N, d) → (N, C)."""
        w, b = self._split(params)
        out = x @ w
        if b is not None:
            out += b[..., None, :] if params.ndim > 1 else b
        return out

    def loss_and_grad(
        self,
        params: np.ndarray,
        x: np.ndarray,
        y: np.ndarray,
        weights: np.ndarray,
        clip_norm: float | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Weighted loss and gradient of each node's model on its own batch.

        Args:
            params: (M, P). x: (M, B, d). y: (M, B) int. weights: (M, B), e.g. 1/B for a batch mean.
            clip_norm: clip every per-sample gradient at this L2 norm first (None: no clipping).
        Returns:
            loss (M,) = Σ_n w_n l_n, grad (M, P) = Σ_n w_n clip(∇l_n).
        """
        loss, grad = self._loss_and_grad(params, x, y, weights, clip_norm, with_loss=True)
        return (loss * weights).sum(axis=1), grad

    def gradient(self, params: np.ndarray, x: np.ndarray, y: np.ndarray, weights: np.ndarray,
                 clip_norm: float | None = None) -> np.ndarray:
        """The gradient of :meth:`loss_and_grad`, bit for bit, without its loss (a local step's)."""
        return self._loss_and_grad(params, x, y, weights, clip_norm, with_loss=False)[1]

    def _loss_and_grad(self, params: np.ndarray, x: np.ndarray, y: np.ndarray, weights: np.ndarray,
                       clip_norm: float | None, with_loss: bool) -> tuple[np.ndarray | None, np.ndarray]:
        """Per-sample loss (M, B) (None without ``with_loss``) and the gradient of :meth:`loss_and_grad`."""
        loss, resid = _softmax_residual(self.logits(params, x), y, with_loss)
        if clip_norm is None:
            resid *= weights[..., None]
        else:
            x_sq = np.einsum("mbd,mbd->mb", x, x) + (1.0 if self.bias else 0.0)
            scale = _clip_scale(np.einsum("mbc,mbc->mb", resid, resid) * x_sq, clip_norm)
            resid *= (weights * scale)[..., None]
        grad = np.empty_like(params)
        gw = grad[:, : self.dim * self.n_classes].reshape(params.shape[0], self.dim, self.n_classes)
        np.matmul(x.transpose(0, 2, 1), resid, out=gw)
        if self.bias:
            grad[:, self.dim * self.n_classes :] = resid.sum(axis=1)
        return loss, grad

    def loss_and_correct(self, params: np.ndarray, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One model on many samples: params (P,), x (N, d), y (N,) → loss (N,), correct (N,) bool."""
        w, b = self._split(params)
        logits_t = w.T @ x.T  # (C, N)
        if b is not None:
            logits_t += b[:, None]
        return _loss_and_correct(logits_t, y)


@dataclass(frozen=True)
class LinearSVM:
    """Binary linear SVM with the hinge loss max(0, 1 − s·(w·x + b)), s = ±1 (label 1 → +1).

    Parameters: w (d) then b if ``bias``. The per-sample (sub)gradient −s·[x, 1] on the margin side
    has norm sqrt(||x||² + 1) <= sqrt(2) with a bias, 1 without. The hinge is not smooth, which the
    DP-PASGD theory assumes (dp-pasgd.md §5.1); the paper uses it anyway for Vehicle.
    """

    dim: int
    n_classes: int = 2
    bias: bool = True

    name = "svm"

    def __post_init__(self) -> None:
        if self.n_classes != 2:
            raise ValueError(f"the linear SVM is binary; the data has {self.n_classes} classes")

    @property
    def num_params(self) -> int:
        return self.dim + (1 if self.bias else 0)

    @property
    def lipschitz_bound(self) -> float:
        return math.sqrt(2.0 if self.bias else 1.0)

    def init(self, rng: np.random.Generator) -> np.ndarray:
        return np.zeros(self.num_params)

    def scores(self, params: np.ndarray, x: np.ndarray) -> np.ndarray:
        """params (M, P), x (M, B, d) → (M, B); or params (P,), x (N, d) → (N,)."""
        w = params[..., : self.dim]
        out = (x @ w[..., None])[..., 0] if params.ndim > 1 else x @ w
        if self.bias:
            out += params[..., self.dim :] if params.ndim > 1 else params[self.dim]
        return out

    def loss_and_grad(
        self,
        params: np.ndarray,
        x: np.ndarray,
        y: np.ndarray,
        weights: np.ndarray,
        clip_norm: float | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """As :meth:`LogisticRegression.loss_and_grad`."""
        sign = 2.0 * y - 1.0
        margin = sign * self.scores(params, x)
        active = margin < 1.0
        coef = -sign * active * weights
        if clip_norm is not None:
            coef *= _clip_scale(active * (np.einsum("mbd,mbd->mb", x, x) + (1.0 if self.bias else 0.0)), clip_norm)
        grad = np.empty_like(params)
        grad[:, : self.dim] = (coef[:, None, :] @ x)[:, 0, :]
        if self.bias:
            grad[:, self.dim] = coef.sum(axis=1)
        loss = np.maximum(0.0, 1.0 - margin)
        return (loss * weights).sum(axis=1), grad

    def loss_and_correct(self, params: np.ndarray, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        score = self.scores(params, x)
        return np.maximum(0.0, 1.0 - (2.0 * y - 1.0) * score), (score > 0) == (y == 1)


@dataclass(frozen=True)
class MLP:
    """One hidden layer of ``hidden`` units (``activation`` "tanh", or "relu" as PADPFL's paper),
    softmax cross-entropy output.

    Parameters: W1 (d × H), b1 (H), W2 (H × C), b2 (C). The gradient w.r.t. W1 grows with ||W2||,
    so no per-sample bound holds on unit-ball inputs: ``lipschitz_bound`` is inf and a private run
    must clip (the config refuses an unclipped private MLP).
    """

    dim: int
    n_classes: int
    hidden: int = 32
    init_scale: float = 1.0
    activation: str = "tanh"

    name = "mlp"

    @property
    def num_params(self) -> int:
        return self.dim * self.hidden + self.hidden + self.hidden * self.n_classes + self.n_classes

    @property
    def lipschitz_bound(self) -> float:
        return math.inf

    def init(self, rng: np.random.Generator) -> np.ndarray:
        """Glorot-uniform weights scaled by ``init_scale``, zero biases. Shape (P,)."""
        params = np.zeros(self.num_params)
        w1, _, w2, _ = self._split(params)
        lim1 = self.init_scale * math.sqrt(6.0 / (self.dim + self.hidden))
        lim2 = self.init_scale * math.sqrt(6.0 / (self.hidden + self.n_classes))
        w1[...] = rng.uniform(-lim1, lim1, size=w1.shape)
        w2[...] = rng.uniform(-lim2, lim2, size=w2.shape)
        return params

    def _split(self, params: np.ndarray):
        lead = params.shape[:-1]
        d, h, c = self.dim, self.hidden, self.n_classes
        ends = np.cumsum([d * h, h, h * c, c])
        w1 = params[..., : ends[0]].reshape(*lead, d, h)
        b1 = params[..., ends[0] : ends[1]]
        w2 = params[..., ends[1] : ends[2]].reshape(*lead, h, c)
        b2 = params[..., ends[2] : ends[3]]
        return w1, b1, w2, b2

    def _forward(self, params: np.ndarray, x: np.ndarray):
        w1, b1, w2, b2 = self._split(params)
        lead_b = (lambda b: b[..., None, :]) if params.ndim > 1 else (lambda b: b)
        pre = x @ w1 + lead_b(b1)
        hid = np.tanh(pre) if self.activation == "tanh" else np.maximum(pre, 0.0)
        return hid, hid @ w2 + lead_b(b2)

    def loss_and_grad(
        self,
        params: np.ndarray,
        x: np.ndarray,
        y: np.ndarray,
        weights: np.ndarray,
        clip_norm: float | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """As :meth:`LogisticRegression.loss_and_grad`."""
        w1, _, w2, _ = self._split(params)
        hid, logits = self._forward(params, x)
        loss, resid = _softmax_residual(logits, y)
        back = (resid @ w2.transpose(0, 2, 1)) * ((1.0 - hid**2) if self.activation == "tanh" else (hid > 0))
        scale = 1.0
        if clip_norm is not None:
            # ||per-sample grad||² = ||r||²·(||h||² + 1) + ||back||²·(||x||² + 1): outer products per layer.
            sq = np.einsum("mbc,mbc->mb", resid, resid) * (np.einsum("mbh,mbh->mb", hid, hid) + 1.0)
            sq += np.einsum("mbh,mbh->mb", back, back) * (np.einsum("mbd,mbd->mb", x, x) + 1.0)
            scale = _clip_scale(sq, clip_norm)
        factor = (weights * scale)[..., None]
        resid *= factor
        back *= factor
        grad = np.empty_like(params)
        g1, gb1, g2, gb2 = self._split(grad)
        np.matmul(x.transpose(0, 2, 1), back, out=g1)
        gb1[...] = back.sum(axis=1)
        np.matmul(hid.transpose(0, 2, 1), resid, out=g2)
        gb2[...] = resid.sum(axis=1)
        return (loss * weights).sum(axis=1), grad

    def loss_and_correct(self, params: np.ndarray, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        _, logits = self._forward(params, x)
        return _loss_and_correct(logits.T, y)


@dataclass(frozen=True)
class RandomFeatures:
    """Random Fourier features of the RBF kernel exp(−γ‖x − x′‖²) (Rahimi and Recht 2007; ACFL's
    remark on kernels): φ(x) = cos(xᵀΩ + b), Ω (d × D_rf) with entries N(0, 2γ), b (D_rf,) U[0, 2π),
    so E[φ(x)ᵀφ(x′)] · 2/D_rf = the kernel.

    Bounded variant: the usual sqrt(2/D_rf) factor is left out, so every entry is in [−1, 1], the
    whole range ACFL's Assumption 1 (|x| ≤ 1) allows, whatever the inputs. The factor would only
    rescale W (a linear model absorbs it), but it would shrink XᵀX by 2/D_rf against the coded set's
    noise N₁ of fixed variance σ₁² (eq. 2): the same ε with a worse signal-to-noise ratio.

    Ω then b are drawn once from ``stream(seed, GLOBAL, −1, FEATURES)``: a function of the run's
    seed alone, so every node, board and the simulation compute the same map, each from the seed.

    Example::

        >>> phi = RandomFeatures(dim=2, count=3, gamma=1.0, seed=0)
        >>> phi(np.zeros((4, 2))).shape, bool(np.abs(phi(np.ones((5, 2)))).max() <= 1)
        ((4, 3), True)
    """

    dim: int
    count: int
    gamma: float = 1.0
    seed: int = 0

    @functools.cached_property
    def _draws(self) -> tuple[np.ndarray, np.ndarray]:
        rng = stream(self.seed, GLOBAL, -1, Purpose.FEATURES)
        omega = rng.normal(0.0, math.sqrt(2.0 * self.gamma), (self.dim, self.count))
        return omega, rng.uniform(0.0, 2.0 * math.pi, self.count)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """(..., d) → (..., D_rf), entries in [−1, 1]."""
        omega, b = self._draws
        return np.cos(x @ omega + b)


@dataclass(frozen=True)
class LinearRegression:
    """Multi-output linear regression (ACFL's model, acfl.md §1.2): predictions x W, W (D × o), the
    sum-form squared loss ½‖x W − y‖² per sample (eq. 1 of the ACFL paper is its sum over samples
    and devices). Classification runs as least squares on one-hot labels.

    Features: x itself, or its random features φ(x) if ``embedding`` (:class:`RandomFeatures`, D_rf
    columns in [−1, 1]), then a constant 1 if ``bias`` (D = d + 1 or D_rf + 1), so |entries| ≤ 1
    still holds (ACFL's Assumption 1). Targets (:meth:`targets`): float y (N, o) as given, integer class
    labels y (N,) as one-hot rows of o = ``outputs`` columns.

    ``correct`` (what the runner reports as accuracy): for class labels, argmax of the prediction
    is the label; for real targets, ‖x W − y‖₂ ≤ ``tolerance`` · ‖y‖₂ (10 % relative error by default).

    The gradient is unbounded (it grows with ‖W‖): ``lipschitz_bound`` is inf.

    Example::

        >>> m = LinearRegression(dim=2, outputs=3, bias=False)
        >>> params = np.zeros((1, m.num_params))
        >>> x = np.ones((1, 4, 2)); y = np.ones((1, 4, 3)); w = np.ones((1, 4))
        >>> loss, grad = m.loss_and_grad(params, x, y, w)
        >>> float(loss[0]), grad.reshape(2, 3).tolist()[0]
        (6.0, [-4.0, -4.0, -4.0])
    """

    dim: int
    outputs: int
    bias: bool = False
    init_high: float = 1.0 / 30.0
    tolerance: float = 0.1
    embedding: RandomFeatures | None = None

    name = "linear"

    def __post_init__(self):
        if self.embedding is not None and self.embedding.dim != self.dim:
            raise ValueError(f"the embedding takes {self.embedding.dim} inputs, the model {self.dim}")

    @property
    def features(self) -> int:
        """D, the width of the design matrix."""
        return (self.dim if self.embedding is None else self.embedding.count) + (1 if self.bias else 0)

    @property
    def num_params(self) -> int:
        return self.features * self.outputs

    @property
    def lipschitz_bound(self) -> float:
        return math.inf

    def init(self, rng: np.random.Generator | None) -> np.ndarray:
        """W₀ with entries U[0, ``init_high``] (the ACFL paper's Sec. V: U[0, 1/30]); zeros without a
        generator. Shape (P,), W row-major."""
        return np.zeros(self.num_params) if rng is None else rng.uniform(0.0, self.init_high, self.num_params)

    def design(self, x: np.ndarray) -> np.ndarray:
        """(..., d) → (..., D): the features (x, or φ(x) with an embedding), with a trailing 1 if ``bias``."""
        if self.embedding is not None:
            x = self.embedding(x)
        if not self.bias:
            return x
        return np.concatenate([x, np.ones(x.shape[:-1] + (1,))], axis=-1)

    def targets(self, y: np.ndarray) -> np.ndarray:
        """(..., o) float targets as they are; (...) integer class labels → (..., o) one-hot."""
        if np.issubdtype(y.dtype, np.integer):
            return (y[..., None] == np.arange(self.outputs)).astype(np.float64)
        return y

    def matrix(self, params: np.ndarray) -> np.ndarray:
        """(..., P) → (..., D, o)."""
        return params.reshape(params.shape[:-1] + (self.features, self.outputs))

    def loss_and_grad(self, params: np.ndarray, x: np.ndarray, y: np.ndarray, weights: np.ndarray,
                      clip_norm: float | None = None) -> tuple[np.ndarray, np.ndarray]:
        """params (M, P), x (M, B, d), y (M, B, o) or (M, B) int, weights (M, B) → loss (M,) =
        Σ_n w_n ½‖x_n W − y_n‖², grad (M, P) = Xᵀ diag(w) (X W − Y). No clipping (``clip_norm``
        must be None: ACFL does not clip)."""
        if clip_norm is not None:
            raise ValueError("the linear regression model does not clip")
        xd = self.design(x)
        resid = xd @ self.matrix(params) - self.targets(y)
        loss = 0.5 * np.einsum("mbo,mbo,mb->m", resid, resid, weights)
        grad = xd.transpose(0, 2, 1) @ (resid * weights[..., None])
        return loss, grad.reshape(params.shape)

    def loss_and_correct(self, params: np.ndarray, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One model on many samples: params (P,), x (N, d), y (N, o) or (N,) int → loss (N,) =
        ½‖x W − y‖², correct (N,) bool (see the class docstring)."""
        pred = self.design(x) @ self.matrix(params)
        target = self.targets(y)
        if np.issubdtype(y.dtype, np.integer):
            correct = pred.argmax(axis=-1) == y
            pred -= target  # the residual, in place: one array less per evaluation
            return 0.5 * np.einsum("no,no->n", pred, pred), correct
        pred -= target
        sq = np.einsum("no,no->n", pred, pred)
        return 0.5 * sq, sq <= self.tolerance**2 * np.einsum("no,no->n", target, target)


Model = Union[LogisticRegression, LinearSVM, MLP, LinearRegression, "TorchModel"]


@dataclass(frozen=True)
class ModelOptions:
    """The ``[model]`` keys a kind may read (testbed.assembly.config.ModelSection), and the run's seed."""

    bias: bool = True
    hidden: int = 32
    activation: str = "tanh"
    random_features: int = 0
    rf_gamma: float = 1.0
    seed: int | None = None
    network: str = "cnn"


@dataclass(frozen=True)
class ModelKind:
    """One ``[model] kind``: the registry :func:`kinds` lists them, in the order of the config's
    choices (its JSON Schema's enum); config validation and :func:`build_model` read it and never
    name a kind.

    Attributes:
        name: its ``model.kind``.
        build: (d, C or the outputs o, options) → the model.
        embeds: it takes a random-feature embedding (``model.random_features``).
        stacks_exactly: its step over M stacked nodes gives each node the numbers of its step alone
            (float64 numpy: yes; a float32 torch network's rounding depends on M), so an emulated
            host may step its nodes together (nodes.agent).
    """

    name: str
    build: Callable[[int, int, ModelOptions], Model]
    embeds: bool = False
    stacks_exactly: bool = True


def _mlp(dim: int, n_classes: int, o: ModelOptions) -> MLP:
    if o.activation not in ("tanh", "relu"):
        raise ValueError(f"unknown activation {o.activation!r}; choose tanh or relu")
    return MLP(dim, n_classes, o.hidden, activation=o.activation)


def _torch(dim: int, n_classes: int, o: ModelOptions) -> "TorchModel":
    from testbed.learning.torch_models import TorchModel  # torch is imported only for this kind

    return TorchModel(o.network, dim, n_classes, o.hidden)


def _linear(dim: int, n_classes: int, o: ModelOptions) -> LinearRegression:
    """n_classes: the outputs o (a regression set's target columns, or the classes)."""
    if not o.random_features:
        return LinearRegression(dim, n_classes, o.bias)
    if o.seed is None:
        raise ValueError("random_features: the embedding is drawn from the run's seed; give it")
    embedding = RandomFeatures(dim, o.random_features, o.rf_gamma, o.seed)
    return LinearRegression(dim, n_classes, o.bias, embedding=embedding)


#: The model kinds, in the order of the config's choices.
_KINDS = (
    ModelKind("logistic", lambda dim, n_classes, o: LogisticRegression(dim, n_classes, o.bias)),
    ModelKind("svm", lambda dim, n_classes, o: LinearSVM(dim, n_classes, o.bias)),
    ModelKind("mlp", _mlp),
    ModelKind("linear", _linear, embeds=True),
    ModelKind("torch", _torch, stacks_exactly=False),
)


def kinds() -> dict[str, ModelKind]:
    """Every model kind, by name, in the order of the config's choices."""
    return {kind.name: kind for kind in _KINDS}


def kind_of(name: str) -> ModelKind:
    try:
        return kinds()[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; choose one of {', '.join(kinds())}") from None


def embedding_kinds() -> list[str]:
    """The kinds that take a random-feature embedding."""
    return [kind.name for kind in _KINDS if kind.embeds]


def embedding_phrase() -> str:
    """Which kinds take ``model.random_features``: 'only the "linear" model takes an embedding'."""
    quoted = " or ".join(f'"{name}"' for name in embedding_kinds())
    return f"only the {quoted} model takes an embedding"


def build_model(kind: str, dim: int, n_classes: int, *, bias: bool = True, hidden: int = 32,
                activation: str = "tanh", random_features: int = 0, rf_gamma: float = 1.0,
                seed: int | None = None, network: str = "cnn") -> Model:
    """The model named ``kind`` (one of :func:`kinds`) for inputs of ``dim`` features; ``activation``
    is the MLP's hidden layer ("tanh" or "relu"); ``random_features`` > 0 ("linear" only): that many
    random Fourier features of γ = ``rf_gamma``, drawn from the run's ``seed`` (required then);
    ``network`` ("torch" only): the PyTorch network of :data:`testbed.learning.torch_models.NETWORKS`
    (torch is imported only for this kind)."""
    if random_features and kind not in embedding_kinds():
        raise ValueError(f"random_features: {embedding_phrase()}, not {kind!r}")
    options = ModelOptions(bias=bias, hidden=hidden, activation=activation, random_features=random_features,
                           rf_gamma=rf_gamma, seed=seed, network=network)
    return kind_of(kind).build(dim, n_classes, options)

