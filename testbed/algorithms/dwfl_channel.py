"""The channel side of a DWFL round: each round's channel state, and what every receiver hears
(:class:`DwflChannel`, the algorithm's channel half).

This is what the channel emulator runs (in-process in sim; a separate process over MQTT later):
given the nodes' transmit signals and the round's channel, it returns each receiver's received
signal. Every draw comes from a stream keyed by the run's seed, so a node, the emulator and a sim
run all derive the same channel without exchanging it:

- small-scale fading of block b: ``stream(seed, GLOBAL, b, CHANNEL)`` (:class:`channel.FadingSchedule`
  maps a round to its block: time-invariant, every round, every B rounds);
- node positions and large-scale fading (optional): ``stream(seed, GLOBAL, -1, CHANNEL)``;
- or, with ``pathloss = "scene"``, each sender's coefficient ray traced to the scene's server point
  in the block (testbed.topology.scene: positions from the SCENE streams, traces from the cache);
- receiver i's channel noise in round r: ``stream(seed, i, r, CHANNEL)``; the parameter server of
  the centralised scheme is receiver ``num_nodes`` (an id no node has).

Schemes (dwfl.md §3.4, §6.3; the physics is :mod:`channel`):

- ``"ota_d2d"`` (DWFL, eq. 1): one full-duplex analog slot, v_i = Σ_{k≠i} g_k s_k + m_i,
  O(N·d) (:func:`channel.d2d_superpose`); output in sqrt(W).
- ``"orthogonal_d2d"``: every node has its own slot; receiver i equalises each link j → i by its
  amplitude g_j sqrt(P_j) and sums them: u_i = Σ_{k≠i} s_k / sqrt(P_k) + n_i. Analog links: n_i is
  the sum of the N−1 per-link noises m_{i,j} / (g_j sqrt(P_j)), drawn as one Gaussian of the summed
  variance σ_m² Σ_{j≠i} 1/(g_j² P_j) (the same distribution in O(N·d) instead of O(N²·d));
  digital links decode without error (n_i = 0). Output in model units.
- On a graph (``[topology]`` other than complete; :class:`HeardLinks`), receiver i hears only its
  neighbours N(i): ``"ota_d2d"`` v_i = Σ_{k∈N(i)} g_k s_k + m_i (eq. 1 over N(i)), and
  ``"orthogonal_d2d"`` u_i = Σ_{k∈N(i)} w_ik (s_k / sqrt(P_k) + per-link noise), weighted by the
  mixing row of i (uniform or Metropolis–Hastings) over the neighbours that transmitted; both one
  sparse product, O(E·d) (:func:`channel.sparse_superpose`). The power alignment of eqs. (3)–(4)
  stays global, c = min_j |h_j| sqrt(P_j) over all nodes: a sender broadcasts one amplitude to all
  of its receivers (the paper's one gain per sender), so it cannot be aligned per neighbourhood.
- ``"ota_central"`` (Seif et al.): every node to the server, y = Σ_k g_k s_k + m
  (:func:`channel.uplink_superpose`), broadcast back unchanged to every node; output in sqrt(W).

Example::

    >>> import numpy as np
    >>> radio = Radio(num_nodes=3, power_w=1.0, noise_power_w=0.0, fading="none", c_scale=0.5)
    >>> rc = round_channel(radio, seed=0, round_index=0)
    >>> rc.alignment.c, rc.gains.tolist()
    (0.5, [1.0, 1.0, 1.0])
    >>> propagate("ota_d2d", np.eye(3), rc, radio, seed=0, round_index=0).tolist()
    [[0.0, 1.0, 1.0], [1.0, 0.0, 1.0], [1.0, 1.0, 0.0]]
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping, Protocol, Sequence

import numpy as np

from channel import (
    Alignment,
    FadingSchedule,
    align_power,
    d2d_superpose,
    draw_fading,
    free_space_pathloss_db,
    uplink_superpose,
)
from channel import sparse_superpose
from channel.pathloss import pathloss_3gpp
from testbed.algorithms.contract import RoundContext, State, TensorSpec
from testbed.errors import ConfigError
from testbed.streams.rng import GLOBAL, Purpose, node_streams, stream
from testbed.topology import Graph, Mixing, Topology, TopologySection
from testbed.util.parallel import ROWS_IN_CACHE, split_work

SCHEMES = ("ota_d2d", "orthogonal_d2d", "ota_central")
PATHLOSS_KINDS = ("none", "free_space", "umi", "uma", "scene")
#: Height of the reference receiver the per-sender path loss is measured to, m (TR 38.901 BS
#: heights for UMi/UMa; device height for free space).
_REFERENCE_HEIGHT_M = {"free_space": 1.5, "umi": 10.0, "uma": 25.0}
_DEVICE_HEIGHT_M = 1.5

#: DWFL's mixing rule for ``[topology] mixing = "auto"``: over the air a receiver hears one sum and
#: can only weight it as a whole (uniform 1/d_i, on the complete graph eq. (7)'s (1 − I)/(N − 1)).
DEFAULT_MIXING = "uniform"

__all__ = ["SCHEMES", "DEFAULT_MIXING", "radio_from_section", "topology_from_sections", "PATHLOSS_KINDS", "Radio", "RoundChannel", "HeardLinks", "heard_links", "round_channel",
           "aligned_channel", "propagate", "receiver_noise_power_w", "channel_noise_row", "large_scale_amplitude"]


@dataclass(frozen=True)
class Radio:
    """The radio of a DWFL run, SI units.

    Attributes:
        num_nodes: N, all nodes of the run.
        power_w: maximum transmit power P_k of every node, W.
        noise_power_w: σ_m², per-entry variance of a receiver's real channel noise, W.
        bandwidth_hz: bandwidth and analog symbol rate, Hz.
        fading: ``"rayleigh"``, ``"rician"`` or ``"none"`` (:func:`channel.draw_fading`).
        k_factor: Rician K, linear.
        coherence_rounds: ``None``: time-invariant (the paper's model); B: redrawn every B rounds.
        pathloss: ``"none"`` or the per-sender large-scale gain toward the centre of the area:
            ``"free_space"`` (Friis), ``"umi"``/``"uma"`` (TR 38.901 via Sionna, with shadowing).
        area_m: side of the square the nodes are dropped in (uniformly, once), m.
        carrier_hz: carrier frequency, Hz.
        scene: with ``pathloss = "scene"``, the testbed.topology.scene.SceneKeys of the run's scene:
            each sender's channel is the narrowband coefficient ray traced to the server point of
            the scene (times the fading, if any), re-traced each coherence block.
        beta: fraction of the power left after alignment that goes to artificial noise (eq. 2).
        c_scale: c as a fraction of the eq. (4) maximum (< 1 leaves the weakest node noise power).
        digital_orthogonal: the orthogonal links decode without error (digital baseline).
    """

    num_nodes: int
    power_w: float
    noise_power_w: float
    bandwidth_hz: float = 1e6
    fading: str = "rayleigh"
    k_factor: float = 3.0
    coherence_rounds: int | None = None
    pathloss: str = "none"
    area_m: float = 100.0
    carrier_hz: float = 2.4e9
    beta: float = 1.0
    c_scale: float = 1.0
    digital_orthogonal: bool = False
    scene: Any = None

    @property
    def schedule(self) -> FadingSchedule:
        return FadingSchedule(self.coherence_rounds)


@dataclass(frozen=True)
class RoundChannel:
    """The channel of one fading block, the same for every node and the emulator.

    Attributes:
        block: the fading block (rounds sharing this draw).
        h: (N,) complex128 channel of every sender (large-scale amplitude included).
        alignment: power alignment of eqs. (2)–(4) on ``h`` (:func:`channel.align_power`).
        gains: (N,) real effective gains g_k = |h_k| after phase pre-compensation.
    """

    block: int
    h: np.ndarray
    alignment: Alignment
    gains: np.ndarray


@dataclass(frozen=True, eq=False)
class HeardLinks:
    """Whom each receiver heard in a round on a graph, and the weight it gives each link.

    Attributes:
        graph: the round's graph.
        weights: (2E,) w_ik aligned with ``graph.indices``: the mixing row of receiver i over the
            neighbours that transmitted: uniform 1/d_i^S, or Metropolis–Hastings W_ik with a silent
            neighbour's weight left to i itself (0 here).
        count: (N,) d_i^S, how many of i's neighbours transmitted.
        weight_sum: (N,) Σ_k w_ik (uniform: 1 where i heard someone, else 0).
    """

    graph: Graph
    weights: np.ndarray
    count: np.ndarray
    weight_sum: np.ndarray


def heard_links(mixing: Mixing, senders: Sequence[int]) -> HeardLinks:
    """The :class:`HeardLinks` of ``mixing``'s graph when ``senders`` transmitted. O(E), no loop.

    Example::

        >>> from testbed.topology import Graph, mixing_weights
        >>> ring = Graph.from_edges(4, [(0, 1), (1, 2), (2, 3), (3, 0)])
        >>> h = heard_links(mixing_weights(ring, "uniform"), [0, 1, 2])
        >>> h.count.tolist(), h.weights[:2].tolist(), h.weight_sum.tolist()
        ([1.0, 2.0, 1.0, 2.0], [1.0, 0.0], [1.0, 1.0, 1.0, 1.0])
    """
    g = mixing.graph
    sent = np.zeros(g.num_nodes)
    sent[np.asarray(senders, dtype=np.int64)] = 1.0
    on = sent[g.indices]
    count = np.bincount(g.rows, weights=on, minlength=g.num_nodes)
    if mixing.rule == "uniform":
        with np.errstate(divide="ignore", invalid="ignore"):
            weights = on / count[g.rows]
        weights[on == 0] = 0.0
    else:
        weights = mixing.weights * on
    return HeardLinks(g, weights, count, np.bincount(g.rows, weights=weights, minlength=g.num_nodes))


def large_scale_amplitude(radio: Radio, seed: int) -> np.ndarray:
    """(N,) amplitude gain of every sender toward the centre of the area (1 without path loss).

    The paper's model has one gain per sender, identical toward every receiver (dwfl.md §1.2); with
    positions that holds for a common reference point, so the gain is measured to the centre of the
    area (where the server of ``ota_central`` stands). Positions: uniform in the square, once. In a
    scene: |h| of each sender's coefficient traced to the scene's server point in block 0.

    Example::

        >>> large_scale_amplitude(Radio(num_nodes=2, power_w=1.0, noise_power_w=1.0), 0).tolist()
        [1.0, 1.0]
    """
    if radio.pathloss == "none":
        return np.ones(radio.num_nodes)
    if radio.pathloss == "scene":  # block 0's: round_channel reads each block's own
        return np.abs(radio.scene.site(radio.num_nodes, seed).server_coefficient(0))
    rng = stream(seed, GLOBAL, -1, Purpose.CHANNEL)
    xy = rng.uniform(-radio.area_m / 2, radio.area_m / 2, size=(radio.num_nodes, 2))
    pos = np.column_stack([xy, np.full(radio.num_nodes, _DEVICE_HEIGHT_M)])
    ref = np.array([[0.0, 0.0, _REFERENCE_HEIGHT_M[radio.pathloss]]])
    if radio.pathloss == "free_space":
        dist = np.maximum(np.linalg.norm(pos - ref, axis=1), 1.0)  # far field: at least 1 m
        return 10.0 ** (-free_space_pathloss_db(dist, radio.carrier_hz) / 20.0)
    if radio.pathloss in ("umi", "uma"):
        return pathloss_3gpp(pos, ref, radio.carrier_hz, radio.pathloss, rng=rng).amplitude[0]
    raise ValueError(f"unknown pathloss {radio.pathloss!r}; expected one of {PATHLOSS_KINDS}")


def round_channel(radio: Radio, seed: int, round_index: int, amplitude: np.ndarray | None = None) -> RoundChannel:
    """The channel of ``round_index``: fading of its block × large-scale amplitude, then alignment.

    Args:
        radio: the run's radio.
        seed: the run's seed.
        round_index: r >= 0.
        amplitude: (N,) large-scale amplitude (:func:`large_scale_amplitude`), to avoid redrawing it.

    Returns:
        :class:`RoundChannel`.
    """
    block = radio.schedule.block_index(round_index)
    fading = draw_fading(radio.fading, (radio.num_nodes,), stream(seed, GLOBAL, block, Purpose.CHANNEL),
                         k_factor=radio.k_factor)
    if radio.pathloss == "scene":  # the block's traced coefficient to the server, its phase included
        return aligned_channel(radio, block, fading * radio.scene.site(radio.num_nodes, seed).server_coefficient(block))
    amp = large_scale_amplitude(radio, seed) if amplitude is None else amplitude
    return aligned_channel(radio, block, fading * amp)


@dataclass(frozen=True)
class RadioView:
    """What the watch page draws of the channel (a testbed.algorithms.contract.ChannelView): each
    node's effective gain and received SNR, drawn as the run draws them (from its seed; the
    coordinator sends the same h)."""

    radio: Radio
    seed: int

    def block_of(self, round_index: int) -> int:
        return self.radio.schedule.block_index(round_index)

    def links(self, round_index: int) -> tuple[np.ndarray, np.ndarray]:
        rc = round_channel(self.radio, self.seed, round_index)
        # Received SNR of sender k at full power: g_k² P_k / σ_m² (σ_m² per real entry).
        return rc.gains, rc.gains**2 * rc.alignment.power_w / self.radio.noise_power_w


def aligned_channel(radio: Radio, block: int, h: np.ndarray) -> RoundChannel:
    """The :class:`RoundChannel` of a block whose channel ``h`` ((N,) complex) is known: the
    alignment of eqs. (3)–(4) on it."""
    al = align_power(h, radio.power_w, beta=radio.beta, c_scale=radio.c_scale)
    return RoundChannel(block=block, h=h, alignment=al, gains=al.effective_gain())


def receiver_noise_power_w(scheme: str, rc: RoundChannel, radio: Radio, receivers: Sequence[int],
                           links: HeardLinks | None = None) -> np.ndarray:
    """(M,) per-entry variance of the channel noise in each listed receiver's output of :func:`propagate`.

    ``ota_d2d``/``ota_central``: σ_m² (W). ``orthogonal_d2d``: σ_m² Σ_{j≠i} 1/(g_j² P_j) in model
    units (0 for digital links); on a graph (``links``) σ_m² Σ_{j∈N(i)} w_ij²/(g_j² P_j); the sums
    over the senders the alignment left active (a silent one's empty slot adds nothing).
    """
    rx = np.asarray(receivers, dtype=np.int64)
    if scheme == "orthogonal_d2d":
        if radio.digital_orthogonal:
            return np.zeros(len(rx))
        with np.errstate(divide="ignore"):  # a silent sender's slot (gain 0) is not listened to
            inv = np.where(rc.alignment.active, 1.0 / (rc.gains**2 * rc.alignment.power_w), 0.0)
        if links is not None:
            g = links.graph
            per_rx = np.bincount(g.rows, weights=links.weights**2 * inv[g.indices], minlength=g.num_nodes)
            return radio.noise_power_w * per_rx[rx]
        return radio.noise_power_w * (inv.sum() - inv[rx])
    return np.full(len(rx), radio.noise_power_w)


def _noise_stream(scheme: str, radio: Radio, receiver: int, seed: int, round_index: int) -> np.random.Generator:
    # The server of ota_central is receiver N: an id no node has, so no stream is shared.
    node = radio.num_nodes if scheme == "ota_central" else receiver
    return stream(seed, node, round_index, Purpose.CHANNEL)


def propagate(
    scheme: str,
    signals: np.ndarray,
    rc: RoundChannel,
    radio: Radio,
    seed: int,
    round_index: int,
    out: np.ndarray | None = None,
    links: HeardLinks | None = None,
) -> np.ndarray:
    """What every receiver hears in one round: a pure function of the transmit signals and channel.

    Args:
        scheme: one of SCHEMES.
        signals: (N, d) real transmit payloads of all N nodes, sqrt(W) (row k: node k).
        rc: the round's channel.
        radio: the run's radio.
        seed, round_index: key the receivers' noise streams.
        out: optional (N, d) output for the D2D schemes; may be ``signals`` (overwritten in place).
            Not used on a graph, whose sparse product returns a new array.
        links: the round's graph and link weights (:func:`heard_links`); None: the complete graph
            (the paper's, the O(N·d) total-minus-own path).

    Returns:
        (N, d) received signals, row i for node i: v_i (ota_d2d, sqrt(W)), the equalised sum u_i
        (orthogonal_d2d, model units), or the server's y broadcast to every node (ota_central,
        sqrt(W); a read-only view, every row the same).
    """
    n = radio.num_nodes
    if signals.shape[0] != n:
        raise ValueError(f"signals must have one row per node ({n}), got {signals.shape[0]}")
    if scheme == "ota_central":
        if links is not None:
            raise ValueError("ota_central needs the complete graph: every node reaches the server")
        y = uplink_superpose(signals, rc.gains, radio.noise_power_w, _noise_stream(scheme, radio, n, seed, round_index))
        return np.broadcast_to(y, signals.shape)
    if scheme == "ota_d2d":
        gains = rc.gains  # eq. (1): v_i = Σ_{k≠i} |h_k| s_k + m_i
    elif scheme == "orthogonal_d2d":
        gains = 1.0 / np.sqrt(rc.alignment.power_w)  # slot k equalised: g_k s_k / (g_k sqrt(P_k))
    else:
        raise ValueError(f"unknown scheme {scheme!r}; expected one of {SCHEMES}")
    noise = receiver_noise_power_w(scheme, rc, radio, range(n), links)
    if links is None:
        gens = node_streams(seed, range(n), round_index, Purpose.CHANNEL)  # _noise_stream of each receiver, in order
        return d2d_superpose(signals, gains, noise, gens, out=out)
    g = links.graph
    # ota_d2d: every neighbour at its gain (the receiver divides by c·d_i^S); orthogonal: each link
    # equalised and weighted by the receiver's mixing row. Silent senders' rows are zero.
    weights = gains[g.indices] if scheme == "ota_d2d" else links.weights * gains[g.indices]
    adjacency = g.adjacency(weights)
    received = np.empty_like(signals, dtype=np.float64)
    noisy = bool(np.any(noise > 0))

    def receivers(lo: int, hi: int) -> None:
        # A few receivers at a time, their noise added while their sums are in cache; each row is
        # its receiver's own sum and stream, so the values do not depend on the split.
        gens = node_streams(seed, range(lo, hi), round_index, Purpose.CHANNEL) if noisy else None
        for a in range(lo, hi, ROWS_IN_CACHE):
            b = min(a + ROWS_IN_CACHE, hi)
            sparse_superpose(signals, adjacency[a:b], noise[a:b], gens, out=received[a:b])

    split_work(n, receivers, numbers=(adjacency.nnz + n) * signals.shape[1])
    return received


def channel_noise_row(scheme: str, rc: RoundChannel, radio: Radio, receiver: int, size: int, seed: int,
                      round_index: int, links: HeardLinks | None = None) -> np.ndarray:
    """(size,) the channel noise that :func:`propagate` added for ``receiver``, redrawn from its stream.

    The receiver cannot know it; variant A of the update (dwfl.md §3.4, the literal eq. 7) subtracts
    it anyway, which this oracle makes possible in emulation.
    """
    var = float(receiver_noise_power_w(scheme, rc, radio, [receiver], links)[0])
    if var == 0:
        return np.zeros(size)
    return np.sqrt(var) * _noise_stream(scheme, radio, receiver, seed, round_index).standard_normal(size)


def radio_from_section(a: Any, num_nodes: int) -> Radio:
    """The :class:`Radio` of a ``[dwfl]`` section (its RadioSection keys in SI units, σ_m² fixed or
    thermal) with DWFL's own radio fields."""
    return a.radio(num_nodes, beta=a.beta, c_scale=a.c_scale, digital_orthogonal=a.orthogonal_link == "digital")


def topology_from_sections(sections: dict[str, Any], num_nodes: int, seed: int) -> Topology:
    """The run's :class:`Topology` from ``[topology]`` (absent: complete) with the ``[dwfl]`` radio's
    link budget (random_geometric: the free-space range at the nodes' power and noise, in the
    radio's area). Raises ConfigError naming the key.

    Every process draws it from the config and seed alone (testbed.topology is numpy only), and a
    node over MQTT learns who of its neighbours sent from the received message's ``senders``. This
    was chosen over sending each node its mixing row in the downlink: nothing more travels, the
    coordinator cannot tell a node a neighbourhood other than the config's, and the cost is O(E) per
    topology block on each node. kind = "file" then needs the edge list on every node's host, at
    the path the experiment file gives."""
    a = sections["dwfl"]
    section = sections.get("topology") or TopologySection()
    topology = Topology(section, num_nodes, seed, a.link_budget())
    if topology.is_complete:
        return topology
    if a.scheme == "ota_central":
        raise ConfigError("topology.kind", 'ota_central needs kind = "complete": every node reaches the server')
    if a.scheme == "ota_d2d" and topology.resolved_mixing(DEFAULT_MIXING) != "uniform":
        raise ConfigError("topology.mixing", "ota_d2d needs uniform mixing: a receiver hears one superposition "
                                             "and can weight only the sum; metropolis_hastings needs separate "
                                             "links (scheme = \"orthogonal_d2d\")")
    return topology


class ChannelOwner(Protocol):
    """What :class:`DwflChannel` reads of the algorithm it is the half of
    (:class:`testbed.algorithms.dwfl.Dwfl`, named so here: the algorithm imports this module)."""

    radio: Radio
    scheme: str
    topology: Topology
    model: Any
    _plans: dict[Any, Any]

    def _plan_key(self, round_index: int) -> Any: ...

    def plan(self, round_index: int) -> Any: ...

    def signal_norm_bound(self, state: State, ctx: RoundContext) -> float: ...


class DwflChannel:
    """The channel half of DWFL and its baselines (:class:`testbed.algorithms.contract.ChannelHalf`):
    what every receiver hears, (N, P) signals → (N, P) received, by
    :func:`testbed.algorithms.dwfl_channel.propagate` on the round's channel h.

    Built from the radio alone (no data, no model): the channel emulator makes one with
    :func:`channel_from_sections`.
    """

    #: An exchange needs two senders: with fewer, nobody hears a peer and the round has no exchange.
    min_senders = 2

    def __init__(self, owner: ChannelOwner | None = None, *, radio: Radio | None = None, scheme: str | None = None,
                 topology: Topology | None = None):
        self._owner = owner
        self.radio = radio if radio is not None else owner.radio  # type: ignore[union-attr]
        self.scheme = scheme if scheme is not None else owner.scheme  # type: ignore[union-attr]
        self.topology = topology if topology is not None else getattr(owner, "topology", None)

    def signal_spec(self) -> TensorSpec:
        """One node's transmit signal, (P,) real, sqrt(W) (known to the full algorithm; the channel
        emulator gets it with each round's notice)."""
        if self._owner is None:
            raise ValueError("the signal size is the model's: build the channel from the algorithm")
        return TensorSpec((self._owner.model.num_params,))

    def round_signal_spec(self, state: State, ctx: RoundContext) -> TensorSpec:
        """:meth:`signal_spec` with the power bound no honest signal of round ``ctx`` exceeds, from
        ``state`` (the coordinator's): :meth:`Dwfl.signal_norm_bound`
        (testbed.algorithms.contract.round_signal_spec)."""
        assert self._owner is not None  # signal_spec's own check
        return dataclasses.replace(self.signal_spec(), max_norm=self._owner.signal_norm_bound(state, ctx))

    def superpose(self, signals: np.ndarray, channel: Mapping[str, np.ndarray], ctx: RoundContext,
                  out: np.ndarray | None = None) -> np.ndarray:
        """(b) eq. (1): (N, P) signals (silent rows zero) on the channel ``channel["channel_h"]``
        (N,) → (N, P) each receiver's signal; ``out`` may be ``signals`` (on a graph a new array is
        returned and ``signals`` stays: the receivers' update reads their own)."""
        block = self.radio.schedule.block_index(ctx.round_index)
        owner = self._owner
        if owner is not None and owner._plan_key(ctx.round_index) in owner._plans:
            rc = owner.plan(ctx.round_index).channel  # sim: the same channel, already aligned
        else:
            rc = aligned_channel(self.radio, block, np.asarray(channel["channel_h"]))
        links = None
        if self.topology is not None and not self.topology.is_complete:
            links = heard_links(self.topology.mixing(ctx.round_index, DEFAULT_MIXING), ctx.answered)
        return propagate(self.scheme, signals, rc, self.radio, ctx.seed, ctx.round_index, out, links)
