"""One transmitter's coverage of a scene: Sionna RT's radio map (``RadioMapSolver``) over a
horizontal plane across the scene's whole x–y extent.

Each cell holds the mean path gain over the cell, g_i = (1/|C_i|) ∫_{C_i} |h(s)|² ds (Sionna RT's
radio map solver, eq. (54) of its documentation), estimated by Monte Carlo from the rays shot; a
cell no ray reached holds 0. The scene, its carrier, the antennas and the interactions followed
are the spec's, as for the traced links (channel.scene.tracing).

The plane must not be at the transmitter's own height: the rays leave the transmitter from that
plane, so a line-of-sight ray never crosses it, and the map would hold only what comes back down
from reflections (in the empty scene, nothing). Half an antenna height below the transmitter, a
line-of-sight map of the empty scene is Friis' (λ / (4π d))² within 0.1 dB out to 20 m and 0.5 dB
at 45 m (tests/test_scene_radio_map.py).

Example (needs Sionna RT)::

    >>> spec = SceneSpec("empty", max_depth=0)
    >>> coverage_map(spec, np.array([0.0, 0.0, 1.5]), plane_z_m=0.75, cell_m=2.0).path_gain.shape  # doctest: +SKIP
    (50, 50)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .geometry import load_scene, scene_extent_m
from .runtime import import_rt
from .spec import SceneSpec

__all__ = ["Coverage", "coverage_map", "MAX_CELLS", "MIN_PLANE_OFFSET_M"]

#: Cells of one radio map at most (the solver holds a float32 gain per cell, and its rays per cell).
MAX_CELLS = 4_000_000
#: The plane at least this far above or below the transmitter, m (see the module's docstring).
MIN_PLANE_OFFSET_M = 0.05


@dataclass(frozen=True)
class Coverage:
    """A radio map.

    Attributes:
        path_gain: (rows, columns) mean linear power gain of each cell, row 0 at the smallest y.
        extent_m: (x_min, x_max, y_min, y_max) of the grid's outer edges, m.
        plane_z_m: the height of the plane, m.
    """

    path_gain: np.ndarray
    extent_m: tuple[float, float, float, float]
    plane_z_m: float


def coverage_map(spec: SceneSpec, transmitter_m: np.ndarray, plane_z_m: float, cell_m: float,
                 samples: int = 1_000_000) -> Coverage:
    """The coverage of a transmitter at ``transmitter_m`` ((3,) m) in ``spec``'s scene, on the
    horizontal plane at ``plane_z_m`` over the scene's x–y extent, in square cells of ``cell_m``
    metres, from ``samples`` rays. ValueError (one line) for a plane at the transmitter's height, or
    a cell size that gives too many cells or none."""
    import mitsuba as mi

    x, y, z = (float(v) for v in np.asarray(transmitter_m, dtype=np.float64).reshape(3))
    if not abs(plane_z_m - z) >= MIN_PLANE_OFFSET_M:
        raise ValueError(f"the radio map's plane at z = {plane_z_m:g} m is within {MIN_PLANE_OFFSET_M:g} m of the "
                         f"transmitter's height ({z:g} m): no line-of-sight ray crosses it")
    scene = load_scene(spec)
    x0, x1, y0, y1 = scene_extent_m(spec, scene)
    if not cell_m > 0 or ((x1 - x0) / cell_m + 1) * ((y1 - y0) / cell_m + 1) > MAX_CELLS:
        raise ValueError(f"a radio map cell of {cell_m:g} m over {x1 - x0:.4g} m × {y1 - y0:.4g} m makes more than "
                         f"{MAX_CELLS} cells or none")
    rt = import_rt()  # load_scene gave the scene the spec's antennas, as every traced node has
    scene.add(rt.Transmitter("coverage", position=mi.Point3f(x, y, z)))
    cx, cy = 0.5 * (x0 + x1), 0.5 * (y0 + y1)
    result = rt.RadioMapSolver()(scene, center=mi.Point3f(cx, cy, float(plane_z_m)),
                                 orientation=mi.Point3f(0.0, 0.0, 0.0), size=mi.Point2f(x1 - x0, y1 - y0),
                                 cell_size=mi.Point2f(cell_m, cell_m), samples_per_tx=int(samples),
                                 max_depth=spec.max_depth, los=spec.line_of_sight,
                                 specular_reflection=spec.specular_reflection,
                                 diffuse_reflection=spec.diffuse_reflection, refraction=spec.refraction,
                                 diffraction=spec.diffraction, seed=spec.solver_seed)
    gain = np.asarray(result.path_gain.numpy(), dtype=np.float64)[0]
    width, height = gain.shape[1] * cell_m, gain.shape[0] * cell_m  # the solver rounds the size up to whole cells
    return Coverage(gain, (cx - width / 2, cx + width / 2, cy - height / 2, cy + height / 2), float(plane_z_m))
