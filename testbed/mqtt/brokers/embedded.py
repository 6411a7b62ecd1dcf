"""The embedded amqtt broker as a managed broker: `testbed.mqtt.embedded_broker.EmbeddedBroker`
in a child process of its own (`testbed broker`; a run's coordinator forks it where it can), so
that its routing runs beside the coordinator, not under its GIL.

Anonymous (it enforces no ACL: :data:`REGISTRATION` has no access format), MQTT 3.1.1 only (amqtt
0.12 refuses v5 CONNECTs). A run starts it when no ``mqtt.broker_url`` is given and this machine
has no Mosquitto, or when ``mqtt.broker = "embedded"``.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
from typing import Any, Callable

from testbed.errors import UserError
from testbed.mqtt.broker import accepts_tcp, format_url, free_port, require_loopback
from testbed.mqtt.brokers.registry import BrokerOptions, Registration
from testbed.util.starting import CAP_S, STALL_S, process_progress, wait_while_starting


class BrokerProcess:
    """The embedded broker in a child process (`testbed broker --parent-pid`), which leaves when
    this process does, even killed.

    Args:
        host: loopback address to listen on.
        start_timeout_s: how long `start()` waits for it to accept connections while the child
            makes no progress (CPU time; testbed.util.starting), up to ``start_cap_s`` in all.
        launch: starts the child: ``launch(argv, stderr_fd)`` runs ``testbed ARGV`` with its stderr
            on that file and returns its ``subprocess.Popen`` (or the like: ``poll``, ``wait``,
            ``terminate``, ``kill``); default a new interpreter. A run's coordinator forks it
            instead (``testbed.util.forked``): serving in 0.1 s, not 0.35 s.

    A run's coordinator starts it in a child process because amqtt routes every message in
    Python, and in the coordinator's own process (`EmbeddedBroker`) that competed for one GIL with
    the coordinator's MQTT client and round loop (ACFL over MQTT, 100 nodes: the coordinator's
    process spent 4.4 s of CPU, 2.7 s of it the broker's).
    """

    def __init__(self, host: str = "127.0.0.1", *, start_timeout_s: float = STALL_S,
                 launch: Callable[[list[str], int], Any] | None = None, start_cap_s: float = CAP_S):
        self.host = require_loopback(host)
        self.port = 0
        self._start_timeout_s, self._start_cap_s = start_timeout_s, start_cap_s
        self._launch = launch or _new_interpreter
        self._proc: Any = None

    @property
    def url(self) -> str:
        """`mqtt://host:port` (valid once started)."""
        return format_url("mqtt", self.host, self.port)

    def start(self) -> BrokerProcess:
        """Start the child; returns when it accepts connections."""
        if self._proc is not None:
            return self
        self.port = self.port or free_port(self.host)
        # Not a pipe: a broker that logs a lot never blocks on it; the child keeps its own descriptor.
        args = ["broker", "--host", self.host, "--port", str(self.port), "--parent-pid", str(os.getpid())]
        with tempfile.TemporaryFile(mode="w+") as errors:
            self._proc = proc = self._launch(args, errors.fileno())
            waited = wait_while_starting(lambda: accepts_tcp(self.host, self.port), lambda: proc.poll() is None,
                                         process_progress(proc.pid), stall_s=self._start_timeout_s,
                                         cap_s=self._start_cap_s)
            if waited.outcome != "ready":
                self.stop()
                errors.seek(0)
                last = [line for line in errors.read().splitlines() if line.strip()][-1:]
                why = last[0].removeprefix('testbed: ') if last else waited.why(self._start_timeout_s, self._start_cap_s)
                raise UserError(f"embedded broker on {self.url} did not start: {why}")
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop the child (SIGTERM: it closes its connections and leaves), killed if it lingers."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def __enter__(self) -> BrokerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _new_interpreter(argv: list[str], stderr_fd: int) -> subprocess.Popen:
    """``testbed ARGV`` in a new interpreter, its stderr on ``stderr_fd`` (BrokerProcess's default)."""
    return subprocess.Popen([sys.executable, "-m", "testbed", *argv], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=stderr_fd)


def _missing() -> str | None:
    return None if importlib.util.find_spec("amqtt") else "the amqtt package is not installed (pip install amqtt)"


def _make(options: BrokerOptions) -> BrokerProcess:
    return BrokerProcess(launch=options.launch)


REGISTRATION = Registration(
    name="embedded", description="amqtt in a child process (pure Python, MQTT 3.1.1, anonymous)",
    preference=1, missing=_missing, make=_make,
    # amqtt speaks 3.1.1 only (a v5 probe would be logged as a warning) and so cannot say that it
    # serves shared subscriptions, which it does (testbed.mqtt.embedded_broker).
    protocol="3.1.1", broadcast="shared")
