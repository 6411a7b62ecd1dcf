"""The graph of a decentralised run as the watch page and `testbed topology` draw it: a
:class:`~testbed.algorithms.contract.GraphView` over the ``[topology]`` section, for any algorithm
that declares it (``Registration.graph_view = graph_view_with(...)``).

Example::

    >>> view = graph_view_with(default_mixing="uniform")({"topology": TopologySection(kind="ring")}, 5, 0)
    >>> view.block_of(3), view.edges(3).tolist()[:2], view.positions(3), view.mixing
    (0, [[0, 1], [0, 4]], None, 'uniform')
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from testbed.topology.geometric import LinkBudget
from testbed.topology.section import TopologySection
from testbed.topology.topology import Topology

__all__ = ["TopologyView", "graph_view_with"]


class TopologyView:
    """The graphs of a run's :class:`Topology`, round by round (the contract's GraphView), and the
    mixing rule the algorithm weights them by (``mixing``: the section's, or for ``"auto"`` the
    algorithm's default)."""

    def __init__(self, topology: Topology, default_mixing: str) -> None:
        self.topology = topology
        self.mixing = topology.resolved_mixing(default_mixing)

    def block_of(self, round_index: int) -> int:
        return self.topology.schedule.block_index(round_index)

    def edges(self, round_index: int) -> np.ndarray:
        return self.topology.graph(round_index).edges()

    def positions(self, round_index: int) -> np.ndarray | None:
        return self.topology.positions_m(round_index)


def graph_view_with(radio: Callable[[dict[str, Any], int], Any] | None = None, *, default_mixing: str
                    ) -> Callable[[dict[str, Any], int, int], TopologyView]:
    """A ``Registration.graph_view`` hook: (sections, N, seed) → the view of the sections'
    ``[topology]`` (its defaults, the complete graph, when the algorithm declares none).

    Args:
        radio: (sections, N) → an object with the link budget's attributes (``power_w``,
            ``noise_power_w``, ``carrier_hz``, ``area_m``: DWFL's Radio), which ``random_geometric``
            needs; None: the algorithm has no radio.
        default_mixing: the rule the algorithm weights the graph by under ``mixing = "auto"``.
    """

    def view(sections: dict[str, Any], num_nodes: int, seed: int) -> TopologyView:
        budget = None if radio is None else LinkBudget.of(radio(sections, num_nodes))
        section = sections.get("topology") or TopologySection()
        return TopologyView(Topology(section, num_nodes, seed, link_budget=budget), default_mixing)

    return view
