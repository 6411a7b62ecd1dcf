"""The embedded MQTT broker: amqtt in a background thread with its own asyncio loop, on loopback.

Anonymous, MQTT 3.1.1 only (amqtt 0.12 refuses v5 CONNECTs). A run whose own broker is this one
serves it from a child process (`testbed.mqtt.brokers.embedded.BrokerProcess`, `testbed broker`);
tests and `testbed calibrate` start it in their own process.

Example::

    >>> with EmbeddedBroker() as broker:                    # doctest: +SKIP
    ...     print(broker.url)
    mqtt://127.0.0.1:40311
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from typing import Any

from testbed.errors import UserError
from testbed.mqtt import fence
from testbed.mqtt.broker import address_family, format_url, free_port, require_loopback
from testbed.mqtt.topics import SHARE_PREFIX
from testbed.util.starting import CAP_S, STALL_S, thread_progress, wait_while_starting


class EmbeddedBroker:
    """An amqtt broker in a background thread.

    Args:
        host: address to listen on: loopback unless `allow_remote`.
        port: TCP port; 0 picks a free one at the first `start()` and keeps it for restarts.
        allow_remote: allow a non-loopback `host` (`testbed broker --host`, boards on a LAN); the
            broker stays anonymous, so anyone who reaches it can use every topic.

    amqtt 0.12 speaks MQTT 3.1.1 only, has no message size limit beyond MQTT's 256 MB packet cap,
    and runs anonymous here (use Mosquitto, `testbed.mqtt.brokers.mosquitto`, for per-node
    credentials and ACLs).

    We own the listening socket and hand each connection to amqtt as an "external" listener:
    amqtt's own shutdown can hang when it races with in-flight deliveries, so `stop()` first
    aborts every connection itself (clients see the drop at once) and bounds amqtt's shutdown.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, start_timeout_s: float = STALL_S,
                 allow_remote: bool = False, start_cap_s: float = CAP_S):
        self.host = host if allow_remote else require_loopback(host)
        self.port = port
        # Its start is waited for while its thread works (testbed.util.starting): up to
        # start_timeout_s without progress, start_cap_s in all.
        self._start_timeout_s, self._start_cap_s = start_timeout_s, start_cap_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._broker: Any = None
        self._server: asyncio.Server | None = None
        self._transports: set[asyncio.BaseTransport] = set()

    @property
    def url(self) -> str:
        """`mqtt://host:port` (valid once started)."""
        return format_url("mqtt", self.host, self.port)

    @property
    def running(self) -> bool:
        return self._thread is not None

    def _config(self) -> dict[str, Any]:
        return {
            "listeners": {"default": {"type": "external", "bind": f"{self.host}:{self.port}"}},
            # Only the auth plugin: amqtt refuses every client without one, and the default
            # $SYS and packet-logging plugins would add traffic and log noise.
            "plugins": {"amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}},
        }

    async def _serve(self) -> None:
        from amqtt.adapters import StreamReaderAdapter, StreamWriterAdapter

        Broker = _broker_class()  # lazy: nodes import this module without amqtt installed

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            try:
                await self._broker.external_connected(StreamReaderAdapter(reader), StreamWriterAdapter(writer),
                                                      "default")
            finally:
                writer.transport.abort()

        # Bind before starting amqtt, so a taken port fails before amqtt has tasks to clean up.
        sock = socket.socket(address_family(self.host))
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, self.port))
            self._broker = Broker(self._config())
            await self._broker.start()
            self._server = await asyncio.get_running_loop().create_server(
                lambda: _TrackedProtocol(asyncio.StreamReader(), handle, self._transports), sock=sock)
        except BaseException:
            sock.close()
            raise

    async def _shutdown(self, timeout_s: float) -> None:
        assert self._server is not None
        loop = asyncio.get_running_loop()
        # Stop accepting, then let connections already accepted get their transport (first turn)
        # and protocol (second turn) before closing the server: on Python 3.11 a connection whose
        # transport is made after Server.close() fails an assertion and leaks its socket.
        for sock in self._server.sockets:
            loop.remove_reader(sock.fileno())
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        self._server.close()
        for transport in list(self._transports):
            transport.abort()
        try:
            await asyncio.wait_for(self._broker.shutdown(), timeout_s)
        except asyncio.TimeoutError:
            pass  # the amqtt race above; the connections are closed already, tasks get cancelled
        await self._server.wait_closed()

    def start(self) -> EmbeddedBroker:
        """Start listening; returns when the broker accepts connections. No-op if running."""
        if self.running:
            return self
        if not self.port:
            self.port = free_port(self.host)
        loop = _new_event_loop()
        outcome: list[BaseException | None] = []
        ready = threading.Event()

        def run() -> None:
            asyncio.set_event_loop(loop)
            try:
                loop.run_until_complete(self._serve())
                outcome.append(None)
            except Exception as exc:  # handed to the starting thread
                outcome.append(exc)
            ready.set()
            if outcome[0] is None:
                loop.run_forever()
            _close_loop(loop)

        thread = threading.Thread(target=run, name=f"amqtt-broker-{self.port}", daemon=True)
        thread.start()
        waited = wait_while_starting(ready.is_set, thread.is_alive,
                                     thread_progress(thread.native_id), stall_s=self._start_timeout_s,
                                     cap_s=self._start_cap_s)
        if not ready.is_set():
            with contextlib.suppress(RuntimeError):  # the loop closed in between: nothing to stop
                loop.call_soon_threadsafe(loop.stop)
            thread.join(self._start_timeout_s)
            raise UserError(f"embedded broker on {self.url} did not start: "
                            f"{waited.why(self._start_timeout_s, self._start_cap_s)}")
        if outcome[0] is not None:
            thread.join(self._start_timeout_s)
            raise UserError(f"embedded broker on {self.url} did not start: {outcome[0]}")
        self._loop, self._thread = loop, thread
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Close every connection, shut amqtt down, join the thread."""
        if not self.running:
            return
        loop, thread = self._loop, self._thread
        assert loop is not None and thread is not None
        try:
            asyncio.run_coroutine_threadsafe(self._shutdown(timeout_s), loop).result(timeout_s + 5)
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join(timeout_s)
            self._loop = self._thread = self._broker = self._server = None

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()




def _new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's event loop where it is installed (libuv's socket I/O and timers under amqtt: about
    15% less of the broker's CPU time in benchmarks/acfl.py's MQTT run), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def _session() -> Any:
    """A session of amqtt's, as a client's (what the table below probes)."""
    from amqtt.session import Session

    return Session()


_BROKER = "amqtt.broker.Broker"

#: Every internal of amqtt that :func:`_amqtt_broker_class`'s mended broker relies on: the methods
#: it overrides (their parameters, and amqtt's own code still calling them), the ones it calls, the
#: attributes it reads. One entry that differs and :func:`_broker_class` answers amqtt's stock broker.
AMQTT_INTERNALS: tuple[fence.Internal, ...] = (
    fence.parameters(f"{_BROKER}._publish_retained_messages_for_subscription", "self, subscription, session"),
    fence.uses(f"{_BROKER}._handle_client_session", "_publish_retained_messages_for_subscription", "_subscriptions"),
    fence.uses(f"{_BROKER}._handle_subscription", "_publish_retained_messages_for_subscription", "add_subscription"),
    fence.parameters(f"{_BROKER}.add_subscription", "self, subscription, session"),
    fence.parameters(f"{_BROKER}._del_all_subscriptions", "self, session"),
    fence.uses(f"{_BROKER}._cleanup_session", "_del_all_subscriptions"),
    fence.uses(f"{_BROKER}._delete_session", "_del_all_subscriptions"),
    fence.parameters(f"{_BROKER}._run_broadcast", "self, running_tasks"),
    fence.uses(f"{_BROKER}._broadcast_loop", "_run_broadcast"),
    fence.uses(f"{_BROKER}.__init__", "_subscriptions", "_broadcast_queue", "plugins_manager", "logger"),
    fence.parameters(f"{_BROKER}._matches", "self, topic, a_filter"),
    fence.parameters(f"{_BROKER}._topic_filtering", "self, session, topic, action"),
    fence.parameters(f"{_BROKER}._retain_broadcast_message", "self, broadcast, qos, target_session"),
    fence.parameters(f"{_BROKER}._get_handler", "self, session"),
    fence.parameters("amqtt.mqtt.protocol.broker_handler.BrokerProtocolHandler.mqtt_publish",
                     "self, topic, data, qos, retain, ack_timeout=None"),
    fence.parameters("amqtt.plugins.manager.PluginManager.is_topic_filtering_enabled", "self"),
    fence.attributes("amqtt.session.Session()", _session, "transitions", "clean_session", "is_anonymous",
                     "client_id"),
    fence.present("amqtt.contexts.Action.RECEIVE"),
)


@fence.once
def _broker_class() -> type:
    """The broker class this process serves: the mended one (:func:`_amqtt_broker_class`) where the
    installed amqtt holds :data:`AMQTT_INTERNALS`, else amqtt's stock broker (one warning names
    what differed). Checked at the first call. ``TESTBED_MQTT_SPEEDUPS=0`` leaves it be: the mends
    fix amqtt 0.12's own faults (its stock broker drops a client whose CONNECT meets another's
    SUBSCRIBE: "dictionary changed size during iteration"), they are not only faster."""
    from amqtt.broker import Broker

    if not fence.holds(__name__, "amqtt", AMQTT_INTERNALS,
                       fallback="amqtt's stock broker, without the mends above (no shared subscriptions: "
                                "mqtt.broadcast = \"shared\" needs Mosquitto then)"):
        return Broker
    return _amqtt_broker_class()


def _amqtt_broker_class() -> type:
    """amqtt's Broker, mended.

    - On every CONNECT amqtt 0.12 sends the new client the retained messages of *every*
      subscription on the broker (other clients' too), awaiting each while it iterates the
      subscription table. A run's retained node statuses then went to every node that connected
      later (O(N²) messages), and concurrent connects crashed that iteration ("dictionary changed
      size"). Retained messages now go only for the session's own subscriptions, and a session with
      none returns before awaiting anything, so the table cannot change under the loop.
    - Routing a message (``_run_broadcast``) formatted its debug lines whatever the log level: the
      whole message with its payload, and one line per subscription it did not match (every other
      node's downlink), a fifth of the broker's time in a run. The same routing, formatted only
      when debug logging is on.
    - Routing compared the topic with every filter on the broker (a few per node); a filter without
      wildcards is now looked up, and only the wildcard and shared ones are matched.
    - Shared subscriptions (``$share/{group}/{filter}``, MQTT 5 §4.8.2; amqtt 0.12 has none, and
      took the filter literally): a message matching the filter goes to one member of the group
      (:mod:`testbed.mqtt.topics`: an emulated host's nodes read the broadcast so). Retained
      messages are not sent to a shared subscription, as the standard says (the filter never
      equals a retained topic).
    """
    import logging

    from amqtt.broker import Broker
    from amqtt.contexts import Action
    from amqtt.mqtt.constants import QOS_1, QOS_2

    class OwnSubscriptionsBroker(Broker):
        async def _publish_retained_messages_for_subscription(self, subscription, session) -> None:
            subscribers = self._subscriptions.get(subscription[0], ())
            if any(s is session for s, _ in subscribers):
                await super()._publish_retained_messages_for_subscription(subscription, session)

        _patterns: list[str] | None = None  # the filters a topic is matched against; None: to list again

        # Listed again once the filters changed (after: routing may run while they change).
        async def add_subscription(self, subscription, session) -> int:
            granted = await super().add_subscription(subscription, session)
            self._patterns = None
            return granted

        async def _del_all_subscriptions(self, session) -> None:
            await super()._del_all_subscriptions(session)
            self._patterns = None

        async def _run_broadcast(self, running_tasks) -> None:
            broadcast = await self._broadcast_queue.get()
            topic = broadcast["topic"]
            debug = self.logger.isEnabledFor(logging.DEBUG)
            filtering = self.plugins_manager.is_topic_filtering_enabled()
            subscribed = self._subscriptions
            if self._patterns is None:
                self._patterns = [f for f in subscribed if f.startswith(SHARE_PREFIX) or "+" in f or "#" in f]
            # A filter without wildcards matches its own topic only: looked up, not compared with
            # each (a run has a few filters per node).
            for key in ([topic] if topic in subscribed else []) + self._patterns:
                subscriptions = subscribed.get(key)
                if not subscriptions:
                    continue
                k_filter, shared = key, key.startswith(SHARE_PREFIX)
                if shared:  # "$share/{group}/{filter}": one member of the group gets it
                    k_filter = k_filter.split("/", 2)[2]
                # amqtt's _matches is the topic's equality for a filter without wildcards
                if k_filter != topic and not (("+" in k_filter or "#" in k_filter) and self._matches(topic, k_filter)):
                    continue
                for target_session, sub_qos in _share_member(subscriptions) if shared else subscriptions:
                    qos = broadcast.get("qos", sub_qos)
                    if filtering and not await self._topic_filtering(target_session, topic=topic,
                                                                     action=Action.RECEIVE):
                        self.logger.info("%s not allowed to receive messages from TOPIC %s.",
                                         target_session.client_id, topic)
                        continue
                    # Kept for a disconnected persistent session at QoS 1 or 2 [MQTT 3.1.2.4], unless
                    # anonymous (amqtt's rule).
                    connected = target_session.transitions.state == "connected"
                    if (not connected and not target_session.clean_session and qos in (QOS_1, QOS_2)
                            and not target_session.is_anonymous):
                        await self._retain_broadcast_message(broadcast, qos, target_session)
                        continue
                    if not connected:
                        continue
                    if debug:
                        self.logger.debug("Broadcasting message on topic %r to %s", topic, target_session.client_id)
                    handler = self._get_handler(target_session)
                    if handler:
                        running_tasks.append(asyncio.ensure_future(
                            handler.mqtt_publish(topic, broadcast["data"], qos, retain=False)))

    def _share_member(subscriptions: list) -> list:
        """The member of a shared subscription a message goes to: the first connected one, else
        (nobody connected) the first, whose persistent session may keep it."""
        for subscription in subscriptions:
            if subscription[0].transitions.state == "connected":
                return [subscription]
        return subscriptions[:1]

    return OwnSubscriptionsBroker


class _TrackedProtocol(asyncio.StreamReaderProtocol):
    """A stream protocol that records its transport from the moment of accept, so that `stop()`
    can close connections whose handler task has not even started yet."""

    def __init__(self, reader: asyncio.StreamReader, handle: Any, transports: set[asyncio.BaseTransport]):
        super().__init__(reader, handle)
        self._registry = transports
        self._own: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._own = transport
        self._registry.add(transport)
        super().connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self._registry.discard(self._own)  # type: ignore[arg-type]
        super().connection_lost(exc)


def _close_loop(loop: asyncio.AbstractEventLoop) -> None:
    # Cancel what amqtt left running (client handlers, timers): no "task destroyed" warnings.
    pending = asyncio.all_tasks(loop)
    for task in pending:
        task.cancel()
    loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
    # One more turn: an aborted transport closes its socket in a callback scheduled for the next.
    loop.run_until_complete(asyncio.sleep(0))
    loop.close()
