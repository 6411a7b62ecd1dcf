"""The nodes' online/offline status over MQTT, for `testbed watch`: a read-only client.

It logs in as the ``watch`` user of `testbed acl` (read access to ``status/+`` and ``coord`` only)
when the run's ``mqtt.credentials`` file has one, subscribes to those topics and hands every status
message to the feed. It publishes nothing: no status of its own, no will.

It holds no message key (testbed.mqtt.auth): it reads the value of a sealed status without
verifying it, so on a broker that lets anyone publish the page may show a forged status; the run
itself acts only on verified ones.

Only the declared payloads (``online``/``offline``, :mod:`testbed.mqtt.topics`) change what the page
shows; anything else (a retained message cleared with an empty payload, garbage, another writer's
topic) is dropped and counted, never read as "offline".
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any, Callable

from testbed.checked.limits import MAX_TEXT_FILE_BYTES
from testbed.errors import UserError
from testbed.mqtt import topics
from testbed.util.userfiles import read_text

log = logging.getLogger(__name__)

#: The declared status payloads and the state each one means.
STATUS_VALUES = {topics.STATUS_ONLINE: True, topics.STATUS_OFFLINE: False}


def watch_credentials(path: str | None) -> tuple[str | None, str | None]:
    """(username, password) of the ``watch`` user in a `testbed acl` credentials file; (None, None)
    without a file (an anonymous broker)."""
    from testbed.mqtt.acl import WATCH_USER

    if path is None:
        return None, None
    try:
        creds = json.loads(read_text(Path(path), MAX_TEXT_FILE_BYTES, "mqtt.credentials"))
    except UserError as exc:
        raise ValueError(str(exc)) from None
    except ValueError as exc:
        raise ValueError(f"mqtt.credentials {path}: unreadable ({exc})") from None
    if not isinstance(creds, dict) or not isinstance(creds.get(WATCH_USER), str):
        raise ValueError(f"mqtt.credentials {path}: has no {WATCH_USER!r} user (rerun `testbed acl`)")
    return WATCH_USER, creds[WATCH_USER]


class StatusListener:
    """Follows a run's status topics on its broker until :meth:`close`, each message through a
    :class:`StatusRouter` (its ``router``).

    Args:
        mqtt: the run's ``[mqtt]`` section (broker_url, run_id, credentials, tls_ca, protocol).
        on_node: called (node id, online) for each node status message, from the listener's thread.
        on_coordinator: called (online) for each coordinator status message.
        on_malformed: called (one line saying what) for each message dropped as not the run's.
    """

    def __init__(self, mqtt: Any, on_node: Callable[[int, bool], None], on_coordinator: Callable[[bool], None],
                 on_malformed: Callable[[str], None] | None = None):
        from testbed.mqtt.client import MqttClient, new_client_id

        user, password = watch_credentials(mqtt.credentials)
        run = mqtt.run_id
        self._client = MqttClient(mqtt.broker_url, client_id=new_client_id(run, "watch"), run=run,
                                  subscriptions=[topics.all_status(run), topics.coord(run)], status_topic=None,
                                  username=user, password=password, tls_ca=mqtt.tls_ca, protocol=mqtt.protocol,
                                  session_expiry_s=0, unverified_statuses=True)
        self.router = StatusRouter(on_node, on_coordinator, on_malformed)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="watch-status", daemon=True)

    def start(self, timeout_s: float = 10.0) -> "StatusListener":
        """Connect and subscribe (blocks until the broker acknowledged), then follow in a thread."""
        self._client.connect(timeout_s)
        self._thread.start()
        return self

    def _serve(self) -> None:
        refused = 0
        while not self._stop.is_set():
            msg = self._client.receive(0.25)
            if msg is not None:
                self.router.handle(msg.kind, msg.node, msg.payload)
            while refused < self._client.rejected:  # refused by the client itself (testbed.mqtt.client
                refused += 1                        # drops a status payload neither online nor offline)
                self.router.refused_by_client()

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2.0)
        self._client.close()


class StatusRouter:
    """Turns the messages of the status topics into node and coordinator states: only a declared
    payload (:data:`STATUS_VALUES`) of a node id or of the coordinator; anything else is dropped,
    counted (:attr:`dropped`) and said (once in the log, every time to ``on_malformed``).

    Example::

        >>> seen = []
        >>> router = StatusRouter(lambda n, online: seen.append((n, online)), seen.append)
        >>> router.handle("status", "3", b"offline"); router.handle("status", "3", b"")
        >>> (seen, router.dropped)
        ([(3, False)], 1)
    """

    def __init__(self, on_node: Callable[[int, bool], None], on_coordinator: Callable[[bool], None],
                 on_malformed: Callable[[str], None] | None = None):
        self._on_node, self._on_coordinator, self._on_malformed = on_node, on_coordinator, on_malformed
        self.dropped = 0

    def handle(self, kind: str, node: str | None, payload: bytes) -> None:
        """One message of a status topic (``kind``: topics.STATUS or topics.COORD)."""
        online = STATUS_VALUES.get(bytes(payload)) if isinstance(payload, (bytes, bytearray)) else None
        if online is None:
            writer = "the coordinator" if kind == topics.COORD else f"node {str(node)[:40]}"
            shown = bytes(payload[:40]) if isinstance(payload, (bytes, bytearray)) else type(payload).__name__
            self._drop(f"status of {writer}: {shown!r} is neither online nor offline")
        elif kind == topics.COORD:
            self._on_coordinator(online)
        elif isinstance(node, str) and node.isascii() and node.isdigit() and len(node) <= 9:
            self._on_node(int(node), online)  # the feed drops an id that is not one of the run's nodes
        elif node != topics.CHANNEL:  # the channel emulator's status is not a node's
            self._drop(f"status of {str(node)[:40]!r}: not a node id")

    def refused_by_client(self) -> None:
        """A message the MQTT client refused before it reached here (its log line says why)."""
        self._drop("a status message refused by the MQTT client (a payload neither online nor offline)")

    def _drop(self, what: str) -> None:
        self.dropped += 1
        if self.dropped == 1:  # one line, not one per message of a flood
            log.warning("dropped a status message (and count any more on the page): %s", what)
        if self._on_malformed is not None:
            self._on_malformed(what)
