"""The profile registry: device profiles (``nodes/profiles.toml``: what an emulated board costs in
seconds and joules) and microcontroller profiles (``firmware_bridge/boards.toml``: what a bridged
board's step costs). Adding a profile is adding a table to its file, or, from a project of one's
own, a module whose ``REGISTRATION`` is a :class:`DeviceProfile` or :class:`McuProfile` (or a
tuple of them) named under the entry-point group ``testbed.board_profiles`` (docs/extending.md).
The config's choices (``nodes.profile``, ``nodes.mcu_profile``), the node file's checks and every
lookup read this registry.

A device profile gives how much slower than the reference host the board runs our numpy workload,
its idle and one-core-active power, its Wi-Fi throughput and its radio power; profiles.toml
documents the reference host and cites the source of every figure (and says which ones are
unconfirmed). nodes/meters/clock.py turns a profile into costs; firmware_bridge/costs.py a microcontroller
profile.

Example::

    >>> p = load_profile("pi-4b")
    >>> p.compute_time_factor, p.wifi_up_bps
    (6.9, 108000000.0)
    >>> "host" in profile_names()
    True
    >>> m = load_mcu_profile("nrf52840")
    >>> m.cpu_hz, m.device_profile().wifi_up_bps
    (64000000.0, 1300000.0)
    >>> {'esp32-s3', 'nrf52840', 'rp2040', 'stm32l4'} <= set(mcu_profile_names())
    True
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from testbed.devices.datafiles import package_dir, read_toml
from testbed.errors import UserError
from testbed.util.registrations import GROUPS, PluginError, plugin_of, registered_in

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
        if bad := _out_of_range(profile, positive, non_negative):
            raise ValueError(f"{path}: profile {name!r}: {', '.join(bad)} out of range")
        profiles[name] = profile
    return profiles


def _out_of_range(profile: Any, positive: tuple[str, ...], non_negative: tuple[str, ...]) -> list[str]:
    """The figures of ``profile`` outside their range (each of ``positive`` > 0, ``non_negative`` >= 0)."""
    return [k for k in positive if not getattr(profile, k) > 0] + [k for k in non_negative if not getattr(profile, k) >= 0]


def _in_order(names: list[str]) -> Any:
    """The order profiles are listed in: the file's, then the plugins' by name."""
    place = {name: i for i, name in enumerate(names)}
    return lambda p: (place.get(p.name, len(place)), p.name)


@cache
def _device_profiles() -> dict[str, DeviceProfile]:
    builtin = _read(PROFILES_FILE, DeviceProfile, _DEVICE_POSITIVE, _DEVICE_NON_NEGATIVE)
    found = registered_in(None, DeviceProfile, "device profile", group=GROUPS["board profile"], builtin=builtin,
                          order=_in_order(list(builtin)), others=(McuProfile,))
    _check_plugins(found, builtin, _DEVICE_POSITIVE, _DEVICE_NON_NEGATIVE)
    return found


@cache
def _mcu_profiles() -> dict[str, McuProfile]:
    builtin = _read(BOARDS_FILE, McuProfile, _MCU_POSITIVE, ())
    found = registered_in(None, McuProfile, "microcontroller profile", group=GROUPS["board profile"], builtin=builtin,
                          order=_in_order(list(builtin)), others=(DeviceProfile,))
    _check_plugins(found, builtin, _MCU_POSITIVE, ())
    return found


def _check_plugins(found: dict[str, Any], builtin: dict[str, Any], positive: tuple[str, ...],
                   non_negative: tuple[str, ...]) -> None:
    """PluginError naming a plugin's profile with figures out of range (the files' are checked as read)."""
    for name, profile in found.items():
        if name not in builtin and (bad := _out_of_range(profile, positive, non_negative)):
            what = "device profile" if isinstance(profile, DeviceProfile) else "microcontroller profile"
            raise PluginError(f"{plugin_of(what, name)}: profile {name!r}: {', '.join(bad)} out of range")


def profile_names() -> tuple[str, ...]:
    """The device profiles' names: the file's in its order, then the plugins' (``nodes.profile``'s choices)."""
    return tuple(_device_profiles())


def mcu_profile_names() -> tuple[str, ...]:
    """The microcontroller profiles' names, the file's then the plugins' (``nodes.mcu_profile``'s choices)."""
    return tuple(_mcu_profiles())


def __getattr__(name: str) -> tuple[str, ...]:
    # PROFILE_NAMES and MCU_PROFILE_NAMES: the names as registered when asked, never frozen at import.
    if name == "PROFILE_NAMES":
        return profile_names()
    if name == "MCU_PROFILE_NAMES":
        return mcu_profile_names()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def load_profile(name: str) -> DeviceProfile:
    """The device profile called ``name``.

    Raises:
        UserError: no such profile (the message lists the known names).
    """
    try:
        return _device_profiles()[name]
    except KeyError:
        raise UserError(f"unknown device profile {name!r}; choose one of {', '.join(profile_names())}") from None


def load_mcu_profile(name: str) -> McuProfile:
    """The microcontroller profile ``name``; UserError naming the known ones otherwise."""
    try:
        return _mcu_profiles()[name]
    except KeyError:
        raise UserError(f"unknown board profile {name!r}; choose one of {', '.join(mcu_profile_names())}") from None
