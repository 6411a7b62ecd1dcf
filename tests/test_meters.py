"""Meters (nodes/meters/): RAPL on a fake powercap tree, INA219/INA260 on a fake I²C bus whose
registers follow the TI datasheets, the CPU-time model meter, and make_meter's choices."""

import pathlib
import sys
import time
from pathlib import Path

import pytest

from nodes.meters import base, rapl
from nodes.meters.base import Measurement, MeterUnavailable
from nodes.meters.ina219 import Ina219Meter, calibration_ina219
from nodes.meters.ina260 import Ina260Meter
from nodes.meters.model import ModelMeter
from nodes.meters.rapl import RaplMeter
from nodes.meters.registry import make_meter
from testbed.devices.profiles import load_profile
from testbed.errors import UserError


def busy(seconds: float = 0.02) -> None:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass


# ---- RAPL ---------------------------------------------------------------------------------------


def _zone(root: Path, name: str, label: str, energy_uj: int, max_uj: int = 262_143_328_850) -> Path:
    zone = root / name
    zone.mkdir(parents=True)
    (zone / "name").write_text(label + "\n")
    (zone / "energy_uj").write_text(f"{energy_uj}\n")
    (zone / "max_energy_range_uj").write_text(f"{max_uj}\n")
    return zone


@pytest.fixture
def powercap(tmp_path):
    """Two packages and a core sub-zone (which must not be counted)."""
    root = tmp_path / "powercap"
    pkgs = [_zone(root, "intel-rapl:0", "package-0", 1_000_000), _zone(root, "intel-rapl:1", "package-1", 5_000_000)]
    _zone(root, "intel-rapl:0:0", "core", 123)
    return root, pkgs


def _set_counter(zone: Path, energy_uj: int) -> None:
    """Move a fake counter while a span is open (the 'work' of the interval)."""
    (zone / "energy_uj").write_text(f"{energy_uj}\n")


def test_rapl_sums_package_deltas_and_ignores_subzones(powercap):
    root, (pkg0, pkg1) = powercap
    meter = RaplMeter(root)
    assert meter.source == "rapl:package-0,package-1"
    with meter.measure() as span:
        _set_counter(pkg0, 3_500_000)
        _set_counter(pkg1, 5_250_000)
        _set_counter(root / "intel-rapl:0:0", 999_999_999)
    assert span.result.energy_j == pytest.approx(2.5 + 0.25)
    assert span.result.measured and span.result.source == "rapl:package-0,package-1"
    assert span.result.seconds >= 0


def test_rapl_handles_wrap_around(tmp_path):
    pkg = _zone(tmp_path, "intel-rapl:0", "package-0", energy_uj=999_000, max_uj=1_000_000)
    meter = RaplMeter(tmp_path)
    with meter.measure() as span:
        _set_counter(pkg, 500)  # wrapped past 1_000_000 back to 500
    assert span.result.energy_j == pytest.approx((1_000_000 - 999_000 + 500) * 1e-6)


def test_rapl_unreadable_counter_is_unavailable(powercap, monkeypatch):
    root, _ = powercap
    read_text = pathlib.Path.read_text

    def root_only(self, *args, **kwargs):
        if self.name == "energy_uj":
            raise PermissionError(13, "Permission denied")
        return read_text(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "read_text", root_only)
    with pytest.raises(MeterUnavailable, match="only by root"):
        RaplMeter(root)
    assert isinstance(make_meter("auto", "host", powercap_root=root), ModelMeter)
    with pytest.raises(UserError, match="'rapl' is not available.*only by root"):
        make_meter("rapl", "host", powercap_root=root)


def test_rapl_without_zones_is_unavailable(tmp_path):
    with pytest.raises(MeterUnavailable, match="no RAPL package zone"):
        RaplMeter(tmp_path)


def test_rapl_default_root_is_the_module_constant(powercap, monkeypatch):
    root, _ = powercap
    monkeypatch.setattr(rapl, "POWERCAP_ROOT", root)
    assert isinstance(make_meter("rapl", "host"), RaplMeter)


# ---- INA219 / INA260 on a fake bus --------------------------------------------------------------


class FakeBus:
    """An smbus2-like bus with one device at ``address``: 16-bit registers, big-endian on the wire."""

    def __init__(self, registers: dict[int, int], address: int = 0x40):
        self.registers = dict(registers)
        self.address = address
        self.writes: list[tuple[int, int]] = []

    def read_i2c_block_data(self, addr, register, length):
        if addr != self.address:
            raise OSError(121, "Remote I/O error")
        value = self.registers.get(register, 0)
        return [(value >> 8) & 0xFF, value & 0xFF][:length]

    def write_i2c_block_data(self, addr, register, data):
        if addr != self.address:
            raise OSError(121, "Remote I/O error")
        value = (data[0] << 8) | data[1]
        self.registers[register] = value
        self.writes.append((register, value))


class NoDevice:
    def read_i2c_block_data(self, addr, register, length):
        raise OSError(121, "Remote I/O error")

    def write_i2c_block_data(self, addr, register, data):
        raise OSError(121, "Remote I/O error")


def _twos(value: int) -> int:
    return value & 0xFFFF


def ina219_bus(volts: float, amps: float, shunt_ohm: float = 0.1, max_current_a: float = 3.2) -> tuple[FakeBus, float]:
    """Registers per SBOS448G: bus voltage bits 15..3 at 4 mV/LSB (CNVR bit 1 set), current in units
    of current_lsb = 0.04096 / (cal × R_shunt). Returns the bus and the power the chip reports."""
    cal = int(0.04096 / (max_current_a / 2**15 * shunt_ohm))
    lsb = 0.04096 / (cal * shunt_ohm)
    current_raw = round(amps / lsb)
    bus_raw = round(volts / 0.004)
    bus = FakeBus({0x00: 0x399F, 0x02: (bus_raw << 3) | 0b10, 0x04: _twos(current_raw)})
    return bus, bus_raw * 0.004 * current_raw * lsb


def ina260_bus(volts: float, amps: float) -> FakeBus:
    """Registers per SBOS656: 1.25 mA and 1.25 mV per LSB, IDs 0x5449 / 0x2270."""
    return FakeBus({0x00: 0x6127, 0x01: _twos(round(amps / 0.00125)), 0x02: round(volts / 0.00125),
                    0xFE: 0x5449, 0xFF: 0x2270})


def test_ina219_calibration_value_from_the_datasheet():
    assert calibration_ina219(0.1, 3.2) == 4194  # trunc(0.04096 / (3.2/32768 × 0.1)) = trunc(4194.3)
    assert calibration_ina219(0.1, 0.4) == 33554


def test_ina219_programs_calibration_and_reads_power():
    bus, power_w = ina219_bus(5.0, 0.5)
    meter = Ina219Meter(bus=bus, interval_s=0.001)
    assert bus.writes == [(0x05, 4194)]
    assert meter.power_w() == pytest.approx(power_w) and power_w == pytest.approx(2.5, rel=1e-3)
    assert meter.source == "ina219@0x40"


def test_ina219_integrates_energy_over_the_interval():
    bus, power_w = ina219_bus(5.0, 0.5)
    meter = Ina219Meter(bus=bus, interval_s=0.001)
    start = time.monotonic()
    with meter.measure() as span:
        time.sleep(0.1)
    wall_s = time.monotonic() - start
    assert span.result.measured
    assert span.result.energy_j == pytest.approx(power_w * wall_s, rel=0.05)


def test_ina219_negative_current_is_signed():
    bus, power_w = ina219_bus(5.0, -0.25)
    assert Ina219Meter(bus=bus).power_w() == pytest.approx(power_w) and power_w < 0


def test_ina260_reads_fixed_lsb_registers():
    meter = Ina260Meter(bus=ina260_bus(5.1, 0.8))
    assert meter.power_w() == pytest.approx(5.1 * 0.8)
    assert Ina260Meter(bus=ina260_bus(5.0, -0.1)).power_w() == pytest.approx(-0.5)


def test_ina260_integrates_a_changing_power():
    bus = ina260_bus(5.0, 0.4)  # 2 W
    meter = Ina260Meter(bus=bus, interval_s=0.001)
    start = time.monotonic()
    with meter.measure() as span:
        time.sleep(0.05)
        switched = time.monotonic()
        bus.registers[0x01] = round(0.8 / 0.00125)  # 4 W from here
        time.sleep(0.05)
    end = time.monotonic()
    expected = 2.0 * (switched - start) + 4.0 * (end - switched)
    assert span.result.energy_j == pytest.approx(expected, rel=0.08)


def test_ina260_rejects_another_chip():
    with pytest.raises(MeterUnavailable, match="not an INA260"):
        Ina260Meter(bus=FakeBus({0xFE: 0x1234}))


def test_ina_without_a_device_is_unavailable():
    with pytest.raises(MeterUnavailable, match="no answer"):
        Ina219Meter(bus=NoDevice())
    with pytest.raises(UserError, match="'ina260' is not available"):
        make_meter("ina260", "host", bus=NoDevice())


def test_ina_on_a_bus_number_needs_smbus2(monkeypatch):
    monkeypatch.setitem(sys.modules, "smbus2", None)  # as where it is not installed (the node extra brings it)
    with pytest.raises(UserError, match="smbus2"):
        make_meter("ina219", "host", bus=1)


# ---- the model meter and make_meter -------------------------------------------------------------


def test_model_meter_measures_cpu_time_of_a_busy_loop():
    meter = make_meter("model", "host")
    with meter.measure() as span:
        busy(0.02)
    host = load_profile("host")
    assert isinstance(span.result, Measurement) and not span.result.measured
    assert span.result.seconds >= 0.015
    assert span.result.energy_j == pytest.approx(span.result.seconds * host.active_power_w)
    assert span.result.source == "model:host"


def test_model_meter_scales_to_board_seconds(monkeypatch):
    clock = iter([10.0, 10.5])
    monkeypatch.setattr(base.time, "process_time", lambda: next(clock))
    zero = load_profile("pi-zero-2w")
    with ModelMeter(zero).measure() as span:
        pass
    assert span.result.seconds == pytest.approx(0.5 * zero.compute_time_factor)
    assert span.result.energy_j == pytest.approx(span.result.seconds * zero.active_power_w)


def test_auto_prefers_ina260_then_ina219_then_rapl_then_the_model(powercap, tmp_path):
    root, _ = powercap
    assert isinstance(make_meter("auto", "host", bus=ina260_bus(5.0, 0.5), powercap_root=root), Ina260Meter)
    assert isinstance(make_meter("auto", "host", bus=ina219_bus(5.0, 0.5)[0], powercap_root=root), Ina219Meter)
    assert isinstance(make_meter("auto", "host", bus=NoDevice(), powercap_root=root), RaplMeter)
    assert isinstance(make_meter("auto", "host", bus=NoDevice(), powercap_root=tmp_path / "none"), ModelMeter)


def test_auto_models_an_emulated_board_even_with_hardware_meters(powercap):
    root, _ = powercap
    meter = make_meter("auto", "pi-4b", bus=ina260_bus(5.0, 0.5), powercap_root=root)
    assert isinstance(meter, ModelMeter) and meter.source == "model:pi-4b"


def test_hardware_meter_for_an_emulated_board_is_refused(powercap):
    root, _ = powercap
    with pytest.raises(UserError, match="emulated board"):
        make_meter("rapl", "pi-5", powercap_root=root)


def test_unknown_meter_kind():
    with pytest.raises(UserError, match="unknown meter 'joulemeter'"):
        make_meter("joulemeter", "host")


def test_auto_falls_back_to_the_model_on_a_machine_without_a_hardware_meter(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "smbus2", None)  # no INA meter can be opened
    monkeypatch.setattr(rapl, "POWERCAP_ROOT", tmp_path)  # no RAPL counters
    meter = make_meter()  # every default, as a node calls it
    assert isinstance(meter, ModelMeter) and not meter.measured
