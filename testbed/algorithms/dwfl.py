"""DWFL (Chen et al., arXiv 2109.09142): decentralised wireless FL with over-the-air DP, and baselines.

One round (Algorithm 1, eq. 7; dwfl.md §3.4), split so that the channel can run elsewhere:

(a) node side, :meth:`Dwfl.node_step`: clipped stochastic gradient g_i (||g_i|| <= g_max), local step
    x_i' = x_i − γ g_i, artificial noise G_i ~ N(0, σ² I) from the node's own stream, transmit signal
    s_i = sqrt(α_i P_i) x_i' + sqrt(β_i P_i) G_i (eq. 2, after phase pre-compensation);
    ``NodeResult.tensors["signal"]`` are the signals (M, P); what the node keeps for (c) is its
    ``carry`` (on a board: in the node's own process), never sent;
(b) channel side, :func:`testbed.algorithms.dwfl_channel.propagate`: signals → each receiver's signal;
(c) node side, :meth:`Dwfl.receive`: x_i'' = x_i' + η (v_i / (c(N−1)) − self_i), where
    ``variant="A"`` (the literal eq. 7) takes self_i = x_i' + a_i G_i + m_i/(c(N−1)), subtracting the
    receiver's own channel noise (an oracle: it is redrawn from the channel's stream), and
    ``variant="B"`` (physically realisable) self_i = x_i' + a_i G_i, with a_i = |h_i| sqrt(β_i P_i)/c.
    Everything but v_i is known before the node listens, so the node step already forms
    pending_i = x_i' − η self_i (B) and the update is pending_i + η/(c(N−1)) (v_i − [A: m_i]).

On a graph (``topology``, ``[topology]`` other than complete; issue 32) receiver i hears only its
neighbours N(i): (b) is one sparse product over the graph's links, O(E·d), and (c) is
:meth:`Dwfl.receive_on_graph`, eq. (7) over the d_i^S neighbours that transmitted (uniform mixing
over the air; orthogonal links weighted by i's row of W); a receiver that heard no one keeps x_i'.
The alignment of eqs. (3)–(4) stays global: a sender broadcasts one amplitude to all its
receivers. Privacy follows per receiver: eqs. (10)–(11) sum over N(i), σ² is calibrated at the
worst receiver, and each sender is charged at the worst of its receivers. Kind "complete" (the
default) keeps the dense path below, bit for bit.

(b) is the algorithm's :class:`DwflChannel` (``Dwfl.channel``: in sim in the runner, over MQTT in the
channel emulator), (c) is :meth:`Dwfl.node_finish`. The state is ``{"models": (N, P)}``, the stack of
the nodes' models (no global model); each node gets only its own row; :meth:`Dwfl.eval_params` is
their average x̄.

Schemes (``scheme``), all calibrated by the same rule (the σ² that meets the per-round ε at the
worst receiver or link; dwfl.md §4.4):

- ``"ota_d2d"``: DWFL as above; ε_i of eq. (11) per receiver;
- ``"orthogonal_d2d"``: every node broadcasts s_i = sqrt(P_i)(x_i' + G_i) in its own slot (no
  alignment needed: each link is equalised alone; model and noise at full amplitude, i.e.
  α_j = β_j = 1 in Remark IV.1's formula, which is then exact); receiver i averages the N−1
  equalised links and subtracts its own noise as DWFL does: x_i'' = x_i' + η(u_i/(N−1) − (x_i' + G_i))
  (dwfl.md §6.3); analog links (per-link channel noise) or digital (error-free, Shannon-rate airtime);
- ``"ota_central"`` (Seif et al.): every node sends its update γ g_i, aligned, with artificial noise
  to a parameter server, y = Σ_k |h_k| s_k + m; the server broadcasts x − y/(cN). Sending γ g_i
  (not g_i) makes the sensitivity 2cγ g_max, the same as DWFL's, so eq. (11) with the sum over all N
  senders applies unchanged.

Privacy in the ledger (per node, per round): one ``GaussianEvent`` in normalised units (everything
divided by c): sensitivity Δ = 2 γ g_max (replacing the node's whole data set moves its x_i' by at
most 2γ g_max, Theorem IV.1) and σ = the std of the noise at the node's worst receiver
(ota_d2d: min_{i≠j} σ_s,i/c of eq. 10; orthogonal: sqrt(σ² + σ_m²/(|h_j|² P_j)); central:
σ_s/c at the server). That is the paper's per-round guarantee, ε = Δ sqrt(2 ln(1.25/δ))/σ; the run's
accountant composes it over the rounds as a Gaussian mechanism (zCDP or dp-accounting). As in the
paper, x_j^(t−1/2) is treated as data-independent and colluding receivers are not covered. The
observer is "peers". A sender the block's alignment leaves inactive (α = β = 0: with
``pathloss = "scene"``, no traced path to the server point) transmits zeros: it releases nothing of
its data, so it is planned and charged no event for the round (its σ is inf:
:func:`testbed.algorithms.dwfl_plan.inactive_senders`), and it adds no artificial noise at any
receiver. The plan assumes every expected node transmits; when fewer did (a node that missed the
round), the receivers heard less artificial noise, and the server step charges each sender the
difference (:meth:`Dwfl.server_step`): exact for Gaussian mechanisms under zCDP, RDP and PLD alike,
since 1/σ² adds up under composition.

Example::

    >>> from testbed.learning.models import LogisticRegression
    >>> from testbed.data.synthetic import make_logistic
    >>> from testbed.algorithms.dwfl_channel import Radio
    >>> data = make_logistic(num_nodes=4, samples_per_node=50, dim=5, seed=0)
    >>> radio = Radio(num_nodes=4, power_w=1000.0, noise_power_w=1.0, fading="none", c_scale=0.5)
    >>> alg = Dwfl(LogisticRegression(5, 2), radio, rounds=3, batch=8, lr=0.1, averaging_rate=0.5,
    ...            gmax=1.0, delta=1e-5, epsilon=0.5)
    >>> from testbed.algorithms.contract import RoundContext
    >>> state = alg.init_state(alg.model.init(None))
    >>> ctx = RoundContext(round_index=0, seed=0, num_nodes=4, expected=(0, 1, 2, 3))
    >>> out = alg.node_step(alg.downlink(state, ctx, ctx.expected), data.train, ctx.expected, ctx)
    >>> heard = alg.channel.superpose(out.tensors["signal"], alg.channel_tensors(ctx), ctx.closed(out.node_ids))
    >>> new = alg.node_finish(out.carry, heard, out.node_ids, ctx.closed(out.node_ids)).tensors["model"]
    >>> out.tensors["signal"].shape, new.shape, alg.eval_params(state).shape
    ((4, 12), (4, 12), (12,))
    >>> round(float(alg.plan(0).epsilon.max()), 6)
    0.5
"""

from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from channel import Alignment, fill_gaussian_rows, transmit_real
from testbed.algorithms import dwfl_cli
from testbed.algorithms.base import BaseAlgorithm, RoundCost
from testbed.algorithms.batches import check_batches, clipped_gradients
from testbed.algorithms.contract import NodeResult, RoundContext, ServerResult, State, TensorSpec
from testbed.algorithms.dwfl_channel import (DEFAULT_MIXING, SCHEMES, DwflChannel, Radio, channel_noise_row,
                                             heard_links, radio_from_section, topology_from_sections)
from testbed.algorithms.dwfl_plan import RoundPlan, RoundPlans, inactive_senders
from testbed.algorithms.dwfl_section import (CALIBRATIONS, INITS, VARIANTS, DwflSection, channel_from_sections,
                                             check, view_from_sections)
from testbed.algorithms.registry import BuildContext, Registration
from testbed.data.federated import Split
from testbed.errors import ConfigError
from testbed.learning.models import Model
from testbed.ledger.events import Event, GaussianEvent
from testbed.privacy import canaries
from testbed.privacy import dwfl as dp
from testbed.streams.rng import Purpose, node_streams, stream
from testbed.topology import Topology, TopologySection, spectral_gap
from testbed.topology.view import graph_view_with
from testbed.util.parallel import ROWS_IN_CACHE, split_work

if TYPE_CHECKING:
    from testbed.streams.node_secret import Secrets


class Dwfl(RoundPlans, BaseAlgorithm):
    """DWFL and its baselines with resolved radio and privacy settings (on the base: its rounds,
    flops, metrics and planned events; no global model, each node keeps its own).

    Over the air (testbed.algorithms.contract.OverTheAir): each node keeps its own model and the
    channel (``channel``) sits between the nodes.

    Args:
        model: the model (testbed.learning.models).
        radio: the run's radio (:class:`testbed.algorithms.dwfl_channel.Radio`; N = ``radio.num_nodes``).
        rounds: T.
        batch: mini-batch size per node and round.
        lr: γ.
        averaging_rate: η (Ψ = (1−η)I + ηW; η = (N−1)/N averages exactly in one noiseless round).
        gmax: clipping norm of each node's stochastic gradient.
        delta: δ.
        epsilon: per-round target ε (σ² calibrated each fading block); or ``sigma2`` given; neither:
            no artificial noise.
        sigma2: σ² of the artificial noise, fixed.
        calibration: ``"with_channel_noise"`` (exact: channel noise counts toward ε) or
            ``"artificial_only"`` (σ² as if there were no channel noise; dwfl.md §4.4 option (i)).
        scheme: one of SCHEMES.
        variant: ``"A"`` (literal eq. 7) or ``"B"`` (realisable).
        init: ``"common"`` (the runner's θ⁰ on every node), ``"zeros"`` (the paper's x = 0) or
            ``"independent"`` (θ⁰ + init_std·N(0, I) per node, from ``stream(seed, node, -1, INIT)``).
        init_std: std of the independent initialisation.
        seed: the run's seed (keys the channel, known to every node).
        topology: who hears whom (:class:`testbed.topology.Topology`); None or kind "complete": the
            paper's complete graph, on today's O(N·d) path. On any other graph receiver i hears its
            neighbours N(i) only (:meth:`receive_on_graph`); ``ota_central`` needs the complete graph and
            ``ota_d2d`` uniform mixing (a receiver hearing one sum can only weight it as a whole).
    """

    #: A node's plan carries its own airtime, energy and privacy σ.
    uniform_plans = False
    #: One local step a round.
    local_steps = 1

    def __init__(
        self,
        model: Model,
        radio: Radio,
        *,
        rounds: int,
        batch: int,
        lr: float,
        averaging_rate: float,
        gmax: float,
        delta: float,
        epsilon: float | None = None,
        sigma2: float | None = None,
        calibration: str = "with_channel_noise",
        scheme: str = "ota_d2d",
        variant: str = "B",
        init: str = "common",
        init_std: float = 0.1,
        seed: int = 0,
        topology: Topology | None = None,
    ):
        for name, value, allowed in (("scheme", scheme, SCHEMES), ("variant", variant, VARIANTS),
                                     ("calibration", calibration, CALIBRATIONS), ("init", init, INITS)):
            if value not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
        if epsilon is not None and sigma2 is not None:
            raise ValueError("give epsilon or sigma2, not both")
        if scheme == "ota_central" and init == "independent":
            raise ValueError("ota_central keeps one model at the server; init 'independent' does not apply")
        if radio.num_nodes < 2:
            raise ValueError("DWFL needs at least 2 nodes")
        self.model, self.radio = model, radio
        self.rounds_planned, self.batch, self.lr, self.eta, self.gmax = rounds, batch, lr, averaging_rate, gmax
        self.delta, self.epsilon, self.sigma2_fixed, self.calibration = delta, epsilon, sigma2, calibration
        self.scheme, self.variant, self.init, self.init_std, self.seed = scheme, variant, init, init_std, seed
        self.topology = Topology(TopologySection(), radio.num_nodes, seed) if topology is None else topology
        if self.topology.num_nodes != radio.num_nodes:
            raise ValueError(f"the topology has {self.topology.num_nodes} nodes, the radio {radio.num_nodes}")
        #: False on the complete graph: today's path, every number as before the graphs came.
        self.on_graph = not self.topology.is_complete
        if self.on_graph and scheme == "ota_central":
            raise ValueError("ota_central needs the complete graph (every node reaches the server)")
        if self.on_graph and scheme == "ota_d2d" and self.topology.resolved_mixing(DEFAULT_MIXING) != "uniform":
            raise ValueError("ota_d2d needs uniform mixing: a receiver hears one superposition and can only "
                             "weight it as a whole")
        self._amplitude: np.ndarray | None = None  # drawn at the first plan that needs it
        self._given_h: dict[int, np.ndarray] = {}  # block → channel received from the coordinator
        self._plans: dict[Any, RoundPlan] = {}  # keyed by :meth:`_plan_key`
        self._channel = DwflChannel(self)

    # ----------------------------------------------------------------------------- set-up

    @property
    def num_nodes(self) -> int:
        return self.radio.num_nodes

    @property
    def sensitivity(self) -> float:
        """Δ = 2 γ g_max in normalised units (Theorem IV.1 with c divided out), true because each
        node clips its batch gradient to ‖g_i‖ <= g_max (:func:`~testbed.algorithms.batches.clipped_gradients`,
        per sample too for a model without a bound), so replacing its whole data set moves its
        x_i' = x_i − γ g_i by at most 2γ g_max, x_i taken as fixed (the paper's assumption, which
        the summary's assumptions state: x_i carries earlier rounds' gradients)."""
        return dp.sensitivity(self.lr, self.gmax)

    def _privacy_event(self, node: int, round_index: int, sigma: float, issuer: str = "node") -> GaussianEvent:
        # Replace-one of the node's whole data set (user level); no amplification claimed.
        return GaussianEvent(node, round_index, sigma, self.sensitivity, 1, observer="peers", issuer=issuer,
                             clip_norm=self.gmax)

    def round_cost(self, node: int, ctx: RoundContext) -> RoundCost:
        """One local step, one exchange of float64 payloads (the transmit and received signals),
        airtime and energy from channel.link."""
        plan = self.plan(ctx.round_index)
        return dataclasses.replace(super().round_cost(node, ctx), airtime_s=float(plan.airtime_s[node]),
                                   energy_j=float(plan.energy_j[node]))

    def releases(self, node: int, ctx: RoundContext) -> list[Event]:
        """One Gaussian release heard by the peers, with the noise of the expected senders; none for a
        node that no one hears (no neighbour in the round's graph) and none for a sender the round's
        alignment leaves silent (α = β = 0, e.g. no traced path to the server point: it transmits
        zeros, so nothing of its data is released; dwfl_plan.inactive_senders)."""
        sigma = float(self.privacy_sigma(ctx.round_index, ctx.expected)[node])
        return [self._privacy_event(node, ctx.round_index, sigma)] if math.isfinite(sigma) else []

    def state_spec(self) -> dict[str, TensorSpec]:
        return {"models": TensorSpec((self.num_nodes, self.model.num_params))}

    def downlink_spec(self) -> dict[str, TensorSpec]:
        """Each node gets its own model row and the round's channel h."""
        return {"model": TensorSpec((self.model.num_params,)),
                "channel_h": TensorSpec((self.num_nodes,), dtype="complex128", per_node=False)}

    def uplink_spec(self) -> dict[str, TensorSpec]:
        """After the exchange each node reports its new model (its bound: :meth:`round_uplink_spec`)."""
        return {"model": TensorSpec((self.model.num_params,))}

    def round_uplink_spec(self, state: State, ctx: RoundContext) -> dict[str, TensorSpec]:
        """:meth:`uplink_spec` with the bound of round ``ctx`` from ``state`` (the coordinator's): the
        new model within :meth:`model_step_bound` of the one the node was sent
        (testbed.algorithms.contract.round_uplink_spec)."""
        return {"model": TensorSpec((self.model.num_params,), max_norm=self.model_step_bound(state, ctx),
                                    relative_to="model")}

    @property
    def channel(self) -> "DwflChannel":
        return self._channel

    def init_state(self, params0: np.ndarray) -> State:
        """``models`` (N, P): every node's model (the paper's x = 0 with ``init="zeros"``, dwfl.md §7 item 6)."""
        base = np.zeros_like(params0) if self.init == "zeros" else params0
        state = np.repeat(np.asarray(base, dtype=np.float64)[None, :], self.num_nodes, axis=0)
        if self.init == "independent":
            for i in range(self.num_nodes):
                state[i] += self.init_std * stream(self.seed, i, -1, Purpose.INIT).standard_normal(base.shape[0])
        return {"models": state}

    def eval_params(self, state: State) -> np.ndarray:
        """x̄ = (1/N) Σ_i x_i, shape (P,)."""
        return state["models"].mean(axis=0)

    def downlink(self, state: State, ctx: RoundContext, node_ids: Sequence[int]) -> dict[str, np.ndarray]:
        """Each node's own row (M, P) (all rows: the state itself, no copy) and h, (M, N)."""
        models = state["models"]
        ids = np.asarray(node_ids, dtype=np.int64)
        own = models if len(ids) == self.num_nodes and (ids == np.arange(self.num_nodes)).all() else models[ids]
        h = self.channel_tensors(ctx)["channel_h"]
        return {"model": own, "channel_h": np.broadcast_to(h, (len(ids), h.shape[0]))}

    # ----------------------------------------------------------------------------- node side

    def local_step(self, models: np.ndarray, train: Split, node_ids: Sequence[int], round_index: int,
                   seed: int, secrets: "Secrets | None" = None) -> np.ndarray:
        """The payload each node transmits: x_i' = x_i − γ clip(g_i) (D2D) or γ clip(g_i) (ota_central).

        Args:
            models: (M, P) the nodes' current models, row i of node ``node_ids[i]``.
            train: their training data (node i of ``train`` is ``node_ids[i]``).
            node_ids, round_index, seed: key the batch streams ``stream(seed, node, r, BATCH)``.
            secrets: the nodes' secrets (RoundContext.secrets), which key those streams instead.
        Returns:
            (M, P) payloads.
        """
        grad = clipped_gradients(self.model, models, train, node_ids, round_index, seed, self.batch, self.gmax,
                                 secrets)
        if self.scheme == "ota_central":
            return self.lr * grad
        return models - self.lr * grad

    def transmit(self, payload: np.ndarray, models: np.ndarray, node_ids: Sequence[int], round_index: int,
                 seed: int, secrets: "Secrets | None" = None) -> tuple[np.ndarray, np.ndarray]:
        """Eq. (2): the transmit signals and what each node keeps for its update.

        Args:
            payload: (M, P) from :meth:`local_step`; consumed (it becomes ``pending``, no copy of a
                large model is made).
            models: (M, P) the models before the round (kept by ota_central's nodes).
            node_ids, round_index, seed: G_i comes from ``stream(seed, node, r, NOISE)``.
            secrets: the nodes' secrets (RoundContext.secrets): G_i from node i's secret's stream.
        Returns:
            signals (M, P), sqrt(W); pending (M, P).
        """
        plan = self.plan(round_index)
        ids = np.asarray(node_ids, dtype=np.int64)
        tx = _rows(plan.tx, ids)
        std = math.sqrt(plan.sigma2)
        signals = np.empty_like(payload)
        central = self.scheme == "ota_central"
        coef = None if central else -self.eta * self._own(plan, ids)

        def rows(lo: int, hi: int) -> None:
            # A few rows at a time, so that each row is drawn, mixed and subtracted while in cache;
            # every row comes from its node's own stream, so the values do not depend on the split.
            buf = np.empty(payload.shape[1])
            gens = node_streams(seed, ids[lo:hi].tolist(), round_index, Purpose.NOISE, secrets)  # one per row, in order
            for a in range(lo, hi, ROWS_IN_CACHE):
                b = min(a + ROWS_IN_CACHE, hi)
                block = signals[a:b]
                fill_gaussian_rows(block, std, gens)
                transmit_real(payload[a:b], block, _rows(tx, slice(a, b)), out=block)  # s_i = sqrt(α_i P_i) u_i + sqrt(β_i P_i) G_i
                if coef is not None:
                    for i in range(a, b):  # pending = x_i' − η self_i, in place over the payload
                        np.multiply(signals[i], coef[i], out=buf)
                        payload[i] += buf

        split_work(len(ids), rows, numbers=payload.size)
        return signals, (models.copy() if central else payload)

    # ----------------------------------------------------------------------------- audit (testbed audit)

    def _plant_canaries(self, payload: np.ndarray, ids: tuple[int, ...], ctx: RoundContext) -> None:
        """Add the audit's canaries to the payloads x_k' (their reach: 2γ g_max, one data set's clipped
        step either way, the ledger's Δ in normalised units) and keep what the audited receiver would
        hear of the canary-free payloads, Σ_{k≠o} (g_k sqrt(α_k P_k)/c) x_k' (eq. 1 over c), for
        :meth:`_observe_canaries`. The receiver o is the one that hears the least artificial noise
        (the largest g_k sqrt(β_k P_k) is its own, which it does not hear), fixed at the first round.

        Raises:
            AuditUnsupported: a scheme or graph whose receivers this audit does not model (it models
                ota_d2d on the complete graph, every node in the round).
        """
        audit = canaries.active_canaries()
        if self.scheme != "ota_d2d" or self.on_graph or len(ids) != self.num_nodes:
            raise canaries.AuditUnsupported("DWFL's audit models ota_d2d on the complete graph with every node in "
                                            f"the round, not {self.scheme}{' on a graph' if self.on_graph else ''}"
                                            f"{'' if len(ids) == self.num_nodes else ' with nodes missing'}")
        plan = self.plan(ctx.round_index)
        al = plan.channel.alignment
        if audit.receiver is None:
            audit.receiver = int(np.argmax(plan.channel.gains * plan.tx.noise_amplitude))
        weight = plan.channel.gains * plan.tx.signal_amplitude / al.c  # 1 for an aligned sender
        weight[audit.receiver] = 0.0  # a receiver does not hear itself
        audit.heard_clean = (ctx.round_index, weight @ payload)
        canaries.plant(payload, ids, reach=self.sensitivity, adjacency="replace_one")

    def _observe_canaries(self, received: np.ndarray, node_ids: Sequence[int], ctx: RoundContext) -> None:
        """Score the canaries from the audited receiver's v_o: v_o / c minus what it would hear of the
        canary-free payloads is the canaries plus every noise it heard, in model units."""
        audit = canaries.active_canaries()
        round_index, clean = audit.heard_clean
        if round_index != ctx.round_index or audit.receiver not in node_ids:
            return
        row = list(node_ids).index(audit.receiver)
        plan = self.plan(ctx.round_index)
        silent = inactive_senders(plan.tx)  # transmitted zeros: its canaries reached no one, no composition
        senders = [n for n in ctx.answered if n != audit.receiver and not silent[n]]
        c = plan.channel.alignment.c
        canaries.observe(received[row] / c - clean, senders, observer="peers")

    def _own(self, plan: RoundPlan, ids: np.ndarray) -> np.ndarray:
        """(M,) o_i with self_i = o_i s_i, what a node subtracts of its own signal (eq. 7)."""
        if self.scheme == "ota_d2d":
            # self_i = x_i' + a_i G_i = |h_i| s_i / c (eq. 3: |h_i| sqrt(α_i P_i) = c)
            return plan.channel.gains[ids] / plan.channel.alignment.c
        return 1.0 / np.sqrt(plan.tx.power_w[ids])  # self_i = x_i' + G_i = s_i / sqrt(P_i)

    def node_step(self, received: Mapping[str, np.ndarray], train: Split, node_ids: Sequence[int],
                  ctx: RoundContext) -> NodeResult:
        """(a): gradient, local step, transmit signal of every node in ``node_ids``.

        Args:
            received: ``model`` (M, P) the nodes' models; ``channel_h`` (M, N) the round's channel.
            train, node_ids: the nodes' data and global ids.
            ctx: the round (its index and seed key the streams).
        Returns:
            ``signal`` (M, P) the transmit signals, sqrt(W); ``carry["pending"]`` (M, P) what each
            node keeps for :meth:`node_finish` (on a graph also ``carry["signal"]``, the same
            array as the signals: a receiver that hears fewer than all of its weight keeps its own
            share); metrics ``samples``; the planned events.
        """
        if ctx.seed != self.seed:
            raise ValueError(f"the algorithm was built for seed {self.seed}, not {ctx.seed} (the channel depends on it)")
        self.accept_channel(ctx.round_index, np.asarray(received["channel_h"][0]))
        ids = tuple(int(i) for i in node_ids)
        models = received["model"]
        payload = self.local_step(models, train, ids, ctx.round_index, ctx.seed, ctx.secrets)
        if canaries.auditing():
            self._plant_canaries(payload, ids, ctx)
        signals, pending = self.transmit(payload, models, ids, ctx.round_index, ctx.seed, ctx.secrets)
        carry = {"pending": pending, "signal": signals} if self.on_graph else {"pending": pending}
        return self.result(ids, {"signal": signals}, train, ctx, carry=carry)

    def node_finish(self, carry: Mapping[str, np.ndarray], received: np.ndarray, node_ids: Sequence[int],
                    ctx: RoundContext) -> NodeResult:
        """(c) for the nodes of a :meth:`node_step`: (M, P) received rows → (M, P) new models.
        Each averages over the S − 1 others that transmitted (``ctx.answered``; beyond the paper,
        which has every node transmit). ``carry["pending"]`` is consumed (updated in place)."""
        pending = carry["pending"]
        if received.shape != pending.shape:
            raise ValueError(f"received signals of shape {received.shape}, expected {pending.shape}")
        if canaries.auditing():
            self._observe_canaries(received, node_ids, ctx)
        if self.on_graph:
            models = self.receive_on_graph(pending, received, carry["signal"], node_ids, ctx.round_index, ctx.seed,
                                           ctx.answered)
        else:
            models = self.receive(pending, received, node_ids, ctx.round_index, ctx.seed, len(ctx.answered))
        return NodeResult(node_ids=tuple(int(n) for n in node_ids), tensors={"model": models})

    def receive(self, pending: np.ndarray, received: np.ndarray, node_ids: Sequence[int], round_index: int,
                seed: int, num_senders: int | None = None) -> np.ndarray:
        """(c): each node's new model from its own received signal (eq. 7).

        Args:
            pending: (M, P) from :meth:`transmit`; consumed (updated in place and returned).
            received: (M, P) each node's row of :func:`~testbed.algorithms.dwfl_channel.propagate`.
            node_ids, round_index, seed: variant A redraws each receiver's channel noise.
            num_senders: S, how many nodes transmitted (None: all N). Over MQTT a node that misses
                the round is silent, and each receiver averages over the S − 1 others it heard
                (beyond the paper, which has every node transmit).
        Returns:
            (M, P) the nodes' models x_i^(t+1/2).
        """
        plan = self.plan(round_index)
        n, c = self.num_nodes if num_senders is None else num_senders, plan.channel.alignment.c
        if n < 2:
            raise ValueError(f"an exchange needs at least 2 senders, got {n}")
        scale = {"ota_d2d": self.eta / (c * (n - 1)), "orthogonal_d2d": self.eta / (n - 1),
                 "ota_central": -1.0 / (c * n)}[self.scheme]  # central: x − y/(cN)
        ids = [int(node) for node in node_ids]

        def rows(lo: int, hi: int) -> None:  # row by row: one row of scratch, whatever N
            buf = np.empty(pending.shape[1])
            for i in range(lo, hi):
                np.multiply(received[i], scale, out=buf)
                pending[i] += buf
                if self.variant == "A":
                    pending[i] -= scale * channel_noise_row(self.scheme, plan.channel, self.radio, ids[i],
                                                            pending.shape[1], seed, round_index)

        split_work(len(ids), rows, numbers=pending.size)
        return pending

    def receive_on_graph(self, pending: np.ndarray, received: np.ndarray, signals: np.ndarray,
                         node_ids: Sequence[int], round_index: int, seed: int, senders: Sequence[int]) -> np.ndarray:
        """(c) on a graph: receiver i heard only its neighbours that transmitted, N^S(i), d_i^S of them.

        - ota_d2d (eq. 7 over N^S(i), uniform mixing): x_i'' = x_i' + η (v_i / (c d_i^S) − self_i),
          v_i = Σ_{k∈N^S(i)} g_k s_k + m_i (variant A also takes m_i / (c d_i^S) off);
        - orthogonal_d2d: x_i'' = x_i' + η (u_i − (Σ_k w_ik) self_i), u_i = Σ_{k∈N^S(i)} w_ik (s_k /
          sqrt(P_k) + link noise) weighted by i's mixing row (uniform 1/d_i^S: Σ_k w_ik = 1;
          Metropolis–Hastings: a silent neighbour's weight stays with i);

        i.e. eq. (8)'s X'' = Ψ X' + (Ψ − I) Φ with Ψ = (1 − η) I + η W over the heard links. A
        receiver that heard no neighbour keeps x_i' (its row of W is the identity's). With
        pending_i = x_i' − η self_i (:meth:`transmit`), x_i'' = pending_i + scale_i (v_i − [A] m_i)
        + η (1 − Σ_k w_ik) o_i s_i, the last term only where a receiver keeps a share of its own.

        Args:
            pending: (M, P) from :meth:`transmit`; consumed (updated in place and returned).
            received: (M, P) each node's row of :func:`~testbed.algorithms.dwfl_channel.propagate`.
            signals: (M, P) the nodes' own transmit signals s_i.
            node_ids, round_index, seed: the receivers; variant A redraws their channel noise.
            senders: the nodes that transmitted (``ctx.answered``).
        Returns:
            (M, P) the nodes' models x_i^(t+1/2).
        """
        plan = self.plan(round_index)
        mixing = self.mixing(round_index)
        links = heard_links(mixing, senders)
        ids = np.asarray(node_ids, dtype=np.int64)
        heard = links.count[ids]
        with np.errstate(divide="ignore"):
            if self.scheme == "ota_d2d":
                scale = np.where(heard > 0, self.eta / (plan.channel.alignment.c * heard), 0.0)
            else:  # the channel weighted every link already
                scale = np.where(heard > 0, self.eta, 0.0)
        if mixing.rule == "uniform":
            kept = np.where(heard > 0, 0.0, 1.0)  # exactly: Σ_k 1/d_i^S need not round to 1
        else:
            kept = 1.0 - links.weight_sum[ids]
        own = self.eta * kept * self._own(plan, ids)

        def rows(lo: int, hi: int) -> None:  # row by row: one row of scratch, whatever N
            buf = np.empty(pending.shape[1])
            for i in range(lo, hi):
                if scale[i]:
                    np.multiply(received[i], scale[i], out=buf)
                    pending[i] += buf
                    if self.variant == "A":
                        pending[i] -= scale[i] * channel_noise_row(self.scheme, plan.channel, self.radio, int(ids[i]),
                                                                   pending.shape[1], seed, round_index, links)
                if own[i]:
                    np.multiply(signals[i], own[i], out=buf)
                    pending[i] += buf

        split_work(len(ids), rows, numbers=pending.size)
        return pending

    # ----------------------------------------------------------------------------- channel side

    def server_step(self, state: State, result: NodeResult, ctx: RoundContext) -> ServerResult:
        """The nodes that finished the round replace their rows; the others keep theirs. Every
        sender (``ctx.answered``) whose receivers heard less artificial noise than planned (fewer
        senders than expected) is charged the difference: a Gaussian event of σ_t with
        1/σ_t² = 1/σ_heard² − 1/σ_planned², so planned plus correction compose to what happened. A
        silent sender (planned and heard σ both inf) released nothing and is charged nothing."""
        models = result.tensors.get("model")
        n = self.num_nodes
        if models is not None and result.node_ids == tuple(range(n)):
            new = models  # every node finished: the stack is the new state, no copy
        else:
            new = np.array(state["models"], copy=True)
            if result.node_ids:
                new[list(result.node_ids)] = models
        events: list[Event] = []
        if ctx.answered and tuple(ctx.answered) != tuple(ctx.expected):
            planned = self.privacy_sigma(ctx.round_index, ctx.expected)
            heard = self.privacy_sigma(ctx.round_index, ctx.answered)
            for node in ctx.answered:
                extra = 1.0 / heard[node] ** 2 - 1.0 / planned[node] ** 2
                if extra > 1e-12 / planned[node] ** 2:
                    events.append(self._privacy_event(node, ctx.round_index, float(1.0 / math.sqrt(extra)), "server"))
        return ServerResult({"models": new}, events)

    # ----------------------------------------------------------------------------- report

    def describe(self) -> dict[str, Any]:
        """Settings, per-round ε per receiver (eq. 11, first block; worst over the blocks drawn) and
        the ε over all planned rounds composed by dp-accounting at the worst node."""
        first = self.plan(0)
        plans = [self.plan(t) for t in range(self.rounds_planned)] if self.rounds_planned else [first]
        z = [float(p.privacy_sigma.min()) / self.sensitivity for p in plans]
        al = first.channel.alignment
        return {
            "scheme": self.scheme, "variant": self.variant, "calibration": self.calibration,
            "epsilon_target_per_round": self.epsilon, "sigma2": first.sigma2,
            "epsilon_per_receiver": first.epsilon.tolist(),
            "epsilon_round_max": max(float(p.epsilon.max()) for p in plans),
            # Remark IV.1 (paper numerator): each sender's ε if it were heard alone, same σ² and β.
            "epsilon_orthogonal": first.epsilon.tolist() if self.scheme == "orthogonal_d2d" else dp.orthogonal_epsilon(
                dp.RoundSetting(first.channel.gains, al.power_w, al.beta, self.radio.noise_power_w, self.lr,
                                self.gmax, self.delta), first.sigma2).tolist(),
            # Over all planned rounds, at the worst node, by every tight accountant (epsilon_composed_rdp...).
            **{f"epsilon_composed_{name}": eps for name, eps in dp.composed_epsilons(z, self.delta).items()},
            "sensitivity": self.sensitivity, "privacy_sigma": first.privacy_sigma.tolist(),
            "delta": self.delta, "rounds_planned": self.rounds_planned, "batch": self.batch, "lr": self.lr,
            "averaging_rate": self.eta, "gmax": self.gmax, "init": self.init,
            "power_w": float(al.power_w[0]), "noise_power_w": self.radio.noise_power_w, "c": al.c,
            "alpha": al.alpha.tolist(), "beta": al.beta.tolist(), "gains": first.channel.gains.tolist(),
            "fading": self.radio.fading, "coherence_rounds": self.radio.coherence_rounds,
            "pathloss": self.radio.pathloss, "airtime_s_per_round": float(first.airtime_s.max()),
            "topology": self.describe_topology(),
        }

    def describe_topology(self) -> dict[str, Any]:
        """``topology`` of summary.json: :meth:`testbed.topology.Topology.describe` and the gap of the
        round's effective mixing Ψ = (1 − η) I + η W (eq. 8), which governs consensus at rate η."""
        out = self.topology.describe(self.rounds_planned, DEFAULT_MIXING)
        n = self.num_nodes
        if self.on_graph:
            gap = spectral_gap(self.mixing(0), laziness=self.eta)
        else:  # eig W = 1, −1/(N − 1): eig Ψ = 1, 1 − ηN/(N − 1) (dwfl.md §8 check 2); no N² matrix
            gap = 1.0 - abs(1.0 - self.eta * n / (n - 1))
        out["effective_spectral_gap"] = round(float(gap), 12)
        out["averaging_rate"] = self.eta
        return out


def _rows(al: Alignment, ids: np.ndarray | slice) -> Alignment:
    """The alignment restricted to the nodes ``ids`` (what those nodes' transmitters use)."""
    return dataclasses.replace(al, alpha=al.alpha[ids], beta=al.beta[ids], power_w=al.power_w[ids],
                               phase_rad=al.phase_rad[ids], active=al.active[ids], csi=al.csi[ids])


def build(sections: dict[str, Any], ctx: BuildContext) -> Dwfl:
    """DWFL as its ``[dwfl]`` section says, for the data this process holds."""
    a: DwflSection = sections["dwfl"]
    data = ctx.data
    check_batches("dwfl", data.train, data.node_ids, 1, a.batch, "batch")
    # N of the whole run: a board's data holds only its own node, the radio holds every node.
    if ctx.num_nodes < 2:
        raise ConfigError("data.num_nodes", "DWFL needs at least 2 nodes")
    topology = topology_from_sections(sections, ctx.num_nodes, ctx.seed)
    if data.num_nodes == ctx.num_nodes:  # the coordinator's process: every block, before the run
        topology.check(a.rounds)
    alg = Dwfl(ctx.model, radio_from_section(a, ctx.num_nodes), rounds=a.rounds, batch=a.batch, lr=a.lr,
               averaging_rate=a.averaging_rate, gmax=a.gmax, delta=ctx.delta, epsilon=a.epsilon, sigma2=a.sigma2,
               calibration=a.calibration, scheme=a.scheme, variant=a.variant, init=a.init, init_std=a.init_std,
               seed=ctx.seed, topology=topology)
    if data.num_nodes == ctx.num_nodes:
        # Fail now, naming the key, if the target ε cannot be met. (A board holds one node's data
        # and gets each round's channel from the coordinator, which has checked this already.)
        alg.plan(0)
    return alg


REGISTRATION = Registration(
    name="dwfl",
    sections={"dwfl": DwflSection, "topology": TopologySection},
    build=build,
    check=check,
    channel=channel_from_sections,
    epsilon_target=lambda sections: sections["dwfl"].epsilon,
    guarantee=lambda sections: "dp",  # the channel's noise, at least, is accounted in every round
    privacy_cli=dwfl_cli.PRIVACY,
    assumptions=lambda sections: list(dwfl_cli.ASSUMPTIONS),
    privacy_statements=(dwfl_cli.STATEMENT,),
    channel_view=view_from_sections,
    graph_view=graph_view_with(radio=lambda sections, num_nodes: radio_from_section(sections["dwfl"], num_nodes),
                               default_mixing=DEFAULT_MIXING),
)
