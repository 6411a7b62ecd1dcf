"""Broker URLs, free loopback ports and a reachability wait: what every client of a broker needs.

The brokers a run or a test starts itself are in `testbed.mqtt.brokers` (one module each, found by
its registry); the amqtt broker itself lives in `testbed.mqtt.embedded_broker`, so that asyncio and
amqtt are imported by what serves it, not by every client of a broker URL (a board's `testbed node`,
an emulated host).
"""

from __future__ import annotations

import dataclasses
import ipaddress
import socket
import time
import urllib.parse

from testbed.errors import UserError

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
        return format_url("mqtts" if self.tls else "mqtt", self.host, self.port)


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


def address_family(host: str) -> socket.AddressFamily:
    """AF_INET6 for an IPv6 literal, else AF_INET."""
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def format_url(scheme: str, host: str, port: int) -> str:
    """``scheme://host:port``, an IPv6 literal in brackets."""
    return f"{scheme}://[{host}]:{port}" if ":" in host else f"{scheme}://{host}:{port}"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on `host` that is free right now (the OS picks it; another process may still
    take it before the caller binds, which brokers here detect and retry)."""
    with socket.socket(address_family(host), socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def accepts_tcp(host: str, port: int) -> bool:
    """True when something accepts a TCP connection at ``host:port`` within half a second."""
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
    while not accepts_tcp(parsed.host, parsed.port):
        if time.monotonic() > deadline:
            raise UserError(f"broker {parsed} not reachable within {timeout_s:g} s")
        time.sleep(0.05)


def is_loopback(host: str) -> bool:
    """True for a loopback address (127.0.0.0/8, ::1); names, even "localhost", are not."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def require_loopback(host: str) -> str:
    """``host`` if it is a loopback address, else a UserError (the brokers a run starts itself)."""
    # These brokers serve tests and emulated runs on this machine (the embedded one without any
    # authentication); serving boards on a network takes an explicit allow_remote.
    if not is_loopback(host):
        raise UserError(f"broker host {host!r}: only loopback addresses (127.0.0.0/8, ::1) are allowed")
    return host
