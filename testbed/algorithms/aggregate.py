"""How a server combines the nodes' updates: the mean the papers use, and robust alternatives for
experiments on poisoning (beyond the papers).

- ``"mean"``: Σ_k w_k u_k with the given weights (DP-PASGD eq. 7b: equal; FedAvg: n_k/n);
- ``"trimmed_mean"``: per coordinate, the mean of the values left after dropping the
  ``trim_fraction`` largest and as many smallest (Yin et al., ICML 2018), unweighted;
- ``"median"``: the coordinate-wise median (Yin et al.), unweighted.

Example::

    >>> u = np.array([[0.0, 1.0], [1.0, 1.0], [100.0, 1.0]])
    >>> aggregate(u, "mean").tolist(), aggregate(u, "median").tolist()
    ([33.666666666666664, 1.0], [1.0, 1.0])
    >>> aggregate(u, "trimmed_mean", trim_fraction=0.34).tolist()
    [1.0, 1.0]
"""

from __future__ import annotations

from typing import Literal

import numpy as np
from pydantic import Field

from testbed.sections import Section

AGGREGATIONS = ("mean", "trimmed_mean", "median")


class AggregationOptions(Section):
    """The keys of an algorithm section whose server averages updates."""

    aggregation: Literal["mean", "trimmed_mean", "median"] = "mean"
    """mean: the paper's; trimmed_mean or median: robust rules for experiments on poisoning."""
    trim_fraction: float = Field(0.1, ge=0, lt=0.5)
    """trimmed_mean: share of nodes dropped at each end, per coordinate."""


def aggregate(updates: np.ndarray, rule: str, weights: np.ndarray | None = None,
              trim_fraction: float = 0.1) -> np.ndarray:
    """(M, P) updates → (P,) by ``rule`` (one of AGGREGATIONS).

    Args:
        updates: one row per node that answered, M >= 1.
        rule: "mean", "trimmed_mean" or "median".
        weights: (M,) weights summing to 1 for "mean" (None: equal).
        trim_fraction: share of nodes dropped at each end per coordinate, in [0, 0.5).
    """
    m = updates.shape[0]
    if rule == "mean":
        return updates.mean(axis=0) if weights is None else weights @ updates
    if rule == "median":
        return np.median(updates, axis=0)
    if rule == "trimmed_mean":
        k = int(np.floor(trim_fraction * m))
        if k == 0:
            return updates.mean(axis=0)
        ordered = np.sort(updates, axis=0)
        return ordered[k:m - k].mean(axis=0)
    raise ValueError(f"unknown aggregation {rule!r}; choose one of {', '.join(AGGREGATIONS)}")
