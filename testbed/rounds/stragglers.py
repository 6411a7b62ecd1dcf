"""Emulated stragglers: which nodes miss a round, drawn from each node's own random stream.

Two models (the ``[stragglers]`` section, :class:`StragglersSection`):

- ``bernoulli``: node i misses round t with probability p, independently of everything else
  (one uniform u from the node's stream; a straggler iff u < p);
- ``deadline``: node i misses round t when its board's round time, jittered, exceeds the round's
  deadline: T_i · exp(σ z − σ²/2) > deadline_s, with T_i the modelled round time
  (nodes.stragglers.modelled_round_time_s) and one standard normal z from the node's stream. The
  lognormal factor has MEAN 1 (its median is exp(−σ²/2) < 1): the modelled time is the expected
  round time, and σ spreads it.

Every draw comes from the node's own Philox counter (seed, node, round, STRAGGLER) of
testbed.streams.counter_rng (vectorised over nodes), so a node's
fate depends only on (seed, its id, the round) and its own modelled time: sim and the MQTT
coordinator draw the same stragglers. Real deadline misses over MQTT come on top of these.

Example::

    >>> section = StragglersSection(model="bernoulli", p=0.5)
    >>> sorted(draw_stragglers(section, seed=0, round_index=3, node_ids=range(6)))
    [2, 5]
    >>> draw_stragglers(StragglersSection(), seed=0, round_index=3, node_ids=range(6))
    frozenset()
"""

from __future__ import annotations

from typing import Literal, Sequence

import numpy as np
from pydantic import Field, model_validator

from testbed.checked.sections import OnlyWith, Section
from testbed.streams.counter_rng import uniform_pairs
from testbed.streams.rng import Purpose

MODELS = ("none", "bernoulli", "deadline")


class StragglersSection(Section):
    """The ``[stragglers]`` section: which emulated nodes miss a round."""

    ONLY_WITH = {"p": (OnlyWith("model", ("bernoulli",)),), "deadline_s": (OnlyWith("model", ("deadline",)),),
                 "jitter_sigma": (OnlyWith("model", ("deadline",)),)}

    model: Literal["none", "bernoulli", "deadline"] = Field(
        "none",
        description='Straggler model: "none" (every node answers), "bernoulli" (each node misses each round '
        'with probability p), "deadline" (a node misses a round when its jittered modelled round time, from '
        "its device profile and link, exceeds deadline_s).",
    )
    p: float = Field(
        0.0, ge=0.0, lt=1.0,
        description='bernoulli: probability that a node misses a round, independently per node and round; in [0, 1).',
    )
    deadline_s: float | None = Field(
        None, gt=0.0,
        description='deadline: the round deadline in seconds (> 0); required when model = "deadline".',
    )
    jitter_sigma: float = Field(
        0.25, ge=0.0,
        description="deadline: sigma of the lognormal multiplicative jitter exp(sigma z - sigma^2/2) on the "
        "modelled round time (mean 1; 0 = no jitter, the modelled time decides).",
    )

    @model_validator(mode="after")
    def _deadline_needs_deadline_s(self) -> "StragglersSection":
        if self.model == "deadline" and self.deadline_s is None:
            raise ValueError('deadline_s: is required when model = "deadline" (the round deadline in seconds, > 0)')
        return self


def draw_stragglers(section: StragglersSection, *, seed: int, round_index: int, node_ids: Sequence[int],
                    round_time_s: np.ndarray | None = None) -> frozenset[int]:
    """Which of ``node_ids`` are emulated stragglers of round ``round_index``.

    Node i's draw comes from its own (seed, i, round_index, STRAGGLER) Philox counter only, so it does
    not depend on which other nodes are asked about (a board asks about itself alone).

    Input
    -----
    section : StragglersSection
    seed : int
        The run's seed.
    round_index : int
        The round (>= 0).
    node_ids : sequence of int, length M
        The nodes to decide for.
    round_time_s : (M,) float array, seconds, optional
        Each node's modelled round time (:func:`modelled_round_time_s`), in node_ids order;
        required for ``deadline``, ignored otherwise.

    Output
    ------
    stragglers : frozenset of int
        The ids of node_ids that miss the round. ``none`` draws nothing and returns an empty set.

    Example
    -------
    >>> s = StragglersSection(model="deadline", deadline_s=1.0, jitter_sigma=0.0)
    >>> sorted(draw_stragglers(s, seed=0, round_index=0, node_ids=[4, 7], round_time_s=np.array([0.5, 2.0])))
    [7]
    """
    ids = [int(i) for i in node_ids]
    if section.model == "none" or not ids:
        return frozenset()
    u, v = uniform_pairs(seed, ids, round_index, Purpose.STRAGGLER)
    if section.model == "bernoulli":
        return frozenset(np.asarray(ids)[u < section.p].tolist())
    if round_time_s is None:
        raise ValueError('the "deadline" straggler model needs each node\'s round_time_s')
    t = np.asarray(round_time_s, dtype=np.float64)
    if t.shape != (len(ids),) or not np.isfinite(t).all() or (t < 0).any():
        raise ValueError(f"round_time_s must be {len(ids)} finite seconds >= 0, got shape {t.shape}")
    sigma = section.jitter_sigma
    z = np.sqrt(-2.0 * np.log(u)) * np.cos(2.0 * np.pi * v)  # Box–Muller: one normal per node
    jittered_s = t * np.exp(sigma * z - 0.5 * sigma * sigma)  # lognormal factor of mean 1
    deadline_s = float(section.deadline_s)  # type: ignore[arg-type]  (set: the section's validator)
    return frozenset(np.asarray(ids)[jittered_s > deadline_s].tolist())


class StragglerDraws:
    """:func:`draw_stragglers` round after round, for a run. The bernoulli model's draws for the
    same node list (the same object: every node, no client sampling) are made for a block of rounds
    in one vectorised Philox call, not one call a round: the same values (each node's own counter).

    Example::

        >>> s = StragglersSection(model="bernoulli", p=0.5)
        >>> ids, draws = [0, 1, 2, 3], StragglerDraws(s, seed=7)
        >>> all(draws.draw(r, ids) == draw_stragglers(s, seed=7, round_index=r, node_ids=ids) for r in range(100))
        True
    """

    MAX_DRAWS = 1 << 20  # per block: rounds × nodes

    def __init__(self, section: StragglersSection, seed: int):
        self.section, self.seed = section, seed
        self._ids: Sequence[int] | None = None
        self._first, self._straggles = 0, np.zeros((0, 0), dtype=bool)
        self._id_array = np.zeros(0, dtype=np.int64)

    def draw(self, round_index: int, node_ids: Sequence[int], round_time_s: np.ndarray | None = None) -> frozenset[int]:
        """The stragglers among ``node_ids`` in round ``round_index`` (see :func:`draw_stragglers`)."""
        if self.section.model != "bernoulli" or not len(node_ids):
            return draw_stragglers(self.section, seed=self.seed, round_index=round_index, node_ids=node_ids,
                                   round_time_s=round_time_s)
        if node_ids is not self._ids or not 0 <= round_index - self._first < len(self._straggles):
            rounds = max(1, min(64, self.MAX_DRAWS // len(node_ids)))
            ids = np.asarray(node_ids, dtype=np.int64)
            u, _ = uniform_pairs(self.seed, np.tile(ids, rounds), np.repeat(np.arange(round_index, round_index + rounds),
                                                                             len(ids)), Purpose.STRAGGLER)
            self._ids, self._first, self._straggles = node_ids, round_index, (u < self.section.p).reshape(rounds, len(ids))
            self._id_array = ids
        return frozenset(self._id_array[self._straggles[round_index - self._first]].tolist())
