"""What the robust rules share: weights capped at the median weight, each row's pull bounded before
its weight scales it (the order robustness comes in: before the weights), and the coordinate-wise
median. No REGISTRATION: not a rule itself."""

from __future__ import annotations

import numpy as np


def robust_weights(weights: np.ndarray | None) -> np.ndarray | None:
    """The weights a robust weighted rule uses: each capped at the median weight, then renormalised.
    With fewer than half the rows hostile the median lies between two honest weights, so a node
    lying about its size or score (PADPFL's capped share) gets no more say than a typical honest
    node, and no honest node loses its share to it; a weight below the median still lowers a row's
    say. Equal weights are unchanged."""
    if weights is None:
        return None
    w = np.asarray(weights, dtype=np.float64)
    capped = np.minimum(w, float(np.median(w)))
    return capped / capped.sum()


def pull_radii(radius: float, weights: np.ndarray | None, m: int) -> float | np.ndarray:
    """Each row's clip radius so that its pull on a weighted mean, w_k ‖clipped change‖, is at most
    radius/M, an equal-weight row's at the radius: τ_k = τ min(1, 1/(M w_k)) (None: τ for all).
    Robustness comes before the weights: a large weight shrinks a row's radius, never widens it."""
    if weights is None:
        return radius
    with np.errstate(divide="ignore"):
        return radius * np.minimum(1.0, 1.0 / (m * np.asarray(weights, dtype=np.float64)))


def coordinate_median(rows: np.ndarray) -> np.ndarray:
    """(P,) the median of each column of the finite rows (M, P): np.median's values, from one
    partition (np.median also sorts NaNs aside, which a checked update never holds: 4x slower)."""
    m = rows.shape[0]
    if m % 2:
        return np.partition(rows, m // 2, axis=0)[m // 2]
    middle = np.partition(rows, (m // 2 - 1, m // 2), axis=0)[m // 2 - 1:m // 2 + 1]
    return middle.mean(axis=0)
