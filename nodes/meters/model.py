"""The model meter: energy (and board seconds) from the device profile, no hardware needed; the
meter "auto" falls back to (and picks for an emulated board)."""

from __future__ import annotations

from nodes.clock import compute_cost
from nodes.meters.base import Measurement, Meter
from nodes.meters.registry import Registration
from testbed.devices.profiles import DeviceProfile


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


REGISTRATION = Registration("model", lambda options: ModelMeter(options.profile), measures_host=False, listed_at=4,
                            fallback=True)
