"""Checks of what a user names on the command line or in an experiment file that would otherwise
surface as a traceback deep inside a command: an experiment path that is a directory or a binary file, an output directory that cannot be made,
a run id that cannot go into an MQTT topic. Each raises UserError (or ConfigError naming the key)
with one line, so `testbed` exits 2."""

from __future__ import annotations

import os
from pathlib import Path

from testbed.checked.limits import MAX_TEXT_FILE_BYTES
from testbed.errors import ConfigError, UserError
from testbed.util import userfiles


def experiment_file(path: Path) -> Path:
    """`path` if it is a readable UTF-8 text file; else ConfigError naming it.

    load_config reads the file itself; this only turns what it would raise as OSError or
    UnicodeDecodeError (a directory, /bin/ls, no permission) into one line. A missing file is left
    to load_config, which says so already.
    """
    if not path.exists():
        return path
    if path.is_dir():
        raise ConfigError(str(path), "is a directory, not an experiment file (TOML)")
    try:  # a regular file of a bounded size: /dev/zero or a FIFO would be read forever
        data = userfiles.read_bytes(path, MAX_TEXT_FILE_BYTES, "experiment file")
    except UserError as exc:
        raise ConfigError(str(path), str(exc).removeprefix(f"experiment file {path}: ")) from None
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(str(path), f"is not a text (TOML) file: byte {exc.start} is not UTF-8") from None
    return path


def output_dir(path: Path, what: str) -> Path:
    """Create directory `path` (and its parents) unless it exists, and check that it is writable.

    Args:
        path: the directory.
        what: how the user named it (``--out``, ``output.dir``), for the message.

    Raises:
        UserError: it cannot be made (under /proc, under a regular file, no permission) or is not
            writable.
    """
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise UserError(f"{what} {path}: exists and is not a directory") from None
    except OSError as exc:
        raise UserError(f"{what} {path}: cannot create the directory ({exc.strerror or exc})") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise UserError(f"{what} {path}: the directory is not writable")
    return path


def run_id(value: object, key: str = "mqtt.run_id") -> str:
    """`value` if it is a valid run id (testbed.mqtt.wire.ID_PATTERN: it goes into MQTT topics, ACL
    files and file names), in any mode; else ConfigError naming `key`."""
    from testbed.mqtt import wire

    try:
        return wire.check_id(value, key)
    except wire.WireError:
        raise ConfigError(key, f"must match {wire.ID_PATTERN.pattern} (letters, digits, '_', '.', '-'; "
                               f"no '/', '+', '#' or spaces: it goes into MQTT topics), got {value!r}") from None
