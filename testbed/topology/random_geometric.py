"""``random_geometric``: nodes placed in the radio's area (walking at ``speed_mps``), an edge where
the free-space SNR at full power clears ``snr_threshold_db`` (testbed.topology.geometric); with a
ray-traced radio (``pathloss = "scene"``) the nodes stand in the scene and the SNR is
P · traced gain / (2σ_m²) (testbed.topology.scene: walls shadow, streets guide)."""

import numpy as np

from testbed.topology.registry import Kind
from testbed.topology.geometric import geometric_graph
from testbed.topology.graph import Graph


def _draw(topology, block, rng):
    site = topology.scene_site()
    if site is not None:
        return traced_graph(site.node_gain(topology.scene_block(block)), topology.link_budget,
                            topology.section.snr_threshold_db)
    return geometric_graph(topology.positions_of_block(block), topology.range_m())


def traced_graph(gain: np.ndarray, budget, snr_threshold_db: float) -> Graph:
    """The graph with an edge (i, k) where the received SNR at full power, P · gain[i, k] / (2σ_m²),
    clears the threshold (gain: (N, N) linear, symmetric: channel.scene's links are reciprocal)."""
    threshold = 2.0 * budget.noise_power_w * 10.0 ** (snr_threshold_db / 10.0) / budget.power_w
    i, k = np.nonzero(np.triu(gain >= threshold, 1))
    return Graph.from_edges(gain.shape[0], np.column_stack([i, k]))


def _entries(topology) -> float | None:
    if topology.link_budget is None or topology.link_budget.scene is not None:
        return None
    n = topology.num_nodes
    return min(1.0, np.pi * topology.range_m() ** 2 / topology.link_budget.area_m ** 2) * n * (n - 1)


def _details(topology) -> dict[str, str]:
    s, budget = topology.section, topology.link_budget
    if budget.scene is not None:
        site = topology.scene_site()
        return {"range": f"SNR >= {s.snr_threshold_db:g} dB on the gains ray traced in {site.spec.scene} "
                         f"at {budget.power_w:g} W, carrier {budget.carrier_hz:g} Hz"}
    out = {"range": (f"{budget.range_m(s.snr_threshold_db):.6g} m (free space: SNR >= {s.snr_threshold_db:g} dB "
                     f"at {budget.power_w:g} W, carrier {budget.carrier_hz:g} Hz; area {budget.area_m:g} m square)")}
    if s.speed_mps:
        out["mobility"] = f"random waypoint at {s.speed_mps:g} m/s, {s.round_s:g} s a round"
    return out


REGISTRATION = Kind("random_geometric", _draw, keys=("snr_threshold_db", "speed_mps"), size_key="snr_threshold_db",
                    random=True, placed_by_radio=True, expected_entries=_entries, details=_details, order=5)
