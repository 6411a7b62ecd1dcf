"""The INA260 meter: a TI current/power monitor with its integrated shunt, on I²C."""

from __future__ import annotations

from nodes.meters.base import MeterUnavailable
from nodes.meters.ina import InaMeter, signed16
from nodes.meters.registry import Registration


class Ina260Meter(InaMeter):
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
        return signed16(self._read_register(self.CURRENT)) * self.CURRENT_LSB_A


REGISTRATION = Registration("ina260", lambda o: Ina260Meter(o.address, o.bus, o.interval_s), listed_at=3,
                            auto_rank=1, unix_groups=("i2c",))
