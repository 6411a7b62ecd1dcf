"""`testbed sweep FILE --grid key=v1,v2 ...`: run an experiment over a grid, in parallel, into one folder."""

from __future__ import annotations

import argparse
from pathlib import Path

from testbed.checked.arguments import COUNT

#: The options that set a sweep's size, as its refusals name them.
SIZE_OPTIONS = {"grid": "--grid", "repeats": "--repeats", "workers": "--workers"}


def register(sub: argparse._SubParsersAction) -> None:
    sweep = sub.add_parser("sweep", help="run an experiment over a grid of values (local processes or Ray)")
    sweep.add_argument("file", type=Path)
    sweep.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2,...", required=True,
                       help="values of one key, e.g. --grid dp_pasgd.tau=1,5,10 (repeatable: cartesian product)")
    sweep.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                       help="override a key for every run (repeatable)")
    sweep.add_argument("--repeats", type=COUNT, default=1, help="runs per grid point, seeds run.seed, run.seed+1, ...")
    sweep.add_argument("--engine", choices=["local", "ray"], default="local",
                       help="local processes (default) or a Ray cluster ($RAY_ADDRESS, else a local instance)")
    sweep.add_argument("--workers", type=COUNT, help="parallel runs (default: CPU count; ray: the whole cluster)")
    sweep.add_argument("--out", type=Path, help="the sweep's folder (default: output.dir/NAME-sweep); "
                                                "rerunning into it skips finished runs")
    sweep.add_argument("--quiet", action="store_true", help="no progress lines, no table")
    sweep.set_defaults(handler=_sweep)


def _sweep(args: argparse.Namespace) -> int:
    from testbed.assembly.experiment import experiment_config
    from testbed.orchestration.sweep import default_sweep_dir, format_table, parse_grid, planned_points, run_sweep

    base = experiment_config(args.file, args.overrides)
    points = planned_points(base, parse_grid(args.grid), args.repeats, args.workers, SIZE_OPTIONS)
    out = args.out or default_sweep_dir(base)
    rows = run_sweep(base, points, out, engine=args.engine, workers=args.workers, quiet=args.quiet)
    if not args.quiet:
        print(format_table(rows))
        print(f"table: {out / 'sweep.csv'}")
        print(f"statistics per grid point: {out / 'sweep_stats.csv'} (testbed compare {out} --a ... --b ...)")
    return 0
