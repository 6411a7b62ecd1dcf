"""``k_regular``: a random ``degree``-regular graph (testbed.topology.kinds.k_regular)."""

from testbed.topology import kinds
from testbed.topology.registry import Kind

REGISTRATION = Kind("k_regular", lambda topology, block, rng: kinds.k_regular(topology.num_nodes,
                                                                               topology.section.degree, rng),
                    keys=("degree",), size_key="degree", random=True,
                    expected_entries=lambda topology: float(topology.num_nodes) * topology.section.degree, order=3)
