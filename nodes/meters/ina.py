"""What the INA219 and INA260 meters share: the I²C bus, 16-bit big-endian registers, and a thread
that samples power and integrates it over the interval."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from nodes.meters.base import Measurement, Meter, MeterUnavailable
from nodes.meters.registry import DEFAULT_I2C_ADDRESS, DEFAULT_I2C_BUS

log = logging.getLogger(__name__)


class InaMeter(Meter):
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


def signed16(raw: int) -> int:
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
