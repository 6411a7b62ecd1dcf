"""The orthogonal digital exchange of D-PSGD and gossip on a graph: who hears whom with which
weight, what every receiver decodes, and what each node's slot costs.

Every node broadcasts its payload s_k (d float64 values, 64·d bits) once, in its own slot (TDMA);
the links are digital and decode without error. Receiver i weights each neighbour's payload by the
mixing matrix W (Metropolis–Hastings or uniform, testbed.topology.mixing) and sums:

    received_i = Σ_{k ∈ N(i)} W_ik s_k,

a sparse product O(E·d) (scipy CSR @ dense), never an N × N one. A silent sender's row is zero, so
it adds nothing; the receiver's own weight absorbs the missing ones (:func:`self_weights`): the
weights among the nodes that did send stay symmetric with rows summing to one, so with MH mixing
and no noise the exchange keeps their average (renormalising each row instead would not).

Cost of round r (:class:`RoundLinks`), per node k:

- its slot at the Shannon rate of its weakest neighbour link, so every neighbour decodes:
  rate_k = B log2(1 + P G_k / (2σ_m²)), G_k = min_{i ∈ N(k)} |h_ki|² (complex noise 2σ_m², σ_m² per
  real rail, as the rest of the channel); slot_k = 64 d / rate_k (channel.link.digital_airtime_s);
- its transmit energy P · slot_k (channel.link.radio_energy_j); listening is not charged energy
  (the radio model has no receive power, as DWFL's);
- its radio time: its own slot plus the slots of its neighbours it listens to,
  airtime_k = slot_k + Σ_{j ∈ N(k)} slot_j (it is idle in the slots of nodes it cannot hear);
- the link gain: the sender's |h_k|² from the radio's fading and path loss
  (testbed.algorithms.dwfl_channel.round_channel; one gain per sender toward every receiver, DWFL's
  model), and on a ``random_geometric`` topology times the free-space gain between the two
  positions, 10^(−FSPL(d)/10) (the link budget the graph was drawn from; the radio's ``pathloss``
  must then be "none": the positions are the large scale);
- in a ray-traced scene (``pathloss = "scene"``), the traced gain of each pair, min over the
  sender's neighbours, times the sender's fading (testbed.topology.scene).

A node with no neighbour (a disconnected graph that was allowed) sends nothing: no slot, no cost.

Every process of a run (the coordinator, the channel emulator, each node) draws the same graph and
fading from the run's seed, so nothing but the payloads is exchanged.

Example::

    >>> from testbed.algorithms.radio_section import RadioSection
    >>> from testbed.topology import Topology, TopologySection
    >>> radio = RadioSection(fading="none", power_dbm=30.0, noise_power_w=0.5).radio(4)
    >>> links = Links(Topology(TopologySection(kind="ring"), 4, seed=0), radio, seed=0, payload_bits=64)
    >>> (links.mixing(0).matrix()[0] * 3).round(12).tolist()
    [1.0, 1.0, 0.0, 1.0]
    >>> cost = links.round_links(0)              # SNR 1 W / 1 W = 1: rate 1 Mbit/s, 64 bits
    >>> cost.slot_s.tolist()[0], cost.airtime_s.tolist()[0], cost.energy_j.tolist()[0]
    (6.4e-05, 0.000192, 6.4e-05)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

import numpy as np

from channel import digital_airtime_s, free_space_pathloss_db, radio_energy_j, snr_linear
from testbed.algorithms.contract import RoundContext, State, TensorSpec
from testbed.algorithms.dwfl_channel import Radio, large_scale_amplitude, round_channel
from testbed.topology import Mixing, Topology

if TYPE_CHECKING:
    import scipy.sparse

__all__ = ["Links", "RoundLinks", "GraphChannel", "self_weights", "neighbour_slots", "DEFAULT_MIXING"]

#: Separate links can weight each neighbour: Metropolis–Hastings unless [topology] says otherwise.
DEFAULT_MIXING = "metropolis_hastings"


@dataclass(frozen=True)
class RoundLinks:
    """What one round's exchange costs (arrays over all N nodes).

    Attributes:
        weakest_gain: (N,) G_k, the power gain of node k's weakest neighbour link (0: no neighbour).
        rate_bps: (N,) the rate of node k's slot (0: it has no slot).
        slot_s: (N,) node k's slot, s.
        airtime_s: (N,) node k's radio time: its slot and its neighbours', s.
        energy_j: (N,) node k's transmit energy, J.
    """

    weakest_gain: np.ndarray
    rate_bps: np.ndarray
    slot_s: np.ndarray
    airtime_s: np.ndarray
    energy_j: np.ndarray

    @property
    def round_s(self) -> float:
        """The round's length on the air: every slot once (TDMA)."""
        return float(self.slot_s.sum())


class Links:
    """The graph, weights and slot costs of every round of a run.

    Args:
        topology: the run's topology (testbed.topology.Topology).
        radio: the run's radio (power, noise, bandwidth, fading, path loss).
        seed: the run's seed (keys the fading).
        payload_bits: the size of one broadcast, bits (64 · d for d float64 values).
    """

    def __init__(self, topology: Topology, radio: Radio, seed: int, payload_bits: int) -> None:
        self.topology, self.radio, self.seed, self.payload_bits = topology, radio, seed, payload_bits
        self._mixing: dict[int, tuple[Mixing, Any]] = {}
        self._costs: dict[tuple[int, int], RoundLinks] = {}
        self._h: dict[int, np.ndarray] = {}  # fading block → every sender's channel
        self._amplitude: np.ndarray | None = None

    def channel_h(self, round_index: int) -> np.ndarray:
        """(N,) complex128 every sender's channel in the round's fading block (given, or drawn once).
        The coordinator sends it with each round, so that a node needs no Sionna to draw it."""
        block = self.radio.schedule.block_index(round_index)
        if block not in self._h:
            if self._amplitude is None:
                self._amplitude = large_scale_amplitude(self.radio, self.seed)
            self._h = {b: h for b, h in self._h.items() if b >= block - 1}
            self._h[block] = round_channel(self.radio, self.seed, round_index, self._amplitude).h
        return self._h[block]

    def accept_channel(self, round_index: int, h: np.ndarray) -> None:
        """Use ``h`` (the coordinator's, checked against the downlink spec) for the round's fading
        block; a cost computed from another h is dropped."""
        block = self.radio.schedule.block_index(round_index)
        known = self._h.get(block)
        if known is None or not np.array_equal(known, h):
            self._h[block] = np.array(h, dtype=np.complex128)
            self._costs = {k: c for k, c in self._costs.items() if k[1] != block}

    @property
    def num_nodes(self) -> int:
        return self.topology.num_nodes

    def _weights(self, round_index: int) -> tuple[Mixing, Any]:
        block = self.topology.schedule.block_index(round_index)
        if block not in self._mixing:
            mixing = self.topology.mixing(round_index, DEFAULT_MIXING)
            self._mixing = {b: m for b, m in self._mixing.items() if b >= block - 1}  # a small window
            self._mixing[block] = (mixing, mixing.graph.adjacency(mixing.weights))
        return self._mixing[block]

    def mixing(self, round_index: int) -> Mixing:
        """W of the round's graph."""
        return self._weights(round_index)[0]

    def off_diagonal(self, round_index: int) -> "scipy.sparse.csr_array":
        """(N, N) sparse W without its diagonal: what the receivers weight the payloads by."""
        return self._weights(round_index)[1]

    def round_links(self, round_index: int) -> RoundLinks:
        """The round's slot costs (computed once per graph block and fading block)."""
        key = (self.topology.schedule.block_index(round_index), self.radio.schedule.block_index(round_index))
        if key not in self._costs:
            self._costs = {k: c for k, c in self._costs.items() if k[0] >= key[0] - 1}
            self._costs[key] = self._cost(round_index)
        return self._costs[key]

    def _cost(self, round_index: int) -> RoundLinks:
        graph = self.mixing(round_index).graph
        n, r = self.num_nodes, self.radio
        weakest = np.zeros(n)
        has = graph.degrees > 0
        h = self.channel_h(round_index)
        site = self.topology.scene_site() if r.pathloss == "scene" else None
        if site is not None:  # each pair's traced gain, times the sender's fading (h over its traced h)
            block = r.schedule.block_index(round_index)
            pair = site.node_gain(block)[graph.rows, graph.indices]
            traced = site.server_coefficient(block)
            with np.errstate(divide="ignore", invalid="ignore"):
                fading = np.where(traced != 0, np.abs(h) ** 2 / np.abs(traced) ** 2, 1.0)
            weakest[has] = fading[has] * np.minimum.reduceat(pair, graph.indptr[:-1][has])
            positions = None
        else:
            weakest[has] = np.abs(h[has]) ** 2  # one gain per sender
            positions = self.topology.positions_m(round_index)
        if positions is not None:  # times the link budget the graph was drawn from, per pair
            gap = positions[graph.rows] - positions[graph.indices]
            distance = np.maximum(np.sqrt((gap**2).sum(axis=1)), 1e-3)
            gain = 10.0 ** (-free_space_pathloss_db(distance, r.carrier_hz) / 10.0)
            weakest[has] *= np.minimum.reduceat(gain, graph.indptr[:-1][has])
        snr = snr_linear(r.power_w, weakest, 2.0 * r.noise_power_w)
        slot = np.zeros(n)
        with np.errstate(divide="ignore"):
            slot[has] = digital_airtime_s(self.payload_bits, r.bandwidth_hz, snr[has])
        rate = np.where(has, self.payload_bits / np.where(has, slot, 1.0), 0.0)
        energy = radio_energy_j(np.where(has, r.power_w, 0.0), slot)
        listening = np.bincount(graph.rows, weights=slot[graph.indices], minlength=n)
        return RoundLinks(weakest_gain=weakest, rate_bps=rate, slot_s=slot, airtime_s=slot + listening,
                          energy_j=energy)


def self_weights(mixing: Mixing, senders: Sequence[int], node_ids: Sequence[int]) -> np.ndarray:
    """(M,) each receiver's own weight when only ``senders`` transmitted: W_ii plus the weights of
    its silent neighbours, 1 − Σ_{k ∈ N(i) ∩ senders} W_ik (the rows of W stay stochastic)."""
    g = mixing.graph
    sent = np.zeros(g.num_nodes)
    sent[np.asarray(senders, dtype=np.int64)] = 1.0
    heard = np.bincount(g.rows, weights=mixing.weights * sent[g.indices], minlength=g.num_nodes)
    return 1.0 - heard[np.asarray(node_ids, dtype=np.int64)]


def neighbour_slots(mixing: Mixing, senders: Sequence[int], node_ids: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """(M, D) the mixing weight W_ij of each receiver's j-th neighbour (in the graph's sorted
    order, D its largest degree) and (M, D) whether that neighbour was heard: a slot past the
    receiver's degree, or of a neighbour not among ``senders``, is not."""
    g = mixing.graph
    width = int(g.degrees.max()) if g.num_nodes else 0
    ids = np.asarray(node_ids, dtype=np.int64)
    slot = np.arange(width)[None, :]
    exists = slot < g.degrees[ids][:, None]
    edge = np.where(exists, g.indptr[ids][:, None] + slot, 0)
    sent = np.zeros(g.num_nodes, dtype=bool)
    sent[np.asarray(senders, dtype=np.int64)] = True
    if not g.indices.size:
        return np.zeros(exists.shape), exists
    return np.where(exists, mixing.weights[edge], 0.0), exists & sent[g.indices[edge]]


def gather_neighbours(mixing: Mixing, signals: np.ndarray) -> np.ndarray:
    """(N, D, ...) receiver i's slot j holds the payload of its j-th neighbour (zeros past its degree):
    what a receiver decodes on separate digital links before a robust rule combines it. A loop
    over the D slots, each a gather across all receivers (O(N D P))."""
    g = mixing.graph
    width = int(g.degrees.max()) if g.num_nodes else 0
    out = np.zeros((signals.shape[0], width) + signals.shape[1:], dtype=signals.dtype)
    for j in range(width):
        has = np.flatnonzero(g.degrees > j)
        out[has, j] = signals[g.indices[g.indptr[has] + j]]
    return out


class GraphChannel:
    """The channel half of the orthogonal exchange (testbed.algorithms.contract.ChannelHalf):
    (N, P) payloads (silent rows zero) → (N, P) received_i = Σ_{k ∈ N(i)} W_ik s_k; with a robust
    rule at the receivers (``neighbourhood``), (N, D, P) each receiver's neighbours' payloads apart
    (:func:`gather_neighbours`), which the receiver combines itself
    (testbed.algorithms.neighbourhood).

    Built from the sections alone for the channel emulator (``num_params`` unknown: the round's
    notice declares the signal), or by the algorithm with its size and its bound.

    Args:
        links: the run's links.
        num_params: P, the payload's size (None: the emulator's, told by each notice).
        bound: (state, ctx) → the largest norm of an honest payload of the round, or None.
        neighbourhood: deliver each receiver its neighbours' payloads apart, not their weighted sum.
    """

    #: One sender is enough: a node with no neighbour heard keeps its own model.
    min_senders = 1

    def __init__(self, links: Links, num_params: int | None = None,
                 bound: Callable[[State, RoundContext], float] | None = None, neighbourhood: bool = False) -> None:
        self.links, self._num_params, self._bound = links, num_params, bound
        self.neighbourhood = neighbourhood

    def received_spec(self, ctx: RoundContext) -> TensorSpec:
        """What one receiver gets in round ``ctx``: the weighted sum, shaped as a payload; with a
        robust rule at the receivers, (D, P), D the round graph's largest degree."""
        spec = self.signal_spec()
        if not self.neighbourhood:
            return spec
        width = int(self.links.mixing(ctx.round_index).graph.degrees.max())
        return TensorSpec((width,) + tuple(spec.shape), spec.dtype)

    def signal_spec(self) -> TensorSpec:
        """One node's payload, (P,) float64."""
        if self._num_params is None:
            raise ValueError("the payload's size is the model's: build the channel from the algorithm")
        return TensorSpec((self._num_params,))

    def round_signal_spec(self, state: State, ctx: RoundContext) -> TensorSpec:
        """:meth:`signal_spec` with the norm no honest payload of round ``ctx`` exceeds."""
        spec = self.signal_spec()
        if self._bound is None:
            return spec
        return TensorSpec(spec.shape, max_norm=self._bound(state, ctx))

    def superpose(self, signals: np.ndarray, channel: Mapping[str, np.ndarray], ctx: RoundContext,
                  out: np.ndarray | None = None) -> np.ndarray:
        """received = W_offdiag @ signals for the round's graph (O(E·P)); ``out`` may be ``signals``.
        With ``neighbourhood``: (N, D, P) the neighbours' payloads apart, a new array (``out`` unused)."""
        if signals.shape[0] != self.links.num_nodes:
            raise ValueError(f"signals must have one row per node ({self.links.num_nodes}), got {signals.shape[0]}")
        if self.neighbourhood:
            return gather_neighbours(self.links.mixing(ctx.round_index), signals)
        received = self.links.off_diagonal(ctx.round_index) @ signals.reshape(signals.shape[0], -1)
        received = np.asarray(received).reshape(signals.shape)
        if out is None:
            return received
        out[...] = received
        return out
