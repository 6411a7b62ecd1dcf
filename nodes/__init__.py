"""What runs on a board: device profiles, meters, the virtual clock, the node agent.

Kept light on purpose (no imports here): a node on a small board imports only what it runs.
"""
