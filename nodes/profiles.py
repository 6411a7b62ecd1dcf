"""Device profiles: what an emulated board costs in seconds and joules (nodes/profiles.toml).

Each profile gives how much slower than the reference host the board runs our numpy workload, its
idle and one-core-active power, its Wi-Fi throughput and its radio power; profiles.toml documents
the reference host and cites the source of every figure (and says which ones are unconfirmed).
nodes/clock.py turns a profile into costs.

Example::

    >>> p = load_profile("pi-4b")
    >>> p.compute_time_factor, p.wifi_up_bps
    (6.9, 108000000.0)
    >>> "host" in PROFILE_NAMES
    True
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from testbed.errors import UserError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

PROFILES_FILE = Path(__file__).with_name("profiles.toml")

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


_POSITIVE = ("compute_time_factor", "wifi_up_bps", "wifi_down_bps")
_NON_NEGATIVE = ("idle_power_w", "active_power_w", "radio_tx_power_w", "radio_rx_power_w")


@cache
def _profiles() -> dict[str, DeviceProfile]:
    with open(PROFILES_FILE, "rb") as f:
        tables = tomllib.load(f)
    fields = {f.name for f in dataclasses.fields(DeviceProfile)} - {"name"}
    profiles = {}
    for name, table in tables.items():
        if set(table) != fields:
            raise ValueError(f"{PROFILES_FILE}: profile {name!r} must have exactly the keys {sorted(fields)}")
        profile = DeviceProfile(name=name, **{**table, "sources": tuple(table["sources"])})
        bad = [k for k in _POSITIVE if not getattr(profile, k) > 0]
        bad += [k for k in _NON_NEGATIVE if not getattr(profile, k) >= 0]
        if bad:
            raise ValueError(f"{PROFILES_FILE}: profile {name!r}: {', '.join(bad)} out of range")
        profiles[name] = profile
    return profiles


PROFILE_NAMES: tuple[str, ...] = tuple(_profiles())


def load_profile(name: str) -> DeviceProfile:
    """The profile called ``name``.

    Raises:
        UserError: no such profile (the message lists the known names).
    """
    try:
        return _profiles()[name]
    except KeyError:
        raise UserError(f"unknown device profile {name!r}; choose one of {', '.join(PROFILE_NAMES)}") from None
