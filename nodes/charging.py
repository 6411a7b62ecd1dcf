"""How an emulated or real node charges seconds and joules to its ledger events."""

from __future__ import annotations

from nodes.agent import Charger, host_charger


def make_charger(profile: str = "host", meter: str = "auto", pacing: bool = False) -> Charger:
    """The charger for a device profile and meter (``host``: host CPU seconds, no energy model)."""
    return host_charger
