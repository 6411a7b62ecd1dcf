"""Meters: the seconds and joules of an interval, measured on a real board or modelled.

Every meter reports a :class:`Measurement` whose ``seconds`` are the process's CPU time over the
interval (``time.process_time``: all threads of this process, so an MQTT client's network thread
counts) and whose ``energy_j`` comes from

- ``RaplMeter``: Linux powercap RAPL package counters (x86), measured. Package energy covers the
  whole CPU package, so other processes' work counts too;
- ``Ina219Meter`` / ``Ina260Meter``: a TI current/power monitor on I²C at the board's supply
  (needs the optional ``smbus2`` package), measured: bus voltage × current sampled by a background
  thread and integrated (trapezoid rule) over the interval's wall time;
- ``ModelMeter``: the device profile's cost model (nodes/clock.py), modelled. For an emulated
  board its ``seconds`` are board seconds (CPU seconds × compute_time_factor).

Use: ``with meter.measure() as span: <the step>`` then ``span.result``. ``make_meter`` picks a meter.

Example::

    >>> meter = make_meter("model", "pi-zero-2w")
    >>> with meter.measure() as span:
    ...     _ = sum(i * i for i in range(10_000))
    >>> span.result.measured, span.result.source
    (False, 'model:pi-zero-2w')
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from nodes.clock import compute_cost
from testbed.devices.profiles import DeviceProfile, load_profile
from testbed.errors import UserError

log = logging.getLogger(__name__)

#: Where Linux exposes RAPL (tests point it at a fake directory).
POWERCAP_ROOT = Path("/sys/class/powercap")
#: Default I²C address of both INA219 and INA260 (A0 = A1 = GND) and the Raspberry Pi's I²C bus.
DEFAULT_I2C_ADDRESS = 0x40
DEFAULT_I2C_BUS = 1
METER_KINDS = ("auto", "rapl", "ina219", "ina260", "model")


@dataclass(frozen=True)
class Measurement:
    """The cost of one interval.

    Attributes:
        seconds: CPU seconds of this process (board seconds for a modelled emulated board).
        energy_j: joules over the interval.
        measured: True when a meter gave the joules, False when a model did.
        source: which meter, e.g. "rapl:package-0", "ina260@0x40", "model:pi-4b".
    """

    seconds: float
    energy_j: float
    measured: bool
    source: str


class MeterUnavailable(Exception):
    """This meter cannot work here; the message says why."""


class Span:
    """One measured interval; ``result`` is set when the ``with`` block ends."""

    def __init__(self, meter: Meter):
        self._meter = meter
        self.result: Measurement | None = None

    def __enter__(self) -> Span:
        self._state = self._meter._begin()
        self._cpu0 = time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        cpu_s = time.process_time() - self._cpu0
        self.result = self._meter._end(self._state, cpu_s)


class Meter:
    """Base class: ``measure()`` opens a Span; subclasses read energy in ``_begin``/``_end``."""

    kind = ""
    measured = True

    @property
    def source(self) -> str:
        return self.kind

    def measure(self) -> Span:
        """A context manager measuring its block: ``with meter.measure() as s: ...; s.result``."""
        return Span(self)

    def close(self) -> None:
        """Release the meter's device, if any."""

    def _begin(self) -> Any:
        return None

    def _end(self, state: Any, cpu_s: float) -> Measurement:
        raise NotImplementedError


class ModelMeter(Meter):
    """Energy (and board seconds) from the device profile: no hardware needed."""

    kind = "model"
    measured = False

    def __init__(self, profile: DeviceProfile):
        self.profile = profile

    @property
    def source(self) -> str:
        return f"model:{self.profile.name}"

    def _end(self, state: None, cpu_s: float) -> Measurement:
        board_s, energy_j = compute_cost(cpu_s, self.profile)
        return Measurement(board_s, energy_j, False, self.source)


class RaplMeter(Meter):
    """Linux powercap RAPL: the energy counters of every CPU package, in µJ.

    Reads ``{root}/intel-rapl:N/energy_uj`` of each top-level package zone (sub-zones such as
    ``intel-rapl:0:0`` are parts of their package and would count twice). A counter wraps to 0
    after ``max_energy_range_uj``; one wrap per interval is corrected, so intervals must be shorter
    than a wrap period (range / power: typically tens of minutes). Since Linux 5.10 ``energy_uj``
    is readable only by root (CVE-2020-8694 mitigation), which makes the meter unavailable.

    Raises:
        MeterUnavailable: no package zone, or its counter is not readable.
    """

    kind = "rapl"

    def __init__(self, root: Path | None = None):
        root = Path(root) if root is not None else POWERCAP_ROOT
        zones = sorted(p for p in root.glob("intel-rapl:*") if p.name.count(":") == 1)
        if not zones:
            raise MeterUnavailable(f"no RAPL package zone under {root}")
        self._zones = []
        for zone in zones:
            try:
                max_uj = int((zone / "max_energy_range_uj").read_text())
                int((zone / "energy_uj").read_text())
            except PermissionError:
                raise MeterUnavailable(f"{zone / 'energy_uj'} is readable only by root") from None
            except (OSError, ValueError) as exc:
                raise MeterUnavailable(f"cannot read {zone}: {exc}") from None
            name = (zone / "name").read_text().strip() if (zone / "name").exists() else zone.name
            self._zones.append((zone / "energy_uj", max_uj, name))

    @property
    def source(self) -> str:
        return "rapl:" + ",".join(name for _, _, name in self._zones)

    def _read(self) -> list[int]:
        return [int(path.read_text()) for path, _, _ in self._zones]

    def _begin(self) -> list[int]:
        return self._read()

    def _end(self, start: list[int], cpu_s: float) -> Measurement:
        total_uj = 0
        for (_, max_uj, _), before, after in zip(self._zones, start, self._read()):
            total_uj += after - before if after >= before else after + max_uj - before
        return Measurement(cpu_s, total_uj * 1e-6, True, self.source)


class _InaMeter(Meter):
    """Common part of the INA219/INA260 meters: open the bus, sample power in a thread, integrate.

    Args:
        address: 7-bit I²C address (0x40 .. 0x4F by the A0/A1 straps).
        bus: an I²C bus number (opened with smbus2.SMBus) or an object with smbus2's
            ``read_i2c_block_data(addr, reg, n)`` and ``write_i2c_block_data(addr, reg, data)``.
        interval_s: sampling interval of the background thread, s.

    Registers are 16-bit big-endian (MSB first), hence block reads of 2 bytes rather than SMBus
    word reads (which are little-endian).
    """

    def __init__(self, address: int = DEFAULT_I2C_ADDRESS, bus: Any = DEFAULT_I2C_BUS, interval_s: float = 0.002):
        self.address = address
        self.interval_s = interval_s
        self._owns_bus = isinstance(bus, int)
        self._bus = _open_bus(bus) if self._owns_bus else bus
        self._lock = threading.Lock()
        try:
            self._setup()
        except OSError as exc:
            self.close()
            raise MeterUnavailable(f"no answer from an I²C device at {address:#04x}: {exc}") from None
        except MeterUnavailable:
            self.close()
            raise

    @property
    def source(self) -> str:
        return f"{self.kind}@{self.address:#04x}"

    def close(self) -> None:
        if self._owns_bus and self._bus is not None:
            self._bus.close()
            self._bus = None

    def _read_register(self, register: int) -> int:
        with self._lock:
            msb, lsb = self._bus.read_i2c_block_data(self.address, register, 2)
        return (msb << 8) | lsb

    def _write_register(self, register: int, value: int) -> None:
        with self._lock:
            self._bus.write_i2c_block_data(self.address, register, [(value >> 8) & 0xFF, value & 0xFF])

    def power_w(self) -> float:
        """One reading: bus voltage × current, W."""
        return self._bus_voltage_v() * self._current_a()

    def _begin(self) -> _Sampler:
        return _Sampler(self.power_w, self.interval_s)

    def _end(self, sampler: _Sampler, cpu_s: float) -> Measurement:
        return Measurement(cpu_s, sampler.stop(), True, self.source)

    def _setup(self) -> None:
        raise NotImplementedError

    def _bus_voltage_v(self) -> float:
        raise NotImplementedError

    def _current_a(self) -> float:
        raise NotImplementedError


class Ina219Meter(_InaMeter):
    """TI INA219 (datasheet SBOS448G) with an external shunt, as on the Adafruit breakout.

    Register map: 0x00 configuration, 0x01 shunt voltage, 0x02 bus voltage, 0x03 power,
    0x04 current, 0x05 calibration. We keep the power-on configuration 0x399F (32 V bus range,
    PGA ÷8 = ±320 mV shunt range, 12-bit ADCs, continuous shunt and bus conversion) and program
    the calibration register (datasheet §8.5.1, eq. 1-2):

        current_lsb = max_current_a / 2**15
        cal = trunc(0.04096 / (current_lsb × shunt_ohm))

    and read back current_lsb = 0.04096 / (cal × shunt_ohm) (cal is an integer). Bus voltage:
    bits 15..3 of register 0x02, LSB 4 mV. Current: register 0x04, two's complement × current_lsb.

    Args:
        shunt_ohm: the shunt resistor (0.1 Ω on the Adafruit board).
        max_current_a: the largest expected current (3.2 A: ±320 mV across 0.1 Ω).
    """

    kind = "ina219"
    CONFIG, BUS_VOLTAGE, CURRENT, CALIBRATION = 0x00, 0x02, 0x04, 0x05
    BUS_VOLTAGE_LSB_V = 0.004

    def __init__(self, address: int = DEFAULT_I2C_ADDRESS, bus: Any = DEFAULT_I2C_BUS, interval_s: float = 0.002,
                 *, shunt_ohm: float = 0.1, max_current_a: float = 3.2):
        self.calibration = calibration_ina219(shunt_ohm, max_current_a)
        self.current_lsb_a = 0.04096 / (self.calibration * shunt_ohm)
        super().__init__(address, bus, interval_s)

    def _setup(self) -> None:
        self._read_register(self.CONFIG)  # raises OSError if nothing answers
        self._write_register(self.CALIBRATION, self.calibration)

    def _bus_voltage_v(self) -> float:
        return (self._read_register(self.BUS_VOLTAGE) >> 3) * self.BUS_VOLTAGE_LSB_V

    def _current_a(self) -> float:
        return _signed16(self._read_register(self.CURRENT)) * self.current_lsb_a


class Ina260Meter(_InaMeter):
    """TI INA260 (datasheet SBOS656) with its integrated 2 mΩ shunt: no calibration needed.

    Register map: 0x00 configuration (power-on 0x6127: continuous current and bus voltage,
    1.1 ms conversions, no averaging), 0x01 current (two's complement, LSB 1.25 mA),
    0x02 bus voltage (LSB 1.25 mV), 0x03 power (LSB 10 mW), 0x06 mask/enable, 0x07 alert limit,
    0xFE manufacturer ID (0x5449, "TI"), 0xFF die ID (0x227 in bits 15..4).
    """

    kind = "ina260"
    CURRENT, BUS_VOLTAGE, MANUFACTURER_ID, DIE_ID = 0x01, 0x02, 0xFE, 0xFF
    TI_ID, INA260_DIE_ID = 0x5449, 0x227
    CURRENT_LSB_A = 0.00125
    BUS_VOLTAGE_LSB_V = 0.00125

    def _setup(self) -> None:
        maker = self._read_register(self.MANUFACTURER_ID)
        die = self._read_register(self.DIE_ID) >> 4
        if (maker, die) != (self.TI_ID, self.INA260_DIE_ID):
            raise MeterUnavailable(f"the device at {self.address:#04x} is not an INA260 "
                                   f"(manufacturer {maker:#06x}, die {die:#05x})")

    def _bus_voltage_v(self) -> float:
        return self._read_register(self.BUS_VOLTAGE) * self.BUS_VOLTAGE_LSB_V

    def _current_a(self) -> float:
        return _signed16(self._read_register(self.CURRENT)) * self.CURRENT_LSB_A


def calibration_ina219(shunt_ohm: float, max_current_a: float) -> int:
    """The INA219 calibration register value (SBOS448G eq. 1-2). 0.1 Ω, 3.2 A → 4194."""
    current_lsb = max_current_a / 2**15
    cal = int(0.04096 / (current_lsb * shunt_ohm))
    if not 0 < cal < 2**16:
        raise ValueError(f"INA219 calibration {cal} out of range for {shunt_ohm} Ω and {max_current_a} A")
    return cal


def _signed16(raw: int) -> int:
    return raw - 0x10000 if raw & 0x8000 else raw


def _open_bus(number: int) -> Any:
    try:
        from smbus2 import SMBus  # optional: only boards with an INA meter need it
    except ImportError:
        raise MeterUnavailable("the smbus2 package is not installed (pip install smbus2)") from None
    try:
        return SMBus(number)
    except OSError as exc:
        raise MeterUnavailable(f"cannot open I²C bus {number}: {exc}") from None


class _Sampler:
    """Samples ``read_power_w`` every ``interval_s`` in a thread and integrates it (trapezoids)
    from construction to ``stop()``."""

    def __init__(self, read_power_w: Any, interval_s: float):
        self._read = read_power_w
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._samples = [(time.monotonic(), read_power_w())]
        self._thread = threading.Thread(target=self._run, name="power-sampler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            try:
                self._samples.append((time.monotonic(), self._read()))
            except OSError as exc:  # a dropped reading leaves a longer trapezoid, not a crash
                log.warning("power sampler: I²C read failed: %s", exc)

    def stop(self) -> float:
        """Stop sampling; the energy since construction, J."""
        self._stop.set()
        self._thread.join()
        self._samples.append((time.monotonic(), self._read()))
        return sum(0.5 * (p0 + p1) * (t1 - t0) for (t0, p0), (t1, p1) in zip(self._samples, self._samples[1:]))


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
    if kind in ("ina219", "ina260", "rapl") and profile.emulated:
        raise UserError(f"meter {kind!r} measures this machine, but profile {profile.name!r} is an emulated "
                        f"board: use meter 'model', or profile 'host' on the board itself")


def make_meter(kind: str = "auto", profile: str | DeviceProfile = "host", *,
               address: int = DEFAULT_I2C_ADDRESS, bus: Any = DEFAULT_I2C_BUS, interval_s: float = 0.002,
               shunt_ohm: float = 0.1, max_current_a: float = 3.2,
               powercap_root: Path | None = None) -> Meter:
    """The meter of ``kind`` for a node with device ``profile``.

    Args:
        kind: "auto", "rapl", "ina219", "ina260" or "model". "auto": for an emulated board
            profile the model (a meter here measures this machine, not the board); for "host" an
            INA260, else an INA219, answering at ``address`` on ``bus``, else RAPL if readable,
            else the model.
        profile: a profile name or DeviceProfile (the model meter's figures).
        address, bus, interval_s, shunt_ohm, max_current_a: INA options (see the meter classes).
        powercap_root: where to look for RAPL (default /sys/class/powercap).

    Raises:
        UserError: an unknown kind; a hardware meter asked for an emulated board; or an explicitly
            requested meter that is not available here (the message says why).
    """
    if isinstance(profile, str):
        profile = load_profile(profile)
    builders = {
        "ina260": lambda: Ina260Meter(address, bus, interval_s),
        "ina219": lambda: Ina219Meter(address, bus, interval_s, shunt_ohm=shunt_ohm, max_current_a=max_current_a),
        "rapl": lambda: RaplMeter(powercap_root),
    }
    if kind == "model":
        return ModelMeter(profile)
    if kind in builders:
        check_meter_fits_profile(kind, profile)
        try:
            return builders[kind]()
        except MeterUnavailable as exc:
            raise UserError(f"meter {kind!r} is not available: {exc}") from None
    if kind != "auto":
        raise UserError(f"unknown meter {kind!r}; choose one of {', '.join(METER_KINDS)}")
    if profile.emulated:
        return ModelMeter(profile)
    for name in ("ina260", "ina219", "rapl"):
        try:
            return builders[name]()
        except MeterUnavailable as exc:
            log.debug("meter %s not available: %s", name, exc)
    return ModelMeter(profile)
