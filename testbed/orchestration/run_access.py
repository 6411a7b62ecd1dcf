"""Who may speak on an MQTT run's broker, and how their messages are told apart: the users'
passwords of a `testbed acl` credentials file, the topic rules the run's own broker enforces
(testbed.mqtt.acl), and the keys the coordinator shares with each node (testbed.mqtt.auth).
Everything is read and checked before the broker starts: a file refused after it started would
leave it running."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Sequence

from testbed.assembly.config import MqttSection
from testbed.checked.limits import MAX_TEXT_FILE_BYTES
from testbed.errors import ConfigError, UserError
from testbed.mqtt import acl, auth, topics
from testbed.util.oneline import shown_ids
from testbed.util.userfiles import read_text

# The coordinator's one logger, whichever of its modules writes: what users and tests filter on.
log = logging.getLogger("testbed.orchestration.coordinator")


def check_credentials(path: str, node_ids: Sequence[int]) -> None:
    """Every emulated node needs its password in the credentials file (checked before any host
    starts, so the error names the nodes rather than a host that exited)."""
    passwords = read_credentials(path)
    missing = [n for n in node_ids if str(n) not in passwords]
    if missing:
        raise ConfigError("mqtt.credentials", f"{path} has no password for node(s) {shown_ids(missing)} "
                          f"(`testbed acl --run RUN --nodes N` writes one for each of nodes 0..N-1)")


def read_credentials(path: str) -> dict:
    try:
        passwords = json.loads(read_text(Path(path), MAX_TEXT_FILE_BYTES, "file"))
    except (UserError, ValueError) as exc:
        raise ConfigError("mqtt.credentials", f"cannot read {path}: {exc}") from None
    if not isinstance(passwords, dict):
        raise ConfigError("mqtt.credentials", f"{path} is not a credentials file of `testbed acl`")
    return passwords


def broker_access(mqtt: MqttSection, node_ids: Sequence[int]) -> acl.Access | None:
    """The users and topic rules the run's own broker enforces: the run's grants with the passwords
    of ``mqtt.credentials`` (none: anonymous clients, any topic)."""
    if mqtt.credentials is None:
        return None
    passwords = read_credentials(mqtt.credentials)
    bad = next((user for user, pw in passwords.items()
                if not isinstance(pw, str) or not user or ":" in user or "\n" in user), None)
    if bad is not None:  # the broker's password file holds each as `user:hash`, one a line
        raise ConfigError("mqtt.credentials", f"{mqtt.credentials}: user {bad!r} has no usable password entry")
    try:
        grants = acl.run_grants(mqtt.run_id, [str(n) for n in node_ids])
    except ValueError as exc:  # a node id that is a service user's name
        raise ConfigError("mqtt.credentials", str(exc)) from None
    return acl.Access(grants, passwords)


def run_keys(m: MqttSection, run: str, node_ids: Sequence[int]) -> auth.Keys | None:
    """The keys the coordinator shares with each node (testbed.mqtt.auth), None with
    ``mqtt.authenticate = false``. The run's emulated boards: derived from a run key made here (new
    at every session); real boards: mqtt.keys, the coordinator's keys file of `testbed provision`.
    The channel emulator, a client of this process, gets a fresh key either way."""
    if not m.authenticate:
        log.warning("messages are not authenticated (mqtt.authenticate = false): anyone on the broker its ACL "
                    "lets in can act for a node or the coordinator")
        return None
    names = [str(n) for n in node_ids]
    if m.emulated:
        keys = auth.Keys.from_run_key(run, auth.new_key(), names)
    elif m.keys is None:
        raise ConfigError("mqtt.keys", "real boards (mqtt.emulated = false) need the coordinator's keys file of "
                          "`testbed provision` (coordinator/keys.json), or mqtt.authenticate = false for a broker you "
                          "trust alone")
    else:
        keys = auth.load_keys(m.keys, run, "mqtt.keys")
        missing = [n for n in names if not keys.holds(n)]
        if missing:
            raise ConfigError("mqtt.keys", f"{m.keys} has no key for node(s) {shown_ids([int(n) for n in missing])}")
        keys = keys.only(names)
    return keys.with_key(topics.CHANNEL, auth.new_key())


def user_credentials(path: str | None, user: str) -> tuple[str | None, str | None]:
    """(username, password) of ``user`` from a `testbed acl` credentials file, or (None, None)."""
    if path is None:
        return None, None
    passwords = read_credentials(path)
    if user not in passwords:
        raise ConfigError("mqtt.credentials", f"{path} has no password for {user!r}")
    return user, passwords[user]
