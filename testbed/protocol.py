"""The messages of a federated round over a transport: what the coordinator and a node say.

Each is a wire message (testbed.wire: JSON header plus tensors). The coordinator broadcasts a
``round`` carrying the whole experiment (its resolved TOML) and the state every node starts from,
so a node that joins or comes back mid-run needs nothing else; a node answers with an ``update``
(its tensors and the ledger events of the round) or a ``refused`` (a budget it would break).

Over-the-air algorithms (DWFL) put the channel emulator in the middle of a round: the coordinator
tells it which nodes will transmit (``transmit``, on ``chan``) and sends each node its own model
(``round`` on the node's downlink); each node answers the channel with its transmit ``signal``;
the channel sends each sender only what it received (``received``); the node finishes its update
and answers the coordinator with an ``update`` carrying its new model.

``session`` is a random id of one coordinator run: replies carrying another session (a stale
node, a resumed run's predecessor) are ignored.

Example::

    >>> import numpy as np
    >>> raw = update(run="r1", session="s", round_index=3, node=7, tensors={"params": np.zeros(2)}, events=[])
    >>> msg = wire.decode(raw)
    >>> msg.kind, msg.round, msg.sender, parse_events(msg, node=7)
    ('update', 3, '7', [])
"""

from __future__ import annotations

from typing import Any, Mapping, NamedTuple, Sequence

import numpy as np

from testbed import wire
from testbed.ledger import Event, event_from_dict, event_to_dict

ROUND, UPDATE, REFUSED, STOP = "round", "update", "refused", "stop"
TRANSMIT, SIGNAL, RECEIVED = "transmit", "signal", "received"
COORDINATOR = "coordinator"
CHANNEL = "channel"


class Reply(NamedTuple):
    """A node's answer: ``to`` is COORDINATOR (update, refused) or CHANNEL (signal)."""

    to: str
    payload: bytes


def round_(run: str, session: str, round_index: int, config_toml: str,
           tensors: Mapping[str, np.ndarray]) -> bytes:
    """Coordinator → nodes: run round ``round_index`` of the experiment ``config_toml`` from ``tensors``."""
    return wire.encode({"run": run, "round": round_index, "sender": COORDINATOR, "kind": ROUND,
                        "meta": {"session": session, "config": config_toml}}, tensors)


def update(run: str, session: str, round_index: int, node: int, tensors: Mapping[str, np.ndarray],
           events: Sequence[Event]) -> bytes:
    """Node → coordinator: what the node sends after its step, and the events it caused."""
    return wire.encode({"run": run, "round": round_index, "sender": str(node), "kind": UPDATE,
                        "meta": {"session": session, "events": [event_to_dict(e) for e in events]}}, tensors)


def refused(run: str, session: str, round_index: int, node: int, budget: str, would_be: float,
            limit: float) -> bytes:
    """Node → coordinator: the node will not run this round, it would break ``budget``."""
    return wire.encode({"run": run, "round": round_index, "sender": str(node), "kind": REFUSED,
                        "meta": {"session": session, "budget": budget, "would_be": would_be, "limit": limit}})


def stop(run: str, session: str, status: str) -> bytes:
    """Coordinator → nodes: the run is over (``status`` as in summary.json)."""
    return wire.encode({"run": run, "round": 0, "sender": COORDINATOR, "kind": STOP,
                        "meta": {"session": session, "status": status}})


def transmit(run: str, session: str, round_index: int, config_toml: str, senders: Sequence[int],
             signal_timeout_s: float, tensors: Mapping[str, np.ndarray]) -> bytes:
    """Coordinator → channel: round ``round_index`` of ``config_toml`` is on, on the channel in
    ``tensors`` (what the algorithm shares with every node, e.g. DWFL's ``channel_h``); expect the
    signals of ``senders`` for at most ``signal_timeout_s`` seconds."""
    return wire.encode({"run": run, "round": round_index, "sender": COORDINATOR, "kind": TRANSMIT,
                        "meta": {"session": session, "config": config_toml, "senders": [int(n) for n in senders],
                                 "signal_timeout_s": signal_timeout_s}}, tensors)


def signal(run: str, session: str, round_index: int, node: int, signal_row: np.ndarray) -> bytes:
    """Node → channel: the node's transmit signal of the round, (P,) real, sqrt(W)."""
    return wire.encode({"run": run, "round": round_index, "sender": str(node), "kind": SIGNAL,
                        "meta": {"session": session}}, {"signal": signal_row})


def received(run: str, session: str, round_index: int, senders: Sequence[int], received_row: np.ndarray) -> bytes:
    """Channel → one node: what it received in the round, and which nodes transmitted."""
    return wire.encode({"run": run, "round": round_index, "sender": CHANNEL, "kind": RECEIVED,
                        "meta": {"session": session, "senders": [int(n) for n in senders]}},
                       {"received": received_row})


def senders_of(msg: wire.Message) -> list[int]:
    """The ``senders`` list of a transmit or received message; raises WireError unless it is a
    list of node ids."""
    raw: Any = msg.meta.get("senders")
    if not isinstance(raw, list) or not all(isinstance(n, int) and not isinstance(n, bool) for n in raw):
        raise wire.WireError("bad_header", f"{msg.kind} without a list of sender ids")
    return raw


def session_of(msg: wire.Message) -> str | None:
    value = msg.meta.get("session")
    return value if isinstance(value, str) else None


def parse_events(msg: wire.Message, node: int) -> list[Event]:
    """The ledger events of an ``update``; raises WireError unless they are well formed, all of
    ``node`` and all of the message's round (a node cannot charge another node or round)."""
    raw: Any = msg.meta.get("events")
    if not isinstance(raw, list):
        raise wire.WireError("bad_header", "update without an events list")
    try:
        events = [event_from_dict(item) for item in raw]
    except (TypeError, ValueError) as exc:
        raise wire.WireError("bad_header", f"malformed ledger event: {exc}") from None
    for event in events:
        if event.node != node or event.round != msg.round:
            raise wire.WireError("wrong_sender", f"event of node {event.node} round {event.round} "
                                                 f"in an update of node {node} round {msg.round}")
    return events
