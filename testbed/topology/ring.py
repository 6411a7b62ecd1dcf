"""``ring``: node i joined to i ± 1 (mod N)."""

from testbed.topology import kinds
from testbed.topology.registry import Kind

REGISTRATION = Kind("ring", lambda topology, block, rng: kinds.ring(topology.num_nodes),
                    expected_entries=lambda topology: 2.0 * topology.num_nodes, order=1)
