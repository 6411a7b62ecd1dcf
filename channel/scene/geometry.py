"""A scene's ground: loading it, its extent, where a node may stand, positions drawn there.

A node stands on *open ground*: a ray cast straight down from above the scene meets one surface
and nothing beneath it (the ground, not a roof or a floor with something under it); its antenna is
``antenna_height_m`` above that surface. Where no surface is met at all (the empty scene, or past
the ground's edge) the ground is z = 0. Indoor scenes have no open ground: give positions in a
region or a file (testbed's ``[scene]`` section), which stand on the lowest surface under them
(:func:`ground_height_m`: a room's floor, not its ceiling).

Example (needs Sionna RT)::

    >>> import numpy as np
    >>> spec = SceneSpec("simple_street_canyon")
    >>> pos = positions_in_open_space(spec, 4, np.random.default_rng(0))   # doctest: +SKIP
    >>> pos.shape, bool(open_ground(spec, pos[:, :2]).all())                # doctest: +SKIP
    ((4, 3), True)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .runtime import import_rt
from .spec import EMPTY_SCENE, SceneSpec

__all__ = ["load_scene", "scene_extent_m", "ground_height_m", "open_ground", "positions_in_open_space",
           "MAX_PLACEMENT_DRAWS"]

#: Candidate positions drawn at most, per node asked, before placing is refused (a region nearly
#: all buildings).
MAX_PLACEMENT_DRAWS = 1000
#: Rays start this far above the scene's top, and a second ray this far below the first hit, m.
_ABOVE_M = 10.0
_BELOW_M = 1e-3
#: Surfaces above one another a downward ray passes at most (roofs, ceilings, floors of a building).
_MAX_LAYERS = 64


def load_scene(spec: SceneSpec) -> Any:
    """A fresh ``sionna.rt.Scene`` of ``spec.scene`` (no transmitter, no receiver), at the spec's
    carrier and bandwidth, its transmit and receive arrays the spec's one antenna. ValueError (one line) for an unknown name or a bad file."""
    rt = import_rt()
    if spec.scene == EMPTY_SCENE:
        scene = rt.load_scene()
    else:
        if spec.is_file:
            source = spec.scene
        else:
            source = getattr(rt.scene, spec.scene, None)
            if not isinstance(source, str) or spec.scene.startswith("_"):
                raise ValueError(f"{spec.scene!r} is not a Sionna RT scene (one of {', '.join(builtin_scenes())}, "
                                 f"{EMPTY_SCENE!r} or a Mitsuba .xml file)")
        try:
            scene = rt.load_scene(source)
        except Exception as exc:  # Mitsuba's parser: a RuntimeError naming the line
            raise ValueError(f"scene {spec.scene}: {str(exc).strip().splitlines()[-1][:200]}") from None
    scene.frequency = spec.carrier_hz
    scene.bandwidth = spec.bandwidth_hz
    # Every node's antenna, transmitting and receiving: one element of the spec's pattern.
    scene.tx_array = scene.rx_array = rt.PlanarArray(num_rows=1, num_cols=1, pattern=spec.antenna_pattern,
                                                     polarization=spec.polarization)
    return scene


def builtin_scenes() -> list[str]:
    """The names of Sionna RT's built-in scenes."""
    rt = import_rt()
    return sorted(n for n, v in vars(rt.scene).items()
                  if isinstance(v, str) and v.endswith(".xml") and not n.startswith("_"))


def scene_extent_m(spec: SceneSpec, scene: Any = None) -> tuple[float, float, float, float]:
    """(x_min, x_max, y_min, y_max) of the scene's bounding box, m; the empty scene: a 100 m square
    round the origin."""
    scene = load_scene(spec) if scene is None else scene
    box = scene.mi_scene.bbox()
    if not box.valid():
        return (-50.0, 50.0, -50.0, 50.0)
    return (float(box.min.x), float(box.max.x), float(box.min.y), float(box.max.y))


def _cast_down(scene: Any, xy: np.ndarray, z_from: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each (x, y), the first surface straight below z_from: (hit?, its z)."""
    import mitsuba as mi

    n = xy.shape[0]
    origin = mi.Point3f(mi.Float(xy[:, 0].astype(np.float32)), mi.Float(xy[:, 1].astype(np.float32)),
                        mi.Float(np.asarray(z_from, dtype=np.float32)))
    down = mi.Vector3f(mi.Float(np.zeros(n, np.float32)), mi.Float(np.zeros(n, np.float32)),
                       mi.Float(-np.ones(n, np.float32)))
    si = scene.mi_scene.ray_intersect(mi.Ray3f(o=origin, d=down))
    hit = np.array(si.is_valid(), dtype=bool).reshape(n)
    z = np.array(si.p.z, dtype=np.float64).reshape(n)
    return hit, np.where(hit, z, 0.0)


def _ground(scene: Any, xy: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(open?, ground z) of each (x, y): see the module's docstring."""
    xy = np.asarray(xy, dtype=np.float64).reshape(-1, 2)
    box = scene.mi_scene.bbox()
    top = (float(box.max.z) if box.valid() else 0.0) + _ABOVE_M
    hit, z = _cast_down(scene, xy, np.full(len(xy), top))
    below, _ = _cast_down(scene, xy, z - _BELOW_M)
    return ~(hit & below), z


def open_ground(spec: SceneSpec, xy: np.ndarray, scene: Any = None) -> np.ndarray:
    """(M,) bool: each (x, y) is open ground (under the open sky)."""
    return _ground(load_scene(spec) if scene is None else scene, xy)[0]


def ground_height_m(spec: SceneSpec, xy: np.ndarray, scene: Any = None) -> np.ndarray:
    """(M,) the z of the ground under each (x, y): the lowest surface a ray cast straight down
    meets (the floor of a room, not its ceiling or the roof above it), m; 0 where there is none."""
    scene = load_scene(spec) if scene is None else scene
    xy = np.asarray(xy, dtype=np.float64).reshape(-1, 2)
    box = scene.mi_scene.bbox()
    top = np.full(len(xy), (float(box.max.z) if box.valid() else 0.0) + _ABOVE_M)
    hit, floor = _cast_down(scene, xy, top)
    for _ in range(_MAX_LAYERS):  # down through each surface until none is below
        if not hit.any():
            break
        below, z = _cast_down(scene, xy, np.where(hit, floor - _BELOW_M, top))
        hit &= below
        floor = np.where(hit, z, floor)
    return floor


def positions_in_open_space(spec: SceneSpec, n: int, rng: np.random.Generator,
                            region: tuple[float, float, float, float] | None = None,
                            scene: Any = None) -> np.ndarray:
    """(n, 3) positions uniform over the open ground of ``region`` (x_min, x_max, y_min, y_max; the
    scene's extent by default), each at ``antenna_height_m`` above its ground, m. Candidates are
    drawn from ``rng`` in batches and the open ones kept in order, so the result depends on the
    generator alone. ValueError (one line) if the region has (nearly) no open ground."""
    scene = load_scene(spec) if scene is None else scene
    x0, x1, y0, y1 = scene_extent_m(spec, scene) if region is None else region
    kept: list[np.ndarray] = []
    count = drawn = 0
    while count < n:
        if drawn >= MAX_PLACEMENT_DRAWS * max(n, 1):
            raise ValueError(f"the region x {x0:g}..{x1:g} m, y {y0:g}..{y1:g} m of {spec.scene} has almost no "
                             f"open ground: {count} of {n} nodes placed in {drawn} draws")
        batch = max(4 * (n - count), 64)
        xy = np.column_stack([rng.uniform(x0, x1, batch), rng.uniform(y0, y1, batch)])
        drawn += batch
        is_open, z = _ground(scene, xy)
        take = np.column_stack([xy, z + spec.antenna_height_m])[is_open]
        kept.append(take)
        count += len(take)
    return np.concatenate(kept)[:n]
