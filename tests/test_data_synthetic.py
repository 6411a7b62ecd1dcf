"""Synthetic logistic-regression task, and the per-node split and unit-ball scaling it relies on."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from testbed.data import load_dataset
from testbed.data.split import SplitWriter, scale_to_unit_ball, split_per_node, split_sizes
from testbed.data.synthetic import make_logistic, true_model
from testbed.errors import DataError


def splits(data):
    return (data.train, data.test, data.validation)


def test_shapes_and_names():
    data = make_logistic(num_nodes=5, samples_per_node=100, dim=7, n_classes=3, seed=0)
    assert (data.num_nodes, data.dim, data.n_classes, data.name) == (5, 7, 3, "synthetic")
    assert data.node_names == tuple(f"node-{m}" for m in range(5))
    assert [s.x.shape for s in splits(data)] == [(400, 7), (50, 7), (50, 7)]
    assert [s.y.shape for s in splits(data)] == [(400,), (50,), (50,)]
    assert data.train.sizes.tolist() == [80] * 5
    assert all(s.x.dtype == np.float64 and s.y.dtype == np.int64 for s in splits(data))


@pytest.mark.parametrize("heterogeneity", [0.0, 3.0])
def test_rows_on_unit_sphere(heterogeneity):
    data = make_logistic(6, 50, 4, seed=1, heterogeneity=heterogeneity)
    for s in splits(data):
        np.testing.assert_allclose(np.linalg.norm(s.x, axis=1), 1.0, atol=1e-12)
        assert np.linalg.norm(s.x, axis=1).max() <= 1 + 1e-12


def test_deterministic_per_seed():
    a, b = make_logistic(4, 60, 5, seed=3), make_logistic(4, 60, 5, seed=3)
    for sa, sb in zip(splits(a), splits(b)):
        np.testing.assert_array_equal(sa.x, sb.x)
        np.testing.assert_array_equal(sa.y, sb.y)
    c = make_logistic(4, 60, 5, seed=4)
    assert not np.array_equal(a.train.x, c.train.x)


@pytest.mark.parametrize("heterogeneity", [0.0, 0.7])
def test_node_subset_is_identical_to_selecting_from_all(heterogeneity):
    full = make_logistic(10, 40, 6, n_classes=3, seed=5, heterogeneity=heterogeneity)
    part = make_logistic(10, 40, 6, n_classes=3, seed=5, heterogeneity=heterogeneity, nodes=[7, 2, 9])
    chosen = full.select([7, 2, 9])
    assert part.node_names == chosen.node_names == ("node-7", "node-2", "node-9")
    for sp, sc in zip(splits(part), splits(chosen)):
        np.testing.assert_array_equal(sp.x, sc.x)
        np.testing.assert_array_equal(sp.y, sc.y)
        np.testing.assert_array_equal(sp.offsets, sc.offsets)


@pytest.mark.parametrize("n_classes", [2, 4])
def test_labels_mixed_and_bayes_accuracy_near_target(n_classes):
    data = make_logistic(20, 500, 30, n_classes=n_classes, seed=2)
    counts = np.bincount(data.train.y, minlength=n_classes)
    assert (counts > 0.1 * len(data.train.y) / n_classes).all(), counts
    w = true_model(30, n_classes, seed=2)
    x = np.concatenate([s.x for s in splits(data)])
    y = np.concatenate([s.y for s in splits(data)])
    assert np.mean(np.argmax(x @ w, axis=1) == y) == pytest.approx(0.875, abs=0.02)


def test_heterogeneity_shifts_node_means():
    def mean_norm(h):
        data = make_logistic(8, 200, 20, seed=0, heterogeneity=h)
        return np.mean([np.linalg.norm(data.train.node_slice(m)[0].mean(axis=0)) for m in range(8)])

    assert mean_norm(0.0) < 0.15 < 0.6 < mean_norm(2.0)


def test_bad_arguments_are_data_errors():
    with pytest.raises(DataError, match=r"nodes \[12\] are not in 0..9"):
        make_logistic(10, 20, 3, nodes=[1, 12])
    with pytest.raises(DataError, match="bayes_accuracy"):
        make_logistic(10, 20, 3, n_classes=4, bayes_accuracy=0.2)
    with pytest.raises(DataError, match="n_classes >= 2"):
        make_logistic(10, 20, 3, n_classes=1)


def test_memory_peak_is_the_final_arrays():
    """No full-size temporaries: peak allocation stays near the size of the result."""
    num_nodes, n, dim = 200, 100, 50
    final_bytes = num_nodes * n * (dim * 8 + 8)
    tracemalloc.start()
    try:
        make_logistic(num_nodes, n, dim, seed=0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1.2 * final_bytes + 3e6, (peak, final_bytes)


def test_load_dataset_synthetic():
    data = load_dataset("synthetic", seed=9, num_nodes=3, samples_per_node=20, dim=4, heterogeneity=0.5)
    np.testing.assert_array_equal(data.train.x, make_logistic(3, 20, 4, seed=9, heterogeneity=0.5).train.x)
    with pytest.raises(DataError, match="reads no file"):
        load_dataset("synthetic", seed=0, path="/tmp", num_nodes=3, samples_per_node=20, dim=4)
    with pytest.raises(DataError, match="missing option.*samples_per_node, dim"):
        load_dataset("synthetic", seed=0, num_nodes=3)


def test_split_sizes_and_remainder_to_validation():
    assert split_sizes(100) == (80, 10, 10)
    assert split_sizes(9) == (7, 0, 2)
    assert split_sizes(0) == (0, 0, 0)
    for n in range(200):
        n_train, n_test, n_val = split_sizes(n)
        assert n_train == int(np.floor(0.8 * n + 1e-9)) and n_test == n // 10 and n_val >= n_test


def test_split_keeps_every_sample_once_with_its_label():
    rng = np.random.default_rng(0)
    # Any real dtype goes in; float64 comes out.
    xs = [rng.standard_normal((13, 3)), np.zeros((0, 3)), rng.integers(0, 9, (27, 3)).astype(np.float32)]
    ys = [np.arange(len(x)) for x in xs]
    data = split_per_node(xs, ys, seed=4, n_classes=2, name="toy")
    for m, (x, y) in enumerate(zip(xs, ys)):
        got_x = np.concatenate([s.node_slice(m)[0] for s in splits(data)])
        got_y = np.concatenate([s.node_slice(m)[1] for s in splits(data)])
        assert sorted(got_y.tolist()) == list(range(len(x)))
        np.testing.assert_array_equal(got_x, x[got_y])
        assert got_x.dtype == np.float64


def test_split_writer_needs_every_node():
    writer = SplitWriter([3, 4], dim=2, seed=0)
    writer.write(0, np.zeros((3, 2)), np.zeros(3, dtype=np.int64))
    with pytest.raises(ValueError, match=r"nodes \[1\] were never written"):
        writer.finish(n_classes=2, name="toy")


def test_scale_to_unit_ball_keeps_geometry():
    x = np.array([[3.0, 4.0], [0.0, 1.0], [0.0, 0.0]])
    scale_to_unit_ball(x)
    np.testing.assert_allclose(x, [[0.6, 0.8], [0.0, 0.2], [0.0, 0.0]])
    one_hot = np.zeros((4, 6))
    one_hot[np.arange(4), [0, 1, 0, 2]] = 1.0
    one_hot[np.arange(4), [3, 3, 4, 5]] = 1.0
    np.testing.assert_allclose(np.linalg.norm(scale_to_unit_ball(one_hot), axis=1), 1.0)


def test_synthetic_rows_are_the_same_under_every_scaling():
    from testbed.data import load_dataset

    base = make_logistic(5, 30, 4, seed=1)
    for scaling in ("per_node", "public_bound", "pooled"):
        other = load_dataset("synthetic", seed=1, num_nodes=5, samples_per_node=30, dim=4, scaling=scaling)
        np.testing.assert_array_equal(base.train.x, other.train.x)
    with pytest.raises(DataError, match="unknown scaling"):
        make_logistic(5, 30, 4, seed=1, scaling="global")


def test_per_node_helpers_match_a_loop_over_nodes_and_skip_empty_nodes():
    from testbed.data.split import scale_to_unit_ball_per_node, standardise_per_node

    rng = np.random.default_rng(0)
    offsets = np.array([0, 0, 7, 7, 20, 21, 21])  # empty first, middle and last nodes; a one-row node
    x = rng.normal(3.0, 2.0, (21, 4))
    want = x.copy()
    for lo, hi in zip(offsets[:-1], offsets[1:]):
        if hi > lo:
            block = want[lo:hi, 1:]
            std = block.std(axis=0)
            want[lo:hi, 1:] = (block - block.mean(axis=0)) / np.where(std > 0, std, 1.0)
            want[lo:hi] /= np.linalg.norm(want[lo:hi], axis=1).max()
    got = scale_to_unit_ball_per_node(standardise_per_node(x, offsets, slice(1, None)), offsets)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)


def test_one_nodes_rows_are_a_read_only_view_and_scattered_rows_a_copy():
    data = load_dataset("synthetic", seed=0, num_nodes=4, samples_per_node=30, dim=3, n_classes=2)
    one = data.train.select([2])
    assert np.shares_memory(one.x, data.train.x) and not one.x.flags.writeable
    assert np.array_equal(one.x, data.train.node_slice(2)[0]) and np.array_equal(one.y, data.train.node_slice(2)[1])
    with pytest.raises(ValueError):
        one.x[0, 0] = 1.0  # the parent's rows: every holder would see it
    consecutive = data.train.select([1, 2])
    assert np.shares_memory(consecutive.x, data.train.x)
    scattered = data.train.select([3, 0])
    assert not np.shares_memory(scattered.x, data.train.x) and scattered.x.flags.writeable
    assert np.array_equal(scattered.x, np.concatenate([data.train.node_slice(3)[0], data.train.node_slice(0)[0]]))
