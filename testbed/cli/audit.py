"""`testbed audit FILE`: run the experiment in sim with canary gradients in its Gaussian releases and
print the one-run empirical lower bound on ε beside the ε its ledger claims
(testbed.orchestration.audit)."""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from testbed.checked.arguments import Number
from testbed.checked.limits import MAX_SEED
from testbed.errors import UserError

#: The most canaries one audit plants (each is a coordinate of some node's release).
MAX_CANARIES = 10_000_000
#: The most runs one membership test makes.
MAX_RUNS = 10_000


def register(sub: argparse._SubParsersAction) -> None:
    audit = sub.add_parser("audit", help="empirical lower bound on epsilon from one run with canaries")
    audit.add_argument("file", type=Path, help="the experiment file")
    audit.add_argument("--canaries", type=Number(int, ge=1, le=MAX_CANARIES),
                       help="canary gradients per run, spread evenly over the nodes (rounded up to a multiple of "
                            "them; default 1000 for one run, one per node with --runs)")
    audit.add_argument("--runs", type=Number(int, ge=1, le=MAX_RUNS), default=1,
                       help="1: the one-run bound (Steinke et al. 2023); more: the membership test of Jagielski et al. "
                            "2020 over that many runs (seeds run.seed, run.seed+1, ...), for a delta too large for one run")
    audit.add_argument("--confidence", type=Number(float, gt=0, lt=1), default=0.95,
                       help="the lower bound's confidence level (default 0.95)")
    audit.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                       help="override any key, as `testbed run --set` (e.g. fewer rounds: --set dwfl.rounds=20)")
    audit.add_argument("--seed", type=Number(int, ge=0, le=MAX_SEED), help="the run's seed (run.seed)")
    audit.add_argument("--out", type=Path, help="keep the audited run in this directory (default: a temporary one)")
    audit.set_defaults(handler=_audit)


def _audit(args: argparse.Namespace) -> int:
    from testbed.assembly.experiment import experiment_config
    from testbed.checked import inputs
    from testbed.orchestration.audit import audit_run
    from testbed.reports.results import holds_run

    config = experiment_config(args.file, args.overrides, mode="sim", seed=args.seed)
    if args.out is not None:
        if holds_run(args.out) or (args.runs > 1 and any(holds_run(d) for d in args.out.glob("s*"))):
            raise UserError(f"audit: --out {args.out} already holds a run; choose another")
        inputs.output_dir(args.out, "--out")
        report = audit_run(config, args.out, canaries=args.canaries, confidence=args.confidence, runs=args.runs)
    else:
        with tempfile.TemporaryDirectory(prefix="testbed-audit-") as tmp:
            report = audit_run(config, Path(tmp) / "run", canaries=args.canaries, confidence=args.confidence,
                               runs=args.runs)
    print("\n".join(report.lines()))
    if args.out is not None:
        print(f"run: {args.out}")
    return 0
