"""The sub-commands algorithms add to a command (`testbed privacy NAME`, `testbed plan NAME`), from
their registrations: the command line names no algorithm.

Example::

    >>> from testbed.cli import build_parser
    >>> build_parser("privacy").parse_args(["privacy", "acfl", "--dim", "2", "--outputs", "1",
    ...                                      "--sigma1-sq", "1", "--sigma2-sq", "1"]).algorithm
    'acfl'
"""

from __future__ import annotations

import argparse

from testbed.cli.examples import epilog


def command_name(algorithm: str) -> str:
    """The sub-command of the algorithm named ``algorithm``: its name with ``-`` for ``_``."""
    return algorithm.replace("_", "-")


def add_algorithm_commands(parser: argparse.ArgumentParser, hook: str) -> None:
    """Give ``parser`` a sub-command per algorithm whose hook ``hook`` (a :class:`Command` field of
    testbed.algorithms.registry.Registration) is set, in the registry's (name) order; the chosen
    algorithm's name is ``args.algorithm``, as the user typed it."""
    from testbed.algorithms import registry

    sub = parser.add_subparsers(dest="algorithm", required=True)
    parent = parser.prog.partition(" ")[2]  # "testbed privacy" → "privacy"
    firsts = []
    for reg in registry.offering(hook):
        command: registry.Command = getattr(reg, hook)
        lines = [f"{parent} {command_name(reg.name)} {arguments}".rstrip() for arguments in command.examples]
        command_parser = sub.add_parser(command_name(reg.name), help=command.help, epilog=epilog(lines) if lines else None)
        command.arguments(command_parser)
        command_parser.set_defaults(handler=command.run)
        firsts += lines[:1]
    parser.epilog = epilog(firsts) if firsts else None
