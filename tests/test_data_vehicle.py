"""Vehicle loader on generated files in MOCHA's vehicle.mat layout (the real file is not available offline)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.io

from testbed.data import cache, load_dataset
from testbed.util import cache_folder
from testbed.data.split import split_sizes
from testbed.data.vehicle import load_vehicle, write_vehicle_mat
from testbed.errors import DataError

SIZES = [40, 55, 31, 62, 48]


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path):
    """No test may touch the network, a user's $TESTBED_DATA or their download cache."""

    def no_download(url, dest, timeout_s=None):
        raise OSError("network disabled in tests")

    monkeypatch.setattr(cache, "download", no_download)
    monkeypatch.delenv(cache.DATA_ENV, raising=False)
    monkeypatch.setenv(cache_folder.CACHE_ENV, str(tmp_path / "cache"))


@pytest.fixture
def mat_file(tmp_path):
    path = tmp_path / "vehicle.mat"
    write_vehicle_mat(path, SIZES, dim=100, seed=0)
    return path


def splits(data):
    return (data.train, data.test, data.validation)


def node_rows(data, m):
    """Node m's samples over all three splits, rows sorted, labels in the same order."""
    x = np.concatenate([s.node_slice(m)[0] for s in splits(data)])
    y = np.concatenate([s.node_slice(m)[1] for s in splits(data)])
    order = np.lexsort(x.T)
    return x[order], y[order]


def expected_features(path, scaling="pooled"):
    """pooled: standardised over the whole file, then divided by the largest row norm; per_node: the
    same over each sensor's rows; public_bound: signed log1p, rows clipped to norm 1."""
    mat = scipy.io.loadmat(path)
    y = np.concatenate([c[0].ravel() for c in mat["Y"]])
    if scaling == "public_bound":
        x = np.concatenate([c[0] for c in mat["X"]])
        x = np.sign(x) * np.log1p(np.abs(x))
        return x / np.maximum(1.0, np.linalg.norm(x, axis=1))[:, None], y
    parts = [np.concatenate([c[0] for c in mat["X"]])] if scaling == "pooled" else [c[0] for c in mat["X"]]
    parts = [(x - x.mean(axis=0)) / x.std(axis=0) for x in parts]
    return np.concatenate([x / np.linalg.norm(x, axis=1).max() for x in parts]), y


def test_written_file_has_mocha_layout(mat_file):
    mat = scipy.io.loadmat(mat_file)
    assert mat["X"].shape == mat["Y"].shape == (len(SIZES), 1)
    assert mat["X"].dtype == object
    for i, n in enumerate(SIZES):
        assert mat["X"][i][0].shape == (n, 100) and mat["X"][i][0].dtype == np.float64
        assert mat["Y"][i][0].shape == (n, 1)
        assert set(np.unique(mat["Y"][i][0]).tolist()) <= {-1.0, 1.0}


@pytest.mark.parametrize("scaling", ["pooled", "per_node", "public_bound"])
def test_vehicle1_one_node_per_sensor(mat_file, scaling):
    data = load_vehicle("vehicle-1", path=str(mat_file), seed=0, scaling=scaling)
    assert (data.num_nodes, data.dim, data.n_classes, data.name) == (len(SIZES), 100, 2, "vehicle-1")
    assert data.node_names == tuple(f"sensor-{i}" for i in range(len(SIZES)))
    x_all, y_all = expected_features(mat_file, scaling)
    start = 0
    for m, n in enumerate(SIZES):
        assert (data.train.sizes[m], data.test.sizes[m], data.validation.sizes[m]) == split_sizes(n)
        got_x, got_y = node_rows(data, m)
        want_x, want_y = x_all[start : start + n], (y_all[start : start + n] > 0).astype(np.int64)
        order = np.lexsort(want_x.T)
        np.testing.assert_allclose(got_x, want_x[order], atol=1e-12)
        np.testing.assert_array_equal(got_y, want_y[order])
        start += n


@pytest.mark.parametrize("scaling", ["pooled", "per_node", "public_bound"])
@pytest.mark.parametrize("partition", ["vehicle-1", "vehicle-2"])
def test_unit_ball_binary_labels_and_determinism(partition, scaling, mat_file):
    data = load_vehicle(partition, path=str(mat_file), seed=1, scaling=scaling)
    norms = np.concatenate([np.linalg.norm(s.x, axis=1) for s in splits(data)])
    assert norms.max() <= 1 + 1e-12 and norms.max() == pytest.approx(1.0)
    if scaling == "per_node":  # every node reaches norm 1 with its own largest row
        for m in range(data.num_nodes):
            node_max = max(np.linalg.norm(s.node_slice(m)[0], axis=1).max(initial=0) for s in splits(data))
            assert node_max == pytest.approx(1.0)
    assert set(np.concatenate([s.y for s in splits(data)]).tolist()) == {0, 1}
    again = load_vehicle(partition, path=str(mat_file), seed=1, scaling=scaling)
    for a, b in zip(splits(data), splits(again)):
        np.testing.assert_array_equal(a.x, b.x)
        np.testing.assert_array_equal(a.y, b.y)


@pytest.mark.parametrize("scaling", ["pooled", "public_bound"])
def test_vehicle2_equal_iid_nodes(mat_file, scaling):
    data = load_vehicle("vehicle-2", path=str(mat_file), seed=0, scaling=scaling)
    sizes = data.train.sizes + data.test.sizes + data.validation.sizes
    assert data.num_nodes == len(SIZES) and sizes.sum() == sum(SIZES)
    assert sizes.max() - sizes.min() <= 1
    assert load_vehicle("vehicle-2", path=str(mat_file), num_nodes=3).num_nodes == 3
    other = load_vehicle("vehicle-2", path=str(mat_file), seed=1, scaling=scaling)
    assert not np.array_equal(data.train.x, other.train.x)
    # Same samples, only spread differently (no statistic depends on who holds a row).
    pooled = lambda d: np.sort(np.concatenate([s.x[:, 0] for s in splits(d)]))  # noqa: E731
    np.testing.assert_array_equal(pooled(data), pooled(other))


def test_row_cell_orientation_and_01_labels(tmp_path):
    x = np.empty((1, 2), dtype=object)
    y = np.empty((1, 2), dtype=object)
    x[0, 0], x[0, 1] = np.ones((10, 3)) * np.arange(3), np.arange(36.0).reshape(12, 3)
    y[0, 0], y[0, 1] = np.ones((10, 1)), np.arange(12.0)[:, None] % 2
    path = tmp_path / "row.mat"
    scipy.io.savemat(path, {"X": x, "Y": y})
    data = load_vehicle("vehicle-1", path=str(path))
    assert data.num_nodes == 2 and data.dim == 3
    assert (data.train.sizes + data.test.sizes + data.validation.sizes).tolist() == [10, 12]


@pytest.mark.parametrize(
    ("content", "match"),
    [
        ({"X": "not a cell"}, "no cell array 'X'"),
        ({"X": [[np.ones((3, 2))]], "Y": [[np.ones((3, 1)) * 2]]}, "labels"),
        ({"X": [[np.ones((3, 2))]], "Y": [[np.ones((4, 1))]]}, "expected n x 2 features and n labels"),
    ],
)
def test_malformed_files(content, match, tmp_path):
    path = tmp_path / "bad.mat"
    cells = {}
    for key, value in content.items():
        if isinstance(value, list):
            cell = np.empty((1, 1), dtype=object)
            cell[0, 0] = value[0][0]
            value = cell
        cells[key] = value
    scipy.io.savemat(path, cells)
    with pytest.raises(DataError, match=match):
        load_vehicle("vehicle-1", path=str(path))


def test_not_a_mat_file(tmp_path):
    path = tmp_path / "vehicle.mat"
    path.write_bytes(b"this is not matlab")
    with pytest.raises(DataError, match="not a readable .mat file"):
        load_vehicle("vehicle-1", path=str(path))


def test_missing_file_explains_how_to_provide_it():
    with pytest.raises(DataError) as err:
        load_vehicle("vehicle-1")
    message = str(err.value)
    assert "vehicle.mat not found" in message and "MOCHA" in message
    assert "data.path" in message and "TESTBED_DATA/vehicle/vehicle.mat" in message


def test_testbed_data_directory(mat_file, monkeypatch):
    monkeypatch.setenv(cache.DATA_ENV, str(mat_file.parent))
    assert load_vehicle("vehicle-1").num_nodes == len(SIZES)


def test_bad_partition_and_num_nodes(mat_file):
    with pytest.raises(DataError, match="one node per sensor"):
        load_vehicle("vehicle-1", path=str(mat_file), num_nodes=23)
    with pytest.raises(DataError, match="unknown Vehicle partition"):
        load_vehicle("vehicle-3", path=str(mat_file))


def test_load_dataset_vehicle(mat_file):
    data = load_dataset("vehicle-2", seed=2, path=str(mat_file), num_nodes=2)
    assert data.name == "vehicle-2" and data.num_nodes == 2


@pytest.mark.parametrize("scaling", ["per_node", "public_bound"])
@pytest.mark.parametrize("partition", ["vehicle-1", "vehicle-2"])
def test_a_board_holding_one_node_gets_the_simulators_rows(mat_file, partition, scaling):
    full = load_vehicle(partition, path=str(mat_file), seed=2, scaling=scaling)
    for m in (0, 3):
        for board in (load_vehicle(partition, path=str(mat_file), seed=2, scaling=scaling, nodes=[m]),
                      full.select([m])):
            assert board.node_ids == (m,) and board.node_names == (full.node_names[m],)
            for a, b in zip(splits(board), splits(full.select([m]))):
                np.testing.assert_array_equal(a.x, b.x)
                np.testing.assert_array_equal(a.y, b.y)


def test_scaling_per_node_uses_only_the_nodes_rows(mat_file, tmp_path):
    """Changing another sensor's data changes nothing on node 0 under per_node (it does under pooled)."""
    other = tmp_path / "other.mat"
    mat = scipy.io.loadmat(mat_file)
    mat["X"][2][0] = mat["X"][2][0] * 50 + 7
    scipy.io.savemat(other, {"X": mat["X"], "Y": mat["Y"]})
    for scaling, same in (("per_node", True), ("public_bound", True), ("pooled", False)):
        a = load_vehicle("vehicle-1", path=str(mat_file), scaling=scaling).train.node_slice(0)[0]
        b = load_vehicle("vehicle-1", path=str(other), scaling=scaling).train.node_slice(0)[0]
        assert np.array_equal(a, b) == same, scaling


def test_unknown_scaling_and_nodes(mat_file):
    with pytest.raises(DataError, match="unknown scaling 'global'"):
        load_vehicle("vehicle-1", path=str(mat_file), scaling="global")
    with pytest.raises(DataError, match="unknown scaling"):
        load_dataset("vehicle-1", seed=0, path=str(mat_file), scaling="global")
    with pytest.raises(DataError, match="nodes"):
        load_vehicle("vehicle-1", path=str(mat_file), nodes=[len(SIZES)])
