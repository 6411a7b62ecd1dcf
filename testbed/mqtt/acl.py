"""Per-node credentials and the topic rules that confine each node to its own topics, whatever the
broker; each managed broker writes them in its own format (`testbed.mqtt.brokers`: Mosquitto's
``acl_file`` and password file in `testbed.mqtt.brokers.mosquitto`).

Rules (for one run; topics as in `testbed.mqtt.topics`):

    node N        write  up/N, tx/N, status/N          read  down/N, rx/N, bcast, coord
    coordinator   write  down/+, bcast, chan, coord    read  up/+, status/+
    channel       write  rx/+, status/channel          read  chan, tx/+, status/+, coord
    watch         (nothing)                            read  status/+, coord

`watch` is `testbed watch`'s read-only user: it sees who is online, never a model or an update.

Each node logs in with username = its node id and a random password, so a node's credentials let
it publish only under its own id and read only its own downlink; where the broker binds client ids
to usernames (Mosquitto's ``use_username_as_clientid``), its credentials cannot take over another
client's session either.
"""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from testbed.mqtt import topics

#: The user of `testbed watch`: reads the status topics only.
WATCH_USER = "watch"


@dataclass(frozen=True)
class Grant:
    """What one user may do: ``rules`` are (``"read"`` or ``"write"``, topic filter) pairs, read
    meaning subscribe to and write publish to, in the order a broker's file lists them."""

    user: str
    rules: tuple[tuple[Literal["read", "write"], str], ...]

    def topics(self, access: Literal["read", "write"]) -> tuple[str, ...]:
        """The filters this user may read, or write."""
        return tuple(topic for kind, topic in self.rules if kind == access)


@dataclass(frozen=True)
class Access:
    """A run's users: their grants, in order, and their plaintext passwords (by username)."""

    grants: tuple[Grant, ...]
    passwords: Mapping[str, str]


def _grant(user: str, read: Iterable[str] = (), write: Iterable[str] = ()) -> Grant:
    return Grant(user, tuple(("read", t) for t in read) + tuple(("write", t) for t in write))


def run_grants(run_id: str, node_ids: Iterable[str], coordinator_user: str = "coordinator") -> tuple[Grant, ...]:
    """The grants of one run: the coordinator, the channel emulator, `testbed watch` (WATCH_USER),
    then one per node (a repeated id once).

    Raises:
        ValueError: a node id is one of the service users' names.
    """
    nodes = list(dict.fromkeys(node_ids))
    for reserved in (coordinator_user, topics.CHANNEL, WATCH_USER):
        if reserved in nodes:
            raise ValueError(f"user {reserved!r} is also a node id")
    services = (
        _grant(coordinator_user, read=(topics.all_up(run_id), topics.all_status(run_id)),
               write=(topics.all_down(run_id), topics.bcast(run_id), topics.chan(run_id), topics.coord(run_id))),
        _grant(topics.CHANNEL, read=(topics.chan(run_id), topics.all_tx(run_id), topics.all_status(run_id),
                                     topics.coord(run_id)),
               write=(topics.all_rx(run_id), topics.status(run_id, topics.CHANNEL))),
        _grant(WATCH_USER, read=(topics.all_status(run_id), topics.coord(run_id))),
    )
    # A node's block lists what it publishes first (as `testbed acl` always wrote it).
    return services + tuple(
        Grant(node, tuple(("write", t) for t in (topics.up(run_id, node), topics.tx(run_id, node),
                                                 topics.status(run_id, node)))
              + tuple(("read", t) for t in (topics.down(run_id, node), topics.rx(run_id, node),
                                            topics.bcast(run_id), topics.coord(run_id))))
        for node in nodes)


def generate_access(run_id: str, node_ids: Iterable[str], coordinator_user: str = "coordinator") -> Access:
    """The grants of one run (:func:`run_grants`) and a fresh random password for each user (144
    random bits)."""
    grants = run_grants(run_id, node_ids, coordinator_user)
    return Access(grants, {grant.user: secrets.token_urlsafe(18) for grant in grants})


def write_private(path: str | Path, text: str) -> Path:
    """Write `text` to a file created with mode 0600 (truncated if it exists)."""
    path = Path(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return path
