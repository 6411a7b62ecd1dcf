"""`testbed watch RUN_DIR`: a live web page of a run (running, finished or killed); read-only."""

from __future__ import annotations

import argparse
import ipaddress
import sys
from pathlib import Path

from testbed.checked.arguments import PORT
from testbed.errors import UserError
from testbed.util.extras import check_installed

DEFAULT_PORT = 8765


def register(sub: argparse._SubParsersAction) -> None:
    watch = sub.add_parser("watch", help="a live web page of a run: progress, curves, every node's budgets")
    watch.add_argument("run_dir", type=Path, help="the run's directory (it may not exist yet)")
    add_server_options(watch)
    watch.set_defaults(handler=_watch)


def add_server_options(parser: argparse.ArgumentParser, prefix: str = "") -> None:
    """--port and --host (shared with `testbed run --watch`)."""
    parser.add_argument("--port", type=PORT, default=DEFAULT_PORT, help=f"the page's port (default {DEFAULT_PORT})")
    parser.add_argument("--host", default="127.0.0.1",
                        help="the address to listen on (default 127.0.0.1: this machine only)")


def check_server_options(args: argparse.Namespace) -> None:
    """One line naming the option if --host is not usable (--port's type checked its range)."""
    try:
        ipaddress.ip_address(args.host)
    except ValueError:
        if args.host != "localhost":
            raise UserError(f"--host must be an IP address or localhost, got {args.host!r}") from None


def _watch(args: argparse.Namespace) -> int:
    check_server_options(args)
    if args.run_dir.exists() and not args.run_dir.is_dir():
        raise UserError(f"{args.run_dir} is not a directory")
    check_installed("coordinator", "watch")  # the watch extra itself is checked by testbed.cli.main
    from testbed.watch.server import serve

    try:
        serve(args.run_dir, host=args.host, port=args.port,
              print_url=lambda url: print(f"watching {args.run_dir} at {url} (Ctrl-C to stop)", flush=True))
    except OSError as exc:  # the port is taken, or the address is not this machine's
        raise UserError(f"cannot listen on {args.host}:{args.port}: {exc.strerror or exc}") from None
    print("", file=sys.stderr)
    return 0
