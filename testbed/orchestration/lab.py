"""What `testbed provision` needs beyond the bundles to start a lab as written: the broker's
address given up front (a name or an IP: ``localhost`` for a lab on one PC, ``192.168.1.10``,
``broker.lan``), and the coordinator's experiment file, written from a base experiment with the
lab's ``[mqtt]`` (no hand editing)."""

from __future__ import annotations

import dataclasses
import ipaddress
import re
from pathlib import Path

from nodes import board_config
from testbed.errors import ConfigError, UserError
from testbed.mqtt.broker import format_url, parse_broker_url

#: A DNS name: labels of letters, digits and hyphens (not at either end), dot-separated.
_DNS_NAME = re.compile(r"^(?=.{1,253}$)([A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?$")
#: The file `--experiment` writes, under OUT/coordinator.
EXPERIMENT_NAME = "experiment.toml"


def broker_at(inventory, address: str):
    """``inventory`` with its broker at ``address``: a whole URL (mqtt:// or mqtts://), or a host
    name or IP address that keeps the inventory's scheme and port.

    Example::

        >>> from testbed.orchestration.provision import Inventory
        >>> inv = Inventory("lab1", "mqtts://broker.lan:8883", None, "/opt/testbed/bin/testbed", ())
        >>> broker_at(inv, "localhost").broker, broker_at(inv, "192.168.1.10").broker, broker_at(inv, "::1").broker
        ('mqtts://localhost:8883', 'mqtts://192.168.1.10:8883', 'mqtts://[::1]:8883')

    Raises:
        ConfigError: naming --broker, for an address that is neither a URL nor a host name or IP.
    """
    address = address.strip()
    if "://" in address:
        url = address
    else:
        host = address[1:-1] if address.startswith("[") and address.endswith("]") else address
        if not _is_host(host):
            raise ConfigError("--broker", f"{address[:80]!r} is not a host name, an IP address or an mqtt(s):// URL")
        current = parse_broker_url(inventory.broker)
        url = format_url("mqtts" if current.tls else "mqtt", host, current.port)
    try:
        checked = board_config.CHECKS["broker"](url)
    except ValueError as exc:
        raise ConfigError("--broker", str(exc)) from None
    return dataclasses.replace(inventory, broker=checked)


def _is_host(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        return bool(_DNS_NAME.match(text))


def write_experiment(base: Path, inventory, out: Path, ca: Path | None) -> Path:
    """OUT/coordinator/experiment.toml: the experiment ``base`` run over MQTT on the lab's boards
    (``run.mode = "mqtt"``, ``data.num_nodes`` the boards, and ``[mqtt]``: the broker, the run id,
    ``emulated = false``, the coordinator's credentials and message keys and, for TLS, the CA), validated as
    `testbed run` validates it.

    Raises:
        UserError: the boards' node ids are not 0 .. N-1 (a run's nodes are), or ``base`` is
            refused (one line naming the key).
    """
    from testbed.assembly.config import to_toml
    from testbed.assembly.experiment import experiment_config

    ids = sorted(board.node_id for board in inventory.boards)
    if ids != list(range(len(ids))):
        raise UserError(f"--experiment: a run's nodes are 0 .. N-1; the inventory's boards have node ids "
                        f"{', '.join(map(str, ids[:10]))}{', ...' if len(ids) > 10 else ''}")
    coordinator = out / "coordinator"
    overrides = {"run.mode": "mqtt", "data.num_nodes": len(ids), "mqtt.broker_url": inventory.broker,
                 "mqtt.run_id": inventory.run_id, "mqtt.emulated": False,
                 "mqtt.credentials": str((coordinator / "credentials.json").resolve()),
                 "mqtt.keys": str((coordinator / "keys.json").resolve())}
    if ca is not None:
        overrides["mqtt.tls_ca"] = str(Path(ca).resolve())
    config = experiment_config(base, overrides)
    path = coordinator / EXPERIMENT_NAME
    path.write_text(to_toml(config))
    return path
