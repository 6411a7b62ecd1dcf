"""``"mean"``: Σ_k w_k u_k with the given weights (DP-PASGD eq. 7b: equal; FedAvg: n_k/n; PADPFL:
p'_k of eq. 11), the papers' rule and the default."""

from testbed.algorithms.aggregations.registry import MEAN, Rule


def _mean(updates, weights, reference, params):
    return updates.mean(axis=0) if weights is None else weights @ updates


REGISTRATION = Rule(MEAN, _mean, uses_weights=True, order=0)
