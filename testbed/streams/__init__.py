"""Random streams: every draw of a run keyed by (seed, node, round, purpose) (rng), the portable
counter-based generator a microcontroller draws from (counter_rng), and a node's secret that keys
its private draws (node_secret). Below everything that draws."""
