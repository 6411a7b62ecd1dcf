"""A base for algorithms: the defaults most of them share, so an algorithm module is its math plus
its registration (the way Flower's FedProx is FedAvg plus a few lines).

:class:`BaseAlgorithm` gives what an algorithm with one global model θ, (P,), broadcast to every
node, and a node step of mini-batch steps has by default: its rounds, its flops, its state,
downlink and metric specs, its initial state and evaluated model, the broadcast, and its planned
events from a rule (:class:`RoundCost`, what a round costs a node, plus the node's releases). A
subclass sets ``model``, ``rounds_planned``, ``local_steps``, ``batch`` and ``lr`` and overrides
only what differs; :class:`SizeSetup` adds the one-time upload of each node's training-set size.

:func:`gaussian_release` adds a node's Gaussian noise to a tensor it releases and returns the noised
tensor and the ledger event of the noise together, the noise drawn at the event's σ, so noise is
never added without its event (PADPFL's upload and score; DP-PASGD's per-step noise is fused into
its block of steps and charged from the same event as its plan, DWFL's is the channel's).

Example::

    >>> from testbed.learning.models import LogisticRegression
    >>> class Plain(BaseAlgorithm):
    ...     model, rounds_planned, local_steps, batch, lr = LogisticRegression(3, 2), 3, 2, 4, 0.1
    >>> alg = Plain()
    >>> alg.rounds, alg.flops_per_step, [e.kind for e in alg.planned_events(0, RoundContext.everyone(0, 1, 2))]
    (3, 192.0, ['compute', 'communication'])
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

import numpy as np

from testbed.algorithms.contract import (
    SAMPLES_METRIC,
    SETUP_ROUND,
    MetricSpec,
    NodeResult,
    RoundContext,
    State,
    TensorSpec,
    gathered_plans,
)
from testbed.algorithms.impact import intake_sizes
from testbed.ledger.events import CommunicationEvent, ComputeEvent, Event, GaussianEvent, NodeEvents
from testbed.privacy import canaries
from testbed.streams.rng import Purpose, node_streams
from testbed.util.parallel import split_work

if TYPE_CHECKING:
    from testbed.data.federated import Split
    from testbed.learning.models import Model
    from testbed.streams.node_secret import Secrets

#: Bytes of one real number on the wire (float64 payloads).
BYTES_PER_REAL = 8


@dataclass(frozen=True)
class RoundCost:
    """What one round costs a node besides its privacy releases: the rule its planned compute and
    communication events come from.

    Attributes:
        local_steps: local steps of the node step (0: the node does not train this round).
        bytes_up, bytes_down: tensor payload bytes of its upload and download.
        step_cost_units: abstract cost of one step (DP-PASGD eq. 8's c2).
        round_cost_units: abstract cost of the round's communication (eq. 8's c1).
        airtime_s, energy_j: the exchange's radio time and energy, when the algorithm models them.
    """

    local_steps: int
    bytes_up: int
    bytes_down: int
    step_cost_units: float = 0.0
    round_cost_units: float = 0.0
    airtime_s: float = 0.0
    energy_j: float = 0.0

    def events(self, node: int, round_index: int) -> list[Event]:
        """The compute event and the communication event of ``node`` in round ``round_index``."""
        return [ComputeEvent(node, round_index, self.local_steps, self.step_cost_units * self.local_steps),
                CommunicationEvent(node, round_index, bytes_up=self.bytes_up, bytes_down=self.bytes_down,
                                   cost_units=self.round_cost_units, airtime_s=self.airtime_s,
                                   energy_j=self.energy_j)]


class BaseAlgorithm:
    """Defaults of an algorithm on the contract (testbed.algorithms.contract.Algorithm).

    A subclass sets ``model``, ``rounds_planned``, ``local_steps`` (steps per round), ``batch`` and
    ``lr``, and writes its math: ``node_step`` (ending in :meth:`result`), ``server_step`` and
    ``describe``. The defaults assume one global model in the state under :attr:`global_name`,
    broadcast to every node, an upload ``update`` of local SGD, one model's size each way and no
    releases; override :meth:`uplink_spec`, :meth:`round_cost` and :meth:`releases` to say otherwise.

    :attr:`uniform_plans`: every node's plan is the same but for its node field (planned once and
    charged as columns); False when they differ (a per-node airtime, a node not due): gathered.
    """

    has_setup = False
    uniform_plans = True
    #: The name of the global model in the state and the downlink.
    global_name = "model"

    model: "Model"
    rounds_planned: int
    local_steps: int
    batch: int
    lr: float

    @property
    def rounds(self) -> int:
        return self.rounds_planned

    @property
    def flops_per_step(self) -> float:
        """~6 × batch × parameters: one gradient step's forward and backward pass."""
        return 6.0 * self.batch * self.model.num_params

    def state_spec(self) -> dict[str, TensorSpec]:
        return {self.global_name: TensorSpec((self.model.num_params,))}

    def downlink_spec(self) -> dict[str, TensorSpec]:
        """Every node gets the global model."""
        return {self.global_name: TensorSpec(self.state_spec()[self.global_name].shape, per_node=False)}

    def sgd_update_spec(self) -> TensorSpec:
        """The local model after ``local_steps`` SGD steps at ``lr`` from the global one: each step
        moves it by η times a mean of per-sample gradients, so by at most η G (G the model's
        gradient bound on unit-ball data), all of them by at most ``local_steps`` η G (no bound for
        a model without one)."""
        g = self.model.lipschitz_bound
        if not math.isfinite(g):
            return TensorSpec((self.model.num_params,))
        return TensorSpec((self.model.num_params,), max_norm=self.local_steps * self.lr * g,
                          relative_to=self.global_name)

    def uplink_spec(self) -> dict[str, TensorSpec]:
        """Each node's local model after its SGD steps (:meth:`sgd_update_spec`)."""
        return {"update": self.sgd_update_spec()}

    def metric_spec(self) -> dict[str, MetricSpec]:
        """Each node reports its training samples."""
        return {"samples": SAMPLES_METRIC}

    def init_state(self, params0: np.ndarray) -> State:
        """The global model θ⁰, (P,)."""
        return {self.global_name: np.asarray(params0, dtype=np.float64)}

    def eval_params(self, state: State) -> np.ndarray:
        return state[self.global_name]

    def downlink(self, state: State, ctx: RoundContext, node_ids: Sequence[int]) -> dict[str, np.ndarray]:
        """The global model for every node of ``node_ids``: (M, ...), a read-only broadcast view (no copies)."""
        model = state[self.global_name]
        return {self.global_name: np.broadcast_to(model, (len(node_ids),) + model.shape)}

    # ----------------------------------------------------------------------------- the local step

    def local_gradient(self, params: np.ndarray, x: np.ndarray, y: np.ndarray, weights: np.ndarray,
                       clip_norm: float | None = None) -> np.ndarray:
        """(M, P) ∇F_k of each node's local loss on its batch: Σ_n w_n ∇l_n, every per-sample
        gradient clipped at ``clip_norm`` first when given (the model's ``loss_and_grad``).

        Args:
            params: (M, P) the nodes' models. x: (M, B, d). y: (M, B). weights: (M, B).
        """
        gradient = getattr(self.model, "gradient", None)  # a model that can skip the loss: the same gradient
        if gradient is not None:
            return gradient(params, x, y, weights, clip_norm)
        return self.model.loss_and_grad(params, x, y, weights, clip_norm)[1]

    def regulariser_gradient(self, params: np.ndarray, start: np.ndarray) -> np.ndarray | None:
        """(M, P) ∇R(w; w_t) of a term R the local objective adds to F_k (FedProx's proximal term,
        testbed.algorithms.fedprox), at the models ``params`` given the ones the round started from,
        ``start``; None: no such term (the default), so nothing is added to the gradient."""
        return None

    def local_sgd(self, params: np.ndarray, start: np.ndarray, train: "Split", idx: np.ndarray, weights: np.ndarray,
                  *, noise: np.ndarray | None = None, clip_norm: float | None = None) -> np.ndarray:
        """``idx.shape[1]`` steps of w ← w − η (∇F_k(w) + b_s + ∇R(w; w_t)) on a block of nodes, in place.

        The one local loop of the algorithms on this base: the data gradient from
        :meth:`local_gradient`, then the step's noise b_s if any (DP-PASGD's eq. 7a, DP-SGD), then
        :meth:`regulariser_gradient`; summed in that order, so every algorithm's numbers are
        the ones its own loop gave.

        Args:
            params: (M, P) the block's models, updated in place (the dtype the steps run in).
            start: (M, P) w_t, the models the round started from (for the regulariser).
            train: the nodes' training data; ``idx`` (M, τ, B) global rows of each step's batch,
                ``weights`` (M, τ, B) their weights.
            noise: (M, τ, P) each step's noise, already scaled (None: none).
            clip_norm: the per-sample clip of :meth:`local_gradient`.
        Returns:
            ``params``.
        """
        def steps(lo: int, hi: int) -> None:  # nodes lo..hi: each node's steps are its own
            mine, theirs = params[lo:hi], start[lo:hi]  # views: updated in place
            for step in range(idx.shape[1]):
                rows = idx[lo:hi, step]
                grad = self.local_gradient(mine, train.x[rows], train.y[rows], weights[lo:hi, step], clip_norm)
                if noise is not None:
                    grad += noise[lo:hi, step]
                regulariser = self.regulariser_gradient(mine, theirs)
                if regulariser is not None:
                    grad += regulariser
                mine -= self.lr * grad

        # Parts of the nodes on the cores (testbed.util.parallel; whole when the caller split them
        # already). A torch network runs its stack on torch's own threads: one Python thread feeds it.
        split_work(len(params), steps, numbers=0 if self.model.name == "torch" else idx.size * train.x.shape[1])
        return params

    # ----------------------------------------------------------------------------- planned events

    def round_cost(self, node: int, ctx: RoundContext) -> RoundCost:
        """What round ``ctx`` costs ``node``: ``local_steps`` steps, the model up and down."""
        size = self.model.num_params * BYTES_PER_REAL
        return RoundCost(self.local_steps, bytes_up=size, bytes_down=size)

    def releases(self, node: int, ctx: RoundContext) -> list[Event]:
        """The privacy events of ``node``'s node step in round ``ctx`` (none by default)."""
        return []

    def planned_events(self, node: int, ctx: RoundContext) -> list[Event]:
        """The events round ``ctx`` causes on ``node`` if it takes part: its :meth:`round_cost`'s,
        then its :meth:`releases`. Budgets check them before the round; whoever runs the step
        charges its seconds and joules (nodes.costs)."""
        return self.round_cost(node, ctx).events(node, ctx.round_index) + self.releases(node, ctx)

    def planned_batch(self, node_ids: Sequence[int], ctx: RoundContext) -> NodeEvents | list[list[Event]]:
        """:meth:`planned_events` of every node at once: planned once for all (:attr:`uniform_plans`)
        or gathered node by node."""
        if not self.uniform_plans:
            return gathered_plans(self, node_ids, ctx)
        ids = np.asarray(node_ids, dtype=np.int64)
        if not len(ids):
            return NodeEvents([], ids)
        return NodeEvents.uniform(self.planned_events(int(ids[0]), ctx), ids)

    def result(self, ids: tuple[int, ...], tensors: dict[str, np.ndarray], train: "Split", ctx: RoundContext, *,
               events: NodeEvents | list[list[Event]] | None = None,
               carry: dict[str, np.ndarray] | None = None) -> NodeResult:
        """A node step's result: ``tensors``, each node's training samples as the ``samples``
        metric, and the planned events (or ``events``, what the step made)."""
        return NodeResult(ids, tensors, {"samples": np.diff(train.offsets).astype(np.float64)},
                          self.planned_batch(ids, ctx) if events is None else events, carry or {})


class SizeSetup:
    """The one-time setup phase in which every node uploads its training-set size n_k (FedAvg's):
    the server takes a claim only if it is >= 1 and at most the node's rows in the run's partition
    (the setup spec refuses one outside [1, the largest partition];
    :func:`~testbed.algorithms.impact.intake_sizes`). A size is metadata, not a DP release: the
    ledger charges its bytes only.

    A subclass sets ``num_nodes`` and ``train_sizes`` (node id → rows, or None: unknown), and
    writes ``server_setup`` from :meth:`claimed_sizes`.
    """

    has_setup = True
    num_nodes: int
    train_sizes: dict[int, int] | None

    def setup_spec(self) -> dict[str, TensorSpec]:
        """Each node's training-set size, once: >= 1, at most the largest node's rows of the partition."""
        largest = float(max(self.train_sizes.values())) if self.train_sizes else float(np.finfo(np.float64).max)
        return {"samples": TensorSpec((1,), value_range=(1.0, largest))}

    def setup_events(self, node: int) -> list[Event]:
        return [CommunicationEvent(node, SETUP_ROUND, bytes_up=BYTES_PER_REAL, bytes_down=0)]

    def setup_step(self, train: "Split", node_ids: Sequence[int], ctx: RoundContext) -> NodeResult:
        ids = tuple(int(n) for n in node_ids)
        sizes = np.diff(train.offsets).astype(np.float64)
        return NodeResult(ids, {"samples": sizes[:, None]}, events=[self.setup_events(n) for n in ids])

    def claimed_sizes(self, result: NodeResult) -> np.ndarray:
        """(N,) n_k of every node that answered, each checked against its partition when the server
        knows every node's; a silent node, or one whose claim is refused, gets the mean of the
        accepted sizes (:func:`intake_sizes`)."""
        claimed = result.tensors["samples"] if result.node_ids else np.zeros(0)
        known = self.train_sizes is not None and len(self.train_sizes) == self.num_nodes  # the server's
        return intake_sizes(result.node_ids, claimed, self.num_nodes, self.train_sizes if known else None)


def gaussian_release(values: np.ndarray, node_ids: Sequence[int], ctx: RoundContext,
                     mechanism: Callable[[int], GaussianEvent], *,
                     purpose: Purpose = Purpose.NOISE,
                     reach: Callable[[GaussianEvent], float] | None = None) -> tuple[np.ndarray, list[GaussianEvent]]:
    """Release ``values`` (M, ...), real, one row per node, through each node's Gaussian mechanism: row i
    gains σ_i Z_i in place, Z_i standard normals from ``stream(seed, node_ids[i], r, purpose)``
    (keyed by the node's secret when ``ctx.secrets`` holds one) and σ_i the σ of the node's event ``mechanism(node)``. Returns the noised rows and the events,
    one per node: the noise and its ledger event come together, so neither goes without the other.

    Under an audit (testbed.privacy.canaries) each row's σ_i Z_i first gains the node's canaries,
    sized by ``reach(event)``: how far one record can move the row, as the mechanism bounds it
    (default: the event's sensitivity; an algorithm whose claimed sensitivity rests on an
    assumption passes the bound that holds without it).

    Raises:
        ValueError: an event of another node or round, of more than one composition, or issued by
            the server (a node's release is its own).
    """
    ids = [int(n) for n in node_ids]
    events = [mechanism(n) for n in ids]
    for node, event in zip(ids, events):
        if (event.node, event.round, event.count, event.issuer) != (node, ctx.round_index, 1, "node"):
            raise ValueError(f"node {node}'s release in round {ctx.round_index} charged as {event}")
    if not ids:
        return values, events
    sigma = np.array([e.sigma for e in events], dtype=values.dtype).reshape((len(ids),) + (1,) * (values.ndim - 1))
    noise = np.empty(values.shape, dtype=values.dtype)

    audited = canaries.auditing()
    reaches = [reach(e) if reach is not None else e.sensitivity for e in events] if audited else []

    def draw(lo: int, hi: int) -> None:  # nodes lo..hi, each from its own stream
        standard_normals(noise[lo:hi], ctx.seed, ids[lo:hi], ctx.round_index, purpose, ctx.secrets)
        if not audited:
            values[lo:hi] += sigma[lo:hi] * noise[lo:hi]
            return
        noise[lo:hi] *= sigma[lo:hi]
        canaries.insert(noise[lo:hi].reshape(hi - lo, 1, -1), ids[lo:hi], ctx.round_index, reach=reaches[lo:hi],
                        adjacency=events[0].adjacency, rates=[e.sampling_rate for e in events[lo:hi]],
                        observer=events[0].observer)
        values[lo:hi] += noise[lo:hi]

    split_work(len(ids), draw, numbers=noise.size)
    return values, events


def standard_normals(out: np.ndarray, seed: int, node_ids: Sequence[int], round_index: int,
                     purpose: Purpose = Purpose.NOISE, secrets: "Secrets | None" = None) -> None:
    """Fill row i of ``out`` (C-contiguous, real; (M, ...)) with standard normals from
    ``stream(seed, node_ids[i], round_index, purpose)`` (the node's secret's stream when
    ``secrets`` holds one: RoundContext.secrets), in row-major order. A float32 ``out`` gets
    the float64 stream's draws, rounded, so every dtype releases the same normals."""
    if not len(node_ids):
        return
    rows = out.reshape(len(node_ids), -1)  # a view: one flat row per node, a scalar's too
    for i, rng in enumerate(node_streams(seed, node_ids, round_index, purpose, secrets)):
        if rows.dtype == np.float64:
            rng.standard_normal(out=rows[i])
        else:
            rows[i] = rng.standard_normal(rows.shape[1])


def released_events(algorithm: BaseAlgorithm, ids: Sequence[int], ctx: RoundContext,
                    *released: Mapping[int, Event]) -> NodeEvents | list[list[Event]]:
    """A node step's events from what it really released: each node's :meth:`~BaseAlgorithm.round_cost`
    events, then its events of ``released`` (node → event, in order; a node absent from one did not
    make that release), as columns where the nodes' lists are alike."""
    lists = [algorithm.round_cost(n, ctx).events(n, ctx.round_index) + [r[n] for r in released if n in r]
             for n in ids]
    return NodeEvents.from_lists(lists, ids) or lists
