"""MQTT brokers for runs and tests, on loopback only, plus broker URLs and a reachability wait.

- `BrokerProcess`: the embedded amqtt broker (`testbed.mqtt.embedded_broker.EmbeddedBroker`) in a
  child process of its own (`testbed broker`; a run's coordinator forks it where it can); the
  default when a run configures no broker, so that its routing runs beside the coordinator, not
  under its GIL. Anonymous, MQTT 3.1.1 only (amqtt 0.12 refuses v5 CONNECTs).
- `MosquittoBroker`: the `mosquitto` binary with a generated config (optional password file, ACL
  file and TLS) in a temporary directory: per-node credentials and ACLs, as in a deployment.

Both listen on a loopback address only, keep their port across `stop()`/`start()` (so clients can
reconnect to the same URL after a restart) and are context managers. The amqtt broker itself
lives in its own module: asyncio and amqtt are imported by what serves it, not by every client of
a broker URL (a board's `testbed node`, an emulated host).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import pwd
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path
from typing import Any, Callable

from testbed.errors import UserError
from testbed.mqtt.acl import BIND_CLIENT_IDS, queued_messages_for

_DEFAULT_PORTS = {"mqtt": 1883, "mqtts": 8883}


@dataclasses.dataclass(frozen=True)
class BrokerUrl:
    """A parsed broker URL `mqtt[s]://[user[:password]@]host[:port]`."""

    host: str
    port: int
    tls: bool
    username: str | None = None
    password: str | None = None

    def __str__(self) -> str:
        """The URL without credentials (safe to log)."""
        return _url("mqtts" if self.tls else "mqtt", self.host, self.port)


def parse_broker_url(url: str) -> BrokerUrl:
    """Parse `mqtt://` (plain TCP, default port 1883) or `mqtts://` (TLS, default port 8883) URLs.

    Raises:
        UserError: other schemes, no host, a bad port, or a path/query part.
    """
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in _DEFAULT_PORTS:
        raise UserError(f"broker url {url!r}: scheme must be mqtt:// or mqtts://")
    try:
        port = parts.port or _DEFAULT_PORTS[parts.scheme]
    except ValueError:
        raise UserError(f"broker url {url!r}: bad port") from None
    if not parts.hostname:
        raise UserError(f"broker url {url!r}: no host")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise UserError(f"broker url {url!r}: unexpected path or query")
    unquote = urllib.parse.unquote
    return BrokerUrl(host=parts.hostname, port=port, tls=parts.scheme == "mqtts",
                     username=unquote(parts.username) if parts.username is not None else None,
                     password=unquote(parts.password) if parts.password is not None else None)


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _url(scheme: str, host: str, port: int) -> str:
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on `host` that is free right now (the OS picks it; another process may still
    take it before the caller binds, which brokers here detect and retry)."""
    with socket.socket(_family(host), socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _accepts(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5):
            return True
    except OSError:
        return False


def wait_for_broker(url: str, timeout_s: float = 10.0) -> None:
    """Block until the broker at `url` accepts TCP connections.

    Raises:
        UserError: not reachable within `timeout_s` seconds.
    """
    parsed = parse_broker_url(url)
    deadline = time.monotonic() + timeout_s
    while not _accepts(parsed.host, parsed.port):
        if time.monotonic() > deadline:
            raise UserError(f"broker {parsed} not reachable within {timeout_s:g} s")
        time.sleep(0.05)


def is_loopback(host: str) -> bool:
    """True for a loopback address (127.0.0.0/8, ::1); names, even "localhost", are not."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _loopback(host: str) -> str:
    # These brokers serve tests and emulated runs on this machine (the embedded one without any
    # authentication); serving boards on a network takes an explicit allow_remote.
    if not is_loopback(host):
        raise UserError(f"broker host {host!r}: only loopback addresses (127.0.0.0/8, ::1) are allowed")
    return host


class BrokerProcess:
    """The embedded broker in a child process (`testbed broker --parent-pid`), which leaves when
    this process does, even killed.

    Args:
        host: loopback address to listen on.
        start_timeout_s: how long `start()` waits for it to accept connections.
        launch: starts the child: ``launch(argv, stderr_fd)`` runs ``testbed ARGV`` with its stderr
            on that file and returns its ``subprocess.Popen`` (or the like: ``poll``, ``wait``,
            ``terminate``, ``kill``); default a new interpreter. A run's coordinator forks it
            instead (``testbed.util.forked``): serving in 0.1 s, not 0.35 s.

    A run's coordinator starts it when no broker is configured: amqtt routes every message in
    Python, and in the coordinator's own process (`EmbeddedBroker`) that competed for one GIL with
    the coordinator's MQTT client and round loop (ACFL over MQTT, 100 nodes: the coordinator's
    process spent 4.4 s of CPU, 2.7 s of it the broker's).
    """

    def __init__(self, host: str = "127.0.0.1", *, start_timeout_s: float = 10.0,
                 launch: Callable[[list[str], int], Any] | None = None):
        self.host = _loopback(host)
        self.port = 0
        self._start_timeout_s = start_timeout_s
        self._launch = launch or _new_interpreter
        self._proc: Any = None

    @property
    def url(self) -> str:
        """`mqtt://host:port` (valid once started)."""
        return _url("mqtt", self.host, self.port)

    def start(self) -> BrokerProcess:
        """Start the child; returns when it accepts connections."""
        if self._proc is not None:
            return self
        self.port = self.port or free_port(self.host)
        # Not a pipe: a broker that logs a lot never blocks on it; the child keeps its own descriptor.
        args = ["broker", "--host", self.host, "--port", str(self.port), "--parent-pid", str(os.getpid())]
        with tempfile.TemporaryFile(mode="w+") as errors:
            self._proc = self._launch(args, errors.fileno())
            deadline = time.monotonic() + self._start_timeout_s
            while not _accepts(self.host, self.port):
                if self._proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    errors.seek(0)
                    last = [line for line in errors.read().splitlines() if line.strip()][-1:] or ["no output"]
                    raise UserError(f"embedded broker on {self.url} did not start: "
                                    f"{last[0].removeprefix('testbed: ')}")
                time.sleep(0.02)
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


@dataclasses.dataclass(frozen=True)
class TlsFiles:
    """PEM files for a TLS listener: the CA that signed the server certificate, the certificate and
    its private key."""

    cafile: Path
    certfile: Path
    keyfile: Path


def _open_files_to_hard_limit() -> None:
    """In the broker's child process, before exec: soft limit on open files = the hard limit."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


class MosquittoBroker:
    """A `mosquitto` subprocess listening on loopback, configured from a generated file.

    Args:
        port: TCP port; 0 picks a free one at the first `start()` and keeps it for restarts.
        acl_file: Mosquitto ACL file (see `testbed.mqtt.acl`), or None for no topic restrictions.
        password_file: Mosquitto password file; when given, anonymous clients are refused.
        bind_client_ids: replace each client's id by its username (`use_username_as_clientid`), so
            no credential can take over another client's session; default: on with a password
            file, as `testbed acl` configures it.
        tls: serve TLS (URL scheme mqtts://) with these files instead of plain TCP.
        binary: the executable to run.
        nodes: the most nodes a run on it will have: sizes ``max_queued_messages``
            (:func:`testbed.mqtt.acl.queued_messages_for`; Mosquitto's default of 1,000 drops the
            statuses and updates of the nodes past the 1,000th).

    Mosquitto inherits this process's hard limit on open files as its soft limit (it does not
    raise it itself, and every client is a socket): a soft limit of 1,024 would cap it near 1,000
    clients.
    """

    def __init__(self, port: int = 0, *, acl_file: str | Path | None = None,
                 password_file: str | Path | None = None, tls: TlsFiles | None = None,
                 host: str = "127.0.0.1", binary: str = "mosquitto", start_timeout_s: float = 10.0,
                 bind_client_ids: bool | None = None, nodes: int = 50_000):
        self.host = _loopback(host)
        self.nodes = nodes
        self.port = port
        self.acl_file = Path(acl_file).resolve() if acl_file else None
        self.password_file = Path(password_file).resolve() if password_file else None
        self.tls = tls
        self.bind_client_ids = bool(password_file) if bind_client_ids is None else bind_client_ids
        self.binary = binary
        self._start_timeout_s = start_timeout_s
        self._proc: subprocess.Popen[bytes] | None = None
        self._dir: Path | None = None

    @property
    def url(self) -> str:
        """`mqtt://host:port`, or `mqtts://` with TLS (valid once started)."""
        return _url("mqtts" if self.tls else "mqtt", self.host, self.port)

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def log_path(self) -> Path | None:
        """Mosquitto's log (connections, denied publishes...) while running."""
        return self._dir / "mosquitto.log" if self._dir else None

    def _config(self) -> str:
        lines = [
            "# generated by testbed.mqtt.broker",
            "per_listener_settings false",
            # Run as ourselves: as root mosquitto would switch to user 'mosquitto', who cannot
            # read our temporary files.
            f"user {pwd.getpwuid(os.geteuid()).pw_name}",
            "persistence false",
            "set_tcp_nodelay true",  # see MqttClient: no Nagle delays on small QoS-1 packets
            "log_dest stderr",
            *(f"log_type {t}" for t in ("error", "warning", "notice", "information")),
            f"allow_anonymous {'false' if self.password_file else 'true'}",
            f"max_queued_messages {queued_messages_for(self.nodes)}",
        ]
        if self.password_file:
            lines.append(f"password_file {self.password_file}")
        if self.acl_file:
            lines.append(f"acl_file {self.acl_file}")
        lines.append(f"listener {self.port} {self.host}")
        if self.bind_client_ids:
            lines.append(BIND_CLIENT_IDS)  # a listener setting: after its `listener` line
        if self.tls:
            lines += [f"cafile {Path(self.tls.cafile).resolve()}",
                      f"certfile {Path(self.tls.certfile).resolve()}",
                      f"keyfile {Path(self.tls.keyfile).resolve()}"]
        return "\n".join(lines) + "\n"

    def start(self) -> MosquittoBroker:
        """Start mosquitto; returns when it accepts connections. No-op if running.

        Raises:
            UserError: binary not found, or mosquitto exited / did not listen in time (the message
                carries the end of its log).
        """
        if self.running:
            return self
        exe = shutil.which(self.binary)
        if exe is None:
            raise UserError(f"mosquitto broker: '{self.binary}' not found on PATH "
                            "(install it, e.g. apt-get install mosquitto)")
        pick_port = not self.port
        attempts = 3 if pick_port else 1
        while True:
            attempts -= 1
            if pick_port:
                self.port = free_port(self.host)
            self._dir = Path(tempfile.mkdtemp(prefix="tb-mosquitto-"))
            conf = self._dir / "mosquitto.conf"
            conf.write_text(self._config())
            with open(self._dir / "mosquitto.log", "wb") as log:
                self._proc = subprocess.Popen([exe, "-c", str(conf)], stdout=log, stderr=subprocess.STDOUT,
                                              stdin=subprocess.DEVNULL, preexec_fn=_open_files_to_hard_limit)
            deadline = time.monotonic() + self._start_timeout_s
            while self._proc.poll() is None and time.monotonic() < deadline:
                # "running" is logged once every listener is bound; the connect check alone could
                # reach another process that holds the port.
                if " running" in self.log_text() and _accepts(self.host, self.port):
                    return self
                time.sleep(0.02)
            tail = self._log_tail()
            self._cleanup()
            # A port picked by us may have been taken in between: try another one.
            if not attempts or "Address already in use" not in tail:
                raise UserError(f"mosquitto on {self.url} did not start: {tail or 'no output'}")

    def _log_tail(self, lines: int = 5) -> str:
        """Mosquitto's error lines, or else its last lines, joined into one line."""
        logged = self.log_text().strip().splitlines()
        return " | ".join([line for line in logged if "Error" in line] or logged[-lines:])

    def log_text(self) -> str:
        """The whole mosquitto log so far ("" if not running)."""
        path = self.log_path
        return path.read_text(errors="replace") if path and path.exists() else ""

    def _cleanup(self) -> None:
        if self._proc is not None:
            if self._proc.poll() is None:
                self._proc.terminate()
                try:
                    self._proc.wait(5)
                except subprocess.TimeoutExpired:
                    self._proc.kill()
                    self._proc.wait()
            self._proc = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None

    def stop(self) -> None:
        """Stop mosquitto (SIGTERM, then SIGKILL after 5 s) and delete its temporary directory."""
        self._cleanup()

    def __enter__(self) -> MosquittoBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
