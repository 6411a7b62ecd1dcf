"""Provisioning a lab of boards from one inventory (`testbed provision INVENTORY.toml --out DIR`).

The inventory names the run, its broker and every board (host name, node id, device profile,
meter, data); provisioning writes, under DIR:

    broker/acl, broker/passwords    Mosquitto's acl_file and password_file (testbed.mqtt.brokers.mosquitto), 0600
    broker/mosquitto.conf           a whole conf that uses them: `mosquitto -c DIR/broker/mosquitto.conf`
                                    starts as written, as the user who owns the files (its paths are
                                    DIR/broker's, absolute, or those of a --broker-dir the files are
                                    copied to on the broker's host)
    broker/ca.pem, cert.pem, key.pem  with --tls: the lab's CA, the broker's certificate for the broker
                                    URL's host and its key (0600) (testbed.orchestration.certificates)
    coordinator/credentials.json    the passwords of the run's service users (coordinator, channel
                                    emulator...), never a board's; `mqtt.credentials`, 0600
    coordinator/keys.json           every board's message key (testbed.mqtt.auth); `mqtt.keys`, 0600
    coordinator/ca.pem              with --tls: the CA, for `mqtt.tls_ca`
    boards/HOST/node.toml           the board's node file (`testbed node --config`)
    boards/HOST/credentials.json    that board's own password only, 0600
    boards/HOST/keys.json           that board's own message key only (HMAC-SHA256), 0600
    boards/HOST/ca.pem              the CA of an mqtts:// broker: the inventory's `ca`, or --tls's
    boards/HOST/data/FILE           the board's data file, when the inventory gives a local one
    boards/HOST/testbed-node.service  the systemd unit that keeps the node agent running

A bundle is unpacked into BOARD_DIR (/etc/testbed) on its board; node.toml's paths are relative
to it, so the same bundle also runs in place (`testbed node --config boards/HOST/node.toml`).

Inventory (TOML)::

    run_id = "lab1"                        # mqtt.run_id of the experiment (default "testbed")
    broker = "mqtts://broker.lan:8883"     # how the boards reach the broker
    ca = "tls/ca.pem"                      # with mqtts:// and your own CA (else --tls makes one)
    testbed = "/opt/testbed/bin/testbed"   # the command on the boards (default)

    [defaults]                             # any board key but host and node_id
    profile = "host"                       # the board as it is (default); its costs measured by
    meter = "ina260"                       # its meter (auto: an INA260, an INA219, RAPL, the model)

    [[boards]]
    host = "pi-01"
    node_id = 0
    data = "shards/adult.data"             # a file here, copied into the bundle
    # or data_path = "/srv/adult.data"     # a file already on the board
"""

from __future__ import annotations

import os
import pwd
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nodes import board_config
from nodes.meters import registry as meters
from testbed.checked import inputs
from testbed.errors import ConfigError, UserError
from testbed.mqtt import acl, auth
from testbed.mqtt.broker import parse_broker_url
from testbed.mqtt.brokers import registry as brokers
from testbed.orchestration.certificates import make_broker_tls
from testbed.util import jsontext, userfiles

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

#: The lab's broker: the managed broker whose files (testbed.mqtt.brokers) provisioning writes.
BROKER_KIND = "mosquitto"
#: Where a bundle is unpacked on its board and where the node agent keeps its ledgers.
BOARD_DIR = "/etc/testbed"
STATE_DIR = "/var/lib/testbed"
UNIT_NAME = "testbed-node.service"
DEFAULT_COMMAND = "/opt/testbed/bin/testbed"

#: Mosquitto started as root switches to the user `mosquitto` unless its conf names another, and
#: then cannot read files only their owner may (the passwords, the key): the conf of files that stay
#: where they were written names their owner.
_RUN_AS_OWNER = "# started as root, Mosquitto runs as this user, the owner of these files"
_TOP_KEYS = ("run_id", "broker", "ca", "testbed", "defaults", "boards")
_BOARD_KEYS = ("host", "node_id", "profile", "meter", "data", "data_path")
#: A host name as a bundle's folder name: DNS labels (RFC 1123), no path separators.
#: The most boards one provisioning makes: one broker's ACL and password file for them all (10,000
#: nodes is the largest lab measured, benchmarks/mqtt_scale.py). Checked before any board is read.
MAX_BOARDS = 10_000
#: The largest inventory read: its boards at 1 KiB each (a board's table is a few lines), checked
#: by its size before it is read.
MAX_INVENTORY_BYTES = MAX_BOARDS * 1024 + 64 * 1024
#: The largest data file copied into a bundle, and the largest CA certificate file read.
MAX_DATA_BYTES = 8 * 2**30
MAX_CA_BYTES = 2**20
_HOST = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,62})(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,62}))*")


@dataclass(frozen=True)
class Board:
    """One board of the inventory.

    Attributes:
        host: its host name (names its bundle).
        node_id: its node id (and MQTT username).
        profile: its device profile (nodes/profiles.toml): "host" for the board as it is (a real
            board's costs, measured by its meter); another board's name only to emulate that
            board (meter "model").
        meter: how it measures joules (nodes.meters.registry.kinds()).
        data: a data file on this machine, copied into the bundle, or None.
        data_path: a data file already on the board, or None.
    """

    host: str
    node_id: int
    profile: str = "host"
    meter: str = "auto"
    data: Path | None = None
    data_path: str | None = None


@dataclass(frozen=True)
class Inventory:
    """A checked inventory: the run, its broker, the CA (or None) and the boards in file order."""

    run_id: str
    broker: str
    ca: Path | None
    command: str
    boards: tuple[Board, ...]


def load_inventory(path: Path, *, allow_absolute: bool = False) -> Inventory:
    """Read and check an inventory. Its files (``data``, ``ca``) are inside its folder, symlinks
    resolved: an inventory someone else wrote cannot have `testbed provision` copy /etc/shadow
    into a bundle. An absolute path outside it is taken only with ``allow_absolute`` (the
    provisioner's ``--allow-absolute-paths``).

    Raises:
        ConfigError: a missing or unreadable file, not TOML, an unknown key, a bad or missing
            value, more than MAX_BOARDS boards, a host or node id given twice, a missing file or
            one outside the inventory's folder (naming the inventory and the key).
    """
    path = Path(path)
    if not path.exists():
        raise ConfigError(str(path), "inventory not found")
    try:
        text = userfiles.read_text(path, MAX_INVENTORY_BYTES, "inventory")
    except UserError as exc:
        why = str(exc).removeprefix(f"inventory {path}: ")
        if "bytes, more than" in why:
            why += f" (an inventory of at most {MAX_BOARDS:,} boards)"
        raise ConfigError(str(path), f"cannot be read: {why}") from None
    if text.count("[[boards]]") > MAX_BOARDS:  # before a parse of them all (a million: 74 s, 0.5 GB)
        raise ConfigError(f"{path}: boards", _too_many(text.count("[[boards]]")))
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(str(path), f"not valid TOML: {exc}") from None
    except RecursionError:
        raise ConfigError(str(path), "not valid TOML: nested too deeply") from None
    reader = _Reader(path, allow_absolute)
    for key in raw:
        if key not in _TOP_KEYS:
            raise reader.fail(key, f"unknown key; an inventory takes {', '.join(_TOP_KEYS)}")
    if "broker" not in raw:
        raise reader.fail("broker", "missing: the URL the boards reach the broker at (mqtt:// or mqtts://)")
    broker = reader.check("broker", "broker", raw["broker"])
    run_id = reader.check("run_id", "run", raw.get("run_id", "testbed"))
    ca = reader.local_file("ca", raw["ca"]) if "ca" in raw else None
    if ca is not None and not broker.startswith("mqtts://"):
        raise reader.fail("ca", "is set but the broker is not mqtts:// (TLS): the boards would talk in cleartext")
    command = raw.get("testbed", DEFAULT_COMMAND)
    if not isinstance(command, str) or not Path(command).is_absolute() or any(c.isspace() for c in command):
        raise reader.fail("testbed", f"must be the absolute path of `testbed` on the boards (systemd's "
                                     f"ExecStart), got {command!r}")
    defaults = raw.get("defaults", {})
    if not isinstance(defaults, dict):
        raise reader.fail("defaults", "must be a table ([defaults])")
    for key in defaults:
        if key not in _BOARD_KEYS or key in ("host", "node_id"):
            raise reader.fail(f"defaults.{key}", f"unknown key; defaults take {', '.join(_BOARD_KEYS[2:])}")
    entries = raw.get("boards")
    if not isinstance(entries, list) or not entries or not all(isinstance(b, dict) for b in entries):
        raise reader.fail("boards", "must be one or more [[boards]] tables")
    if len(entries) > MAX_BOARDS:  # before any board is checked, let alone a password made for it
        raise reader.fail("boards", _too_many(len(entries)))
    boards: list[Board] = []
    for i, entry in enumerate(entries):
        board = reader.board(f"boards[{i}]", entry, defaults)
        if any(b.host == board.host for b in boards):
            raise reader.fail(f"boards[{i}].host", f"{board.host!r} is given twice")
        if any(b.node_id == board.node_id for b in boards):
            raise reader.fail(f"boards[{i}].node_id", f"{board.node_id} is given twice")
        boards.append(board)
    return Inventory(run_id=run_id, broker=broker, ca=ca, command=command, boards=tuple(boards))


def _too_many(boards: int) -> str:
    return (f"{boards:,} boards, more than the {MAX_BOARDS:,} one provisioning makes (one broker's ACL and password "
            "file); split the lab into several runs")


class _Reader:
    """Checks the values of one inventory file; every error names the file and the key."""

    def __init__(self, path: Path, allow_absolute: bool):
        self.path = path
        self.base = path.resolve().parent
        self.allow_absolute = allow_absolute

    def fail(self, key: str, problem: str) -> ConfigError:
        return ConfigError(f"{self.path}: {key}", problem)

    def check(self, key: str, name: str, value: Any) -> Any:
        """``value`` checked as the node file's key ``name`` is (nodes.board_config.CHECKS)."""
        try:
            return board_config.CHECKS[name](value)
        except ValueError as exc:
            raise self.fail(key, str(exc)) from None

    def local_file(self, key: str, value: Any) -> Path:
        """A regular file on this machine inside the inventory's folder (symlinks resolved), or
        anywhere given absolute with ``allow_absolute``."""
        try:
            file = userfiles.inside(self.base, self.check(key, "data", value), "", allow_absolute=self.allow_absolute)
            userfiles.regular_file(file, MAX_DATA_BYTES, "")
        except UserError as exc:
            why = str(exc).strip()
            if "outside" in why and Path(value).is_absolute():
                why += "; give --allow-absolute-paths to take it"
            raise self.fail(key, why) from None
        return file

    def board(self, where: str, entry: dict[str, Any], defaults: dict[str, Any]) -> Board:
        """One ``[[boards]]`` table (``where``: how to name it), over the ``[defaults]``."""
        for key in entry:
            if key not in _BOARD_KEYS:
                raise self.fail(f"{where}.{key}", f"unknown key; a board takes {', '.join(_BOARD_KEYS)}")
        values = {**defaults, **entry}
        for key in ("host", "node_id"):
            if key not in values:
                raise self.fail(f"{where}.{key}", "missing")
        host = values["host"]
        if not isinstance(host, str) or not _HOST.fullmatch(host):
            raise self.fail(f"{where}.host", f"must be a host name (letters, digits, '-', '.'), got {host!r}")
        if "data" in values and "data_path" in values:
            raise self.fail(f"{where}.data", "give data (a file here, copied) or data_path (a file on the board), "
                                             "not both")
        profile = self.check(f"{where}.profile", "profile", values.get("profile", "host"))
        meter = self.check(f"{where}.meter", "meter", values.get("meter", "auto"))
        try:
            meters.check_meter_fits_profile(meter, profile)
        except UserError as exc:
            raise self.fail(f"{where}.meter", str(exc)) from None
        return Board(
            host=host, node_id=self.check(f"{where}.node_id", "node_id", values["node_id"]), profile=profile,
            meter=meter, data=self.local_file(f"{where}.data", values["data"]) if "data" in values else None,
            data_path=self.check(f"{where}.data_path", "data", values["data_path"]) if "data_path" in values else None)


def node_unit(command: str, meter: str) -> str:
    """The systemd unit of a board's node agent.

    It starts after the network is online and is restarted whatever way it ends: the agent also
    exits (status 0) when a run is over and when the broker has been gone for 30 s, and a lab's
    board should be back for the next run. A dynamic user runs it, reading the board's password
    and message key through systemd's credentials (the file itself stays root's, 0600) and keeping its ledgers in
    its state directory; a meter adds the groups its registration names (an INA219/INA260: the
    ``i2c`` group, Raspberry Pi OS's owner of /dev/i2c-*; ``meter = "auto"`` finds an INA only
    where the unit is given that group).

    Args:
        command: the path of `testbed` on the board.
        meter: the board's meter kind.
    """
    names = () if meter == meters.AUTO else meters.get(meter).unix_groups
    groups = f"SupplementaryGroups={' '.join(names)}\n" if names else ""
    return f"""[Unit]
Description=testbed node agent (config {BOARD_DIR}/node.toml)
Wants=network-online.target
# time-sync.target: with systemd-time-wait-sync enabled, a board without an RTC waits for NTP
# before it checks the broker's TLS certificate (else "not yet valid" at boot)
After=network-online.target time-sync.target
StartLimitIntervalSec=0

[Service]
Type=exec
ExecStart={command} node --config {BOARD_DIR}/node.toml --credentials ${{CREDENTIALS_DIRECTORY}}/credentials.json --keys ${{CREDENTIALS_DIRECTORY}}/keys.json --state-dir ${{STATE_DIRECTORY}}
LoadCredential=credentials.json:{BOARD_DIR}/credentials.json
LoadCredential=keys.json:{BOARD_DIR}/keys.json
DynamicUser=yes
{groups}StateDirectory=testbed
# a data set the board downloads (Adult...) is cached in the state directory
Environment=TESTBED_CACHE=%S/testbed/cache
Restart=always
RestartSec=5
NoNewPrivileges=yes
ProtectSystem=strict
ProtectHome=yes
PrivateTmp=yes

[Install]
WantedBy=multi-user.target
"""


def broker_access() -> brokers.AccessFormat:
    """How the lab's broker (BROKER_KIND) keeps the run's users: its files and where they go."""
    fmt = brokers.get(BROKER_KIND).access
    assert fmt is not None, f"{BROKER_KIND} writes no ACL"
    return fmt


def provision(inventory: Inventory, out: Path, *, tls: bool = False, broker_dir: str | None = None) -> dict[str, Path]:
    """Write the broker's files, the coordinator's credentials and one bundle per board under ``out``.

    Args:
        inventory: a checked inventory (:func:`load_inventory`).
        out: an empty or missing folder.
        tls: make the lab's CA and the broker's certificate and key (an mqtts:// broker whose
            inventory names no ``ca``).
        broker_dir: where the broker's files will be on the broker's host (an absolute path), for
            the conf's paths; None: where they are written, ``out/broker``.

    Returns:
        {board host: its bundle folder}.

    Raises:
        UserError: ``out`` is not empty or cannot be written; ``tls`` with a plain broker or with
            the inventory's own ``ca``; a relative ``broker_dir``.
    """
    url = parse_broker_url(inventory.broker)
    if tls and not url.tls:
        raise UserError(f"--tls: the inventory's broker {inventory.broker} is plain mqtt://; give an mqtts:// URL "
                        "(port 8883 by convention)")
    if tls and inventory.ca is not None:
        raise UserError(f"--tls makes the lab's CA, but the inventory names its own ca {inventory.ca}: give one "
                        "or the other")
    if broker_dir is not None and not Path(broker_dir).is_absolute():
        raise UserError(f"--broker-dir {broker_dir}: must be an absolute path (the conf's paths are read by "
                        "Mosquitto from wherever it starts)")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise UserError(f"--out {out}: not an empty folder (an earlier provisioning's passwords would mix with "
                        "new ones); choose another or remove it")
    inputs.output_dir(out, "--out")
    nodes = [str(b.node_id) for b in inventory.boards]
    access = acl.generate_access(inventory.run_id, nodes)
    fmt = broker_access()
    passwords = access.passwords
    made = make_broker_tls(url.host, inventory.run_id) if tls else None
    try:
        ca_pem = made.ca_pem if made is not None else \
            userfiles.read_bytes(inventory.ca, MAX_CA_BYTES, "ca") if inventory.ca is not None else None
        broker_files = _private_dir(out / "broker")
        fmt.write(broker_files, access)
        if made is not None:
            (broker_files / "ca.pem").write_bytes(made.ca_pem)
            (broker_files / "cert.pem").write_bytes(made.cert_pem)
            acl.write_private(broker_files / "key.pem", made.key_pem.decode())
        conf = fmt.config(broker_dir or str(broker_files.resolve()), url.port, len(nodes), url.tls)
        if broker_dir is None:  # started here: as whoever owns the files, root included (no chown)
            conf = f"{_RUN_AS_OWNER}\nuser {pwd.getpwuid(os.geteuid()).pw_name}\n{conf}"
        acl.write_private(broker_files / fmt.config_name, conf)
        services = {user: pw for user, pw in passwords.items() if user not in nodes}
        coordinator = _private_dir(out / "coordinator")
        acl.write_private(coordinator / "credentials.json", jsontext.dumps(services, indent=2) + "\n")
        keys = auth.Keys(inventory.run_id, {node: auth.new_key() for node in nodes})
        auth.write_keys(coordinator / "keys.json", keys)
        if made is not None:
            (coordinator / "ca.pem").write_bytes(made.ca_pem)
        bundles = {b.host: _bundle(inventory, b, passwords[str(b.node_id)], keys.only([str(b.node_id)]),
                                   out / "boards" / b.host, ca_pem)
                   for b in inventory.boards}
    except OSError as exc:
        raise UserError(f"--out {out}: cannot write {exc.filename or 'there'} ({exc.strerror or exc})") from None
    return bundles


def _bundle(inventory: Inventory, board: Board, password: str, keys: auth.Keys, folder: Path,
            ca_pem: bytes | None) -> Path:
    """One board's bundle: its node file, its own password and message key, the CA (``ca_pem``), its
    data and the unit."""
    _private_dir(folder)
    acl.write_private(folder / "credentials.json", jsontext.dumps({str(board.node_id): password}, indent=2) + "\n")
    auth.write_keys(folder / "keys.json", keys)
    data = board.data_path
    if board.data is not None:  # a node's training data: the owner's only, never wider than the source's
        (folder / "data").mkdir()
        userfiles.copy_file(board.data, folder / "data" / board.data.name, ceiling=userfiles.PRIVATE_MODE,
                            max_bytes=MAX_DATA_BYTES, what="data")
        data = f"data/{board.data.name}"
    if ca_pem is not None:
        (folder / "ca.pem").write_bytes(ca_pem)
    values = {"broker": inventory.broker, "run": inventory.run_id, "node_id": board.node_id,
              "credentials": "credentials.json", "keys": "keys.json", "tls_ca": "ca.pem" if ca_pem is not None else None,
              "data": data, "meter": board.meter, "profile": board.profile, "state_dir": STATE_DIR}
    header = (f"Node file of board {board.host} (node {board.node_id}) in run {inventory.run_id}, by `testbed provision`.\n"
              f"Unpack this folder into {BOARD_DIR}; paths are relative to this file's folder.")
    (folder / "node.toml").write_text(board_config.board_config_text(values, header))
    (folder / UNIT_NAME).write_text(node_unit(inventory.command, board.meter))
    return folder


def _private_dir(path: Path) -> Path:
    """A folder only its owner can enter (it holds passwords)."""
    path.mkdir(parents=True, exist_ok=True)
    os.chmod(path, 0o700)
    return path
