"""Every extension axis has a registry, and what a user chooses from comes from it: the experiment
file's choices (its JSON Schema), the node file's and the command line's. One table lists them all;
each axis's own tests (tests/test_registry_*.py, test_algorithm_hooks.py) add a module and see it
appear.
"""

from __future__ import annotations

import argparse
from typing import Callable

import pytest

from nodes.meters import registry as meters
from testbed.algorithms import registry as algorithms
from testbed.algorithms.aggregations import registry as aggregations
from testbed.assembly.config import json_schema
from testbed.cli import build_parser
from testbed.data import registry as datasets
from testbed.devices import profiles, virtual_boards
from testbed.learning.models import kinds as model_kinds
from testbed.mqtt.brokers import registry as brokers
from testbed.privacy.accountants import registry as accountants
from testbed.topology import registry as topologies
from testbed.util.registrations import GROUPS

#: axis → (its registered names, where the experiment file offers them: (section model, field), the
#: choices the config adds of its own, where the command line offers them: (command, flag)).
AXES: dict[str, tuple[Callable[[], list[str]], tuple[str, str] | None, tuple[str, ...], tuple[str, str] | None]] = {
    "algorithm": (algorithms.names, ("RunSection", "algorithm"), (), None),
    "data set": (datasets.names, ("DataSection", "dataset"), (), None),
    "model kind": (lambda: list(model_kinds()), ("ModelSection", "kind"), (), None),
    "accountant": (accountants.names, ("PrivacySection", "accountant"), (), None),
    "tight accountant": (accountants.tight_names, ("PrivacySection", "tight_accountant"), ("none",), None),
    "device profile": (lambda: list(profiles.profile_names()), ("NodesSection", "profile"), (), None),
    "microcontroller profile": (lambda: list(profiles.mcu_profile_names()), ("NodesSection", "mcu_profile"), (), None),
    "virtual board": (lambda: list(virtual_boards.names()), ("NodesSection", "mcu_board"), (), ("bridge", "--virtual")),
    "meter": (lambda: list(meters.kinds()), None, (), ("node", "--meter")),
    # `testbed acl` writes access files: it offers the brokers that have an access format.
    "managed broker": (lambda: [n for n, r in brokers.registrations().items() if r.access is not None], None, (),
                       ("acl", "--broker")),
    "topology kind": (topologies.names, ("TopologySection", "kind"), (), None),
    # `testbed privacy dwfl --topology`: the kinds drawn from flags alone (not placed by a radio).
    "topology kind (flags)": (lambda: [n for n, k in topologies.registrations().items() if not k.placed_by_radio],
                              None, (), ("privacy dwfl", "--topology")),
    "aggregation rule": (aggregations.names, ("FedAvgSection", "aggregation"), (), None),
}


def _cli_choices(command: str, flag: str) -> list[str]:
    """The choices of ``flag`` of ``command`` (words: "privacy dwfl" is a sub-command's)."""
    words = command.split()
    parser = build_parser(words[0])
    for word in words:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[word]
    action = next(a for a in parser._actions if flag in a.option_strings)
    return list(action.choices)


@pytest.mark.parametrize("axis", AXES)
def test_the_choices_come_from_the_registry(axis):
    names, field, extra, cli = AXES[axis]
    registered = names()
    assert registered and len(set(registered)) == len(registered), f"{axis}: no entries, or one twice"
    if field is not None:
        section, key = field
        enum = json_schema()["$defs"][section]["properties"][key]["enum"]
        assert sorted(enum) == sorted([*registered, *extra]), f"{axis}: schema {enum} vs registry {registered}"
    if cli is not None:
        choices = _cli_choices(*cli)
        assert [c for c in choices if c != "auto"] == [n for n in registered if n != "auto"], \
            f"{axis}: {cli[0]} {cli[1]} offers {choices}, the registry {registered}"


def test_the_table_names_every_registry():
    """Every module named registry.py in the tree is one whose axes the table lists: a new registry
    fails here until its choices are checked above."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    in_tree = {".".join(p.relative_to(root).with_suffix("").parts)
               for package in ("testbed", "nodes", "firmware_bridge") for p in (root / package).rglob("registry.py")}
    assert in_tree == {m.__name__ for m in (algorithms, datasets, accountants, meters, brokers, topologies, aggregations)}


def test_every_axis_has_an_entry_point_group():
    """The groups a plugin names its modules under (docs/extending.md): one per axis, each
    ``testbed.`` and the axis."""
    assert set(GROUPS.values()) == {"testbed.algorithms", "testbed.datasets", "testbed.accountants",
                                    "testbed.board_profiles", "testbed.meters", "testbed.brokers",
                                    "testbed.topologies", "testbed.aggregations"}


def test_the_installed_entry_points_are_read_once_a_process(monkeypatch):
    """Each read of the installed distributions' entry points opens every distribution's metadata;
    a run reads several registries before round 1 (issue 44), so it is read once for all of them."""
    from testbed.util import registrations

    reads = []
    real = registrations.entry_points
    monkeypatch.setattr(registrations, "entry_points", lambda: reads.append(1) or real())
    registrations._installed_entry_points.cache_clear()
    try:
        for group in GROUPS.values():
            registrations.plugin_sources(group)
        assert len(reads) == 1
    finally:
        registrations._installed_entry_points.cache_clear()
