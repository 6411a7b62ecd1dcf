"""``complete``: every node hears every other (DWFL's paper)."""

from testbed.topology.registry import COMPLETE, Kind
from testbed.topology.graph import Graph


def _draw(topology, block, rng):
    # Built only by algorithms without a dense path (the baselines): Topology refuses it above the
    # adjacency limit before it gets here.
    return Graph.complete(topology.num_nodes)


REGISTRATION = Kind(COMPLETE, _draw, order=0)
