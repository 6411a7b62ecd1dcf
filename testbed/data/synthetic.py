"""A synthetic multinomial logistic-regression task: the offline default and the benchmark task.

The generative model, for node m with samples n = 1..N_m:

- a true weight matrix W* (d x K), entries N(0, 1), from ``stream(seed, GLOBAL, -1, DATA)``;
- features ``x = r / ||r||`` with ``r = g / sqrt(d) + h * u_m``, g ~ N(0, I_d) per sample and u_m a
  random unit vector of node m. With heterogeneity h = 0 every node draws x uniformly on the unit
  sphere (i.i.d.); with h > 0 node m's samples crowd around its own direction u_m (at h = 1 the
  shift is as long as the typical noise g / sqrt(d)), so nodes differ in features and in label mix
  (non-i.i.d.);
- labels ``y ~ softmax(s * x W*)`` with one inverse temperature s for all nodes.

Every row lies on the unit sphere, so the DP sensitivity bound ||x|| <= 1 holds with equality,
which gives the most signal per unit of privacy noise. Each row is divided by its own norm, a
statistic of that row alone: no statistic is pooled over rows or nodes, so the three ``scaling``
choices of the file-based loaders (:data:`testbed.data.split.SCALINGS`) give identical arrays here
(the largest row norm of every node, of the whole set and the public bound are all 1).

s is calibrated so that the Bayes classifier argmax_k (x W*)_k has expected accuracy
``bayes_accuracy`` (default 0.875) on the i.i.d. (h = 0) feature distribution, whatever d and K:
the task is learnable, but not trivially. With h > 0 the Bayes accuracy drifts from the target.

Node m draws from ``stream(seed, m, -1, DATA)`` only (u_m, then g, then the label uniforms), so a
board that generates only its own node gets exactly the arrays the simulator gets for that node.

Example::

    >>> data = make_logistic(num_nodes=4, samples_per_node=50, dim=10, seed=1)
    >>> data.train.x.shape, data.test.x.shape, data.validation.x.shape
    ((160, 10), (20, 10), (20, 10))
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from testbed.data.federated import FederatedData
from testbed.data.registry import Registration
from testbed.data.split import SPLITS, SplitWriter, check_scaling, split_sizes
from testbed.errors import DataError
from testbed.streams.rng import GLOBAL, Purpose, node_streams, stream
from testbed.util.parallel import split_work

if TYPE_CHECKING:
    from testbed.data.lazy import LazyFederatedData
    from testbed.data.section import DataSection

DEFAULT_BAYES_ACCURACY = 0.875
#: Feature types the generator writes (``data.dtype``).
DTYPES = ("float64", "float32")
#: Monte Carlo samples behind the calibration of s (standard error of the accuracy ~0.001).
_CALIBRATION_SAMPLES = 8192


def _softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=1, keepdims=True)
    np.exp(z, out=z)
    z /= z.sum(axis=1, keepdims=True)
    return z


def _calibrate_scale(w: np.ndarray, target: float, rng: np.random.Generator) -> float:
    """The inverse temperature s with E[max_k softmax(s x W)_k] = target for x uniform on the sphere.

    x W is sampled without forming x: with W = QR (Q: d x q orthonormal, q = min(d, K)) and
    x = g/||g||, x W = (Q^T g) R / ||g||, where Q^T g ~ N(0, I_q) and ||g||^2 = ||Q^T g||^2 + chi2(d-q)
    independently. The cost does not grow with d.
    """
    d, k = w.shape
    _, r = np.linalg.qr(w)
    a = rng.standard_normal((_CALIBRATION_SAMPLES, r.shape[0]))
    rest = rng.chisquare(d - r.shape[0], _CALIBRATION_SAMPLES) if d > r.shape[0] else 0.0
    z = (a @ r) / np.sqrt(np.einsum("ij,ij->i", a, a) + rest)[:, None]

    def accuracy(s: float) -> float:
        return float(_softmax(s * z).max(axis=1).mean())

    # The max softmax probability grows with s, so bisection finds the target.
    lo, hi = 0.0, 1.0
    while accuracy(hi) < target and hi < 1e6:
        lo, hi = hi, 2.0 * hi
    for _ in range(30):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if accuracy(mid) < target else (lo, mid)
    # Four significant digits: a board whose exp() differs in the last bit still gets the same s.
    return float(f"{0.5 * (lo + hi):.4g}")


# Cached: an emulated host generating its nodes one by one calibrates s once, not once per node.
@functools.lru_cache(maxsize=8)
def true_model(
    dim: int, n_classes: int = 2, seed: int = 0, bayes_accuracy: float = DEFAULT_BAYES_ACCURACY
) -> np.ndarray:
    """The scaled true weights s W* of :func:`make_logistic`: labels are drawn from softmax(x @ result).

    Input
    -----
    dim, n_classes, seed, bayes_accuracy :
        As in :func:`make_logistic`.

    Output
    ------
    w : [dim, n_classes], float64
        argmax(x @ w) is the Bayes classifier of the generated data.

    Example
    -------
    >>> true_model(dim=5, n_classes=3, seed=0).shape
    (5, 3)
    """
    if not 1.0 / n_classes < bayes_accuracy < 1.0:
        raise DataError(
            f"synthetic: bayes_accuracy must be in (1/n_classes, 1) = ({1 / n_classes:.3g}, 1), "
            f"got {bayes_accuracy}"
        )
    rng = stream(seed, GLOBAL, -1, Purpose.DATA)
    w = rng.standard_normal((dim, n_classes))
    # The calibration sample continues the same stream: it depends on the seed only, like W*.
    w = _calibrate_scale(w, bayes_accuracy, rng) * w
    w.flags.writeable = False  # shared by every caller through the cache
    return w


#: Bytes of raw features generated per chunk of nodes: small enough to stay in cache and to keep
#: the peak near the final arrays, large enough that numpy's per-call overhead is negligible.
_CHUNK_BYTES = 1 << 20


def _write_nodes(writer: SplitWriter, seed: int, node_ids: Sequence[int], n: int, w: np.ndarray,
                 heterogeneity: float) -> None:
    """Generate the n samples of every node of ``node_ids`` and write them, a chunk of nodes at a time.

    Per node, its own stream ``stream(seed, node, -1, DATA)`` draws u_m (d), then g (n x d), then
    the n label uniforms, in that order (so a board generating one node gets the same rows); the
    draws are per node (each node is its own stream), everything else is vectorised over the chunk:
    x = g / sqrt(d) + h u_m scaled to norm 1, labels by inverse CDF of softmax(x W) (x [n, d]
    float64 before the writer rounds it to its dtype, y [n] int64). Parts of the nodes go
    through this on the cores' threads (testbed.util.parallel), each with its own buffers and
    streams: every number of a node is computed from its own rows alone, so the split changes none.
    """
    dim, n_classes = w.shape
    chunk = max(1, min(len(node_ids), _CHUNK_BYTES // (8 * n * dim)))

    def write(lo: int, hi: int) -> None:  # nodes lo .. hi-1, a chunk at a time
        x = np.empty((chunk, n, dim))
        logits = np.empty((chunk, n, n_classes))
        uniforms = np.empty((chunk, n))
        shift = np.empty((chunk, 1, dim))
        streams = node_streams(seed, node_ids[lo:hi], -1, Purpose.DATA)
        for first in range(lo, hi, chunk):
            c = min(chunk, hi - first)
            for i in range(c):
                rng = next(streams)
                # u_m is drawn even when h = 0, so changing h never shifts the later draws.
                u = rng.standard_normal(dim)
                shift[i, 0] = u / np.linalg.norm(u)
                rng.standard_normal(out=x[i])
                rng.random(out=uniforms[i])
            xc, flat = x[:c], x[:c].reshape(c * n, dim)
            xc *= 1.0 / np.sqrt(dim)
            if heterogeneity:
                xc += heterogeneity * shift[:c]
            flat /= np.sqrt(np.einsum("ij,ij->i", flat, flat))[:, None]
            for i in range(c):  # one small product per node: BLAS sums each row as it does for that node alone
                np.matmul(x[i], w, out=logits[i])
            cdf = np.cumsum(_softmax(logits[:c].reshape(c * n, n_classes)), axis=1)
            # Inverse-CDF sampling; min() guards against cdf[-1] rounding just below the uniform.
            y = np.minimum((uniforms[:c].reshape(-1, 1) >= cdf).sum(axis=1), n_classes - 1).astype(np.int64)
            writer.write_many(first, xc, y.reshape(c, n))

    split_work(len(node_ids), write, numbers=len(node_ids) * n * (dim + 1))


def make_logistic(
    num_nodes: int,
    samples_per_node: int,
    dim: int,
    n_classes: int = 2,
    seed: int = 0,
    heterogeneity: float = 0.0,
    nodes: Sequence[int] | None = None,
    bayes_accuracy: float = DEFAULT_BAYES_ACCURACY,
    scaling: str = "per_node",
    dtype: str = "float64",
    splits: Sequence[str] = SPLITS,
) -> FederatedData:
    """Generate the synthetic logistic-regression task and split every node 80/10/10.

    Input
    -----
    num_nodes : int
        M, the size of the whole federation (node ids 0..M-1).
    samples_per_node : int
        Samples of every node before the split.
    dim : int
        Feature dimension d.
    n_classes : int
        K >= 2.
    seed : int
        The run's seed.
    heterogeneity : float
        h >= 0, the per-node mean shift (0: i.i.d. nodes).
    nodes : sequence of int, optional
        Generate only these node ids (in this order), e.g. the one node of an MQTT board; the arrays
        are identical to generating all M nodes and selecting these.
    bayes_accuracy : float
        Target accuracy of the Bayes classifier at h = 0, in (1/K, 1).
    scaling : str
        One of :data:`testbed.data.split.SCALINGS`; checked, and the same arrays whichever it is
        (every row is already on the unit sphere, from its own norm alone).
    dtype : str
        ``"float64"`` or ``"float32"`` (``data.dtype``): the features are generated in float64 and
        rounded once to this type, so a float32 set is the float64 one rounded.
    splits : sequence of str
        The splits to hold (default all three); the others have no rows, every node 0 samples.

    Output
    ------
    data : FederatedData
        ``name="synthetic"``, one node per id, node names ``"node-<id>"``; x of ``dtype`` with every
        row norm 1, y int64 in [0, K). The three splits together hold
        8 * len(nodes) * samples_per_node * d bytes of float64 features: 400 MB for 1,000 x 500 x 100
        (half in float32).

    Example
    -------
    >>> full = make_logistic(8, 20, 3, seed=2)
    >>> part = make_logistic(8, 20, 3, seed=2, nodes=[5])
    >>> bool((part.train.x == full.select([5]).train.x).all())
    True
    """
    check_scaling(scaling)
    if dtype not in DTYPES:
        raise DataError(f"synthetic: dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if num_nodes < 1 or samples_per_node < 1 or dim < 1 or n_classes < 2 or heterogeneity < 0:
        raise DataError(
            "synthetic: need num_nodes >= 1, samples_per_node >= 1, dim >= 1, n_classes >= 2 and "
            f"heterogeneity >= 0; got {num_nodes}, {samples_per_node}, {dim}, {n_classes}, {heterogeneity}"
        )
    node_ids = list(range(num_nodes)) if nodes is None else [int(m) for m in nodes]
    outside = [m for m in node_ids if not 0 <= m < num_nodes]
    if outside:
        raise DataError(f"synthetic: nodes {outside} are not in 0..{num_nodes - 1}")

    w = true_model(dim, n_classes, seed, bayes_accuracy)
    writer = SplitWriter([samples_per_node] * len(node_ids), dim=dim, seed=seed, node_ids=node_ids, dtype=dtype,
                         keep=splits)
    _write_nodes(writer, seed, node_ids, samples_per_node, w, heterogeneity)
    return writer.finish(n_classes=n_classes, name="synthetic")


def _options(d: "DataSection") -> dict[str, Any]:
    return dict(num_nodes=d.num_nodes, samples_per_node=d.samples_per_node, dim=d.dim, n_classes=d.n_classes,
                heterogeneity=d.heterogeneity, dtype=d.dtype)


def lazy_logistic(*, num_nodes: int, samples_per_node: int, dim: int, n_classes: int, seed: int,
                  **options) -> "LazyFederatedData":
    """The task of :func:`make_logistic` (``options``: its other keywords) as lazy nodes
    (testbed.data.lazy): every node with ``samples_per_node`` samples, its rows made from its own
    streams when asked for."""
    from testbed.data.lazy import LazyFederatedData, SplitLayout

    layouts = [SplitLayout(np.arange(num_nodes + 1, dtype=np.int64) * part) for part in split_sizes(samples_per_node)]
    make = functools.partial(make_logistic, num_nodes, samples_per_node, dim, n_classes, seed, **options)
    return LazyFederatedData(*layouts, n_classes=n_classes, name="synthetic", dim=dim, node_ids=range(num_nodes),
                             make=lambda nodes, splits: make(nodes=nodes, splits=splits))


def _lazy(d: "DataSection", seed: int) -> "LazyFederatedData":
    return lazy_logistic(num_nodes=d.num_nodes, samples_per_node=d.samples_per_node, dim=d.dim,
                         n_classes=d.n_classes, seed=seed, heterogeneity=d.heterogeneity, scaling=d.scaling,
                         dtype=d.dtype)


REGISTRATION = Registration("synthetic", make_logistic, _options, order=0,
                            no_path="dataset is generated and reads no file", lazy=_lazy,
                            train_only={"splits": ("train",)}, features=lambda d: d.dim, counted=True)
