"""The nodes' online/offline status over MQTT, for `testbed watch`: a read-only client.

It logs in as the ``watch`` user of `testbed acl` (read access to ``status/+`` and ``coord`` only)
when the run's ``mqtt.credentials`` file has one, subscribes to those topics and hands every status
message to the feed. It publishes nothing: no status of its own, no will.
"""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any, Callable

from testbed.mqtt import topics

log = logging.getLogger(__name__)


def watch_credentials(path: str | None) -> tuple[str | None, str | None]:
    """(username, password) of the ``watch`` user in a `testbed acl` credentials file; (None, None)
    without a file (an anonymous broker)."""
    from testbed.mqtt.acl import WATCH_USER

    if path is None:
        return None, None
    try:
        creds = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ValueError(f"mqtt.credentials {path}: unreadable ({exc})") from None
    if not isinstance(creds, dict) or not isinstance(creds.get(WATCH_USER), str):
        raise ValueError(f"mqtt.credentials {path}: has no {WATCH_USER!r} user (rerun `testbed acl`)")
    return WATCH_USER, creds[WATCH_USER]


class StatusListener:
    """Follows a run's status topics on its broker until :meth:`close`.

    Args:
        mqtt: the run's ``[mqtt]`` section (broker_url, run_id, credentials, tls_ca, protocol).
        on_node: called (node id, online) for each node status message, from the listener's thread.
        on_coordinator: called (online) for each coordinator status message.
    """

    def __init__(self, mqtt: Any, on_node: Callable[[int, bool], None], on_coordinator: Callable[[bool], None]):
        from testbed.mqtt.client import MqttClient, new_client_id

        user, password = watch_credentials(mqtt.credentials)
        run = mqtt.run_id
        self._client = MqttClient(mqtt.broker_url, client_id=new_client_id(run, "watch"), run=run,
                                  subscriptions=[topics.all_status(run), topics.coord(run)], status_topic=None,
                                  username=user, password=password, tls_ca=mqtt.tls_ca, protocol=mqtt.protocol,
                                  session_expiry_s=0)
        self._on_node, self._on_coordinator = on_node, on_coordinator
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="watch-status", daemon=True)

    def start(self, timeout_s: float = 10.0) -> "StatusListener":
        """Connect and subscribe (blocks until the broker acknowledged), then follow in a thread."""
        self._client.connect(timeout_s)
        self._thread.start()
        return self

    def _serve(self) -> None:
        while not self._stop.is_set():
            msg = self._client.receive(0.25)
            if msg is None:
                continue
            online = msg.payload == topics.STATUS_ONLINE
            if msg.kind == topics.COORD:
                self._on_coordinator(online)
            elif (node := topics.node_index(msg.node)) is not None:  # not the channel emulator
                self._on_node(node, online)

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2.0)
        self._client.close()
