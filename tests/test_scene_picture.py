"""testbed.reports.scene_picture: a scene seen from above. Footprints are the objects' meshes
projected (walls edge-on and flat objects left out), the figure holds one marker and one id per node,
one line per edge coloured by the edge's own gain, and the radio map under it all. Meshes here are
stand-ins with Mitsuba's two buffers, so these tests need no Sionna RT."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from testbed.reports.scene_picture import Footprint, RadioMapImage, draw_scene, footprints, save_figure


class _Mesh:
    def __init__(self, vertices: np.ndarray, faces: np.ndarray) -> None:
        self._v, self._f = np.asarray(vertices, np.float32), np.asarray(faces, np.uint32)

    def vertex_positions_buffer(self):
        return self._v.ravel()

    def faces_buffer(self):
        return self._f.ravel()


class _Object:
    def __init__(self, mesh: _Mesh) -> None:
        self.mi_mesh = mesh


def _box(x0: float, y0: float, x1: float, y1: float, height: float) -> _Object:
    """A closed box's 8 corners and 12 triangles (two per face), as a scene exports a building."""
    v = np.array([[x, y, z] for z in (0.0, height) for y in (y0, y1) for x in (x0, x1)])
    quads = [(0, 1, 3, 2), (4, 5, 7, 6), (0, 1, 5, 4), (2, 3, 7, 6), (0, 2, 6, 4), (1, 3, 7, 5)]
    faces = [t for a, b, c, d in quads for t in ((a, b, c), (a, c, d))]
    return _Object(_Mesh(v, np.array(faces)))


def _plane(size: float, z: float = 0.0) -> _Object:
    v = np.array([[-size, -size, z], [size, -size, z], [size, size, z], [-size, size, z]])
    return _Object(_Mesh(v, np.array([[0, 1, 2], [0, 2, 3]])))


def test_a_box_projects_to_its_roof_and_floor_and_the_ground_is_left_out():
    shapes = footprints({"ground": _plane(50.0), "house": _box(0, 0, 10, 4, 7.5), "ceiling": _plane(5.0, z=3.0)})
    assert [s.name for s in shapes] == ["house"]
    house = shapes[0]
    assert house.height_m == pytest.approx(7.5)
    assert house.triangles_xy.shape == (4, 3, 2)  # the four walls are edge-on: roof and floor remain
    xy = house.triangles_xy.reshape(-1, 2)
    assert xy.min(axis=0).tolist() == [0, 0] and xy.max(axis=0).tolist() == [10, 4]


def _picture(n: int, edges: np.ndarray, rng: np.random.Generator, radio_map: RadioMapImage | None = None):
    gain = rng.uniform(1e-12, 1e-6, size=(n, n))
    gain = (gain + gain.T) / 2
    np.fill_diagonal(gain, 0.0)
    positions = np.column_stack([rng.uniform(-40, 40, n), rng.uniform(-20, 20, n), np.full(n, 1.5)])
    return draw_scene(footprints({"house": _box(-5, -5, 5, 5, 10.0)}), positions, edges, gain, radio_map), positions, gain


@settings(max_examples=15, deadline=None)
@given(n=st.integers(2, 12), seed=st.integers(0, 2**32 - 1), density=st.floats(0.0, 1.0))
def test_every_node_has_a_marker_and_its_id_and_every_edge_a_line_coloured_by_its_gain(n, seed, density):
    from matplotlib.collections import LineCollection, PathCollection

    rng = np.random.default_rng(seed)
    pairs = np.array([(i, j) for i in range(n) for j in range(i + 1, n)])
    edges = pairs[rng.uniform(size=len(pairs)) < density].reshape(-1, 2)
    fig, positions, gain = _picture(n, edges, rng)
    ax = fig.axes[0]
    markers = [c for c in ax.collections if isinstance(c, PathCollection)]
    assert len(markers) == 1 and np.allclose(markers[0].get_offsets(), positions[:, :2])
    assert sorted(t.get_text() for t in ax.texts) == sorted(str(i) for i in range(n))
    lines = [c for c in ax.collections if isinstance(c, LineCollection)]
    if len(edges):
        (links,) = lines
        assert np.allclose(links.get_array(), 10 * np.log10(gain[edges[:, 0], edges[:, 1]]))
        widths = np.asarray(links.get_linewidths())
        strongest, weakest = np.argmax(links.get_array()), np.argmin(links.get_array())
        assert widths[strongest] >= widths[weakest]
    else:
        assert not lines
    xs, ys = ax.get_xlim(), ax.get_ylim()
    assert np.all((positions[:, 0] > xs[0]) & (positions[:, 0] < xs[1]) & (positions[:, 1] > ys[0]) & (positions[:, 1] < ys[1]))
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_the_radio_map_is_under_the_buildings_and_spans_its_extent(tmp_path):
    rng = np.random.default_rng(1)
    db = rng.uniform(-120, -40, size=(20, 30))
    db[0, 0] = np.nan  # a cell no ray reached: masked, not a colour
    fig, _, _ = _picture(3, np.array([[0, 1]]), rng, RadioMapImage(db, (-60.0, 60.0, -40.0, 40.0), transmitter=2))
    ax = fig.axes[0]
    (image,) = ax.images
    assert image.get_extent() == [-60.0, 60.0, -40.0, 40.0]
    assert image.get_array().mask[0, 0] and not image.get_array().mask[1:, 1:].any()
    assert image.zorder < min(c.zorder for c in ax.collections)
    assert any("node 2" in a.get_xlabel() for a in fig.axes[1:])  # the colour bar names the transmitter
    path = save_figure(fig, tmp_path / "scene.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_footprint_is_drawn_where_its_triangles_are():
    from matplotlib.collections import PolyCollection

    tri = np.array([[[0, 0], [10, 0], [10, 10]]], dtype=float)
    fig = draw_scene([Footprint("roof", tri, 3.0)], np.array([[20.0, 20.0]]), np.zeros((0, 2)), np.zeros((1, 1)))
    (polys,) = [c for c in fig.axes[0].collections if isinstance(c, PolyCollection)]
    assert np.allclose(polys.get_paths()[0].vertices[:3], tri[0])
    import matplotlib.pyplot as plt

    plt.close(fig)
