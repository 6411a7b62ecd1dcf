"""Algorithms: a node step (what a node computes and sends) and a combine step (what the
coordinator or the channel makes of what the nodes sent), pure functions on arrays."""
