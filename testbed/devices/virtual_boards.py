"""The virtual-board registry: boards without hardware that run the firmware and give the bridge a
serial line. A virtual board is one folder of ``firmware_bridge/firmware/boards/``: its
board-support files, ``board.mk`` (its firmware's make rule, target named as the folder) and
``board.toml`` (its registration, read here). Adding a board is adding a folder; the config's
``nodes.mcu_board`` choices and `testbed bridge --virtual` read this registry, and
``firmware_bridge.virtual`` starts a board by its registration.

``board.toml`` keys:

- ``description``: one line, what the board is (the CLI's help);
- ``runner``: how ``firmware_bridge.virtual`` runs its image (``firmware_bridge.virtual.RUNNERS``:
  "pty", a host process behind a pseudo-terminal; "qemu", under ``qemu-system-arm``);
- ``artifact``: the image its make target builds, relative to ``BUILD/<board>/``;
- ``compiler``, ``compiler_env``: the compiler its build needs, and the environment variable
  that names another (the Makefile's own variable);
- ``install``: the Debian packages that hold the compiler;
- ``qemu_machine``: for runner "qemu", QEMU's ``-M`` machine.

Example::

    >>> names()
    ('host', 'mps2-an385')
    >>> get("mps2-an385").runner, get("mps2-an385").qemu_machine
    ('qemu', 'mps2-an385')
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from testbed.devices.datafiles import package_dir, read_toml
from testbed.errors import UserError

#: The folder of the virtual boards' folders.
BOARDS_DIR = package_dir("firmware_bridge") / "firmware" / "boards"
REGISTRATION_FILE = "board.toml"


@dataclass(frozen=True)
class VirtualBoard:
    """One virtual board's registration (its folder's ``board.toml``; the module doc says each key)."""

    name: str
    folder: Path
    description: str
    runner: str
    artifact: str
    compiler: str
    compiler_env: str
    install: str
    qemu_machine: str | None = None


_REQUIRED = {f.name for f in dataclasses.fields(VirtualBoard)} - {"name", "folder", "qemu_machine"}


def _registration(folder: Path) -> VirtualBoard:
    path = folder / REGISTRATION_FILE
    table = read_toml(path)
    missing, unknown = _REQUIRED - set(table), set(table) - _REQUIRED - {"qemu_machine"}
    if missing or unknown:
        raise ValueError(f"{path}: needs the keys {sorted(_REQUIRED)} (and qemu_machine for runner 'qemu'); "
                         f"missing {sorted(missing)}, unknown {sorted(unknown)}")
    if not all(isinstance(value, str) and value for value in table.values()):
        raise ValueError(f"{path}: every value must be a non-empty string")
    return VirtualBoard(name=folder.name, folder=folder, **table)


@cache
def registrations() -> dict[str, VirtualBoard]:
    """Every virtual board (each folder with a ``board.toml``), by name, sorted."""
    return {folder.name: _registration(folder)
            for folder in sorted(BOARDS_DIR.iterdir()) if (folder / REGISTRATION_FILE).is_file()}


def names() -> tuple[str, ...]:
    return tuple(registrations())


def get(name: str) -> VirtualBoard:
    """The virtual board ``name``; UserError naming the known ones otherwise."""
    try:
        return registrations()[name]
    except KeyError:
        raise UserError(f"unknown virtual board {name!r}; choose one of {', '.join(names())}") from None
