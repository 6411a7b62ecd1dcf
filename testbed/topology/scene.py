"""A run's nodes in a Sionna RT scene: where they stand, block by block, and the traced channel
between them (channel.scene), for every radio consumer of a run (docs/scene.md).

``[ALGORITHM] pathloss = "scene"`` (the radio keys of DWFL, D-PSGD and gossip) with the
sub-table ``[ALGORITHM.scene]`` (:class:`SceneSection`): the scene, where the nodes stand, their
antennas, the solver's settings, their walk. :class:`SceneSite` holds it for a run:

- positions: a file, or uniform over the open ground of the scene (or of a region of it), from
  ``stream(seed, GLOBAL, -1, SCENE)``; with ``speed_mps`` the nodes walk (random waypoint, the
  waypoints on open ground; a step that would end off open ground is not taken and a new waypoint
  drawn), one step per coherence block, block b's draws from ``stream(seed, GLOBAL, b, SCENE)``;
- a block's channel: ONE trace of the N nodes and the server point (index N), through the on-disk
  cache (channel.scene.cached_trace), so a sweep and every process of a run trace each geometry
  once and read the same numbers.

Example (needs Sionna RT)::

    >>> site = SceneSite(SceneSection(samples_per_source=1000), num_nodes=3, seed=0,
    ...                  carrier_hz=3.5e9, bandwidth_hz=1e6)                     # doctest: +SKIP
    >>> site.node_gain(0).shape, site.server_coefficient(0).shape                 # doctest: +SKIP
    ((3, 3), (3,))
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field, model_validator

from channel.scene import SceneSpec, cached_trace
from channel.scene.geometry import ground_height_m, load_scene, open_ground, positions_in_open_space, scene_extent_m
from channel.scene.spec import ANTENNA_PATTERNS, EMPTY_SCENE
from channel.scene.tracing import TracedLinks
from testbed.checked.sections import NonNegative, OnlyWith, Positive, Section
from testbed.errors import ConfigError, UserError
from testbed.streams.rng import GLOBAL, Purpose, stream
from testbed.util.userfiles import read_text

__all__ = ["SceneSection", "SceneKeys", "SceneSite", "SceneGeometry", "scene_site", "scene_geometry", "check_blocks", "default_cache_dir",
           "MAX_POSITIONS_FILE_BYTES"]

#: A positions file holds at most this many bytes (a line of three numbers per node).
MAX_POSITIONS_FILE_BYTES = 4 * 1024 * 1024


def default_cache_dir() -> Path:
    """Where traces are kept without ``cache_dir``: $XDG_CACHE_HOME/testbed/scene (~/.cache/...)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "testbed" / "scene"


class SceneSection(Section):
    """The scene a decentralised run's radio is ray traced in (Sionna RT; docs/scene.md). Read with
    ``pathloss = "scene"``; the carrier and bandwidth are the radio's (carrier_hz, bandwidth_hz)."""

    ONLY_WITH = {"region_m": (OnlyWith("placement", ("open_ground", "region")),),
                 "positions_path": (OnlyWith("placement", ("file",)),),
                 "round_s": (OnlyWith("speed_mps"),)}

    name: str = Field("simple_street_canyon", pattern=r"^[a-z][a-z0-9_]*$")
    """A Sionna RT built-in scene (simple_street_canyon, munich, floor_wall, ...) or "empty" (free
    space); ignored with path."""
    path: str | None = None
    """A Mitsuba XML scene file (relative to the experiment file), in place of name."""
    placement: Literal["open_ground", "region", "file"] = "open_ground"
    """Where the nodes stand: uniform over the open ground (under the open sky, not on a roof) of the
    scene or of region_m; uniform in region_m (indoor scenes); or positions_path."""
    region_m: list[float] | None = None
    """[x_min, x_max, y_min, y_max] of the placement, m (absent: the scene's extent)."""
    positions_path: str | None = None
    """A file of one "x y z" (m, or "x y": z is the antenna height over the ground) per node, in
    node order; "#" comments."""
    antenna_height_m: float = Field(1.5, gt=0, le=100)
    """Every node's antenna above the ground under it, m."""
    server_position_m: list[float] | None = None
    """[x, y, z] of the server / reference receiver the per-sender gains are measured to, m (absent:
    the middle of the placement's extent, server_height_m above the ground there)."""
    server_height_m: float = Field(10.0, gt=0, le=500)
    """The default server's antenna above the ground, m."""
    antenna_pattern: Literal[ANTENNA_PATTERNS] = "iso"  # type: ignore[valid-type]
    """Every antenna's pattern (Sionna RT's)."""
    polarization: Literal["V", "H"] = "V"
    """Every antenna's polarisation."""
    max_depth: int = Field(3, ge=0, le=8)
    """The most interactions on a path."""
    samples_per_source: int = Field(100_000, ge=100, le=10_000_000)
    """Rays shot from each node."""
    line_of_sight: bool = True
    specular_reflection: bool = True
    diffuse_reflection: bool = False
    refraction: bool = True
    diffraction: bool = False
    speed_mps: NonNegative[float] = 0.0
    """The nodes walk on open ground at this speed (random waypoint), m/s, re-traced every
    coherence block (the radio's coherence_rounds); 0: they stand still."""
    round_s: Positive[float] = 1.0
    """With speed_mps: how long a round lasts for the walk, s."""
    cache_dir: str | None = None
    """The folder traces are kept in (absent: ~/.cache/testbed/scene)."""

    @model_validator(mode="after")
    def _shapes(self) -> "SceneSection":
        if self.region_m is not None and (len(self.region_m) != 4 or not (self.region_m[0] < self.region_m[1]
                                                                           and self.region_m[2] < self.region_m[3])):
            raise ValueError("region_m: [x_min, x_max, y_min, y_max] with x_min < x_max and y_min < y_max")
        if self.server_position_m is not None and len(self.server_position_m) != 3:
            raise ValueError("server_position_m: [x, y, z] in m")
        if self.placement == "file" and self.positions_path is None:
            raise ValueError('positions_path: placement = "file" needs the file')
        if self.path is not None and not self.path.endswith(".xml"):
            raise ValueError(f"path: {self.path} is not a Mitsuba .xml scene")
        return self

    def spec(self, carrier_hz: float, bandwidth_hz: float) -> SceneSpec:
        """The :class:`channel.scene.SceneSpec` of these keys at the radio's carrier and bandwidth."""
        return SceneSpec(self.path or self.name, carrier_hz=carrier_hz, bandwidth_hz=bandwidth_hz,
                         antenna_height_m=self.antenna_height_m, antenna_pattern=self.antenna_pattern,
                         polarization=self.polarization, max_depth=self.max_depth,
                         samples_per_source=self.samples_per_source, line_of_sight=self.line_of_sight,
                         specular_reflection=self.specular_reflection, diffuse_reflection=self.diffuse_reflection,
                         refraction=self.refraction, diffraction=self.diffraction)


class SceneSite:
    """The nodes of a run in a scene, block by block (see the module's docstring).

    Args:
        section: the ``[ALGORITHM.scene]`` keys.
        num_nodes: N.
        seed: the run's seed.
        carrier_hz, bandwidth_hz: the radio's.
        block_rounds: rounds per coherence block (the radio's coherence_rounds; None: one block).
    """

    def __init__(self, section: SceneSection, num_nodes: int, seed: int, carrier_hz: float, bandwidth_hz: float,
                 block_rounds: int | None = None) -> None:
        self.section, self.num_nodes, self.seed = section, num_nodes, seed
        self.spec = section.spec(carrier_hz, bandwidth_hz)
        self.block_rounds = block_rounds
        self.cache_dir = Path(section.cache_dir) if section.cache_dir else default_cache_dir()
        self._scene: Any = None
        self._walk: tuple[int, np.ndarray, np.ndarray] | None = None  # (block, positions, waypoints)
        self._traced: dict[int, TracedLinks] = {}

    @property
    def scene(self) -> Any:
        if self._scene is None:
            self._scene = _checked(load_scene, self.spec)
        return self._scene

    def extent_m(self) -> tuple[float, float, float, float]:
        """The placement's region: region_m, or the scene's extent."""
        r = self.section.region_m
        return tuple(r) if r is not None else scene_extent_m(self.spec, self.scene)  # type: ignore[return-value]

    def server_position_m(self) -> np.ndarray:
        """(3,) the server / reference receiver, m."""
        if self.section.server_position_m is not None:
            return np.array(self.section.server_position_m, dtype=np.float64)
        x0, x1, y0, y1 = self.extent_m()
        xy = np.array([[(x0 + x1) / 2, (y0 + y1) / 2]])
        return np.array([xy[0, 0], xy[0, 1], ground_height_m(self.spec, xy, self.scene)[0] + self.section.server_height_m])

    def block_of(self, round_index: int) -> int:
        return 0 if self.block_rounds is None else round_index // self.block_rounds

    def positions_m(self, block: int = 0) -> np.ndarray:
        """(N, 3) the nodes' positions in coherence block ``block``, m."""
        if self._walk is None or block < self._walk[0]:
            start = self._start()
            self._walk = (0, start, self._waypoints(0, start.shape[0]))
        b, here, goal = self._walk
        while b < block:
            here, goal = self._step(here, goal, b + 1)
            b += 1
        self._walk = (b, here, goal)
        return here

    def traced(self, block: int = 0) -> TracedLinks:
        """The block's trace of the N nodes and the server (index N): one solver call, cached."""
        if block not in self._traced:
            points = np.vstack([self.positions_m(block), self.server_position_m()[None, :]])
            self._traced = {b: t for b, t in self._traced.items() if b >= block - 1}
            self._traced[block] = _checked(cached_trace, self.spec, points, self.cache_dir)
        return self._traced[block]

    def node_gain(self, block: int = 0) -> np.ndarray:
        """(N, N) the linear power gain between every pair of nodes, [receiver, sender]."""
        n = self.num_nodes
        return self.traced(block).gain[:n, :n]

    def server_coefficient(self, block: int = 0) -> np.ndarray:
        """(N,) complex128 the narrowband coefficient of each node's link to the server."""
        n = self.num_nodes
        return self.traced(block).coefficient[n, :n]

    # ------------------------------------------------------------------------------------ placing

    def _start(self) -> np.ndarray:
        s, n = self.section, self.num_nodes
        if s.placement == "file":
            return self._from_file(Path(s.positions_path))  # type: ignore[arg-type]
        rng = stream(self.seed, GLOBAL, -1, Purpose.SCENE)
        if s.placement == "region":
            x0, x1, y0, y1 = self.extent_m()
            xy = np.column_stack([rng.uniform(x0, x1, n), rng.uniform(y0, y1, n)])
            return np.column_stack([xy, ground_height_m(self.spec, xy, self.scene) + s.antenna_height_m])
        region = tuple(s.region_m) if s.region_m is not None else None
        return _checked(positions_in_open_space, self.spec, n, rng, region, self.scene)

    def _from_file(self, path: Path) -> np.ndarray:
        try:
            text = read_text(path, MAX_POSITIONS_FILE_BYTES, "scene positions file")
        except UserError as exc:
            raise ConfigError("scene.positions_path", str(exc)) from None
        rows = []
        for number, line in enumerate(text.splitlines(), start=1):
            words = line.split("#", 1)[0].replace(",", " ").split()
            if not words:
                continue
            try:
                values = [float(w) for w in words]
            except ValueError:
                values = []
            if len(values) not in (2, 3) or not np.all(np.isfinite(values)):
                raise ConfigError("scene.positions_path", f"{path}:{number}: expected 'x y' or 'x y z' in m, "
                                  f"got {line.strip()[:60]!r}")
            rows.append(values)
        if len(rows) != self.num_nodes:
            raise ConfigError("scene.positions_path", f"{path}: {len(rows)} positions for {self.num_nodes} nodes")
        xy = np.array([r[:2] for r in rows])
        ground = ground_height_m(self.spec, xy, self.scene) + self.section.antenna_height_m
        return np.column_stack([xy, [r[2] if len(r) == 3 else g for r, g in zip(rows, ground)]])

    def _waypoints(self, block: int, count: int) -> np.ndarray:
        return positions_in_open_space(self.spec, count, stream(self.seed, GLOBAL, block, Purpose.SCENE),
                                       tuple(self.section.region_m) if self.section.region_m else None,
                                       self.scene) if self.section.speed_mps else np.zeros((count, 3))

    def _step(self, here: np.ndarray, goal: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
        """One block of the walk: toward each waypoint by speed × block length; a node that arrives,
        or whose step would end off open ground, stays and draws a new waypoint."""
        s = self.section
        if not s.speed_mps:
            return here, goal
        step_m = s.speed_mps * s.round_s * (self.block_rounds or 1)
        gap = goal[:, :2] - here[:, :2]
        dist = np.linalg.norm(gap, axis=1)
        frac = np.minimum(1.0, step_m / np.maximum(dist, 1e-300))
        xy = here[:, :2] + gap * frac[:, None]
        ok = open_ground(self.spec, xy, self.scene)
        z = ground_height_m(self.spec, xy, self.scene) + s.antenna_height_m
        moved = np.where(ok[:, None], np.column_stack([xy, z]), here)
        fresh = self._waypoints(block, len(here))
        renew = (frac >= 1.0) | ~ok
        return moved, np.where(renew[:, None], fresh, goal)


def _checked(fn, *args):
    """``fn(*args)`` with channel.scene's one-line refusals as a ConfigError naming the section."""
    try:
        return fn(*args)
    except ValueError as exc:  # SceneUnavailable is one
        raise ConfigError("scene", str(exc)) from None


@dataclass(frozen=True)
class SceneKeys:
    """What a run's :class:`SceneSite` is made of, hashable: the radio (testbed.algorithms'
    RadioSection, Radio) and the topology's link budget carry it, and every consumer in a process
    gets the same site (its positions, its traces) from :meth:`site`.

    Attributes:
        section_json: the ``scene`` keys as JSON.
        carrier_hz, bandwidth_hz: the radio's.
        block_rounds: the radio's coherence_rounds (None: one block).
    """

    section_json: str
    carrier_hz: float
    bandwidth_hz: float
    block_rounds: int | None

    @classmethod
    def of(cls, section: SceneSection, carrier_hz: float, bandwidth_hz: float, block_rounds: int | None) -> "SceneKeys":
        return cls(section.model_dump_json(), float(carrier_hz), float(bandwidth_hz), block_rounds)

    def site(self, num_nodes: int, seed: int) -> SceneSite:
        """The run's site (one per keys, N and seed in a process)."""
        return _site(self, num_nodes, seed)


@functools.lru_cache(maxsize=8)
def _site(keys: SceneKeys, num_nodes: int, seed: int) -> SceneSite:
    return SceneSite(SceneSection.model_validate_json(keys.section_json), num_nodes, seed, keys.carrier_hz,
                     keys.bandwidth_hz, keys.block_rounds)


def scene_site(radio_section: Any, num_nodes: int, seed: int) -> SceneSite:
    """The :class:`SceneSite` of a radio section with ``pathloss = "scene"``."""
    return radio_section.scene_keys().site(num_nodes, seed)


class SceneGeometry:
    """What `testbed scene show` draws of a run: the spec, the nodes' positions and their traced
    links in block 0, and the server.

    Attributes:
        spec: the channel.scene.SceneSpec.
        positions_m: (N, 3), m.
        links: channel.scene.TracedLinks of the N nodes ([receiver, sender]).
        server_position_m: (3,), m.
        site: the run's :class:`SceneSite` (every block).
    """

    def __init__(self, site: SceneSite) -> None:
        n = site.num_nodes
        full = site.traced(0)
        self.site, self.spec = site, site.spec
        self.positions_m = site.positions_m(0)
        self.links = TracedLinks(positions_m=self.positions_m, coefficient=full.coefficient[:n, :n],
                                 gain=full.gain[:n, :n], paths=full.paths[:n, :n])
        self.server_position_m = site.server_position_m()


def check_blocks(radio_key: str, radio_section: Any, topology: Any) -> None:
    """With a scene, the nodes are where the scene puts them: a random_geometric topology neither
    places nor walks them itself, and with walking nodes its graph is redrawn with every re-trace
    (its coherence_rounds the radio's). ConfigError naming the key."""
    if radio_section.pathloss != "scene" or topology is None or topology.kind != "random_geometric":
        return
    if topology.speed_mps:
        raise ConfigError("topology.speed_mps", f"the nodes stand in the scene: they walk with {radio_key}.scene."
                                                "speed_mps; leave topology.speed_mps out")
    walking = bool((radio_section.scene or SceneSection()).speed_mps)
    if walking and topology.coherence_rounds != radio_section.coherence_rounds:
        raise ConfigError("topology.coherence_rounds", f"the walking nodes are re-traced every {radio_key}."
                          f"coherence_rounds = {radio_section.coherence_rounds}; redraw the graph as often "
                          "(the same coherence_rounds)")


def scene_geometry(config: Any) -> SceneGeometry:
    """The scene of an experiment (a testbed.checked.sections.Config whose algorithm's section has
    ``pathloss = "scene"``). ConfigError naming the key otherwise."""
    name = config.run.algorithm
    section = getattr(config, name, None)
    if section is None or getattr(section, "pathloss", None) != "scene":
        raise ConfigError(f"{name}.pathloss", f'the run has no scene: set [{name}] pathloss = "scene"')
    return SceneGeometry(scene_site(section, config.data.num_nodes, config.run.seed))
