"""Bounds no honest upload exceeds, from public quantities (a data bound, a clip norm, a noise σ,
a power constraint), for the :class:`~testbed.algorithms.contract.TensorSpec` an algorithm
declares: the coordinator refuses a tensor outside them like any other malformed reply.

A bound with Gaussian noise in it holds with probability at least 1 − :data:`HONEST_FAILURE`
per tensor (two standard tail bounds, for Z ~ N(0, I_n)):

- norm: z ↦ ‖z‖ is 1-Lipschitz and E‖Z‖ ≤ sqrt(n), so P(‖Z‖ ≥ sqrt(n) + t) ≤ exp(−t²/2)
  (Gaussian concentration); t = sqrt(2 ln(1/f)) makes that f;
- entries: P(|Z_k| ≥ t) ≤ 2 exp(−t²/2) for one entry; over n entries (union bound)
  P(max_k |Z_k| ≥ t) ≤ 2n exp(−t²/2) = f at t = sqrt(2 ln(2n/f)).

At f = 1e-9 a run of 1000 rounds of 100 nodes refuses an honest tensor with probability below
1e-4; the bounds are a few σ wider than honest noise, so a tensor scaled far past them (1e6 ×, or
1e300) is refused, while one inside them moves the aggregate by no more than an honest node could
(robust aggregation, not these bounds, answers a hostile node inside them).

Example::

    >>> round(gaussian_norm_bound(1.0, 100), 3), round(gaussian_entry_bound(1.0, 100), 3)
    (16.438, 7.214)
    >>> gaussian_norm_bound(0.0, 100)
    0.0
"""

from __future__ import annotations

import math

#: The probability that one honest tensor exceeds a bound derived here.
HONEST_FAILURE = 1e-9


def gaussian_norm_bound(sigma: float, entries: int, failure: float = HONEST_FAILURE) -> float:
    """t with P(‖σ Z‖ ≥ t) ≤ ``failure`` for Z ~ N(0, I_entries): σ (sqrt(n) + sqrt(2 ln(1/f)))."""
    return sigma * (math.sqrt(entries) + math.sqrt(2.0 * math.log(1.0 / failure)))


def gaussian_entry_bound(sigma: float, entries: int, failure: float = HONEST_FAILURE) -> float:
    """t with P(max_k |σ Z_k| ≥ t) ≤ ``failure`` for Z ~ N(0, I_entries): σ sqrt(2 ln(2n/f))."""
    return sigma * math.sqrt(2.0 * math.log(2.0 * max(entries, 1) / failure))
