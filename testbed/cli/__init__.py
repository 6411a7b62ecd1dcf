"""The `testbed` command line. User errors print one line and exit 2; no traceback for them.

Each command lives in its own module here with a ``register(subparsers)`` function; COMMANDS lists
them in the order `testbed --help` shows.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from testbed.errors import UserError
from testbed.extras import check_installed, missing_package_message

#: The install extra (pyproject.toml) a command needs whatever the experiment; checked before it runs.
EXTRA_OF_COMMAND = {"run": "coordinator", "sweep": "coordinator", "report": "coordinator", "plan": "coordinator",
                    "broker": "coordinator", "node": "node", "nodes": "node", "bridge": "bridge"}
COMMANDS = ("run", "report", "privacy", "node", "bridge", "broker", "acl", "provision", "plan", "sweep", "calibrate", "schema")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="testbed", description="Private federated learning on wireless IoT, hardware in the loop.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        importlib.import_module(f"testbed.cli.{name}").register(sub)
    args = parser.parse_args(argv)
    try:
        if args.command in EXTRA_OF_COMMAND:
            check_installed(EXTRA_OF_COMMAND[args.command], args.command)
        return args.handler(args)
    except UserError as exc:
        print(f"testbed: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:  # a board has only testbed[node]; say what to install
        message = missing_package_message(exc)
        if message is None:
            raise
        print(f"testbed: {args.command} {message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("testbed: interrupted", file=sys.stderr)
        return 130
