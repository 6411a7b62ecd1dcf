"""``erdos_renyi``: G(N, p), every pair independently with probability ``p``."""

from testbed.topology import kinds
from testbed.topology.registry import Kind


def _entries(topology) -> float:
    n = topology.num_nodes
    return topology.section.p * n * (n - 1)


REGISTRATION = Kind("erdos_renyi", lambda topology, block, rng: kinds.erdos_renyi(topology.num_nodes,
                                                                                   topology.section.p, rng),
                    keys=("p",), size_key="p", random=True, expected_entries=_entries, order=4)
