"""`testbed sweep FILE --grid key=v1,v2 ...`: run an experiment over a grid, in parallel, into one folder."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from testbed.arguments import COUNT

#: Bytes a sweep holds per run before any starts (its point, its config's TOML, its table row).
POINT_BYTES = 16 * 1024
#: Bytes a parallel run's process holds besides its run's own estimate (interpreter, numpy, pydantic).
WORKER_BYTES = 150 * 2**20


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
    from testbed import inputs
    from testbed.config import load_config
    from testbed.errors import UserError
    from testbed.limits import MAX_SEED
    from testbed.resources import check_count, estimate_bytes
    from testbed.orchestration.sweep import format_table, grid_points, parse_grid, run_sweep

    base = load_config(inputs.experiment_file(args.file), args.overrides)
    inputs.run_id(base.mqtt.run_id)
    grid = parse_grid(args.grid)
    if base.run.seed + args.repeats - 1 > MAX_SEED:
        raise UserError(f"--repeats {args.repeats}: seeds from run.seed {base.run.seed} would pass {MAX_SEED}")
    runs = math.prod(len(values) for values in grid.values()) * args.repeats
    check_count(runs, POINT_BYTES, "--grid and --repeats: a sweep of")  # before its points are made
    if args.workers is not None:
        check_count(min(args.workers, runs), WORKER_BYTES + sum(estimate_bytes(base).values()), "--workers")
    points = grid_points(grid, args.repeats, base.run.seed)
    out = args.out or Path(base.output.dir) / f"{base.run.name}-sweep"
    rows = run_sweep(base, points, out, engine=args.engine, workers=args.workers, quiet=args.quiet)
    if not args.quiet:
        print(format_table(rows))
        print(f"table: {out / 'sweep.csv'}")
        print(f"statistics per grid point: {out / 'sweep_stats.csv'} (testbed compare {out} --a ... --b ...)")
    return 0
