"""Impact factors of priority-based aggregation (PADPFL, adaptive-dp.md §1.2, §5.3, §4.5): given
per node or per part in the paper's ratio notation, switched by a schedule (eq. 51), redistributed
when clients straggle, and spread participation when a client may upload at most R of T rounds;
and what bounds the numbers nodes report for them (:func:`intake_sizes`, :func:`cap_shares`).

All weight vectors are (N,) float64 over the run's nodes, p_i >= 0 and Σ p_i = 1 (eq. 2).

Example (scenario 2 of Table I: parts of 20, 35 and 5 clients, ratio "0-2-1")::

    >>> p = ratio_weights([20, 35, 5], parse_ratios("0-2-1"))
    >>> [round(float(v) * 75, 9) for v in (p[0], p[20], p[59])], round(float(p.sum()), 12)
    ([0.0, 2.0, 1.0], 1.0)
    >>> redistribute(np.array([0.5, 0.25, 0.25]), np.array([True, False, True])).tolist()
    [0.6666666666666666, 0.0, 0.3333333333333333]
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import math

import numpy as np

#: How far Σ p may be from 1 (adaptive-dp.md §7 item 1).
SUM_TOLERANCE = 1e-12


def parse_ratios(ratios: str | Sequence[float]) -> np.ndarray:
    """The paper's ratio notation, "0-1-2" (or a list of numbers): one per-client ratio per part.

    Returns:
        (K,) float64 ratios, all >= 0, not all 0. Raises ValueError otherwise.
    """
    if isinstance(ratios, str):
        try:
            values = [float(v) for v in ratios.split("-")]
        except ValueError:
            raise ValueError(f'ratios are numbers joined by "-" like "0-1-2", got {ratios!r}') from None
    else:
        values = [float(v) for v in ratios]
    r = np.asarray(values, dtype=np.float64)
    if r.size == 0 or np.any(r < 0) or not np.all(np.isfinite(r)) or r.sum() <= 0:
        raise ValueError(f"ratios must be >= 0 and not all 0, got {ratios!r}")
    return r


def ratio_weights(parts: Sequence[int], ratios: np.ndarray) -> np.ndarray:
    """Per-client impact factors from per-part ratios (adaptive-dp.md §5.3): a client of part k gets
    p = r_k / Σ_j n_j r_j, n_j the clients of part j; parts are consecutive node ids.

    Args:
        parts: (K,) clients per part. ratios: (K,) per-client ratio of each part.
    Returns:
        (Σ n_k,) the impact factors, summing to 1.
    """
    n = np.asarray(parts, dtype=np.int64)
    r = np.asarray(ratios, dtype=np.float64)
    if n.shape != r.shape:
        raise ValueError(f"{len(r)} ratios for {len(n)} parts")
    total = float(n @ r)
    if total <= 0:
        raise ValueError("every part with a non-zero ratio is empty")
    return np.repeat(r / total, n)


def link_quality_weights(num_nodes: int, seed: int, *, pathloss: str, area_m: float, carrier_hz: float,
                         power_dbm: float, noise_dbm: float, scene: Any = None) -> np.ndarray:
    """Impact factors from each client's uplink (beyond the paper): p_i ∝ log2(1 + SNR_i), the
    Shannon rate per hertz of client i's link to the server at its mean channel power gain.

    SNR_i = P β_i² / σ², β_i the large-scale amplitude of :func:`large_scale_amplitude` (clients
    dropped uniformly in an ``area_m`` square, once, from the run's seed; path loss toward the
    server at its centre: Friis, or TR 38.901 UMi/UMa with shadowing; or, with ``pathloss = "scene"``,
    ray traced from where the clients stand in ``scene`` (testbed.topology.scene.SceneKeys) to its
    server point), P and σ² from ``power_dbm`` and ``noise_dbm``. A server measures these gains from its clients' pilots: they say where a
    client is, nothing about its data, and are not charged.

    Returns:
        (num_nodes,) p, summing to 1.

    Example::

        >>> p = link_quality_weights(3, 0, pathloss="free_space", area_m=100.0, carrier_hz=2.4e9,
        ...                          power_dbm=20.0, noise_dbm=-90.0)
        >>> p.shape, round(float(p.sum()), 12)
        ((3,), 1.0)
    """
    from testbed.algorithms.dwfl_channel import Radio, large_scale_amplitude

    radio = Radio(num_nodes=num_nodes, power_w=_watts(power_dbm), noise_power_w=_watts(noise_dbm),
                  pathloss=pathloss, area_m=area_m, carrier_hz=carrier_hz, scene=scene)
    snr = radio.power_w * large_scale_amplitude(radio, seed) ** 2 / radio.noise_power_w
    rate = np.log2(1.0 + snr)
    if not rate.sum() > 0:
        raise ValueError("every client's link carries nothing at this power and noise")
    return rate / rate.sum()


def _watts(dbm: float) -> float:
    return 10.0 ** ((dbm - 30.0) / 10.0)


def check_weights(p: np.ndarray, num_nodes: int) -> str | None:
    """Why ``p`` is not a valid impact-factor vector for ``num_nodes`` clients (eq. 2); None if it is."""
    if p.shape != (num_nodes,):
        return f"{p.size} impact factors for {num_nodes} nodes"
    if not np.all(np.isfinite(p)) or np.any(p < 0):
        return "impact factors must be finite and >= 0"
    if abs(float(p.sum()) - 1.0) > SUM_TOLERANCE:
        return f"impact factors sum to {float(p.sum()):.15g}, not 1 (eq. 2)"
    return None


class ImpactSchedule:
    """Impact factors that change after given rounds (eq. 51: p^(t+1) = p^(t) + α^(t), Σ α = 0).

    Args:
        phases: (first round index, p) pairs, the first at round 0, ascending; each p valid.
    Example::

        >>> s = ImpactSchedule([(0, np.array([0.0, 1.0])), (10, np.array([1.0, 0.0]))])
        >>> s.at(9).tolist(), s.at(10).tolist(), s.alpha(9).tolist()
        ([0.0, 1.0], [1.0, 0.0], [1.0, -1.0])
    """

    def __init__(self, phases: Sequence[tuple[int, np.ndarray]]):
        starts = [int(s) for s, _ in phases]
        if not starts or starts[0] != 0 or any(b <= a for a, b in zip(starts, starts[1:])):
            raise ValueError(f"phases must start at round 0 and ascend, got starts {starts}")
        self.starts = np.asarray(starts)
        self.weights = np.stack([np.asarray(p, dtype=np.float64) for _, p in phases])  # (phases, N)
        for p in self.weights:
            problem = check_weights(p, self.weights.shape[1])
            if problem is not None:
                raise ValueError(problem)

    def at(self, round_index: int) -> np.ndarray:
        """(N,) p of the aggregation of round ``round_index`` (0-based); checked again (eq. 2)."""
        p = self.weights[int(np.searchsorted(self.starts, round_index, side="right")) - 1]
        problem = check_weights(p, p.shape[0])
        if problem is not None:
            raise ValueError(f"round {round_index}: {problem}")
        return p

    def alpha(self, round_index: int) -> np.ndarray:
        """(N,) α^(t) = p of the next round − p of this one (eq. 51); Σ α = 0, |α_i| <= 1."""
        return self.at(round_index + 1) - self.at(round_index)


def redistribute(p: np.ndarray, contributing: np.ndarray) -> np.ndarray:
    """The straggler rule (adaptive-dp.md §0 item 1: the server "can distribute p_k among counterpart
    clients for that iteration"), proportionally: p'_i = p_i / Σ_{j∈S} p_j on the contributing
    clients S, 0 elsewhere. All zeros when Σ_{j∈S} p_j = 0 (nobody with weight contributed).

    Args:
        p: (N,) the round's impact factors. contributing: (N,) bool.
    Returns:
        (N,) p' with Σ = 1 (or all zeros).
    """
    kept = np.where(contributing, p, 0.0)
    total = kept.sum()
    return kept / total if total > 0 else kept


def cap_shares(p: np.ndarray, cap: float | None) -> np.ndarray:
    """``p`` ((N,) weights >= 0 summing to 1, or all zeros) with no share above ``cap``: every share
    above it is cut to the cap and the excess goes to the others in proportion to their shares
    (repeated until none is above: at most one pass per node). A cap below 1/k, k the nodes with
    weight, cannot be met: those k get 1/k each. All zeros stay all zeros; ``cap`` None (or >= 1)
    returns ``p``.

    This bounds what any one node can take of an aggregate whatever it reports (a size, a score, a
    link): its share is at most ``max(cap, 1/k)``.

    Example::

        >>> cap_shares(np.array([0.9, 0.06, 0.04]), 0.5).round(12).tolist()
        [0.5, 0.3, 0.2]
        >>> cap_shares(np.array([0.7, 0.3, 0.0]), 0.4).tolist()
        [0.5, 0.5, 0.0]
    """
    if cap is None or cap >= 1.0 or not p.any():
        return p
    out = np.asarray(p, dtype=np.float64) / p.sum()
    positive = out > 0
    limit = max(cap, 1.0 / int(positive.sum()))
    capped = np.zeros(out.shape, dtype=bool)
    while True:
        over = (out > limit * (1 + 1e-12)) & ~capped
        if not over.any():
            return out
        capped |= over
        free = positive & ~capped
        out[capped] = limit
        rest = 1.0 - limit * int(capped.sum())
        share = out[free].sum()
        if share <= 0:  # only capped nodes carry weight (k * limit = 1)
            return out
        out[free] = out[free] / share * rest  # in this order: tiny shares never overflow


def intake_sizes(node_ids: Sequence[int], claimed: np.ndarray, num_nodes: int,
                 declared: Mapping[int, int] | None = None) -> np.ndarray:
    """(N,) every node's training-set size from what the nodes that answered claimed (``claimed``
    (M,), row i node ``node_ids[i]``), each checked against what is declared: a claim is taken
    only if it is a finite number >= 1 and at most the node's size in the run's partition
    (``declared``, node → rows; None: no upper bound known). A node that did not answer, or whose
    claim is refused, gets the mean of the accepted claims (all 1, equal weights, if none was).

    A node can then under-report (and lose weight) but never claim more data than it holds.

    Example::

        >>> intake_sizes((0, 1, 2), np.array([10.0, 1e9, -150.0]), 4, {0: 10, 1: 30, 2: 60, 3: 5}).tolist()
        [10.0, 10.0, 10.0, 10.0]
    """
    sizes = np.full(num_nodes, np.nan)
    if len(node_ids):
        ids = np.asarray(node_ids, dtype=np.int64)
        claims = np.asarray(claimed, dtype=np.float64).reshape(len(ids))
        upper = np.full(len(ids), np.inf) if declared is None else np.array([declared[int(n)] for n in ids], float)
        ok = np.isfinite(claims) & (claims >= 1.0) & (claims <= upper)
        sizes[ids[ok]] = claims[ok]
    accepted = ~np.isnan(sizes)
    return np.where(accepted, sizes, sizes[accepted].mean() if accepted.any() else 1.0)


def spread_uploads(node_ids: np.ndarray, num_nodes: int, round_index: int, rounds: int, uploads: int) -> np.ndarray:
    """Whether each node uploads in ``round_index`` when it may upload R of T rounds: node i uploads
    in round r iff ⌊(r+1)R/T + o_i/N⌋ > ⌊rR/T + o_i/N⌋, so exactly R times, evenly spread and
    staggered across nodes (about NR/T uploads per round, NbAFL's K of N).

    The offsets o_i = i·s mod N (s the stride of :func:`interleaving_stride`, coprime with N) are a
    permutation of 0..N−1 that puts consecutive ids far apart: a round's uploaders are spread over
    the ids, so a block of consecutive ids (Table I's parts) is heard in every round, not one block
    a round as staggering by i itself would give.

    Args:
        node_ids: (M,) ids. num_nodes: N. round_index: r in [0, T). rounds: T. uploads: R <= T.
    Returns:
        (M,) bool.

    Example::

        >>> due = np.stack([spread_uploads(np.arange(6), 6, r, 3, 1) for r in range(3)])
        >>> due.sum(axis=0).tolist(), due.sum(axis=1).tolist()
        ([1, 1, 1, 1, 1, 1], [2, 2, 2])
    """
    i = np.asarray(node_ids, dtype=np.int64)
    offset = (i * interleaving_stride(num_nodes)) % num_nodes
    whole = rounds * num_nodes  # in integers: ⌊(rRN + o T)/(TN)⌋, no rounding at the boundaries
    return ((round_index + 1) * uploads * num_nodes + offset * rounds) // whole > (round_index * uploads * num_nodes + offset * rounds) // whole


def interleaving_stride(num_nodes: int) -> int:
    """s coprime with N nearest to N(√5 − 1)/2 (the golden-ratio stride): i ↦ i·s mod N is a
    permutation that scatters any run of consecutive ids evenly over 0..N−1 (Weyl's sequence).

    Example::

        >>> interleaving_stride(60), interleaving_stride(1)
        (37, 1)
    """
    if num_nodes <= 2:
        return 1
    nearest = round(num_nodes * (math.sqrt(5.0) - 1.0) / 2.0)
    for step in range(num_nodes):  # a coprime is within a few steps (1 always is)
        for s in (nearest - step, nearest + step):
            if 1 <= s < num_nodes and math.gcd(s, num_nodes) == 1:
                return s
    return 1
