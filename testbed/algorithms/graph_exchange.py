"""Baselines of decentralised learning on a graph over orthogonal digital links: D-PSGD (Lian et
al., NeurIPS 2017, Algorithm 1) and gossip averaging with local differential privacy, one algorithm
class for both; each is registered by its own module (testbed.algorithms.dpsgd, .gossip), with
its section ``[dpsgd]`` or ``[gossip]`` (:class:`ExchangeSection`) and the shared ``[topology]``.

Each node i keeps its own model x_i; the state is ``{"models": (N, P)}`` and the evaluated model
their average x̄. One round r, W the mixing matrix of the round's graph ([topology]; MH by default):

- ``dpsgd`` (Lian et al., Algorithm 1, lines 4–6): the stochastic gradient at the node's own model
  *before* mixing, clipped, ‖g_i‖ <= g_max; the node sends s_i = x_i + n_i; then
  x_i ← W_ii x_i + Σ_{k ∈ N(i)} W_ik s_k − γ g_i(x_i).
- ``gossip`` (adapt, then combine): x_i' = x_i − γ g_i; the node sends s_i = x_i' + n_i; then
  x_i'' = W_ii x_i' + Σ_{k ∈ N(i)} W_ik s_k.

Robust rules (``aggregation``; testbed.algorithms.neighbourhood, docs/robust-aggregation.md): the
mixing above is the papers' (``"mean"``, the default). With ``"self_centred_clip"`` (ClippedGossip,
He, Karimireddy and Jaggi 2022), ``"trimmed_mean"`` or ``"median"`` (BRIDGE, Yang and Bajwa 2019)
each receiver gets its neighbours' payloads apart and combines them with its own model by the rule,
in place of the weighted sum; D-PSGD then still subtracts γ g_i(x_i).

n_i ~ N(0, σ² I) is the node's local DP noise from its own stream ``stream(seed, i, r, NOISE)``
(none: σ = 0, as in Lian et al.); a node weights its own model exactly (it needs no noise against
itself). The exchange is :mod:`testbed.algorithms.gossip_channel` (in sim in the runner, over MQTT
in the channel emulator, both its :class:`~testbed.algorithms.gossip_channel.GraphChannel`): each
receiver gets Σ_{k ∈ N(i)} W_ik s_k, a silent neighbour's weight goes to the receiver's own.

Privacy (per node, per round): one ``GaussianEvent`` of σ and sensitivity Δ = 2γ g_max, observer
"peers" (every neighbour hears the release), charged when the payload is made. Replacing the node's
data set moves its one data-dependent term, γ g_i, by at most 2γ g_max; as in DWFL (Theorem IV.1)
the model before the round is treated as data-independent, so the per-round guarantee is that of
one Gaussian mechanism and the run's accountant composes the rounds. With ``epsilon`` set, σ is
calibrated by the classic bound σ = Δ sqrt(2 ln(1.25/δ)) / ε (Dwork & Roth Thm. A.1, as DWFL's
eq. 11), so a baseline and DWFL at the same per-round ε carry the same guarantee. (D-PSGD's first
release, x_i⁰, depends on no data: charging it over-counts, never under-counts.)

Cost in the ledger (per node, per round): one local step; bytes up its broadcast (8 P), bytes down
what it decodes (8 P per neighbour); airtime and transmit energy of its digital slot at the rate of
its weakest neighbour link plus the slots it listens to (:class:`~testbed.algorithms.gossip_channel.RoundLinks`).

Example::

    >>> from testbed.learning.models import LogisticRegression
    >>> from testbed.data.synthetic import make_logistic
    >>> from testbed.topology import Topology, TopologySection
    >>> from testbed.algorithms.contract import RoundContext
    >>> from testbed.algorithms.gossip_channel import Links
    >>> data = make_logistic(num_nodes=4, samples_per_node=50, dim=5, seed=0)
    >>> model = LogisticRegression(5, 2)
    >>> radio = ExchangeSection(fading="none").radio(4)
    >>> links = Links(Topology(TopologySection(kind="ring"), 4, seed=0), radio, 0, 64 * model.num_params)
    >>> alg = GraphExchange(model, links, kind="gossip", rounds=3, batch=8, lr=0.1, gmax=1.0, delta=1e-5,
    ...                     epsilon=0.5)
    >>> state = alg.init_state(model.init(None))
    >>> ctx = RoundContext.everyone(0, 0, 4)
    >>> out = alg.node_step(alg.downlink(state, ctx, ctx.expected), data.train, ctx.expected, ctx)
    >>> heard = alg.channel.superpose(out.tensors["signal"], alg.channel_tensors(ctx), ctx.closed(out.node_ids))
    >>> alg.node_finish(out.carry, heard, out.node_ids, ctx.closed(out.node_ids)).tensors["model"].shape
    (4, 12)
    >>> round(alg.sigma * 0.5 / alg.sensitivity, 6)       # σ = Δ sqrt(2 ln(1.25/δ)) / ε
    4.844805
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal, Mapping, Sequence

import numpy as np
from pydantic import model_validator

from testbed.algorithms.base import BYTES_PER_REAL, BaseAlgorithm, RoundCost, gaussian_release, released_events
from testbed.algorithms.batches import check_batches, clipped_gradients
from testbed.algorithms.bounds import gaussian_norm_bound
from testbed.algorithms.contract import NodeResult, RoundContext, ServerResult, State, TensorSpec
from testbed.algorithms.gossip_channel import DEFAULT_MIXING, GraphChannel, Links, neighbour_slots, self_weights
from testbed.algorithms.neighbourhood import NEIGHBOURHOOD_RULES, clip_radius, median, self_centred_clip, trimmed_mean
from testbed.algorithms.radio_section import RadioSection
from testbed.algorithms.registry import BuildContext, Registration, RobustChoice
from testbed.checked.sections import NonNegative, OnlyWith, Positive
from testbed.data.federated import Split
from testbed.errors import ConfigError
from testbed.learning.models import Model
from testbed.ledger.events import Event, GaussianEvent
from testbed.privacy import dwfl as dp
from testbed.privacy.statements import DELTA, PrivacyStatement
from testbed.topology import Topology, TopologySection
from testbed.topology.view import graph_view_with
from testbed.topology.scene import check_blocks

if TYPE_CHECKING:
    from testbed.checked.sections import Config

KINDS = ("dpsgd", "gossip")


class ExchangeSection(RadioSection):
    """What D-PSGD and gossip share: rounds, the local step, the clip, the local DP noise, the
    rule a node combines its neighbours' payloads by, and the radio. Give ``epsilon`` (per round, σ
    calibrated) or ``sigma``, not both (neither: no noise)."""

    ONLY_WITH = {**RadioSection.ONLY_WITH,
                 "clip_multiple": (OnlyWith("aggregation", ("self_centred_clip",)),),
                 "trim": (OnlyWith("aggregation", ("trimmed_mean",)),)}

    rounds: Positive[int] = 100
    batch: Positive[int] = 32
    lr: Positive[float] = 0.1
    """γ."""
    gmax: Positive[float] = 1.0
    """Clipping norm of each node's stochastic gradient."""
    epsilon: Positive[float] | None = None
    """Per-round ε of each node's release (σ = 2γ g_max sqrt(2 ln(1.25/δ)) / ε)."""
    sigma: NonNegative[float] | None = None
    """σ, the std of the noise on each released entry, fixed."""
    aggregation: Literal[NEIGHBOURHOOD_RULES] = "mean"  # type: ignore[valid-type]
    """mean: the paper's mixing; self_centred_clip (ClippedGossip), trimmed_mean, median (BRIDGE):
    robust rules over each node's neighbours against hostile ones (docs/robust-aggregation.md)."""
    clip_multiple: Positive[float] = 0.25
    """self_centred_clip: τ = clip_multiple × (lr × gmax + σ sqrt(P)), public, per round (0.25: the
    benchmark's, docs/robust-aggregation.md)."""
    trim: Positive[int] = 1
    """trimmed_mean: b, the largest and smallest neighbour values dropped per coordinate (every node
    needs at least 2b + 1 neighbours)."""

    @model_validator(mode="after")
    def _one_noise_setting(self) -> "ExchangeSection":
        if self.sigma is not None and self.epsilon is not None:
            raise ValueError("sigma: give sigma or epsilon, not both")
        return self


class GraphExchange(BaseAlgorithm):
    """D-PSGD or gossip with resolved settings (testbed.algorithms.contract.OverTheAir: the
    exchange sits between the node step and the node's finish).

    Args:
        model: the model.
        links: the run's graph, weights and slot costs.
        kind: ``"dpsgd"`` or ``"gossip"``.
        rounds: T. batch: mini-batch size. lr: γ. gmax: the gradient clip.
        delta: δ of the per-round calibration.
        epsilon: per-round ε (σ calibrated), or ``sigma`` fixed; neither: no noise.
        seed: the run's seed (keys the graph and fading).
        aggregation: the receivers' rule (testbed.algorithms.neighbourhood.NEIGHBOURHOOD_RULES).
        clip_multiple: self_centred_clip's τ in units of γ g_max + σ sqrt(P).
        trim: trimmed_mean's b.
    """

    uniform_plans = False  # each node's slot, degree and airtime are its own
    local_steps = 1

    def __init__(self, model: Model, links: Links, *, kind: str, rounds: int, batch: int, lr: float, gmax: float,
                 delta: float, epsilon: float | None = None, sigma: float | None = None, seed: int = 0,
                 aggregation: str = "mean", clip_multiple: float = 0.25, trim: int = 1):
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        if aggregation not in NEIGHBOURHOOD_RULES:
            raise ValueError(f"aggregation must be one of {NEIGHBOURHOOD_RULES}, got {aggregation!r}")
        if epsilon is not None and sigma is not None:
            raise ValueError("give epsilon or sigma, not both")
        self.model, self.links, self.kind = model, links, kind
        self.rounds_planned, self.batch, self.lr, self.gmax = rounds, batch, lr, gmax
        self.delta, self.epsilon, self.seed = delta, epsilon, seed
        # Δ = 2γ g_max: each node clips its batch gradient to g_max (batches.clipped_gradients), so
        # replacing its whole data set moves its one data-dependent term γ g_i by at most 2γ g_max,
        # the model before the round taken as fixed (as DWFL's Theorem IV.1; the summary says so).
        self.sensitivity = dp.sensitivity(lr, gmax)
        if epsilon is not None:
            self.sigma = self.sensitivity * dp.gaussian_factor(delta) / epsilon
        else:
            self.sigma = 0.0 if sigma is None else float(sigma)
        self.aggregation, self.trim = aggregation, trim
        self.clip_radius = clip_radius(clip_multiple, lr, gmax, self.sigma, model.num_params, self.local_steps)
        self._channel = GraphChannel(links, model.num_params, self.signal_norm_bound,
                                     neighbourhood=aggregation != "mean")

    @property
    def num_nodes(self) -> int:
        return self.links.num_nodes

    @property
    def channel(self) -> GraphChannel:
        return self._channel

    # ----------------------------------------------------------------------------- specs and state

    def state_spec(self) -> dict[str, TensorSpec]:
        return {"models": TensorSpec((self.num_nodes, self.model.num_params))}

    def downlink_spec(self) -> dict[str, TensorSpec]:
        """Each node gets its own model and the round's channel h (its slot's rate depends on it; a
        board then needs no Sionna to draw the fading). The graph comes from the seed."""
        return {"model": TensorSpec((self.model.num_params,)),
                "channel_h": TensorSpec((self.num_nodes,), dtype="complex128", per_node=False)}

    def uplink_spec(self) -> dict[str, TensorSpec]:
        """After the exchange each node reports its new model (its bound: :meth:`round_uplink_spec`)."""
        return {"model": TensorSpec((self.model.num_params,))}

    def round_uplink_spec(self, state: State, ctx: RoundContext) -> dict[str, TensorSpec]:
        """The new model within :meth:`model_step_bound` of the one the node was sent."""
        return {"model": TensorSpec((self.model.num_params,), max_norm=self.model_step_bound(state, ctx),
                                    relative_to="model")}

    def _spread(self, state: State, ctx: RoundContext) -> tuple[np.ndarray, float]:
        """The expected nodes' models and 2 max_k ‖x_k − x̄‖ over them (>= any ‖x_k − x_i‖)."""
        ids = np.asarray(ctx.expected if ctx.expected else range(self.num_nodes), dtype=np.int64)
        models = state["models"][ids]
        return models, 2.0 * float(np.linalg.norm(models - models.mean(axis=0), axis=1).max())

    def model_step_bound(self, state: State, ctx: RoundContext) -> float:
        """How far an honest node's new model can be from the one it was sent: with weights
        w_ik >= 0 summing to one over the node and its heard neighbours,
        x_i^new − x_i = Σ_k w_ik (x_k − x_i) − γ (own or mixed clipped gradients) + Σ_{k≠i} w_ik n_k,
        so at most the spread of the expected models + γ g_max + the norm bound of a Gaussian of
        per-entry variance Σ w_ik² σ² <= σ² (testbed.algorithms.bounds).

        With self-centred clipping the bound is public, whatever the models: x_i^new − x_i =
        Σ_j W_ij CLIP(s_j − x_i, τ) − γ g, at most τ + γ g_max (Σ_j W_ij <= 1), so a hostile node's
        own row cannot run away faster than an honest one could (a relative 1e-9 for rounding)."""
        if self.aggregation == "self_centred_clip":
            return (self.clip_radius + self.lr * self.gmax) * (1.0 + 1e-9)
        _, spread = self._spread(state, ctx)
        return spread + self.lr * self.gmax + gaussian_norm_bound(self.sigma, self.model.num_params)

    def signal_norm_bound(self, state: State, ctx: RoundContext) -> float:
        """The largest norm of an honest payload of round ``ctx``: ‖x_i‖ (+ γ g_max for gossip's
        x_i') + the noise's norm bound, the maximum over the expected senders."""
        models, _ = self._spread(state, ctx)
        step = self.lr * self.gmax if self.kind == "gossip" else 0.0
        largest = float(np.linalg.norm(models, axis=1).max())
        return largest + step + gaussian_norm_bound(self.sigma, self.model.num_params)

    def init_state(self, params0: np.ndarray) -> State:
        """``models`` (N, P): every node starts from the runner's θ⁰."""
        return {"models": np.repeat(np.asarray(params0, dtype=np.float64)[None, :], self.num_nodes, axis=0)}

    def eval_params(self, state: State) -> np.ndarray:
        """x̄ = (1/N) Σ_i x_i, shape (P,)."""
        return state["models"].mean(axis=0)

    def downlink(self, state: State, ctx: RoundContext, node_ids: Sequence[int]) -> dict[str, np.ndarray]:
        """Each node's own row (M, P) (all rows: the state itself, no copy)."""
        models = state["models"]
        ids = np.asarray(node_ids, dtype=np.int64)
        every = len(ids) == self.num_nodes and bool((ids == np.arange(self.num_nodes)).all())
        h = self.links.channel_h(ctx.round_index)
        return {"model": models if every else models[ids], "channel_h": np.broadcast_to(h, (len(ids), h.shape[0]))}

    def channel_tensors(self, ctx: RoundContext) -> dict[str, np.ndarray]:
        """Nothing: the exchange needs only the graph, which every process draws from the seed."""
        return {}

    def use_channel(self, downlink: Mapping[str, np.ndarray], round_index: int) -> None:
        """Use the channel h the coordinator sent with a node's downlink."""
        self.links.accept_channel(round_index, np.asarray(downlink["channel_h"]))

    # ----------------------------------------------------------------------------- ledger

    def round_cost(self, node: int, ctx: RoundContext) -> RoundCost:
        """One local step; its broadcast up, its neighbours' payloads down; its slot's airtime and
        energy plus the slots it listens to (testbed.algorithms.gossip_channel)."""
        size = self.model.num_params * BYTES_PER_REAL
        degree = int(self.links.mixing(ctx.round_index).graph.degrees[node])
        cost = self.links.round_links(ctx.round_index)
        return RoundCost(self.local_steps, bytes_up=size if degree else 0, bytes_down=size * degree,
                         airtime_s=float(cost.airtime_s[node]), energy_j=float(cost.energy_j[node]))

    def _release(self, node: int, round_index: int) -> GaussianEvent:
        # Replace-one of the node's whole data set; every neighbour hears it; no amplification claimed.
        return GaussianEvent(node, round_index, self.sigma, self.sensitivity, 1, observer="peers",
                             clip_norm=self.gmax)

    def releases(self, node: int, ctx: RoundContext) -> list[Event]:
        """One Gaussian release heard by the peers (none without noise)."""
        return [self._release(node, ctx.round_index)] if self.sigma > 0 else []

    # ----------------------------------------------------------------------------- node side

    def node_step(self, received: Mapping[str, np.ndarray], train: Split, node_ids: Sequence[int],
                  ctx: RoundContext) -> NodeResult:
        """The clipped gradient at each node's own model, its payload s_i (``signal``) and what it
        keeps for :meth:`node_finish` (``carry``: ``own``, the model it weights exactly, and for
        D-PSGD ``step`` = γ g_i, applied after mixing)."""
        if ctx.seed != self.seed:
            raise ValueError(f"the algorithm was built for seed {self.seed}, not {ctx.seed} (the graph depends on it)")
        self.links.accept_channel(ctx.round_index, np.asarray(received["channel_h"][0]))
        ids = tuple(int(i) for i in node_ids)
        models = np.asarray(received["model"], dtype=np.float64)
        step = self.lr * clipped_gradients(self.model, models, train, ids, ctx.round_index, ctx.seed, self.batch,
                                           self.gmax, ctx.secrets)
        if self.kind == "gossip":
            own = models - step  # x_i'
            carry = {"own": own}
        else:
            own = models.copy()  # x_i: the gradient enters after mixing
            carry = {"own": own, "step": step}
        signals = own.copy()
        released: dict[int, Event] = {}
        if self.sigma > 0:
            signals, events = gaussian_release(signals, ids, ctx, lambda n: self._release(n, ctx.round_index))
            released = dict(zip(ids, events))
        return self.result(ids, {"signal": signals}, train, ctx, events=released_events(self, ids, ctx, released),
                           carry=carry)

    def node_finish(self, carry: Mapping[str, np.ndarray], received: np.ndarray, node_ids: Sequence[int],
                    ctx: RoundContext) -> NodeResult:
        """x_i^new = w_i own_i + received_i (− γ g_i for D-PSGD), w_i = W_ii plus the weights of the
        neighbours that did not send (``ctx.answered`` are the senders); with a robust rule,
        received_i is the (D, P) neighbours' payloads and x_i^new the rule's combination of them
        with own_i (testbed.algorithms.neighbourhood)."""
        own = carry["own"]
        if self.aggregation == "mean":
            if received.shape != own.shape:
                raise ValueError(f"received payloads of shape {received.shape}, expected {own.shape}")
            weight = self_weights(self.links.mixing(ctx.round_index), ctx.answered, node_ids)
            new = own * weight[:, None]
            new += received
        else:
            new = self._robust_mix(own, received, node_ids, ctx)
        if "step" in carry:
            new -= carry["step"]
        return NodeResult(node_ids=tuple(int(n) for n in node_ids), tensors={"model": new})

    def _robust_mix(self, own: np.ndarray, received: np.ndarray, node_ids: Sequence[int],
                    ctx: RoundContext) -> np.ndarray:
        """The configured robust rule over each node's heard neighbours' payloads and its own model."""
        weights, heard = neighbour_slots(self.links.mixing(ctx.round_index), ctx.answered, node_ids)
        if received.shape != heard.shape + own.shape[1:]:
            raise ValueError(f"received payloads of shape {received.shape}, expected {heard.shape + own.shape[1:]}")
        if self.aggregation == "self_centred_clip":
            return self_centred_clip(own, received, weights, heard, self.clip_radius)
        if self.aggregation == "trimmed_mean":
            return trimmed_mean(own, received, heard, self.trim)
        return median(own, received, heard)

    def server_step(self, state: State, result: NodeResult, ctx: RoundContext) -> ServerResult:
        """The nodes that finished the round replace their rows; the others keep theirs. No server
        event: each node's noise is its own, whoever else sent."""
        models = result.tensors.get("model")
        if models is not None and result.node_ids == tuple(range(self.num_nodes)):
            return ServerResult({"models": models})
        new = np.array(state["models"], copy=True)
        if result.node_ids:
            new[list(result.node_ids)] = models
        return ServerResult({"models": new})

    # ----------------------------------------------------------------------------- report

    def describe(self) -> dict[str, Any]:
        """Settings, σ and the per-round ε, the composed ε of the planned rounds, and the first
        round's exchange: its airtime on the air (every slot once) and the nodes' costs."""
        cost = self.links.round_links(0)
        z = self.sigma / self.sensitivity
        privacy: dict[str, Any] = {}
        if z > 0:  # without noise no ε is finite: none is reported
            # The per-round ε of every node's release (the classic bound; the CLI's per-round line).
            privacy["epsilon_round_max"] = dp.gaussian_factor(self.delta) / z
            privacy.update({f"epsilon_composed_{name}": eps for name, eps in
                            dp.composed_epsilons([z] * max(self.rounds_planned, 1), self.delta).items()})
        return {
            "kind": self.kind, "rounds_planned": self.rounds_planned, "batch": self.batch, "lr": self.lr,
            "gmax": self.gmax, "delta": self.delta, "epsilon_target_per_round": self.epsilon, "sigma": self.sigma,
            "aggregation": self.aggregation,
            **({"clip_radius": self.clip_radius} if self.aggregation == "self_centred_clip" else {}),
            **({"trim": self.trim} if self.aggregation == "trimmed_mean" else {}),
            "sensitivity": self.sensitivity,
            **privacy,
            "power_w": self.links.radio.power_w, "noise_power_w": self.links.radio.noise_power_w,
            "bandwidth_hz": self.links.radio.bandwidth_hz, "payload_bits": self.links.payload_bits,
            "round_airtime_s": cost.round_s, "node_airtime_s_max": float(cost.airtime_s.max()),
            "node_energy_j_max": float(cost.energy_j.max()),
            "topology": self.links.topology.describe(self.rounds_planned, DEFAULT_MIXING),
        }


# ----------------------------------------------------------------------------- registration


def _topology(sections: dict[str, Any], num_nodes: int, seed: int) -> Topology:
    own: ExchangeSection = next(iter(sections.values()))
    return Topology(sections["topology"], num_nodes, seed, own.link_budget())


def links_from_sections(sections: dict[str, Any], num_nodes: int, seed: int, num_params: int) -> Links:
    """The run's :class:`Links` from its sections (its own and ``[topology]``)."""
    own: ExchangeSection = next(iter(sections.values()))
    return Links(_topology(sections, num_nodes, seed), own.radio(num_nodes), seed,
                 payload_bits=8 * BYTES_PER_REAL * num_params)


def channel_from_sections(sections: dict[str, Any], num_nodes: int, seed: int) -> GraphChannel:
    """The channel half alone (the channel emulator's): the payload size comes with each notice,
    and the emulator never prices a slot (num_params 0 only sizes the links' costs). With a robust
    rule it delivers each receiver its neighbours' payloads apart."""
    own: ExchangeSection = next(iter(sections.values()))
    return GraphChannel(links_from_sections(sections, num_nodes, seed, num_params=0),
                        neighbourhood=own.aggregation != "mean")


def _builder(kind: str):
    def build(sections: dict[str, Any], ctx: BuildContext) -> GraphExchange:
        a: ExchangeSection = sections[kind]
        check_batches(kind, ctx.data.train, ctx.data.node_ids, 1, a.batch, "batch")
        if ctx.num_nodes < 2:
            raise ConfigError("data.num_nodes", f"{kind} needs at least 2 nodes")
        links = links_from_sections(sections, ctx.num_nodes, ctx.seed, ctx.model.num_params)
        return GraphExchange(ctx.model, links, kind=kind, rounds=a.rounds, batch=a.batch, lr=a.lr, gmax=a.gmax,
                             delta=ctx.delta, epsilon=a.epsilon, sigma=a.sigma, seed=ctx.seed,
                             aggregation=a.aggregation, clip_multiple=a.clip_multiple, trim=a.trim)
    return build


def _checker(kind: str):
    def check(config: "Config") -> None:
        """The graph of every block is drawable and connected (unless allowed), and the path loss
        comes from one place: a config error naming the key, before anything runs."""
        a: ExchangeSection = getattr(config, kind)
        if config.data.num_nodes < 2:
            raise ConfigError("data.num_nodes", f"{kind} needs at least 2 nodes")
        if config.topology.kind == "random_geometric" and a.pathloss not in ("none", "scene"):
            raise ConfigError(f"{kind}.pathloss", "a random_geometric topology takes each link's path loss from the "
                                                  "nodes' positions (free space, or a ray-traced scene: pathloss = "
                                                  "\"scene\"); leave pathloss out")
        check_blocks(kind, a, config.topology)
        topology = Topology(config.topology, config.data.num_nodes, config.run.seed, a.link_budget())
        topology.check(a.rounds)
        if a.aggregation == "trimmed_mean":
            degrees = topology.mixing(0, DEFAULT_MIXING).graph.degrees
            if int(degrees.min()) < 2 * a.trim + 1:
                raise ConfigError(f"{kind}.trim", f"trimmed_mean drops {2 * a.trim} of each node's neighbours' values per "
                                                  f"coordinate; node {int(degrees.argmin())} has {int(degrees.min())} "
                                                  f"neighbour(s), fewer than 2 trim + 1 = {2 * a.trim + 1}")
    return check


#: Each kind's name in prose, its short name, and what it sends.
_SENDS = {"dpsgd": ("D-PSGD", "D-PSGD", "x_i + n_i, its model before this round's step (which carries the last round's "
                    "γ g_i)"),
          "gossip": ("Gossip averaging with local DP", "Gossip", "x_i − γ g_i + n_i")}


def assumptions(kind: str) -> list[str]:
    """The summary's assumptions of a private run of ``kind`` (Registration.assumptions)."""
    short = _SENDS[kind][1]
    return [f"{short}'s per-round sensitivity 2γ g_max treats the model before the step as fixed (as DWFL's Theorem "
            "IV.1): a node keeps its own model without noise, so its earlier gradients reach later releases "
            "without fresh noise, and the ε composed over the rounds is under that assumption"]


def statement(kind: str) -> PrivacyStatement:
    """What a private run of ``kind`` guarantees (testbed.privacy.statements)."""
    title, _, sends = _SENDS[kind]
    return PrivacyStatement(
        name=kind, title=title,
        unit="node: (ε, δ)-DP of a node's whole training set, per round, composed over the rounds (with epsilon or "
             "sigma set; without noise, not private)",
        adjacency="replace a node's whole data set: its clipped batch gradient (‖g_i‖ <= g_max) moves its release by "
                  "at most Δ = 2γ g_max",
        observers=f"its neighbours and anyone on their digital links (observer \"peers\"), who hear {sends}",
        accountant="one Gaussian mechanism a round, composed by privacy.accountant; the tight "
                   "privacy.tight_accountant beside it",
        paper_accountant="none: Lian et al.'s D-PSGD is not private; σ is calibrated per round by the classic bound "
                         "σ = Δ sqrt(2 ln(1.25/δ))/ε (Dwork and Roth, Theorem A.1), as DWFL's eq. (11)",
        amplification="none",
        assumptions=tuple(assumptions(kind)) + ("colluding neighbours are not covered: each is charged what one "
                                                "neighbour hears",),
        delta=DELTA,
        not_protected=("who is whose neighbour, and each node's position and links",
                       "the node's data against itself"),
        evidence=("tests/test_gossip.py::test_every_release_is_one_gaussian_event_the_peers_observe",
                  f"tests/test_gossip.py::test_one_{kind}_round_on_a_ring_of_four_by_hand",
                  "tests/test_privacy_dwfl.py::test_composition_with_dp_accounting",
                  "Dwork and Roth 2014, Theorem A.1"))


def registration(kind: str, section: type[ExchangeSection]) -> Registration:
    """The registration of ``kind`` (its module's REGISTRATION) with its own section ``[kind]``
    and the shared ``[topology]``."""
    return Registration(
        name=kind,
        sections={kind: section, "topology": TopologySection},
        build=_builder(kind),
        check=_checker(kind),
        channel=channel_from_sections,
        epsilon_target=lambda sections: sections[kind].epsilon,
        guarantee=lambda sections: "dp" if sections[kind].epsilon is not None or (sections[kind].sigma or 0) > 0
        else "none",
        graph_view=graph_view_with(radio=lambda sections, num_nodes: sections[kind].link_budget(),
                                   default_mixing=DEFAULT_MIXING),
        assumptions=lambda sections: assumptions(kind),
        privacy_statements=(statement(kind),),
        # both exchanges' rows of benchmarks/robust_aggregation.py: self-centred clipping held
        robust_choice=RobustChoice("self_centred_clip", "O(DP) per node, 9x the mean's exchange at N = 100, "
                                                        "D = 4; D x the received bytes over MQTT"),
    )
