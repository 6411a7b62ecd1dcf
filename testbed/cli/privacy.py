"""`testbed privacy ALGORITHM ...`: the papers' privacy calculators, one sub-command per algorithm."""

from __future__ import annotations

import argparse
import json

from testbed.cli.numbers import COUNT, POSITIVE, PROBABILITY, Number, NumberList, calculator, finite_result
from testbed.errors import UserError



def register(sub: argparse._SubParsersAction) -> None:
    privacy = sub.add_parser("privacy", help="privacy calculators")
    psub = privacy.add_subparsers(dest="algorithm", required=True)
    _register_dp_pasgd(psub)
    _register_dwfl(psub)
    from testbed.cli.acfl import register_privacy

    register_privacy(psub)
    _register_padpfl(psub)


def _register_dp_pasgd(psub: argparse._SubParsersAction) -> None:
    dp = psub.add_parser("dp-pasgd", help="ε of eq. (9) for σ, or σ for a target ε")
    dp.add_argument("--steps", type=COUNT, required=True, help="K, local steps per device")
    dp.add_argument("--lipschitz", type=POSITIVE, required=True, help="G, per-sample gradient bound")
    dp.add_argument("--batch", type=COUNT, required=True, help="X, mini-batch size")
    dp.add_argument("--delta", type=PROBABILITY, required=True, help="δ")
    group = dp.add_mutually_exclusive_group(required=True)
    group.add_argument("--sigma", type=POSITIVE, help="noise std per coordinate")
    group.add_argument("--epsilon", type=POSITIVE, help="target ε: prints the calibrated σ")
    dp.add_argument("--calibration", choices=["corrected", "paper_literal"], default="corrected",
                    help="σ from ε: the correct root of eq. (9), or eq. (23) as printed (not private)")
    dp.add_argument("--json", action="store_true")
    dp.set_defaults(handler=_dp_pasgd)


def _register_dwfl(psub: argparse._SubParsersAction) -> None:
    dw = psub.add_parser("dwfl", help="per-receiver ε of eq. (11) and the orthogonal ε, or σ² for a target ε")
    dw.add_argument("--gains", type=NumberList(float, min_len=2, gt=0), required=True, help="|h_k| of every node")
    dw.add_argument("--power-w", type=POSITIVE, required=True, help="P_k of every node, W")
    dw.add_argument("--beta", type=NumberList(float, ge=0, le=1), help="one value: fraction of 1 − α_k given to artificial noise (default 1); "
                                   "N comma-separated values: β_k")
    group = dw.add_mutually_exclusive_group(required=True)
    group.add_argument("--sigma2", type=Number(float, ge=0), help="σ², variance of the artificial noise per entry")
    group.add_argument("--epsilon", type=POSITIVE, help="per-round target ε at the worst receiver: prints σ²")
    dw.add_argument("--noise-var", type=Number(float, ge=0), required=True, help="σ_m², channel noise per entry, W")
    dw.add_argument("--lr", type=POSITIVE, required=True, help="γ, learning rate")
    dw.add_argument("--gmax", type=POSITIVE, required=True, help="gradient clipping norm")
    dw.add_argument("--delta", type=PROBABILITY, required=True, help="δ")
    dw.add_argument("--json", action="store_true")
    dw.set_defaults(handler=_dwfl)


def _register_padpfl(psub: argparse._SubParsersAction) -> None:
    pa = psub.add_parser("padpfl", help="client noise (eq. 8), server noise (eq. 13) and the condition of Theorem 1")
    group = pa.add_mutually_exclusive_group(required=True)
    group.add_argument("--weights", type=NumberList(float, ge=0, le=1), help="p of every client (sum 1)")
    group.add_argument("--parts", type=Parts(), help="N1:r1,N2:r2,...: clients per part and their per-client ratio (the paper's "
                                       '"0-1-2" over parts of N1, N2, N3), normalised')
    pa.add_argument("--min-samples", type=COUNT, required=True, help="min_i m_i")
    pa.add_argument("--clip", type=POSITIVE, required=True, help="B, the clipping bound on the weights")
    pa.add_argument("--rounds", type=COUNT, required=True, help="T, aggregations")
    pa.add_argument("--uploads", type=COUNT, required=True, help="R, the most uploads of one client (R <= T)")
    pa.add_argument("--epsilon", type=POSITIVE, required=True, help="ε, the target of Theorem 1")
    pa.add_argument("--delta", type=PROBABILITY, required=True, help="δ")
    pa.add_argument("--json", action="store_true")
    pa.set_defaults(handler=_padpfl)


@calculator
def _padpfl(args: argparse.Namespace) -> int:
    import numpy as np

    from testbed.algorithms.impact import check_weights, ratio_weights
    from testbed.privacy import padpfl as dp

    if args.weights is not None:
        p = np.array(args.weights)
        problem = check_weights(p, p.size)
        if problem is not None:
            raise UserError(f"--weights: {problem}")
    else:
        counts, ratios = args.parts
        if sum(n * r for n, r in zip(counts, ratios)) <= 0:
            raise UserError("--parts needs some weight: a ratio > 0")
        p = ratio_weights(counts, np.array(ratios))
    if args.uploads > args.rounds:
        raise UserError(f"--uploads: R = {args.uploads} exceeds --rounds T = {args.rounds}")
    common = (args.clip, args.rounds, args.uploads, args.min_samples, args.epsilon, args.delta)
    sigma_c = dp.client_sigma(args.clip, args.uploads, args.min_samples, args.epsilon, args.delta)  # eq. (8)
    sigma_s = dp.server_sigma(p, *common)  # eq. (13)
    result = {"sigma_client": sigma_c, "sigma_server": sigma_s, "sigma_total": dp.broadcast_sigma(p, sigma_c, sigma_s),
              "sigma_target": dp.target_sigma(p, args.clip, args.rounds, args.min_samples, args.epsilon, args.delta),
              "c": dp.gaussian_c(args.delta), "condition": dp.server_noise_needed(p, args.rounds, args.uploads),
              "threshold": dp.condition_threshold(p), "max_p": float(p.max()), "sum_p2": float(p @ p),
              "gaussian_condition": dp.gaussian_condition_holds(args.epsilon)}
    finite_result(result)
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"sigma_client  {sigma_c:.6g}  (eq. 8, every client)")
    print(f"sigma_server  {sigma_s:.6g}  (eq. 13)")
    print(f"sigma_total   {result['sigma_total']:.6g}  (sqrt(sum p^2 sigma_C^2 + sigma_S^2) in the broadcast; "
          f"Theorem 1 needs {result['sigma_target']:.6g})")
    print(f"c             {result['c']:.6g}")
    print(f"condition     T = {args.rounds} {'>' if result['condition'] else '<='} R sqrt(sum p^2)/max p = "
          f"{args.uploads * result['threshold']:.6g}" + ("" if result["condition"] else ": no server noise"))
    if not result["gaussian_condition"]:
        print(f"WARNING       epsilon = {args.epsilon:g} >= 1: the Gaussian mechanism of eqs. (8), (13) is proven for "
              "epsilon < 1 only")
    return 0


@calculator
def _dwfl(args: argparse.Namespace) -> int:
    import numpy as np

    from channel import align_power
    from testbed.privacy import dwfl as dp

    gains = np.array(args.gains)
    beta = args.beta
    try:
        al = align_power(gains, args.power_w, beta=beta if beta is None or len(beta) > 1 else beta[0])  # eqs. (3)-(4)
    except ValueError as exc:
        raise UserError(f"--beta: {exc}") from None
    setting = dp.RoundSetting(gains, args.power_w, al.beta, args.noise_var, args.lr, args.gmax, args.delta)
    if args.epsilon is not None:
        sigma2 = dp.calibrate_sigma2(args.epsilon, setting)
    else:
        sigma2 = args.sigma2
    eps = dp.epsilon_per_receiver(setting, sigma2)  # eq. (11)
    orth = dp.orthogonal_epsilon(setting, sigma2)  # Remark IV.1
    result = {"epsilon": eps.tolist(), "epsilon_orthogonal": orth.tolist(), "sigma2": sigma2, "c": al.c,
              "alpha": al.alpha.tolist(), "beta": al.beta.tolist(),
              "sigma_z2": dp.sigma_z2(setting, sigma2)}
    finite_result(result)
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"sigma2   {sigma2:.6f}" + (f"  (calibrated for epsilon {args.epsilon:g} at the worst receiver)"
                                       if args.epsilon is not None else ""))
    print(f"c        {al.c:.6g}  (eq. 4)")
    print("receiver epsilon (eq. 11)  epsilon orthogonal (Remark IV.1)")
    for i, (e, o) in enumerate(zip(eps, orth)):
        print(f"{i:>8} {e:>17.6f}  {o:>18.6f}")
    print(f"worst    {eps.max():>17.6f}  {orth.max():>18.6f}   at delta {args.delta:g}, per round")
    return 0


@calculator
def _dp_pasgd(args: argparse.Namespace) -> int:
    from testbed.privacy import zcdp

    if args.epsilon is not None:
        sigma = zcdp.dp_pasgd_sigma(args.steps, args.lipschitz, args.batch, args.epsilon, args.delta, args.calibration)
    else:
        sigma = args.sigma
    rho = zcdp.dp_pasgd_rho(args.steps, args.lipschitz, args.batch, sigma)
    eps = zcdp.rho_to_epsilon(rho, args.delta)
    finite_result({"epsilon": eps, "rho": rho, "sigma": sigma})
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


class Parts:
    """``--parts N1:r1,N2:r2,...``: clients per part (an integer >= 1) and their per-client ratio
    (>= 0), as (counts, ratios)."""

    count, ratio = COUNT, Number(float, ge=0)
    __name__ = "parts"

    def __call__(self, text: str) -> tuple[list[int], list[float]]:
        pairs = [item.split(":") for item in text.split(",") if item.strip()]
        if not pairs or any(len(pair) != 2 for pair in pairs):
            raise argparse.ArgumentTypeError(f"is N1:r1,N2:r2,... (clients:ratio), got {text!r}")
        return [self.count(n) for n, _ in pairs], [self.ratio(r) for _, r in pairs]

    def describe(self) -> str:
        return f"N:r pairs, comma separated, N {self.count.describe()}, r {self.ratio.describe()}"
