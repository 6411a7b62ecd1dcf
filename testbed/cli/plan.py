"""`testbed plan ALGORITHM [FILE]`: choose an algorithm's design from budgets before running it, one
sub-command per algorithm that registers a planner (``Registration.plan_cli``)."""

from __future__ import annotations

import argparse

from testbed.cli.algorithm_commands import add_algorithm_commands


def register(sub: argparse._SubParsersAction) -> None:
    planner = sub.add_parser("plan", help="choose an algorithm's design from its budgets")
    add_algorithm_commands(planner, "plan_cli")
