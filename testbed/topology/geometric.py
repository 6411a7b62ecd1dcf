"""The graph the radio gives: nodes placed in a square, an edge where the link's SNR clears a threshold.

Link budget (free space, Friis): node k's signal reaches node i at distance d with received SNR
P · 10^(−FSPL(d)/10) / (2σ_m²) (complex noise power 2σ_m², σ_m² per real rail, as the rest of the
channel), FSPL(d) = 20 log10(4π d f / c) (channel.free_space_pathloss_db). The SNR falls with d, so
"clears the threshold" is "within the range" r, where FSPL(r) = 10 log10(P / (2σ_m²)) − threshold;
the graph is the random geometric graph of radius r (Penrose), drawn with the same correctly rounded
operations (no fused or reordered sums) on every machine, so that a board draws the same edges.

Mobility (random waypoint, Bettstetter): every node walks toward a waypoint drawn uniformly in the
area at ``speed_mps``; on arrival it pauses for the rest of the block and draws the next waypoint.
Positions are those at the start of each coherence block; block b's draws come from the block's
stream, so block b depends only on the seed and b.

Example::

    >>> import numpy as np
    >>> budget = LinkBudget(power_w=1.0, noise_power_w=1e-12, carrier_hz=2.4e9, area_m=100.0)
    >>> round(budget.range_m(snr_threshold_db=10.0), 1)
    2222.7
    >>> g = geometric_graph(np.array([[0.0, 0.0], [3.0, 4.0], [30.0, 40.0]]), range_m=5.0)
    >>> g.edges().tolist()
    [[0, 1]]
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from channel import free_space_pathloss_db
from testbed.topology.graph import Graph, concatenated_ranges

__all__ = ["LinkBudget", "geometric_graph", "initial_positions", "RandomWaypoint"]

#: Squared distances are compared in chunks of about this many pairs (8 MB of float64 per array),
#: so memory does not grow with N (rows of all N columns: 1024 rows were 330 MB at N = 10,000).
_CHUNK_PAIRS = 2**20
#: Cells are this much wider than the range, so that a pair in range never lands two cells apart
#: by the rounding of x / cell.
_CELL_MARGIN = 1e-6
#: Beyond this many cells on a side (a range tiny against the spread) the cells cannot be numbered
#: in int64 keys; every pair is compared instead.
_MAX_CELLS_PER_SIDE = 2**30


@dataclass(frozen=True)
class LinkBudget:
    """What the range of a link depends on, SI units.

    Attributes:
        power_w: every node's transmit power P, W.
        noise_power_w: σ_m², the receiver's noise per real entry, W.
        carrier_hz: carrier frequency f, Hz.
        area_m: side of the square the nodes are placed in, m.
        scene: with a ray-traced radio, its testbed.topology.scene.SceneKeys: the nodes stand in
            the scene and a link's SNR is P · traced gain / (2σ_m²), not free space's.
    """

    power_w: float
    noise_power_w: float
    carrier_hz: float
    area_m: float
    scene: Any = None

    @classmethod
    def of(cls, radio: Any) -> "LinkBudget":
        """The link budget of anything with these four attributes (an algorithm's radio)."""
        return cls(power_w=float(radio.power_w), noise_power_w=float(radio.noise_power_w),
                   carrier_hz=float(radio.carrier_hz), area_m=float(radio.area_m), scene=getattr(radio, "scene", None))

    def range_m(self, snr_threshold_db: float) -> float:
        """r: the distance at which the received SNR equals ``snr_threshold_db`` (free space)."""
        budget_db = 10.0 * math.log10(self.power_w / (2.0 * self.noise_power_w)) - snr_threshold_db
        at_one_m = float(free_space_pathloss_db(1.0, self.carrier_hz))  # FSPL(d) = FSPL(1 m) + 20 log10 d
        return 10.0 ** ((budget_db - at_one_m) / 20.0)

    def snr_db(self, distance_m: np.ndarray) -> np.ndarray:
        """The received SNR of a link of each distance, dB."""
        d = np.maximum(np.asarray(distance_m, dtype=np.float64), 1e-3)
        return 10.0 * np.log10(self.power_w / (2.0 * self.noise_power_w)) - free_space_pathloss_db(d, self.carrier_hz)


def geometric_graph(positions_m: np.ndarray, range_m: float) -> Graph:
    """The graph of (N, 2) positions with an edge between every pair at most ``range_m`` apart.

    A cell list (cells a little wider than the range: a pair in range is in the same or adjacent
    cells): O(N + candidate pairs) work and memory, not O(N²), with each candidate's distance
    dx² + dy² rounded exactly as a comparison of every pair would round it (the same edges)."""
    pos = np.asarray(positions_m, dtype=np.float64)
    n = pos.shape[0]
    r2 = float(range_m) ** 2
    cell = float(range_m) * (1.0 + _CELL_MARGIN)
    span = (pos.max(axis=0) - pos.min(axis=0)) if n else np.zeros(2)
    if n < 2 or not cell > 0 or np.any(span / cell > _MAX_CELLS_PER_SIDE):
        return _every_pair(pos, r2)
    coords = np.floor((pos - pos.min(axis=0)) / cell).astype(np.int64) + 1  # a border of empty cells
    width = int(coords[:, 1].max()) + 2
    key = coords[:, 0] * width + coords[:, 1]
    order = np.argsort(key, kind="stable")
    cells, first, count = np.unique(key[order], return_index=True, return_counts=True)
    parts = []
    # Half of the 3 × 3 neighbourhood: every unordered pair of cells once (the own cell: i < j below).
    for dx_cells, dy_cells in ((0, 0), (0, 1), (1, -1), (1, 0), (1, 1)):
        target = key + dx_cells * width + dy_cells
        at = np.minimum(np.searchsorted(cells, target), len(cells) - 1)
        i_pts = np.flatnonzero(cells[at] == target)
        starts, sizes = first[at[i_pts]], count[at[i_pts]]
        i = np.repeat(i_pts, sizes)
        j = order[concatenated_ranges(starts, starts + sizes)]
        if (dx_cells, dy_cells) == (0, 0):
            i, j = i[i < j], j[i < j]
        parts.append(_within(pos, i, j, r2))
    return Graph.from_edges(n, np.concatenate(parts))


def _within(pos: np.ndarray, i: np.ndarray, j: np.ndarray, r2: float) -> np.ndarray:
    """(K, 2) the pairs (i, j) at most sqrt(r2) apart, dx² + dy² rounded the same for every pair."""
    dx = pos[i, 0] - pos[j, 0]
    dy = pos[i, 1] - pos[j, 1]
    d2 = dx * dx
    d2 += dy * dy
    keep = d2 <= r2
    return np.column_stack([i[keep], j[keep]])


def _every_pair(pos: np.ndarray, r2: float) -> Graph:
    """Every pair compared, in bounded chunks (a range of 0, or cells too many to number)."""
    n = pos.shape[0]
    parts = [np.zeros((0, 2), dtype=np.int64)]
    rows = max(1, _CHUNK_PAIRS // max(n, 1))
    for start in range(0, n, rows):
        i, j = np.divmod(np.arange(start * n, min(start + rows, n) * n, dtype=np.int64), n)
        keep = i < j
        parts.append(_within(pos, i[keep], j[keep], r2))
    return Graph.from_edges(n, np.concatenate(parts))


def initial_positions(num_nodes: int, area_m: float, rng: np.random.Generator) -> np.ndarray:
    """(N, 2) positions uniform in the square [0, area_m)², m."""
    return rng.uniform(0.0, area_m, size=(num_nodes, 2))


class RandomWaypoint:
    """Positions at the start of every block under the random waypoint model.

    Args:
        start_m: (N, 2) positions at block 0.
        area_m: side of the square, m.
        speed_mps: walking speed, m/s.
        block_s: how long a block lasts, s (rounds per block × seconds per round).
        block_rng: block b → its generator (the next waypoints of the nodes that arrive in it).
    """

    def __init__(self, start_m: np.ndarray, area_m: float, speed_mps: float, block_s: float, block_rng) -> None:
        self._area, self._step_m, self._rng = area_m, speed_mps * block_s, block_rng
        self._start = np.array(start_m, dtype=np.float64)
        self._rewind()

    def _rewind(self) -> None:
        """Back to block 0 (the walk is sequential: block b needs every block before it)."""
        self._block, self._here = 0, self._start
        self._waypoints = self._rng(0).uniform(0.0, self._area, size=self._start.shape)

    def positions(self, block: int) -> np.ndarray:
        """(N, 2) positions at the start of ``block``: walked forward from the last block asked
        (from block 0 for an earlier one). Only the current block is kept: a long walk of many
        nodes holds O(N), not O(N · blocks)."""
        if block < self._block:
            self._rewind()
        while self._block < block:
            gap = self._waypoints - self._here
            dist = np.linalg.norm(gap, axis=1)
            arrive = dist <= self._step_m
            frac = np.where(arrive, 1.0, self._step_m / np.maximum(dist, 1e-300))
            self._here = self._here + gap * frac[:, None]
            self._block += 1
            fresh = self._rng(self._block).uniform(0.0, self._area, size=self._here.shape)
            self._waypoints = np.where(arrive[:, None], fresh, self._waypoints)
        return self._here
