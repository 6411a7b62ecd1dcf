"""`testbed privacy NAME`: what an algorithm's privacy figures mean, and its paper's calculator.

One sub-command per privacy statement an algorithm registers (``Registration.privacy_statements``,
testbed.privacy.statements). With no arguments (or only ``--json``) it prints the statement, the
lines docs/privacy.md is generated from; with its calculator's arguments (``Registration.privacy_cli``,
where the algorithm has one) it runs the paper's privacy calculator. A calculator's required
arguments are required only once one of its arguments is given.
"""

from __future__ import annotations

import argparse
import json

from testbed.cli.algorithm_commands import EXPERIMENTS, command_name
from testbed.cli.examples import epilog
from testbed.errors import UserError

#: Arguments that are not a calculator's inputs.
_NOT_INPUTS = ("help", "json")


def register(sub: argparse._SubParsersAction) -> None:
    from testbed.algorithms import registry

    privacy = sub.add_parser("privacy", help="what each algorithm's privacy figures mean, and the papers' privacy "
                                             "calculators")
    commands = privacy.add_subparsers(dest="algorithm", required=True)
    firsts: list[str] = []
    for reg in registry.registrations().values():
        own = next((s for s in reg.privacy_statements if s.name == reg.name), None)
        if own is not None or reg.privacy_cli is not None:  # an algorithm without a statement: its calculator alone
            _add(commands, reg.name, own, reg.privacy_cli, firsts)
        for variant in reg.privacy_statements:
            if command_name(variant.name) not in commands.choices:
                _add(commands, variant.name, variant, None, firsts)
    privacy.epilog = epilog(firsts[:3])


def _add(commands: argparse._SubParsersAction, name: str, statement, calculator, firsts: list[str]) -> None:
    """The sub-command ``name``: the statement bare, the calculator with its arguments."""
    command = command_name(name)
    lines = ([f"privacy {command}"] if statement else []) + \
        [f"privacy {command} {a}".rstrip() for a in (calculator.examples if calculator else ())]
    helps = ([f"{statement.title}: its privacy statement"] if statement else []) + ([calculator.help] if calculator else [])
    parser = commands.add_parser(command, help="; ".join(helps), epilog=epilog(lines) if lines else None)
    parser.set_defaults(experiments=EXPERIMENTS)
    if calculator is not None:
        calculator.arguments(parser)
    if statement is None:
        parser.set_defaults(handler=calculator.run)
        return
    if not any(a.dest == "json" for a in parser._actions):
        parser.add_argument("--json", action="store_true")
    parser.set_defaults(handler=_handler(statement, calculator, parser, _optional_inputs(parser)))
    firsts += lines[-1:]


def _optional_inputs(parser: argparse.ArgumentParser) -> tuple[list[argparse.Action], list]:
    """Make the calculator's required arguments (and required exclusive groups) optional, so the
    bare command prints the statement; return them, to require once any input is given."""
    required = [a for a in parser._actions if a.required]
    groups = [g for g in parser._mutually_exclusive_groups if g.required]
    for item in (*required, *groups):
        item.required = False
    return required, groups


def _handler(statement, calculator, parser: argparse.ArgumentParser, inputs):
    required, groups = inputs
    given_any = [a for a in parser._actions if a.dest not in _NOT_INPUTS]

    def run(args: argparse.Namespace) -> int:
        if not any(getattr(args, a.dest, None) != a.default for a in given_any):
            if args.json:
                print(json.dumps({"name": statement.name, "title": statement.title,
                                  "lines": [{"label": k, "text": v} for k, v in statement.fields()]},
                                 ensure_ascii=False, allow_nan=False))
            else:
                print("\n".join(statement.lines()))
            return 0
        missing = [a.option_strings[0] for a in required if getattr(args, a.dest, None) is None]
        missing += [" or ".join(a.option_strings[0] for a in g._group_actions) for g in groups
                    if all(getattr(args, a.dest, None) is None for a in g._group_actions)]
        if missing:
            raise UserError(f"privacy {command_name(statement.name)}: the calculator needs {', '.join(missing)} "
                            f"(with no arguments: the privacy statement)")
        return calculator.run(args)

    return run
