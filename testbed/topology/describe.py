"""What `testbed topology show` says of one round's graph, and its edge list in the ``file``
kind's format (so that a drawn graph can be run again as ``kind = "file"``).

Example::

    >>> from testbed.topology.section import TopologySection
    >>> from testbed.topology.topology import Topology
    >>> topo = Topology(TopologySection(kind="ring", mixing="uniform"), num_nodes=5, seed=0)
    >>> describe_round(topo, 0, "metropolis_hastings")["spectral gap"]
    '0.190983005625 (uniform)'
    >>> print(edge_list_text(topo, 0).splitlines()[1])
    0 1
"""

from __future__ import annotations

import numpy as np

from testbed.errors import ConfigError
from testbed.topology.mixing import complete_graph_gap, mixing_weights, spectral_gap
from testbed.topology.topology import MAX_ADJACENCY_ENTRIES, Topology

__all__ = ["describe_round", "edge_list_text"]

#: What ``mixing = "auto"`` resolves to, by how the algorithm exchanges (docs/topologies.md).
AUTO_RULES = {"uniform": "over the air", "metropolis_hastings": "over separate links"}


def describe_round(topology: Topology, round_index: int, default_mixing: str) -> dict[str, str]:
    """Label → text of the graph of ``round_index`` (0-based): kind, nodes, edges, degrees,
    connected, mixing and the spectral gap of the rule the algorithm uses (the section's, or
    ``default_mixing``, the algorithm's, for ``mixing = "auto"``), range (random_geometric). The
    complete graph is described in closed form."""
    s, n = topology.section, topology.num_nodes
    block = topology.schedule.block_index(round_index)
    out = {"kind": s.kind, "nodes": str(n)}
    rule = topology.resolved_mixing(default_mixing)
    if topology.is_complete:
        edges, degrees, parts = n * (n - 1) // 2, np.full(n, n - 1), 1
        gap = complete_graph_gap(n, rule)
    else:
        g = topology.graph(round_index)
        edges, degrees, parts = g.num_edges, g.degrees, int(g.components.max()) + 1 if n else 0
        gap = spectral_gap(mixing_weights(g, rule))
    out["edges"] = f"{edges} (round {round_index + 1}, block {block}"
    out["edges"] += f" of every {s.coherence_rounds} rounds)" if s.coherence_rounds else ": the whole run)"
    out["degrees"] = f"min {int(degrees.min())}, mean {float(degrees.mean()):.6g}, max {int(degrees.max())}"
    out["connected"] = "yes" if parts <= 1 else f"no: {parts} parts"
    out["mixing"] = rule if s.mixing != "auto" else f"{rule} (auto: the algorithm's, {AUTO_RULES[rule]})"
    # Rounded as the summary's (Topology.describe): a bipartite graph's 0 is not shown as 1e-16.
    out["spectral gap"] = f"{round(gap, 12):.12g} ({rule})"
    out.update(topology.registration.details(topology))  # a kind's own lines (random_geometric: range, mobility)
    return out


def edge_list_text(topology: Topology, round_index: int) -> str:
    """The graph of ``round_index`` as an edge list file: a comment line, then ``i j`` per edge."""
    s, n = topology.section, topology.num_nodes
    if topology.is_complete and n * (n - 1) > MAX_ADJACENCY_ENTRIES:
        raise ConfigError("topology.kind", f"the complete graph of {n} nodes has {n * (n - 1) // 2} edges: "
                                           "too many to write")
    edges = topology.graph(round_index).edges()
    head = f"# testbed topology: kind {s.kind}, {n} nodes, round {round_index + 1}, seed {topology.seed}\n"
    return head + "".join(f"{i} {j}\n" for i, j in edges.tolist())
