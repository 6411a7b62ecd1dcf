"""``"krum"``, ``"multi_krum"``: the row (or the mean of the ``krum_select`` rows) whose squared
distances to its M − f − 2 nearest rows sum least (Blanchard et al., NeurIPS 2017), unweighted."""

import numpy as np

from testbed.algorithms.aggregations.robust import coordinate_median
from testbed.algorithms.aggregations.registry import Rule


def krum_scores(updates: np.ndarray, byzantine_f: int, reference: np.ndarray | None = None) -> np.ndarray:
    """(M,) Krum scores (Blanchard et al. 2017): each row's sum of squared distances to its
    k = M − f − 2 nearest other rows (at least 1, at most M − 1; zeros for M = 1).

    The pairwise distances come from one Gram matrix (||a − b||² = ||a||² + ||b||² − 2 a·b,
    O(M² P) in one matrix product) of the rows centred on ``reference`` (the model the nodes
    started from; None: the rows' coordinate-wise median): a centre no hostile row can move keeps
    the honest rows' distances exact however far a hostile row lies. A distance that overflows
    counts as infinite."""
    m = updates.shape[0]
    if m == 1:
        return np.zeros(1)
    centred = updates - (coordinate_median(updates) if reference is None else reference)
    with np.errstate(over="ignore", invalid="ignore"):
        gram = centred @ centred.T
        sq = np.diag(gram).copy()
        dist = sq[:, None] + sq[None, :] - 2.0 * gram
    dist = np.where(np.isnan(dist), np.inf, np.maximum(dist, 0.0))
    np.fill_diagonal(dist, np.inf)
    k = min(max(m - byzantine_f - 2, 1), m - 1)
    return np.partition(dist, k - 1, axis=1)[:, :k].sum(axis=1)


def krum_choice(updates: np.ndarray, byzantine_f: int, count: int, reference: np.ndarray | None = None) -> np.ndarray:
    """Indices of the ``count`` rows of least Krum score, best first (ties: the lower index)."""
    return np.argsort(krum_scores(updates, byzantine_f, reference), kind="stable")[:count]


def _krum(updates, weights, reference, params):
    return updates[krum_choice(updates, params.byzantine_f, 1, reference)[0]].copy()


def _multi_krum(updates, weights, reference, params):
    m = updates.shape[0]
    count = params.krum_select if params.krum_select is not None else m - params.byzantine_f
    chosen = np.sort(krum_choice(updates, params.byzantine_f, min(max(count, 1), m), reference))
    return updates[chosen].mean(axis=0)


REGISTRATION = (Rule("krum", _krum, order=5), Rule("multi_krum", _multi_krum, order=6))
