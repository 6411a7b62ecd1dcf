"""A run's topology over its rounds: the graph of every coherence block and its mixing weights.

Built from ``[topology]`` (:class:`~testbed.topology.section.TopologySection`), N and the run's
seed, plus the radio's :class:`~testbed.topology.geometric.LinkBudget` for ``random_geometric``.
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

from pathlib import Path
from typing import Any

import numpy as np

from channel import FadingSchedule
from testbed.errors import ConfigError, UserError
from testbed.streams.rng import GLOBAL, Purpose, stream
from testbed.topology import kinds
from testbed.topology.geometric import LinkBudget, RandomWaypoint, geometric_graph, initial_positions
from testbed.topology.graph import Graph
from testbed.topology.mixing import Mixing, complete_graph_gap, mixing_weights, spectral_gap
from testbed.topology.section import TopologySection

__all__ = ["Topology", "MAX_ADJACENCY_ENTRIES"]

#: A graph's directed entries (2E) at most: 5·10⁷ is 400 MB per int64 array, checked before any is made.
MAX_ADJACENCY_ENTRIES = 50_000_000
#: The shortest line that holds an edge ("0 1\\n"): a file's size bounds its edges by this.
_MIN_EDGE_LINE_BYTES = 4
#: Bytes held per edge at the peak of reading an edge list (its ids, both directions, the sort's
#: keys and copies, the CSR rows): an estimate that errs high.
_EDGE_PEAK_BYTES = 96


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
    def is_complete(self) -> bool:
        """The complete graph in every round (DWFL's paper: the algorithm keeps its dense path)."""
        return self.kind == "complete"

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
        """(N, 2) positions at the round's block (random_geometric), else None."""
        if self.kind != "random_geometric":
            return None
        return self._walker().positions(self.schedule.block_index(round_index))

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
        if self.kind == "random_geometric":
            out["range_m"] = self._range_m()
        return out

    # ---------------------------------------------------------------------------------------- drawing

    def _draw(self, block: int) -> Graph:
        s, n = self.section, self.num_nodes
        try:
            if s.kind == "complete":  # built only by algorithms without a dense path (the baselines)
                if n * (n - 1) > MAX_ADJACENCY_ENTRIES:
                    raise ConfigError("topology.kind", f"the complete graph of {n} nodes holds {n * (n - 1):.3g} links "
                                      f"(the limit is {MAX_ADJACENCY_ENTRIES:.0e}); choose a sparse kind")
                return Graph.complete(n)
            if s.kind == "ring":
                return kinds.ring(n)
            if s.kind == "torus":
                return kinds.torus(n, s.rows)
            if s.kind == "file":
                return kinds.from_edge_list(n, s.path, MAX_ADJACENCY_ENTRIES // 2)  # type: ignore[arg-type]  # resolved by testbed.assembly.config
            rng = stream(self.seed, GLOBAL, block, Purpose.TOPOLOGY)
            if s.kind == "k_regular":
                return kinds.k_regular(n, s.degree, rng)
            if s.kind == "erdos_renyi":
                return kinds.erdos_renyi(n, s.p, rng)
            return geometric_graph(self._walker().positions(block), self._range_m())
        except (ValueError, OSError) as exc:
            raise ConfigError(f"topology.{_key_of(s.kind)}", str(exc)) from None

    def _range_m(self) -> float:
        if self.link_budget is None:
            raise ConfigError("topology.kind", "random_geometric needs the radio's link budget; this algorithm has none")
        return self.link_budget.range_m(self.section.snr_threshold_db)

    def _walker(self) -> RandomWaypoint:
        if self._walk is None:
            budget = self.link_budget
            if budget is None:
                self._range_m()  # raises
            area = budget.area_m  # type: ignore[union-attr]
            start = initial_positions(self.num_nodes, area, stream(self.seed, GLOBAL, -1, Purpose.TOPOLOGY))
            block_s = (self.section.coherence_rounds or 1) * self.section.round_s
            self._walk = RandomWaypoint(start, area, self.section.speed_mps, block_s,
                                        lambda b: stream(self.seed, GLOBAL, b, Purpose.TOPOLOGY))
        return self._walk

    def _check_size(self) -> None:
        """Refuse, before anything is allocated, a graph whose adjacency would not fit."""
        s, n = self.section, self.num_nodes
        if s.kind == "complete":
            return  # the algorithms keep their dense path; the graph is built only for small N
        expected = {"ring": 2.0 * n, "torus": 4.0 * n, "k_regular": float(n) * s.degree,
                    "erdos_renyi": s.p * n * (n - 1)}.get(s.kind)
        if s.kind == "random_geometric" and self.link_budget is not None:
            share = min(1.0, np.pi * self._range_m() ** 2 / self.link_budget.area_m ** 2)
            expected = share * n * (n - 1)
        if s.kind == "file" and s.path is not None:
            expected = self._file_entries(s.path)
        if expected is not None and expected > MAX_ADJACENCY_ENTRIES:
            raise ConfigError(f"topology.{_key_of(s.kind)}",
                              f"the graph would hold about {expected:.3g} links (the limit is {MAX_ADJACENCY_ENTRIES:.0e}); "
                              "make it sparser")

    def _file_entries(self, path: str) -> float:
        """The most directed entries an edge list file can give, from its size before a byte is
        read (its lines are at least "i j\\n"), refused if the graph would not fit in the memory
        this machine has available (ConfigError naming topology.path)."""
        from testbed.util import memory
        from testbed.util.userfiles import regular_file

        n = self.num_nodes
        try:
            size = regular_file(Path(path), kinds.max_edge_list_bytes(n, MAX_ADJACENCY_ENTRIES // 2), "")
        except UserError as exc:
            raise ConfigError("topology.path", str(exc).strip()) from None
        edges = min(size // _MIN_EDGE_LINE_BYTES, n * (n - 1) // 2)
        need, have = edges * _EDGE_PEAK_BYTES, memory.available_bytes()
        if have is not None and need > have:
            raise ConfigError("topology.path", f"{path}: up to {edges:,} edges need about {need / 2**20:,.0f} MiB to "
                                               f"read, this machine has {have / 2**20:,.0f} MiB available")
        return 2.0 * edges


def _key_of(kind: str) -> str:
    """The key that sets a kind's size, named in its refusals."""
    return {"k_regular": "degree", "erdos_renyi": "p", "random_geometric": "snr_threshold_db",
            "torus": "rows", "file": "path"}.get(kind, "kind")
