"""Where a run's nodes stand, as its summary records it (``topology`` in summary.json), so that what a
run leaves (the HTML report) places the nodes without the radio, the scene or Sionna RT.

For a kind placed by the radio (``random_geometric``, in free space or in a ray-traced scene) of at
most :data:`MAX_RECORDED_NODES` nodes: ``positions_m``, the nodes' positions in the first block (m,
to the millimetre; (N, 3) in a scene, (N, 2) in the free-space square), and in a scene ``scene`` (its
name or file) and ``server_m`` (the server point); with at most :data:`MAX_RECORDED_EDGES` edges,
``edges``, the first block's graph as [i, j] pairs. Nothing for another kind.

Example::

    >>> from testbed.topology import LinkBudget, Topology
    >>> from testbed.topology.section import TopologySection
    >>> budget = LinkBudget(power_w=1.0, noise_power_w=1e-12, carrier_hz=2.4e9, area_m=100.0)
    >>> topo = Topology(TopologySection(kind="random_geometric", snr_threshold_db=55.0), 4, seed=1, link_budget=budget)
    >>> record = placement_record(topo)
    >>> record["positions_m"][2:], record["edges"]
    ([[37.708, 68.309], [26.192, 71.615]], [[2, 3]])
    >>> placement_record(Topology(TopologySection(kind="ring"), 3, seed=1))
    {}
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["placement_record", "MAX_RECORDED_NODES", "MAX_RECORDED_EDGES"]

#: Positions are recorded up to this many nodes (the watch page draws up to as many).
MAX_RECORDED_NODES = 500
#: The first block's edges are recorded up to this many (a summary stays small).
MAX_RECORDED_EDGES = 2000
#: Positions are recorded to this many decimals of a metre.
_DECIMALS = 3


def placement_record(topology: Any) -> dict[str, Any]:
    """What summary.json's ``topology`` records of where ``topology``'s nodes stand (see the module)."""
    if not topology.registration.placed_by_radio or topology.num_nodes > MAX_RECORDED_NODES:
        return {}
    out: dict[str, Any] = {}
    site = topology.scene_site()
    if site is not None:
        positions = site.positions_m(topology.scene_block(0))
        out["scene"] = site.spec.scene
        out["server_m"] = _rounded(site.server_position_m())
    else:
        positions = topology.positions_of_block(0)
    out["positions_m"] = _rounded(positions)
    edges = topology.graph(0).edges()
    if len(edges) <= MAX_RECORDED_EDGES:
        out["edges"] = np.asarray(edges, dtype=np.int64).tolist()
    return out


def _rounded(values: np.ndarray) -> list:
    return np.round(np.asarray(values, dtype=np.float64), _DECIMALS).tolist()
