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
from testbed.assembly.config import json_schema
from testbed.cli import build_parser
from testbed.data import registry as datasets
from testbed.devices import profiles, virtual_boards
from testbed.learning.models import kinds as model_kinds
from testbed.mqtt.brokers import registry as brokers
from testbed.privacy.accountants import registry as accountants

#: axis → (its registered names, where the experiment file offers them: (section model, field), the
#: choices the config adds of its own, where the command line offers them: (command, flag)).
AXES: dict[str, tuple[Callable[[], list[str]], tuple[str, str] | None, tuple[str, ...], tuple[str, str] | None]] = {
    "algorithm": (algorithms.names, ("RunSection", "algorithm"), (), None),
    "data set": (datasets.names, ("DataSection", "dataset"), (), None),
    "model kind": (lambda: list(model_kinds()), ("ModelSection", "kind"), (), None),
    "accountant": (accountants.names, ("PrivacySection", "accountant"), (), None),
    "tight accountant": (accountants.tight_names, ("PrivacySection", "tight_accountant"), ("none",), None),
    "device profile": (lambda: list(profiles.PROFILE_NAMES), ("NodesSection", "profile"), (), None),
    "microcontroller profile": (lambda: list(profiles.MCU_PROFILE_NAMES), ("NodesSection", "mcu_profile"), (), None),
    "virtual board": (lambda: list(virtual_boards.names()), ("NodesSection", "mcu_board"), (), ("bridge", "--virtual")),
    "meter": (lambda: list(meters.kinds()), None, (), ("node", "--meter")),
    # `testbed acl` writes access files: it offers the brokers that have an access format.
    "managed broker": (lambda: [n for n, r in brokers.registrations().items() if r.access is not None], None, (),
                       ("acl", "--broker")),
}


def _cli_choices(command: str, flag: str) -> list[str]:
    parser = build_parser(command)
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    action = next(a for a in sub.choices[command]._actions if flag in a.option_strings)
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
    assert in_tree == {m.__name__ for m in (algorithms, datasets, accountants, meters, brokers)}
