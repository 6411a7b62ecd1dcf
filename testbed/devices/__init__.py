"""Board kinds: device profiles, microcontroller profiles and virtual boards, found through registries.

Each kind's declarations are data kept beside what runs it (``nodes/profiles.toml``,
``firmware_bridge/boards.toml``, a ``board.toml`` in each ``firmware_bridge/firmware/boards/``
folder); the registries here read them as data, so the config (testbed.assembly) takes its choices
from them without importing a layer above it. Meters are a registry of their own (``nodes.meters``):
they run code on the board.
"""
