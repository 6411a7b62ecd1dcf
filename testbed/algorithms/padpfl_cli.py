"""What the command line needs of PADPFL (its registration's hook): its privacy calculator
`testbed privacy padpfl`, the client noise of eq. (8), the server noise of eq. (13) and the
condition of Theorem 1 (testbed.privacy.padpfl).
"""

from __future__ import annotations

import argparse

from testbed.algorithms.registry import Command
from testbed.arguments import COUNT, POSITIVE, PROBABILITY, Number, NumberList, calculator, finite_result
from testbed.errors import UserError
from testbed.util import jsontext


def _arguments(pa: argparse.ArgumentParser) -> None:
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


@calculator
def _privacy(args: argparse.Namespace) -> int:
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
        print(jsontext.dumps(result))
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


PRIVACY = Command(help="client noise (eq. 8), server noise (eq. 13) and the condition of Theorem 1",
                  arguments=_arguments, run=_privacy,
                  examples=("--parts 20:0,20:1,20:2 --min-samples 150 --clip 1 --rounds 30 --uploads 5 --epsilon 5 "
                            "--delta 0.01",))
