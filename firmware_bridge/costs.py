"""A bridged board's seconds and joules: from the cycles it reports, through its profile.

A real board's counter (kind ``cycles`` or ``timer``) gives its seconds: cycles / counter Hz. A
virtual board's counter (``host``, ``emulated``) is not the board's time, so its seconds are
modelled: steps × the algorithm's flops per step × the profile's cycles per flop / its clock.
Joules are seconds × the profile's active power, so they are always modelled (``measured=False``,
as the Pi profiles' model meter is) until a board reports a power meter. The update's link is
charged by the profile's radio (nodes.meters.clock.comm_cost).

Example::

    >>> from testbed.ledger.events import ComputeEvent
    >>> costs = BoardCosts("nrf52840", flops_per_step=6 * 16 * 18)
    >>> costs.record(steps=5, cycles=64_000, counter_hz=64_000_000, kind="cycles")
    >>> costs.last.seconds, costs.last.source
    (0.001, 'board:cycles')
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import replace
from typing import Iterator, Sequence

from nodes.meters.base import Measurement
from nodes.meters.clock import comm_cost
from testbed.devices.profiles import load_mcu_profile
from testbed.ledger.events import CommunicationEvent, ComputeEvent, Event


class BoardCosts:
    """What the node agent asks of its costs (``measure``, ``charge``, ``close``) for a board.

    Args:
        profile: the board's profile name (firmware_bridge/boards.toml).
        flops_per_step: float operations of one local step (the algorithm's ``flops_per_step``),
            for a virtual board's modelled seconds.
    """

    def __init__(self, profile: str, flops_per_step: float = 0.0):
        self.profile = load_mcu_profile(profile)
        self.flops_per_step = flops_per_step
        self.last = Measurement(0.0, 0.0, False, "board:none")

    def record(self, *, steps: int, cycles: int, counter_hz: int, kind: str) -> None:
        """Turn a round's report into the step's measurement (seconds, modelled joules)."""
        self.last = self.measurement(steps=steps, cycles=cycles, counter_hz=counter_hz, kind=kind)

    def measurement(self, *, steps: int, cycles: int, counter_hz: int, kind: str) -> Measurement:
        """A round's seconds and modelled joules from what the board reported (``kind`` "model":
        no report, the steps' modelled time)."""
        if kind in ("cycles", "timer"):
            seconds, source = cycles / counter_hz, f"board:{kind}"
        else:
            seconds = steps * self.flops_per_step * self.profile.cycles_per_flop / self.profile.cpu_hz
            source = f"model:{self.profile.name}"
        return Measurement(seconds, seconds * self.profile.active_power_w, False, source)

    @contextmanager
    def measure(self) -> Iterator[list[Measurement]]:
        """As NodeCosts.measure: after the block, ``m[0]`` is what the board's step reported."""
        box: list[Measurement] = []
        yield box
        box.append(self.last)

    def charge(self, events: Sequence[Event], compute: Measurement) -> list[Event]:
        """The step's events with the board's seconds and joules, and its radio's airtime."""
        charged = []
        for e in events:
            if isinstance(e, ComputeEvent):
                e = replace(e, compute_s=compute.seconds, energy_j=compute.energy_j, measured=compute.measured)
            elif isinstance(e, CommunicationEvent) and e.airtime_s == 0.0 and e.energy_j == 0.0:
                airtime_s, energy_j = comm_cost(e.bytes_up, e.bytes_down, self.profile.device_profile())
                e = replace(e, airtime_s=airtime_s, energy_j=energy_j, measured=False)
            charged.append(e)
        return charged

    def close(self) -> None:
        """Nothing held."""
