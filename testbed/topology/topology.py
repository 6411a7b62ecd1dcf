"""A run's topology over its rounds: the graph of every coherence block and its mixing weights.

Built from ``[topology]`` (:class:`~testbed.topology.section.TopologySection`), N and the run's
seed, plus the radio's :class:`~testbed.topology.geometric.LinkBudget` for a kind placed by the
radio (``random_geometric``). Each kind's graph is drawn by its registration
(testbed.topology: one module each, or a plugin's).
Block b's graph is drawn from ``stream(seed, GLOBAL, b, TOPOLOGY)`` (positions at block 0 from
round −1's stream), so every process of a run (coordinator, channel emulator, boards) draws the
same graph without exchanging it.

Example::

    >>> from testbed.topology.section import TopologySection
    >>> topo = Topology(TopologySection(kind="ring"), num_nodes=6, seed=0)
    >>> topo.graph(0).neighbours(0).tolist(), topo.is_complete
    ([1, 5], False)
    >>> topo.describe(rounds=10, default_mixing="metropolis_hastings")["spectral_gap"]
    0.333333333333
"""

from __future__ import annotations

from typing import Any

import numpy as np

from channel import FadingSchedule
from testbed.errors import ConfigError
from testbed.streams.rng import GLOBAL, Purpose, stream
from testbed.topology import registry
from testbed.topology.geometric import LinkBudget, RandomWaypoint, initial_positions
from testbed.topology.graph import Graph
from testbed.topology.mixing import Mixing, complete_graph_gap, mixing_weights, spectral_gap
from testbed.topology.placement import placement_record
from testbed.topology.section import TopologySection

__all__ = ["Topology", "MAX_ADJACENCY_ENTRIES"]

#: A graph's directed entries (2E) at most: 5·10⁷ is 400 MB per int64 array, checked before any is made.
MAX_ADJACENCY_ENTRIES = 50_000_000


class Topology:
    """The graphs of a run.

    Args:
        section: the ``[topology]`` section.
        num_nodes: N.
        seed: the run's seed.
        link_budget: the radio's (``random_geometric`` needs it).
    """

    def __init__(self, section: TopologySection, num_nodes: int, seed: int,
                 link_budget: LinkBudget | None = None) -> None:
        self.section, self.num_nodes, self.seed, self.link_budget = section, num_nodes, seed, link_budget
        self.schedule = FadingSchedule(section.coherence_rounds)
        self._graphs: dict[int, Graph] = {}
        self._walk: RandomWaypoint | None = None
        self._check_size()

    @property
    def kind(self) -> str:
        return self.section.kind

    @property
    def registration(self) -> registry.Kind:
        return registry.get(self.kind)

    @property
    def is_complete(self) -> bool:
        """The complete graph in every round (DWFL's paper: the algorithm keeps its dense path)."""
        return self.kind == registry.COMPLETE

    def resolved_mixing(self, default: str) -> str:
        """The mixing rule: the section's, or the algorithm's ``default`` for ``"auto"``."""
        return default if self.section.mixing == "auto" else self.section.mixing

    def graph(self, round_index: int) -> Graph:
        """The graph of ``round_index``'s block (drawn once per block)."""
        block = self.schedule.block_index(round_index)
        if block not in self._graphs:
            self._graphs = {b: g for b, g in self._graphs.items() if b >= block - 1}  # keep the window small
            self._graphs[block] = self._draw(block)
        return self._graphs[block]

    def mixing(self, round_index: int, default: str) -> Mixing:
        """W of the round's graph under the resolved rule."""
        return mixing_weights(self.graph(round_index), self.resolved_mixing(default))

    def positions_m(self, round_index: int) -> np.ndarray | None:
        """(N, 2) positions at the round's block (a kind placed by the radio), else None."""
        if not self.registration.placed_by_radio:
            return None
        return self.positions_of_block(self.schedule.block_index(round_index))

    def positions_of_block(self, block: int) -> np.ndarray:
        """(N, 2) the nodes' positions in coherence block ``block``: placed in the radio's area from
        the run's seed, then walking (random waypoint), or where they stand in the radio's scene
        at the block's first round; ConfigError without a link budget."""
        site = self.scene_site()
        if site is not None:
            return site.positions_m(self.scene_block(block))[:, :2]
        return self._walker().positions(block)

    def scene_site(self) -> Any:
        """The radio's testbed.topology.scene.SceneSite when it is ray traced, else None."""
        scene = None if self.link_budget is None else self.link_budget.scene
        return None if scene is None else scene.site(self.num_nodes, self.seed)

    def scene_block(self, block: int) -> int:
        """The scene's block (the radio's coherence block) at the first round of topology block ``block``."""
        return self.scene_site().block_of(block * (self.section.coherence_rounds or 1))

    def check(self, rounds: int) -> None:
        """Every block of ``rounds`` rounds is drawable and (unless allowed) connected; raises
        ConfigError naming the key."""
        if self.is_complete:  # connected by construction: never build its N² entries to be told so
            return
        blocks = sorted({self.schedule.block_index(t) for t in range(max(rounds, 1))})
        for block in blocks:
            g = self.graph(block * (self.section.coherence_rounds or 1))
            if not self.section.allow_disconnected and not g.is_connected:
                parts = int(g.components.max()) + 1
                raise ConfigError("topology.allow_disconnected",
                                  f"the {self.kind} graph of block {block} falls into {parts} parts; densify it "
                                  "or set allow_disconnected = true")

    def describe(self, rounds: int, default_mixing: str) -> dict[str, Any]:
        """What the summary says of the topology (``topology`` in summary.json): the kind, the
        mixing rule, degrees and the spectral gap of W in the first block."""
        rule = self.resolved_mixing(default_mixing)
        n = self.num_nodes
        if self.is_complete:  # known in closed form; never build N² entries for the summary
            gap = complete_graph_gap(n, rule)
            degrees = np.full(n, n - 1)
        else:
            g = self.graph(0)
            gap, degrees = spectral_gap(mixing_weights(g, rule)), g.degrees
        out: dict[str, Any] = {"kind": self.kind, "mixing": rule, "spectral_gap": round(float(gap), 12),
                               "mean_degree": float(degrees.mean()), "min_degree": int(degrees.min()),
                               "max_degree": int(degrees.max()),
                               "coherence_rounds": self.section.coherence_rounds,
                               "blocks": len({self.schedule.block_index(t) for t in range(max(rounds, 1))})}
        if self.registration.placed_by_radio and self.scene_site() is None:
            out["range_m"] = self.range_m()
        out.update(placement_record(self))  # where the nodes stand, for the HTML report
        return out

    # ---------------------------------------------------------------------------------------- drawing

    def _draw(self, block: int) -> Graph:
        s, n, kind = self.section, self.num_nodes, self.registration
        if self.is_complete and n * (n - 1) > MAX_ADJACENCY_ENTRIES:  # built only by algorithms without a dense path
            raise ConfigError("topology.kind", f"the complete graph of {n} nodes holds {n * (n - 1):.3g} links "
                              f"(the limit is {MAX_ADJACENCY_ENTRIES:.0e}); choose a sparse kind")
        try:
            return kind.draw(self, block, stream(self.seed, GLOBAL, block, Purpose.TOPOLOGY))
        except (ValueError, OSError) as exc:
            raise ConfigError(f"topology.{kind.size_key}", str(exc)) from None

    def range_m(self) -> float:
        """The radio's range at the section's SNR threshold, m; ConfigError without a link budget."""
        if self.link_budget is None:
            raise ConfigError("topology.kind", f"{self.kind} needs the radio's link budget; this algorithm has none")
        return self.link_budget.range_m(self.section.snr_threshold_db)

    def _walker(self) -> RandomWaypoint:
        if self._walk is None:
            budget = self.link_budget
            if budget is None:
                self.range_m()  # raises
            area = budget.area_m  # type: ignore[union-attr]
            start = initial_positions(self.num_nodes, area, stream(self.seed, GLOBAL, -1, Purpose.TOPOLOGY))
            block_s = (self.section.coherence_rounds or 1) * self.section.round_s
            self._walk = RandomWaypoint(start, area, self.section.speed_mps, block_s,
                                        lambda b: stream(self.seed, GLOBAL, b, Purpose.TOPOLOGY))
        return self._walk

    def _check_size(self) -> None:
        """Refuse, before anything is allocated, a graph whose adjacency would not fit."""
        if self.is_complete:
            return  # the algorithms keep their dense path; the graph is built only for small N
        kind = self.registration
        expected = kind.expected_entries(self)
        if expected is not None and expected > MAX_ADJACENCY_ENTRIES:
            raise ConfigError(f"topology.{kind.size_key}",
                              f"the graph would hold about {expected:.3g} links (the limit is {MAX_ADJACENCY_ENTRIES:.0e}); "
                              "make it sparser")
