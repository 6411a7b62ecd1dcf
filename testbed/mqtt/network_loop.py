"""One network thread for many paho clients: the sockets of every node an emulated host serves,
watched with the operating system's selector (epoll on Linux).

Why: paho's own ``loop_start`` gives each client a thread, a wake-up socket pair and a
``select()`` that cannot watch descriptors above 1023, so one process tops out near 340 clients.
Here each client costs one socket and no thread, and a host of 500 or 1,000 nodes is routine.

Reconnects are spread out ("full jitter"): after a drop, each client waits a uniformly random
time in [0, b] before its next attempt, b doubling from ``reconnect_min_s`` up to
``reconnect_max_s`` while attempts fail. When a broker restart drops every node of a machine at
once, their attempts do not arrive together (a storm of thousands of CONNECTs in the same
millisecond overflows the broker's listen backlog, and refused SYNs wait out the kernel's 1 s, 3 s,
7 s retransmits); the longer the outage, the wider they spread. Each attempt runs at its own time,
not on the keepalive tick.

Every socket operation (connect, read, write, keepalive, reconnect, disconnect) happens on the
loop's thread. Other threads only queue packets (paho's ``publish``) and then call :meth:`flush`,
which asks the loop thread to write them: paho's own "register write" hint can be lost when a
publish races the loop's write of the previous packet, an explicit flush request cannot.

Example::

    >>> loop = NetworkLoop()
    >>> client = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id="n1")
    >>> loop.add(client, "127.0.0.1", 1883, keepalive_s=30)        # doctest: +SKIP
    >>> client.publish("t", b"x", qos=1); loop.flush(client)          # doctest: +SKIP
    >>> loop.remove(client); loop.close()                              # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import dataclasses
import heapq
import logging
import random
import selectors
import socket
import ssl
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import paho.mqtt.client as paho

log = logging.getLogger(__name__)

_MISC_INTERVAL_S = 0.5  # keepalive pings are checked this often


@dataclasses.dataclass(eq=False)
class _Served:
    """A client the loop serves, and where it stands."""

    client: paho.Client
    reconnect_min_s: float
    reconnect_max_s: float
    wanted: bool = True  # False once removed: a dropped socket is not reconnected
    retry_at: float | None = None  # when to try connecting again; None while connected
    backoff_s: float = 0.0  # the bound b of the next jittered wait
    closed: threading.Event = dataclasses.field(default_factory=threading.Event)


class NetworkLoop:
    """Serves the network side of any number of paho clients from one daemon thread.

    A client handed to :meth:`add` must not use paho's own loop (``loop_start``,
    ``loop_forever``); the loop connects it, keeps it alive, and reconnects it with exponential
    backoff and jitter whenever its connection drops, until :meth:`remove`.

    Args:
        name: the thread's name.
        rng: draws the reconnect jitter (default: seeded from the OS, so the hosts of a machine
            do not draw the same waits).
    """

    def __init__(self, name: str = "mqtt-network", rng: random.Random | None = None) -> None:
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ, None)
        self._lock = threading.Lock()
        self._local = threading.local()  # a thread's flushes held by batch()
        self._requests: deque[Callable[[], None]] = deque()
        self._wake_pending = False  # a wake-up byte is on its way and the requests not yet drained
        self._served: dict[paho.Client, _Served] = {}
        self._rng = rng or random.Random()
        # (monotonic s, tie-breaker, client): reconnect attempts due; an entry whose client was
        # removed or rescheduled meanwhile is skipped when it comes up.
        self._retries: list[tuple[float, int, _Served]] = []
        self._retry_count = 0
        self._running = True
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    # ---- called from any thread --------------------------------------------------------------

    def add(self, client: paho.Client, host: str, port: int, *, keepalive_s: int,
            reconnect_min_s: float = 0.25, reconnect_max_s: float = 30.0, **connect_kwargs: Any) -> None:
        """Start serving ``client``: connect it to ``host:port`` (retrying with backoff while the
        broker is unreachable), then keep it connected. ``connect_kwargs`` go to paho's
        ``connect_async`` (``clean_start``, ``properties``)."""
        client.on_socket_open = self._on_socket_open
        client.on_socket_close = self._on_socket_close
        client.on_socket_register_write = lambda c, userdata, sock: self.flush(c)
        client.on_socket_unregister_write = None
        client.connect_async(host, port, keepalive=keepalive_s, **connect_kwargs)
        served = _Served(client, reconnect_min_s, reconnect_max_s, backoff_s=reconnect_min_s)
        with self._lock:
            self._served[client] = served
        self._call_soon(lambda: self._connect(served, time.monotonic()))

    def flush(self, client: paho.Client) -> None:
        """Have the loop thread write what ``client`` has queued (call after ``publish``); within
        :meth:`batch`, at the end of the block."""
        held = getattr(self._local, "held", None)
        if held is not None:
            held[client] = None
            return
        self._call_soon(lambda: self._write(client))

    @contextlib.contextmanager
    def batch(self) -> Iterator[None]:
        """Within the block, this thread's flushes are held and handed to the loop thread as one
        request at its end: a host's replies to a round go out on one wake-up of the loop instead
        of one each (each wake-up hands the GIL back and forth between the two threads)."""
        self._local.held = held = {}
        try:
            yield
        finally:
            self._local.held = None
            if held:
                clients = list(held)
                self._call_soon(lambda: [self._write(client) for client in clients])

    def remove(self, client: paho.Client, timeout_s: float = 2.0, properties: Any = None) -> None:
        """Disconnect ``client`` cleanly (its DISCONNECT written, with MQTT 5 ``properties`` if
        given, so the broker sends no will) and stop serving it; waits up to ``timeout_s`` for the
        socket to close."""
        self.remove_all([client], timeout_s, properties)

    def remove_all(self, clients: Sequence[paho.Client], timeout_s: float = 2.0, properties: Any = None) -> None:
        """:meth:`remove` of each of ``clients``, together: every DISCONNECT is written on one
        wake-up of the loop before any socket's close is awaited (at most ``timeout_s`` in all)."""
        with self._lock:
            served = [self._served.get(client) for client in clients]
        self._call_soon(lambda: [self._disconnect(client, properties) for client in clients])
        if threading.current_thread() is self._thread:
            return
        deadline = time.monotonic() + timeout_s
        for one in served:
            if one is not None:
                one.closed.wait(max(0.0, deadline - time.monotonic()))

    def close(self) -> None:
        """Stop the thread; sockets of clients still served are closed without a DISCONNECT."""
        if not self._running:
            return
        self._running = False
        self._wake()
        self._thread.join(timeout=5.0)
        with self._lock:
            still_served = list(self._served.values())
        for served in still_served:
            sock = served.client.socket()
            if sock is not None:
                sock.close()
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()

    def _call_soon(self, request: Callable[[], None]) -> None:
        # Queued even from the loop thread: paho asks for writes from inside loop_read, which
        # must not re-enter paho. One wake-up byte for any number of requests queued before the
        # loop drains them (a host flushes the replies of all its nodes at once).
        with self._lock:
            self._requests.append(request)
            wake, self._wake_pending = not self._wake_pending, True
        if wake:
            self._wake()

    def _wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except (BlockingIOError, OSError):
            pass  # the pipe is full of wake-ups already, or closing

    # ---- paho socket callbacks (loop thread) --------------------------------------------------

    def _on_socket_open(self, client: paho.Client, userdata: Any, sock: Any) -> None:
        self._selector.register(sock, selectors.EVENT_READ, client)

    def _on_socket_close(self, client: paho.Client, userdata: Any, sock: Any) -> None:
        try:
            self._selector.unregister(sock)
        except (KeyError, ValueError):
            pass
        with self._lock:
            served = self._served.get(client)
        if served is None:
            return
        if served.wanted:
            self._retry_later(served, time.monotonic())
        else:
            self._forget(served)

    # ---- the loop thread ----------------------------------------------------------------------

    def _run(self) -> None:
        next_misc = time.monotonic()
        while self._running:
            now = time.monotonic()
            if now >= next_misc:
                self._misc(now)
                next_misc = now + _MISC_INTERVAL_S
            self._retry_due(now)
            wake_at = min(next_misc, self._retries[0][0]) if self._retries else next_misc
            for key, events in self._selector.select(timeout=max(0.0, wake_at - time.monotonic())):
                # A broadcast makes every socket of a host readable at once, and reading them all
                # can take longer than the broker waits for a keepalive (measured: 1,682 of 10,000
                # nodes dropped): the pings due go out in between.
                if (now := time.monotonic()) >= next_misc:
                    self._misc(now)
                    next_misc = now + _MISC_INTERVAL_S
                client = key.data
                if client is None:
                    self._drain_requests()
                    continue
                if events & selectors.EVENT_READ:
                    self._read(client)
                if events & selectors.EVENT_WRITE:
                    self._write(client)

    def _drain_requests(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except BlockingIOError:
            pass
        with self._lock:
            self._wake_pending = False  # requests queued from here on wake the loop again
            requests = list(self._requests)
            self._requests.clear()
        for request in requests:
            try:
                request()
            except Exception:
                log.exception("network loop request failed")

    def _read(self, client: paho.Client) -> None:
        client.loop_read()
        sock = client.socket()
        # TLS may hold decrypted bytes the selector cannot see.
        while isinstance(sock, ssl.SSLSocket) and sock.pending() and client.socket() is sock:
            client.loop_read()
        self._watch_writes(client)

    def _write(self, client: paho.Client) -> None:
        if client.socket() is not None and client.want_write():
            client.loop_write()
        self._watch_writes(client)

    def _watch_writes(self, client: paho.Client) -> None:
        sock = client.socket()
        if sock is None:
            return
        events = selectors.EVENT_READ | (selectors.EVENT_WRITE if client.want_write() else 0)
        try:
            if self._selector.get_key(sock).events != events:
                self._selector.modify(sock, events, client)
        except (KeyError, ValueError):
            pass  # closed meanwhile

    def _forget(self, served: _Served) -> None:
        with self._lock:
            self._served.pop(served.client, None)
        served.closed.set()

    def _misc(self, now: float) -> None:
        with self._lock:
            served_now = list(self._served.items())
        for client, served in served_now:
            if client.socket() is not None:
                client.loop_misc()  # keepalive: PINGREQ due, or the broker silent too long
                # Written now, not when the selector next reports the socket writable: inside a
                # long batch of reads that is only after the batch, when the broker may have
                # given up on the client already.
                self._write(client)
                if client.is_connected():
                    served.backoff_s = served.reconnect_min_s

    def _retry_later(self, served: _Served, now: float) -> None:
        """Schedule ``served``'s next connect attempt after a jittered wait in [0, b]; b doubles."""
        served.retry_at = now + self._rng.uniform(0.0, served.backoff_s)
        served.backoff_s = min(2 * served.backoff_s, served.reconnect_max_s)
        self._retry_count += 1
        heapq.heappush(self._retries, (served.retry_at, self._retry_count, served))

    def _retry_due(self, now: float) -> None:
        while self._retries and self._retries[0][0] <= now:
            at, _, served = heapq.heappop(self._retries)
            if served.wanted and served.retry_at == at and served.client.socket() is None:
                self._connect(served, now)

    def _connect(self, served: _Served, now: float) -> None:
        served.retry_at = None
        try:
            served.client.reconnect()  # the first connect too: connect_async only stored the address
        except (OSError, ssl.SSLError) as exc:
            log.debug("%s: connect failed: %s", served.client._client_id, exc)
            self._retry_later(served, now)
            return
        self._watch_writes(served.client)

    def _disconnect(self, client: paho.Client, properties: Any = None) -> None:
        with self._lock:
            served = self._served.get(client)
        if served is None:
            return
        served.wanted = False
        if client.socket() is None:
            self._forget(served)
            return
        client.disconnect(properties=properties)  # queues DISCONNECT; paho closes the socket once written
        self._write(client)
