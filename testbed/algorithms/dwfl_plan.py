"""DWFL's round plans (testbed.algorithms.dwfl): what one fading block is and what it costs and
reveals, and how far an honest node's messages can reach in it.

For each fading block (on a graph, each fading and topology block) :class:`RoundPlans` draws the
channel, aligns the powers (eqs. 3–4), calibrates the artificial noise σ² to the per-round target ε
at the worst receiver (eqs. 10–11; Remark IV.1 for orthogonal slots; the server for ota_central),
and derives each node's ledger σ, airtime and energy; from the plan follow the bounds the
coordinator holds honest messages to (:meth:`RoundPlans.model_step_bound`,
:meth:`RoundPlans.signal_norm_bound`).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from channel import (Alignment, analog_link, digital_link, orthogonal_round_airtime_s, shannon_rate_bps,
                     snr_linear)
from testbed.algorithms.base import BYTES_PER_REAL
from testbed.algorithms.bounds import gaussian_norm_bound
from testbed.algorithms.contract import RoundContext, State
from testbed.algorithms.dwfl_channel import (DEFAULT_MIXING, HeardLinks, Radio, RoundChannel, aligned_channel,
                                             heard_links, large_scale_amplitude, receiver_noise_power_w,
                                             round_channel)
from testbed.errors import ConfigError
from testbed.privacy import dwfl as dp
from testbed.topology import Graph, Mixing, Topology

if TYPE_CHECKING:
    from testbed.learning.models import Model


@dataclass(frozen=True)
class RoundPlan:
    """Everything about one fading block that nodes and accountants need (arrays over all N nodes).

    Attributes:
        channel: the block's channel.
        tx: amplitudes of eq. (2) actually used (the alignment; all-ones α, β for orthogonal).
        sigma2: σ², per-entry variance of the artificial noise G_i.
        epsilon: (N,) per-round ε: per receiver (eq. 11, ota_d2d), per sender link (Remark IV.1,
            orthogonal_d2d) or at the server (ota_central, every entry the same).
        privacy_sigma: (N,) normalised noise std at each node's worst receiver (ledger σ); inf for a
            node no one hears and for a sender the alignment left inactive (:func:`inactive_senders`:
            no release, nothing charged).
        airtime_s, energy_j: (N,) each node's radio time in the round and its transmit energy (0 for
            an inactive sender).
    """

    channel: RoundChannel
    tx: Alignment
    sigma2: float
    epsilon: np.ndarray
    privacy_sigma: np.ndarray
    airtime_s: np.ndarray
    energy_j: np.ndarray


def inactive_senders(tx: Alignment) -> np.ndarray:
    """(N,) bool: the senders whose payload goes out at amplitude 0 (eq. 2's sqrt(α_k P_k) = 0: the
    alignment left them inactive, e.g. no traced path to the server point). Such a sender transmits
    zeros (its artificial noise too: β_k = 0), so it releases nothing of its data that round."""
    return tx.signal_amplitude == 0


def _unheard_if_silent(privacy_sigma: np.ndarray, tx: Alignment) -> np.ndarray:
    """``privacy_sigma`` with a silent sender's entry inf: no receiver hears anything of its data, so
    its ledger has no release that round (a planned event would over-count; DESIGN.md "Ledger and
    budgets": the ledger charges what happened)."""
    return np.where(inactive_senders(tx), np.inf, privacy_sigma)


def _min_over_others(values: np.ndarray) -> np.ndarray:
    """(N,) min_{i≠j} values[i] for every j (the smallest, or the second smallest for its holder)."""
    order = np.argsort(values, kind="stable")
    out = np.full(values.shape, values[order[0]])
    out[order[0]] = values[order[1]]
    return out


class RoundPlans:
    """The plans of a DWFL algorithm's rounds, drawn and calibrated once per block (a mixin of
    :class:`testbed.algorithms.dwfl.Dwfl`, whose settings it reads)."""

    model: "Model"
    radio: Radio
    topology: Topology
    on_graph: bool
    seed: int
    scheme: str
    calibration: str
    epsilon: float | None
    sigma2_fixed: float | None
    lr: float
    gmax: float
    eta: float
    delta: float
    num_nodes: int
    _amplitude: np.ndarray | None
    _given_h: dict[int, np.ndarray]
    _plans: dict[Any, RoundPlan]

    def plan(self, round_index: int) -> RoundPlan:
        """The :class:`RoundPlan` of the round's fading block (drawn and calibrated once per block;
        on a graph once per fading block and topology block)."""
        key = self._plan_key(round_index)
        if key not in self._plans:
            self._plans[key] = self._make_plan(round_index)
        return self._plans[key]

    def _plan_key(self, round_index: int) -> Any:
        """What a plan is drawn once for: the fading block (and on a graph the topology's block)."""
        block = self.radio.schedule.block_index(round_index)
        return (block, self.topology.schedule.block_index(round_index)) if self.on_graph else block

    def graph_of(self, round_index: int) -> Graph | None:
        """The round's :class:`testbed.topology.Graph`, or None on the complete graph (never built)."""
        return self.topology.graph(round_index) if self.on_graph else None

    def mixing(self, round_index: int) -> Mixing:
        """W of the round's graph under ``[topology] mixing`` (auto: :data:`DEFAULT_MIXING`)."""
        return self.topology.mixing(round_index, DEFAULT_MIXING)

    def links(self, round_index: int, senders: Sequence[int]) -> HeardLinks | None:
        """Whom each receiver heard when ``senders`` transmitted, with its weights; None on the
        complete graph."""
        return heard_links(self.mixing(round_index), senders) if self.on_graph else None

    def channel_tensors(self, ctx: RoundContext) -> dict[str, np.ndarray]:
        """What every node and the channel need for the round besides the signals: the block's
        channel h, (N,) complex128. The coordinator sends it, so a board needs no Sionna to draw it
        (a real radio would estimate it from pilots)."""
        return {"channel_h": self.plan(ctx.round_index).channel.h}

    def use_channel(self, downlink: Mapping[str, np.ndarray], round_index: int) -> None:
        """Use the channel h the coordinator sent with a node's downlink (:meth:`channel_tensors`)."""
        self.accept_channel(round_index, np.asarray(downlink["channel_h"]))

    def accept_channel(self, round_index: int, h: np.ndarray) -> None:
        """Use the channel the coordinator sent (:meth:`channel_tensors`) for the round's block."""
        block = self.radio.schedule.block_index(round_index)
        known = self._plans.get(self._plan_key(round_index))
        if known is None or not np.array_equal(known.channel.h, h):
            self._plans = {k: v for k, v in self._plans.items() if (k[0] if self.on_graph else k) != block}
            self._given_h[block] = np.array(h)

    def _round_channel(self, round_index: int) -> RoundChannel:
        block = self.radio.schedule.block_index(round_index)
        r = self.radio
        if block in self._given_h:
            # Kept for the block (on a graph a topology block may start inside it), older ones dropped.
            self._given_h = {b: h for b, h in self._given_h.items() if b >= block}
            return aligned_channel(r, block, self._given_h[block])
        if self._amplitude is None:
            self._amplitude = large_scale_amplitude(r, self.seed)
        return round_channel(r, self.seed, round_index, self._amplitude)

    def _make_plan(self, round_index: int) -> RoundPlan:
        n, r = self.num_nodes, self.radio
        rc = self._round_channel(round_index)
        al, g = rc.alignment, rc.gains
        p, sm = al.power_w, r.noise_power_w
        orth = self.scheme == "orthogonal_d2d"
        graph = self.graph_of(round_index)
        link_noise = 0.0 if orth and r.digital_orthogonal else sm  # what the privacy noise includes
        cal_noise = link_noise if self.calibration == "with_channel_noise" else 0.0
        if orth:  # each sender heard alone on its link: β = 1 in the bound, no alignment constant
            setting = dp.RoundSetting(g, p, 1.0, link_noise, self.lr, self.gmax, self.delta)
        else:
            setting = dp.RoundSetting(g, p, al.beta, sm, self.lr, self.gmax, self.delta, c=al.c, graph=graph)
        # Orthogonal: model and noise at full power on a link the alignment found (a sender it left
        # inactive, gain 0, has no link to equalise: it stays silent as over the air).
        on = al.active.astype(np.float64)
        tx = dataclasses.replace(al, alpha=on, beta=on) if orth else al
        if self.sigma2_fixed is not None:
            sigma2 = self.sigma2_fixed
        elif self.epsilon is None:
            sigma2 = 0.0
        elif orth:
            sigma2 = dp.calibrate_sigma2_orthogonal(self.epsilon, dataclasses.replace(setting, noise_power_w=cal_noise))
        elif self.scheme == "ota_d2d":
            sigma2 = dp.calibrate_sigma2(self.epsilon, setting,
                                         count_channel_noise=self.calibration == "with_channel_noise")
        else:
            sigma2 = dp.calibrate_sigma2_central(self.epsilon, dataclasses.replace(setting, noise_power_w=cal_noise))
        if not math.isfinite(sigma2):
            raise ConfigError("dwfl.epsilon", f"{self.epsilon} cannot be met in round {round_index}: a receiver "
                              "hears no artificial noise (every other sender has beta = 0); lower dwfl.c_scale")
        if orth:
            with np.errstate(divide="ignore", invalid="ignore"):  # a silent sender's: masked below
                eps = np.where(al.active, dp.orthogonal_epsilon(setting, sigma2, numerator="paper"), 0.0)
                var = sigma2 + link_noise / (g**2 * p)
            if graph is not None:  # a sender with no neighbour is heard by no one
                eps, var = np.where(graph.degrees > 0, eps, 0.0), np.where(graph.degrees > 0, var, np.inf)
        elif self.scheme == "ota_d2d":
            eps = dp.epsilon_per_receiver(setting, sigma2)  # eq. (11), over N(i) on a graph
            var = self._worst_receiver(dp.receiver_noise_variance(g, p, al.beta, sigma2, sm, graph) / al.c**2,
                                       graph)  # eq. (10)
        else:
            eps = np.full(n, dp.central_epsilon(setting, sigma2))
            var = np.full(n, (float(dp.artificial_noise_powers(g, p, al.beta).sum()) * sigma2 + sm) / al.c**2)
        airtime, energy = self._link_cost(rc)
        return RoundPlan(channel=rc, tx=tx, sigma2=float(sigma2), epsilon=np.asarray(eps, dtype=float),
                         privacy_sigma=_unheard_if_silent(np.sqrt(var), tx), airtime_s=airtime, energy_j=energy)

    def _link_cost(self, rc: RoundChannel) -> tuple[np.ndarray, np.ndarray]:
        """(N,) radio time of each node in the round (transmitting or listening) and (N,) transmit energy:
        none for a sender the alignment left inactive (it transmits zeros; it still listens)."""
        n, r, d = self.num_nodes, self.radio, self.model.num_params
        p, active = rc.alignment.power_w, rc.alignment.active
        if self.scheme == "orthogonal_d2d" and r.digital_orthogonal:
            # One slot per sender at its Shannon rate; complex noise power 2σ_m² (σ_m² per real rail).
            # A silent sender (no link: gain 0, rate 0) has no slot.
            links = [digital_link(BYTES_PER_REAL * 8 * d, p[k], rc.gains[k] ** 2, 2 * r.noise_power_w,
                                  r.bandwidth_hz) if active[k] else None for k in range(n)]
            round_s = orthogonal_round_airtime_s([c.airtime_s for c in links if c is not None])
            return np.full(n, round_s), np.array([0.0 if c is None else c.energy_j for c in links])
        costs = [analog_link(d, r.bandwidth_hz, p[k]) for k in range(n)]  # d channel uses each
        slot = np.array([c.airtime_s for c in costs])
        slots_per_round = {"ota_d2d": 1, "ota_central": 2, "orthogonal_d2d": n}[self.scheme]
        return slots_per_round * slot, np.where(active, [c.energy_j for c in costs], 0.0)

    def link_rate_bps(self, nodes: Sequence[int]) -> np.ndarray:
        """Each of ``nodes``' link rate, bit/s: the Shannon rate B·log2(1 + SNR)
        (channel.shannon_rate_bps) at its aligned power and gain of the first fading block, complex
        noise 2σ_m² (as the digital orthogonal link's airtime, :meth:`_link_cost`): the rate an
        emulated host of these nodes is shaped to with ``links.rate_bps = "channel"``."""
        rc = self.plan(0).channel
        snr = snr_linear(rc.alignment.power_w, rc.gains**2, 2 * self.radio.noise_power_w)
        return shannon_rate_bps(self.radio.bandwidth_hz, snr)[np.asarray(nodes, dtype=np.int64)]

    @staticmethod
    def _worst_receiver(per_receiver: np.ndarray, graph) -> np.ndarray:
        """(N,) for every sender j, min over its receivers i of ``per_receiver[i]``: all i ≠ j on the
        complete graph, i ∈ N(j) on a graph (inf for a node no one hears)."""
        return _min_over_others(per_receiver) if graph is None else dp.min_over_neighbours(per_receiver, graph)

    def privacy_sigma(self, round_index: int, senders: Sequence[int]) -> np.ndarray:
        """(N,) each node's normalised noise std at its worst receiver when ``senders`` transmit
        (the ledger σ; eq. 10 with the sum over the senders only: a silent node adds no noise; on
        a graph the sum over each receiver's neighbours that transmitted, the worst over the
        sender's neighbours; inf for a node no one hears and for a sender the alignment left
        inactive, :func:`inactive_senders`, which releases nothing). Orthogonal slots do not
        depend on who else transmitted."""
        plan = self.plan(round_index)
        if self.scheme == "orthogonal_d2d" or len(senders) == self.num_nodes:
            return plan.privacy_sigma
        al, g = plan.channel.alignment, plan.channel.gains
        heard = np.zeros(self.num_nodes)
        heard[np.asarray(senders, dtype=np.int64)] = 1.0
        beta = al.beta * heard  # a silent sender's artificial noise reaches nobody
        sm = self.radio.noise_power_w
        if self.scheme == "ota_d2d":
            graph = self.graph_of(round_index)
            var = self._worst_receiver(dp.receiver_noise_variance(g, al.power_w, beta, plan.sigma2, sm, graph)
                                       / al.c**2, graph)
        else:
            var = np.full(self.num_nodes, (float(dp.artificial_noise_powers(g, al.power_w, beta).sum())
                                           * plan.sigma2 + sm) / al.c**2)
        return _unheard_if_silent(np.sqrt(var), plan.tx)

    def model_step_bound(self, state: State, ctx: RoundContext) -> float:
        """How far an honest node's new model can be from the one it was sent in round ``ctx``.

        With x_k' = x_k − γ g_k (‖γ g_k‖ <= γ g_max) and S >= 2 senders, eq. (7) gives (variant B;
        variant A takes the channel noise off, which only shrinks it)

        - ota_d2d: x_i'' − x_i = −γ g_i + η (mean_{k≠i} x_k' − x_i') + η (−a_i G_i
          + Σ_{k≠i} a_k G_k / (S − 1) + m_i / (c (S − 1))), a_k = |h_k| sqrt(β_k P_k)/c;
        - orthogonal_d2d: the same with a_k = 1 and the per-link noise n_i for m_i/c;
        - ota_central: x_i'' − x_i = −Σ_k (γ g_k + a_k G_k)/S − m/(c S) (one model: no consensus term).

        The consensus term is at most η (max_{i,k} ‖x_k − x_i‖ + 2γ g_max) <= η (2 max_k ‖x_k − x̄‖
        + 2γ g_max) over the round's expected nodes (the coordinator holds their models); the noise is
        Gaussian with per-entry variance at most η² (2σ² max_k a_k² + σ_m²/c²) (central: without
        η², orthogonal: 2σ² + the largest receiver's link noise), bounded at its norm tail."""
        plan = self.plan(ctx.round_index)
        rc, al = plan.channel, plan.channel.alignment
        ids = np.asarray(ctx.expected if ctx.expected else range(self.num_nodes), dtype=np.int64)
        step = self.lr * self.gmax
        if self.scheme == "ota_central":
            consensus = 0.0
        else:
            models = state["models"][ids]
            spread = 2.0 * float(np.linalg.norm(models - models.mean(axis=0), axis=1).max())
            consensus = self.eta * (spread + 2.0 * step)
        if self.scheme == "orthogonal_d2d":
            link = float(receiver_noise_power_w(self.scheme, rc, self.radio, range(self.num_nodes)).max())
            variance = self.eta**2 * (2.0 * plan.sigma2 + link)
        else:
            a_max_sq = float((rc.gains**2 * al.beta * al.power_w).max()) / al.c**2
            variance = 2.0 * plan.sigma2 * a_max_sq + self.radio.noise_power_w / al.c**2
            if self.scheme == "ota_d2d":
                variance *= self.eta**2
        return step + consensus + gaussian_norm_bound(math.sqrt(variance), self.model.num_params)

    def signal_norm_bound(self, state: State, ctx: RoundContext) -> float:
        """The largest norm an honest transmit signal of round ``ctx`` can have: eq. (2) under the
        power constraint, s_i = sqrt(α_i P_i) u_i + sqrt(β_i P_i) G_i with α_i + β_i <= 1 and
        P_i <= P, so ‖s_i‖ <= sqrt(α_i P_i) ‖u_i‖ + sqrt(β_i P_i) ‖G_i‖, where the payload u_i is
        x_i − γ g_i (‖·‖ <= ‖x_i‖ + γ g_max, x_i the model the node was sent) or, for ota_central,
        γ g_i (<= γ g_max), and ‖G_i‖ <= σ (sqrt(P) + t) but with probability HONEST_FAILURE
        (testbed.algorithms.bounds). The maximum over the round's expected senders."""
        plan = self.plan(ctx.round_index)
        ids = np.asarray(ctx.expected if ctx.expected else range(self.num_nodes), dtype=np.int64)
        step = self.lr * self.gmax
        if self.scheme == "ota_central":
            payload = np.full(len(ids), step)
        else:
            payload = np.linalg.norm(state["models"][ids], axis=1) + step
        noise = gaussian_norm_bound(math.sqrt(plan.sigma2), self.model.num_params)
        power = plan.tx.power_w[ids]
        bound = np.sqrt(plan.tx.alpha[ids] * power) * payload + np.sqrt(plan.tx.beta[ids] * power) * noise
        return float(bound.max())
