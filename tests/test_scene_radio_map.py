"""channel.scene.radio_map: one transmitter's coverage. In the empty scene, line of sight only, each
cell's gain is Friis' (λ / (4π d))² at the cell's distance (Monte Carlo: within a fraction of a dB);
the grid covers the scene's extent; a plane at the transmitter's height and a cell size making too
many cells are one-line refusals."""

from __future__ import annotations

import numpy as np
import pytest

from channel import free_space_pathloss_db
from channel.scene import SceneSpec
from channel.scene.geometry import scene_extent_m
from channel.scene.radio_map import MAX_CELLS, coverage_map

EMPTY = SceneSpec("empty", carrier_hz=2.4e9, max_depth=0)
TX_M = np.array([3.0, -7.0, 1.5])


def _cell_centres(coverage, cell_m):
    x0, _, y0, _ = coverage.extent_m
    rows, columns = coverage.path_gain.shape
    return np.meshgrid(x0 + (np.arange(columns) + 0.5) * cell_m, y0 + (np.arange(rows) + 0.5) * cell_m)


def test_the_empty_scene_is_friis_at_every_distance():
    cell_m = 2.0
    coverage = coverage_map(EMPTY, TX_M, plane_z_m=0.75, cell_m=cell_m, samples=2_000_000)
    x, y = _cell_centres(coverage, cell_m)
    d = np.sqrt((x - TX_M[0]) ** 2 + (y - TX_M[1]) ** 2 + (TX_M[2] - 0.75) ** 2)
    friis = 10.0 ** (-free_space_pathloss_db(d, EMPTY.carrier_hz) / 10.0)
    assert np.all(coverage.path_gain[d > 5] > 0)
    error_db = 10.0 * np.log10(coverage.path_gain[d > 5] / friis[d > 5])
    assert abs(np.median(error_db)) < 0.1
    near = (d > 5) & (d < 20)
    assert np.max(np.abs(10.0 * np.log10(coverage.path_gain[near] / friis[near]))) < 0.6


def test_the_grid_spans_the_scene_and_rows_run_up_in_y():
    spec = SceneSpec("simple_street_canyon", max_depth=1, samples_per_source=1000)
    coverage = coverage_map(spec, np.array([-40.0, 0.0, 1.5]), plane_z_m=0.75, cell_m=4.0, samples=200_000)
    x0, x1, y0, y1 = scene_extent_m(spec)
    ex0, ex1, ey0, ey1 = coverage.extent_m
    assert ex0 <= x0 and ex1 >= x1 and ey0 <= y0 and ey1 >= y1
    assert ex1 - ex0 < x1 - x0 + 4.0 and ey1 - ey0 < y1 - y0 + 4.0  # rounded up to whole cells, no more
    rows, columns = coverage.path_gain.shape
    assert (columns, rows) == (round((ex1 - ex0) / 4.0), round((ey1 - ey0) / 4.0))
    # The transmitter's own cell is the strongest: row index from y, column from x.
    r, c = np.unravel_index(np.argmax(coverage.path_gain), coverage.path_gain.shape)
    assert abs(ex0 + (c + 0.5) * 4.0 - (-40.0)) <= 4.0 and abs(ey0 + (r + 0.5) * 4.0 - 0.0) <= 4.0


@pytest.mark.parametrize("plane_z_m,cell_m,words", [(1.5, 2.0, "transmitter's height"), (1.49, 2.0, "no line-of-sight"),
                                                     (0.75, 0.01, f"more than {MAX_CELLS}"), (0.75, 0.0, "or none")])
def test_refusals_are_one_line(plane_z_m, cell_m, words):
    with pytest.raises(ValueError) as caught:
        coverage_map(EMPTY, TX_M, plane_z_m=plane_z_m, cell_m=cell_m)
    assert words in str(caught.value) and "\n" not in str(caught.value)
