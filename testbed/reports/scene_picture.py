"""The picture of a run's scene, from above (`testbed scene show`): the buildings as filled
footprints, an optional radio map of one transmitter's coverage underneath, the links of the run's
graph (line width and colour by the traced path gain, dB) and the nodes with their ids.

A footprint is the top-down projection of an object's mesh: every triangle of non-zero area in the
x–y plane (a roof, a slab) filled, so walls (vertical, projecting to a line) add nothing and a
building's roof covers its ground plan. Flat objects at the scene's floor (the ground, a floor
slab) are the picture's background, not a building; nor are flat objects above it (a ceiling,
which would hide an indoor scene's rooms).

Example::

    >>> import numpy as np
    >>> roof = Footprint("box", np.array([[[0, 0], [10, 0], [10, 10]], [[0, 0], [10, 10], [0, 10]]], float), 3.0)
    >>> fig = draw_scene([roof], np.array([[-5.0, 0, 1.5], [15.0, 0, 1.5]]), np.array([[0, 1]]),
    ...                  np.array([[0, 1e-9], [1e-9, 0]]))
    >>> [t.get_text() for t in fig.axes[0].texts]
    ['0', '1']
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["Footprint", "RadioMapImage", "footprints", "draw_scene", "save_figure"]

#: An object whose mesh spans less than this height is flat (a ground plane, a floor, a ceiling), m.
FLAT_M = 0.05
#: A projected triangle of less area than this is a wall seen edge-on (drawn as nothing), m².
EDGE_ON_M2 = 1e-6
#: The radio map's colours span this many dB below its strongest cell (weaker cells are the darkest).
RADIO_MAP_RANGE_DB = 80.0
#: Node ids are written beside the nodes up to this many nodes (beyond, they would hide the picture).
MAX_LABELLED_NODES = 200


@dataclass(frozen=True)
class Footprint:
    """One scene object seen from above.

    Attributes:
        name: the object's name in the scene.
        triangles_xy: (T, 3, 2) the projected triangles of non-zero area, m.
        height_m: the object's top above the scene's floor, m.
    """

    name: str
    triangles_xy: np.ndarray
    height_m: float


@dataclass(frozen=True)
class RadioMapImage:
    """One transmitter's coverage over a horizontal plane.

    Attributes:
        path_gain_db: (rows, columns) path gain in dB, row 0 at ``extent_m``'s y minimum; NaN where
            no path reached the cell.
        extent_m: (x_min, x_max, y_min, y_max) of the grid's outer edges, m.
        transmitter: the node whose coverage it is.
        plane_z_m: the height it is taken at, m (None: not said).
    """

    path_gain_db: np.ndarray
    extent_m: tuple[float, float, float, float]
    transmitter: int
    plane_z_m: float | None = None


def footprints(objects: dict[str, Any]) -> list[Footprint]:
    """The footprints of a scene's objects (``sionna.rt.Scene.objects``: name → an object with a
    Mitsuba mesh, ``mi_mesh``), flat ones left out."""
    meshes = {name: _triangles_xyz(obj.mi_mesh) for name, obj in objects.items()}
    floor_m = min((t[..., 2].min() for t in meshes.values() if t.size), default=0.0)
    out = []
    for name, tri in meshes.items():
        if not tri.size or tri[..., 2].max() - tri[..., 2].min() < FLAT_M:
            continue
        xy = tri[..., :2]
        a, b, c = xy[:, 0], xy[:, 1], xy[:, 2]
        area = 0.5 * np.abs((b[:, 0] - a[:, 0]) * (c[:, 1] - a[:, 1]) - (b[:, 1] - a[:, 1]) * (c[:, 0] - a[:, 0]))
        out.append(Footprint(name, xy[area > EDGE_ON_M2], float(tri[..., 2].max() - floor_m)))
    return out


def _triangles_xyz(mesh: Any) -> np.ndarray:
    """(T, 3, 3) the world-space triangles of a Mitsuba mesh (its buffers are flat arrays)."""
    vertices = np.asarray(mesh.vertex_positions_buffer(), dtype=np.float64).reshape(-1, 3)
    faces = np.asarray(mesh.faces_buffer(), dtype=np.int64).reshape(-1, 3)
    return vertices[faces]


def draw_scene(shapes: list[Footprint], positions_m: np.ndarray, edges: np.ndarray, gain: np.ndarray | None,
               radio_map: RadioMapImage | None = None, title: str = "", server_m: np.ndarray | None = None):
    """The figure: footprints, the radio map under them, the ``edges`` ((E, 2) node pairs) coloured
    and widened by ``gain`` ((N, N) linear power gain) in dB (all alike without it), the nodes at
    ``positions_m`` ((N, 2) or (N, 3), m) with their ids, and the server (a star) at ``server_m`` if
    given. Returns the matplotlib Figure (not shown, not saved)."""
    plt = _pyplot()
    from matplotlib.collections import LineCollection, PolyCollection

    pos = np.asarray(positions_m, dtype=np.float64)[:, :2]
    edges = np.asarray(edges, dtype=np.int64).reshape(-1, 2)
    fig, ax = plt.subplots(figsize=(10, 8), layout="constrained")
    ax.set_facecolor("#f4f4f0")
    if radio_map is not None:
        shown = np.ma.masked_invalid(radio_map.path_gain_db)
        top = float(shown.max()) if shown.count() else 0.0
        image = ax.imshow(shown, origin="lower", extent=radio_map.extent_m, cmap="viridis", interpolation="nearest",
                          vmin=top - RADIO_MAP_RANGE_DB, vmax=top, zorder=0)
        fig.colorbar(image, ax=ax, location="bottom", shrink=0.6, pad=0.01,
                     label=f"path gain from node {radio_map.transmitter} (dB)"
                     + ("" if radio_map.plane_z_m is None else f" at z = {radio_map.plane_z_m:.3g} m"))
    if shapes:
        # Each triangle outlined in its own fill colour: no seams between a roof's triangles.
        ax.add_collection(PolyCollection(np.concatenate([s.triangles_xy for s in shapes]), facecolors="#9a9a9a",
                                         edgecolors="#9a9a9a", linewidths=0.4, zorder=1))
    if len(edges) and gain is None:
        ax.add_collection(LineCollection(pos[edges], colors="#4a6fa5", linewidths=1.2, zorder=2))
    elif len(edges):
        link_db = _db(gain[edges[:, 0], edges[:, 1]])
        low, high = float(np.min(link_db)), float(np.max(link_db))
        norm = plt.Normalize(low, high if high > low else low + 1.0)
        lines = LineCollection(pos[edges], cmap="plasma", norm=norm, zorder=2,
                               linewidths=0.6 + 2.4 * norm(link_db).clip(0.0, 1.0))
        lines.set_array(link_db)
        ax.add_collection(lines)
        fig.colorbar(lines, ax=ax, shrink=0.6, pad=0.01, label="link path gain (dB)")
    ax.scatter(pos[:, 0], pos[:, 1], s=36, c="white", edgecolors="black", linewidths=1.0, zorder=3)
    if server_m is not None:
        sx, sy = (float(v) for v in np.asarray(server_m, dtype=np.float64)[:2])
        ax.scatter([sx], [sy], s=160, marker="*", c="gold", edgecolors="black", linewidths=0.8, zorder=3)
        ax.annotate("server", (sx, sy), xytext=(6, -10), textcoords="offset points", fontsize=8, zorder=4)
        pos_and_server = np.vstack([pos, [[sx, sy]]])
    else:
        pos_and_server = pos
    if len(pos) <= MAX_LABELLED_NODES:
        for i, (x, y) in enumerate(pos):
            ax.annotate(str(i), (x, y), xytext=(4, 4), textcoords="offset points", fontsize=8, zorder=4)
    ax.set_aspect("equal")
    ax.autoscale_view()
    _fit(ax, shapes, pos_and_server, radio_map)
    ax.set(xlabel="x (m)", ylabel="y (m)", title=title)
    return fig


def _db(gain: np.ndarray) -> np.ndarray:
    """Linear power gain → dB (a link of zero gain is −inf, and not drawn as an edge by the run)."""
    with np.errstate(divide="ignore"):
        return 10.0 * np.log10(np.asarray(gain, dtype=np.float64))


def _fit(ax, shapes: list[Footprint], pos: np.ndarray, radio_map: RadioMapImage | None) -> None:
    """The axes hold every footprint, node and the radio map, with a small margin."""
    xy = [pos] + [s.triangles_xy.reshape(-1, 2) for s in shapes]
    if radio_map is not None:
        x0, x1, y0, y1 = radio_map.extent_m
        xy.append(np.array([[x0, y0], [x1, y1]]))
    allxy = np.concatenate(xy)
    lo, hi = allxy.min(axis=0), allxy.max(axis=0)
    margin = 0.03 * float(max(hi - lo)) + 1.0
    ax.set_xlim(lo[0] - margin, hi[0] + margin)
    ax.set_ylim(lo[1] - margin, hi[1] + margin)


def save_figure(fig, path: Path) -> Path:
    """Write ``fig`` as a PNG at ``path`` and close it; OSError as the file system says."""
    plt = _pyplot()
    try:
        fig.savefig(path, dpi=110, format="png")
    finally:
        plt.close(fig)
    return Path(path)


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


#: A placement record is drawn up to this many nodes and edges (testbed.topology.placement records no more).
MAX_PLACED_NODES = 500
MAX_PLACED_EDGES = 2000


def placement_figure(topology: dict[str, Any]):
    """The figure of where a run's nodes stood, from its summary's ``topology`` record
    (testbed.topology.placement: ``positions_m``, and ``edges``, ``scene``, ``server_m`` when
    recorded), or None when the run recorded no positions. Drawn from the record alone: no
    buildings (they are the scene's; `testbed scene show` draws them). The record is a file's:
    ValueError (one line) when it is not what placement records."""
    if not topology.get("positions_m"):
        return None
    positions = _numbers(topology["positions_m"], "positions_m", MAX_PLACED_NODES)
    n = len(positions)
    edges = topology.get("edges")
    if edges is not None:
        edges = _pairs(edges, n)
    server = None if topology.get("server_m") is None else _numbers([topology["server_m"]], "server_m", 1)[0]
    scene = topology.get("scene")
    where = f"in {str(scene)[:80]}" if scene else "in the radio's square (free space)"
    links = "links not recorded" if edges is None else f"{len(edges)} links in the first block"
    return draw_scene([], positions, np.zeros((0, 2), np.int64) if edges is None else edges, None,
                      title=f"{n} nodes {where}, {links}", server_m=server)


def _pairs(edges: Any, n: int) -> np.ndarray:
    """(E, 2) int64 node pairs from a file's list of [i, j]; ValueError (one line) otherwise."""
    ok = (isinstance(edges, list) and len(edges) <= MAX_PLACED_EDGES
          and all(isinstance(e, list) and len(e) == 2 for e in edges)
          and all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v < n for e in edges for v in e))
    if not ok:
        raise ValueError(f"edges must be at most {MAX_PLACED_EDGES} pairs of node ids below {n}")
    return np.array(edges, dtype=np.int64).reshape(-1, 2)


def _numbers(rows: Any, name: str, most: int) -> np.ndarray:
    """(M, 2 or 3) finite float64 from a file's list of rows; ValueError (one line) otherwise."""
    ok = (isinstance(rows, list) and 0 < len(rows) <= most and all(isinstance(r, list) and len(r) in (2, 3)
          and len(r) == len(rows[0]) for r in rows)
          and all(isinstance(v, (int, float)) and not isinstance(v, bool) for r in rows for v in r))
    try:
        values = np.array(rows, dtype=np.float64) if ok else None
    except OverflowError:  # an integer past float64's range
        values = None
    if values is None or not np.all(np.isfinite(values)):
        raise ValueError(f"{name} must be 1 to {most} rows of 2 or 3 finite numbers (metres)")
    return values
