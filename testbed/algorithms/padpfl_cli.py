"""What the command line needs of PADPFL (its registration's hook): its privacy calculator
`testbed privacy padpfl`, the client noise of eq. (8), the server noise of eq. (13) and the
condition of Theorem 1 (testbed.privacy.padpfl).
"""

from __future__ import annotations

import argparse

from testbed.algorithms.registry import Command
from testbed.checked.arguments import COUNT, POSITIVE, PROBABILITY, Number, NumberList, calculator, finite_result
from testbed.errors import UserError
from testbed.privacy.statements import DELTA, PrivacyStatement
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
    pa.add_argument("--sensitivity", choices=["paper_eq7", "clipped_weights"], default="paper_eq7",
                    help="Δf the noise is calibrated for: 2B/min m (eq. 7, the paper's; default) or 2B (true of SGD)")
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
    records = args.min_samples if args.sensitivity == "paper_eq7" else 1  # the m of Δf = 2B/m
    common = (args.clip, args.rounds, args.uploads, records, args.epsilon, args.delta)
    sigma_c = dp.client_sigma(args.clip, args.uploads, records, args.epsilon, args.delta)  # eq. (8)
    sigma_s = dp.server_sigma(p, *common)  # eq. (13)
    result = {"sigma_client": sigma_c, "sigma_server": sigma_s, "sigma_total": dp.broadcast_sigma(p, sigma_c, sigma_s),
              "sigma_target": dp.target_sigma(p, args.clip, args.rounds, records, args.epsilon, args.delta),
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
    if args.sensitivity == "paper_eq7":
        print("NOTE          Δf = 2B/min m (eq. 7): under the paper's assumption (eq. 6), not a guarantee for SGD; "
              "--sensitivity clipped_weights calibrates for 2B")
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


STATEMENT = PrivacyStatement(
    name="padpfl", title="PADPFL",
    unit="record: (ε, δ)-DP of each node's training records",
    adjacency="replace one record of a node's training set",
    observers="the server sees each upload (observer \"server\"); the public sees the noised broadcast (observer "
              "\"public\"), charged p'_i Δf_i at the noise that reached it (a robust rule: the upload's own σ_C, Δf_i)",
    accountant="privacy.accountant composes each node's uploads and broadcasts per observer; the tight "
               "privacy.tight_accountant beside it",
    paper_accountant="linear composition of the Gaussian mechanism's c·Δf/σ per release (eqs. 8, 13; "
                     "epsilon_paper_uplink, epsilon_paper_downlink in the summary), proven for ε < 1 only",
    amplification="none with local_step = \"sgd\" (whole weight vectors are released); with local_step = \"dp_sgd\" "
                  "the tight accountant amplifies each step by X/m_i, which needs batches the observer cannot know",
    assumptions=("sensitivity = \"clipped_weights\" (the default): 2B, true of any two weight vectors clipped to B, "
                 "so of SGD's; eqs. (8), (13) are calibrated for it",
                 "sensitivity = \"paper_eq7\": 2B/m_i, under the paper's assumption (eq. 6), not a guarantee for SGD; "
                 "only with [privacy] reproduction = true, and the summary's assumptions say so",
                 "local_step = \"dp_sgd\": every per-sample gradient clipped to C (sample_clip), so 2C/X per step; "
                 "the upload and the broadcast are post-processing of the noised steps",
                 "impact = \"quality_score\": each score has sensitivity 1/m_i (an accuracy over m_i rows of a model "
                 "this round's data did not make), charged to the server's observer",
                 "the public's figure rests on the server's noise σ_S too: over MQTT with a node that has a secret, "
                 "drawn from the coordinator's own secret (server-secret.key in the run directory, mode 0600, which "
                 "the public must not get); in sim and emulated runs from the run seed, derivable by anyone holding "
                 "it (summary.json's public entry says `server_randomness`)"),
    delta=DELTA,
    not_protected=("impact = \"data_size\": the training-set sizes, uploaded exactly once (metadata)",
                   "impact = \"reliability\" or \"link_quality\": whether a node answered, where it is",
                   "the weights p and who contributes in each round"),
    evidence=("tests/test_sound_sensitivities.py::test_the_default_charges_clipped_weights_2b_and_the_run_assumes_nothing",
              "tests/test_sound_sensitivities.py::test_eq7_is_refused_outside_a_reproduction_and_said_in_its_summary",
              "tests/test_sound_sensitivities.py::test_one_record_moves_a_dp_sgd_step_by_at_most_2c_over_x",
              "tests/test_sound_sensitivities.py::test_dp_sgd_charges_each_step_and_its_ledger_is_dp_accountings_composition",
              "tests/test_sound_sensitivities.py::test_dp_sgd_learns_above_the_majority_share_at_a_sound_epsilon",
              "tests/test_padpfl.py::test_a_run_reports_both_observers_the_papers_accounting_and_the_resolved_min_samples",
              "tests/test_padpfl.py::test_quality_score_is_clipped_noised_charged_and_turned_into_a_softmax",
              "tests/test_node_secret.py::test_the_public_cannot_regenerate_the_servers_noise_once_a_node_has_a_secret",
              "tests/test_privacy_audit.py::test_audit_of_padpfl_refutes_the_papers_sensitivity_for_sgd",
              "Talaei and Izadi, eqs. (6)-(8), (13) (adaptive-dp.md §2); Abadi et al. 2016 (DP-SGD)"))
