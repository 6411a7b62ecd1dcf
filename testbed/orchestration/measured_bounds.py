"""The physical bounds of what a node measures or models itself in one event (the seconds and joules
of testbed.ledger.fields.MEASURED_FIELDS), derived from public, declared quantities: the node's
device or board profile, the event's plan, and how long the round was open for that node. The one
place that computes them; the coordinator applies them to every reply of every algorithm over MQTT,
and SimNodes to what its cost model charges, so that a value no board could have spent is refused
(one logged line) and charged at its bound.

The window: a node's round is open from the moment the coordinator sends it (or, in sim, begins
it) to the moment its reply arrives (in sim: the step's end), plus :data:`SLACK_S` for clock
granularity. What a node can have spent in that window:

- **compute_s** of a profiled board (nodes/profiles.toml) is host CPU-seconds × its
  ``compute_time_factor`` (nodes/meters/clock.py); a process's CPU-seconds are at most the window × this
  machine's cores (``time.process_time`` counts every thread). The ``host`` profile is the factor 1.
  A microcontroller board (firmware_bridge/boards.toml) reports its own cycles (a real board: within
  the window) or is modelled from the plan's steps (a virtual board: steps × FLOPs per step × cycles
  per FLOP / clock): the larger of the two.
- **airtime_s** is at most the larger of the window (a measured airtime), the link model's airtime
  of the plan's bytes at the profile's throughput (a modelled one; nodes.meters.clock.comm_cost), and the
  airtime the plan itself carries (an over-the-air algorithm's channel model).
- **energy_j** is at most the board's maximum power × the event's bound in seconds (compute_s's or
  airtime_s's), and never below the joules the plan carries. A profiled board's maximum power is
  ``4 × active_power_w + radio_tx_power_w + radio_rx_power_w``: ``active_power_w`` is one busy
  core's share (profiles.toml: idle + (all-core stress − idle) / 4), so four of them bound an
  all-core load on the profiled boards (four cores at most), with both radios on top. A
  microcontroller has one core: ``active_power_w`` plus its radios. The ``host`` profile's power is
  a TDP share, not a bound of what its meter (RAPL: the whole package) reads: it keeps the fixed
  cap of :data:`testbed.ledger.fields.MAX_POWER_W` per second of the window.

A link's seconds (links.netns: testbed.ledger.events.WireEvent) are the coordinator's own
measurement, not a node's: a host's round on its link is at most the round's window from the round's
start to its close on the coordinator's clock (:func:`wire_limit_s`), and the nodes' shares of it sum
to it, so none is beyond it either.

A node whose profile the coordinator does not know (not emulated by it: a real board started by
hand) keeps the fixed caps of testbed.ledger.fields (a day, a kilowatt). Every derived bound is
also capped by those. Bytes are not measured: an event's bytes must be the plan's exactly (the
declared tensors' payload), so no bound is needed for them.

Example::

    >>> from testbed.ledger.events import ComputeEvent
    >>> bounds = MeasuredBounds.of_profile("pi-4b", cores=2)
    >>> limits = bounds.limits(ComputeEvent(0, 3, local_steps=5), open_s=2.0)
    >>> limits["compute_s"] == 6.9 * 2 * (2.0 + SLACK_S)
    True
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from firmware_bridge.costs import BoardCosts
from nodes.meters.clock import comm_cost
from testbed.devices.profiles import HOST, DeviceProfile, load_profile
from testbed.ledger.events import CommunicationEvent, ComputeEvent, Event
from testbed.ledger.fields import FIELD_RULES, MAX_EVENT_J, MAX_EVENT_S, MAX_POWER_W, MEASURED_FIELDS

#: Seconds added to a round's open window: clock granularity, and the moments between the reply's
#: measurement and its arrival that the coordinator's clock cannot split from the round.
SLACK_S = 1.0
#: Busy cores of a profiled board at most (every board of nodes/profiles.toml has four).
BOARD_CORES = 4
#: The bounded numbers of an event (``measured`` is a flag, not a quantity).
BOUNDED_FIELDS = tuple(sorted(name for name in MEASURED_FIELDS if FIELD_RULES[name].type is float))
_FIXED_CAPS = {"compute_s": MAX_EVENT_S, "airtime_s": MAX_EVENT_S, "energy_j": MAX_EVENT_J}
_NONE: dict[str, float] = {}  # the limits of an event kind without measured numbers
_LEAST_KEPT = 4096  # least_limits' answers kept per bounds


@dataclass(frozen=True)
class MeasuredBounds:
    """What bounds one node's measured fields: its profile's figures (None: the fixed caps only).

    Attributes:
        device: the node's device profile (an emulated board or the host), or None.
        board: a microcontroller board's cost model (its profile and the algorithm's FLOPs per
            step), or None.
        cores: the cores of the machine the node's process runs on.
    """

    device: DeviceProfile | None = None
    board: BoardCosts | None = None
    cores: int = 1
    # least_limits' answers by what they depend on (not a part of the bounds' value)
    _least: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @classmethod
    def of_profile(cls, profile: str, cores: int | None = None) -> "MeasuredBounds":
        """Bounds of a node emulated on this machine (``cores`` None: this machine's) with the
        device profile ``profile``."""
        return cls(device=load_profile(profile), cores=cores or os.cpu_count() or 1)

    @classmethod
    def of_board(cls, mcu_profile: str, flops_per_step: float) -> "MeasuredBounds":
        """Bounds of a microcontroller board (one core) with the board profile ``mcu_profile``."""
        board = BoardCosts(mcu_profile, flops_per_step)
        return cls(device=board.profile.device_profile(), board=board, cores=1)

    def limits(self, planned: Event, open_s: float) -> dict[str, float]:
        """The bound of each measured number of ``planned``'s kind, for a round open ``open_s``
        seconds for the node (negative or not finite: no window known, the fixed caps)."""
        if not isinstance(planned, (ComputeEvent, CommunicationEvent)):
            return {}
        if self.device is None or not (math.isfinite(open_s) and open_s >= 0):
            return {name: _FIXED_CAPS[name] for name in BOUNDED_FIELDS if hasattr(planned, name)}
        window_s = open_s + SLACK_S
        if isinstance(planned, ComputeEvent):
            seconds_name, seconds = "compute_s", self._compute_s(planned, window_s)
        else:
            modelled_s, _ = comm_cost(planned.bytes_up, planned.bytes_down, self.device)
            seconds_name, seconds = "airtime_s", max(window_s, modelled_s, planned.airtime_s)
        energy_j = max(planned.energy_j, self._max_power_w() * (window_s if self._is_host() else seconds))
        return {seconds_name: min(seconds, _FIXED_CAPS[seconds_name]), "energy_j": min(energy_j, MAX_EVENT_J)}

    def least_limits(self, planned: Event) -> dict[str, float]:
        """:meth:`limits` of a window that closes at once (``open_s`` 0): the least bound of each
        field, since every bound only grows with the window. Made once per what it depends on
        (the kind, the plan's steps, bytes, seconds and joules); a caller must not change it.
        What is within these is within :meth:`limits` at any ``open_s`` >= 0: a reply's fast path
        (testbed.ledger.fields.planned_within)."""
        if isinstance(planned, ComputeEvent):
            key: tuple = (ComputeEvent, planned.local_steps, planned.compute_s, planned.energy_j)
        elif isinstance(planned, CommunicationEvent):
            key = (CommunicationEvent, planned.bytes_up, planned.bytes_down, planned.airtime_s, planned.energy_j)
        else:
            return _NONE
        least = self._least.get(key)
        if least is None:
            if len(self._least) >= _LEAST_KEPT:  # plans that change every round (a channel's airtime)
                self._least.clear()
            least = self._least[key] = self.limits(planned, 0.0)
        return least

    def _compute_s(self, planned: ComputeEvent, window_s: float) -> float:
        if self.board is not None:
            modelled = self.board.measurement(steps=planned.local_steps, cycles=0, counter_hz=1, kind="model")
            return max(window_s, modelled.seconds, planned.compute_s)
        assert self.device is not None
        return max(window_s, self.device.compute_time_factor * self.cores * window_s, planned.compute_s)

    def _is_host(self) -> bool:
        return self.device is not None and self.device.name == HOST

    def _max_power_w(self) -> float:
        d = self.device
        assert d is not None
        if self._is_host():
            return MAX_POWER_W
        cores = 1 if self.board is not None else BOARD_CORES
        return cores * d.active_power_w + d.radio_tx_power_w + d.radio_rx_power_w


def wire_limit_s(open_s: float) -> float:
    """The most seconds a host's round can have spent on its link: the round open ``open_s``
    seconds on the coordinator's clock, plus :data:`SLACK_S`, within the fixed cap of a day."""
    return min(max(open_s, 0.0) + SLACK_S, MAX_EVENT_S)
