"""What the topology tests of the watch page and `testbed topology` share: DWFL declaring
``[topology]`` (its registration does once issue 32's DWFL on a graph is in; until then this
fixture declares it for the test), and a small DWFL experiment."""

from __future__ import annotations

import dataclasses

import pytest

from testbed.algorithms import registry
from testbed.assembly import config as config_module
from testbed.topology import TopologySection

DWFL_TEXT = """
[run]
name = "g"
algorithm = "dwfl"
seed = 3
[data]
dataset = "synthetic"
num_nodes = {num_nodes}
samples_per_node = 40
dim = 4
[dwfl]
rounds = 6
batch = 8
lr = 0.3
epsilon = 0.5
noise_power_w = 1e-9
[output]
figures = false
"""


def dwfl_text(num_nodes: int = 12, topology: str = "") -> str:
    """A small DWFL experiment, with ``topology`` (TOML lines) as its [topology] section."""
    return DWFL_TEXT.format(num_nodes=num_nodes) + (f"[topology]\n{topology}\n" if topology else "")


@pytest.fixture
def dwfl_topology(monkeypatch):
    """DWFL with [topology] among its sections (a no-op once its registration declares it)."""
    regs = registry.registrations()
    if "topology" in regs["dwfl"].sections:
        yield
        return
    declared = dataclasses.replace(regs["dwfl"], sections={**regs["dwfl"].sections, "topology": TopologySection})
    monkeypatch.setitem(regs, "dwfl", declared)
    config_module._section_classes.cache_clear()
    config_module._config_model.cache_clear()
    yield
    monkeypatch.undo()
    config_module._section_classes.cache_clear()
    config_module._config_model.cache_clear()
