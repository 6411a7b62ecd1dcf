"""A board's node file (``testbed node --config /etc/testbed/node.toml``): how one board joins runs.

The file's keys are the long options of `testbed node` with ``_`` for ``-`` (``node_id`` for
``--node-id``); an option given on the command line takes precedence over the file, and the file
over the defaults in :data:`DEFAULTS`. Relative paths are resolved against the file's folder, so a
bundle of `testbed provision` can be used where it is unpacked. Every value is checked before
anything connects: a bad one is a one-line :class:`~testbed.errors.ConfigError` naming the file
and the key.

Example::

    >>> values = parse_board_config('broker = "mqtt://broker.lan:1883"\\nnode_id = 3\\nmeter = "model"\\n', "node.toml")
    >>> values["node_id"], values["meter"]
    (3, 'model')
    >>> parse_board_config('node_id = -1\\n', "node.toml")
    Traceback (most recent call last):
    ...
    testbed.errors.ConfigError: config error: node.toml: node_id: must be an integer >= 0, got -1
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable

from nodes.meters import registry as meters
from testbed.checked.limits import MAX_CHUNK_BYTES, MAX_INT, MAX_TEXT_FILE_BYTES, MIN_CHUNK_BYTES
from testbed.devices.profiles import profile_names
from testbed.errors import ConfigError, UserError
from testbed.mqtt import wire
from testbed.mqtt.broker import parse_broker_url
from testbed.util.userfiles import read_text

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

#: MQTT versions `testbed node --protocol` takes.
PROTOCOLS = ("auto", "5", "3.1.1")
#: Keys holding paths: resolved against the node file's folder.
PATH_KEYS = ("credentials", "keys", "tls_ca", "data", "state_dir")

#: What a key takes when neither the command line nor the file gives it (None: nothing).
DEFAULTS: dict[str, Any] = {
    "broker": None, "run": "testbed", "node_id": None, "credentials": None, "keys": None, "tls_ca": None, "data": None,
    "meter": "auto", "profile": "host", "state_dir": str(Path.home() / ".cache" / "testbed" / "node"),
    "protocol": "auto", "pacing": False, "max_chunk_bytes": 256 * 1024, "verbose": False,
    "reproducible": False,
}


def _text(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"must be a non-empty string, got {value!r}")
    return value


def _one_of(choices: tuple[str, ...] | Callable[[], tuple[str, ...]]) -> Callable[[Any], str]:
    """A check that the value is one of ``choices`` (or of what the callable gives when the check
    runs: a registry's names, which a registration may add to)."""
    def check(value: Any) -> str:
        known = choices() if callable(choices) else choices
        if value not in known:
            raise ValueError(f"must be one of {', '.join(known)}, got {value!r}")
        return value
    return check


def _int_in(low: int, high: int) -> Callable[[Any], int]:
    """An integer in [low, high] (the ranges of testbed.checked.limits, as on the command line)."""
    def check(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"must be an integer >= {low}, got {value!r:.40}")
        if value > high:
            raise ValueError(f"must be an integer <= {high}, got {value!r:.40}")
        return value
    return check


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"must be true or false, got {value!r}")
    return value


def _broker(value: Any) -> str:
    try:
        parse_broker_url(_text(value))
    except UserError as exc:
        raise ValueError(str(exc)) from None
    return value


def _run(value: Any) -> str:
    try:
        return wire.check_id(value, "the run id")
    except wire.WireError as exc:
        raise ValueError(exc.reason) from None


CHECKS: dict[str, Callable[[Any], Any]] = {
    "broker": _broker, "run": _run, "node_id": _int_in(0, MAX_INT), "credentials": _text, "keys": _text,
    "tls_ca": _text, "data": _text, "meter": _one_of(meters.kinds), "profile": _one_of(profile_names), "state_dir": _text,
    "protocol": _one_of(PROTOCOLS), "pacing": _flag, "max_chunk_bytes": _int_in(MIN_CHUNK_BYTES, MAX_CHUNK_BYTES), "verbose": _flag,
    "reproducible": _flag,
}
assert set(CHECKS) == set(DEFAULTS)


def parse_board_config(text: str, source: str, base_dir: Path | None = None) -> dict[str, Any]:
    """The checked values of a node file's text (only the keys it has).

    Args:
        text: the TOML text.
        source: how to name the file in errors.
        base_dir: the folder relative paths are resolved against (None: left as they are).

    Raises:
        ConfigError: not TOML, an unknown key, or a bad value (naming ``source`` and the key).
    """
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(source, f"not valid TOML: {exc}") from None
    values: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in CHECKS:
            raise ConfigError(f"{source}: {key}", f"unknown key; a node file takes {', '.join(CHECKS)}")
        try:
            values[key] = CHECKS[key](value)
        except ValueError as exc:
            raise ConfigError(f"{source}: {key}", str(exc)) from None
        if key in PATH_KEYS and base_dir is not None and not Path(value).is_absolute():
            values[key] = str(base_dir / value)
    return values


def load_board_config(path: Path) -> dict[str, Any]:
    """The checked values of the node file at ``path``; relative paths resolved against its folder."""
    if not Path(path).exists():
        raise ConfigError(str(path), "node file not found")
    try:
        text = read_text(Path(path), MAX_TEXT_FILE_BYTES, "node file")
    except UserError as exc:
        raise ConfigError(str(path), f"cannot be read: {str(exc).removeprefix(f'node file {path}: ')}") from None
    return parse_board_config(text, str(path), Path(path).resolve().parent)


def resolve(given: dict[str, Any], file_values: dict[str, Any]) -> dict[str, Any]:
    """Every key's value: the command line's (``given``, None where an option was not given), else
    the file's, else :data:`DEFAULTS`."""
    return {key: given[key] if given.get(key) is not None else file_values.get(key, default)
            for key, default in DEFAULTS.items()}


def board_config_text(values: dict[str, Any], header: str = "") -> str:
    """A node file holding ``values`` (checked as :func:`parse_board_config` would; None left out),
    in the order of :data:`DEFAULTS`, after the comment lines of ``header``."""
    from testbed.assembly.config import toml_value

    lines = [f"# {line}".rstrip() for line in header.splitlines()]
    for key in DEFAULTS:
        value = values.get(key)
        if value is None:
            continue
        CHECKS[key](value)
        lines.append(f"{key} = {toml_value(value)}")
    unknown = set(values) - set(DEFAULTS)
    if unknown:
        raise ValueError(f"not node file keys: {', '.join(sorted(unknown))}")
    return "\n".join(lines) + "\n"

