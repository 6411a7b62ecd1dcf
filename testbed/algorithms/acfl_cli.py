"""ACFL's sub-commands of the command line (its registration's hooks): `testbed privacy acfl` and
`testbed plan acfl`, Theorem 1's ε-MI-DP of ACFL's coded data set (or the noise for a target ε),
and Theorem 3's α* with the bound 4ũ/(λ²T) (testbed.privacy.acfl).

Example::

    $ testbed privacy acfl --dim 10 --outputs 10 --sigma1-sq 1 --sigma2-sq 1 --json
    {"epsilon": 10.050..., "sigma1_sq": 1.0, "sigma2_sq": 1.0, "unit": "nats"}
"""

from __future__ import annotations

import argparse

from testbed.algorithms.registry import Command
from testbed.checked.arguments import COUNT, POSITIVE, Number, calculator, finite_result
from testbed.checked.limits import MAX_EPSILON_NATS
from testbed.errors import UserError
from testbed.privacy.statements import PrivacyStatement
from testbed.util import jsontext


def _privacy_arguments(p: argparse.ArgumentParser) -> None:
    _dims(p)
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--sigma1-sq", type=POSITIVE, help="σ₁², variance of H_X's noise (with --sigma2-sq)")
    group.add_argument("--epsilon", type=Number(float, gt=0, le=MAX_EPSILON_NATS),
                       help="target ε (in --unit): prints σ₁² and σ₂² = ratio · σ₁²")
    p.add_argument("--sigma2-sq", type=POSITIVE, help="σ₂², variance of H_Y's noise")
    p.add_argument("--ratio", type=POSITIVE, default=1.0, help="σ₂²/σ₁² for --epsilon (default 1)")
    p.add_argument("--unit", choices=["nats", "bits"], default="nats", help="ε in nats (natural log, default) or bits")
    p.add_argument("--json", action="store_true")


def _plan_arguments(p: argparse.ArgumentParser) -> None:
    _dims(p)
    p.add_argument("--sigma1-sq", type=POSITIVE, required=True, help="σ₁²")
    p.add_argument("--sigma2-sq", type=POSITIVE, required=True, help="σ₂²")
    p.add_argument("--nodes", type=COUNT, required=True, help="N, devices")
    p.add_argument("--straggler-p", type=Number(float, ge=0, lt=1), required=True, help="p, per device and iteration")
    p.add_argument("--beta", type=POSITIVE, required=True, help="β, the bound on a device's gradient norm (Assumption 2)")
    p.add_argument("--model-bound", type=POSITIVE, required=True, help="C, the bound on ‖W_t‖_F (Assumption 3)")
    p.add_argument("--strong-convexity", type=POSITIVE, required=True, help="λ, Σ XᵀX ≥ λI")
    p.add_argument("--iterations", type=COUNT, required=True, help="T")
    p.add_argument("--unit", choices=["nats", "bits"], default="nats", help="unit of epsilon (default nats)")
    p.add_argument("--json", action="store_true")


def _dims(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dim", type=COUNT, required=True, help="d, features (columns of X)")
    p.add_argument("--outputs", type=COUNT, required=True, help="o, outputs (columns of Y)")


@calculator
def _privacy(args: argparse.Namespace) -> int:
    from testbed.privacy import acfl

    if args.epsilon is not None:
        if args.sigma2_sq is not None:
            raise UserError("--sigma2-sq goes with --sigma1-sq, not with --epsilon (use --ratio)")
        s1, s2 = acfl.sigma_sq_for_epsilon(args.dim, args.outputs, args.epsilon, args.ratio, unit=args.unit)
    else:
        if args.sigma2_sq is None:
            raise UserError("--sigma1-sq needs --sigma2-sq")
        s1, s2 = args.sigma1_sq, args.sigma2_sq
    eps = acfl.mi_epsilon(args.dim, args.outputs, s1, s2, unit=args.unit)  # eq. (17)
    result = finite_result({"epsilon": eps, "sigma1_sq": s1, "sigma2_sq": s2, "unit": args.unit})
    if args.json:
        print(jsontext.dumps(result))
        return 0
    print(f"sigma1_sq  {s1:.6g}")
    print(f"sigma2_sq  {s2:.6g}")
    print(f"epsilon    {eps:.6f} {args.unit}  (MI-DP of the coded data set per device, Theorem 1, eq. 17; "
          "the gradients sent during training are not covered)")
    return 0


@calculator
def _plan(args: argparse.Namespace) -> int:
    from testbed.privacy import acfl

    kw = dict(nodes=args.nodes, p=args.straggler_p, beta_sq=args.beta**2, model_bound_sq=args.model_bound**2,
              dim=args.dim, outputs=args.outputs, sigma1_sq=args.sigma1_sq, sigma2_sq=args.sigma2_sq)
    alpha = acfl.optimal_alpha(**kw)  # eq. (36)
    u_tilde = acfl.u_tilde(**kw)  # eq. (38)
    bound = acfl.convergence_bound(u_tilde, args.strong_convexity, args.iterations)  # eq. (37)
    eps = acfl.mi_epsilon(args.dim, args.outputs, args.sigma1_sq, args.sigma2_sq, unit=args.unit)  # eq. (17)
    result = finite_result({"alpha": alpha, "bound": bound, "epsilon": eps, "u_tilde": u_tilde, "unit": args.unit})
    if args.json:
        print(jsontext.dumps(result))
        return 0
    print(f"alpha    {alpha:.6g}  (α*, eq. 36)")
    print(f"bound    {bound:.6g}  (E‖W_T − W*‖²_F ≤ 4ũ/(λ²T), eqs. 37–38; ũ = {u_tilde:.6g})")
    print(f"epsilon  {eps:.6f} {args.unit}  (Theorem 1, eq. 17)")
    return 0


PRIVACY = Command(help="ε-MI-DP of ACFL's coded data set (Theorem 1), or σ₁², σ₂² for a target ε",
                  arguments=_privacy_arguments, run=_privacy,
                  examples=("--dim 10 --outputs 10 --sigma1-sq 1 --sigma2-sq 1", "--dim 10 --outputs 10 --epsilon 5 --json"))
PLAN = Command(help="α* (eq. 36), the bound 4ũ/(λ²T) (eqs. 37–38) and ε (eq. 17)", arguments=_plan_arguments,
               run=_plan, examples=("--dim 100 --outputs 10 --sigma1-sq 1 --sigma2-sq 1 --nodes 5 --straggler-p 0.1 "
                                    "--beta 10 --model-bound 1 --strong-convexity 1 --iterations 1000",))


#: The summary's assumptions of an ACFL run (Registration.assumptions).
ASSUMPTIONS = ("ACFL's ε is ε-MI-DP in nats of the one-time coded upload (Theorem 1, every entry of X and Y in "
               "[−1, 1]); the gradients X^T(X W_t − Y) sent every iteration carry no noise and are not covered",)

STATEMENT = PrivacyStatement(
    name="acfl", title="ACFL",
    unit="entry: ε-MI-DP (Cuff and Yu) in nats of each entry of a node's features, for its one-time coded upload; "
         "not (ε, δ)-DP",
    adjacency="none: sup over one entry Z_jk of the mutual information I(Z_jk; upload | the other entries)",
    observers="the server, which receives each node's coded Gram H_X = X^T X + N1, H_Y = X^T Y + N2 (observer "
              "\"server\")",
    accountant="the mutual-information ledger (budget.mi_epsilon), never composed with (ε, δ); several uploads add "
               "up (the chain rule, conservative)",
    paper_accountant="Theorem 1, eq. (17): ε = (d − 1/2) log(1 + 1/σ1²) + (o/2) log(1 + 1/σ2²); SCFL's "
                     "(encoding = \"projection\") bound is derived here, not the paper's",
    amplification="none",
    assumptions=("every entry of X and Y in [−1, 1] (Assumption 1: the loaders' scaling, and the coordinator refuses "
                 "an upload beyond its bound)",
                 "ε in nats: the paper's proof uses differential entropies (acfl.md §3.2)"),
    delta="none: MI-DP has no δ; privacy.delta is not used",
    not_protected=("the gradients X^T(X W_t − Y) sent every iteration: exact, outside the paper's scope",
                   "how many rows a node holds"),
    evidence=("tests/test_acfl.py::test_6_theorem_1_values_monotone_limit_inverse_and_bits",
              "tests/test_acfl.py::test_a_run_records_the_upload_and_its_mi_epsilon_per_node",
              "tests/test_acfl.py::test_mutual_info_event_round_trips_and_has_its_own_budget",
              "tests/test_honest_summaries.py::test_acfl_headlines_its_mi_dp_and_a_regression_its_loss",
              "Li, Xiao and Skoglund, Theorem 1 (acfl.md §3); Cuff and Yu 2016 (MI-DP)"))
