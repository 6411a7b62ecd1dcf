"""The meter registry: every module of :mod:`nodes.meters` that defines ``REGISTRATION`` is a meter;
adding one is adding a module, here or in an installed plugin (docs/extending.md). The node file's
``meter`` choices, `testbed node --meter`, `testbed calibrate --meter` and provisioning read this
registry, and :func:`make_meter` builds a meter from it.

Example::

    >>> kinds()[:5]  # the built-in ones; an installed plugin's may follow
    ('auto', 'rapl', 'ina219', 'ina260', 'model')
    >>> meter = make_meter("model", "pi-zero-2w")
    >>> with meter.measure() as span:
    ...     _ = sum(i * i for i in range(10_000))
    >>> span.result.measured, span.result.source
    (False, 'model:pi-zero-2w')
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from nodes.meters.base import Meter, MeterUnavailable
from testbed.devices.profiles import DeviceProfile, load_profile
from testbed.errors import UserError
from testbed.util.registrations import GROUPS, PluginError, plugin_of, registered_in

log = logging.getLogger(__name__)

#: The choice that picks a meter: the fallback for an emulated board, else the first of the
#: probed meters that answers here (:attr:`Registration.auto_rank`), else the fallback.
AUTO = "auto"
#: Default I²C address of both INA219 and INA260 (A0 = A1 = GND) and the Raspberry Pi's I²C bus.
DEFAULT_I2C_ADDRESS = 0x40
DEFAULT_I2C_BUS = 1


@dataclass(frozen=True)
class MeterOptions:
    """What a meter is built with (each meter takes the options it needs).

    Attributes:
        profile: the node's device profile (the model meter's figures).
        address, bus, interval_s: an I²C meter's address, bus (number or smbus2-like object) and
            sampling interval in s.
        shunt_ohm, max_current_a: an INA219's shunt and largest expected current.
        powercap_root: where to look for RAPL (None: /sys/class/powercap).
    """

    profile: DeviceProfile
    address: int = DEFAULT_I2C_ADDRESS
    bus: Any = DEFAULT_I2C_BUS
    interval_s: float = 0.002
    shunt_ohm: float = 0.1
    max_current_a: float = 3.2
    powercap_root: Path | None = None


@dataclass(frozen=True)
class Registration:
    """One meter.

    Attributes:
        name: its ``meter`` kind (node file, `testbed node --meter`, an inventory's boards).
        build: MeterOptions → the meter; raises MeterUnavailable when it cannot work here.
        measures_host: it measures this machine (hardware), so it is refused for an emulated
            board's profile (it would not measure that board).
        listed_at: its place among the listed choices (help, errors), after "auto".
        auto_rank: where "auto" probes it, lowest first; None: "auto" never picks it by probing.
        fallback: the meter "auto" falls back to and picks for an emulated board (exactly one).
        unix_groups: the groups a node's service needs to read it (provisioning's unit file).
    """

    name: str
    build: Callable[[MeterOptions], Meter]
    measures_host: bool = True
    listed_at: int = 0
    auto_rank: int | None = None
    fallback: bool = False
    unix_groups: tuple[str, ...] = ()


@functools.cache
def registrations() -> dict[str, Registration]:
    """Every meter of nodes.meters and of the installed plugins (testbed.meters), by name, in listed order (modules imported once, on first use)."""
    import nodes.meters as package

    found = registered_in(package, Registration, "meter", group=GROUPS["meter"], order=lambda r: (r.listed_at, r.name), reserved=(AUTO,))
    fallbacks = [name for name, reg in found.items() if reg.fallback]
    if len(fallbacks) != 1:
        claims = [name for name in fallbacks if plugin_of("meter", name)]
        if claims:  # a built-in meter is the fallback: a plugin's claim to it is the plugin's error
            taken = ", ".join(repr(name) for name in fallbacks if name not in claims)
            raise PluginError(f"{plugin_of('meter', claims[0])}: meter {claims[0]!r} claims to be the fallback, "
                              f"which {taken} is")
        raise RuntimeError(f"exactly one meter must be the fallback, got {fallbacks}")
    return found


def names() -> tuple[str, ...]:
    return tuple(registrations())


def kinds() -> tuple[str, ...]:
    """Every ``meter`` choice: "auto", then each meter."""
    return (AUTO, *names())


def get(kind: str) -> Registration:
    """The meter ``kind``; UserError naming the choices otherwise."""
    try:
        return registrations()[kind]
    except KeyError:
        raise UserError(f"unknown meter {kind!r}; choose one of {', '.join(kinds())}") from None


def check_meter_fits_profile(kind: str, profile: str | DeviceProfile) -> None:
    """Raise UserError when meter ``kind`` is a hardware meter and ``profile`` an emulated board:
    the meter would measure this machine, not the board the profile describes.

    >>> check_meter_fits_profile("ina260", "host"); check_meter_fits_profile("model", "pi-4b")
    >>> check_meter_fits_profile("ina260", "pi-4b")
    Traceback (most recent call last):
    ...
    testbed.errors.UserError: meter 'ina260' measures this machine, but profile 'pi-4b' is an emulated board: use meter 'model', or profile 'host' on the board itself
    """
    if isinstance(profile, str):
        profile = load_profile(profile)
    if kind != AUTO and get(kind).measures_host and profile.emulated:
        raise UserError(f"meter {kind!r} measures this machine, but profile {profile.name!r} is an emulated "
                        f"board: use meter 'model', or profile 'host' on the board itself")


def make_meter(kind: str = AUTO, profile: str | DeviceProfile = "host", *,
               address: int = DEFAULT_I2C_ADDRESS, bus: Any = DEFAULT_I2C_BUS, interval_s: float = 0.002,
               shunt_ohm: float = 0.1, max_current_a: float = 3.2,
               powercap_root: Path | None = None) -> Meter:
    """The meter of ``kind`` for a node with device ``profile``.

    Args:
        kind: "auto" or a registered meter (:func:`kinds`). "auto": for an emulated board profile
            the fallback (the model: a meter here measures this machine, not the board); for
            "host" the probed meters in their ``auto_rank`` order (an INA260, an INA219 answering
            at ``address`` on ``bus``, RAPL if readable), else the fallback.
        profile: a profile name or DeviceProfile (the model meter's figures).
        address: an I²C meter's address (:class:`MeterOptions`, as the five below).
        bus: its bus (number or smbus2-like object).
        interval_s: its sampling interval in s.
        shunt_ohm: an INA219's shunt.
        max_current_a: an INA219's largest expected current.
        powercap_root: where to look for RAPL (None: /sys/class/powercap).

    Raises:
        UserError: an unknown kind; a hardware meter asked for an emulated board; or an explicitly
            requested meter that is not available here (the message says why).
    """
    if isinstance(profile, str):
        profile = load_profile(profile)
    options = MeterOptions(profile, address, bus, interval_s, shunt_ohm, max_current_a, powercap_root)
    if kind == AUTO:
        return _auto(options)
    reg = get(kind)
    check_meter_fits_profile(kind, profile)
    try:
        return reg.build(options)
    except MeterUnavailable as exc:
        raise UserError(f"meter {kind!r} is not available: {exc}; on a machine without it use meter 'auto' (the "
                        "best this machine has) or 'model' (the profile's figures)") from None


def _auto(options: MeterOptions) -> Meter:
    fallback = next(reg for reg in registrations().values() if reg.fallback)
    if options.profile.emulated:
        return fallback.build(options)
    probed = sorted((reg for reg in registrations().values() if reg.auto_rank is not None), key=lambda r: r.auto_rank)
    for reg in probed:
        try:
            return reg.build(options)
        except MeterUnavailable as exc:
            log.debug("meter %s not available: %s", reg.name, exc)
    return fallback.build(options)
