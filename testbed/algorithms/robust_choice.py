"""Which robust rule to set per averaging algorithm, from the benchmark's table
(docs/robust-aggregation.md, ``benchmarks/robust_aggregation.py``): the cheapest rule that holds
at 10 % hostile nodes (no attack of the grid lowers the mean accuracy by more than 0.05), with its
cost. ``testbed run --help`` prints it; tests/test_robust_gossip.py checks it against the table.

Example::

    >>> HOLDS_AT_10["gossip"].rule
    'self_centred_clip'
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Choice:
    """A rule that holds at 10 % hostile in the benchmark and what it costs."""

    rule: str
    cost: str


#: Per averaging algorithm (ACFL sums coded gradients, DWFL sums over the air: neither can take one).
HOLDS_AT_10: dict[str, Choice] = {
    "fedavg": Choice("norm_clip", "O(MP), one pass; no accuracy lost without attack"),
    "dp_pasgd": Choice("trimmed_mean", "O(MP log M), a sort per coordinate (14x the mean at N = 1000)"),
    "padpfl": Choice("trimmed_mean", "O(MP log M); unweighted, so the impact factors and a lying score no "
                                     "longer steer the model"),
    "gossip": Choice("self_centred_clip", "O(DP) per node, 9x the mean's exchange at N = 100, D = 4; "
                                          "D x the received bytes over MQTT"),
    "dpsgd": Choice("self_centred_clip", "O(DP) per node, 9x the mean's exchange at N = 100, D = 4; "
                                         "D x the received bytes over MQTT"),
}


def help_text() -> str:
    """The ``testbed run --help`` block naming each algorithm's rule."""
    lines = ["robust aggregation against hostile nodes inside the bounds (docs/robust-aggregation.md): the",
             "rule that held at 10 % hostile in the benchmark, per algorithm (--set ALGORITHM.aggregation=RULE):"]
    lines += [f"  {name:<9} {choice.rule:<18} {choice.cost}" for name, choice in HOLDS_AT_10.items()]
    return "\n".join(lines)
