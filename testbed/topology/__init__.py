"""Topologies of decentralised runs: which nodes hear each other, round by round.

- :mod:`~testbed.topology.graph`: :class:`Graph`, an undirected simple graph as CSR arrays;
- :mod:`~testbed.topology.kinds`: ring, torus, k-regular, Erdős–Rényi, edge list files;
- :mod:`~testbed.topology.registry`: the kinds of ``[topology] kind``, one module of this package
  each (``complete``, ``ring``, ``torus``, ``k_regular``, ``erdos_renyi``, ``random_geometric``,
  ``file``) or an installed plugin's (docs/extending.md);
- :mod:`~testbed.topology.geometric`: the graph the radio gives (free-space SNR threshold) and the
  random waypoint walk;
- :mod:`~testbed.topology.scene`: the nodes of a run in a ray-traced scene (``pathloss = "scene"``):
  positions, walks and the traced links of every block;
- :mod:`~testbed.topology.mixing`: Metropolis–Hastings and uniform weights, the spectral gap;
- :mod:`~testbed.topology.topology`: :class:`Topology`, the graph of every coherence block of a run;
- :mod:`~testbed.topology.section`: the ``[topology]`` section.

Numpy only (scipy for large spectral gaps): a board draws the same graph as the coordinator.
"""

from testbed.topology.geometric import LinkBudget
from testbed.topology.graph import Graph
from testbed.topology.mixing import Mixing, mixing_weights, spectral_gap
from testbed.topology.section import TopologySection
from testbed.topology.topology import Topology

__all__ = ["Graph", "LinkBudget", "Mixing", "Topology", "TopologySection", "mixing_weights", "spectral_gap"]
