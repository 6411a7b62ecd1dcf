"""The virtual clock of an emulated node: what a step and a transfer cost on its board.

- compute: board seconds = host CPU seconds × the profile's compute_time_factor; joules = the
  board's ACTIVE power (whole board, one core busy) × board seconds.
- communication: airtime = bits up / Wi-Fi up rate + bits down / Wi-Fi down rate (one half-duplex
  radio: the two directions do not overlap); joules = (idle + radio tx power) × uplink airtime +
  (idle + radio rx power) × downlink airtime.

Whole-board power, not the increment over idle, is charged on purpose: it is what a supply-side
meter (an INA219/INA260 on the board's 5 V input, nodes/meters/) reports over the same interval,
so modelled and measured ledgers are comparable. The energy of idle time between events is
charged to no event (no event covers it).

``Pacer`` optionally makes an emulated node take the wall time its board would.

Example::

    >>> from testbed.devices.profiles import load_profile
    >>> p = load_profile("pi-4b")
    >>> board_s, energy_j = compute_cost(0.001, p)       # 1 ms of host CPU
    >>> round(board_s, 4), round(energy_j, 6)
    (0.0069, 0.016905)
    >>> airtime_s, radio_j = comm_cost(1616, 1616, p)   # a 202-parameter model up and down
"""

from __future__ import annotations

import time
from typing import Callable

from testbed.devices.profiles import DeviceProfile


def compute_cost(host_cpu_s: float, profile: DeviceProfile) -> tuple[float, float]:
    """Board seconds and joules of a computation that took ``host_cpu_s`` CPU seconds here.

    Returns:
        (board_s, energy_j): host_cpu_s × compute_time_factor, and active_power_w × board_s.
    """
    board_s = host_cpu_s * profile.compute_time_factor
    return board_s, profile.active_power_w * board_s


def comm_cost(bytes_up: int, bytes_down: int, profile: DeviceProfile) -> tuple[float, float]:
    """Airtime and board joules of sending ``bytes_up`` and receiving ``bytes_down`` over Wi-Fi.

    Returns:
        (airtime_s, energy_j): 8·bytes_up/wifi_up_bps + 8·bytes_down/wifi_down_bps, and the
        whole-board energy over that airtime (idle plus the radio's tx or rx power).
    """
    up_s = 8.0 * bytes_up / profile.wifi_up_bps
    down_s = 8.0 * bytes_down / profile.wifi_down_bps
    energy_j = (up_s * (profile.idle_power_w + profile.radio_tx_power_w)
                + down_s * (profile.idle_power_w + profile.radio_rx_power_w))
    return up_s + down_s, energy_j


class Pacer:
    """Real-time pacing of an emulated node: after a step that took ``host_elapsed_s`` of wall
    time here, sleep until the board's ``board_s`` have passed, so the node answers when its board
    would (deadlines and stragglers then behave as on hardware).

    Args:
        enabled: False makes ``wait`` a no-op (the default for fast runs).
        sleep: the sleep function (tests pass a fake).

    Example::

        >>> Pacer(enabled=True, sleep=lambda s: None).wait(board_s=0.5, host_elapsed_s=0.1)
        0.4
    """

    def __init__(self, enabled: bool, sleep: Callable[[float], None] = time.sleep):
        self.enabled = enabled
        self._sleep = sleep

    def wait(self, board_s: float, host_elapsed_s: float) -> float:
        """Sleep max(0, board_s − host_elapsed_s) seconds if enabled; return the seconds slept."""
        pause_s = max(0.0, board_s - host_elapsed_s) if self.enabled else 0.0
        if pause_s > 0:
            self._sleep(pause_s)
        return pause_s
