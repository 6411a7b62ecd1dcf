"""The managed-broker registry: every module of this package that defines ``REGISTRATION`` is a
broker a run can start itself; adding one is adding a
module, here or in an installed plugin (docs/extending.md).

A :class:`Registration` says the broker's name (``mqtt.broker``), whether this machine can run it,
how to make one (:class:`ManagedBroker`: start, stop, URL) and, when it can enforce them, how it
writes a run's users and topic rules (:class:`testbed.mqtt.acl.Access`) in its own format
(:class:`AccessFormat`). With no ``mqtt.broker_url`` a run starts the broker ``mqtt.broker`` names,
or with ``"auto"`` the most preferred one this machine has (:func:`choose`).

Example::

    >>> {"embedded", "mosquitto"} <= set(names())
    True
    >>> get("embedded").access is None  # anonymous: it enforces no ACL
    True
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Protocol

from testbed.errors import ConfigError
from testbed.mqtt.acl import Access
from testbed.util.registrations import GROUPS, lookup, registered_in

#: ``mqtt.broker``'s choice of the most preferred broker this machine can run.
AUTO = "auto"


class ManagedBroker(Protocol):
    """A broker this process started: on a loopback address, until :meth:`stop`."""

    @property
    def url(self) -> str:
        """``mqtt://host:port`` (valid once started)."""
        ...

    def start(self) -> "ManagedBroker":
        """Start it; returns once it accepts connections (a no-op when running).

        Raises:
            UserError: it could not start (the reason in one line).
        """
        ...

    def stop(self) -> None:
        """Stop it and remove whatever it wrote; no process of it is left behind."""
        ...


@dataclass(frozen=True)
class BrokerOptions:
    """What a run asks of the broker it starts.

    Attributes:
        nodes: the most nodes that will connect (sizes the broker's per-client queues).
        access: the run's users and topic rules, to enforce (None: anonymous clients, any topic);
            only for a broker with an :class:`AccessFormat`.
        launch: how to start a ``testbed`` subcommand as a child process (``launch(argv,
            stderr_fd)``, returning a ``Popen``-like object), for a broker served by one; None: a
            new interpreter. A run's coordinator forks itself (``testbed.util.forked``).
        also_listen: addresses of this machine to listen on besides loopback, on the same port
            with the same users, topic rules and TLS (the run's links: testbed.orchestration.links);
            only for a broker whose registration says ``listens_beyond_loopback``.
    """

    nodes: int = 1
    access: Access | None = None
    launch: Callable[[list[str], int], Any] | None = None
    also_listen: tuple[str, ...] = ()


@dataclass(frozen=True)
class AccessFormat:
    """How a broker keeps a run's users and topic rules.

    Attributes:
        files: the names of the files :attr:`write` makes in a folder.
        write: (folder, access) → writes them there, each mode 0600.
        config_name: the broker's configuration file that loads them (e.g. ``mosquitto.conf``).
        config: (folder the files are in on the broker's host, listener port, nodes, TLS) → that
            configuration's lines; with TLS the folder also holds ``ca.pem``, ``cert.pem`` and
            ``key.pem`` (the broker's certificate and key, signed by the boards' CA).
        installed_dir: where a deployment keeps the files on the broker's host.
    """

    files: tuple[str, ...]
    write: Callable[[Path, Access], None]
    config_name: str
    config: Callable[[str, int, int, bool], str]
    installed_dir: str


@dataclass(frozen=True)
class Registration:
    """One managed broker.

    Attributes:
        name: its ``mqtt.broker``.
        description: one line for help texts.
        preference: ``"auto"`` starts the available broker of the lowest preference.
        missing: () → why this machine cannot run it, or None when it can.
        make: (options) → the broker, not yet started.
        access: how it writes and enforces a run's users and topics; None: it takes anonymous
            clients and enforces no topic rules.
        protocol: the MQTT version (``mqtt.protocol``) clients speak to it when theirs is "auto".
        broadcast: how an emulated host reads the broadcast on it when ``mqtt.broadcast`` is "auto".
        listens_beyond_loopback: it takes :attr:`BrokerOptions.also_listen`.
    """

    name: str
    description: str
    preference: int
    missing: Callable[[], str | None]
    make: Callable[[BrokerOptions], ManagedBroker]
    access: AccessFormat | None = None
    protocol: str = "auto"
    broadcast: str = "auto"
    listens_beyond_loopback: bool = False


@functools.cache
def registrations() -> dict[str, Registration]:
    """Every managed broker of this package and of the installed plugins (testbed.brokers), by name (modules imported once, on first use)."""
    import testbed.mqtt.brokers as package

    return registered_in(package, Registration, "managed broker", group=GROUPS["managed broker"], reserved=(AUTO,))


def names() -> list[str]:
    return list(registrations())


def get(name: str) -> Registration:
    return lookup(registrations(), name, "managed broker")


def choose(name: str, key: str = "mqtt.broker") -> Registration:
    """The broker ``name`` names (``"auto"``: the most preferred one this machine can run).

    Raises:
        ConfigError: an unknown name, or a broker this machine cannot run (naming ``key``).
    """
    if name == AUTO:
        return min((r for r in registrations().values() if r.missing() is None), key=lambda r: r.preference)
    if name not in registrations():
        raise ConfigError(key, f"must be {AUTO} or one of {', '.join(names())}, got {name!r}")
    reg = registrations()[name]
    if (why := reg.missing()) is not None:
        raise ConfigError(key, f"{name}: {why}")
    return reg


def with_access() -> list[str]:
    """The brokers that write and enforce a run's users and topic rules."""
    return [name for name, reg in registrations().items() if reg.access is not None]
