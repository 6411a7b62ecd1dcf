"""Many MQTT clients at once (an emulated host's nodes, testbed.nodes.host): connected with at most
a few awaiting the broker together, and publishing with every frame handed over before any
acknowledgement is awaited; no thread per client. (Closing many at once is
testbed.mqtt.client.close_all, which a client's own close is.)"""

from __future__ import annotations

import collections
import time
from collections.abc import Iterable, Mapping

from testbed.errors import UserError
from testbed.mqtt.client import BrokerRefused, Connecting, MqttClient

#: Clients :func:`connect_all` has awaiting the broker at once, by default: all the nodes of all the
#: hosts of a machine at once would be a storm of CONNECTs.
CONNECTS_IN_FLIGHT = 32


def connect_all(clients: Mapping[str, MqttClient], timeout_s: float = 10.0, *, probe_first: bool = True,
                in_flight: int = CONNECTS_IN_FLIGHT) -> None:
    """:meth:`MqttClient.connect` of each of ``clients`` (each within ``timeout_s`` from its own
    start), at most ``in_flight`` of them awaiting the broker at once: the next starts when the
    oldest is connected. No thread per connect: an emulated host's 50 nodes connected by a pool of
    32 threads spent 100 ms just starting them (each start waits for the new thread to get the
    interpreter from the busy ones), and each acknowledgement handed the interpreter to a thread.

    Args:
        clients: name -> client; the name leads the message of its client's failure.

    Raises:
        what :meth:`MqttClient.connect` raises, of the first client that fails, its message after
        the client's name (the clients started with it are left connecting: the caller closes
        them, as after a failed ``connect``).
    """
    if in_flight < 1:
        raise ValueError(f"in_flight must be >= 1, got {in_flight}")
    started: collections.deque[tuple[str, MqttClient, Connecting]] = collections.deque()

    def finish(name: str, client: MqttClient, connecting: Connecting) -> None:
        try:
            client._finish_connect(connecting)
        except UserError as exc:
            raise _named(name, exc) from None

    for name, client in clients.items():
        if client._paho is not None:  # connected (or connecting) already
            continue
        if len(started) >= in_flight:
            finish(*started.popleft())
        try:
            started.append((name, client, client._start_connect(timeout_s, probe_first)))
        except UserError as exc:
            raise _named(name, exc) from None
    for one in started:
        finish(*one)


def _named(name: str, exc: UserError) -> UserError:
    """``exc``'s message after ``name``: a BrokerRefused stays one, any other error a UserError."""
    return (BrokerRefused if isinstance(exc, BrokerRefused) else UserError)(f"{name}: {exc}")


def publish_all(items: Iterable[tuple[MqttClient, str, bytes]], timeout_s: float) -> list[str]:
    """Publish each (client, topic, payload) at once, then await their acknowledgements, all within
    ``timeout_s``; one line per publish that was not acknowledged (or not taken) in time."""
    deadline = time.monotonic() + timeout_s
    sent, problems = [], []
    for client, topic, payload in items:
        try:
            sent.append((client, topic, client._send(topic, payload, retain=False)))
        except (RuntimeError, ValueError) as exc:
            problems.append(f"{client.client_id}: {exc}")
    for client, topic, mids in sent:
        try:
            client._await_acks(topic, mids, max(0.0, deadline - time.monotonic()))
        except (TimeoutError, BrokerRefused) as exc:
            problems.append(str(exc))
    return problems
