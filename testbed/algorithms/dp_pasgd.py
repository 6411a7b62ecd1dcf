"""DP-PASGD (Hu et al.): τ noisy local SGD steps per node, then equal-weight averaging.

The node step runs eq. (7a) τ times on a stack of nodes (leading node axis; one node on a board,
all of them in sim); the combine step is eq. (7b). DP-SGD is τ = 1; PASGD is σ = 0.

Example::

    >>> from testbed.models import LogisticRegression
    >>> from testbed.data.synthetic import make_logistic
    >>> data = make_logistic(num_nodes=4, samples_per_node=100, dim=5, seed=0)
    >>> alg = DpPasgd(LogisticRegression(5, 2), steps=20, tau=5, batch=8, lr=0.5, sigma=1.0,
    ...               delta=1e-4, train_sizes=data.train.sizes)
    >>> state = alg.init_state(alg.model.init(None))
    >>> out = alg.node_step(state, data.train, node_ids=[0, 1, 2, 3], round_index=0, seed=1)
    >>> out.params.shape, alg.combine(out, state).shape
    ((4, 12), (12,))
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from testbed.algorithms import NodeOutput
from testbed.algorithms.batches import node_keys, uniform_batches
from testbed.data.federated import FederatedData, Split
from testbed.errors import ConfigError
from testbed.ledger import CommunicationEvent, ComputeEvent, Event, GaussianEvent
from testbed.models import Model
from testbed.privacy import zcdp
from testbed.rng import Purpose, stream

if TYPE_CHECKING:
    from testbed.config import Config


class DpPasgd:
    """DP-PASGD with resolved noise and sensitivity.

    Args:
        model: the model (see testbed.models).
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
        train_sizes: training samples of each node, by global node id, for the sampling rate.
    """

    #: Nodes send their models to the coordinator (no channel emulator between them).
    over_the_air = False

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

    @property
    def rounds(self) -> int:
        """K/τ communication rounds."""
        return self.steps // self.tau

    @property
    def sensitivity(self) -> float:
        """2G/X under replace-one adjacency (dp-pasgd.md §2.2)."""
        return zcdp.dp_pasgd_sensitivity(self.lipschitz, self.batch)

    def planned_events(self, node: int, round_index: int) -> list[Event]:
        """The events one round causes on ``node``: τ steps (c2 each), τ Gaussian releases, one
        upload and one download of the model (c1). ``would_exceed`` checks these before the round;
        whoever runs the step charges its seconds and joules (nodes.costs)."""
        size = self.model.num_params * 8
        events: list[Event] = [
            ComputeEvent(node, round_index, self.tau, self.c2 * self.tau),
            CommunicationEvent(node, round_index, bytes_up=size, bytes_down=size, cost_units=self.c1),
        ]
        if self.sigma > 0:
            events.append(self._privacy_event(node, round_index))
        return events

    def _privacy_event(self, node: int, round_index: int) -> GaussianEvent:
        rate = min(1.0, self.batch / self.train_sizes[node])
        if self.sampling == "poisson":
            # Normalised by the expected batch X: one record moves the mean by at most G/X.
            return GaussianEvent(node, round_index, self.sigma, self.lipschitz / self.batch, self.tau,
                                 adjacency="add_remove", sampling="poisson", sampling_rate=rate)
        return GaussianEvent(node, round_index, self.sigma, self.sensitivity, self.tau,
                             adjacency="replace_one", sampling="without_replacement", sampling_rate=rate)

    def init_state(self, params0: np.ndarray) -> np.ndarray:
        """The state is the global model θ, shape (P,); every node starts from θ⁰."""
        return params0

    def eval_params(self, state: np.ndarray) -> np.ndarray:
        return state

    def describe(self) -> dict[str, Any]:
        """What the summary reports of this algorithm's privacy set-up."""
        return {"sigma": self.sigma, "sensitivity": self.sensitivity, "lipschitz": self.lipschitz,
                "calibration": self.calibration, "sampling": self.sampling, "steps_planned": self.steps,
                "tau": self.tau, "batch": self.batch, "lr": self.lr}

    def node_step(
        self,
        global_params: np.ndarray,
        train: Split,
        node_ids: Sequence[int],
        round_index: int,
        seed: int,
    ) -> NodeOutput:
        """τ steps of eq. (7a) on every node of ``train`` from the common model θ.

        Args:
            global_params: (P,) the model every node downloaded.
            train: the nodes' training data (node i of ``train`` is node ``node_ids[i]``).
            node_ids: (M,) global node ids, which key the random streams.
            round_index: the communication round r (steps rτ+1 .. (r+1)τ).
            seed: the run's seed.
        Returns:
            NodeOutput with the (M, P) local models and each node's events.
        """
        m_nodes, tau = len(node_ids), self.tau
        batch_idx, batch_w = self._draw_batches(train, node_ids, round_index, seed)
        noise = np.empty((m_nodes, tau, self.model.num_params))
        for i, node in enumerate(node_ids):
            stream(seed, node, round_index, Purpose.NOISE).standard_normal(out=noise[i])
        noise *= self.sigma
        params = np.repeat(global_params[None, :], m_nodes, axis=0)
        for step in range(tau):
            idx = batch_idx[:, step]
            _, grad = self.model.loss_and_grad(params, train.x[idx], train.y[idx], batch_w[:, step], self.clip_norm)
            grad += noise[:, step]
            params -= self.lr * grad  # eq. (7a): w = θ − η(g + b)
        events = [self.planned_events(node, round_index) for node in node_ids]
        return NodeOutput(node_ids=tuple(int(n) for n in node_ids), params=params, events=events)

    def _draw_batches(self, train: Split, node_ids: Sequence[int], round_index: int, seed: int):
        """Global row indices (M, τ, B) and weights (M, τ, B) of every node's τ mini-batches.

        Uniform: B distinct rows per step (the smallest B of τ×N_m uniform keys), weight 1/B.
        Poisson: each row with probability B/N_m, weight 1/B, padded to the step's largest batch
        with weight 0 (pads point at the node's first row and contribute nothing).
        """
        tau, batch = self.tau, self.batch
        if self.sampling != "poisson":
            idx = uniform_batches(train, node_ids, round_index, seed, tau, batch)
            return idx, np.full(idx.shape, 1.0 / batch)
        masks = [keys < batch / keys.shape[1] for keys in node_keys(train, node_ids, round_index, seed, tau)]
        width = max(1, max(int(mask.sum(axis=1).max()) for mask in masks))
        idx = np.zeros((len(node_ids), tau, width), dtype=np.int64)
        weights = np.zeros((len(node_ids), tau, width))
        for i, mask in enumerate(masks):
            for step in range(tau):
                rows = np.flatnonzero(mask[step])
                idx[i, step, : len(rows)] = rows
                weights[i, step, : len(rows)] = 1.0 / batch
        return idx + train.offsets[:-1, None, None], weights

    @staticmethod
    def combine(output: NodeOutput, state: np.ndarray | None = None) -> np.ndarray:
        """Eq. (7b): θ = (1/M) Σ_m w_m over the nodes that answered, equal weights whatever N_m
        (eq. 4). (M, P) → (P,)."""
        return output.params.mean(axis=0)


def from_config(config: "Config", model: Model, data: FederatedData) -> DpPasgd:
    """DP-PASGD as the ``[dp_pasgd]`` and ``[privacy]`` sections of ``config`` say."""
    a = config.dp_pasgd
    smallest = int(data.train.sizes.min())
    if a.batch > smallest:
        node = int(data.train.sizes.argmin())
        raise ConfigError("dp_pasgd.batch",
                          f"{a.batch} is larger than node {data.node_ids[node]}'s {smallest} training samples")
    return DpPasgd(
        model, steps=a.steps, tau=a.tau, batch=a.batch, lr=a.lr, delta=config.privacy.delta,
        train_sizes=dict(zip(data.node_ids, data.train.sizes.tolist())), sigma=a.sigma, epsilon=a.epsilon,
        calibration=a.calibration,
        lipschitz=a.lipschitz, clip_norm=a.lipschitz if a.clip else None, sampling=a.sampling,
        c1=a.c1, c2=a.c2,
    )
