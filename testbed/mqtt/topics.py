"""MQTT topics of the testbed: versioned, scoped by run, one writer per topic.

    tb/v1/{run}/up/{node}       node -> coordinator   wire messages      writer: that node
    tb/v1/{run}/down/{node}     coordinator -> node   wire messages      writer: coordinator
    tb/v1/{run}/bcast           coordinator -> all    wire messages      writer: coordinator
    tb/v1/{run}/status/{node}   b"online"/b"offline", retained, the node's last will
    tb/v1/{run}/coord           coordinator status, retained, the coordinator's last will

Run and node ids match `testbed.wire.ID_PATTERN`, so they never contain '/', '+' or '#'. The
protocol version `v1` changes only when the topic layout does (the payload schema has its own
version in the wire header).
"""

from __future__ import annotations

import dataclasses

from testbed.wire import WireError, check_id

PREFIX = "tb"
VERSION = "v1"

UP, DOWN, BCAST, STATUS, COORD = "up", "down", "bcast", "status", "coord"
#: Kinds that carry wire messages (the others carry status strings).
DATA_KINDS = frozenset({UP, DOWN, BCAST})

STATUS_ONLINE = b"online"
STATUS_OFFLINE = b"offline"


class TopicError(ValueError):
    """A topic that is not one of the testbed's (wrong prefix, version, kind or id)."""


@dataclasses.dataclass(frozen=True)
class Topic:
    """A parsed topic: `node` is None for the run-wide kinds (bcast, coord)."""

    run: str
    kind: str
    node: str | None


def _base(run: str) -> str:
    try:
        check_id(run, "run id")
    except WireError as exc:
        raise TopicError(exc.reason) from None
    return f"{PREFIX}/{VERSION}/{run}"


def _node(node: str) -> str:
    try:
        return check_id(node, "node id")
    except WireError as exc:
        raise TopicError(exc.reason) from None


def up(run: str, node: str) -> str:
    """Topic a node publishes its messages on."""
    return f"{_base(run)}/{UP}/{_node(node)}"


def down(run: str, node: str) -> str:
    """Topic the coordinator publishes one node's messages on."""
    return f"{_base(run)}/{DOWN}/{_node(node)}"


def bcast(run: str) -> str:
    """Topic the coordinator publishes messages for every node on."""
    return f"{_base(run)}/{BCAST}"


def status(run: str, node: str) -> str:
    """A node's retained online/offline status (its last will)."""
    return f"{_base(run)}/{STATUS}/{_node(node)}"


def coord(run: str) -> str:
    """The coordinator's retained online/offline status (its last will)."""
    return f"{_base(run)}/{COORD}"


def all_up(run: str) -> str:
    """Filter matching every node's uplink."""
    return f"{_base(run)}/{UP}/+"


def all_down(run: str) -> str:
    """Filter matching every node's downlink (for the coordinator's ACL)."""
    return f"{_base(run)}/{DOWN}/+"


def all_status(run: str) -> str:
    """Filter matching every node's status."""
    return f"{_base(run)}/{STATUS}/+"


def node_subscriptions(run: str, node: str) -> list[str]:
    """What a node subscribes to: its downlink, the broadcast and the coordinator's status."""
    return [down(run, node), bcast(run), coord(run)]


def coordinator_subscriptions(run: str) -> list[str]:
    """What the coordinator subscribes to: every uplink and every node status."""
    return [all_up(run), all_status(run)]


def parse(topic: str) -> Topic:
    """Split a concrete topic (no wildcards) into (run, kind, node); raise TopicError otherwise."""
    parts = topic.split("/")
    if len(parts) < 4 or parts[0] != PREFIX or parts[1] != VERSION:
        raise TopicError(f"not a {PREFIX}/{VERSION} topic: {topic!r}")
    run, kind, rest = parts[2], parts[3], parts[4:]
    _base(run)
    if kind in (UP, DOWN, STATUS) and len(rest) == 1:
        return Topic(run, kind, _node(rest[0]))
    if kind in (BCAST, COORD) and not rest:
        return Topic(run, kind, None)
    raise TopicError(f"unknown topic layout: {topic!r}")
