"""What the command line needs of DWFL (its registration's hook): its privacy calculator
`testbed privacy dwfl`, the per-receiver ε of eq. (11) and the orthogonal ε of Remark IV.1, or σ²
for a target ε (testbed.privacy.dwfl).
"""

from __future__ import annotations

import argparse
import json

from testbed.algorithms.registry import Command
from testbed.arguments import POSITIVE, PROBABILITY, Number, NumberList, calculator, finite_result
from testbed.errors import UserError


def _arguments(dw: argparse.ArgumentParser) -> None:
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


@calculator
def _privacy(args: argparse.Namespace) -> int:
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


PRIVACY = Command(help="per-receiver ε of eq. (11) and the orthogonal ε, or σ² for a target ε",
                  arguments=_arguments, run=_privacy,
                  examples=("--gains 1,2,2,2 --power-w 1 --sigma2 1 --noise-var 1 --lr 0.1 --gmax 1 --delta 1e-5",
                            "--gains 1,2,2,2 --power-w 1 --epsilon 0.5 --noise-var 1 --lr 0.1 --gmax 1 --delta 1e-5 --json"))
