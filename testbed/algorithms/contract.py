"""The contract between an algorithm and whatever runs it (the sim runner, the MQTT coordinator,
a node agent on a board, the channel emulator).

An algorithm is pure steps on named arrays plus explicit random streams. One round:

1. ``downlink(state, ctx, node_ids)``: what the coordinator sends each node, declared by
   ``downlink_spec()``: a tensor either the same for every node (``per_node=False``: broadcast
   once) or one row per node (``per_node=True``: DWFL's own model). The runner never indexes the
   state; it asks the algorithm.
2. ``node_step(received, train, node_ids, ctx)``: on a stack of nodes (all of them in sim, one on a
   board): named tensors out (``uplink_spec()`` declares them), per-node metrics (sample count,
   weight...) and the ledger events the step caused.
3. over the air only (:class:`OverTheAir`): the node's transmit signals go through the channel's
   ``superpose``; each node finishes its update with ``node_finish`` from what it received.
4. ``server_step(state, result, ctx)``: the new state, plus events the server issues on behalf of
   nodes (server-side noise that protects a node's data; a correction of what a node was charged
   when fewer peers transmitted than planned). Over MQTT these reach each node with its next round.
   An algorithm whose server events are known ahead may say them, ``planned_server_events(state,
   ctx)`` (None when not): the tight accountant then computes the run's end while it runs.
   The server's own privacy noise comes from :func:`server_stream` (keyed by the coordinator's
   secret over MQTT when a node has one, else the run seed), and an algorithm that draws it says
   against which observers' figures it counts, ``server_noise_observers`` (a frozenset; absent:
   none), so the summary's statements name the server's randomness (testbed.privacy.secrecy).

An optional ``setup`` phase runs once before round 1 (``has_setup``): nodes upload something once
(their data size, a coded data set) through ``setup_step``, and ``server_setup`` folds it into the
state; it is charged to the ledger like a round, under round index :data:`SETUP_ROUND`.

Shapes: every tensor that crosses a step boundary has a leading node axis M (the nodes of
``node_ids``, in that order); a :class:`TensorSpec` gives the shape of one node's row.

Example::

    >>> spec = TensorSpec((3,))
    >>> spec.problem(np.zeros(3)) is None, spec.problem(np.zeros(2))
    (True, 'shape (2,), expected (3,)')
    >>> ctx = RoundContext(round_index=0, seed=1, num_nodes=4, expected=(0, 1, 3))
    >>> ctx.absent
    (2,)
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Mapping, Protocol, Sequence, runtime_checkable

import numpy as np

from testbed.streams.rng import GLOBAL, Purpose, stream
from testbed.util.numbers import finite_real

if TYPE_CHECKING:
    from testbed.data.federated import Split
    from testbed.learning.models import Model
    from testbed.ledger.events import Event, NodeEvents
    from testbed.streams.node_secret import NodeSecret, Secrets

#: Round index of the one-time setup phase in the ledger and on the wire.
SETUP_ROUND = -1

#: The state of an algorithm: named arrays, all of it checkpointed, only what ``downlink`` says sent.
State = dict[str, np.ndarray]


@dataclass(frozen=True)
class TensorSpec:
    """One named tensor an algorithm sends or receives, per node.

    Attributes:
        shape: one node's row (no node axis).
        dtype: numpy dtype name ("float64", "complex128", "int64").
        per_node: for a downlink tensor, whether each node gets its own row (True) or all get the
            same (False: sent once to everybody).
        max_norm: an L2 (Frobenius) bound no honest node's row exceeds (None: no bound is known),
            measured from ``relative_to``.
        relative_to: the downlink tensor the norm bound refers to (an update's distance from the
            model the node received), or None: the row's own norm.
        norm_growth: with ``relative_to``, the bound is ``max_norm + norm_growth · ‖reference‖``
            (ACFL's gradient (XᵀX) W − XᵀY grows with the model W it was computed at).
        centred: with ``relative_to``, measure ‖row − reference‖ (True) or ‖row‖ (False).
        value_range: (low, high), a bound every entry of an honest row lies in (None: none known);
            real dtypes only.

    The bounds come from public quantities (testbed.algorithms.bounds): a tensor outside them is
    refused like a malformed one, before it is used.
    """

    shape: tuple[int, ...]
    dtype: str = "float64"
    per_node: bool = True
    max_norm: float | None = None
    relative_to: str | None = None
    norm_growth: float = 0.0
    centred: bool = True
    value_range: tuple[float, float] | None = None

    @functools.cached_property
    def _dtype(self) -> np.dtype:
        return np.dtype(self.dtype)  # parsed once: every reply of every node is checked against it

    def problem(self, row: Any, reference: np.ndarray | None = None, *, finite_known: bool = False) -> str | None:
        """Why ``row`` (one node's tensor, as received) is not what this spec declares; None if it is.
        Checks type, dtype, shape, finiteness (unless ``finite_known``: a tensor of a message
        testbed.mqtt.wire decoded, which refuses non-finite values), the value range and the norm bound
        (with ``reference``, the node's ``relative_to`` downlink row, when the spec has one; a
        bound relative to a missing reference is not checked), cheapest first."""
        if not isinstance(row, np.ndarray):
            return f"not an array ({type(row).__name__})"
        if row.dtype != self._dtype:
            return f"dtype {row.dtype}, expected {self.dtype}"
        if row.shape != self.shape:
            return f"shape {row.shape}, expected {self.shape}"
        if not finite_known and not np.isfinite(row).all():
            return "non-finite values"
        if self.value_range is not None and row.size:
            low, high = self.value_range
            slack = 1e-9 * max(abs(low), abs(high))  # as the norm's: rounding of a value at the bound
            smallest, largest = row.min(), row.max()
            if smallest < low - slack or largest > high + slack:
                return (f"values in [{smallest:.6g}, {largest:.6g}], outside [{low:.6g}, {high:.6g}] where "
                        "every honest node's are")
        if self.max_norm is not None and (self.relative_to is None or reference is not None):
            bound = self.max_norm
            if self.relative_to is not None and self.norm_growth:
                bound += self.norm_growth * _norm(reference)
            norm = _norm(row - reference if self.relative_to is not None and self.centred else row)
            if not norm <= bound * (1 + 1e-9):  # an overflow to inf is above every bound
                return f"norm {norm:.6g} above the bound {bound:.6g} no honest node exceeds"
        return None


def _norm(values: np.ndarray) -> float:
    """The L2 (Frobenius) norm by one dot product: several times faster than np.linalg.norm's
    scaled sum on the coordinator's hot path; a sum of squares that overflows gives inf (refused)."""
    return math.sqrt(float(np.vdot(values, values).real))


def check_tensors(specs: Mapping[str, TensorSpec], tensors: Mapping[str, Any],
                  reference: Mapping[str, np.ndarray] | None = None, *, finite_known: bool = False) -> str | None:
    """Why ``tensors`` (one node's, by name) do not match ``specs`` exactly; None if they do.
    ``reference``: the node's downlink rows, for norm bounds measured from one of them;
    ``finite_known``: see :meth:`TensorSpec.problem`."""
    if tensors.keys() != specs.keys():
        return f"tensors {sorted(tensors)}, expected {sorted(specs)}"
    for name, spec in specs.items():
        ref = reference.get(spec.relative_to) if reference is not None and spec.relative_to else None
        problem = spec.problem(tensors[name], ref, finite_known=finite_known)
        if problem is not None:
            return f"{name}: {problem}"
    return None


def round_uplink_spec(algorithm: Any, state: "State", ctx: "RoundContext") -> dict[str, TensorSpec]:
    """The uplink spec of round ``ctx``: the algorithm's ``round_uplink_spec(state, ctx)`` when its
    bounds depend on the round's state (DWFL: how far a node's new model can be from the one it was
    sent depends on how far apart the models are), else its ``uplink_spec()``."""
    own = getattr(algorithm, "round_uplink_spec", None)
    return own(state, ctx) if own is not None else algorithm.uplink_spec()


def round_signal_spec(channel: Any, state: "State", ctx: "RoundContext") -> TensorSpec:
    """A channel half's transmit signal of round ``ctx``, with the round's power bound when the half
    offers ``round_signal_spec(state, ctx)``, else its ``signal_spec()``."""
    own = getattr(channel, "round_signal_spec", None)
    return own(state, ctx) if own is not None else channel.signal_spec()


def received_spec(channel: Any, ctx: "RoundContext") -> TensorSpec:
    """What one node receives from a channel half in round ``ctx``: the half's
    ``received_spec(ctx)`` when it delivers something else than a signal's shape (D-PSGD's and
    gossip's neighbours' payloads apart, for a robust rule), else its ``signal_spec()``."""
    own = getattr(channel, "received_spec", None)
    return own(ctx) if own is not None else channel.signal_spec()


@dataclass(frozen=True)
class MetricSpec:
    """One per-node metric an algorithm's node step reports (``NodeResult.metrics``), as a reply
    from outside must carry it: a finite number in ``[low, high]``, a whole one if ``integer``.

    Example::

        >>> MetricSpec(low=1, high=600, integer=True).problem(600.0), MetricSpec(high=1.0).problem(2.5)
        (None, 'value 2.5 outside [0, 1]')
    """

    low: float = 0.0
    high: float = float("inf")
    integer: bool = False

    def problem(self, value: Any) -> str | None:
        """Why ``value`` (as received) is not this metric; None if it is."""
        # A float's finiteness without numpy's scalar machinery (every reply's metrics, on the
        # coordinator's hot path); an int's as before.
        if value.__class__ is float:
            if not math.isfinite(value):
                return f"value {value!r:.40} is not a finite number"
        elif value.__class__ is not int or finite_real(value) is None:  # an int past float64's range too
            return f"value {value!r:.40} is not a finite number"
        if not self.low <= value <= self.high:
            return f"value {value!r:.40} outside [{self.low:g}, {self.high:g}]"
        if self.integer and value != int(value):
            return f"value {value!r:.40} is not a whole number"
        return None


#: A node's count of training samples, the metric most node steps report (no server step reads it).
SAMPLES_METRIC = MetricSpec(low=1, high=2**31 - 1, integer=True)


def metric_specs(algorithm: Any) -> dict[str, MetricSpec]:
    """The metrics ``algorithm`` declares (its optional ``metric_spec()``; none without one): a
    reply must carry exactly these names, each within its spec."""
    declare = getattr(algorithm, "metric_spec", None)
    return declare() if declare is not None else {}


def check_metrics(specs: Mapping[str, MetricSpec], metrics: Any) -> str | None:
    """Why ``metrics`` (one node's, name → number, as received) are not exactly ``specs``; None
    if they are."""
    if not isinstance(metrics, dict) or metrics.keys() != specs.keys():
        names = sorted(map(str, metrics))[:10] if isinstance(metrics, dict) else type(metrics).__name__
        return f"metrics {names}, declared {sorted(specs)}"
    for name, spec in specs.items():
        problem = spec.problem(metrics[name])
        if problem is not None:
            return f"metric {name}: {problem}"
    return None


@dataclass(frozen=True)
class RoundContext:
    """What every step knows of the round.

    Attributes:
        round_index: r (0-based), or SETUP_ROUND.
        seed: the run's seed (keys every random stream).
        num_nodes: N, all nodes of the run.
        expected: the nodes asked to take part, ascending (live sampled nodes, less emulated
            stragglers).
        answered: the nodes whose release reached the server or the channel (filled in for
            ``node_finish`` and ``server_step``).
        stragglers: sampled nodes that did not answer or were not asked (emulated stragglers,
            offline nodes).
        sampled: the nodes this round samples (testbed.rounds.client_sampling), ascending; None: all N.
            A node not sampled is neither expected nor a straggler.
        secrets: node → its secret (testbed.streams.node_secret), which keys that node's private draws
            (noise, batches, scores: testbed.streams.rng.PRIVATE_PURPOSES); only a board stepping itself
            holds one, the coordinator and sim never do (None: every draw from ``seed``).
        server_secret: the coordinator's own secret, which keys the server's private draws
            (:func:`server_stream`); over MQTT only, when a node has a secret of its own (None:
            the run seed, what sim and an all-emulated run draw from, bit for bit).
    """

    round_index: int
    seed: int
    num_nodes: int
    expected: tuple[int, ...]
    answered: tuple[int, ...] = ()
    stragglers: tuple[int, ...] = ()
    sampled: tuple[int, ...] | None = None
    secrets: "Secrets | None" = field(default=None, compare=False, repr=False)
    server_secret: "NodeSecret | None" = field(default=None, compare=False, repr=False)

    @classmethod
    def everyone(cls, round_index: int, seed: int, num_nodes: int) -> "RoundContext":
        """The context of a round every node of the run is asked to take part in."""
        return cls(round_index, seed, num_nodes, tuple(range(num_nodes)))

    @property
    def participants(self) -> tuple[int, ...]:
        """The nodes the round is for: the sampled ones, or all N."""
        return tuple(range(self.num_nodes)) if self.sampled is None else self.sampled

    @property
    def absent(self) -> tuple[int, ...]:
        """Sampled nodes not asked to take part (emulated stragglers, offline nodes)."""
        asked = set(self.expected)
        return tuple(n for n in self.participants if n not in asked)

    def closed(self, answered: Sequence[int]) -> "RoundContext":
        """The context once the round closed with ``answered`` (every other participant straggled)."""
        heard = tuple(sorted(int(n) for n in answered))
        silent = tuple(sorted(set(self.participants) - set(heard)))
        return replace(self, answered=heard, stragglers=silent)


@dataclass(frozen=True)
class NodeResult:
    """What a stack of nodes produced in one step.

    Attributes:
        node_ids: (M,) the nodes, in row order.
        tensors: name → (M, ...) what each node sends (``uplink_spec``, or the transmit signal).
        metrics: name → (M,) per-node numbers the server may use or report ("samples": training
            samples, "weight": its aggregation weight, a quality score...).
        events: per node, the ledger events of the step (compute, communication, privacy); a
            :class:`~testbed.ledger.events.NodeEvents` reads the same and is charged as columns.
        carry: name → (M, ...) what a node keeps for ``node_finish`` (never sent).
    """

    node_ids: tuple[int, ...]
    tensors: dict[str, np.ndarray]
    metrics: dict[str, np.ndarray] = field(default_factory=dict)
    events: list[list["Event"]] = field(default_factory=list)
    carry: dict[str, np.ndarray] = field(default_factory=dict)

    def rows(self, node: int) -> dict[str, np.ndarray]:
        """One node's tensors (its rows, without the node axis)."""
        i = self.node_ids.index(node)
        return {name: value[i] for name, value in self.tensors.items()}


@dataclass(frozen=True)
class ServerResult:
    """The server step's output: the new state and the events it issued on behalf of nodes
    (each event's ``node`` says whose ledger it belongs to)."""

    state: State
    events: list["Event"] = field(default_factory=list)


@runtime_checkable
class Algorithm(Protocol):
    """What every registered algorithm provides (see the module docstring for the round)."""

    model: "Model"
    #: whether ``setup_step``/``server_setup`` run once before round 1.
    has_setup: bool

    @property
    def rounds(self) -> int: ...

    @property
    def flops_per_step(self) -> float:
        """Floating-point operations of one node's local step (the deadline straggler model's
        compute time), a model: ~6 × batch × parameters for a gradient step."""
        ...

    def init_state(self, params0: np.ndarray) -> State: ...

    def state_spec(self) -> dict[str, TensorSpec]:
        """Names, shapes (whole arrays, not rows) and dtypes of the state, for checkpoint checks."""
        ...

    def downlink_spec(self) -> dict[str, TensorSpec]: ...

    def uplink_spec(self) -> dict[str, TensorSpec]: ...

    # Optional: ``metric_spec() -> dict[str, MetricSpec]``, the per-node metrics the node step
    # reports (read through :func:`metric_specs`; an algorithm without it reports none).

    def planned_events(self, node: int, ctx: RoundContext) -> list["Event"]:
        """The events the round will cause on ``node`` if it takes part (budgets check them before)."""
        ...

    def downlink(self, state: State, ctx: RoundContext, node_ids: Sequence[int]) -> dict[str, np.ndarray]: ...

    def node_step(self, received: Mapping[str, np.ndarray], train: "Split", node_ids: Sequence[int],
                  ctx: RoundContext) -> NodeResult: ...

    def server_step(self, state: State, result: NodeResult, ctx: RoundContext) -> ServerResult: ...

    def eval_params(self, state: State) -> np.ndarray:
        """(P,) the model to evaluate (the global model, or the nodes' average)."""
        ...

    def describe(self) -> dict[str, Any]:
        """What the summary reports of the algorithm's settings and privacy."""
        ...


@runtime_checkable
class WithSetup(Protocol):
    """The optional one-time phase before round 1 (``has_setup = True``)."""

    def setup_spec(self) -> dict[str, TensorSpec]: ...

    def setup_events(self, node: int) -> list["Event"]: ...

    def setup_step(self, train: "Split", node_ids: Sequence[int], ctx: RoundContext) -> NodeResult: ...

    def server_setup(self, state: State, result: NodeResult, ctx: RoundContext) -> ServerResult: ...


@runtime_checkable
class ChannelHalf(Protocol):
    """The channel's side of an over-the-air round: what every receiver hears. The channel
    emulator is built from this (``Registration.channel``), never from an algorithm's name."""

    def signal_spec(self) -> TensorSpec:
        """One node's transmit signal."""
        ...

    def superpose(self, signals: np.ndarray, channel: Mapping[str, np.ndarray], ctx: RoundContext,
                  out: np.ndarray | None = None) -> np.ndarray:
        """(N, ...) transmit signals (zero rows for silent nodes; ``ctx.answered`` are the senders)
        → (N, ...) what each node receives. ``out`` may be ``signals`` (overwritten)."""
        ...


@runtime_checkable
class OverTheAir(Protocol):
    """An algorithm whose nodes exchange analog signals through the channel between the node step
    and the server step. ``node_step`` returns the transmit signal as ``tensors["signal"]`` and
    what the node keeps in ``carry``; ``node_finish`` turns what it received into its update."""

    @property
    def channel(self) -> ChannelHalf: ...

    def channel_tensors(self, ctx: RoundContext) -> dict[str, np.ndarray]:
        """What the channel needs for the round besides the signals (DWFL: the channel h), the
        same tensors every node receives with its downlink."""
        ...

    def use_channel(self, downlink: Mapping[str, np.ndarray], round_index: int) -> None:
        """A node learns the round's channel from its downlink (one node's rows), before it plans
        the round's events (a board does not draw the channel itself)."""
        ...

    def node_finish(self, carry: Mapping[str, np.ndarray], received: np.ndarray, node_ids: Sequence[int],
                    ctx: RoundContext) -> NodeResult: ...


class ChannelView(Protocol):
    """What the live view draws of an over-the-air algorithm's channel (``Registration.channel_view``):
    each node's link, round by round, drawn as the run draws it."""

    def block_of(self, round_index: int) -> int:
        """The fading block of round ``round_index`` (r >= 0): the links change only between blocks."""
        ...

    def links(self, round_index: int) -> tuple[np.ndarray, np.ndarray]:
        """(N,) each node's channel gain and (N,) its received SNR at full power (linear, not dB) in
        round ``round_index`` (r >= 0)."""
        ...


class GraphView(Protocol):
    """What the live view draws of a decentralised algorithm's graph (``Registration.graph_view``):
    who hears whom, round by round, drawn as the run draws it."""

    def block_of(self, round_index: int) -> int:
        """The block of round ``round_index`` (r >= 0): the graph changes only between blocks."""
        ...

    def edges(self, round_index: int) -> np.ndarray:
        """(E, 2) int the round's edges, each once (i < j)."""
        ...

    def positions(self, round_index: int) -> np.ndarray | None:
        """(N, 2) the nodes' positions in the round, m, or None when the graph has no geometry."""
        ...


@dataclass(frozen=True)
class McuTask:
    """One round of one node, as a microcontroller board receives it (the firmware's node step,
    docs/serial-protocol.md § "The node step").

    Attributes:
        seed: the generator's key: the run's seed, or on a board with a secret the key its
            secret derives for the round (NodeSecret.philox_seed; :func:`mcu_seed`). node,
            round_index: the stream's counter words.
        tau: local steps τ. batch: mini-batch size B. lr: η. sigma: noise std σ (0: no noise).
        n_classes: C (the model has P = dC + C parameters, d the data's features).
    """

    seed: int
    node: int
    round_index: int
    tau: int
    batch: int
    lr: float
    sigma: float
    n_classes: int


def server_stream(ctx: RoundContext, purpose: Purpose) -> np.random.Generator:
    """The server's stream of round ``ctx`` for ``purpose``: ``stream(seed, GLOBAL, r, purpose)``,
    a private purpose keyed by ``ctx.server_secret`` when the coordinator holds one, so that the
    public, which reads the seed in every round's experiment, cannot regenerate the server's noise
    and subtract it from a broadcast."""
    return stream(ctx.seed, GLOBAL, ctx.round_index, purpose, ctx.server_secret)


def mcu_seed(node: int, ctx: RoundContext) -> int:
    """The Philox key of ``node``'s round on a microcontroller: derived from the node's secret
    when ``ctx`` holds one (its private draws then unknown to whoever holds the seed), else the
    run's seed."""
    secret = ctx.secrets.get(int(node)) if ctx.secrets else None
    return ctx.seed if secret is None else secret.philox_seed(ctx.seed, node, ctx.round_index)


@runtime_checkable
class RunsOnMcu(Protocol):
    """An algorithm whose node step a microcontroller board can run (the bridge asks it)."""

    def mcu_task(self, node: int, ctx: RoundContext) -> McuTask:
        """The board's task for ``node`` in round ``ctx``; ValueError if the board cannot run it."""
        ...

    def mcu_result(self, update: np.ndarray, train: "Split", node: int, ctx: RoundContext) -> NodeResult:
        """The node step's result from the board's (P,) update."""
        ...


def planned_batch(algorithm: Algorithm, node_ids: Sequence[int], ctx: RoundContext) -> "NodeEvents | list[list[Event]]":
    """What ``planned_events`` plans for each of ``node_ids``, as the contract's per-node lists,
    and as columns where it can be (a :class:`~testbed.ledger.events.NodeEvents`, charged and logged
    without an object per node): the algorithm's own ``planned_batch(node_ids, ctx)`` if it has
    one, else its per-node plans gathered (plain lists when the nodes' plans differ in kind)."""
    own = getattr(algorithm, "planned_batch", None)
    return own(node_ids, ctx) if own is not None else gathered_plans(algorithm, node_ids, ctx)


def gathered_plans(algorithm: Algorithm, node_ids: Sequence[int], ctx: RoundContext) -> "NodeEvents | list[list[Event]]":
    """``planned_events`` of each of ``node_ids`` in turn, as columns where the nodes' plans are
    alike in kind (a :class:`~testbed.ledger.events.NodeEvents`), else the plain per-node lists."""
    from testbed.ledger.events import NodeEvents

    lists = [algorithm.planned_events(int(n), ctx) for n in node_ids]
    return NodeEvents.from_lists(lists, node_ids) or lists


def is_over_the_air(algorithm: Any) -> bool:
    return isinstance(algorithm, OverTheAir)
