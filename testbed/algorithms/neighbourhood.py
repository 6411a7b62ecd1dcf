"""How a node of D-PSGD or gossip combines its own model with the payloads it decoded from its
neighbours: the papers' mixing, or a robust rule against hostile neighbours whose payloads pass
every declared check (docs/robust-aggregation.md, "Gossip and D-PSGD").

Each rule runs on M nodes at once: ``own`` (M, P), the model the node weights exactly;
``payloads`` (M, D, P), slot j of node i the payload of its j-th neighbour (D the round graph's
largest degree; a slot past the node's degree or of a silent neighbour is not ``heard``);
``weights`` (M, D) the mixing weights W_ij of those slots. Loops run over the D slots, each
vectorised across the nodes, so a node's result does not depend on which other nodes share its
stack (a board computes it alone, bit for bit as the simulation does).

- ``"mean"``: the papers' x_i ← w_i x_i + Σ_j W_ij s_j; computed by the channel's sparse product,
  not here (:class:`~testbed.algorithms.gossip_channel.GraphChannel`).
- ``"self_centred_clip"`` (ClippedGossip, He, Karimireddy and Jaggi 2022, the self-centred
  clipping update of Algorithm 1): x_i ← x_i + Σ_j W_ij CLIP(s_j − x_i, τ), CLIP(z, τ) =
  z min(1, τ/‖z‖). One neighbour moves x_i by at most W_ij τ per round whatever it sends. τ is
  public (:func:`clip_radius`), never a function of a model a neighbour moved.
- ``"trimmed_mean"`` (BRIDGE-T, Yang and Bajwa 2019, the screening step of Algorithm 1): per
  coordinate, the node drops the b largest and b smallest of its heard neighbours' values and
  averages the rest with its own, (x_i + Σ_{kept} s_j) / (1 + k_i − 2b); with k_i <= 2b heard it
  keeps its own model. With at most b hostile neighbours every coordinate stays within its honest
  neighbours' and its own range.
- ``"median"`` (BRIDGE-M, ibid.): the coordinate-wise median of its own value and its heard
  neighbours'; within the honest values' range while fewer than half of them are hostile.

Example::

    >>> own = np.array([[0.0, 0.0]])
    >>> payloads = np.array([[[1.0, 0.0], [0.0, 100.0], [9.0, 9.0]]])   # the third slot unheard
    >>> w, heard = np.array([[0.25, 0.25, 0.25]]), np.array([[True, True, False]])
    >>> self_centred_clip(own, payloads, w, heard, radius=2.0).tolist()
    [[0.25, 0.5]]
    >>> median(own, payloads, heard).tolist(), trimmed_mean(own, payloads, heard, trim=0).tolist()
    ([[0.0, 0.0]], [[0.3333333333333333, 33.333333333333336]])
"""

from __future__ import annotations

import math

import numpy as np

#: The node-side rules of D-PSGD and gossip ("mean": the paper's mixing, the default).
NEIGHBOURHOOD_RULES = ("mean", "self_centred_clip", "trimmed_mean", "median")


def clip_radius(clip_multiple: float, lr: float, gmax: float, sigma: float, num_params: int,
                local_steps: int = 1) -> float:
    """τ of self-centred clipping, from the round's public quantities only: ``clip_multiple`` ×
    (γ g_max × steps, how far one honest step moves a model, + σ sqrt(P), the norm of the noise on
    an honest payload). A hostile neighbour cannot raise it, and it does not grow with the models."""
    return clip_multiple * (lr * gmax * local_steps + sigma * math.sqrt(num_params))


def self_centred_clip(own: np.ndarray, payloads: np.ndarray, weights: np.ndarray, heard: np.ndarray,
                      radius: float) -> np.ndarray:
    """(M, P) x_i + Σ_j W_ij CLIP(s_j − x_i, τ) over the heard slots (ClippedGossip, Algorithm 1)."""
    new = np.array(own, dtype=np.float64, copy=True)
    for j in range(payloads.shape[1]):
        change = payloads[:, j] - own
        norm = np.sqrt(np.einsum("ij,ij->i", change, change))
        scale = np.divide(radius, norm, out=np.ones_like(norm), where=norm > radius)
        coef = np.where(heard[:, j], weights[:, j] * scale, 0.0)
        new += coef[:, None] * change
    return new


def _sorted_heard(payloads: np.ndarray, heard: np.ndarray) -> np.ndarray:
    """(M, D, P) each coordinate's heard values in increasing order, the unheard slots last (+inf)."""
    values = np.where(heard[:, :, None], payloads, np.inf)
    return np.sort(values, axis=1)


def trimmed_mean(own: np.ndarray, payloads: np.ndarray, heard: np.ndarray, trim: int) -> np.ndarray:
    """(M, P) BRIDGE-T: own and the heard neighbours' values left after dropping the ``trim``
    largest and smallest per coordinate, averaged; own alone when no neighbour's value is left."""
    ordered = _sorted_heard(payloads, heard)
    count = heard.sum(axis=1)
    total = np.array(own, dtype=np.float64, copy=True)
    for j in range(payloads.shape[1]):
        keep = (j >= trim) & (j < count - trim)
        total += np.where(keep[:, None], ordered[:, j], 0.0)
    return total / (1.0 + np.maximum(count - 2 * trim, 0))[:, None]


def median(own: np.ndarray, payloads: np.ndarray, heard: np.ndarray) -> np.ndarray:
    """(M, P) BRIDGE-M: the coordinate-wise median of own and the heard neighbours' values."""
    values = np.concatenate([np.asarray(own, dtype=np.float64)[:, None], payloads], axis=1)
    ordered = _sorted_heard(values, np.concatenate([np.ones((own.shape[0], 1), dtype=bool), heard], axis=1))
    count = 1 + heard.sum(axis=1)
    low = np.take_along_axis(ordered, ((count - 1) // 2)[:, None, None], axis=1)[:, 0]
    high = np.take_along_axis(ordered, (count // 2)[:, None, None], axis=1)[:, 0]
    return np.where((count % 2 == 1)[:, None], low, 0.5 * (low + high))
