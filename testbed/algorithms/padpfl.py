"""PADPFL (Talaei and Izadi, arXiv 2406.18491; extraction adaptive-dp.md): FedProx local training,
clipped and noised uploads (eq. 8), aggregation with personal impact factors p (eq. 11) and server
noise before the broadcast (eq. 13, Theorem 1). With p_i = 1/N it is NbAFL (Wei et al.).

One round r (0-based; the paper's aggregation t = r + 1):

1. every node starts from the broadcast x~ and runs ``local_steps`` mini-batch SGD steps on the
   FedProx objective l_i(x) + (μ/2)||x − x~||² (eqs. 4, 30, 31), all nodes at once (node axis);
2. clips its whole weight vector, x ← x / max(1, ||x||/B) (adaptive-dp.md §2.2, NbAFL's), and adds
   N(0, σ_C² I), σ_C of eq. (8), fresh each round from its own stream; uploads x~_i;
3. the server takes p^(r) (given, per part, or a schedule, eq. 51; or an automatic rule, see
   :class:`Padpfl`), redistributes the weight of
   clients that did not contribute (stragglers; with ``participation = "spread"``, clients not due)
   over the others in proportion, aggregates x = Σ p'_i x~_i (eq. 11), and adds N(0, σ_S² I) with
   σ_S of eq. (13) recomputed from p' (its zero branch included), drawn from
   ``server_stream(ctx, NOISE)``: ``stream(seed, GLOBAL, r, NOISE)`` so sim and an emulated MQTT
   run agree, keyed by the coordinator's secret when a node has one (the broadcast's public
   figure rests on it: :attr:`Padpfl.server_noise_observers`).

Ledger (per node and round): the upload, a :class:`GaussianEvent` of σ_C and sensitivity 2B (true of
any two weight vectors clipped to B; ``sensitivity = "paper_eq7"``: 2B/m_i, eq. 7, true only under
eq. 6's assumption, a reproduction's setting) seen by the server; and, issued by the server, the
broadcast, a Gaussian event of the noise that really reached it, sqrt(Σ p'_j² σ_C² + σ_S²), and
sensitivity p'_i·Δf_i, seen by the public. With ``local_step = "dp_sgd"`` the local steps are
DP-SGD's instead (per-sample clip C, noise every step, each step charged at 2C/X with sampling rate
X/m_i) and the upload and broadcast are their post-processing. Both are composed by the configured accountant; the
paper's own linear accounting (adaptive-dp.md §2.4) is reported by :meth:`Padpfl.describe`.

Example::

    >>> from testbed.learning.models import LogisticRegression
    >>> from testbed.data.synthetic import make_logistic
    >>> from testbed.algorithms.contract import RoundContext
    >>> data = make_logistic(num_nodes=4, samples_per_node=60, dim=5, seed=0)
    >>> alg = Padpfl(LogisticRegression(5, 2), schedule=ImpactSchedule([(0, np.full(4, 0.25))]), rounds=3,
    ...              local_steps=2, batch=8, lr=0.1, mu=0.1, clip=1.0, epsilon=20.0, delta=0.01,
    ...              min_samples=48, train_sizes=data.train.sizes, num_nodes=4)
    >>> state = alg.init_state(alg.model.init(None))
    >>> ctx = RoundContext.everyone(0, 1, 4)
    >>> out = alg.node_step(alg.downlink(state, ctx, ctx.expected), data.train, ctx.expected, ctx)
    >>> new = alg.server_step(state, out, ctx.closed(out.node_ids))
    >>> out.tensors["update"].shape, new.state["model"].shape, [e.observer for e in new.events][:2]
    ((4, 12), (12,), ['public', 'public'])
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Mapping, Sequence

import numpy as np

from testbed.algorithms import padpfl_cli
from testbed.algorithms.aggregate import Aggregation, bucket_stream
from testbed.algorithms.base import (BaseAlgorithm, RoundCost, SizeSetup, gaussian_release, released_events,
                                     standard_normals)
from testbed.algorithms.batches import check_batches, uniform_batches
from testbed.algorithms.bounds import gaussian_entry_bound, gaussian_norm_bound
from testbed.algorithms.contract import NodeResult, RoundContext, ServerResult, State, TensorSpec, server_stream
from testbed.algorithms.impact import ImpactSchedule, cap_shares, check_weights, redistribute, spread_uploads
from testbed.algorithms.padpfl_section import PadpflSection, assumptions, check, plan, schedule_from_section
from testbed.algorithms.registry import BuildContext, Registration, RobustChoice
from testbed.data.federated import Split
from testbed.errors import ConfigError
from testbed.learning.models import Model
from testbed.ledger.events import Event, GaussianEvent
from testbed.privacy import padpfl as dp
from testbed.privacy import canaries, zcdp
from testbed.streams.rng import Purpose
from testbed.util.parallel import split_work


class Padpfl(SizeSetup, BaseAlgorithm):
    """PADPFL with resolved impact factors and noise (on the base: the broadcast x~ as its global
    model; with ``data_size``, the sizes' setup phase).

    Args:
        model: the model (testbed.learning.models); its flat weight vector is what is clipped and noised.
        schedule: the impact factors of every round.
        rounds: T. uploads: R (None: T). participation: "every_round" or "spread".
        local_steps, batch, lr, mu: FedProx by local SGD (steps per round, batch, η, μ).
        clip: B (None: no clipping; only without ε). epsilon: the paper's ε (None: no noise).
        delta: δ. min_samples: min_i m_i of eqs. (8), (13).
        train_sizes: m_i of each node held here, by global id (the server's: every node's).
        num_nodes: N of the run. sensitivity: "clipped_weights" (2B) or "paper_eq7" (2B/m_i, eq. 7).
        impact: where p comes from each round: "equal", "given" or "link_quality" (``schedule``), or
            an automatic rule, "data_size", "reliability" or "quality_score" (``schedule`` unused).
        score_sigma, score_temperature: σ of the score's noise and τ of its softmax (quality_score).
        aggregation: the server's rule over the uploads with p'_i > 0 (default eq. 11's weighted
            mean; a robust rule changes what the broadcast is charged, see :meth:`_broadcast_events`).
        local_step: "sgd" (FedProx by SGD, eq. 8's noise on the upload) or "dp_sgd" (per-sample
            clipped, noised steps; the upload their post-processing). sample_clip: C of "dp_sgd".

    The automatic rules use only what the server may hold without a new leak, or pay for it:

    - ``data_size``: p_i = n_i / Σ n_j. Each node uploads n_i once in the setup phase (as FedAvg
      does); the server keeps the sizes in its state and never broadcasts them. A size is metadata:
      it tells the server how much data a node holds (and with the parts of Table I which part it
      is in), not what the data are; it is not charged to the ledger as a DP release (nothing
      noisy, one exact number). The noise does not depend on it either: σ_C of eq. (8) and σ_S of
      eq. (13) use min_i m_i whatever the sizes, so only p (and so σ_S through Σp², max p) moves.
    - ``reliability``: p_i ∝ (a_i + 1)/(d_i + 2), a_i the rounds the node answered out of the d_i
      it was due in so far (the server sees who answered: public to it by construction), smoothed
      (Laplace) so a node with no history gets 1/2 rather than 0. Updated in ``server_step`` after
      the round's aggregation, so p of round r uses rounds 0..r−1.
    - ``quality_score``: every node due reports s_i = clip(acc_i, 0, 1) + N(0, σ_q²), acc_i the
      accuracy of the broadcast x~ it received on its own m_i training rows, with noise from its
      own stream (seed, node, r, SCORE); the server sets p = softmax(s/τ) over the nodes that
      answered. The score is an uplink tensor ("score"), so the coordinator checks it, and a
      Gaussian release of σ_q seen by the server, charged to the node's ledger with sensitivity
      1/m_i: one row replaced changes an accuracy over m_i rows by at most 1/m_i (the clip range 1
      over the rows it is computed on). The score of round r sets the aggregation of round r.

    - ``link_quality``: p_i ∝ log2(1 + SNR_i) of the client's uplink at its mean channel gain
      (:func:`testbed.algorithms.impact.link_quality_weights`): what the server measures from pilots,
      computed once from the run's seed; it says where a client is, not what its data are.

    Whatever the rule, p of every round is checked (p >= 0, Σ = 1), a straggler's weight is
    redistributed, and σ_S of eq. (13) is recomputed from the p' used.

    Threat model of the automatic rules (a node may lie about anything it reports; an authenticated
    node is not a trusted one). After redistribution, no node's share exceeds ``max_weight_share``
    (:func:`~testbed.algorithms.impact.cap_shares`; at least 1/k with k nodes of weight), so whatever
    the lie, one node moves the aggregate by at most that share of its (norm-bounded) upload:

    - ``data_size``: a node could claim any size. A claim is taken only if finite, >= 1 and at most
      the node's rows in the run's partition (the server builds the same layout; the setup spec
      refuses one outside [1, the largest partition] already): a liar can only under-report and
      lose weight (:func:`~testbed.algorithms.impact.intake_sizes`).
    - ``reliability``: observed by the server (who answered), never reported: a node gains weight
      only by answering, which is what the rule rewards.
    - ``quality_score``: a node could report the top of the score's range every round. The spec
      refuses a score outside [−t, 1 + t] (t: the honest noise's tail bound), the server clips the
      scores to [0, 1] before the softmax (post-processing of the noisy release: no privacy cost),
      so a liar gains at most a factor exp((1 − s)/τ) over an honest score s, and the cap bounds it.
    - ``link_quality``: measured by the server (here from the run's seed); a real node could fake a
      stronger link by sending its pilots louder: the cap bounds that too.
    """

    #: Only the data_size rule has the setup phase (set per instance).
    has_setup = False
    #: A node's plan depends on whether it is due this round.
    uniform_plans = False

    def __init__(self, model: Model, *, schedule: ImpactSchedule, rounds: int, local_steps: int, batch: int,
                 lr: float, mu: float, clip: float | None, epsilon: float | None, delta: float, min_samples: int,
                 train_sizes: Mapping[int, int] | Sequence[int], num_nodes: int, uploads: int | None = None,
                 participation: str = "every_round", sensitivity: str = "clipped_weights", impact: str = "given",
                 score_sigma: float | None = None, score_temperature: float = 0.1,
                 aggregation: Aggregation = Aggregation(), max_weight_share: float | None = None,
                 local_step: str = "sgd", sample_clip: float | None = None):
        if epsilon is not None and clip is None:
            raise ValueError("a private PADPFL needs the clipping bound B")
        if local_step == "dp_sgd" and (epsilon is None or sample_clip is None):
            raise ValueError("PADPFL's DP-SGD local step needs epsilon and the per-sample clip C")
        self.model, self.schedule, self.rounds_planned = model, schedule, rounds
        # R < T with every client uploading every round is allowed here (the per-round mechanism of
        # Theorem 1, which the unit tests probe); a configured run refuses it (uploads_disagree).
        self.uploads = rounds if uploads is None else uploads
        self.participation, self.sensitivity = participation, sensitivity
        self.local_step, self.sample_clip = local_step, sample_clip
        self.local_steps, self.batch, self.lr, self.mu = local_steps, batch, lr, mu
        self.clip, self.epsilon, self.delta, self.min_samples = clip, epsilon, delta, min_samples
        self.train_sizes = dict(train_sizes) if isinstance(train_sizes, Mapping) else dict(enumerate(train_sizes))
        self.num_nodes = num_nodes
        if impact == "quality_score" and not score_sigma:
            raise ValueError("the quality_score rule needs the noise of the reported score (score_sigma > 0)")
        self.impact, self.score_sigma, self.score_temperature = impact, score_sigma, score_temperature
        self.aggregation = aggregation
        # The cap applies to the rules nodes can sway (None: the paper's uncapped factors).
        self.max_weight_share = max_weight_share if impact not in ("equal", "given") else None
        self.has_setup = impact == "data_size"  # the sizes, uploaded once
        # Eq. (8): one σ_C for every client, whatever its p_i or its own m_i, calibrated for the
        # sensitivity in force (2B/min m_i under eq. 7, 2B for clipped weights). DP-SGD's uploads
        # carry no noise of their own: σ of each step, calibrated over a client's R·local_steps steps.
        self.sigma_client = 0.0 if epsilon is None or self.dp_sgd else \
            dp.client_sigma(clip, self.uploads, self.sensitivity_records, epsilon, delta)
        self.step_sigma = 0.0 if not self.dp_sgd else \
            zcdp.dp_pasgd_sigma(self.uploads * local_steps, sample_clip, batch, epsilon, delta)

    @property
    def private(self) -> bool:
        return self.epsilon is not None

    @property
    def dp_sgd(self) -> bool:
        """Whether the local steps are DP-SGD's (per-sample clip, noise every step)."""
        return self.local_step == "dp_sgd"

    @property
    def sensitivity_records(self) -> int:
        """The m of Δf = 2B/m that eqs. (8) and (13) are calibrated for: min_i m_i under eq. (7)
        (``paper_eq7``), 1 for clipped weights (2B)."""
        return self.min_samples if self.sensitivity == "paper_eq7" else 1

    def upload_sensitivity(self, node: int) -> float:
        """Δf_i of one upload under replace-one adjacency. ``clipped_weights``: 2B, because the
        upload is clip_B(x_i), ||clip_B(x)|| <= B for any x (§2.2's clip, applied in
        :meth:`node_step`), so two uploads differing in one record differ by at most 2B whatever
        SGD did. ``paper_eq7``: 2B/m_i (eq. 7), true only if x_i were the mean of m_i per-sample
        minimisers each of norm <= B (eq. 6), which SGD's iterate is not."""
        return 2.0 * self.clip / (self.train_sizes[node] if self.sensitivity == "paper_eq7" else 1)

    @property
    def step_sensitivity(self) -> float:
        """Δ of one DP-SGD step's noised mean gradient under replace-one adjacency: 2C/X, because
        each of the X per-sample gradients of the batch is clipped to norm C (``clip_norm`` of
        ``loss_and_grad``) and the mean weighs each by 1/X, so replacing one record moves it by at
        most 2C/X (as DP-PASGD's 2G/X, dp-pasgd.md §2.2). FedProx's μ(x − x~) term depends on the
        record only through the earlier noised steps: post-processing."""
        return zcdp.dp_pasgd_sensitivity(self.sample_clip, self.batch)

    def regulariser_gradient(self, params: np.ndarray, start: np.ndarray) -> np.ndarray:
        """FedProx's μ(x − x~), the gradient of (μ/2)||x − x~||² (eq. 31: ∇h = ∇l_i + μ(x − x~));
        added at μ = 0 too, as the paper's step is written."""
        return self.mu * (params - start)

    def uploads_in(self, node_ids: Sequence[int], round_index: int) -> np.ndarray:
        """(M,) whether each node uploads its model this round (always, or R of T when spread)."""
        if self.participation == "spread":
            return spread_uploads(np.asarray(node_ids), self.num_nodes, round_index, self.rounds_planned, self.uploads)
        return np.ones(len(node_ids), dtype=bool)

    # ----------------------------------------------------------------------------- specs and events

    def state_spec(self) -> dict[str, TensorSpec]:
        """The model; the sizes (data_size) or the answer and due counts (reliability)."""
        spec = super().state_spec()
        if self.impact == "data_size":
            spec["sizes"] = TensorSpec((self.num_nodes,))
        if self.impact == "reliability":
            spec["answered"] = TensorSpec((self.num_nodes,))
            spec["due"] = TensorSpec((self.num_nodes,))
        return spec

    def uplink_spec(self) -> dict[str, TensorSpec]:
        """The noisy clipped model x~_i: norm <= B + the noise's norm tail bound, every entry within
        B + its entry tail bound (testbed.algorithms.bounds). Unclipped (no noise either), every node
        uploading every round: within ``local_steps`` η G of the model it received (each FedProx step
        moves it by η (∇l + μ (x − x~)), and with η μ <= 2 the proximal part never takes it farther
        from x~), G the model's gradient bound; else no bound. With quality_score, the noisy clipped
        score s_i in [−t, 1 + t], t the tail bound of σ_q."""
        p = self.model.num_params
        if self.clip is None:
            steps_bounded = self.lr * self.mu <= 2.0 and self.participation == "every_round"
            spec = {"update": self.sgd_update_spec() if steps_bounded else TensorSpec((p,))}
        else:
            largest = self.clip + gaussian_entry_bound(self.sigma_client, p)
            spec = {"update": TensorSpec((p,), max_norm=self.clip + gaussian_norm_bound(self.sigma_client, p),
                                         value_range=(-largest, largest))}
        if self.impact == "quality_score":
            t = gaussian_entry_bound(self.score_sigma, 1)
            spec["score"] = TensorSpec((1,), value_range=(-t, 1.0 + t))
        return spec

    def score_sensitivity(self, node: int) -> float:
        """Δ of the reported score under replace-one adjacency: 1/m_i, because the score is
        clip(acc, 0, 1) with acc the mean over the node's m_i rows of a 0/1 correctness, of a model
        (the received broadcast) that does not depend on the node's data of this round: replacing
        one row changes one term by at most 1, the mean by at most 1/m_i."""
        return 1.0 / self.train_sizes[node]

    # The setup phase (data_size only): every node uploads its training-set size once (FedAvg's).

    def server_setup(self, state: State, result: NodeResult, ctx: RoundContext) -> ServerResult:
        """n_i of every node that answered, kept in the state (never broadcast); all 1, equal
        factors, if no claim was accepted (:meth:`~SizeSetup.claimed_sizes`)."""
        return ServerResult({**state, "sizes": self.claimed_sizes(result)})

    def round_cost(self, node: int, ctx: RoundContext) -> RoundCost:
        """One round on ``node``: its local steps (none when not due), the download and the upload
        (zeros when not due)."""
        cost = super().round_cost(node, ctx)
        return cost if self.uploads_in([node], ctx.round_index)[0] else dataclasses.replace(cost, local_steps=0)

    def upload_release(self, node: int, round_index: int) -> GaussianEvent:
        """The Gaussian release of ``node``'s upload seen by the server: σ_C of eq. (8), Δf_i of
        :meth:`upload_sensitivity`; with DP-SGD local steps, its ``local_steps`` noised steps of
        σ and 2C/X on a uniform batch of X of the node's m_i rows (sampling without replacement,
        rate X/m_i; :func:`~testbed.algorithms.batches.uniform_batches`). The upload itself and
        the broadcast are post-processing of those steps."""
        if self.dp_sgd:
            return GaussianEvent(node, round_index, self.step_sigma, self.step_sensitivity, self.local_steps,
                                 adjacency="replace_one", sampling="without_replacement",
                                 sampling_rate=min(1.0, self.batch / self.train_sizes[node]), observer="server",
                                 clip_norm=self.sample_clip)
        return GaussianEvent(node, round_index, self.sigma_client, self.upload_sensitivity(node), 1,
                             observer="server", clip_norm=self.clip)

    def score_release(self, node: int, round_index: int) -> GaussianEvent:
        """The Gaussian release of ``node``'s quality score seen by the server: σ_q, Δ = 1/m_i."""
        return GaussianEvent(node, round_index, self.score_sigma, self.score_sensitivity(node), 1, observer="server")

    def releases(self, node: int, ctx: RoundContext) -> list[Event]:
        """A due node's upload release (eq. 8, when private) and its score's (quality_score)."""
        if not self.uploads_in([node], ctx.round_index)[0]:
            return []
        return ([self.upload_release(node, ctx.round_index)] if self.private else []) + \
            ([self.score_release(node, ctx.round_index)] if self.impact == "quality_score" else [])

    # ----------------------------------------------------------------------------- steps

    def init_state(self, params0: np.ndarray) -> State:
        """x~^(0): the common initial model (no data in it, no noise), (P,); equal sizes until the
        setup brings them (data_size); no history (reliability)."""
        state = super().init_state(params0)
        if self.impact == "data_size":
            state["sizes"] = np.ones(self.num_nodes)
        if self.impact == "reliability":
            state["answered"] = np.zeros(self.num_nodes)
            state["due"] = np.zeros(self.num_nodes)
        return state

    # eval_params is the base's: the noisy broadcast x~, what the clients receive (adaptive-dp.md §3 notes).

    def node_step(self, received: Mapping[str, np.ndarray], train: Split, node_ids: Sequence[int],
                  ctx: RoundContext) -> NodeResult:
        """FedProx, clipping and client noise on every node at once.

        Args:
            received: ``{"model": (M, P)}`` the broadcast x~ each node got.
            train: the nodes' training data (row block i is node ``node_ids[i]``).
            node_ids: (M,) global ids (key the batch and noise streams).
            ctx: the round.
        Returns:
            tensors ``update`` (M, P): x~_i = clip_B(x_i) + n_i (zeros for a node not due), and with
            quality_score ``score`` (M, 1): clip(accuracy of x~ on the node's rows, 0, 1) + N(0, σ_q²);
            metrics ``samples`` (M,) m_i; the planned events.
        """
        ids = tuple(int(n) for n in node_ids)
        r = ctx.round_index
        start = np.asarray(received["model"], dtype=np.float64)
        idx = uniform_batches(train, ids, r, ctx.seed, self.local_steps, self.batch, ctx.secrets)
        weights = np.full(idx.shape, 1.0 / self.batch)
        params = start.copy()

        due = self.uploads_in(ids, r)
        audited = self.dp_sgd and canaries.auditing()

        def local_steps(lo: int, hi: int) -> None:  # nodes lo..hi (each node's steps are its own)
            mine, theirs = params[lo:hi], start[lo:hi]
            noise = None
            if self.dp_sgd:  # every step's noise, σ of the steps' event (upload_release), from the node's NOISE stream
                noise = np.empty((hi - lo, self.local_steps, params.shape[1]))
                standard_normals(noise, ctx.seed, ids[lo:hi], r, Purpose.NOISE, ctx.secrets)
                noise *= self.step_sigma
                for i in np.flatnonzero(due[lo:hi]) if audited else ():  # a due node's canaries ride on its steps' noise
                    event = self.upload_release(ids[lo + i], r)
                    canaries.insert(noise[i:i + 1], ids[lo + i:lo + i + 1], r, reach=self.step_sensitivity,
                                    adjacency=event.adjacency, rates=[event.sampling_rate], observer=event.observer)
            # the mean of (clipped per-sample) gradients, noised under DP-SGD, plus FedProx's term
            self.local_sgd(mine, theirs, train, idx[lo:hi], weights[lo:hi], noise=noise,
                           clip_norm=self.sample_clip if self.dp_sgd else None)

        # A torch network runs its stack on torch's own threads: one Python thread feeds it.
        split_work(len(ids), local_steps, numbers=0 if self.model.name == "torch" else params.size * self.local_steps)
        if self.clip is not None:  # x / max(1, ||x||/B), the whole vector (§2.2)
            params /= np.maximum(1.0, np.linalg.norm(params, axis=1) / self.clip)[:, None]
        rows = np.flatnonzero(due)  # only a due node releases anything; the others upload zeros
        everyone = len(rows) == len(ids)
        due_ids = [ids[i] for i in rows]
        params[~due] = 0.0
        uploads: dict[int, Event] = {}
        if self.dp_sgd:  # the steps were noised; the clipped upload is their post-processing
            uploads = {n: self.upload_release(n, r) for n in due_ids}
        elif self.private:  # eq. (8)
            # An audit's canaries are sized 2B, what one record can move a clipped SGD-trained
            # model by, whatever the ledger's sensitivity setting claims (2B/m_i under eq. 7).
            mine, events = gaussian_release(params if everyone else params[rows], due_ids, ctx,
                                            lambda n: self.upload_release(n, r), reach=lambda _: 2.0 * self.clip)
            if not everyone:
                params[rows] = mine
            uploads = dict(zip(due_ids, events))
        tensors = {"update": params}
        scores: dict[int, Event] = {}
        if self.impact == "quality_score":
            tensors["score"] = np.zeros((len(ids), 1))
            tensors["score"][rows], events = self.scores(start[rows], train if everyone else train.select(list(rows)),
                                                         due_ids, ctx)
            scores = dict(zip(due_ids, events))
        return self.result(ids, tensors, train, ctx, events=released_events(self, ids, ctx, uploads, scores))

    def scores(self, received: np.ndarray, train: Split, ids: Sequence[int],
               ctx: RoundContext) -> tuple[np.ndarray, list[GaussianEvent]]:
        """(M, 1) each node's noisy clipped score: the accuracy of the model it received on its own
        training rows, clipped to [0, 1], plus σ_q times one normal from (seed, node, r, SCORE);
        and the score's release events."""
        out = np.empty((len(ids), 1))
        for i in range(len(ids)):
            x, y = train.node_slice(i)
            _, correct = self.model.loss_and_correct(received[i], x, y)
            out[i, 0] = min(max(float(correct.mean()), 0.0), 1.0)
        return gaussian_release(out, ids, ctx, lambda n: self.score_release(n, ctx.round_index), purpose=Purpose.SCORE)

    def impact_factors(self, ctx: RoundContext, state: State | None = None,
                       result: NodeResult | None = None) -> np.ndarray:
        """(N,) p^(r) before redistribution: the schedule's, or the automatic rule's from the state
        (sizes, answer counts) or the round's reported scores; checked (p >= 0, Σ = 1)."""
        if self.impact in ("equal", "given", "link_quality"):
            return self.schedule.at(ctx.round_index)
        if state is None:
            raise ValueError(f"the {self.impact} rule needs the server's state")
        if self.impact == "data_size":
            p = state["sizes"] / state["sizes"].sum()
        elif self.impact == "reliability":
            share = (state["answered"] + 1.0) / (state["due"] + 2.0)
            p = share / share.sum()
        else:  # quality_score: softmax over the nodes that reported (the others redistributed anyway)
            s = np.zeros(self.num_nodes)
            if result is not None and result.node_ids:
                # Clipped to the accuracy's range (post-processing): a lie at the top of the
                # spec's range gains no more than an honest perfect score.
                s[list(result.node_ids)] = np.clip(result.tensors["score"][:, 0], 0.0, 1.0)
            z = np.exp((s - s.max()) / self.score_temperature)
            p = z / z.sum()
        problem = check_weights(p, self.num_nodes)
        if problem is not None:
            raise ValueError(f"round {ctx.round_index}: {problem}")
        return p

    def round_weights(self, ctx: RoundContext, state: State | None = None, result: NodeResult | None = None) -> np.ndarray:
        """(N,) p' of round ``ctx.round_index``: p^(r) (:meth:`impact_factors`), redistributed over
        the nodes that answered and were due (all zeros if none of them has weight), then capped at
        ``max_weight_share`` per node for the automatic rules (:func:`cap_shares`)."""
        contributing = np.zeros(self.num_nodes, dtype=bool)
        answered = np.asarray(ctx.answered, dtype=np.int64)
        contributing[answered] = self.uploads_in(answered, ctx.round_index)
        return cap_shares(redistribute(self.impact_factors(ctx, state, result), contributing), self.max_weight_share)

    def _history(self, state: State, ctx: RoundContext) -> State:
        """The state's non-model part after the round: reliability adds who was due and answered."""
        kept = {k: v for k, v in state.items() if k != "model"}
        if self.impact == "reliability":
            due = self.uploads_in(np.arange(self.num_nodes), ctx.round_index)
            heard = np.zeros(self.num_nodes, dtype=bool)
            heard[list(ctx.answered)] = True
            kept = {"answered": state["answered"] + (due & heard), "due": state["due"] + due}
        return kept

    def server_sigma(self, weights: np.ndarray) -> float:
        """σ_S of eq. (13) for the round's p' (0 when not private, with DP-SGD local steps, or on
        the zero branch), calibrated for the upload sensitivity in force (:attr:`sensitivity_records`)."""
        if not self.private or self.dp_sgd:
            return 0.0
        return dp.server_sigma(weights, self.clip, self.rounds_planned, self.uploads, self.sensitivity_records,
                               self.epsilon, self.delta)

    def server_step(self, state: State, result: NodeResult, ctx: RoundContext) -> ServerResult:
        """Eq. (11) with p' (or the configured robust rule over the uploads with p'_i > 0, norm_clip
        measuring each from the broadcast x~) then the server noise of eq. (13); the broadcast
        charged to every contributing node with p'_i > 0 as a public Gaussian release. Nobody with
        weight contributed: x~ stays and nothing is released."""
        p = self.round_weights(ctx, state, result)
        history = self._history(state, ctx)
        if not p.any():
            return ServerResult({"model": state["model"], **history})
        rows = [result.node_ids.index(n) for n in np.flatnonzero(p)]
        heard = np.flatnonzero(p)
        model = self.aggregation.combine(result.tensors["update"][rows], p[heard], state["model"],
                                         bucket_stream(ctx.seed, ctx.round_index))  # eq. (11): Σ p'_i x~_i
        if self.private:
            model += self.server_sigma(p) * server_stream(ctx, Purpose.NOISE).standard_normal(model.shape[0])
        return ServerResult({"model": model, **history}, self._broadcast_events(p, ctx.round_index))

    @property
    def server_noise_observers(self) -> frozenset[str]:
        """The observers whose figure rests on the server's noise σ_S: the public's, of eq. (11)'s
        mean broadcast (a robust rule's is charged the uploads' own noise alone; DP-SGD's none)."""
        if not self.private or self.dp_sgd or not self.aggregation.is_mean:
            return frozenset()
        return frozenset({"public"})

    def _broadcast_events(self, p: np.ndarray, round_index: int) -> list[Event]:
        """The broadcast's public Gaussian release, charged to each node with p'_i > 0: of the
        noise that reached it, sqrt(Σ p'_j² σ_C² + σ_S²), and sensitivity p'_i Δf_i under eq. (11)'s
        mean. A robust rule is not that linear sum (Krum may broadcast one node's upload whole), so
        the public is charged what post-processing guarantees: the upload's own σ_C and Δf_i.
        With DP-SGD local steps the broadcast is post-processing of the uploads, whose steps the
        server's observer is charged already: nothing more."""
        if not self.private or self.dp_sgd or not p.any():
            return []
        if not self.aggregation.is_mean:
            return [GaussianEvent(int(n), round_index, self.sigma_client, self.upload_sensitivity(int(n)), 1,
                                  observer="public", issuer="server", clip_norm=self.clip) for n in np.flatnonzero(p)]
        sigma_b = dp.broadcast_sigma(p, self.sigma_client, self.server_sigma(p))
        return [GaussianEvent(int(n), round_index, sigma_b, float(p[n]) * self.upload_sensitivity(int(n)), 1,
                              observer="public", issuer="server", clip_norm=self.clip) for n in np.flatnonzero(p)]

    def planned_server_events(self, state: State, ctx: RoundContext) -> list[Event] | None:
        """What :meth:`server_step` issues in round ``ctx`` if every expected node answers, for rules
        whose factors are known ahead (equal, given, link_quality, data_size); None for those that
        depend on what the rounds bring (reliability, quality_score)."""
        if self.impact in ("reliability", "quality_score"):
            return None
        contributing = np.zeros(self.num_nodes, dtype=bool)
        expected = np.asarray(ctx.expected, dtype=np.int64)
        contributing[expected] = self.uploads_in(expected, ctx.round_index)
        return self._broadcast_events(cap_shares(redistribute(self.impact_factors(ctx, state), contributing),
                                                 self.max_weight_share), ctx.round_index)

    # ----------------------------------------------------------------------------- report

    def describe(self) -> dict[str, Any]:
        """Settings and the paper's numbers with every client taking part: σ_C (eq. 8), σ_S (eq. 13)
        and σ_A per phase of the schedule, c, the condition T > R sqrt(Σp²)/max p, and the paper's
        linear accounting (ε of the uplink over R uploads, of the downlink over T broadcasts, at the
        noise of eq. 13) beside the ε the ledger's accountants give (the summary's nodes)."""
        out: dict[str, Any] = {
            "rounds": self.rounds_planned, "uploads": self.uploads, "participation": self.participation,
            "local_steps": self.local_steps, "batch": self.batch, "lr": self.lr, "mu": self.mu, "clip": self.clip,
            "private": self.private, "min_samples": self.min_samples, "local_step": self.local_step,
            "sensitivity": self.sensitivity, "impact": self.impact,
        }
        if self.impact not in ("equal", "given"):
            # p is set each round by the rule: no phases to report; σ_S is recomputed from each round's p'.
            out["max_weight_share"] = self.max_weight_share
            if self.impact == "quality_score":
                out.update({"score_sigma": self.score_sigma, "score_temperature": self.score_temperature})
            if self.private and self.dp_sgd:
                out.update(self._dp_sgd_settings())
            elif self.private:
                out.update({"epsilon": self.epsilon, "delta": self.delta, "c": dp.gaussian_c(self.delta),
                            "sigma_client": self.sigma_client,
                            "epsilon_paper_uplink": dp.paper_epsilon_uplink(self.sigma_client, self.clip,
                                                                            self.sensitivity_records, self.uploads,
                                                                            self.delta),
                            "gaussian_condition": dp.gaussian_condition_holds(self.epsilon)})
            return out
        out |= {
            "impact_phases": [{"from_round": int(s), "max_p": float(p.max()), "sum_p2": float(p @ p),
                               "distinct_p": sorted({round(float(v), 15) for v in p})}
                              for s, p in zip(self.schedule.starts, self.schedule.weights)],
        }
        if not self.private:
            return out
        if self.dp_sgd:
            return out | self._dp_sgd_settings()
        phases = []
        for p in self.schedule.weights:
            sigma_s = self.server_sigma(p)
            total = dp.broadcast_sigma(p, self.sigma_client, sigma_s)
            phases.append({"sigma_server": sigma_s, "sigma_total": total,
                           "sigma_target": dp.target_sigma(p, self.clip, self.rounds_planned,
                                                           self.sensitivity_records, self.epsilon, self.delta),
                           "condition": dp.server_noise_needed(p, self.rounds_planned, self.uploads),
                           "epsilon_paper_downlink": dp.paper_epsilon_downlink(
                               float(p.max()), total, self.clip, self.sensitivity_records, self.rounds_planned,
                               self.delta)})
        out.update({
            "epsilon": self.epsilon, "delta": self.delta, "c": dp.gaussian_c(self.delta),
            "sigma_client": self.sigma_client, "phases": phases,
            "epsilon_paper_uplink": dp.paper_epsilon_uplink(self.sigma_client, self.clip, self.sensitivity_records,
                                                            self.uploads, self.delta),
            "epsilon_paper_downlink": max(ph["epsilon_paper_downlink"] for ph in phases),
            "gaussian_condition": dp.gaussian_condition_holds(self.epsilon),
        })
        return out

    def _dp_sgd_settings(self) -> dict[str, Any]:
        """The DP-SGD local step's privacy settings: σ of every step (calibrated by zCDP over a
        client's R·local_steps steps, as DP-PASGD's eq. 9), its sensitivity 2C/X, and the steps charged."""
        return {"epsilon": self.epsilon, "delta": self.delta, "sample_clip": self.sample_clip,
                "step_sigma": self.step_sigma, "step_sensitivity": self.step_sensitivity,
                "steps_charged": self.uploads * self.local_steps,
                "epsilon_zcdp": zcdp.dp_pasgd_epsilon(self.uploads * self.local_steps, self.sample_clip, self.batch,
                                                      self.step_sigma, self.delta)}


def build(sections: dict[str, Any], ctx: BuildContext) -> Padpfl:
    """PADPFL as its ``[padpfl]`` section says, for the data this process holds."""
    a: PadpflSection = sections["padpfl"]
    data = ctx.data
    check_batches("padpfl", data.train, data.node_ids, a.local_steps, a.batch, "local_steps")
    min_samples = a.min_samples
    if min_samples is None:
        if data.num_nodes != ctx.num_nodes:
            raise ConfigError("padpfl.min_samples", "a node holding only its own data needs min_i m_i in the config")
        min_samples = int(data.train.sizes.min())
    if a.local_step == "sgd" and a.epsilon is not None and not dp.gaussian_condition_holds(a.epsilon):
        warnings.warn(f"padpfl.epsilon = {a.epsilon:g}: the Gaussian mechanism the paper calibrates by (eqs. 8, 13) "
                      "is proven for epsilon < 1 only; the ledger's accountants give the epsilon really spent",
                      stacklevel=2)
    return Padpfl(ctx.model, schedule=schedule_from_section(a, ctx.num_nodes, ctx.seed), rounds=a.rounds,
                  local_steps=a.local_steps, batch=a.batch, lr=a.lr, mu=a.mu, clip=a.clip, epsilon=a.epsilon,
                  delta=ctx.delta, min_samples=min_samples,
                  train_sizes=dict(zip(data.node_ids, data.train.sizes.tolist())), num_nodes=ctx.num_nodes,
                  uploads=a.uploads, participation=a.participation, sensitivity=a.sensitivity, impact=a.impact,
                  score_sigma=a.score_sigma, score_temperature=a.score_temperature, local_step=a.local_step,
                  sample_clip=a.sample_clip,
                  aggregation=a.aggregation_rule(ctx.num_nodes, "padpfl"), max_weight_share=a.max_weight_share)


REGISTRATION = Registration(
    name="padpfl",
    sections={"padpfl": PadpflSection},
    build=build,
    check=check,
    plan=plan,
    epsilon_target=lambda sections: sections["padpfl"].epsilon,
    # Its noise is calibrated by the paper's eqs. (8), (13), not to the accountant's ε: no calibrate hook.
    guarantee=lambda sections: "dp" if sections["padpfl"].epsilon is not None else "none",
    privacy_cli=padpfl_cli.PRIVACY,
    privacy_statements=(padpfl_cli.STATEMENT,),
    assumptions=assumptions,
    robust_choice=RobustChoice("trimmed_mean", "O(MP log M); unweighted, so the impact factors and a lying score "
                                               "no longer steer the model"),
)
