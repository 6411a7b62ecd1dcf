"""The `testbed` command line. User errors print one line and exit 2; no traceback for them.

Each command lives in its own module here with a ``register(subparsers)`` function; COMMANDS lists
them in the order `testbed --help` shows.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import sys
from typing import NoReturn

from testbed.checked.arguments import HelpFormatter
from testbed.cli.examples import EXAMPLES, epilog
from testbed.errors import UserError
from testbed.util.extras import check_installed, missing_package_message

#: The install extra (pyproject.toml) a command needs whatever the experiment; checked before it runs.
EXTRA_OF_COMMAND = {"run": "coordinator", "audit": "coordinator", "sweep": "coordinator", "compare": "coordinator", "report": "coordinator", "plan": "coordinator",
                    "scene": "coordinator", "broker": "coordinator", "watch": "watch", "node": "node", "nodes": "node", "bridge": "bridge"}
#: Commands registered by another command's module.
_MODULE_OF = {"nodes": "node"}
COMMANDS = ("run", "watch", "report", "runs", "privacy", "audit", "node", "bridge", "broker", "acl", "provision", "board", "plan", "sweep", "compare", "calibrate", "topology", "scene", "schema", "new")


class Parser(argparse.ArgumentParser):
    """argparse whose errors are UserErrors: `main` prints them as its one line and exits 2, no
    usage block (``--help`` shows it). Sub-commands' parsers are of this class too, and state
    numeric arguments' ranges (testbed.checked.arguments.HelpFormatter)."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def format_help(self) -> str:
        # An epilog that is costly to write (the run command's names every algorithm's robust rule,
        # importing them all) is a function, written when the help is shown, not at every start.
        if callable(self.epilog):
            self.epilog = self.epilog()
        return super().format_help()

    def error(self, message: str) -> NoReturn:
        command = self.prog.partition(" ")[2]  # "testbed privacy dp-pasgd" → "privacy dp-pasgd"
        raise UserError(f"{command + ': ' if command else ''}{' '.join(message.split())} (see {self.prog} --help)")


def build_parser(command: str | None = None, commands: bool = True) -> Parser:
    """The command line's parser with the command ``command`` (a word of argv) registered, or every
    command when it names none; none with ``commands=False`` (``testbed --version``)."""
    parser = Parser(prog="testbed", description="Private federated learning on wireless IoT, hardware in the loop.",
                    epilog=epilog(EXAMPLES["run"][:1] + EXAMPLES["report"][:1]) + "\n\n`testbed COMMAND --help` "
                                                                                    "shows each command's own")
    parser.add_argument("--version", action="version", version=f"testbed {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    # Only the command asked for is imported (a board's `testbed node` or a short run does not pay
    # for every command's imports); `testbed`, `testbed --help` or an unknown command list them all.
    chosen = _MODULE_OF.get(command, command)
    for name in ((chosen,) if chosen in COMMANDS else COMMANDS) if commands else ():
        importlib.import_module(f"testbed.cli.{name}").register(sub)
    for name, command_parser in sub.choices.items():
        if name in EXAMPLES:  # the algorithms' commands (privacy, plan) have theirs from the registry
            command_parser.epilog = epilog(EXAMPLES[name])
        if name == "run":
            command_parser.epilog = functools.partial(_with_robust_help, command_parser.epilog)
    return parser


def _with_robust_help(epilog: str) -> str:
    return epilog + "\n\n" + robust_help()


def robust_help() -> str:
    """``testbed run --help``'s block naming each averaging algorithm's robust rule and its cost
    (its registration's ``robust_choice``)."""
    from testbed.algorithms import registry

    lines = ["robust aggregation against hostile nodes inside the bounds (docs/robust-aggregation.md): the",
             "rule that held at 10 % hostile in the benchmark, per algorithm (--set ALGORITHM.aggregation=RULE):"]
    lines += [f"  {reg.name:<9} {reg.robust_choice.rule:<18} {reg.robust_choice.cost}"
              for reg in registry.offering("robust_choice")]
    return "\n".join(lines)


def _version() -> str:
    """The package's version: testbed.__version__, the one place it is written (pyproject.toml's
    dynamic version reads it, so an installed wheel's metadata says the same)."""
    from testbed import __version__

    return __version__


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        # Inside: the parser's choices come from the registries, where a broken plugin is a UserError.
        # `testbed --version` answers before any command is needed: none is imported for it.
        parser = build_parser(next((a for a in argv if not a.startswith("-")), None), commands=argv != ["--version"])
        args = parser.parse_args(argv)
        if args.command in EXTRA_OF_COMMAND:
            check_installed(EXTRA_OF_COMMAND[args.command], args.command)
        code = args.handler(args)
        sys.stdout.flush()  # a reader gone is found here, not in the interpreter's flush at exit
        return code
    except UserError as exc:
        print(f"testbed: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:  # a board has only dpfl-testbed[node]; say what to install
        message = missing_package_message(exc)
        if message is None:
            raise
        print(f"testbed: {args.command} {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("testbed: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `testbed runs | head`: the reader has what it wanted
        return _reader_gone()


def program() -> NoReturn:
    """The `testbed` program (its console script and ``python -m testbed``): :func:`main`, then
    out of the process once everything is written (stdout and stderr flushed, the other threads'
    work ended as the interpreter ends it, the exit handlers run: logging's flush among them), but
    without the interpreter's teardown of every module and object: 60-80 ms of a J1 run after its
    last file was closed, and a third of `testbed --version`. Under a profiler or a tracer
    (``python -m cProfile -m testbed``, coverage) it ends as the interpreter does. Python callers
    use :func:`main`, which returns. OpenBLAS loads with one thread (testbed.util.threads)."""
    import atexit
    import os
    import threading

    from testbed.util.threads import one_blas_thread_at_load

    one_blas_thread_at_load()  # before any command imports numpy
    try:
        code = main()
    except SystemExit as exit:  # argparse's --help and --version
        if exit.code is not None and not isinstance(exit.code, int):
            raise
        code = exit.code or 0
    if sys.getprofile() is not None or sys.gettrace() is not None:
        sys.exit(code)  # a profiler or coverage writes its figures as the interpreter ends: let it
    threading._shutdown()  # type: ignore[attr-defined]  what the interpreter's exit does first: the pools' threads end
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (BrokenPipeError, ValueError):  # the reader left; a stream closed: nothing more to say
            pass
    os._exit(code)


def _reader_gone() -> int:
    """The reader of stdout left (a pager, ``head``): stop quietly, as a Unix tool does. stdout is
    pointed at /dev/null so the interpreter's flush at exit does not raise again."""
    import os

    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is not a file (a test's capture): nothing to flush
        pass
    return 128 + 13  # killed by SIGPIPE, as the shell reports it
