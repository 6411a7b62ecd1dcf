"""``[topology]``: which nodes hear each other in a decentralised run (testbed.topology)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from testbed.checked.sections import NonNegative, OnlyWith, Positive, Section, one_of
from testbed.topology import registry


class TopologySection(Section):
    """The graph of a decentralised run: each node hears its neighbours only. Static, or redrawn
    every ``coherence_rounds`` (random kinds; random_geometric nodes also move). docs/topologies.md."""

    # Which kinds read a key is each kind's registration's (its ``keys``), asked when a section is checked.
    ONLY_WITH = {**{key: (OnlyWith("kind", registry.reading(key)),)
                    for key in ("degree", "p", "rows", "path", "snr_threshold_db", "speed_mps")},
                 "round_s": (OnlyWith("speed_mps"),),
                 "coherence_rounds": (OnlyWith("kind", registry.random_names),)}

    kind: one_of(registry.names) = registry.COMPLETE  # type: ignore[valid-type]
    """complete (DWFL's paper), ring, torus, k_regular (degree), erdos_renyi (p), random_geometric
    (an edge where the free-space SNR clears snr_threshold_db, nodes placed in the radio's area; with
    the radio's pathloss = "scene", the ray-traced SNR, nodes where the scene places them),
    file (an edge list, path), or a kind a plugin registers (testbed.topology)."""
    degree: Positive[int] = 4
    """k_regular: every node's number of neighbours (N·degree even, degree < N)."""
    p: float = Field(0.1, gt=0, le=1)
    """erdos_renyi: the probability of each edge."""
    rows: Positive[int] | None = None
    """torus: the grid's rows (dividing N, >= 3); absent: the most square grid."""
    path: str | None = None
    """file: an edge list, one "i j" pair of node ids per line ("#" comments), relative to the
    experiment file."""
    snr_threshold_db: float = Field(10.0, ge=-30, le=100)
    """random_geometric: a link exists where the received SNR at full power clears this, dB."""
    speed_mps: NonNegative[float] = 0.0
    """random_geometric: the nodes walk at this speed (random waypoint), m/s; 0: static positions."""
    round_s: Positive[float] = 1.0
    """random_geometric with speed_mps: how long a round lasts for the walk, s."""
    coherence_rounds: Positive[int] | None = None
    """Redraw the graph every this many rounds (links fading in and out; random_geometric: the
    positions after the walk); absent: one graph for the whole run."""
    mixing: Literal["auto", "metropolis_hastings", "uniform"] = "auto"
    """The mixing weights: metropolis_hastings (doubly stochastic; needs a link per neighbour),
    uniform (1/d_i: what an over-the-air receiver hearing one sum can do) or auto (the algorithm's
    choice: uniform over the air, metropolis_hastings over separate links)."""
    allow_disconnected: bool = False
    """Accept a graph that falls apart (a part that never hears the rest never agrees with it)."""

    @model_validator(mode="after")
    def _kind_is_complete(self) -> "TopologySection":
        if (problem := registry.get(self.kind).check(self)) is not None:
            raise ValueError(problem)
        return self
