"""`testbed compare SWEEP_DIR --a KEY=VALUE... --b KEY=VALUE...`: paired comparison of a sweep's
grid points (runs paired by seed), Holm-corrected over every --b and --metric; a thin layer over
testbed.reports.compare.compare."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    cmp = sub.add_parser("compare", help="paired comparison of a sweep's settings (runs paired by seed)")
    cmp.add_argument("sweep_dir", type=Path, help="a sweep folder (testbed sweep --out; it holds sweep.csv)")
    cmp.add_argument("--a", nargs="+", required=True, metavar="KEY=VALUE",
                     help="the first setting: grid values, e.g. --a dp_pasgd.tau=1 (a key's last part will do)")
    cmp.add_argument("--b", nargs="+", action="append", required=True, metavar="KEY=VALUE",
                     help="a setting to compare with --a (repeatable: every one is compared with --a)")
    cmp.add_argument("--metric", action="append", metavar="NAME",
                     help="a numeric column of sweep.csv (repeatable; default test_accuracy)")
    better = cmp.add_mutually_exclusive_group()
    better.add_argument("--higher-is-better", dest="higher_is_better", action="store_const", const=True,
                        help="for every metric (default: per metric, testbed.reports.compare.HIGHER_IS_BETTER)")
    better.add_argument("--lower-is-better", dest="higher_is_better", action="store_const", const=False)
    cmp.add_argument("--json", action="store_true", help="print the comparisons as a JSON list")
    cmp.set_defaults(handler=_compare)


def _compare(args: argparse.Namespace) -> int:
    from testbed.reports.compare import DEFAULT_METRIC, compare, comparisons_json, format_comparisons, parse_setting

    comparisons = compare(args.sweep_dir, parse_setting(args.a, "--a"), [parse_setting(b, "--b") for b in args.b],
                          metrics=args.metric or [DEFAULT_METRIC], higher_is_better=args.higher_is_better)
    print(comparisons_json(comparisons) if args.json else format_comparisons(comparisons))
    return 0
