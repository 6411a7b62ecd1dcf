"""The profile registry: device profiles (``nodes/profiles.toml``: what an emulated board costs in
seconds and joules) and microcontroller profiles (``firmware_bridge/boards.toml``: what a bridged
board's step costs). Adding a profile is adding a table to its file; the config's choices
(``nodes.profile``, ``nodes.mcu_profile``), the node file's checks and every lookup read this
registry.

A device profile gives how much slower than the reference host the board runs our numpy workload,
its idle and one-core-active power, its Wi-Fi throughput and its radio power; profiles.toml
documents the reference host and cites the source of every figure (and says which ones are
unconfirmed). nodes/meters/clock.py turns a profile into costs; firmware_bridge/costs.py a microcontroller
profile.

Example::

    >>> p = load_profile("pi-4b")
    >>> p.compute_time_factor, p.wifi_up_bps
    (6.9, 108000000.0)
    >>> "host" in PROFILE_NAMES
    True
    >>> m = load_mcu_profile("nrf52840")
    >>> m.cpu_hz, m.device_profile().wifi_up_bps
    (64000000.0, 1300000.0)
    >>> sorted(MCU_PROFILE_NAMES)
    ['esp32-s3', 'nrf52840', 'rp2040', 'stm32l4']
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from testbed.devices.datafiles import package_dir, read_toml
from testbed.errors import UserError

PROFILES_FILE = package_dir("nodes") / "profiles.toml"
BOARDS_FILE = package_dir("firmware_bridge") / "boards.toml"

#: The profile of this machine as it is: no scaling, costs measured where a meter exists.
HOST = "host"


@dataclass(frozen=True)
class DeviceProfile:
    """One board's cost figures (SI units).

    Attributes:
        name: profile name ("pi-zero-2w", ..., or "host").
        description: the board and its CPU and radio.
        compute_time_factor: board seconds per host CPU-second for our numpy workload.
        idle_power_w: whole-board power when idle, W.
        active_power_w: whole-board power while one core runs the step, W.
        wifi_up_bps, wifi_down_bps: application-level throughput, bit/s.
        radio_tx_power_w, radio_rx_power_w: board power added while the radio transmits /
            receives, on top of idle_power_w, W.
        sources: where each figure comes from (see profiles.toml for the full references).
    """

    name: str
    description: str
    compute_time_factor: float
    idle_power_w: float
    active_power_w: float
    wifi_up_bps: float
    wifi_down_bps: float
    radio_tx_power_w: float
    radio_rx_power_w: float
    sources: tuple[str, ...]

    @property
    def emulated(self) -> bool:
        """True for a board emulated on this machine; False for the host itself."""
        return self.name != HOST


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
        """The same board as nodes/ models a link (nodes.meters.clock.comm_cost reads it)."""
        return DeviceProfile(self.name, self.description, 1.0, self.idle_power_w, self.active_power_w,
                             self.link_up_bps, self.link_down_bps, self.radio_tx_power_w, self.radio_rx_power_w,
                             self.sources)


_DEVICE_POSITIVE = ("compute_time_factor", "wifi_up_bps", "wifi_down_bps")
_DEVICE_NON_NEGATIVE = ("idle_power_w", "active_power_w", "radio_tx_power_w", "radio_rx_power_w")
_MCU_POSITIVE = ("cpu_hz", "cycles_per_flop", "link_up_bps", "link_down_bps")


def _read(path: Path, kind: type, positive: tuple[str, ...], non_negative: tuple[str, ...]) -> dict[str, Any]:
    """Every table of ``path`` as a ``kind``, in the file's order; ValueError naming the table and
    the figures when one has other keys than ``kind``'s fields or a figure out of range."""
    fields = {f.name for f in dataclasses.fields(kind)} - {"name"}
    profiles = {}
    for name, table in read_toml(path).items():
        if set(table) != fields:
            raise ValueError(f"{path}: profile {name!r} must have exactly the keys {sorted(fields)}")
        profile = kind(name=name, **{**table, "sources": tuple(table["sources"])})
        bad = [k for k in positive if not getattr(profile, k) > 0]
        bad += [k for k in non_negative if not getattr(profile, k) >= 0]
        if bad:
            raise ValueError(f"{path}: profile {name!r}: {', '.join(bad)} out of range")
        profiles[name] = profile
    return profiles


@cache
def _device_profiles() -> dict[str, DeviceProfile]:
    return _read(PROFILES_FILE, DeviceProfile, _DEVICE_POSITIVE, _DEVICE_NON_NEGATIVE)


@cache
def _mcu_profiles() -> dict[str, McuProfile]:
    return _read(BOARDS_FILE, McuProfile, _MCU_POSITIVE, ())


#: The device profiles' names, in the file's order (the config's ``nodes.profile`` choices).
PROFILE_NAMES: tuple[str, ...] = tuple(_device_profiles())
#: The microcontroller profiles' names, in the file's order (``nodes.mcu_profile``'s choices).
MCU_PROFILE_NAMES: tuple[str, ...] = tuple(_mcu_profiles())


def load_profile(name: str) -> DeviceProfile:
    """The device profile called ``name``.

    Raises:
        UserError: no such profile (the message lists the known names).
    """
    try:
        return _device_profiles()[name]
    except KeyError:
        raise UserError(f"unknown device profile {name!r}; choose one of {', '.join(PROFILE_NAMES)}") from None


def load_mcu_profile(name: str) -> McuProfile:
    """The microcontroller profile ``name``; UserError naming the known ones otherwise."""
    try:
        return _mcu_profiles()[name]
    except KeyError:
        raise UserError(f"unknown board profile {name!r}; choose one of {', '.join(MCU_PROFILE_NAMES)}") from None
