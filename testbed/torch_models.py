"""PyTorch networks behind the numpy model interface of :mod:`testbed.models`.

A :class:`TorchModel` keeps the contract every algorithm relies on: its parameters are one flat
vector of length P per node, stacked as an (M, P) float64 array, and ``loss_and_grad`` takes and
returns numpy arrays with a leading node axis. Inside, the network (a ``torch.nn.Module`` from
:data:`NETWORKS`) runs in float32 for all M nodes at once: ``torch.func.functional_call`` on the
node's own parameters, ``vmap`` over the node axis (never a Python loop over nodes or samples).

DP for networks with no closed-form gradient bound (``lipschitz_bound`` is inf): with ``clip_norm``
C, ``loss_and_grad`` computes per-sample gradients with ``vmap(grad)`` over the samples (as Opacus
and the torch.func tutorials compute them), clips each to norm C, then takes their weighted sum, so
a record's influence on the step is at most w·C by construction: the sensitivity the accountants use.

torch is imported only when a torch model is configured (every other run, and a node agent on a
small board, never pays for it). The number of threads torch uses is ``$TESTBED_TORCH_THREADS``
when set: the coordinator sets it for each emulated host so that hosts do not fight over cores.

Images arrive as flat rows (the loaders' format: channels × height × width, divided by sqrt(d) into
the unit ball); a convolutional network multiplies them back to pixels in [0, 1] (a fixed first
layer: tiny inputs would make tiny gradients) and reshapes them, from the row length: 64 → 1×8×8
(digits), 784 → 1×28×28 (MNIST), 3072 → 3×32×32 (CIFAR-10).

Example::

    >>> m = TorchModel("cnn", dim=64, n_classes=10)
    >>> params = np.stack([m.init(np.random.default_rng(s)) for s in range(3)])   # 3 nodes
    >>> x = np.zeros((3, 4, 64)); y = np.zeros((3, 4), dtype=np.int64); w = np.full((3, 4), 0.25)
    >>> loss, grad = m.loss_and_grad(params, x, y, w, clip_norm=1.0)
    >>> loss.shape, grad.shape == params.shape, bool(np.linalg.norm(grad, axis=1).max() <= 1.0)
    ((3,), True, True)
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

if TYPE_CHECKING:
    import torch

#: The networks a ``[model] kind = "torch"`` may name (``model.network``).
NETWORKS = ("mlp", "cnn", "cifar10_cnn")

#: Flat row length → (channels, height, width) of the image sets the loaders produce.
IMAGE_SHAPES = {64: (1, 8, 8), 784: (1, 28, 28), 3072: (3, 32, 32)}

#: Clipping at C(1 − 2⁻²⁰) keeps a clipped float32 gradient's norm at or below C despite rounding.
_CLIP_MARGIN = 1.0 - 2.0**-20
#: Rows per forward pass when evaluating one model on a whole split (bounds the activations' memory).
_EVAL_CHUNK = 4096


@functools.cache
def torch_module() -> Any:
    """torch, imported on first use, its thread count set from ``$TESTBED_TORCH_THREADS`` if given."""
    import torch

    threads = os.environ.get("TESTBED_TORCH_THREADS")
    if threads:
        torch.set_num_threads(max(1, int(threads)))
    return torch


def image_shape(dim: int, network: str) -> tuple[int, int, int]:
    """(channels, height, width) of a flat image row of ``dim`` values; ValueError for another length."""
    if dim not in IMAGE_SHAPES:
        known = ", ".join(f"{d} ({'x'.join(map(str, s))})" for d, s in IMAGE_SHAPES.items())
        raise ValueError(f"the {network} network takes images; rows of {dim} features are none of {known}")
    return IMAGE_SHAPES[dim]


def build_network(network: str, dim: int, n_classes: int, hidden: int = 64) -> "torch.nn.Module":
    """The ``torch.nn.Module`` named ``network`` for flat rows of ``dim`` features and ``n_classes``.

    - "mlp": Linear(d, hidden) → ReLU → Linear(hidden, C).
    - "cnn": conv 3×3 (→8) → ReLU → max-pool 2, and for images of side ≥ 16 a second conv 3×3
      (→16) → ReLU → max-pool 2; then Linear(·, C). 1,370 parameters on 8×8 digits, 9,098 on MNIST.
    - "cifar10_cnn": the small CNN of PyTorch's CIFAR-10 tutorial, which the DWFL extraction
      suggests (dwfl.md §6.1: "a small CNN"): conv 5×5 (3→6) → pool → conv 5×5 (6→16) → pool →
      120 → 84 → C, ReLU between; 62,006 parameters.
    """
    nn = torch_module().nn

    class PixelScale(nn.Module):
        """Undoes the loaders' public bound (rows divided by sqrt(d)): the layers see pixels in [0, 1]."""

        def forward(self, x):
            return x * math.sqrt(dim)

    if network == "mlp":
        return nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, n_classes))
    if network not in NETWORKS:
        raise ValueError(f"unknown network {network!r}; choose one of {', '.join(NETWORKS)}")
    channels, side, _ = image_shape(dim, network)
    if network == "cnn":
        layers: list = [PixelScale(), nn.Unflatten(1, (channels, side, side)), nn.Conv2d(channels, 8, 3, padding=1), nn.ReLU(),
                        nn.MaxPool2d(2)]
        width, side = 8, side // 2
        if side >= 8:
            layers += [nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)]
            width, side = 16, side // 2
        return nn.Sequential(*layers, nn.Flatten(), nn.Linear(width * side * side, n_classes))
    if (channels, side) != (3, 32):
        raise ValueError(f"the cifar10_cnn network takes 3x32x32 images, not {channels}x{side}x{side}")
    return nn.Sequential(PixelScale(), nn.Unflatten(1, (3, 32, 32)), nn.Conv2d(3, 6, 5), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(16 * 5 * 5, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, n_classes))


class _Compiled:
    """A network and its vectorised functions of flat parameters (built once per architecture)."""

    def __init__(self, network: str, dim: int, n_classes: int, hidden: int):
        torch = torch_module()
        from torch.func import functional_call, grad_and_value, vmap

        self.module = build_network(network, dim, n_classes, hidden)
        named = list(self.module.named_parameters())
        self.names = [name for name, _ in named]
        self.shapes = [tuple(p.shape) for _, p in named]
        sizes = [p.numel() for _, p in named]
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(int).tolist()
        self.num_params = self.offsets[-1]
        # fan-in of each tensor's layer: its own for a weight, the preceding weight's for a bias
        self.fan_in: list[int] = []
        for name, shape in zip(self.names, self.shapes):
            self.fan_in.append(int(np.prod(shape[1:])) if name.endswith("weight") else self.fan_in[-1])
        cross_entropy = torch.nn.functional.cross_entropy
        module = self.module

        def batch_loss(named, x, y, w):
            """One node: its tensors by name, x (B, d), y (B,), w (B,) → Σ_n w_n l_n."""
            logits = functional_call(module, named, (x,))
            return (w * cross_entropy(logits, y, reduction="none")).sum()

        def sample_loss(named, x, y):
            """One sample: x (d,), y () → l."""
            return cross_entropy(functional_call(module, named, (x[None],)), y[None])

        # Gradients by tensor (not of one flat vector: the backward of slicing a flat vector would
        # write every tensor's gradient into a zero (M, B, P) array).
        self.node_grads: Callable = vmap(grad_and_value(batch_loss))
        self.sample_grads: Callable = vmap(vmap(grad_and_value(sample_loss), in_dims=(None, 0, 0)))

    def unflatten(self, flat: "torch.Tensor") -> dict[str, "torch.Tensor"]:
        """flat (..., P) → {name: (..., *shape)}, the tensors of each row."""
        lead = flat.shape[:-1]
        return {name: flat[..., lo:hi].reshape(*lead, *shape) for name, shape, lo, hi in
                zip(self.names, self.shapes, self.offsets[:-1], self.offsets[1:])}


def _sample_norms(grads: list["torch.Tensor"]) -> "torch.Tensor":
    """(M, B) L2 norms of per-sample gradients given as (M, B, k_t) pieces, one per tensor t
    (vector norms of the pieces' norms: no (M, B, P) concatenation)."""
    torch = torch_module()
    return torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g, dim=-1) for g in grads]), dim=0)


@functools.lru_cache(maxsize=8)
def _compiled(network: str, dim: int, n_classes: int, hidden: int) -> _Compiled:
    return _Compiled(network, dim, n_classes, hidden)


@dataclass(frozen=True)
class TorchModel:
    """A network of :data:`NETWORKS` as a model of flat parameter vectors (module docstring).

    Attributes:
        network: "mlp", "cnn" or "cifar10_cnn" (:func:`build_network`).
        dim: features of a flat input row d. n_classes: C. hidden: the MLP's hidden units.
    """

    network: str
    dim: int
    n_classes: int
    hidden: int = 64

    name = "torch"
    #: what the network computes in (parameters travel as float64 between steps, as every model's)
    dtype = "float32"

    def __post_init__(self) -> None:
        if self.network not in NETWORKS:
            raise ValueError(f"unknown network {self.network!r}; choose one of {', '.join(NETWORKS)}")
        if self.network != "mlp":
            image_shape(self.dim, self.network)

    @property
    def _net(self) -> _Compiled:
        return _compiled(self.network, self.dim, self.n_classes, self.hidden)

    @property
    def num_params(self) -> int:
        return self._net.num_params

    @property
    def lipschitz_bound(self) -> float:
        """No per-sample gradient bound holds for a deep network: a private run clips."""
        return math.inf

    def init(self, rng: np.random.Generator) -> np.ndarray:
        """PyTorch's default initialisation of every layer, U(±1/sqrt(fan_in)) for weights and
        biases, drawn from ``rng`` (so every node and the simulation draw the same θ⁰). Shape (P,)."""
        if rng is None:
            raise ValueError("a torch network's θ⁰ is random: give init a numpy Generator")
        net = self._net
        return np.concatenate([rng.uniform(-1.0, 1.0, int(np.prod(shape))) / math.sqrt(fan)
                               for shape, fan in zip(net.shapes, net.fan_in)])

    def loss_and_grad(self, params: np.ndarray, x: np.ndarray, y: np.ndarray, weights: np.ndarray,
                      clip_norm: float | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Weighted loss and gradient of each node's network on its own batch, all nodes at once.

        Args:
            params: (M, P). x: (M, B, d). y: (M, B) int. weights: (M, B), e.g. 1/B for a batch mean.
            clip_norm: clip every per-sample gradient at this L2 norm first (None: no clipping).
        Returns:
            loss (M,) = Σ_n w_n l_n, grad (M, P) = Σ_n w_n clip(∇l_n), float64 (computed in float32).
        """
        torch = torch_module()
        net = self._net
        p = torch.from_numpy(np.asarray(params, dtype=np.float32))
        xs = torch.from_numpy(np.asarray(x, dtype=np.float32))
        ys = torch.from_numpy(np.asarray(y, dtype=np.int64))
        ws = torch.from_numpy(np.asarray(weights, dtype=np.float32))
        m_nodes, batch = ys.shape
        named = net.unflatten(p)
        if clip_norm is None:
            grads, loss = net.node_grads(named, xs, ys, ws)
            grad = torch.cat([g.reshape(m_nodes, -1) for g in grads.values()], dim=1)
            return loss.double().numpy(), grad.double().numpy()
        by_tensor, losses = net.sample_grads(named, xs, ys)  # name → (M, B, *shape); (M, B)
        grads = [g.reshape(m_nodes, batch, -1) for g in by_tensor.values()]
        norms = _sample_norms(grads)
        if not torch.isfinite(norms).all():  # an overflowing sample contributes nothing, not NaN
            grads = [torch.nan_to_num(g, nan=0.0, posinf=0.0, neginf=0.0) for g in grads]
            norms = _sample_norms(grads)
        scale = torch.clamp(clip_norm * _CLIP_MARGIN / torch.clamp(norms, min=1e-30), max=1.0)
        coef = ws * torch.where(torch.isfinite(norms), scale, torch.zeros_like(scale))
        grad = torch.cat([torch.einsum("mb,mbk->mk", coef, g) for g in grads], dim=1)
        return (ws * losses).sum(dim=1).double().numpy(), grad.double().numpy()

    def loss_and_correct(self, params: np.ndarray, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """One network on many samples: params (P,), x (N, d), y (N,) → loss (N,), correct (N,) bool."""
        torch = torch_module()
        net = self._net
        named = net.unflatten(torch.from_numpy(np.asarray(params, dtype=np.float32)))
        losses, correct = [], []
        with torch.no_grad():
            for lo in range(0, len(y), _EVAL_CHUNK):
                logits = torch.func.functional_call(net.module, named,
                                                    (torch.from_numpy(np.asarray(x[lo:lo + _EVAL_CHUNK], np.float32)),))
                target = torch.from_numpy(np.asarray(y[lo:lo + _EVAL_CHUNK], np.int64))
                losses.append(torch.nn.functional.cross_entropy(logits, target, reduction="none").double().numpy())
                correct.append((logits.argmax(dim=-1) == target).numpy())
        if not losses:
            return np.zeros(0), np.zeros(0, dtype=bool)
        return np.concatenate(losses), np.concatenate(correct)
