"""DWFL (Chen et al., arXiv 2109.09142): decentralised wireless FL with over-the-air DP, and baselines.

One round (Algorithm 1, eq. 7; dwfl.md §3.4), split so that the channel can run elsewhere:

(a) node side, :meth:`Dwfl.node_step`: clipped stochastic gradient g_i (||g_i|| <= g_max), local step
    x_i' = x_i − γ g_i, artificial noise G_i ~ N(0, σ² I) from the node's own stream, transmit signal
    s_i = sqrt(α_i P_i) x_i' + sqrt(β_i P_i) G_i (eq. 2, after phase pre-compensation);
    ``NodeOutput.params`` are the signals (M, P); what the node keeps for (c) stays in the
    algorithm object (on a board: in the node's own process), never in the output;
(b) channel side, :func:`testbed.algorithms.dwfl_channel.propagate`: signals → each receiver's signal;
(c) node side, :meth:`Dwfl.receive`: x_i'' = x_i' + η (v_i / (c(N−1)) − self_i), where
    ``variant="A"`` (the literal eq. 7) takes self_i = x_i' + a_i G_i + m_i/(c(N−1)), subtracting the
    receiver's own channel noise (an oracle: it is redrawn from the channel's stream), and
    ``variant="B"`` (physically realisable) self_i = x_i' + a_i G_i, with a_i = |h_i| sqrt(β_i P_i)/c.
    Everything but v_i is known before the node listens, so the node step already forms
    pending_i = x_i' − η self_i (B) and the update is pending_i + η/(c(N−1)) (v_i − [A: m_i]).

In sim :meth:`Dwfl.combine` is (b) then (c) for all nodes. The state is the (N, P) stack of the
nodes' models (no global model); :meth:`Dwfl.eval_params` is their average x̄.

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
paper, x_j^(t−1/2) is treated as data-independent and colluding receivers are not covered.

Example::

    >>> from testbed.models import LogisticRegression
    >>> from testbed.data.synthetic import make_logistic
    >>> from testbed.algorithms.dwfl_channel import Radio
    >>> data = make_logistic(num_nodes=4, samples_per_node=50, dim=5, seed=0)
    >>> radio = Radio(num_nodes=4, power_w=1000.0, noise_power_w=1.0, fading="none", c_scale=0.5)
    >>> alg = Dwfl(LogisticRegression(5, 2), radio, rounds=3, batch=8, lr=0.1, averaging_rate=0.5,
    ...            gmax=1.0, delta=1e-5, epsilon=0.5)
    >>> state = alg.init_state(alg.model.init(None))
    >>> out = alg.node_step(state, data.train, [0, 1, 2, 3], round_index=0, seed=0)
    >>> out.params.shape, alg.combine(out, state).shape, alg.eval_params(state).shape
    ((4, 12), (4, 12), (12,))
    >>> round(float(alg.plan(0).epsilon.max()), 6)
    0.5
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from channel import Alignment, analog_link, digital_link, fill_gaussian_rows, orthogonal_round_airtime_s, transmit_real
from testbed.algorithms import NodeOutput
from testbed.algorithms.batches import uniform_batches
from testbed.algorithms.dwfl_channel import (
    SCHEMES,
    Radio,
    aligned_channel,
    RoundChannel,
    channel_noise_row,
    large_scale_amplitude,
    propagate,
    round_channel,
)
from testbed.data.federated import FederatedData, Split
from testbed.errors import ConfigError
from testbed.ledger import CommunicationEvent, ComputeEvent, Event, GaussianEvent
from testbed.models import Model
from testbed.privacy import dwfl as dp
from testbed.rng import Purpose, stream

if TYPE_CHECKING:
    from testbed.config import Config

VARIANTS = ("A", "B")
CALIBRATIONS = ("with_channel_noise", "artificial_only")
INITS = ("common", "zeros", "independent")
_BYTES_PER_REAL = 8  # float64 payloads on the wire (MQTT carries the transmit and received signals)


@dataclass(frozen=True)
class _Kept:
    """What the nodes of the last node step keep for their update (never transmitted)."""

    round_index: int
    seed: int
    node_ids: tuple[int, ...]
    pending: np.ndarray  # (M, P): x_i' − η self_i (D2D), or the model before the round (ota_central)


@dataclass(frozen=True)
class RoundPlan:
    """Everything about one fading block that nodes and accountants need (arrays over all N nodes).

    Attributes:
        channel: the block's channel.
        tx: amplitudes of eq. (2) actually used (the alignment; all-ones α, β for orthogonal).
        sigma2: σ², per-entry variance of the artificial noise G_i.
        epsilon: (N,) per-round ε: per receiver (eq. 11, ota_d2d), per sender link (Remark IV.1,
            orthogonal_d2d) or at the server (ota_central, every entry the same).
        privacy_sigma: (N,) normalised noise std at each node's worst receiver (ledger σ).
        airtime_s, energy_j: (N,) each node's radio time in the round and its transmit energy.
    """

    channel: RoundChannel
    tx: Alignment
    sigma2: float
    epsilon: np.ndarray
    privacy_sigma: np.ndarray
    airtime_s: np.ndarray
    energy_j: np.ndarray


def _min_over_others(values: np.ndarray) -> np.ndarray:
    """(N,) min_{i≠j} values[i] for every j (the smallest, or the second smallest for its holder)."""
    order = np.argsort(values, kind="stable")
    out = np.full(values.shape, values[order[0]])
    out[order[0]] = values[order[1]]
    return out


class Dwfl:
    """DWFL and its baselines with resolved radio and privacy settings.

    Over the air: over MQTT each node keeps its own model and the channel emulator sits between
    the nodes (testbed.protocol); ``over_the_air`` tells the coordinator so.

    Args:
        model: the model (testbed.models).
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
    """

    #: Over MQTT the channel emulator sits between the nodes, each keeping its own model.
    over_the_air = True

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
        self._amplitude: np.ndarray | None = None  # drawn at the first plan that needs it
        self._given_h: dict[int, np.ndarray] = {}  # block → channel received from the coordinator
        self._plans: dict[int, RoundPlan] = {}
        self._kept: _Kept | None = None

    # ----------------------------------------------------------------------------- set-up

    @property
    def rounds(self) -> int:
        return self.rounds_planned

    @property
    def num_nodes(self) -> int:
        return self.radio.num_nodes

    @property
    def sensitivity(self) -> float:
        """Δ = 2 γ g_max in normalised units (Theorem IV.1 with c divided out)."""
        return dp.sensitivity(self.lr, self.gmax)

    def plan(self, round_index: int) -> RoundPlan:
        """The :class:`RoundPlan` of the round's fading block (drawn and calibrated once per block)."""
        block = self.radio.schedule.block_index(round_index)
        if block not in self._plans:
            self._plans[block] = self._make_plan(round_index)
        return self._plans[block]

    def shared_tensors(self, round_index: int) -> dict[str, np.ndarray]:
        """What every node needs for the round besides its model: the block's channel h, (N,)
        complex128. Over MQTT the coordinator sends it, so a board needs no Sionna to draw it
        (a real radio would estimate it from pilots)."""
        return {"channel_h": self.plan(round_index).channel.h}

    def accept_shared(self, round_index: int, tensors: dict[str, np.ndarray]) -> None:
        """Use the channel the coordinator sent (:meth:`shared_tensors`) for the round's block."""
        h = tensors.get("channel_h")
        if h is None or h.shape != (self.num_nodes,) or not np.iscomplexobj(h):
            raise ValueError(f"a DWFL round needs channel_h of shape ({self.num_nodes},), complex")
        block = self.radio.schedule.block_index(round_index)
        known = self._plans.get(block)
        if known is None or not np.array_equal(known.channel.h, h):
            self._plans.pop(block, None)
            self._given_h[block] = np.array(h)

    def _round_channel(self, round_index: int) -> RoundChannel:
        block = self.radio.schedule.block_index(round_index)
        r = self.radio
        if block in self._given_h:
            return aligned_channel(r, block, self._given_h.pop(block))
        if self._amplitude is None:
            self._amplitude = large_scale_amplitude(r, self.seed)
        return round_channel(r, self.seed, round_index, self._amplitude)

    def _make_plan(self, round_index: int) -> RoundPlan:
        n, r = self.num_nodes, self.radio
        rc = self._round_channel(round_index)
        al, g = rc.alignment, rc.gains
        p, sm = al.power_w, r.noise_power_w
        args = (self.lr, self.gmax, self.delta)
        orth = self.scheme == "orthogonal_d2d"
        link_noise = 0.0 if orth and r.digital_orthogonal else sm  # what the privacy noise includes
        cal_noise = link_noise if self.calibration == "with_channel_noise" else 0.0
        tx = dataclasses.replace(al, alpha=np.ones(n), beta=np.ones(n)) if orth else al
        if self.sigma2_fixed is not None:
            sigma2 = self.sigma2_fixed
        elif self.epsilon is None:
            sigma2 = 0.0
        elif orth:
            sigma2 = dp.calibrate_sigma2_orthogonal(self.epsilon, g, p, 1.0, cal_noise, *args)
        elif self.scheme == "ota_d2d":
            sigma2 = dp.calibrate_sigma2(self.epsilon, g, p, al.beta, sm, *args, c=al.c,
                                         count_channel_noise=self.calibration == "with_channel_noise")
        else:
            sigma2 = dp.calibrate_sigma2_central(self.epsilon, g, p, al.beta, cal_noise, *args, c=al.c)
        if not math.isfinite(sigma2):
            raise ConfigError("dwfl.epsilon", f"{self.epsilon} cannot be met in round {round_index}: a receiver "
                              "hears no artificial noise (every other sender has beta = 0); lower dwfl.c_scale")
        if orth:
            eps = dp.orthogonal_epsilon(g, p, 1.0, sigma2, link_noise, *args, numerator="paper")
            var = sigma2 + link_noise / (g**2 * p)
        elif self.scheme == "ota_d2d":
            eps = dp.epsilon_per_receiver(g, p, al.beta, sigma2, sm, *args, c=al.c)  # eq. (11)
            var = _min_over_others(dp.receiver_noise_variance(g, p, al.beta, sigma2, sm) / al.c**2)  # eq. (10)
        else:
            eps = np.full(n, dp.central_epsilon(g, p, al.beta, sigma2, sm, *args, c=al.c))
            var = np.full(n, (float(dp.artificial_noise_powers(g, p, al.beta).sum()) * sigma2 + sm) / al.c**2)
        airtime, energy = self._link_cost(rc)
        return RoundPlan(channel=rc, tx=tx, sigma2=float(sigma2), epsilon=np.asarray(eps, dtype=float),
                         privacy_sigma=np.sqrt(var), airtime_s=airtime, energy_j=energy)

    def _link_cost(self, rc: RoundChannel) -> tuple[np.ndarray, np.ndarray]:
        """(N,) radio time of each node in the round (transmitting or listening) and (N,) transmit energy."""
        n, r, d = self.num_nodes, self.radio, self.model.num_params
        p = rc.alignment.power_w
        if self.scheme == "orthogonal_d2d" and r.digital_orthogonal:
            # One slot per sender at its Shannon rate; complex noise power 2σ_m² (σ_m² per real rail).
            links = [digital_link(_BYTES_PER_REAL * 8 * d, p[k], rc.gains[k] ** 2, 2 * r.noise_power_w,
                                  r.bandwidth_hz) for k in range(n)]
            round_s = orthogonal_round_airtime_s([c.airtime_s for c in links])
            return np.full(n, round_s), np.array([c.energy_j for c in links])
        costs = [analog_link(d, r.bandwidth_hz, p[k]) for k in range(n)]  # d channel uses each
        slot = np.array([c.airtime_s for c in costs])
        slots_per_round = {"ota_d2d": 1, "ota_central": 2, "orthogonal_d2d": n}[self.scheme]
        return slots_per_round * slot, np.array([c.energy_j for c in costs])

    def planned_events(self, node: int, round_index: int) -> list[Event]:
        """One local step, one exchange (airtime and energy from channel.link), one Gaussian release.
        Whoever runs the step charges its seconds and joules (nodes.costs)."""
        plan = self.plan(round_index)
        size = self.model.num_params * _BYTES_PER_REAL
        return [
            ComputeEvent(node, round_index, 1),
            CommunicationEvent(node, round_index, bytes_up=size, bytes_down=size,
                               airtime_s=float(plan.airtime_s[node]), energy_j=float(plan.energy_j[node])),
            # Replace-one of the node's whole data set (user level); no amplification claimed.
            GaussianEvent(node, round_index, float(plan.privacy_sigma[node]), self.sensitivity, 1),
        ]

    def init_state(self, params0: np.ndarray) -> np.ndarray:
        """(N, P) every node's model (the paper's x = 0 with ``init="zeros"``, dwfl.md §7 item 6)."""
        base = np.zeros_like(params0) if self.init == "zeros" else params0
        state = np.repeat(base[None, :], self.num_nodes, axis=0)
        if self.init == "independent":
            for i in range(self.num_nodes):
                state[i] += self.init_std * stream(self.seed, i, -1, Purpose.INIT).standard_normal(base.shape[0])
        return state

    def eval_params(self, state: np.ndarray) -> np.ndarray:
        """x̄ = (1/N) Σ_i x_i, shape (P,)."""
        return state.mean(axis=0)

    # ----------------------------------------------------------------------------- node side

    def local_step(self, models: np.ndarray, train: Split, node_ids: Sequence[int], round_index: int,
                   seed: int) -> np.ndarray:
        """The payload each node transmits: x_i' = x_i − γ clip(g_i) (D2D) or γ clip(g_i) (ota_central).

        Args:
            models: (M, P) the nodes' current models, row i of node ``node_ids[i]``.
            train: their training data (node i of ``train`` is ``node_ids[i]``).
            node_ids, round_index, seed: key the batch streams ``stream(seed, node, r, BATCH)``.
        Returns:
            (M, P) payloads.
        """
        idx = uniform_batches(train, node_ids, round_index, seed, steps=1, batch=self.batch)[:, 0]
        weights = np.full(idx.shape, 1.0 / self.batch)
        _, grad = self.model.loss_and_grad(models, train.x[idx], train.y[idx], weights)
        norms = np.linalg.norm(grad, axis=1, keepdims=True)
        grad *= np.minimum(1.0, self.gmax / np.maximum(norms, 1e-300))  # clip: ||g_i|| <= g_max
        if self.scheme == "ota_central":
            return self.lr * grad
        return models - self.lr * grad

    def transmit(self, payload: np.ndarray, models: np.ndarray, node_ids: Sequence[int], round_index: int,
                 seed: int) -> tuple[np.ndarray, np.ndarray]:
        """Eq. (2): the transmit signals and what each node keeps for its update.

        Args:
            payload: (M, P) from :meth:`local_step`; consumed (it becomes ``pending``, no copy of a
                large model is made).
            models: (M, P) the models before the round (kept by ota_central's nodes).
            node_ids, round_index, seed: G_i comes from ``stream(seed, node, r, NOISE)``.
        Returns:
            signals (M, P), sqrt(W); pending (M, P).
        """
        plan = self.plan(round_index)
        ids = np.asarray(node_ids, dtype=np.int64)
        tx = _rows(plan.tx, ids)
        signals = np.empty_like(payload)
        fill_gaussian_rows(signals, math.sqrt(plan.sigma2), [stream(seed, i, round_index, Purpose.NOISE) for i in ids])
        transmit_real(payload, signals, tx, out=signals)  # s_i = sqrt(α_i P_i) u_i + sqrt(β_i P_i) G_i
        if self.scheme == "ota_central":
            return signals, models.copy()
        if self.scheme == "ota_d2d":
            # self_i = x_i' + a_i G_i = |h_i| s_i / c (eq. 3: |h_i| sqrt(α_i P_i) = c)
            own = plan.channel.gains[ids] / plan.channel.alignment.c
        else:
            own = 1.0 / np.sqrt(plan.tx.power_w[ids])  # self_i = x_i' + G_i = s_i / sqrt(P_i)
        coef = -self.eta * own
        buf = np.empty(payload.shape[1])
        for i in range(len(ids)):  # pending = x_i' − η self_i, in place over the payload, one row of scratch
            np.multiply(signals[i], coef[i], out=buf)
            payload[i] += buf
        return signals, payload

    def node_step(self, state: np.ndarray, train: Split, node_ids: Sequence[int], round_index: int,
                  seed: int) -> NodeOutput:
        """(a): gradient, local step, transmit signal of every node in ``node_ids``.

        Args:
            state: (M, P) the nodes' models (all N in sim, a board's own row over MQTT).
            train, node_ids, round_index, seed: as :meth:`local_step`.
        Returns:
            NodeOutput with the (M, P) transmit signals and the nodes' events; what the nodes keep
            for :meth:`receive` stays here until :meth:`combine`.
        """
        if seed != self.seed:
            raise ValueError(f"the algorithm was built for seed {self.seed}, not {seed} (the channel depends on it)")
        ids = tuple(int(i) for i in node_ids)
        payload = self.local_step(state, train, ids, round_index, seed)
        signals, pending = self.transmit(payload, state, ids, round_index, seed)
        self._kept = _Kept(round_index, seed, ids, pending)
        events = [self.planned_events(node, round_index) for node in ids]
        return NodeOutput(node_ids=ids, params=signals, events=events)

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
        buf = np.empty(pending.shape[1])
        for i, node in enumerate(node_ids):  # row by row: one row of scratch, whatever N
            np.multiply(received[i], scale, out=buf)
            pending[i] += buf
            if self.variant == "A":
                pending[i] -= scale * channel_noise_row(self.scheme, plan.channel, self.radio, int(node),
                                                        pending.shape[1], seed, round_index)
        return pending

    # ----------------------------------------------------------------------------- channel side

    def propagate(self, signals: np.ndarray, round_index: int, seed: int, out: np.ndarray | None = None) -> np.ndarray:
        """(b): every node's received signal, (N, P) → (N, P) (the channel emulator's job).

        ``out`` may be ``signals`` itself (overwritten) when the signals are not needed afterwards."""
        return propagate(self.scheme, signals, self.plan(round_index).channel, self.radio, seed, round_index, out)

    def combine(self, output: NodeOutput, state: np.ndarray | None = None) -> np.ndarray:
        """Sim: (b) then (c) for all nodes of the last :meth:`node_step`. (N, P) signals → (N, P) models.

        Consumes ``output``: the received signals overwrite the transmitted ones, and the pending
        updates become the new models (one round holds no more than three (N, P) arrays)."""
        kept = self._kept
        if kept is None or tuple(output.node_ids) != kept.node_ids:
            raise ValueError("combine needs the output of this algorithm's last node_step for all nodes")
        received = self.propagate(output.params, kept.round_index, kept.seed, out=output.params)
        return self.finish(received)

    def finish(self, received: np.ndarray, num_senders: int | None = None) -> np.ndarray:
        """(c) for the nodes of the last :meth:`node_step` (on a board: the node itself), from
        their (M, P) received rows; returns their (M, P) new models. ``num_senders``: see
        :meth:`receive`."""
        kept = self._kept
        if kept is None:
            raise ValueError("finish needs a node_step first")
        if received.shape != kept.pending.shape:
            raise ValueError(f"received signals of shape {received.shape}, expected {kept.pending.shape}")
        self._kept = None
        return self.receive(kept.pending, received, kept.node_ids, kept.round_index, kept.seed, num_senders)

    # ----------------------------------------------------------------------------- report

    def describe(self) -> dict[str, Any]:
        """Settings, per-round ε per receiver (eq. 11, first block; worst over the blocks drawn) and
        the ε over all planned rounds composed by dp-accounting at the worst node."""
        first = self.plan(0)
        plans = [self.plan(t) for t in range(self.rounds_planned)] if self.rounds_planned else [first]
        z = [float(p.privacy_sigma.min()) / self.sensitivity for p in plans]
        # One self-composed event when every round is the same mechanism (time-invariant channel):
        # a PLD of T separate events costs T convolutions.
        same = all(v == z[0] for v in z)
        # PLD discretises the privacy loss; below a noise multiplier of 0.1 its grid explodes (and ε
        # is in the hundreds anyway), so only RDP is reported there.
        composed = {acc: None if acc == "pld" and min(z) < 0.1 else dp.composed_epsilon(
            z[0] if same else z, self.delta, rounds=len(z) if same else None, accountant=acc)
            for acc in ("rdp", "pld")}
        al = first.channel.alignment
        return {
            "scheme": self.scheme, "variant": self.variant, "calibration": self.calibration,
            "epsilon_target_per_round": self.epsilon, "sigma2": first.sigma2,
            "epsilon_per_receiver": first.epsilon.tolist(),
            "epsilon_round_max": max(float(p.epsilon.max()) for p in plans),
            # Remark IV.1 (paper numerator): each sender's ε if it were heard alone, same σ² and β.
            "epsilon_orthogonal": first.epsilon.tolist() if self.scheme == "orthogonal_d2d" else dp.orthogonal_epsilon(
                first.channel.gains, al.power_w, al.beta, first.sigma2, self.radio.noise_power_w, self.lr,
                self.gmax, self.delta).tolist(),
            "epsilon_composed_rdp": composed["rdp"], "epsilon_composed_pld": composed["pld"],
            "sensitivity": self.sensitivity, "privacy_sigma": first.privacy_sigma.tolist(),
            "delta": self.delta, "rounds_planned": self.rounds_planned, "batch": self.batch, "lr": self.lr,
            "averaging_rate": self.eta, "gmax": self.gmax, "init": self.init,
            "power_w": float(al.power_w[0]), "noise_power_w": self.radio.noise_power_w, "c": al.c,
            "alpha": al.alpha.tolist(), "beta": al.beta.tolist(), "gains": first.channel.gains.tolist(),
            "fading": self.radio.fading, "coherence_rounds": self.radio.coherence_rounds,
            "pathloss": self.radio.pathloss, "airtime_s_per_round": float(first.airtime_s.max()),
        }


def _rows(al: Alignment, ids: np.ndarray) -> Alignment:
    """The alignment restricted to the nodes ``ids`` (what those nodes' transmitters use)."""
    return dataclasses.replace(al, alpha=al.alpha[ids], beta=al.beta[ids], power_w=al.power_w[ids],
                               phase_rad=al.phase_rad[ids], active=al.active[ids], csi=al.csi[ids])


def radio_from_config(config: "Config", num_nodes: int) -> Radio:
    """The :class:`Radio` of the ``[dwfl]`` section: dBm to W, σ_m² fixed or thermal (k·T·B·NF/2)."""
    from channel import dbm_to_w, real_noise_variance_w, thermal_noise_power_w

    a = config.dwfl
    if a.noise_figure_db is not None:
        noise = float(real_noise_variance_w(thermal_noise_power_w(a.bandwidth_hz, a.noise_figure_db)))
    else:
        noise = 1.0 if a.noise_power_w is None else a.noise_power_w  # dwfl.md §1.2: σ_m² = 1
    return Radio(num_nodes=num_nodes, power_w=float(dbm_to_w(a.power_dbm)), noise_power_w=noise,
                 bandwidth_hz=a.bandwidth_hz, fading=a.fading, k_factor=a.k_factor,
                 coherence_rounds=a.coherence_rounds, pathloss=a.pathloss, area_m=a.area_m,
                 carrier_hz=a.carrier_hz, beta=a.beta, c_scale=a.c_scale,
                 digital_orthogonal=a.orthogonal_link == "digital")


def from_config(config: "Config", model: Model, data: FederatedData) -> Dwfl:
    """DWFL as the ``[dwfl]`` and ``[privacy]`` sections of ``config`` say."""
    a = config.dwfl
    smallest = int(data.train.sizes.min())
    if a.batch > smallest:
        node = int(data.train.sizes.argmin())
        raise ConfigError("dwfl.batch", f"{a.batch} is larger than node {node}'s {smallest} training samples")
    # N of the whole run: a board's data holds only its own node, the radio holds every node.
    if config.data.num_nodes < 2:
        raise ConfigError("data.num_nodes", "DWFL needs at least 2 nodes")
    alg = Dwfl(model, radio_from_config(config, config.data.num_nodes), rounds=a.rounds, batch=a.batch, lr=a.lr,
               averaging_rate=a.averaging_rate, gmax=a.gmax, delta=config.privacy.delta, epsilon=a.epsilon, sigma2=a.sigma2, calibration=a.calibration,
               scheme=a.scheme, variant=a.variant, init=a.init, init_std=a.init_std, seed=config.run.seed)
    if data.num_nodes == config.data.num_nodes:
        # Fail now, naming the key, if the target ε cannot be met. (A board holds one node's data
        # and gets each round's channel from the coordinator, which has checked this already.)
        alg.plan(0)
    return alg
