"""``"norm_clip"``: each row's distance from the reference clipped to ``clip_multiple`` times the
median of the round's distances, then the weighted mean."""

import numpy as np

from testbed.algorithms.aggregations.robust import pull_radii, robust_weights
from testbed.algorithms.aggregations.registry import Rule


def _norm_clip(updates, weights, reference, params):
    # The bound is a multiple of the median distance: with fewer than half the rows hostile, the
    # median lies between two honest rows' distances, so hostile rows cannot raise the bound.
    # Distances and the mean come from products with the reference, never an (M, P) copy of the
    # changes (its allocation alone costs 20x the mean): ||u − c||² = ||u||² − 2 u·c + ||c||², off
    # by ~1e-16 ||c||², far below any update a node sends.
    c = np.zeros(updates.shape[1]) if reference is None else reference
    along = updates @ c
    norms = np.sqrt(np.maximum(np.einsum("ij,ij->i", updates, updates) - 2.0 * along + c @ c, 0.0))
    weights = robust_weights(weights)
    bound = pull_radii(params.clip_multiple * float(np.median(norms)), weights, len(norms))
    scale = np.divide(bound, norms, out=np.ones_like(norms), where=norms > bound)
    coef = scale / len(scale) if weights is None else weights * scale  # the weighted mean of the clipped rows
    return c + (coef @ updates - coef.sum() * c)


REGISTRATION = Rule("norm_clip", _norm_clip, uses_weights=True, order=1)
