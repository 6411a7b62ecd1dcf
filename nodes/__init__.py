"""What runs on a board: meters, the virtual clock, the node agent, and the device profiles' data
(profiles.toml, read by testbed.devices.profiles).

Kept light on purpose (no imports here): a node on a small board imports only what it runs.
"""
