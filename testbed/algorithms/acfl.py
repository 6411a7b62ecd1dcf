"""ACFL (Li, Xiao, Skoglund, "Adaptive coded federated learning: privacy preservation and straggler
mitigation", arXiv 2403.14905; extraction ``../shared/papers/acfl.md``), with its baselines NA and
SCFL as options.

Multi-output linear regression, W (D × o), the sum-form loss of eq. (1), full-batch gradients, no
clipping (the model: :class:`testbed.learning.models.LinearRegression`, ``model.kind = "linear"``).

1. **Setup** (the contract's one-time phase, round −1): node i uploads its coded data set,
   ``encoding = "gram"`` (ACFL, eqs. 2–3): H_X = XᵀX + N₁ (D × D, all D² entries i.i.d. N(0, σ₁²),
   not symmetrised) and H_Y = XᵀY + N₂ (D × o, N(0, σ₂²)), the noise drawn once from the node's
   own stream; the server keeps only the sums H̃_X, H̃_Y (eq. 4).
   ``encoding = "projection"`` (SCFL, our reading of [24], see :mod:`testbed.privacy.acfl`):
   X̃ = G X + N₁, Ỹ = G Y + N₂ with G (D × m_i) of unit-norm Gaussian columns (E[GᵀG] = I), the
   same D × D and D × o upload; the server keeps Σ X̃ᵀX̃ and Σ X̃ᵀỸ (the stacked global coded set's
   Gram, all its gradient needs).
2. **Each iteration t = r + 1**: every non-straggler sends G_t⁽ⁱ⁾ = Xᵀ(X W_t − Y) (eq. 7); the server
   computes the coded gradient G_S = H̃_X W_t − H̃_Y (eq. 8; SCFL: (Σ X̃ᵀX̃ − n D σ₁² I) W_t − Σ X̃ᵀỸ,
   the noise's bias removed, n the uploads summed), aggregates
   G_All = α_t G_S + (1 − α_t)/(1 − p) Σ_{answered} G_t⁽ⁱ⁾ (eq. 9) and steps
   W_{t+1} = W_t − η_t G_All (eq. 10).

Weights (``weights``): "adaptive" (eqs. 42–43: β̂² the mean ‖G_t⁽ⁱ⁾‖²_F over the current
non-stragglers, Ĉ² = ‖W_t‖²_F), "theoretical" (α* of eq. 36 for given β and C), "fixed" (``alpha``;
NA is "fixed" with 0.5, the paper's baseline). When every node straggles β̂² is 0/0
(``all_straggle``): "coded" uses α = 1 (the coded gradient alone), "last" the last β̂².

Stragglers come through the contract (``ctx.answered``): the ``[stragglers]`` Bernoulli model in sim
and over MQTT, and real deadline misses over MQTT. The rescaling p (``rescale``): "configured"
(``straggler_p``, default the ``[stragglers]`` Bernoulli p) or "observed" (1 − answered/N).

Privacy: the coded upload is ε-MI-DP (Theorem 1, eq. 17; SCFL: a derived bound), one
:class:`~testbed.ledger.events.MutualInfoEvent` per node at round −1 under its own budget
(``budget.mi_epsilon``). The gradients sent during training are **not** covered (the paper's scope).

Bounds (what the coordinator refuses; :mod:`testbed.algorithms.bounds`): Assumption 1 (every entry
of X and Y in [−1, 1]: the loaders' public scaling, and what Theorem 1's privacy needs) and m, the
largest node's training rows of the run's partition, bound every honest upload. With x_n, y_n the
rows: ‖XᵀX‖_F ≤ Σ‖x_n‖² ≤ m D and |(XᵀX)_jk| ≤ m; ‖XᵀY‖_F ≤ Σ‖x_n‖‖y_n‖ ≤ m sqrt(D o); SCFL's
G X = Σ g_n x_nᵀ (unit columns g_n) has ‖·‖_F ≤ m sqrt(D), entries ≤ m, and G Y ‖·‖_F ≤ m sqrt(o);
plus the noise N₁, N₂ at its tail bound. A gradient (XᵀX) W − XᵀY has ‖·‖_F ≤ m D ‖W‖_F + m sqrt(D o),
W the model the node received. An upload scaled far past them (1e6 ×) is refused; one inside them
moves the model no more than a node holding m rows at the bound could.

Bytes (Remark 1, eqs. 11–13, φ = 64 bits): the setup uploads 8 (D² + D o) bytes; each iteration a
non-straggler uploads 8 D o bytes (its gradient) and receives 8 D o (W_t).

Example::

    >>> from testbed.learning.models import LinearRegression
    >>> from testbed.data.regression import make_regression
    >>> from testbed.algorithms.contract import RoundContext, SETUP_ROUND
    >>> data = make_regression(num_nodes=4, samples_per_node=20, dim=3, outputs=2, seed=0)
    >>> alg = Acfl(LinearRegression(3, 2), num_nodes=4, iterations=5, lr=1e-2, sigma1_sq=0.0,
    ...            sigma2_sq=0.0, straggler_p=0.0)
    >>> state = alg.init_state(np.zeros(6))
    >>> ctx = RoundContext(SETUP_ROUND, 0, 4, (0, 1, 2, 3)).closed((0, 1, 2, 3))
    >>> state = alg.server_setup(state, alg.setup_step(data.train, [0, 1, 2, 3], ctx), ctx).state
    >>> sorted(state), state["HX"].shape
    (['HX', 'HY', 'W', 'alpha', 'beta_sq', 'uploads'], (3, 3))
"""

from __future__ import annotations

import math
from typing import Any, Literal, Mapping, Sequence

import numpy as np
from pydantic import Field, model_validator

from testbed.algorithms import acfl_cli
from testbed.algorithms.base import BYTES_PER_REAL, BaseAlgorithm, RoundCost
from testbed.algorithms.bounds import gaussian_entry_bound, gaussian_norm_bound
from testbed.algorithms.contract import SETUP_ROUND, NodeResult, RoundContext, ServerResult, State, TensorSpec
from testbed.algorithms.registry import BuildContext, Registration
from testbed.checked.limits import MAX_EPSILON_NATS
from testbed.checked.sections import Fraction, OnlyWith, Positive, Section
from testbed.data.federated import Split
from testbed.errors import ConfigError
from testbed.learning.models import LinearRegression
from testbed.ledger.events import CommunicationEvent, Event, MutualInfoEvent
from testbed.privacy import acfl as theory
from testbed.streams.rng import Purpose, node_streams

ENCODINGS = ("gram", "projection")
WEIGHTS = ("adaptive", "theoretical", "fixed")
LR_SCHEDULES = ("eta0_over_t", "eta0_over_t_plus_1", "inverse_lambda_t", "constant")


class AcflSection(Section):
    """ACFL, NA (``weights = "fixed"``, ``alpha = 0.5``) and SCFL (``encoding = "projection"``,
    ``weights = "fixed"``)."""

    ONLY_WITH = {"strong_convexity": (OnlyWith("lr_schedule", ("inverse_lambda_t",)),),
                 "noise_ratio": (OnlyWith("mi_epsilon"),), "alpha": (OnlyWith("weights", ("fixed",)),),
                 "beta": (OnlyWith("weights", ("theoretical",)),), "model_bound": (OnlyWith("weights", ("theoretical",)),),
                 "straggler_p": (OnlyWith("rescale", ("configured",)),)}

    iterations: Positive[int] = 1000
    """T, the second stage's iterations (rounds)."""
    lr: Positive[float] = 1e-4
    """η₀ of η_t = η₀/t (the paper's Sec. V: 1e-4)."""
    lr_schedule: Literal["eta0_over_t", "eta0_over_t_plus_1", "inverse_lambda_t", "constant"] = "eta0_over_t"
    """η_t = η₀/t with t counted from 1 (the paper's, which leaves η at its t = 0 undefined), η₀/(t+1),
    1/(λt) of Theorem 2 (needs strong_convexity), or η₀ throughout ("constant", beyond the paper: see
    :meth:`Acfl.learning_rate`)."""
    strong_convexity: Positive[float] | None = None
    """λ of Theorem 2 (Σ XᵀX ≥ λI), for lr_schedule = "inverse_lambda_t"."""
    sigma1_sq: Positive[float] | None = None
    """σ₁², the variance of H_X's noise (with sigma2_sq; default 1 when neither they nor mi_epsilon is given)."""
    sigma2_sq: Positive[float] | None = None
    """σ₂², the variance of H_Y's noise."""
    mi_epsilon: float | None = Field(None, gt=0, le=MAX_EPSILON_NATS)
    """Target ε-MI-DP of the coded upload, in nats: σ₁², σ₂² from the inverse of Theorem 1 (or of
    the derived SCFL bound), σ₂² = noise_ratio · σ₁²; at most 700 (exp(ε) stays finite)."""
    noise_ratio: Positive[float] = 1.0
    """σ₂²/σ₁² when calibrating from mi_epsilon (the paper's Fig. 1 uses equal variances)."""
    encoding: Literal["gram", "projection"] = "gram"
    """"gram": ACFL's XᵀX + N₁, XᵀY + N₂ (eqs. 2–3); "projection": SCFL's G X + N₁, G Y + N₂."""
    weights: Literal["adaptive", "theoretical", "fixed"] = "adaptive"
    """α_t: eq. (43) online, α* of eq. (36) for beta and model_bound, or alpha."""
    alpha: Fraction = 0.5
    """The fixed weight (NA: 0.5)."""
    beta: Positive[float] | None = None
    """β of Assumption 2 (‖G⁽ⁱ⁾‖_F ≤ β), for weights = "theoretical"."""
    model_bound: Positive[float] | None = None
    """C of Assumption 3 (‖W_t‖_F ≤ C), for weights = "theoretical"."""
    all_straggle: Literal["coded", "last"] = "coded"
    """When every node straggles (β̂² = 0/0): α = 1, or the last β̂² (α = 1 before any)."""
    straggler_p: float | None = Field(None, ge=0.0, lt=1.0)
    """p of the 1/(1−p) rescaling (eq. 9); none: [stragglers] p (Bernoulli), else required."""
    rescale: Literal["configured", "observed"] = "configured"
    """p from straggler_p, or the round's observed rate 1 − answered/N."""

    @model_validator(mode="after")
    def _one_noise_setting(self) -> "AcflSection":
        if self.mi_epsilon is not None and (self.sigma1_sq is not None or self.sigma2_sq is not None):
            raise ValueError("mi_epsilon: give either mi_epsilon or sigma1_sq and sigma2_sq, not both")
        if (self.sigma1_sq is None) != (self.sigma2_sq is None):
            raise ValueError("sigma2_sq: give sigma1_sq and sigma2_sq together")
        if self.weights == "theoretical" and (self.beta is None or self.model_bound is None):
            raise ValueError('beta: weights = "theoretical" needs beta and model_bound')
        if self.lr_schedule == "inverse_lambda_t" and self.strong_convexity is None:
            raise ValueError('strong_convexity: lr_schedule = "inverse_lambda_t" needs it')
        return self

    def noise(self, features: int, outputs: int) -> tuple[float, float]:
        """(σ₁², σ₂²) of this section for D features and o outputs."""
        if self.mi_epsilon is None:
            return (self.sigma1_sq, self.sigma2_sq) if self.sigma1_sq is not None else (1.0, 1.0)
        if self.encoding == "projection":
            s1 = theory.scfl_sigma_sq_for_epsilon(self.mi_epsilon)
            return s1, self.noise_ratio * s1
        return theory.sigma_sq_for_epsilon(features, outputs, self.mi_epsilon, self.noise_ratio)


def padded(train: Split, outputs_of, design=None) -> tuple[np.ndarray, np.ndarray]:
    """Every node's rows in one zero-padded stack: x (M, m_max, D), y (M, m_max, o), x through
    ``design`` (the model's features: bias column, embedding) *before* padding, so the padding rows
    stay zero: they add nothing to XᵀX, XᵀY or Xᵀ(XW − Y), and ragged nodes (Adult-1) share one
    batched product."""
    sizes = train.sizes
    m_max = int(sizes.max()) if len(sizes) else 0
    rows = np.arange(m_max)
    mask = rows[None, :] < sizes[:, None]
    index = np.where(mask, train.offsets[:-1, None] + rows[None, :], 0)
    features = train.x if design is None else design(train.x)
    x = np.where(mask[..., None], features[index], 0.0)
    y = np.where(mask[..., None], outputs_of(train.y[index]), 0.0)
    return x, y


class Acfl(BaseAlgorithm):
    """ACFL and its baselines (module docstring), on the base: W broadcast as its global model.

    Args:
        model: the linear regression (D = ``model.features``, o = ``model.outputs``).
        num_nodes: N.
        iterations: T.
        lr: η₀. lr_schedule: one of :data:`LR_SCHEDULES`. strong_convexity: λ (for "inverse_lambda_t").
        sigma1_sq, sigma2_sq: σ₁², σ₂² (0 allowed here: no noise, ε infinite; the config needs > 0).
        straggler_p: p of the rescaling. rescale: "configured" or "observed".
        encoding, weights, alpha, beta, model_bound, all_straggle: as in :class:`AcflSection`.
        max_rows: m, the most training rows any node of the run holds (the run's partition): it
            bounds the honest uploads (module docstring); None: no bound declared.
    """

    has_setup = True
    global_name = "W"

    def __init__(self, model: LinearRegression, *, num_nodes: int, iterations: int, lr: float, sigma1_sq: float,
                 sigma2_sq: float, straggler_p: float, lr_schedule: str = "eta0_over_t",
                 strong_convexity: float | None = None, encoding: str = "gram", weights: str = "adaptive",
                 alpha: float = 0.5, beta: float | None = None, model_bound: float | None = None,
                 all_straggle: str = "coded", rescale: str = "configured", max_rows: int | None = None):
        self.model, self.num_nodes, self.iterations, self.lr = model, num_nodes, iterations, lr
        self.lr_schedule, self.strong_convexity = lr_schedule, strong_convexity
        self.sigma1_sq, self.sigma2_sq, self.straggler_p, self.rescale = sigma1_sq, sigma2_sq, straggler_p, rescale
        self.encoding, self.weights, self.alpha = encoding, weights, alpha
        self.beta, self.model_bound, self.all_straggle = beta, model_bound, all_straggle
        self.features, self.outputs = model.features, model.outputs
        self.max_rows = max_rows
        # The nodes' XᵀX and XᵀY, row self._row[node] (only the nodes this process holds).
        self._row: dict[int, int] = {}
        self._gram_x = np.zeros((0, self.features, self.features))
        self._gram_y = np.zeros((0, self.features, self.outputs))

    # --- what the contract asks -------------------------------------------------------------

    @property
    def rounds(self) -> int:
        return self.iterations

    @property
    def flops_per_step(self) -> float:
        """One node's gradient from its cached Gram: (XᵀX) W − XᵀY, 2 D² o."""
        return 2.0 * self.features**2 * self.outputs

    @property
    def epsilon_nats(self) -> float:
        """ε-MI-DP of one node's coded upload, nats (Theorem 1, eq. 17; SCFL: the derived bound),
        true of the upload the code makes: H_X = XᵀX + N₁, H_Y = XᵀY + N₂ with every entry of N₁, N₂
        i.i.d. Gaussian of σ₁², σ₂² drawn once from the node's own stream (:meth:`setup_step`), and
        every entry of X and Y in [−1, 1] (Assumption 1: the loaders' public scaling). It covers
        that upload only: the gradients of :meth:`node_step` are exact."""
        if self.encoding == "projection":
            return theory.scfl_epsilon(self.sigma1_sq) if self.sigma1_sq > 0 else float("inf")
        if self.sigma1_sq <= 0 or self.sigma2_sq <= 0:
            return float("inf")
        return theory.mi_epsilon(self.features, self.outputs, self.sigma1_sq, self.sigma2_sq)

    def state_spec(self) -> dict[str, TensorSpec]:
        """W (D × o) the model; H̃_X (D × D), H̃_Y (D × o) the global coded set (server-only);
        ``uploads`` (1,) how many nodes' uploads it sums; ``beta_sq`` (1,) the last β̂²
        (NaN before any); ``alpha`` (1,) the last α_t."""
        d, o = self.features, self.outputs
        return {"W": TensorSpec((d, o)), "HX": TensorSpec((d, d)), "HY": TensorSpec((d, o)),
                "uploads": TensorSpec((1,)), "beta_sq": TensorSpec((1,)), "alpha": TensorSpec((1,))}

    def uplink_spec(self) -> dict[str, TensorSpec]:
        """G_t⁽ⁱ⁾ (D × o): ‖·‖_F ≤ m D ‖W_t‖_F + m sqrt(D o) (module docstring), W_t as received."""
        d, o, m = self.features, self.outputs, self.max_rows
        if m is None:
            return {"gradient": TensorSpec((d, o))}
        return {"gradient": TensorSpec((d, o), max_norm=m * math.sqrt(d * o), relative_to="W", norm_growth=m * d,
                                       centred=False)}

    def setup_spec(self) -> dict[str, TensorSpec]:
        """The coded data set: H_X (D × D) and H_Y (D × o) (SCFL: X̃ and Ỹ, the same sizes), within
        the bounds of the module docstring: Assumption 1 and m rows, plus the noise's tail."""
        d, o, m = self.features, self.outputs, self.max_rows
        if m is None:
            return {"HX": TensorSpec((d, d)), "HY": TensorSpec((d, o))}
        s1, s2 = math.sqrt(self.sigma1_sq), math.sqrt(self.sigma2_sq)
        data_x = m * d if self.encoding == "gram" else m * math.sqrt(d)  # ‖XᵀX‖_F, or ‖G X‖_F
        data_y = m * math.sqrt(d * o) if self.encoding == "gram" else m * math.sqrt(o)  # ‖XᵀY‖_F, or ‖G Y‖_F

        def spec(shape: tuple[int, int], data_norm: float, sigma: float) -> TensorSpec:
            entries = shape[0] * shape[1]
            largest = m + gaussian_entry_bound(sigma, entries)  # every data entry is a sum of m terms in [−1, 1]
            return TensorSpec(shape, max_norm=data_norm + gaussian_norm_bound(sigma, entries),
                              value_range=(-largest, largest))

        return {"HX": spec((d, d), data_x, s1), "HY": spec((d, o), data_y, s2)}

    def setup_events(self, node: int) -> list[Event]:
        """The one-time upload, 8 (D² + D o) bytes (Remark 1, eq. 12), and its ε-MI-DP."""
        size = (self.features**2 + self.features * self.outputs) * BYTES_PER_REAL  # φ = 64 bits (Remark 1)
        return [CommunicationEvent(node, SETUP_ROUND, bytes_up=size, bytes_down=0),
                MutualInfoEvent(node, SETUP_ROUND, self.epsilon_nats)]

    def round_cost(self, node: int, ctx: RoundContext) -> RoundCost:
        """One full-batch gradient: 8 D o bytes up (Remark 1, eq. 13), W_t down."""
        size = self.features * self.outputs * BYTES_PER_REAL
        return RoundCost(1, bytes_up=size, bytes_down=size)

    def init_state(self, params0: np.ndarray) -> State:
        d, o = self.features, self.outputs
        return {"W": np.asarray(params0, dtype=np.float64).reshape(d, o).copy(), "HX": np.zeros((d, d)),
                "HY": np.zeros((d, o)), "uploads": np.zeros(1), "beta_sq": np.full(1, np.nan), "alpha": np.zeros(1)}

    def eval_params(self, state: State) -> np.ndarray:
        return state["W"].ravel()

    # --- first stage ------------------------------------------------------------------------

    def grams(self, train: Split, node_ids: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """(XᵀX (M, D, D), XᵀY (M, D, o)) of each node, computed once per node (a node's data is
        fixed for the run) and kept: each gradient is then (XᵀX) W − XᵀY, eq. (7) regrouped."""
        missing = [i for i, n in enumerate(node_ids) if int(n) not in self._row]
        if missing:
            x, y = padded(train.select(missing) if len(missing) < len(node_ids) else train, self._targets,
                          self.model.design)
            xt = x.transpose(0, 2, 1)
            for i in missing:
                self._row[int(node_ids[i])] = len(self._row)
            self._gram_x = np.concatenate([self._gram_x, xt @ x])
            self._gram_y = np.concatenate([self._gram_y, xt @ y])
        rows = np.fromiter((self._row[int(n)] for n in node_ids), dtype=np.int64, count=len(node_ids))
        if rows.size and np.array_equal(rows, np.arange(rows[0], rows[0] + rows.size)):
            # The usual case (the same nodes every iteration, in order): views, not an (M, D, D) copy
            # per iteration. Read-only to the callers.
            span = slice(int(rows[0]), int(rows[0]) + rows.size)
            return self._gram_x[span], self._gram_y[span]
        return self._gram_x[rows], self._gram_y[rows]

    def _targets(self, y: np.ndarray) -> np.ndarray:
        return self.model.targets(y)

    def setup_step(self, train: Split, node_ids: Sequence[int], ctx: RoundContext) -> NodeResult:
        """Each node's coded data set (eqs. 2–3, or SCFL's projection), noise drawn once from
        ``stream(seed, node, −1, NOISE)`` (its secret's on a board with one): N₁ first (D × D), then N₂ (D × o)."""
        ids = tuple(int(n) for n in node_ids)
        d, o = self.features, self.outputs
        hx, hy = np.empty((len(ids), d, d)), np.empty((len(ids), d, o))
        s1, s2 = np.sqrt(self.sigma1_sq), np.sqrt(self.sigma2_sq)
        if self.encoding == "gram":
            a, b = self.grams(train, ids)
        else:
            x, y = padded(train, self._targets, self.model.design)
        for i, rng in enumerate(node_streams(ctx.seed, ids, SETUP_ROUND, Purpose.NOISE, ctx.secrets)):
            if self.encoding == "gram":
                hx[i] = a[i] + s1 * rng.standard_normal((d, d))  # eq. (2)
                hy[i] = b[i] + s2 * rng.standard_normal((d, o))  # eq. (3)
            else:
                m = int(train.sizes[i])
                g = rng.standard_normal((d, m))
                g /= np.linalg.norm(g, axis=0, keepdims=True)  # unit columns: E[GᵀG] = I
                hx[i] = g @ x[i, :m] + s1 * rng.standard_normal((d, d))
                hy[i] = g @ y[i, :m] + s2 * rng.standard_normal((d, o))
        return NodeResult(ids, {"HX": hx, "HY": hy}, events=[self.setup_events(n) for n in ids])

    def server_setup(self, state: State, result: NodeResult, ctx: RoundContext) -> ServerResult:
        """H̃_X = Σ H_X⁽ⁱ⁾, H̃_Y = Σ H_Y⁽ⁱ⁾ over the uploads received (eq. 4); SCFL: Σ X̃ᵀX̃, Σ X̃ᵀỸ.
        The individual uploads are not kept."""
        hx, hy = result.tensors.get("HX"), result.tensors.get("HY")
        new = dict(state)
        if result.node_ids:
            if self.encoding == "gram":
                new["HX"], new["HY"] = hx.sum(axis=0), hy.sum(axis=0)  # eq. (4)
            else:
                xt = hx.transpose(0, 2, 1)
                new["HX"], new["HY"] = (xt @ hx).sum(axis=0), (xt @ hy).sum(axis=0)
        new["uploads"] = np.array([float(len(result.node_ids))])
        return ServerResult(new)

    # --- second stage -----------------------------------------------------------------------

    def node_step(self, received: Mapping[str, np.ndarray], train: Split, node_ids: Sequence[int],
                  ctx: RoundContext) -> NodeResult:
        """G_t⁽ⁱ⁾ = Xᵀ(X W_t − Y) = (XᵀX) W_t − XᵀY on every node at once (eq. 7)."""
        ids = tuple(int(n) for n in node_ids)
        a, b = self.grams(train, ids)
        return self.result(ids, {"gradient": a @ received["W"] - b}, train, ctx)  # eq. (7)

    def coded_gradient(self, state: State) -> np.ndarray:
        """G_S = H̃_X W_t − H̃_Y (eq. 8); SCFL: the noise bias n D σ₁² W_t taken off."""
        g = state["HX"] @ state["W"] - state["HY"]  # eq. (8)
        if self.encoding == "projection":
            g -= state["uploads"][0] * self.features * self.sigma1_sq * state["W"]
        return g

    def rescale_p(self, ctx: RoundContext) -> float:
        """p of eq. (9)'s 1/(1 − p): configured, or observed this round."""
        if self.rescale == "observed":
            return 1.0 - len(ctx.answered) / self.num_nodes
        return self.straggler_p

    def weight(self, state: State, grads: np.ndarray, p: float) -> tuple[float, float]:
        """(α_t, β̂²) for this round from the non-stragglers' gradients (M, D, o)."""
        beta_sq = float(np.einsum("mdo,mdo->m", grads, grads).mean()) if len(grads) else np.nan  # eq. (42)
        if self.weights == "fixed":
            return self.alpha, beta_sq
        d, o = self.features, self.outputs
        if self.weights == "theoretical":
            return theory.optimal_alpha(nodes=self.num_nodes, p=p, beta_sq=self.beta**2,  # eq. (36)
                                        model_bound_sq=self.model_bound**2, dim=d, outputs=o,
                                        sigma1_sq=self.sigma1_sq, sigma2_sq=self.sigma2_sq), beta_sq
        b = beta_sq
        if np.isnan(b):
            b = state["beta_sq"][0] if self.all_straggle == "last" else np.nan
            if np.isnan(b):
                return 1.0, beta_sq
        c_sq = float(np.einsum("do,do->", state["W"], state["W"]))  # eq. (42)
        num = p * b
        den = num + d * self.sigma1_sq * c_sq * (1 - p) + self.sigma2_sq * o * d * (1 - p)  # eq. (43)
        return (num / den if den > 0 else 1.0), beta_sq

    def learning_rate(self, round_index: int) -> float:
        """η_t of round r (0-based), t = r + 1 counted from 1: η₀/t (Sec. V), η₀/(t + 1), 1/(λt)
        (Theorem 2), or η₀ ("constant").

        "constant" is ours, beyond the paper, for real data: a stable η₀ must stay below about
        2/λ_max(H̃_X), and the one-hot least squares of Adult is ill-conditioned (λ_max ≈ 4e4, rank
        deficient), so η₀/t, whose Σ_t η_t grows only like η₀ ln T, leaves the weakly curved
        directions where W₀ put them (test accuracy stuck at the majority share). A constant step
        moves every direction of eigenvalue above ≈ λ_max/T. It gives up the 1/T rate of
        Theorem 2 (the coded set's noise is fixed, not fresh, so the iterates settle at the noisy
        objective's minimiser rather than wander). A public bound for choosing η₀ without looking
        at the data: entries |x| ≤ 1 give λ_max(Σ XᵀX) ≤ tr = Σ‖x‖² ≤ n D (n rows in all), and
        rows in the unit ball (the loaders' scaling) ≤ n, plus one per row for a bias column;
        η₀ = 1/that bound is always stable for the noiseless part."""
        t = round_index + 1
        if self.lr_schedule == "constant":
            return self.lr
        if self.lr_schedule == "eta0_over_t":
            return self.lr / t
        if self.lr_schedule == "eta0_over_t_plus_1":
            return self.lr / (t + 1)
        return 1.0 / (self.strong_convexity * t)  # Theorem 2

    def server_step(self, state: State, result: NodeResult, ctx: RoundContext) -> ServerResult:
        """α_t, G_All (eq. 9) and W_{t+1} = W_t − η_t G_All (eq. 10)."""
        grads = result.tensors["gradient"] if result.node_ids else np.zeros((0, self.features, self.outputs))
        p = self.rescale_p(ctx)
        alpha, beta_sq = self.weight(state, grads, p)
        g_all = alpha * self.coded_gradient(state)
        if len(grads):
            g_all += (1.0 - alpha) / (1.0 - p) * grads.sum(axis=0)  # eq. (9)
        new = dict(state)
        new["W"] = state["W"] - self.learning_rate(ctx.round_index) * g_all  # eq. (10)
        new["alpha"] = np.array([alpha])
        if not np.isnan(beta_sq):
            new["beta_sq"] = np.array([beta_sq])
        return ServerResult(new)

    def describe(self) -> dict[str, Any]:
        return {"iterations": self.iterations, "lr": self.lr, "lr_schedule": self.lr_schedule,
                "encoding": self.encoding, "weights": self.weights,
                "alpha": self.alpha if self.weights == "fixed" else None, "sigma1_sq": self.sigma1_sq,
                "sigma2_sq": self.sigma2_sq, "straggler_p": self.straggler_p, "rescale": self.rescale,
                "mi_epsilon_nats": self.epsilon_nats, "private": True,
                "privacy_scope": "MI-DP (Theorem 1) covers the one-time coded upload only; the gradients "
                                 "sent each iteration are not covered (the paper's scope)"}


def _linear(model: Any) -> LinearRegression:
    """The model, if it is the linear regression ACFL trains (checked when the run is built, so a
    bare ``[run] algorithm = "acfl"`` still loads and writes its config)."""
    if not isinstance(model, LinearRegression):
        raise ConfigError("model.kind", f'ACFL trains a linear regression: set model.kind = "linear", not '
                                        f'"{model.name}"')
    return model


def build(sections: dict[str, Any], ctx: BuildContext) -> Acfl:
    a: AcflSection = sections["acfl"]
    model = _linear(ctx.model)
    s1, s2 = a.noise(model.features, model.outputs)
    return Acfl(model, num_nodes=ctx.num_nodes, iterations=a.iterations, lr=a.lr, lr_schedule=a.lr_schedule,
                strong_convexity=a.strong_convexity, sigma1_sq=s1, sigma2_sq=s2,
                straggler_p=ctx.straggler_p if a.straggler_p is None else a.straggler_p, rescale=a.rescale,
                encoding=a.encoding, weights=a.weights, alpha=a.alpha, beta=a.beta, model_bound=a.model_bound,
                all_straggle=a.all_straggle, max_rows=int(ctx.data.train.sizes.max()))


def check(config: Any) -> None:
    """Cross-section constraints: a straggler p to rescale with."""
    a: AcflSection = config.acfl
    if a.straggler_p is None and a.rescale == "configured" and config.stragglers.model == "deadline":
        raise ConfigError("acfl.straggler_p", 'give the p to rescale deadline stragglers with, or set '
                                              'acfl.rescale = "observed"')


def plan(config: Any, model: LinearRegression, data: Any) -> tuple[Any, dict]:
    """Before the run: the noise, the ε-MI-DP of the coded upload against ``budget.mi_epsilon``
    (the setup spends it before round 1, so a budget it breaks stops the run here), for the
    summary's ``plan``."""
    a: AcflSection = config.acfl
    model = _linear(model)
    s1, s2 = a.noise(model.features, model.outputs)
    eps = theory.scfl_epsilon(s1) if a.encoding == "projection" else theory.mi_epsilon(model.features, model.outputs,
                                                                                       s1, s2)
    limit = config.budget.mi_epsilon
    if limit is not None and eps > limit * (1 + 1e-9):
        raise ConfigError("budget.mi_epsilon", f"the coded upload spends {eps:.6g} nats, more than {limit:g}")
    return config, {"sigma1_sq": s1, "sigma2_sq": s2, "mi_epsilon_nats": eps, "features": model.features,
                    "outputs": model.outputs}


REGISTRATION = Registration(name="acfl", sections={"acfl": AcflSection}, build=build, check=check, plan=plan,
                            planned_rounds=lambda sections: sections["acfl"].iterations,
                            guarantee=lambda sections: "mi_dp", privacy_cli=acfl_cli.PRIVACY, plan_cli=acfl_cli.PLAN,
                            assumptions=lambda sections: list(acfl_cli.ASSUMPTIONS),
                            privacy_statements=(acfl_cli.STATEMENT,))


def bernoulli_answered(seed: int, p: float, num_nodes: int, iterations: int) -> np.ndarray:
    """(T, N) bool: who answers each iteration under ``[stragglers] model = "bernoulli"``, the very
    draws of :func:`testbed.rounds.stragglers.draw_stragglers` (node i's uniform from its
    (seed, i, r, STRAGGLER) Philox counter), so an in-memory run sees the stragglers `testbed run` sees."""
    from testbed.streams.counter_rng import uniform_pairs

    ids = list(range(num_nodes))
    return np.array([uniform_pairs(seed, ids, r, Purpose.STRAGGLER)[0] >= p
                     for r in range(iterations)]).reshape(iterations, num_nodes)


def trajectory(alg: Acfl, data: Any, *, seed: int, answered: np.ndarray, params0: np.ndarray) -> dict[str, np.ndarray]:
    """Setup, then one iteration per row of ``answered``, in memory: the algorithm's own steps as
    the sim runner calls them, without ledger, budgets or files (for experiments and benchmarks;
    the same seed gives the same W as ``testbed run``).

    Args:
        alg: the algorithm. data: every node's data (FederatedData). seed: the run's seed.
        answered: (T, N) bool, the non-stragglers of each iteration. params0: (P,) W₀.
    Returns:
        "loss" (T + 1,): f(W_t) of eq. (1), the sum over every node's training rows, t = 0..T;
        "alpha" (T,): α_t; "W" (D, o): W_T.

    Example::

        >>> from testbed.learning.models import LinearRegression
        >>> from testbed.data.regression import make_regression
        >>> data = make_regression(num_nodes=3, samples_per_node=20, dim=2, outputs=2, seed=0)
        >>> alg = Acfl(LinearRegression(2, 2), num_nodes=3, iterations=4, lr=1e-2, sigma1_sq=1.0,
        ...            sigma2_sq=1.0, straggler_p=0.2)
        >>> out = trajectory(alg, data, seed=0, answered=np.ones((4, 3), bool), params0=np.zeros(4))
        >>> out["loss"].shape, bool(out["loss"][-1] < out["loss"][0])
        ((5,), True)
    """
    ids = tuple(data.node_ids)
    n = len(ids)
    setup_ctx = RoundContext(SETUP_ROUND, seed, n, ids).closed(ids)
    state = alg.init_state(params0)
    state = alg.server_setup(state, alg.setup_step(data.train, ids, setup_ctx), setup_ctx).state
    a, b = alg.grams(data.train, ids)
    a_sum, b_sum = a.sum(axis=0), b.sum(axis=0)
    y = alg.model.targets(data.train.y)
    yy = float(np.einsum("no,no->", y, y))

    def loss(w: np.ndarray) -> float:  # eq. (1): ½ Σ_i ‖X_i W − Y_i‖², from the Grams
        return 0.5 * float(np.einsum("do,do->", w, a_sum @ w)) - float(np.einsum("do,do->", w, b_sum)) + 0.5 * yy

    losses, alphas = [loss(state["W"])], []
    every = np.arange(n)
    for r, mask in enumerate(np.asarray(answered, dtype=bool)):
        heard = tuple(int(ids[i]) for i in every[mask])
        ctx = RoundContext(r, seed, n, heard).closed(heard)
        train = data.train if len(heard) == n else data.train.select(list(every[mask]))
        result = alg.node_step(alg.downlink(state, ctx, heard), train, heard, ctx) if heard \
            else NodeResult((), {})
        state = alg.server_step(state, result, ctx).state
        losses.append(loss(state["W"]))
        alphas.append(float(state["alpha"][0]))
    return {"loss": np.array(losses), "alpha": np.array(alphas), "W": state["W"]}
