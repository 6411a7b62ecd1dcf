"""How a server combines the nodes' updates: the mean the papers use, and robust rules against
hostile nodes whose updates pass every declared check (docs/robust-aggregation.md).

Each rule is one module of testbed/algorithms/aggregations/ (or of an installed plugin: the
entry-point group ``testbed.aggregations``; testbed.algorithms.aggregations.registry), a function
of the (M, P) rows of the nodes that answered (M >= 1), their weights (or None: equal) and the
model they started from:

- ``"mean"``: Σ_k w_k u_k with the given weights (DP-PASGD eq. 7b: equal; FedAvg: n_k/n; PADPFL:
  p'_k of eq. 11), the papers' rule and the default;
- ``"norm_clip"``: each row's distance from the reference clipped to ``clip_multiple`` times the
  median of the round's distances, then the weighted mean;
- ``"trimmed_mean"``: per coordinate, the mean of the values left after dropping the
  ``trim_fraction`` largest and as many smallest (Yin et al., ICML 2018), unweighted;
- ``"median"``: the coordinate-wise median (Yin et al.), unweighted;
- ``"krum"``, ``"multi_krum"``: the row (or the mean of the ``krum_select`` rows) whose squared
  distances to its M − f − 2 nearest rows sum least (Blanchard et al., NeurIPS 2017), unweighted;
- ``"centred_clip"``: centred clipping (Karimireddy, He and Jaggi, ICML 2021, the CC update of
  Algorithm 2; the rule the bucketing paper, ICLR 2022, pairs with its Algorithm 1):
  v ← v + Σ_k w_k CLIP(u_k − v, τ_k), ``clip_iterations`` times from the reference, τ =
  ``clip_multiple`` × the median distance from it.

Any rule but the mean can run on buckets (``bucket_size`` s > 1; Karimireddy, He and Jaggi, ICLR
2022, Algorithm 1): the rows shuffled by a public stream of the round, averaged s at a time, and the
rule applied to the ⌈M/s⌉ bucket means.

Weights decide which rows take part (a row of weight 0 is left out by the caller); only the
rules registered with ``uses_weights`` (mean, norm_clip, centred_clip) use their values, and the
robust ones apply robustness before the weights: each weight is capped at the median weight
(:func:`~testbed.algorithms.aggregations.robust.robust_weights`), and each row's **pull** is bounded before its weight can scale it, at
most τ/M, as a row of equal weight 1/M at the radius τ (τ_k = τ min(1, 1/(M w_k)),
:func:`~testbed.algorithms.aggregations.robust.pull_radii`). A node that lies about its size or score (PADPFL's capped share) then has no
more say than a typical honest node.

Example::

    >>> u = np.array([[0.0, 1.0], [1.0, 1.0], [100.0, 1.0]])
    >>> Aggregation().combine(u).tolist(), Aggregation("median").combine(u).tolist()
    ([33.666666666666664, 1.0], [1.0, 1.0])
    >>> Aggregation("trimmed_mean", trim_fraction=0.34).combine(u).tolist()
    [1.0, 1.0]
    >>> Aggregation("norm_clip", clip_multiple=1.0).combine(u).round(4).tolist()  # row 3 clipped to sqrt(2)
    [0.8047, 0.6714]
    >>> Aggregation("krum", byzantine_f=0).combine(u).tolist()  # rows 1 and 2 tie: the first
    [0.0, 1.0]
    >>> Aggregation("centred_clip", clip_multiple=1.0, clip_iterations=1).combine(u).round(4).tolist()
    [0.8047, 0.6714]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from pydantic import Field

from testbed.algorithms.aggregations import registry as rules
from testbed.errors import ConfigError
from testbed.streams.rng import GLOBAL, Purpose, stream
from testbed.checked.sections import NonNegative, OnlyWith, Positive, Section, one_of


@dataclass(frozen=True)
class Aggregation:
    """A rule and its parameters, as an algorithm's server applies it each round.

    Attributes:
        rule: a registered rule's name (testbed.algorithms.aggregations.registry).
        trim_fraction: trimmed_mean: share of the rows dropped at each end, per coordinate.
        clip_multiple: norm_clip: the bound as a multiple of the median distance from the reference.
        byzantine_f: krum, multi_krum: f, the hostile rows tolerated (M > 2f + 2 for the guarantee).
        krum_select: multi_krum: how many best-scored rows are averaged (None: M − f).
        clip_iterations: centred_clip: L, the clipping iterations from the reference.
        bucket_size: s, rows averaged per bucket before the rule (1: no bucketing).
    """

    rule: str = "mean"
    trim_fraction: float = 0.1
    clip_multiple: float = 2.0
    byzantine_f: int = 1
    krum_select: int | None = None
    clip_iterations: int = 3
    bucket_size: int = 1

    def __post_init__(self) -> None:
        rules.get(self.rule)  # ValueError naming the known ones
        if self.bucket_size < 1 or (self.bucket_size > 1 and self.rule == rules.MEAN):
            raise ValueError("bucket_size: a positive count, above 1 only with a robust rule (the mean of "
                             "bucket means is the mean)")

    def combine(self, updates: np.ndarray, weights: np.ndarray | None = None,
                reference: np.ndarray | None = None, shuffle: np.random.Generator | None = None) -> np.ndarray:
        """(M, P) rows → (P,) by the rule.

        Args:
            updates: one row per node that answered, M >= 1.
            weights: (M,) weights summing to 1, used by the weighted rules (None: equal).
            reference: (P,) the model the nodes started from, which norm_clip and centred_clip
                measure changes from and Krum centres its distances on (None: the origin for the
                clipping rules, the rows being the changes; the rows' coordinate-wise median for Krum).
            shuffle: the public stream that assigns rows to buckets (:func:`bucket_stream`);
                needed when ``bucket_size`` > 1.
        """
        if self.bucket_size > 1 and updates.shape[0] > 1:
            if shuffle is None:
                raise ValueError("bucketing needs the round's public stream (bucket_stream)")
            updates, weights = buckets(updates, weights, self.bucket_size, shuffle)
        return rules.get(self.rule).combine(updates, weights, reference, self)

    @property
    def is_mean(self) -> bool:
        """Whether the rule is the papers' weighted mean of the rows as they came, so an
        algorithm's accounting of its aggregate (a sensitivity, a noise sum) still holds."""
        return self.rule == rules.MEAN


def bucket_stream(seed: int, round_index: int) -> np.random.Generator:
    """The public stream that shuffles a round's rows into buckets (keyed by the run's seed: the
    server's draw, no node's secret; a hostile node cannot choose its bucket-mates)."""
    return stream(seed, GLOBAL, round_index, Purpose.BUCKETS)


def buckets(updates: np.ndarray, weights: np.ndarray | None, size: int,
            shuffle: np.random.Generator) -> tuple[np.ndarray, np.ndarray | None]:
    """Bucketing (Karimireddy, He and Jaggi, ICLR 2022, Algorithm 1): the M rows in a random order,
    averaged ``size`` at a time into ⌈M/size⌉ bucket means (the last may be smaller), with the
    buckets' weights (their rows' sum; their mean weighted within). Hostile rows then sit among
    honest ones, and the rule sees bucket means whose spread is 1/size of the rows'."""
    m = updates.shape[0]
    order = shuffle.permutation(m)
    starts = np.arange(0, m, size)
    counts = np.diff(np.append(starts, m))
    if weights is None:
        return np.add.reduceat(updates[order], starts, axis=0) / counts[:, None], None
    w = np.asarray(weights, dtype=np.float64)[order]
    mass = np.add.reduceat(w, starts)
    sums = np.add.reduceat(updates[order] * w[:, None], starts, axis=0)
    means = np.divide(sums, mass[:, None], out=np.add.reduceat(updates[order], starts, axis=0) / counts[:, None],
                      where=mass[:, None] > 0)
    return means, mass / mass.sum()


class AggregationOptions(Section):
    """The keys of an algorithm section whose server averages updates (docs/robust-aggregation.md)."""

    ONLY_WITH = {"trim_fraction": (OnlyWith("aggregation", ("trimmed_mean",)),),
                 "clip_multiple": (OnlyWith("aggregation", ("norm_clip", "centred_clip")),),
                 "clip_iterations": (OnlyWith("aggregation", ("centred_clip",)),),
                 "bucket_size": (OnlyWith("aggregation", rules.robust_names),),
                 "byzantine_f": (OnlyWith("aggregation", ("krum", "multi_krum")),),
                 "krum_select": (OnlyWith("aggregation", ("multi_krum",)),)}

    aggregation: one_of(rules.names) = rules.MEAN  # type: ignore[valid-type]
    """mean: the paper's; norm_clip, trimmed_mean, median, krum, multi_krum, centred_clip: robust
    rules against hostile nodes (docs/robust-aggregation.md); or a rule a plugin registers."""
    trim_fraction: float = Field(0.1, ge=0, lt=0.5)
    """trimmed_mean: share of nodes dropped at each end, per coordinate."""
    clip_multiple: Positive[float] = 2.0
    """norm_clip: clip each update's change at this multiple of the round's median change norm."""
    byzantine_f: NonNegative[int] = 1
    """krum, multi_krum: f, the hostile nodes tolerated; f < (N − 2)/2."""
    krum_select: Positive[int] | None = None
    """multi_krum: how many best-scored updates are averaged; absent: the nodes that answered − f."""
    clip_iterations: Positive[int] = 3
    """centred_clip: the clipping iterations from the previous round's model."""
    bucket_size: Positive[int] = 1
    """A robust rule: average the updates this many at a time, in a random order, before the rule
    (bucketing); 1: none."""

    def aggregation_rule(self, num_nodes: int, section: str) -> Aggregation:
        """The rule of this section for a run of ``num_nodes`` nodes; ConfigError naming the key
        when Krum cannot tolerate ``byzantine_f`` of them."""
        if self.aggregation in ("krum", "multi_krum"):
            if not self.byzantine_f < (num_nodes - 2) / 2:
                raise ConfigError(f"{section}.byzantine_f", f"Krum tolerates f < (N - 2)/2 hostile nodes; "
                                                            f"{self.byzantine_f} is too many for N = {num_nodes}")
            if self.krum_select is not None and self.krum_select > num_nodes:
                raise ConfigError(f"{section}.krum_select", f"{self.krum_select} is more than the "
                                                            f"{num_nodes} nodes of the run")
        if self.aggregation in ("krum", "multi_krum") and self.bucket_size > 1:
            count = -(-num_nodes // self.bucket_size)
            if not self.byzantine_f < (count - 2) / 2:
                raise ConfigError(f"{section}.byzantine_f", f"Krum on buckets tolerates f < (B - 2)/2 hostile buckets; "
                                                            f"{self.byzantine_f} is too many for B = {count} buckets")
        return Aggregation(self.aggregation, self.trim_fraction, self.clip_multiple, self.byzantine_f,
                           self.krum_select, self.clip_iterations, self.bucket_size)
