"""`testbed runs [DIR]`: the runs under DIR (default: runs), one line each, like `flwr ls`."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    runs = sub.add_parser("runs", help="list the runs under a folder: name, algorithm, status, rounds, accuracy, ε, date")
    runs.add_argument("dir", type=Path, nargs="?", default=Path("runs"),
                      help="a folder of runs, or a sweep's folder (default: runs)")
    runs.add_argument("--json", action="store_true", help="print the runs as a JSON list")
    runs.set_defaults(handler=_runs)


def _runs(args: argparse.Namespace) -> int:
    from testbed.reports.runs import format_runs, list_runs, runs_json

    runs = list_runs(args.dir)
    print(runs_json(runs) if args.json else format_runs(runs))
    return 0
