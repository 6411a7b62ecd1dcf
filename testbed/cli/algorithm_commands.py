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
from typing import TYPE_CHECKING, Sequence

from testbed.cli.examples import epilog

if TYPE_CHECKING:
    from testbed.checked.sections import Config
    from testbed.data.federated import FederatedData
    from testbed.learning.models import Model


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
        command_parser.set_defaults(handler=command.run, experiments=EXPERIMENTS)
        firsts += lines[:1]
    parser.epilog = epilog(firsts) if firsts else None


class _Experiments:
    """The experiment files an algorithm's command reads (registry.Experiments), through the config
    and the assembly a run uses: the command line may import them, an algorithm's module may not."""

    def load(self, text: str, overrides: Sequence[str] = (), source: str = "<text>") -> "Config":
        from testbed.assembly.config import load_config_text

        return load_config_text(text, overrides, source=source)

    def load_file(self, path: str) -> "Config":
        from testbed.assembly.config import load_config

        return load_config(path)

    def data_and_model(self, config: "Config") -> tuple["FederatedData", "Model"]:
        from testbed.assembly.assemble import load_data, model_for

        data = load_data(config.data, config.run.seed)
        return data, model_for(config.model, data, config.run.seed)


#: Given to every algorithm's command as ``args.experiments``.
EXPERIMENTS = _Experiments()
