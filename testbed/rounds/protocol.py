"""The messages of a federated round over a transport: what the coordinator, a node and the
channel say. Nothing here names an algorithm: tensors are the ones the algorithm declares.

Each is a wire message (testbed.mqtt.wire: JSON header plus tensors). The coordinator sends a
``round`` carrying the whole experiment (its resolved TOML), the nodes expected to take part, the
events the server issued on a node's behalf since its last round (``charges``) and the node's
downlink tensors: once on the broadcast topic when every node gets the same, else on each node's
own downlink with its own rows. A node answers with an ``update`` (its uplink tensors, per-node
metrics and the ledger events of the round) or a ``refused`` (a budget it would break). A node not
among ``expected`` (an emulated straggler) does nothing. ``setup`` asks every node for the
algorithm's one-time upload, answered by a ``setup_update``.

Over-the-air algorithms put the channel emulator in the middle of a round: the coordinator tells it
which nodes will transmit, the signal's shape and the channel (``transmit``, on ``chan``); each node
answers the round with its transmit ``signal`` to the channel; the channel sends each sender only
what it received (``received``); the node finishes its update and answers the coordinator.

Before the first round (or the setup) of a session the coordinator sends a ``prepare`` carrying the
experiment and the nodes it waits for; each node builds its experiment (loads its data, builds the
model) and answers ``ready`` with the experiment file's SHA-256 and which randomness keys its private
draws ("node_secret": a key the coordinator never holds; "run_seed": the run's seed), so that the first round's deadline
starts once the nodes can run it rather than while they are still building it.

A ``stop`` ends the run; each node answers it (and sends it unasked when it leaves before the stop:
a signal, its host shutting down) with a ``ledger`` report of its own ledger for the session (the rounds it logged, its totals), so that the coordinator charges whatever a node released
but the coordinator never received, and can say which figures the node confirmed.

``session`` is a random id of one coordinator run: replies carrying another session (a stale node,
a resumed run's predecessor) are ignored.

Example::

    >>> import numpy as np
    >>> raw = update(run="r1", session="s", round_index=3, node=7, tensors={"update": np.zeros(2)}, events=[])
    >>> msg = wire.decode(raw)
    >>> msg.kind, msg.round, msg.sender, msg.meta["events"], msg.meta["metrics"]
    ('update', 3, '7', [], {})
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

from testbed.algorithms.contract import SETUP_ROUND, TensorSpec
from testbed.ledger.events import Event
from testbed.ledger.fields import ABSURD, event_from_dict, event_to_dict
from testbed.ledger.node import NodeLedger, Totals
from testbed.mqtt import wire
from testbed.streams.node_secret import RANDOMNESS, RUN_SEED
from testbed.util.memo import remember_last
from testbed.util.numbers import finite_real

ROUND, UPDATE, REFUSED, STOP = "round", "update", "refused", "stop"
LEDGER = "ledger"  # node → coordinator, answering a stop or leaving: what its own ledger logged this session
SETUP, SETUP_UPDATE = "setup", "setup_update"
PREPARE, READY = "prepare", "ready"  # coordinator → nodes before the first round; node → coordinator once built
TRANSMIT, SIGNAL, RECEIVED = "transmit", "signal", "received"
COORDINATOR = "coordinator"
CHANNEL = "channel"


class Reply:
    """A node's answer: ``to`` is COORDINATOR (update, refused, ledger report) or CHANNEL (signal);
    ``message`` is its wire message, as bytes or as a :class:`wire.Draft` (an update or a ledger
    report: a host may send it as a row under a header its other nodes' share,
    testbed.mqtt.shared_header). ``payload`` is its bytes either way, the same at every ask.
    Unpacks as ``(to, payload)``."""

    __slots__ = ("to", "message")

    def __init__(self, to: str, message: bytes | wire.Draft):
        self.to = to
        self.message = message

    @property
    def payload(self) -> bytes:
        m = self.message
        return m if isinstance(m, bytes) else m.encode()

    def __iter__(self) -> Iterator[Any]:
        return iter((self.to, self.payload))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Reply) and (self.to, self.payload) == (other.to, other.payload)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Reply(to={self.to!r}, {type(self.message).__name__})"


def _meta(session: str, **items: Any) -> dict[str, Any]:
    return {"session": session, **items}


def round_(run: str, session: str, round_index: int, config_toml: str, expected: Sequence[int],
           tensors: Mapping[str, np.ndarray], charges: Sequence[Event] = ()) -> bytes:
    """Coordinator → nodes: run round ``round_index`` of ``config_toml`` if you are ``expected``."""
    return wire.encode({"run": run, "round": round_index, "sender": COORDINATOR, "kind": ROUND,
                        "meta": _meta(session, config=config_toml, expected=[int(n) for n in expected],
                                      charges=[event_to_dict(e) for e in charges])}, tensors)


def setup(run: str, session: str, config_toml: str, expected: Sequence[int]) -> bytes:
    """Coordinator → nodes: run the algorithm's one-time setup step."""
    return wire.encode({"run": run, "round": 0, "sender": COORDINATOR, "kind": SETUP,
                        "meta": _meta(session, config=config_toml, expected=[int(n) for n in expected])})


def prepare(run: str, session: str, config_toml: str, expected: Sequence[int]) -> bytes:
    """Coordinator → nodes, before the session's first round or setup: build the experiment of
    ``config_toml`` (load your data, build the model) and answer ``ready`` if you are ``expected``."""
    return wire.encode({"run": run, "round": 0, "sender": COORDINATOR, "kind": PREPARE,
                        "meta": _meta(session, config=config_toml, expected=[int(n) for n in expected])})


def ready(run: str, session: str, node: int, experiment: str, randomness: str = RUN_SEED) -> bytes:
    """Node → coordinator, answering a prepare: the experiment whose SHA-256 is ``experiment`` is
    built, the node can run its rounds; its private draws come from ``randomness``
    (testbed.streams.node_secret.RANDOMNESS: which kind, never the key)."""
    return wire.encode({"run": run, "round": 0, "sender": str(node), "kind": READY,
                        "meta": _meta(session, experiment=experiment, randomness=randomness)})


_SHA256_HEX = re.compile(r"[0-9a-f]{64}")


def ready_of(msg: wire.Message) -> str:
    """The experiment key (SHA-256, 64 lowercase hex digits) a ``ready`` names; WireError unless its
    header's round is 0 and its meta holds exactly ``session``, ``experiment`` and (optionally)
    ``randomness``, one of testbed.streams.node_secret.RANDOMNESS."""
    meta = msg.meta
    if msg.round != 0 or meta.keys() - {"randomness"} != {"session", "experiment"} \
            or not isinstance(meta["experiment"], str) or not _SHA256_HEX.fullmatch(meta["experiment"]):
        raise wire.WireError("bad_header", "a ready needs round 0 and exactly a session and an experiment "
                                           "(its file's SHA-256 in hex), and may say its randomness")
    randomness_of(msg)
    return meta["experiment"]


def randomness_of(msg: wire.Message) -> str:
    """Which randomness a ``ready``'s node says keys its private draws: "node_secret" or
    "run_seed"; a ready that does not say (an older node) counts as "run_seed", the weaker claim.
    WireError for anything else."""
    value = msg.meta.get("randomness", RUN_SEED)
    if value not in RANDOMNESS or not isinstance(value, str):
        raise wire.WireError("bad_header", f"a ready's randomness must be one of {', '.join(RANDOMNESS)}, "
                                           f"got {value!r:.40}")
    return value


@remember_last  # a host's nodes read one broadcast, one config text: hashed once
def experiment_key(config_toml: str) -> str:
    """The SHA-256 (hex) of an experiment file: what a node's ``ready`` names."""
    return hashlib.sha256(config_toml.encode()).hexdigest()


def update(run: str, session: str, round_index: int, node: int, tensors: Mapping[str, np.ndarray],
           events: Sequence[Event], metrics: Mapping[str, float] | None = None, kind: str = UPDATE) -> bytes:
    """Node → coordinator: what the node sends after its step, its metrics and the events it caused
    (``kind`` SETUP_UPDATE for the setup step, whose wire round is 0)."""
    return update_draft(run, session, round_index, node, tensors, events, metrics, kind).encode()


def update_draft(run: str, session: str, round_index: int, node: int, tensors: Mapping[str, np.ndarray],
                 events: Sequence[Event], metrics: Mapping[str, float] | None = None,
                 kind: str = UPDATE) -> wire.Draft:
    """:func:`update`'s message before it is laid out (a host may send it as a row, :class:`Reply`)."""
    return wire.draft({"run": run, "round": max(round_index, 0), "sender": str(node), "kind": kind,
                       "meta": _update_meta(session, events, metrics or {})}, tensors)


def _update_meta(session: str, events: Sequence[Event], metrics: Mapping[str, Any]) -> dict[str, Any]:
    """An update's meta: its session, its events and its metrics (each a float)."""
    return _meta(session, events=[event_to_dict(e) for e in events], metrics={k: float(v) for k, v in metrics.items()})


def update_drafts(run: str, session: str, round_index: int, nodes: Sequence[int],
                  tensors: Mapping[str, np.ndarray], events: Sequence[Sequence[Event]],
                  metrics: Mapping[str, np.ndarray] | None = None, kind: str = UPDATE) -> list[wire.Draft | wire.WireError]:
    """:func:`update_draft` of each of ``nodes`` (row ``i`` of every stacked tensor and metric,
    ``events[i]``), drafted together (wire.drafts): a host's replies to one round. A node whose
    row fails its checks (a non-finite value) is its WireError."""
    rows = [(str(node), _update_meta(session, node_events, {k: v[i] for k, v in (metrics or {}).items()}))
            for i, (node, node_events) in enumerate(zip(nodes, events))]
    return wire.drafts({"run": run, "round": max(round_index, 0), "kind": kind}, rows, tensors)


def refused(run: str, session: str, round_index: int, node: int, budget: str, would_be: float,
            limit: float) -> bytes:
    """Node → coordinator: the node will not run this round, it would break ``budget``."""
    return wire.encode({"run": run, "round": max(round_index, 0), "sender": str(node), "kind": REFUSED,
                        "meta": _meta(session, budget=budget, would_be=would_be, limit=limit)})


def stop(run: str, session: str, status: str, round_index: int, earlier_sessions: Sequence[str] = ()) -> bytes:
    """Coordinator → nodes: the run is over (``status`` as in summary.json) after round
    ``round_index``, the last the coordinator sent: a node's replay guard rejects a message of a
    round before its window, and a stop of round 0 never reached a run's nodes past round 16.
    ``earlier_sessions``: the run's sessions before this one (a resumed run's), whose ledgers a
    node adds to its report (:func:`earlier_sessions_of`)."""
    return wire.encode({"run": run, "round": round_index, "sender": COORDINATOR, "kind": STOP,
                        "meta": _meta(session, status=status, earlier_sessions=list(earlier_sessions))})


#: At most this many earlier sessions named in a stop (a run resumed this often is still reported).
MAX_EARLIER_SESSIONS = 1000


def earlier_sessions_of(msg: wire.Message) -> tuple[str, ...]:
    """The earlier sessions a stop names: ids (wire.ID_PATTERN), at most MAX_EARLIER_SESSIONS;
    WireError otherwise. A stop without the key (an older coordinator) names none."""
    value = msg.meta.get("earlier_sessions", [])
    if not isinstance(value, list) or len(value) > MAX_EARLIER_SESSIONS or \
            not all(isinstance(s, str) and wire.ID_PATTERN.fullmatch(s) for s in value):
        raise wire.WireError("bad_header", f"a stop's earlier_sessions must be at most {MAX_EARLIER_SESSIONS} ids")
    return tuple(value)


@dataclass(frozen=True)
class LedgerReport:
    """A node's own ledger of one session, as it reports it when the run stops.

    Attributes:
        rounds: the rounds whose events the node logged itself, as sorted disjoint half-open
            intervals ``(start, stop)`` (testbed.ledger.node.RoundSet); the setup is round SETUP_ROUND.
        totals: its running totals (testbed.ledger.node.Totals' fields).
    """

    rounds: tuple[tuple[int, int], ...]
    totals: Totals

    def round_indices(self) -> Iterator[int]:
        """Every round the node logged, in order."""
        for start, stop_ in self.rounds:
            yield from range(start, stop_)

    def merged(self, other: "LedgerReport") -> "LedgerReport":
        """Two reports of one node's ledger of one session (one as it left, one at the stop, in
        either order): every round either logged, each total the larger (a ledger only grows)."""
        rounds: list[tuple[int, int]] = []
        for start, stop_ in sorted(self.rounds + other.rounds):
            if rounds and start <= rounds[-1][1]:
                rounds[-1] = (rounds[-1][0], max(rounds[-1][1], stop_))
            else:
                rounds.append((start, stop_))
        return LedgerReport(tuple(rounds), Totals(**{name: max(getattr(self.totals, name), getattr(other.totals, name))
                                                     for name in _TOTAL_TYPES}))


#: At most this many intervals of logged rounds in a report (a node that answered every other round
#: of a 20,000-round run); a longer list is refused before anything is built from it.
MAX_REPORT_INTERVALS = 10_000
_TOTAL_TYPES = {f.name: (int if f.type in ("int", int) else float) for f in dataclasses.fields(Totals)}


def ledger_report(run: str, session: str, round_index: int, node: int, ledger: NodeLedger,
                  totals: Totals | None = None) -> wire.Draft:
    """Node → coordinator, answering the stop of round ``round_index``: ``ledger``'s rounds (this
    session's) and ``totals`` (default: the ledger's; a node reports its whole run's, every session
    it kept, so that the coordinator's summary is raised to what earlier sessions spent too). Not
    laid out (``.encode()`` gives its bytes): a host sends its nodes' reports to one stop as rows
    under one header, as their updates (:class:`Reply`)."""
    totals = {name: getattr(ledger.totals if totals is None else totals, name) for name in _TOTAL_TYPES}
    return wire.draft({"run": run, "round": max(round_index, 0), "sender": str(node), "kind": LEDGER,
                       "meta": _meta(session, rounds=[list(iv) for iv in ledger.rounds_logged.intervals],
                                     totals=totals)})


def report_of(msg: wire.Message) -> LedgerReport:
    """The ledger report a ``ledger`` message carries; WireError unless its rounds are sorted,
    disjoint intervals of round indices (at most :data:`MAX_REPORT_INTERVALS`, none past the
    message's round) and every total is a finite non-negative number of its field's type."""
    raw_rounds, raw_totals = msg.meta.get("rounds"), msg.meta.get("totals")
    if not isinstance(raw_rounds, list) or len(raw_rounds) > MAX_REPORT_INTERVALS:
        raise wire.WireError("bad_header", f"a ledger report needs at most {MAX_REPORT_INTERVALS} round intervals")
    rounds, last = [], SETUP_ROUND - 1
    for iv in raw_rounds:
        if not (isinstance(iv, list) and len(iv) == 2 and all(_whole(v) for v in iv)
                and last <= iv[0] < iv[1] <= msg.round + 1):
            raise wire.WireError("bad_header", f"ledger report interval {iv!r:.60}: not sorted, disjoint "
                                               f"[start, stop) within rounds {SETUP_ROUND}..{msg.round}")
        rounds.append((iv[0], iv[1]))
        last = iv[1]
    if not isinstance(raw_totals, dict) or raw_totals.keys() != _TOTAL_TYPES.keys():
        raise wire.WireError("bad_header", f"a ledger report needs the totals {sorted(_TOTAL_TYPES)}")
    for name, kind in _TOTAL_TYPES.items():
        value = raw_totals[name]
        if not (_whole(value) if kind is int else value.__class__ in (int, float)) \
                or not 0 <= value <= ABSURD:
            raise wire.WireError("bad_header", f"ledger report total {name} = {value!r:.40}: not a "
                                               f"{kind.__name__} in [0, {ABSURD:g}]")
    return LedgerReport(tuple(rounds), Totals(**{k: kind(raw_totals[k]) for k, kind in _TOTAL_TYPES.items()}))


def _whole(value: Any) -> bool:
    return value.__class__ is int and -2**62 < value < 2**62


def transmit(run: str, session: str, round_index: int, config_toml: str, senders: Sequence[int],
             signal_timeout_s: float, signal_spec: TensorSpec, tensors: Mapping[str, np.ndarray]) -> bytes:
    """Coordinator → channel: round ``round_index`` of ``config_toml`` is on, on the channel in
    ``tensors`` (e.g. DWFL's ``channel_h``); expect a signal of ``signal_spec`` from each of
    ``senders`` for at most ``signal_timeout_s`` seconds."""
    bound = {} if signal_spec.max_norm is None else {"signal_max_norm": float(signal_spec.max_norm)}
    return wire.encode({"run": run, "round": round_index, "sender": COORDINATOR, "kind": TRANSMIT,
                        "meta": _meta(session, config=config_toml, senders=[int(n) for n in senders],
                                      signal_timeout_s=signal_timeout_s, signal_shape=list(signal_spec.shape),
                                      signal_dtype=signal_spec.dtype, **bound)}, tensors)


def signal(run: str, session: str, round_index: int, node: int, signal_row: np.ndarray) -> bytes:
    """Node → channel: the node's transmit signal of the round."""
    return wire.encode({"run": run, "round": round_index, "sender": str(node), "kind": SIGNAL,
                        "meta": _meta(session)}, {"signal": signal_row})


def received(run: str, session: str, round_index: int, senders: Sequence[int], received_row: np.ndarray) -> bytes:
    """Channel → one node: what it received in the round, and which nodes transmitted."""
    return wire.encode({"run": run, "round": round_index, "sender": CHANNEL, "kind": RECEIVED,
                        "meta": _meta(session, senders=[int(n) for n in senders])}, {"received": received_row})


def _ids(msg: wire.Message, key: str) -> list[int]:
    raw: Any = msg.meta.get(key)
    if not isinstance(raw, list) or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in raw):
        raise wire.WireError("bad_header", f"{msg.kind} without a list of node ids in {key!r}")
    return raw


def senders_of(msg: wire.Message) -> list[int]:
    """The ``senders`` of a transmit or received message; WireError unless a list of node ids."""
    return _ids(msg, "senders")


@remember_last  # every node of an emulated host reads them from one broadcast: checked once
def expected_of(msg: wire.Message) -> tuple[int, ...]:
    """The ``expected`` nodes of a round or setup, in ascending order; WireError unless a list of
    node ids."""
    return tuple(sorted(_ids(msg, "expected")))


def session_of(msg: wire.Message) -> str | None:
    """The message's session id, or None when it carries none or one that is not an id
    (wire.ID_PATTERN: it names the node's ledger files, so never a path)."""
    value = msg.meta.get("session")
    return value if isinstance(value, str) and wire.ID_PATTERN.fullmatch(value) else None


def config_of(msg: wire.Message) -> str:
    value = msg.meta.get("config")
    if not isinstance(value, str) or session_of(msg) is None:
        raise wire.WireError("bad_header", f"a {msg.kind} needs a session and a config")
    return value


def signal_spec_of(msg: wire.Message) -> TensorSpec:
    """The signal shape, dtype and (optional) norm bound of the round a transmit notice declares."""
    shape, dtype = msg.meta.get("signal_shape"), msg.meta.get("signal_dtype")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d > 0 for d in shape) or dtype not in (
            "float64", "float32", "complex128"):
        raise wire.WireError("bad_header", "a transmit notice needs signal_shape and signal_dtype")
    bound = msg.meta.get("signal_max_norm")
    if bound is not None and not (bound.__class__ in (int, float) and (finite_real(bound) or 0.0) > 0):
        raise wire.WireError("bad_header", f"a transmit notice's signal_max_norm {bound!r:.40} is not a positive number")
    return TensorSpec(tuple(shape), dtype, max_norm=None if bound is None else float(bound))


def _events(raw: Any, what: str) -> list[Event]:
    if not isinstance(raw, list):
        raise wire.WireError("bad_header", f"{what} without an events list")
    try:
        return [event_from_dict(item) for item in raw]
    except (TypeError, ValueError) as exc:
        raise wire.WireError("bad_header", f"malformed ledger event: {exc}") from None


def charges_of(msg: wire.Message, node: int) -> list[Event]:
    """The events the server issued on ``node``'s behalf that a round carries (only the node's own,
    only server-issued, only of earlier rounds)."""
    events = _events(msg.meta.get("charges", []), "a round's charges")
    mine = [e for e in events if e.node == node]
    for event in mine:
        if getattr(event, "issuer", None) != "server" or not SETUP_ROUND <= event.round < msg.round:
            raise wire.WireError("bad_header", f"a charge of round {event.round} that the server did not issue "
                                               f"before round {msg.round}")
    return mine
