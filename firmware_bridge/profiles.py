"""Microcontroller board profiles (firmware_bridge/boards.toml, each figure with its source).

Example::

    >>> p = load_mcu_profile("nrf52840")
    >>> p.cpu_hz, p.device_profile().wifi_up_bps
    (64000000.0, 1300000.0)
    >>> sorted(MCU_PROFILE_NAMES)
    ['esp32-s3', 'nrf52840', 'rp2040', 'stm32l4']
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from nodes.profiles import DeviceProfile
from testbed.errors import UserError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

BOARDS_FILE = Path(__file__).with_name("boards.toml")


@dataclass(frozen=True)
class McuProfile:
    """One microcontroller board (SI units; boards.toml explains every field)."""

    name: str
    description: str
    cpu_hz: float
    cycles_per_flop: float
    active_power_w: float
    idle_power_w: float
    link_up_bps: float
    link_down_bps: float
    radio_tx_power_w: float
    radio_rx_power_w: float
    ram_bytes: int
    flash_bytes: int
    sources: tuple[str, ...]

    def device_profile(self) -> DeviceProfile:
        """The same board as nodes/ models a link (nodes.clock.comm_cost reads it)."""
        return DeviceProfile(self.name, self.description, 1.0, self.idle_power_w, self.active_power_w,
                             self.link_up_bps, self.link_down_bps, self.radio_tx_power_w, self.radio_rx_power_w,
                             self.sources)


@cache
def _profiles() -> dict[str, McuProfile]:
    with open(BOARDS_FILE, "rb") as f:
        tables = tomllib.load(f)
    fields = {f.name for f in dataclasses.fields(McuProfile)} - {"name"}
    out = {}
    for name, table in tables.items():
        if set(table) != fields:
            raise ValueError(f"{BOARDS_FILE}: profile {name!r} must have exactly the keys {sorted(fields)}")
        profile = McuProfile(name=name, **{**table, "sources": tuple(table["sources"])})
        if min(profile.cpu_hz, profile.cycles_per_flop, profile.link_up_bps, profile.link_down_bps) <= 0:
            raise ValueError(f"{BOARDS_FILE}: profile {name!r}: rates must be positive")
        out[name] = profile
    return out


MCU_PROFILE_NAMES: tuple[str, ...] = tuple(_profiles())


def load_mcu_profile(name: str) -> McuProfile:
    """The board profile ``name``; UserError naming the known ones otherwise."""
    try:
        return _profiles()[name]
    except KeyError:
        raise UserError(f"unknown board profile {name!r}; choose one of {', '.join(MCU_PROFILE_NAMES)}") from None
