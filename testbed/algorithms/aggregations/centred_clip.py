"""``"centred_clip"``: centred clipping (Karimireddy, He and Jaggi, ICML 2021, the CC update of
Algorithm 2; the rule the bucketing paper, ICLR 2022, pairs with its Algorithm 1):
v ← v + Σ_k w_k CLIP(u_k − v, τ_k), ``clip_iterations`` times from the reference, τ =
``clip_multiple`` × the median distance from it."""

import numpy as np

from testbed.algorithms.aggregations.robust import pull_radii, robust_weights
from testbed.algorithms.aggregations.registry import Rule


def _centred_clip(updates, weights, reference, params):
    # Karimireddy, He and Jaggi (ICML 2021), the CC update of Algorithm 2:
    # v_{l+1} = v_l + (1/M) Σ_k CLIP(u_k − v_l, τ), CLIP(z, τ) = z min(1, τ/‖z‖), from v_0 = the
    # reference (the previous round's aggregate: these nodes send models, not momenta, so the
    # paper's start, the last aggregate momentum, is the zero change). τ is fixed for the round
    # from the distances to v_0, which no hostile row moves: clip_multiple × their median (f < M/2
    # cannot raise it). With weights, each row's pull is bounded before its weight scales it
    # (pull_radii).
    m = updates.shape[0]
    weights = robust_weights(weights)
    v = np.zeros(updates.shape[1]) if reference is None else np.array(reference, dtype=np.float64)
    radius = pull_radii(params.clip_multiple * float(np.median(np.linalg.norm(updates - v, axis=1))), weights, m)
    coef_w = np.full(m, 1.0 / m) if weights is None else np.asarray(weights, dtype=np.float64)
    for _ in range(params.clip_iterations):
        change = updates - v
        norms = np.linalg.norm(change, axis=1)
        scale = np.divide(radius, norms, out=np.ones_like(norms), where=norms > radius)
        v = v + (coef_w * scale) @ change
    return v


REGISTRATION = Rule("centred_clip", _centred_clip, uses_weights=True, order=2)
