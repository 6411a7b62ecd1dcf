"""``torus``: an R × C grid with wrap-around, R·C = N (``rows``: R, else the most square)."""

from testbed.topology import kinds
from testbed.topology.registry import Kind

REGISTRATION = Kind("torus", lambda topology, block, rng: kinds.torus(topology.num_nodes, topology.section.rows),
                    keys=("rows",), size_key="rows", expected_entries=lambda topology: 4.0 * topology.num_nodes,
                    order=2)
