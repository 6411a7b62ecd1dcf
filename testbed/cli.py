"""The `testbed` command line. User errors print one line and exit 2; no traceback for them."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from testbed.errors import UserError


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        return args.handler(args)
    except UserError as exc:
        print(f"testbed: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("testbed: interrupted", file=sys.stderr)
        return 130


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="testbed", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run an experiment file")
    run.add_argument("file", type=Path)
    run.add_argument("--mode", choices=["sim"], help="where the nodes run (default: run.mode of the file)")
    run.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                     help="override any key, e.g. --set dp_pasgd.tau=5 (repeatable)")
    run.add_argument("--seed", type=int, help="the run's seed (run.seed)")
    run.add_argument("--out", type=Path, help="the run directory (default: output.dir/NAME-TIME-sSEED)")
    run.add_argument("--quiet", action="store_true", help="no progress bar, no summary table")
    run.set_defaults(handler=_cmd_run)

    privacy = sub.add_parser("privacy", help="privacy calculators")
    psub = privacy.add_subparsers(dest="algorithm", required=True)
    dp = psub.add_parser("dp-pasgd", help="ε of eq. (9) for σ, or σ for a target ε")
    dp.add_argument("--steps", type=int, required=True, help="K, local steps per device")
    dp.add_argument("--lipschitz", type=float, required=True, help="G, per-sample gradient bound")
    dp.add_argument("--batch", type=int, required=True, help="X, mini-batch size")
    dp.add_argument("--delta", type=float, required=True)
    group = dp.add_mutually_exclusive_group(required=True)
    group.add_argument("--sigma", type=float, help="noise std per coordinate")
    group.add_argument("--epsilon", type=float, help="target ε: prints the calibrated σ")
    dp.add_argument("--calibration", choices=["corrected", "paper_literal"], default="corrected",
                    help="σ from ε: the correct root of eq. (9), or eq. (23) as printed (not private)")
    dp.add_argument("--json", action="store_true")
    dp.set_defaults(handler=_cmd_privacy_dp_pasgd)

    report = sub.add_parser("report", help="redraw a run's figures and print its summary")
    report.add_argument("run_dir", type=Path)
    report.set_defaults(handler=_cmd_report)
    return parser


def _cmd_run(args: argparse.Namespace) -> int:
    from testbed.config import load_config
    from testbed.runner import run_experiment

    overrides = list(args.overrides)
    if args.mode:
        overrides.append(f"run.mode={args.mode!r}")
    if args.seed is not None:
        overrides.append(f"run.seed={args.seed}")
    config = load_config(args.file, overrides)
    result = run_experiment(config, out_dir=args.out, quiet=args.quiet)
    if not args.quiet:
        print(format_summary(result.summary))
    return 0


def format_summary(summary: dict) -> str:
    """A short table of a run's outcome for the terminal."""
    nodes = summary["nodes"].values()
    eps = [n["epsilon"] for n in nodes]
    tight = [n["epsilon_tight"] for n in nodes if n["epsilon_tight"] is not None]
    cost = [n["cost_units"] for n in nodes]
    lines = [
        f"run          {summary['run_dir']}",
        f"status       {summary['status']}" + (
            f" ({summary['stopped']['budget']} budget of node {summary['stopped']['node']}: "
            f"{summary['stopped']['would_be']:.6g} > {summary['stopped']['limit']:.6g})" if summary.get("stopped") else ""),
        f"algorithm    {summary['algorithm']} ({summary['mode']}, seed {summary['seed']}, "
        f"{summary['rounds']} rounds, {len(eps)} nodes)",
        f"test acc     {summary['final']['test_accuracy']:.4f}   train loss {summary['final']['train_loss']:.4f}",
        f"epsilon      {min(eps):.4g} .. {max(eps):.4g} at delta {summary['budgets']['delta']:g} "
        f"({summary['budgets']['accountant']})" + (f"; tight {max(tight):.4g}" if tight else ""),
        f"cost units   {max(cost):.6g} per node" + (
            f" of {summary['budgets']['cost_units']:g}" if summary["budgets"]["cost_units"] else ""),
    ]
    target = summary.get("privacy", {}).get("epsilon_target")
    if target is not None and max(eps) > target * (1 + 1e-9):
        lines.append(f"WARNING      calibration {summary['privacy']['calibration']} targets epsilon {target:g} "
                     f"but spends {max(eps):.4g}")
    return "\n".join(lines)


def _cmd_privacy_dp_pasgd(args: argparse.Namespace) -> int:
    from testbed.privacy import zcdp

    for name in ("steps", "batch"):
        if getattr(args, name) <= 0:
            raise UserError(f"--{name} must be > 0")
    if args.lipschitz <= 0:
        raise UserError("--lipschitz must be > 0")
    if not 0 < args.delta < 1:
        raise UserError("--delta must be in (0, 1)")
    if args.epsilon is not None:
        if args.epsilon <= 0:
            raise UserError("--epsilon must be > 0")
        sigma = zcdp.dp_pasgd_sigma(args.steps, args.lipschitz, args.batch, args.epsilon, args.delta, args.calibration)
    else:
        if args.sigma <= 0:
            raise UserError("--sigma must be > 0")
        sigma = args.sigma
    rho = zcdp.dp_pasgd_rho(args.steps, args.lipschitz, args.batch, sigma)
    eps = zcdp.rho_to_epsilon(rho, args.delta)
    if args.json:
        print(json.dumps({"epsilon": eps, "rho": rho, "sigma": sigma, "calibration": args.calibration}))
    else:
        print(f"sigma    {sigma:.6f}" + (f"  ({args.calibration} calibration for epsilon {args.epsilon:g})"
                                          if args.epsilon is not None else ""))
        print(f"rho      {rho:.6f}  (zCDP, eq. 9)")
        print(f"epsilon  {eps:.6f}  at delta {args.delta:g}")
        if args.epsilon is not None and eps > args.epsilon * (1 + 1e-9):
            print(f"WARNING  {args.calibration} calibration spends epsilon {eps:.4g}, not {args.epsilon:g}")
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from testbed.plots import draw_figures
    from testbed.results import read_summary

    if not (args.run_dir / "summary.json").exists():
        raise UserError(f"{args.run_dir} has no summary.json; not a run directory")
    for path in draw_figures(args.run_dir):
        print(path)
    print(format_summary(read_summary(args.run_dir)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
