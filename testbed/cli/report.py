"""`testbed report RUN_DIR`: redraw a run's figures from its files and print its summary;
``--json``: print only the summary, as JSON (no figures drawn); ``--html``: write one self-contained
report.html of the run, or of a sweep folder."""

from __future__ import annotations

import argparse
from pathlib import Path

from testbed.errors import UserError
from testbed.util import jsontext


def register(sub: argparse._SubParsersAction) -> None:
    report = sub.add_parser("report", help="redraw a run's figures and print its summary")
    report.add_argument("run_dir", type=Path, help="a run directory (or, with --html, a sweep folder)")
    report.add_argument("--html", action="store_true",
                        help="write RUN_DIR/report.html: summary, figures, nodes, config in one file")
    report.add_argument("--json", action="store_true", help="print the run's summary.json (checked) and nothing else")
    report.set_defaults(handler=_report)


def _report(args: argparse.Namespace) -> int:
    from testbed.cli.run import format_summary
    from testbed.reports.plots import draw_figures
    from testbed.reports.results import read_summary
    from testbed.util.dirlock import DirectoryLock

    if args.json and args.html:
        raise UserError("report: --json and --html are exclusive")
    if args.json:
        print(jsontext.dumps(read_summary(args.run_dir), indent=2))
        return 0
    if args.html:
        from testbed.reports.html import write_report

        print(write_report(args.run_dir))
        return 0
    if not (args.run_dir / "summary.json").exists():
        raise UserError(f"{args.run_dir} has no summary.json; not a run directory")
    with DirectoryLock(args.run_dir):  # refused while a run writes it
        for path in draw_figures(args.run_dir):
            print(path)
    print(format_summary(read_summary(args.run_dir)))
    return 0
