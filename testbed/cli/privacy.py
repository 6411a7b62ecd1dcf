"""`testbed privacy ALGORITHM ...`: the papers' privacy calculators, one sub-command per algorithm."""

from __future__ import annotations

import argparse
import json

from testbed.errors import UserError


def register(sub: argparse._SubParsersAction) -> None:
    privacy = sub.add_parser("privacy", help="privacy calculators")
    psub = privacy.add_subparsers(dest="algorithm", required=True)
    _register_dp_pasgd(psub)


def _register_dp_pasgd(psub: argparse._SubParsersAction) -> None:
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
    dp.set_defaults(handler=_dp_pasgd)


def positive(name: str, value: float) -> None:
    if not value > 0:
        raise UserError(f"--{name} must be > 0, got {value}")


def probability(name: str, value: float) -> None:
    if not 0 < value < 1:
        raise UserError(f"--{name} must be in (0, 1), got {value}")


def _dp_pasgd(args: argparse.Namespace) -> int:
    from testbed.privacy import zcdp

    positive("steps", args.steps)
    positive("batch", args.batch)
    positive("lipschitz", args.lipschitz)
    probability("delta", args.delta)
    if args.epsilon is not None:
        positive("epsilon", args.epsilon)
        sigma = zcdp.dp_pasgd_sigma(args.steps, args.lipschitz, args.batch, args.epsilon, args.delta, args.calibration)
    else:
        positive("sigma", args.sigma)
        sigma = args.sigma
    rho = zcdp.dp_pasgd_rho(args.steps, args.lipschitz, args.batch, sigma)
    eps = zcdp.rho_to_epsilon(rho, args.delta)
    if args.json:
        print(json.dumps({"epsilon": eps, "rho": rho, "sigma": sigma, "calibration": args.calibration}))
        return 0
    print(f"sigma    {sigma:.6f}" + (f"  ({args.calibration} calibration for epsilon {args.epsilon:g})"
                                      if args.epsilon is not None else ""))
    print(f"rho      {rho:.6f}  (zCDP, eq. 9)")
    print(f"epsilon  {eps:.6f}  at delta {args.delta:g}")
    if args.epsilon is not None and eps > args.epsilon * (1 + 1e-9):
        print(f"WARNING  {args.calibration} calibration spends epsilon {eps:.4g}, not {args.epsilon:g}")
    return 0
