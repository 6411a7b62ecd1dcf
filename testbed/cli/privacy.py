"""`testbed privacy ALGORITHM ...`: the papers' privacy calculators, one sub-command per algorithm
that registers one (``Registration.privacy_cli``)."""

from __future__ import annotations

import argparse

from testbed.cli.algorithm_commands import add_algorithm_commands


def register(sub: argparse._SubParsersAction) -> None:
    privacy = sub.add_parser("privacy", help="privacy calculators")
    add_algorithm_commands(privacy, "privacy_cli")
