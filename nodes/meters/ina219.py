"""The INA219 meter: a TI current/power monitor with an external shunt, on I²C."""

from __future__ import annotations

from typing import Any

from nodes.meters.ina import InaMeter, signed16
from nodes.meters.registry import DEFAULT_I2C_ADDRESS, DEFAULT_I2C_BUS, Registration


class Ina219Meter(InaMeter):
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
        return signed16(self._read_register(self.CURRENT)) * self.current_lsb_a


def calibration_ina219(shunt_ohm: float, max_current_a: float) -> int:
    """The INA219 calibration register value (SBOS448G eq. 1-2). 0.1 Ω, 3.2 A → 4194."""
    current_lsb = max_current_a / 2**15
    cal = int(0.04096 / (current_lsb * shunt_ohm))
    if not 0 < cal < 2**16:
        raise ValueError(f"INA219 calibration {cal} out of range for {shunt_ohm} Ω and {max_current_a} A")
    return cal


REGISTRATION = Registration(
    "ina219", lambda o: Ina219Meter(o.address, o.bus, o.interval_s, shunt_ohm=o.shunt_ohm, max_current_a=o.max_current_a),
    listed_at=2, auto_rank=2, unix_groups=("i2c",))
