"""PyTorch networks behind the numpy model interface of :mod:`testbed.learning.models`.

A :class:`TorchModel` keeps the contract every algorithm relies on: its parameters are one flat
vector of length P per node, stacked as an (M, P) float64 array, and ``loss_and_grad`` takes and
returns numpy arrays with a leading node axis. Inside, the network (a ``torch.nn.Module`` from
:data:`NETWORKS`) runs in float32 for all M nodes at once, the node axis folded into its layers
(:class:`_NodeFolded`: a convolution of M nodes is one grouped convolution, a linear layer one
batched matrix product; autograd on the sum of the nodes' losses gives each node its own gradient).
Never a Python loop over nodes or samples. (This replaced ``torch.func``'s ``vmap`` over the node
axis, under which the max-pool's batching rules were most of the digits CNN step.)

DP for networks with no closed-form gradient bound (``lipschitz_bound`` is inf): with ``clip_norm``
C, ``loss_and_grad`` computes every sample's gradient from each layer's input and the gradient at
its output (as Opacus computes them), clips each to norm C, then takes their weighted sum, so a
record's influence on the step is at most w·C by construction: the sensitivity the accountants use.

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
from typing import TYPE_CHECKING, Any, NamedTuple

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


@functools.cache
def _pixel_scale() -> type:
    """The layer that undoes the loaders' public bound (built on first use: torch is imported lazily)."""
    nn = torch_module().nn

    class PixelScale(nn.Module):
        """Multiplies flat rows by ``factor`` = sqrt(d): rows divided by sqrt(d) become pixels in [0, 1]."""

        def __init__(self, factor: float):
            super().__init__()
            self.factor = factor

        def forward(self, x):
            return x * self.factor

    return PixelScale


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
    if network == "mlp":
        return nn.Sequential(nn.Linear(dim, hidden), nn.ReLU(), nn.Linear(hidden, n_classes))
    if network not in NETWORKS:
        raise ValueError(f"unknown network {network!r}; choose one of {', '.join(NETWORKS)}")
    channels, side, _ = image_shape(dim, network)
    pixels = [_pixel_scale()(math.sqrt(dim)), nn.Unflatten(1, (channels, side, side))]
    if network == "cnn":
        layers: list = [*pixels, nn.Conv2d(channels, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)]
        width, side = 8, side // 2
        if side >= 8:
            layers += [nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)]
            width, side = 16, side // 2
        return nn.Sequential(*layers, nn.Flatten(), nn.Linear(width * side * side, n_classes))
    if (channels, side) != (3, 32):
        raise ValueError(f"the cifar10_cnn network takes 3x32x32 images, not {channels}x{side}x{side}")
    return nn.Sequential(*pixels, nn.Conv2d(3, 6, 5), nn.ReLU(), nn.MaxPool2d(2),
                         nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                         nn.Linear(16 * 5 * 5, 120), nn.ReLU(), nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, n_classes))


class _NodeFolded:
    """A sequential network stepped for M nodes at once, the node axis folded into the layers' own axes.

    Rows (around linear layers) are (M, B, features): a linear layer is one batched matrix product
    over the node axis. Feature maps (around convolutions) are (B, M·channels, H, W) in channels-last
    memory: a convolution is one grouped convolution with groups = M (node m's channels meet only
    node m's kernels), and max-pool and ReLU act on the M·channels maps as on any. The step is thus
    torch's ordinary kernels and autograd on the sum of the nodes' losses, whose gradient in node m's
    parameter block is node m's own (under vmap, the max-pool's batching rules were most of the CNN
    step). A ReLU followed by a max-pool runs as max-pool then ReLU: the same values and gradients
    (ReLU is monotone and keeps ties), on a quarter of the elements.

    Per-sample gradients (for clipping) come from each layer's input and the gradient at its output,
    as Opacus computes them: a linear layer's is the outer product g aᵀ (its norm |g|·sqrt(|a|² + 1)
    with the bias, never materialised), a convolution's the weight gradient of a convolution whose
    groups are the samples.
    """

    def __init__(self, module: "torch.nn.Module"):
        nn = torch_module().nn
        layers = list(module)
        for i in range(len(layers) - 1):
            if isinstance(layers[i], nn.ReLU) and isinstance(layers[i + 1], nn.MaxPool2d):
                layers[i], layers[i + 1] = layers[i + 1], layers[i]
        for layer in layers:
            plain = (isinstance(layer, (nn.ReLU, _pixel_scale()))
                     or (isinstance(layer, nn.MaxPool2d) and not layer.return_indices)
                     or (isinstance(layer, nn.Linear) and layer.bias is not None)
                     or (isinstance(layer, nn.Conv2d) and layer.groups == 1 and layer.padding_mode == "zeros"
                         and not isinstance(layer.padding, str) and layer.bias is not None)
                     or (isinstance(layer, nn.Flatten) and (layer.start_dim, layer.end_dim) == (1, -1))
                     or (isinstance(layer, nn.Unflatten) and layer.dim == 1))
            if not plain:
                raise ValueError(f"the node-folded step has no rule for the layer {layer}")
        self.layers = layers
        self.with_params = [layer for layer in layers if isinstance(layer, (nn.Linear, nn.Conv2d))]
        # named_parameters order is each layer's weight then bias, layer by layer: the flat layout
        assert [p for layer in self.with_params for p in (layer.weight, layer.bias)] == list(module.parameters())

    def loss_and_grad(self, p: "torch.Tensor", x: "torch.Tensor", y: "torch.Tensor", w: "torch.Tensor",
                      clip_norm: float | None) -> tuple["torch.Tensor", "torch.Tensor"]:
        """:meth:`TorchModel.loss_and_grad` on float32 tensors: p (M, P), x (M, B, d), y (M, B),
        w (M, B) → Σ_n w_n l_n (M,) and Σ_n w_n ∇l_n (M, P), each ∇l_n clipped at ``clip_norm``."""
        torch = torch_module()
        if clip_norm is None:
            tensors = [t.detach().requires_grad_() for t in self.fold(p)]
            loss = (w * _sample_losses(self.forward(tensors, x)[0], y)).sum(dim=1)
            grads = torch.autograd.grad(loss.sum(), tensors)
            return loss.detach(), torch.cat([g.reshape(len(y), -1) for g in grads], dim=1)
        logits, records = self.forward(self.fold(p), x, record=True)
        losses = _sample_losses(logits, y)
        # the gradient of Σ_n l_n at a layer's output is, sample by sample, that sample's own
        out_grads = torch.autograd.grad(losses.sum(), [record.out for record in records])
        layers = [self.sample_grads(record, g) for record, g in zip(records, out_grads)]
        norms = sum(sq for sq, _ in layers).sqrt()  # (M, B)
        scale = torch.clamp(clip_norm * _CLIP_MARGIN / torch.clamp(norms, min=1e-30), max=1.0)
        # a sample whose gradient overflows (norm inf or NaN) contributes nothing, not NaN
        finite = torch.isfinite(norms)
        coef = torch.where(finite, w * scale, 0.0)
        if not finite.all():
            layers = [self.sample_grads(record, g, finite) for record, g in zip(records, out_grads)]
        return (w * losses.detach()).sum(dim=1), torch.cat([g for _, combine in layers for g in combine(coef)], dim=1)

    def fold(self, flat: "torch.Tensor") -> list["torch.Tensor"]:
        """flat (M, P) → each weight and bias as the folded layers take them: conv weight
        (M·out, in, kh, kw), conv bias (M·out,), linear weight (M, out, in), linear bias (M, 1, out)."""
        nn = torch_module().nn
        m_nodes, lo, tensors = flat.shape[0], 0, []
        for layer in self.with_params:
            weight = flat[:, lo:lo + layer.weight.numel()]
            lo += layer.weight.numel()
            bias = flat[:, lo:lo + layer.bias.numel()]
            lo += layer.bias.numel()
            if isinstance(layer, nn.Conv2d):
                tensors += [weight.reshape(m_nodes * layer.out_channels, *layer.weight.shape[1:]), bias.reshape(-1)]
            else:
                tensors += [weight.reshape(m_nodes, *layer.weight.shape), bias.reshape(m_nodes, 1, -1)]
        return tensors

    def forward(self, tensors: list["torch.Tensor"], x: "torch.Tensor",
                record: bool = False) -> tuple["torch.Tensor", list[_Record]]:
        """Logits (M, B, C) of x (M, B, d) under the folded ``tensors``; with ``record``, also a
        :class:`_Record` of each weighted layer, the first one's output made a leaf that requires grad."""
        torch = torch_module()
        nn, F = torch.nn, torch.nn.functional
        m_nodes, batch = x.shape[:2]
        h, records, params, i = x, [], iter(tensors), 0
        while i < len(self.layers):
            layer = self.layers[i]
            i += 1
            if isinstance(layer, nn.Conv2d):
                z = F.conv2d(h, next(params), next(params), layer.stride, layer.padding, layer.dilation, m_nodes)
            elif isinstance(layer, nn.Linear):
                weight, bias = next(params), next(params)
                z = torch.baddbmm(bias, h, weight.transpose(1, 2))
            elif isinstance(layer, nn.ReLU):
                h = F.relu(h)
            elif isinstance(layer, nn.MaxPool2d):
                h = _max_pool(layer, h)
            elif isinstance(layer, nn.Unflatten):  # rows (M, B, c·h·w) → maps (B, M·c, h, w)
                h = (h.reshape(m_nodes, batch, *layer.unflattened_size).transpose(0, 1)
                     .reshape(batch, -1, *layer.unflattened_size[1:]).contiguous(memory_format=torch.channels_last))
            elif isinstance(layer, nn.Flatten):  # maps → rows, each node's features in (c, h, w) order
                h = h.reshape(batch, m_nodes, -1).transpose(0, 1)
            else:
                h = layer(h)  # the pixel scale
            if isinstance(layer, (nn.Conv2d, nn.Linear)):
                pooled = None
                if record and isinstance(layer, nn.Conv2d) and i < len(self.layers) \
                        and isinstance(self.layers[i], nn.MaxPool2d):
                    # the max-pool's indices, to route its output's gradient to the convolution's
                    # output in NCHW memory, where the per-sample gradients want it (module docstring)
                    pooled, indices = _max_pool(self.layers[i], z, return_indices=True)
                    i += 1
                out = z if pooled is None else pooled
                if record:
                    if not out.requires_grad:
                        out = out.detach().requires_grad_()
                    records.append(_Record(layer, h, out, None if pooled is None else (indices, tuple(z.shape))))
                h = out
        return h, records

    def sample_grads(self, record: _Record, out_grad: "torch.Tensor", finite: "torch.Tensor | None" = None):
        """One layer's per-sample gradients: (their squared norms (M, B), and a function of
        coefficients c (M, B) → the layer's [weight, bias] gradients Σ_n c_n ∇_n, each (M, k)).

        out_grad: the gradient of Σ_n l_n at ``record.out``. finite (M, B) bool: samples to keep (the
        others' gradients are set to 0, so that an overflowing sample cannot turn the sums into NaN)."""
        torch = torch_module()
        layer, inputs = record.layer, record.inputs.detach()
        if finite is not None:
            inputs, out_grad = (torch.where(_rows(finite, t), t, 0.0) for t in (inputs, out_grad))
        if isinstance(layer, torch.nn.Linear):  # rows (M, B, in), (M, B, out)
            sq = out_grad.square().sum(-1) * (inputs.square().sum(-1) + 1.0)

            def combine(coef):
                coef_grad = coef[..., None] * out_grad
                return [torch.bmm(coef_grad.transpose(1, 2), inputs).flatten(1), coef_grad.sum(1)]

            return sq, combine
        # A convolution's per-sample kernel gradients: the weight gradient of a convolution whose
        # groups are the B·M samples (torch's own kernel, in NCHW memory, where batch and channels
        # fold into one axis); its bias gradients: the gradient at its output summed over positions.
        batch, m_nodes = inputs.shape[0], out_grad.shape[1] // layer.out_channels
        samples = batch * m_nodes
        if record.pool is None:
            grads = out_grad.contiguous()
        else:  # the max-pool's backward, written in NCHW memory
            indices, shape = record.pool
            grads = out_grad.new_zeros(shape[0], shape[1], shape[2] * shape[3]).scatter_add_(
                2, indices.reshape(shape[0], shape[1], -1), out_grad.reshape(shape[0], shape[1], -1)).reshape(shape)
        grads = grads.reshape(1, samples * layer.out_channels, *grads.shape[2:])
        maps = inputs.contiguous().reshape(1, samples * layer.in_channels, *inputs.shape[2:])
        kernel = torch.nn.grad.conv2d_weight(maps, (samples * layer.out_channels, *layer.weight.shape[1:]), grads,
                                             layer.stride, layer.padding, layer.dilation, samples)
        kernel = kernel.reshape(batch, m_nodes, -1)  # (B, M, out·in·kh·kw)
        bias = grads.reshape(batch, m_nodes, layer.out_channels, -1).sum(-1)
        sq = (kernel.square().sum(-1) + bias.square().sum(-1)).T

        def combine(coef):
            return [torch.einsum("mb,bmk->mk", coef, kernel), torch.einsum("mb,bmk->mk", coef, bias)]

        return sq, combine


def _sample_losses(logits: "torch.Tensor", y: "torch.Tensor") -> "torch.Tensor":
    """logits (M, B, C), y (M, B) → the cross-entropy of each sample, (M, B)."""
    cross_entropy = torch_module().nn.functional.cross_entropy
    return cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="none").reshape(y.shape)


def _max_pool(pool: "torch.nn.Module", maps: "torch.Tensor", return_indices: bool = False):
    """``pool`` (a MaxPool2d) applied to maps (B, M·c, H, W)."""
    return torch_module().nn.functional.max_pool2d(maps, pool.kernel_size, pool.stride, pool.padding, pool.dilation,
                                                   pool.ceil_mode, return_indices)


class _Record(NamedTuple):
    """A weighted layer as the clipped step saw it: its input, the tensor whose gradient gives the
    per-sample gradients (the layer's output, or the following max-pool's output), and then the
    pool's (indices, the layer's output shape)."""

    layer: Any
    inputs: Any
    out: Any
    pool: Any


class _Compiled:
    """A network, its flat layout and its node-folded step (built once per architecture)."""

    def __init__(self, network: str, dim: int, n_classes: int, hidden: int):
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
        self.folded = _NodeFolded(self.module)

    def unflatten(self, flat: "torch.Tensor") -> dict[str, "torch.Tensor"]:
        """flat (..., P) → {name: (..., *shape)}, the tensors of each row."""
        lead = flat.shape[:-1]
        return {name: flat[..., lo:hi].reshape(*lead, *shape) for name, shape, lo, hi in
                zip(self.names, self.shapes, self.offsets[:-1], self.offsets[1:])}


def _rows(finite: "torch.Tensor", t: "torch.Tensor") -> "torch.Tensor":
    """finite (M, B) as a mask broadcasting over t: rows (M, B, k) or maps (B, M·c, h, w)."""
    if t.dim() == 3:
        return finite[..., None]
    return finite.T.repeat_interleave(t.shape[1] // finite.shape[0], dim=1)[..., None, None]


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
        loss, grad = self._net.folded.loss_and_grad(
            torch.from_numpy(np.asarray(params, dtype=np.float32)), torch.from_numpy(np.asarray(x, dtype=np.float32)),
            torch.from_numpy(np.asarray(y, dtype=np.int64)), torch.from_numpy(np.asarray(weights, dtype=np.float32)),
            clip_norm)
        return loss.double().numpy(), grad.double().numpy()

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
