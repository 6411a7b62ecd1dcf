"""MQTT topics of the testbed: versioned, scoped by run, one writer per topic.

    tb/v1/{run}/up/{node}       node -> coordinator   wire messages      writer: that node
    tb/v1/{run}/down/{node}     coordinator -> node   wire messages      writer: coordinator
    tb/v1/{run}/bcast           coordinator -> all    wire messages      writer: coordinator
    tb/v1/{run}/status/{node}   b"online"/b"offline", retained, the node's last will
    tb/v1/{run}/coord           coordinator status, retained, the coordinator's last will
    tb/v1/{run}/chan            coordinator -> channel emulator   wire messages   writer: coordinator
    tb/v1/{run}/tx/{node}       node -> channel emulator          transmit signal writer: that node
    tb/v1/{run}/rx/{node}       channel emulator -> node          received signal writer: channel

The last three exist for over-the-air algorithms (DWFL): the radio between the nodes is emulated
by a client of its own, `channel` (status topic `status/channel`).

The nodes of one emulated host read the broadcast through a shared subscription
(``$share/{group}/tb/v1/{run}/bcast``, MQTT 5 §4.8.2, which Mosquitto also serves to 3.1.1 clients
and the embedded broker serves too): the broker hands each broadcast to one connection of the
group, and the host passes it to all of its nodes; without it a host of N nodes reads and decodes
each broadcast N times. The embedded broker hands it to a connected member; Mosquitto to each
member in turn, a disconnected one with a persistent session included (queued for it until it is
back): while one node of a host is cut off, some rounds reach that host late.

Run and node ids match `testbed.mqtt.wire.ID_PATTERN`, so they never contain '/', '+' or '#'. The
protocol version `v1` changes only when the topic layout does (the payload schema has its own
version in the wire header).
"""

from __future__ import annotations

import dataclasses
import functools

from testbed.mqtt.wire import WireError, check_id

PREFIX = "tb"
VERSION = "v1"

UP, DOWN, BCAST, STATUS, COORD = "up", "down", "bcast", "status", "coord"
CHAN, TX, RX = "chan", "tx", "rx"
#: Kinds that carry wire messages (the others carry status strings).
DATA_KINDS = frozenset({UP, DOWN, BCAST, CHAN, TX, RX})
#: The channel emulator's id (its status topic, its username, the sender of rx messages).
CHANNEL = "channel"

STATUS_ONLINE = b"online"
STATUS_OFFLINE = b"offline"
#: The only payloads a status topic (STATUS, COORD) may carry; anything else is malformed.
STATUS_VALUES = frozenset({STATUS_ONLINE, STATUS_OFFLINE})


class TopicError(ValueError):
    """A topic that is not one of the testbed's (wrong prefix, version, kind or id)."""


@dataclasses.dataclass(frozen=True)
class Topic:
    """A parsed topic: `node` is None for the run-wide kinds (bcast, coord, chan)."""

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


def chan(run: str) -> str:
    """Topic the coordinator tells the channel emulator about each round on."""
    return f"{_base(run)}/{CHAN}"


def tx(run: str, node: str) -> str:
    """Topic a node publishes its transmit signal on (read by the channel emulator)."""
    return f"{_base(run)}/{TX}/{_node(node)}"


def rx(run: str, node: str) -> str:
    """Topic the channel emulator publishes one node's received signal on."""
    return f"{_base(run)}/{RX}/{_node(node)}"


def all_tx(run: str) -> str:
    """Filter matching every node's transmit signal."""
    return f"{_base(run)}/{TX}/+"


def all_rx(run: str) -> str:
    """Filter matching every node's received signal (for the channel's ACL)."""
    return f"{_base(run)}/{RX}/+"


def all_up(run: str) -> str:
    """Filter matching every node's uplink."""
    return f"{_base(run)}/{UP}/+"


def all_down(run: str) -> str:
    """Filter matching every node's downlink (for the coordinator's ACL)."""
    return f"{_base(run)}/{DOWN}/+"


def all_status(run: str) -> str:
    """Filter matching every node's status."""
    return f"{_base(run)}/{STATUS}/+"


SHARE_PREFIX = "$share/"


def shared(group: str, topic_filter: str) -> str:
    """``topic_filter`` as a shared subscription of ``group``: the broker delivers each matching
    message to one member of the group."""
    try:
        check_id(group, "share group")
    except WireError as exc:
        raise TopicError(exc.reason) from None
    return f"{SHARE_PREFIX}{group}/{topic_filter}"


def broadcast_subscription(run: str, group: str | None = None) -> str:
    """The filter a node reads the broadcast through: the topic itself, or shared with the other
    members of ``group`` (its host's nodes)."""
    return bcast(run) if group is None else shared(group, bcast(run))


def node_subscriptions(run: str, node: str, broadcast_group: str | None = None,
                       coordinator_status: bool = True) -> list[str]:
    """What a node subscribes to: its downlink, its received signal, the broadcast (shared with
    ``broadcast_group``, if given) and, with ``coordinator_status``, the coordinator's status."""
    return [down(run, node), rx(run, node), broadcast_subscription(run, broadcast_group),
            *([coord(run)] if coordinator_status else [])]


def channel_subscriptions(run: str) -> list[str]:
    """What the channel emulator subscribes to: the coordinator's round notices, every transmit
    signal, every node status (to stop waiting for a node gone offline) and the coordinator's."""
    return [chan(run), all_tx(run), all_status(run), coord(run)]


def writer(kind: str, node: str | None, coordinator_id: str) -> str:
    """Who may publish on a topic of ``kind``: the node itself on up, tx and status, the channel
    emulator on rx, the coordinator on down, bcast, chan and coord."""
    if kind in (UP, TX, STATUS):
        assert node is not None
        return node
    return CHANNEL if kind == RX else coordinator_id


def coordinator_subscriptions(run: str) -> list[str]:
    """What the coordinator subscribes to: every uplink and every node status."""
    return [all_up(run), all_status(run)]


def node_index(name: str | None) -> int | None:
    """The integer id of a node named on a topic: its decimal digits, as a node's client names it
    (``str(node)``); None for other writers (the channel) and for any other spelling (" 3", "1_0",
    "03", "-1", other scripts' digits), which int() would read as some node's id."""
    if name is None or not (name.isascii() and name.isdigit()) or (name[0] == "0" and name != "0"):
        return None
    return int(name)


@functools.lru_cache(maxsize=4096)  # a run's topics recur every round (a Topic is frozen)
def parse(topic: str) -> Topic:
    """Split a concrete topic (no wildcards) into (run, kind, node); raise TopicError otherwise."""
    parts = topic.split("/")
    if len(parts) < 4 or parts[0] != PREFIX or parts[1] != VERSION:
        raise TopicError(f"not a {PREFIX}/{VERSION} topic: {topic!r}")
    run, kind, rest = parts[2], parts[3], parts[4:]
    _base(run)
    if kind in (UP, DOWN, STATUS, TX, RX) and len(rest) == 1:
        return Topic(run, kind, _node(rest[0]))
    if kind in (BCAST, COORD, CHAN) and not rest:
        return Topic(run, kind, None)
    raise TopicError(f"unknown topic layout: {topic!r}")
