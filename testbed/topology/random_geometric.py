"""``random_geometric``: nodes placed in the radio's area (walking at ``speed_mps``), an edge where
the free-space SNR at full power clears ``snr_threshold_db`` (testbed.topology.geometric)."""

import numpy as np

from testbed.topology.registry import Kind
from testbed.topology.geometric import geometric_graph


def _draw(topology, block, rng):
    return geometric_graph(topology.positions_of_block(block), topology.range_m())


def _entries(topology) -> float | None:
    if topology.link_budget is None:
        return None
    n = topology.num_nodes
    return min(1.0, np.pi * topology.range_m() ** 2 / topology.link_budget.area_m ** 2) * n * (n - 1)


def _details(topology) -> dict[str, str]:
    s, budget = topology.section, topology.link_budget
    out = {"range": (f"{budget.range_m(s.snr_threshold_db):.6g} m (free space: SNR >= {s.snr_threshold_db:g} dB "
                     f"at {budget.power_w:g} W, carrier {budget.carrier_hz:g} Hz; area {budget.area_m:g} m square)")}
    if s.speed_mps:
        out["mobility"] = f"random waypoint at {s.speed_mps:g} m/s, {s.round_s:g} s a round"
    return out


REGISTRATION = Kind("random_geometric", _draw, keys=("snr_threshold_db", "speed_mps"), size_key="snr_threshold_db",
                    random=True, placed_by_radio=True, expected_entries=_entries, details=_details, order=5)
