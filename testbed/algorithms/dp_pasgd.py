"""DP-PASGD (Hu et al.): τ noisy local SGD steps per node, then equal-weight averaging.

The node step runs eq. (7a) τ times on a stack of nodes (leading node axis; one node on a board,
all of them in sim); the server step is eq. (7b) over the nodes that answered. DP-SGD is τ = 1;
PASGD is σ = 0. The state is ``{"model": θ}``, (P,), broadcast to every node each round.

Example::

    >>> from testbed.learning.models import LogisticRegression
    >>> from testbed.data.synthetic import make_logistic
    >>> from testbed.algorithms.contract import RoundContext
    >>> data = make_logistic(num_nodes=4, samples_per_node=100, dim=5, seed=0)
    >>> alg = DpPasgd(LogisticRegression(5, 2), steps=20, tau=5, batch=8, lr=0.5, sigma=1.0,
    ...               delta=1e-4, train_sizes=data.train.sizes)
    >>> state = alg.init_state(alg.model.init(None))
    >>> ctx = RoundContext(round_index=0, seed=1, num_nodes=4, expected=(0, 1, 2, 3))
    >>> out = alg.node_step(alg.downlink(state, ctx, ctx.expected), data.train, ctx.expected, ctx)
    >>> out.tensors["update"].shape, alg.server_step(state, out, ctx.closed(out.node_ids)).state["model"].shape
    ((4, 12), (12,))
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np

from testbed.algorithms import dp_pasgd_cli, mcu_logistic
from testbed.algorithms.aggregate import Aggregation, bucket_stream
from testbed.algorithms.base import BYTES_PER_REAL, BaseAlgorithm, RoundCost, standard_normals
from testbed.algorithms.batches import check_batches, node_keys, uniform_batches
from testbed.algorithms.contract import (McuTask, MetricSpec, NodeResult, RoundContext, ServerResult, State, TensorSpec,
                                         mcu_seed)
from testbed.algorithms.dp_pasgd_section import (DpPasgdSection, PlanSection, calibrate, check, check_lipschitz,
                                                 guarantee, plan, planned_rounds)
from testbed.algorithms.registry import BuildContext, Registration, RobustChoice
from testbed.data.federated import FederatedData, Split
from testbed.learning.models import LogisticRegression, Model
from testbed.ledger.events import Event, EventBatch, GaussianEvent, NodeEvents
from testbed.privacy import canaries, zcdp
from testbed.util.parallel import split_work

if TYPE_CHECKING:
    from testbed.streams.node_secret import Secrets


#: Bytes of one block of nodes' noise and batch rows in :meth:`DpPasgd.node_step`.
_BLOCK_BYTES = 4 << 20


class DpPasgd(BaseAlgorithm):
    """DP-PASGD with resolved noise and sensitivity (on the base: the global model θ, broadcast).

    Args:
        model: the model (see testbed.learning.models).
        steps: K, local steps per node in the whole run; a multiple of ``tau``.
        tau: local steps between averagings (τ = 1: DP-SGD).
        batch: mini-batch size X (same on every node).
        lr: learning rate η.
        sigma: noise std σ per coordinate (0: PASGD); or None to calibrate from ``epsilon``.
        epsilon: target ε at ``delta`` after K steps, per ``calibration`` (eq. 9 or eq. 23).
        lipschitz: G of the sensitivity 2G/X; default: the model's bound (or ``clip_norm``).
        clip_norm: clip per-sample gradients at this norm (not in the paper; off by default).
        sampling: "uniform" (X distinct samples per step) or "poisson" (rate X/N_m each sample).
        c1, c2: abstract cost per round and per step (eq. 8).
        aggregation: the server's rule (testbed.algorithms.aggregate; default the mean of eq. 7b).
        train_sizes: training samples of each node, by global node id, for the sampling rate.
        mcu_nodes: nodes that are microcontroller boards: their step is the firmware's float32 one
            (testbed.algorithms.mcu_logistic), the same numbers a bridged board sends.
    """

    def __init__(
        self,
        model: Model,
        *,
        steps: int,
        tau: int,
        batch: int,
        lr: float,
        delta: float,
        train_sizes: Mapping[int, int] | Sequence[int],
        sigma: float | None = None,
        epsilon: float | None = None,
        calibration: str = "corrected",
        lipschitz: float | None = None,
        clip_norm: float | None = None,
        sampling: str = "uniform",
        c1: float = 100.0,
        c2: float = 1.0,
        aggregation: Aggregation = Aggregation(),
        bound_updates: bool = True,
        mcu_nodes: frozenset[int] = frozenset(),
    ):
        if steps % tau:
            raise ValueError(f"steps K = {steps} must be a multiple of tau = {tau}")
        self.model = model
        self.steps, self.tau, self.batch, self.lr = steps, tau, batch, lr
        self.delta, self.sampling, self.c1, self.c2 = delta, sampling, c1, c2
        self.clip_norm = clip_norm
        self.lipschitz = lipschitz if lipschitz is not None else (clip_norm or model.lipschitz_bound)
        self.train_sizes = dict(train_sizes) if isinstance(train_sizes, Mapping) else dict(enumerate(train_sizes))
        if sigma is None and epsilon is None:
            sigma = 0.0
        if sigma is None:
            sigma = zcdp.dp_pasgd_sigma(steps, self.lipschitz, batch, epsilon, delta, calibration)
        self.sigma = float(sigma)
        self.calibration = calibration
        self.aggregation, self.bound_updates = aggregation, bound_updates
        self.mcu_nodes = frozenset(int(n) for n in mcu_nodes)

    @property
    def rounds(self) -> int:
        """K/τ communication rounds."""
        return self.steps // self.tau

    @property
    def sensitivity(self) -> float:
        """2G/X under replace-one adjacency (dp-pasgd.md §2.2), true because each of the X
        per-sample gradients of a step has norm <= G: clipped to G (``clip_norm``, the ``clip_norm``
        of ``loss_and_grad``), or, unclipped, G at least the model's own per-sample bound on rows of
        norm <= 1 (``lipschitz_bound``; tests/test_models.py, and :func:`build` refuses a smaller
        G); the step's gradient is their mean (weights 1/X), so replacing one record moves it by at
        most 2G/X. Poisson batches (add/remove, :meth:`_privacy_event`): adding a record adds one
        gradient of norm <= G to a sum divided by the expected X: G/X."""
        return zcdp.dp_pasgd_sensitivity(self.lipschitz, self.batch)

    @property
    def record_reach(self) -> float:
        """How far one record can move one step's mean gradient, from the mechanism itself: 2C/X
        (replace-one; C/X add/remove under Poisson sampling) with C the clip norm, or the model's own
        per-sample gradient bound on unit-ball data; not ``lipschitz``, the G the ledger is told
        (an audit's canaries are sized by this, so a G set too small is caught)."""
        g = self.clip_norm if self.clip_norm is not None else self.model.lipschitz_bound
        return (1.0 if self.sampling == "poisson" else 2.0) * g / self.batch

    @property
    def local_steps(self) -> int:
        """τ local steps a round."""
        return self.tau

    def uplink_spec(self) -> dict[str, TensorSpec]:
        """Each node sends its local model after τ steps, within :attr:`update_norm_bound` of θ."""
        return {"update": TensorSpec((self.model.num_params,), max_norm=self.update_norm_bound, relative_to="model")}

    def metric_spec(self) -> dict[str, MetricSpec]:
        """Each node reports its training samples, at most the largest node's."""
        return {"samples": MetricSpec(low=1, high=max(self.train_sizes.values(), default=1), integer=True)}

    @property
    def update_norm_bound(self) -> float | None:
        """How far from θ an honest node's update can be: τ steps of eq. (7a), each moving it by
        at most η G (G: the clip norm, or the model's per-sample gradient bound on unit-ball data)
        plus η times Gaussian noise; Σ of τ noise vectors is N(0, τσ² I_P), whose norm exceeds
        σ sqrt(τ) (sqrt(P) + t) with probability at most exp(−t²/2): t = 10. None without a
        gradient bound or with ``bound_updates`` off."""
        g = self.clip_norm if self.clip_norm is not None else self.model.lipschitz_bound
        if not self.bound_updates or g is None:
            return None
        p = self.model.num_params
        return self.lr * self.tau * g + self.lr * self.sigma * math.sqrt(self.tau) * (math.sqrt(p) + 10.0)

    def round_cost(self, node: int, ctx: RoundContext) -> RoundCost:
        """τ steps (c2 each), one upload and one download of the model (c1)."""
        size = self.model.num_params * BYTES_PER_REAL
        return RoundCost(self.tau, bytes_up=size, bytes_down=size, step_cost_units=self.c2, round_cost_units=self.c1)

    def releases(self, node: int, ctx: RoundContext) -> list[Event]:
        """τ Gaussian releases, seen by the server (none at σ = 0)."""
        if self.sigma > 0:  # released to the server; what it broadcasts is post-processing
            return [self._privacy_event(node, ctx.round_index)]
        return []

    def planned_batch(self, node_ids: Sequence[int], ctx: RoundContext) -> NodeEvents:
        """:meth:`planned_events` of every node at once: the same but for the sampling rate, a
        column when the nodes hold different amounts of data."""
        ids = np.asarray(node_ids, dtype=np.int64)
        events = super().planned_batch(ids, ctx)
        if self.sigma > 0 and len(ids):
            rates = np.minimum(1.0, self.batch / np.array([self.train_sizes[n] for n in ids.tolist()], dtype=np.float64))
            if (rates != rates[0]).any():
                events.batches[-1] = EventBatch(events.batches[-1].template, ids, {"sampling_rate": rates})
        return events

    def _privacy_event(self, node: int, round_index: int) -> GaussianEvent:
        rate = min(1.0, self.batch / self.train_sizes[node])
        if self.sampling == "poisson":
            # Normalised by the expected batch X: one record moves the mean by at most G/X.
            return GaussianEvent(node, round_index, self.sigma, self.lipschitz / self.batch, self.tau,
                                 adjacency="add_remove", sampling="poisson", sampling_rate=rate, observer="server",
                                 clip_norm=self.clip_norm or 0.0)
        return GaussianEvent(node, round_index, self.sigma, self.sensitivity, self.tau,
                             adjacency="replace_one", sampling="without_replacement", sampling_rate=rate,
                             observer="server", clip_norm=self.clip_norm or 0.0)

    def describe(self) -> dict[str, Any]:
        """What the summary reports of this algorithm's privacy set-up."""
        return {"sigma": self.sigma, "sensitivity": self.sensitivity, "lipschitz": self.lipschitz,
                "calibration": self.calibration, "sampling": self.sampling, "steps_planned": self.steps,
                "tau": self.tau, "batch": self.batch, "lr": self.lr}

    def node_step(self, received: Mapping[str, np.ndarray], train: Split, node_ids: Sequence[int],
                  ctx: RoundContext) -> NodeResult:
        """τ steps of eq. (7a) on every node of ``train`` from the common model θ.

        Args:
            received: ``{"model": (M, P)}`` the model every node downloaded.
            train: the nodes' training data (node i of ``train`` is node ``node_ids[i]``).
            node_ids: (M,) global node ids, which key the random streams.
            ctx: the round (r: steps rτ+1 .. (r+1)τ; the seed).
        Returns:
            ``update`` (M, P) the local models; metrics ``samples`` (M,) training samples; events.
        """
        m_nodes, tau, round_index, seed = len(node_ids), self.tau, ctx.round_index, ctx.seed
        batch_idx, batch_w = self._draw_batches(train, node_ids, round_index, seed, ctx.secrets)
        # The steps run in the features' type (data.dtype): float32 halves the memory traffic; the
        # noise is the float64 stream's, rounded, so both types release the same draws.
        dtype = np.float32 if train.x.dtype == np.float32 else np.float64
        params = np.array(received["model"], dtype=dtype)  # (M, P), writable
        # A block of nodes at a time (each node's steps are its own): the block's noise and batch
        # rows stay small and in cache, where all 10,000 nodes' would be 100s of MB per step.
        per_node = tau * self.model.num_params + self.batch * train.x.shape[1]
        block = max(1, _BLOCK_BYTES // (per_node * np.dtype(dtype).itemsize))
        noise = np.empty((min(block, m_nodes), tau, self.model.num_params), dtype=dtype)
        audited = canaries.auditing() and self.sigma > 0
        if audited:  # the canaries follow each node's release as charged: its adjacency, sampling rate, observer
            charged = [self._privacy_event(int(n), round_index) for n in node_ids]
        for lo in range(0, m_nodes, block):
            hi = min(m_nodes, lo + block)

            def steps(a: int, b: int) -> None:  # the block's nodes a..b: their noise, then their τ steps
                standard_normals(noise[a:b], seed, node_ids[lo + a:lo + b], round_index, secrets=ctx.secrets)
                noise[a:b] *= self.sigma  # the σ of the plan's GaussianEvent (releases)
                if audited:  # each step's canaries ride on its noise (testbed.privacy.canaries)
                    canaries.insert(noise[a:b], node_ids[lo + a:lo + b], round_index, reach=self.record_reach,
                                    adjacency=charged[0].adjacency, observer=charged[0].observer,
                                    rates=[e.sampling_rate for e in charged[lo + a:lo + b]])
                mine = params[lo + a:lo + b]  # a view: the steps update params in place
                # eq. (7a): w = θ − η(g + b), τ times
                self.local_sgd(mine, received["model"][lo + a:lo + b], train, batch_idx[lo + a:lo + b], batch_w[lo + a:lo + b], noise=noise[a:b],
                               clip_norm=self.clip_norm)

            # A torch network runs its stack on torch's own threads: one Python thread feeds it.
            split_work(hi - lo, steps, numbers=0 if self.model.name == "torch" else noise[:hi - lo].size)
        for i, node in enumerate(node_ids):  # microcontroller boards: the firmware's arithmetic
            if int(node) in self.mcu_nodes:
                lo, hi = train.offsets[i], train.offsets[i + 1]
                params[i] = mcu_logistic.node_step(self.mcu_task(int(node), ctx), received["model"][i],
                                                   train.x[lo:hi], train.y[lo:hi])
        return self.result(tuple(int(n) for n in node_ids), {"update": params.astype(np.float64, copy=False)}, train,
                           ctx)

    def mcu_task(self, node: int, ctx: RoundContext) -> McuTask:
        """What a microcontroller board runs for ``node`` this round (testbed.algorithms.mcu_logistic).

        Raises:
            ValueError: the firmware runs logistic regression, uniform batches, no clipping.
        """
        if not isinstance(self.model, LogisticRegression) or not self.model.bias:
            raise ValueError("a microcontroller board runs logistic regression with a bias (model.kind = \"logistic\")")
        if self.clip_norm is not None or self.sampling != "uniform":
            raise ValueError("a microcontroller board runs uniform batches without clipping")
        return McuTask(mcu_seed(node, ctx), node, ctx.round_index, self.tau, self.batch, self.lr, self.sigma,
                                    self.model.n_classes)

    def mcu_result(self, update: np.ndarray, train: Split, node: int, ctx: RoundContext) -> NodeResult:
        """The node step's result from a board's (P,) update, as :meth:`node_step` gives it."""
        return self.result((node,), {"update": np.asarray(update, dtype=np.float64)[None]}, train, ctx,
                           events=[self.planned_events(node, ctx)])

    def _draw_batches(self, train: Split, node_ids: Sequence[int], round_index: int, seed: int,
                      secrets: "Secrets | None" = None):
        """Global row indices (M, τ, B) and weights (M, τ, B) of every node's τ mini-batches.

        Uniform: B distinct rows per step (the smallest B of τ×N_m uniform keys), weight 1/B.
        Poisson: each row with probability B/N_m, weight 1/B, padded to the step's largest batch
        with weight 0 (pads point at the node's first row and contribute nothing).
        """
        tau, batch = self.tau, self.batch
        if self.sampling != "poisson":
            idx = uniform_batches(train, node_ids, round_index, seed, tau, batch, secrets)
            return idx, np.full(idx.shape, 1.0 / batch)
        masks = [keys < batch / keys.shape[1] for keys in node_keys(train, node_ids, round_index, seed, tau, secrets)]
        width = max(1, max(int(mask.sum(axis=1).max()) for mask in masks))
        idx = np.zeros((len(node_ids), tau, width), dtype=np.int64)
        weights = np.zeros((len(node_ids), tau, width))
        for i, mask in enumerate(masks):
            for step in range(tau):
                rows = np.flatnonzero(mask[step])
                idx[i, step, : len(rows)] = rows
                weights[i, step, : len(rows)] = 1.0 / batch
        return idx + train.offsets[:-1, None, None], weights

    def server_step(self, state: State, result: NodeResult, ctx: RoundContext) -> ServerResult:
        """Eq. (7b): θ = (1/M) Σ_m w_m over the nodes that answered, equal weights whatever N_m
        (eq. 4), or the configured robust rule (norm_clip measures each update from θ); nobody
        answered: θ stays."""
        if not result.node_ids:
            return ServerResult(state)
        return ServerResult({"model": self.aggregation.combine(result.tensors["update"], reference=state["model"],
                                                              shuffle=bucket_stream(ctx.seed, ctx.round_index))})


def build(sections: dict[str, Any], ctx: BuildContext) -> DpPasgd:
    """DP-PASGD as its ``[dp_pasgd]`` section says, for the data this process holds."""
    a: DpPasgdSection = sections["dp_pasgd"]
    data = ctx.data
    check_batches("dp_pasgd", data.train, data.node_ids, a.tau, a.batch, "tau")
    check_lipschitz(sections, ctx.model)
    return DpPasgd(
        ctx.model, steps=a.steps, tau=a.tau, batch=a.batch, lr=a.lr, delta=ctx.delta,
        train_sizes=dict(zip(data.node_ids, data.train.sizes.tolist())), sigma=a.sigma, epsilon=a.epsilon,
        calibration=a.calibration,
        lipschitz=a.lipschitz, clip_norm=a.lipschitz if a.clip else None, sampling=a.sampling,
        c1=a.c1, c2=a.c2, aggregation=a.aggregation_rule(ctx.num_nodes, "dp_pasgd"), bound_updates=a.bound_updates,
        mcu_nodes=ctx.mcu_nodes,
    )


def calibration_step(model: Model, data: FederatedData, batch: int) -> Callable[[Any, int], None]:
    """(params, n) → n DP-PASGD local steps from ``params`` through the real code path
    (``DpPasgd.node_step`` with τ = 1 on the one node of ``data``: batch ``batch``, Gaussian noise,
    update): the step whose cost is c2 of the planner's cost model (eq. 8)."""
    alg = DpPasgd(model, steps=1, tau=1, batch=batch, lr=0.1, delta=1e-4, sigma=1.0,
                  train_sizes=dict(zip(data.node_ids, data.train.sizes.tolist())))
    ids = tuple(data.node_ids)

    def steps(params: Any, n: int) -> None:
        for i in range(n):
            ctx = RoundContext(i, 0, len(ids), ids)
            alg.node_step(alg.downlink({"model": params}, ctx, ids), data.train, ids, ctx)

    return steps


REGISTRATION = Registration(
    name="dp_pasgd",
    sections={"dp_pasgd": DpPasgdSection, "plan": PlanSection},
    build=build,
    check=check,
    plan=plan,
    epsilon_target=lambda sections: sections["dp_pasgd"].epsilon,
    planned_rounds=lambda sections: planned_rounds(sections["dp_pasgd"]),
    guarantee=guarantee,
    calibrate=calibrate,
    client_sampling=True,
    privacy_cli=dp_pasgd_cli.PRIVACY,
    privacy_statements=(dp_pasgd_cli.STATEMENT, dp_pasgd_cli.MCU_STATEMENT),
    plan_cli=dp_pasgd_cli.PLAN,
    calibration_step=calibration_step,
    robust_choice=RobustChoice("trimmed_mean", "O(MP log M), a sort per coordinate (14x the mean at N = 1000)"),
)
