"""The resource cost model of DP-PASGD (Hu et al., §5.1): c1 per communication round, c2 per step.

Units are the paper's abstract ones (c1 = 100, c2 = 1 by default) unless a calibration file of
`testbed calibrate` gives them in joules or seconds.

Example::

    >>> resource_cost(steps=90, tau=10, c1=100.0, c2=1.0)
    990.0
"""

from __future__ import annotations


def resource_cost(steps: float, tau: float, c1: float, c2: float) -> float:
    """C = c1·K/τ + c2·K, eq. (8): K/τ rounds of communication plus K local steps."""
    return c1 * steps / tau + c2 * steps


def max_steps(tau: float, cost_budget: float, c1: float, c2: float) -> float:
    """The largest (real) K with c1·K/τ + c2·K <= C_th: C_th·τ/(c1 + c2·τ) (from eq. 10c)."""
    return cost_budget * tau / (c1 + c2 * tau)
