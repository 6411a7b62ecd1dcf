"""The model meter: energy (and board seconds) from the device profile, no hardware needed; the
meter "auto" falls back to (and picks for an emulated board). In a board run through an emulator
(`testbed board run`), the CPU seconds it models from are the host's (nodes.meters.emulation), never the
emulator's."""

from __future__ import annotations

from nodes.meters import emulation
from nodes.meters.base import Measurement, Meter
from nodes.meters.clock import compute_cost
from nodes.meters.registry import Registration
from testbed.devices.profiles import DeviceProfile


class ModelMeter(Meter):
    """Energy (and board seconds) from the device profile: no hardware needed."""

    kind = "model"
    measured = False

    def __init__(self, profile: DeviceProfile):
        self.profile = profile
        self.emulated = emulation.slowdown()  # (times slower, emulator) in an emulated board, else None

    @property
    def source(self) -> str:
        if self.emulated is None:
            return f"model:{self.profile.name}"
        factor, emulator = self.emulated
        return f"model:{self.profile.name} (under {emulator}: CPU seconds / {factor:.3g}, the emulation's slowdown)"

    def _end(self, state: None, cpu_s: float) -> Measurement:
        if self.emulated is not None:
            cpu_s /= self.emulated[0]  # the host's own seconds for this work
        board_s, energy_j = compute_cost(cpu_s, self.profile)
        return Measurement(board_s, energy_j, False, self.source)


REGISTRATION = Registration("model", lambda options: ModelMeter(options.profile), measures_host=False, listed_at=4,
                            fallback=True)
