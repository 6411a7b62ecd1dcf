"""What the command line needs of DWFL (its registration's hook): its privacy calculator
`testbed privacy dwfl`, the per-receiver ε of eq. (11) and the orthogonal ε of Remark IV.1, or σ²
for a target ε (testbed.privacy.dwfl). On a graph (``--topology ring`` and its keys, or
``--experiment FILE``'s ``[topology]``) each receiver hears its neighbours only: eq. (10)–(11) over
N(i), σ² at the worst receiver, and each sender's ε at the worst of its receivers (the ledger's).
"""

from __future__ import annotations

import argparse

from testbed.algorithms.registry import Command
from testbed.checked.arguments import POSITIVE, PROBABILITY, Number, NumberList, calculator, finite_result
from testbed.errors import UserError
from testbed.privacy.statements import DELTA, PrivacyStatement
from testbed.topology import registry as topologies
from testbed.util import jsontext


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
    where = dw.add_mutually_exclusive_group()
    where.add_argument("--topology", choices=_kinds(), default=topologies.COMPLETE,
                       help="who hears whom (default complete: the paper's); a kind the radio places "
                            f"({', '.join(_radio_kinds()) or 'none'}) needs --experiment")
    where.add_argument("--experiment", metavar="FILE", help="an experiment file: its [topology] (N = the number of "
                       "gains; random_geometric: its [dwfl] radio's range), drawn from its seed")
    dw.add_argument("--degree", type=Number(int, ge=1), help="k_regular: every node's neighbours")
    dw.add_argument("--p", type=PROBABILITY, help="erdos_renyi: the probability of each edge")
    dw.add_argument("--rows", type=Number(int, ge=3), help="torus: the grid's rows")
    dw.add_argument("--edges", metavar="PATH", help="file: an edge list, one 'i j' pair per line")
    dw.add_argument("--seed", type=Number(int, ge=0), default=0, help="draws the random kinds (default 0)")
    dw.add_argument("--json", action="store_true")


def _kinds() -> list[str]:
    """The kinds drawn from flags alone, as registered (testbed.topology)."""
    return [name for name, kind in topologies.registrations().items() if not kind.placed_by_radio]


def _radio_kinds() -> list[str]:
    """The kinds that place nodes by a radio: drawn from an experiment file's (--experiment)."""
    return [name for name, kind in topologies.registrations().items() if kind.placed_by_radio]

#: flag → the [topology] key it sets.
_TOPOLOGY_FLAGS = {"degree": "degree", "p": "p", "rows": "rows", "edges": "path"}


def _graph(args: argparse.Namespace, num_nodes: int):
    """The graph of the first block of the topology the flags or the experiment file give; None for
    the complete graph (the dense path). UserError naming the flag or key."""
    from pydantic import ValidationError

    from testbed.topology import Topology, TopologySection

    if args.experiment is not None:
        from testbed.algorithms.dwfl_channel import topology_from_sections

        config = args.experiments.load_file(args.experiment)
        if config.run.algorithm != "dwfl":
            raise UserError(f"--experiment: {args.experiment} runs {config.run.algorithm}, not dwfl")
        topology = topology_from_sections({"dwfl": config.dwfl, "topology": config.topology}, num_nodes,
                                          config.run.seed)
    else:
        keys = {key: getattr(args, flag) for flag, key in _TOPOLOGY_FLAGS.items() if getattr(args, flag) is not None}
        try:
            section = TopologySection(kind=args.topology, **keys)
        except ValidationError as exc:
            problem = exc.errors()[0]
            raise UserError(f"--topology {args.topology}: {problem['msg']}") from None
        topology = Topology(section, num_nodes, args.seed)
    return None if topology.is_complete else topology.graph(0)


@calculator
def _privacy(args: argparse.Namespace) -> int:
    import numpy as np

    from channel import align_power
    from testbed.privacy import dwfl as dp

    gains = np.array(args.gains)
    graph = _graph(args, len(gains))
    beta = args.beta
    try:
        al = align_power(gains, args.power_w, beta=beta if beta is None or len(beta) > 1 else beta[0])  # eqs. (3)-(4)
    except ValueError as exc:
        raise UserError(f"--beta: {exc}") from None
    setting = dp.RoundSetting(gains, args.power_w, al.beta, args.noise_var, args.lr, args.gmax, args.delta,
                              graph=graph)
    if args.epsilon is not None:
        sigma2 = dp.calibrate_sigma2(args.epsilon, setting)
    else:
        sigma2 = args.sigma2
    eps = dp.epsilon_per_receiver(setting, sigma2)  # eq. (11), over N(i) on a graph
    orth = dp.orthogonal_epsilon(setting, sigma2)  # Remark IV.1
    result = {"epsilon": eps.tolist(), "epsilon_orthogonal": orth.tolist(), "sigma2": sigma2, "c": al.c,
              "alpha": al.alpha.tolist(), "beta": al.beta.tolist(),
              **({"sigma_z2": dp.sigma_z2(setting, sigma2)} if graph is None else {})}  # Lemma IV.6: complete
    if graph is not None:
        result.update(topology=args.topology if args.experiment is None else "experiment",
                      degree=graph.degrees.tolist(), epsilon_sender=dp.epsilon_per_sender(setting, sigma2).tolist())
    finite_result(result)
    if args.json:
        print(jsontext.dumps(result))
        return 0
    print(f"sigma2   {sigma2:.6f}" + (f"  (calibrated for epsilon {args.epsilon:g} at the worst receiver)"
                                       if args.epsilon is not None else ""))
    print(f"c        {al.c:.6g}  (eq. 4)")
    if graph is None:
        print("receiver epsilon (eq. 11)  epsilon orthogonal (Remark IV.1)")
        for i, (e, o) in enumerate(zip(eps, orth)):
            print(f"{i:>8} {e:>17.6f}  {o:>18.6f}")
        print(f"worst    {eps.max():>17.6f}  {orth.max():>18.6f}   at delta {args.delta:g}, per round")
        return 0
    sender = result["epsilon_sender"]
    print("node  degree  receiver epsilon (eq. 11 over N(i))  sender epsilon (worst receiver)  epsilon orthogonal")
    for i, (d, e, s, o) in enumerate(zip(graph.degrees.tolist(), eps, sender, orth)):
        print(f"{i:>4} {d:>7} {e:>36.6f} {s:>32.6f} {o:>19.6f}")
    print(f"worst{'':>8}{eps.max():>36.6f} {max(sender):>32.6f} {orth.max():>19.6f}   at delta {args.delta:g}, per round")
    return 0


PRIVACY = Command(help="per-receiver ε of eq. (11) and the orthogonal ε, or σ² for a target ε",
                  arguments=_arguments, run=_privacy,
                  examples=("--gains 1,2,2,2 --power-w 1 --sigma2 1 --noise-var 1 --lr 0.1 --gmax 1 --delta 1e-5",
                            "--gains 1,2,2,2 --power-w 1 --epsilon 0.5 --noise-var 1 --lr 0.1 --gmax 1 --delta 1e-5 --json",
                            "--gains 1,2,2,2,2 --power-w 1 --sigma2 1 --noise-var 1 --lr 0.1 --gmax 1 --delta 1e-5 "
                            "--topology ring"))


#: The summary's assumptions of a DWFL run (Registration.assumptions): what its ε rests on.
ASSUMPTIONS = ("DWFL's per-round sensitivity 2γ g_max treats x_j^(t−1/2) as fixed, as the paper's Theorem IV.1 does: "
               "a node's model carries its earlier rounds' gradients into later signals without fresh noise, so the "
               "ε composed over the rounds is under that assumption",
               "DWFL's ε excludes colluding receivers: each receiver is charged only the noise of what it alone heard")

STATEMENT = PrivacyStatement(
    name="dwfl", title="DWFL",
    unit="node: (ε, δ)-DP of a node's whole training set, per round, composed over the rounds",
    adjacency="replace a node's whole data set: its clipped batch gradient (‖g_i‖ <= g_max) moves by at most 2 g_max, "
              "its signal by at most Δ = 2γ g_max in normalised units (Theorem IV.1)",
    observers="the other nodes (observer \"peers\"): each receiver hears the superposition of its neighbours' signals, "
              "their artificial noise and its channel noise; a sender is charged at its worst receiver; a node that "
              "misses a round leaves the others' receivers short of its noise, and that shortfall is charged to them "
              "after the round; a sender the alignment leaves inactive (alpha = beta = 0: on a scene, no traced path "
              "to the server point) transmits zeros and is charged nothing for the round",
    accountant="the per-round Gaussian mechanism composed over the rounds by privacy.accountant; the tight "
               "privacy.tight_accountant beside it",
    paper_accountant="the per-round ε = Δ sqrt(2 ln(1.25/δ))/σ of eq. (11) at the worst receiver, not composed",
    amplification="none",
    assumptions=ASSUMPTIONS + ("the channel (fading, path loss, receiver noise power) and the alignment are as "
                               "modelled: the channel's noise counts towards the privacy",),
    delta=DELTA,
    not_protected=("colluding receivers pooling what they heard",
                   "a node's position and channel gains, and whether it transmitted"),
    evidence=("tests/test_privacy_dwfl.py::test_check_6_epsilon_formula",
              "tests/test_privacy_dwfl.py::test_check_9_sensitivity_with_clipping",
              "tests/test_privacy_dwfl.py::test_composition_with_dp_accounting",
              "tests/test_privacy_dwfl.py::test_dwfl_composition_worst_receiver",
              "tests/test_dwfl.py::test_silent_senders_are_charged_what_the_receivers_really_heard",
              "tests/test_dwfl_inactive.py::test_charged_senders_are_the_active_ones_a_receiver_hears",
              "Chen et al., Theorem IV.1, eqs. (10)-(11) (dwfl.md §4)"))
