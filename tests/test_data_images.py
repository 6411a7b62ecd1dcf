"""Digit images for PADPFL: the IDX reader and MNIST's checks, salt-and-pepper noise, parts with
per-part sizes and noise, a board's rows, and the ReLU MLP of the paper."""

from __future__ import annotations

import gzip

import numpy as np
import pytest

from testbed.data.images import NOISE_DENSITIES, _mnist_file, density, read_idx, salt_and_pepper
from testbed.errors import DataError
from testbed.learning.models import build_model

from conftest import needs_module

needs_sklearn = needs_module("sklearn", "digits")  # the digits data set ships with scikit-learn


def _idx(images: np.ndarray) -> bytes:
    dims = images.ndim
    return bytes([0, 0, 8, dims]) + b"".join(int(n).to_bytes(4, "big") for n in images.shape) + images.tobytes()


def test_read_idx_reads_images_and_labels_and_refuses_other_shapes():
    img = np.arange(3 * 28 * 28, dtype=np.uint64).astype(np.uint8).reshape(3, 28, 28)
    np.testing.assert_array_equal(read_idx(_idx(img), 3, (28, 28), "x"), img)
    np.testing.assert_array_equal(read_idx(_idx(np.array([7, 1, 0], dtype=np.uint8)), 3, None, "y"), [7, 1, 0])
    with pytest.raises(DataError, match="shape"):
        read_idx(_idx(img), 4, (28, 28), "x")
    with pytest.raises(DataError, match="not an IDX"):
        read_idx(b"\x00\x00\x09\x03" + _idx(img)[4:], 3, (28, 28), "x")


def test_mnist_files_are_checked_a_gz_by_sha256_a_plain_one_by_header(tmp_path, monkeypatch):
    monkeypatch.delenv("TESTBED_DATA", raising=False)
    monkeypatch.setenv("TESTBED_CACHE", str(tmp_path / "cache"))
    (tmp_path / "train-labels-idx1-ubyte.gz").write_bytes(gzip.compress(_idx(np.zeros(60000, dtype=np.uint8))))
    with pytest.raises(DataError, match="sha256"):  # not the published file
        _mnist_file("train-labels-idx1-ubyte", str(tmp_path))
    (tmp_path / "train-labels-idx1-ubyte").write_bytes(_idx(np.zeros(59999, dtype=np.uint8)))
    with pytest.raises(DataError, match="MNIST's is"):
        _mnist_file("train-labels-idx1-ubyte", str(tmp_path))
    (tmp_path / "train-labels-idx1-ubyte").write_bytes(_idx(np.full(60000, 3, dtype=np.uint8)))
    assert len(_mnist_file("train-labels-idx1-ubyte", str(tmp_path))) == 8 + 60000


def test_salt_and_pepper_hits_the_named_density_with_even_odds():
    assert [density(k) for k in ("severe", "moderate", "slight", "none")] == [0.5, 0.3, 0.1, 0.0]
    assert NOISE_DENSITIES["none"] == 0 and density(0.25) == 0.25
    with pytest.raises(DataError):
        density("heavy")
    x = np.full((200, 100), 0.5)
    salt_and_pepper(x, 0.3, np.random.default_rng(0))
    hit = x != 0.5
    assert hit.mean() == pytest.approx(0.3, abs=0.01)
    assert (x[hit] == 1).mean() == pytest.approx(0.5, abs=0.02) and set(np.unique(x[hit])) == {0.0, 1.0}
    clean = np.full((3, 4), 0.5)
    assert (salt_and_pepper(clean, 0.0, np.random.default_rng(0)) == 0.5).all()


@needs_sklearn
def test_digits_in_parts_with_sizes_noise_and_a_boards_own_rows():
    from testbed.data import load_dataset

    kw = dict(seed=2, num_nodes=6, parts=[2, 3, 1], part_samples=[20, 30, 50], part_noise=["severe", "none", 0.1])
    data = load_dataset("digits", **kw)
    assert data.train.sizes.tolist() == [16, 16, 24, 24, 24, 40] and data.dim == 64 and data.n_classes == 10
    assert data.node_names == ("part-1", "part-1", "part-2", "part-2", "part-2", "part-3")
    assert np.linalg.norm(data.train.x, axis=1).max() <= 1 + 1e-12
    pixels = data.train.x * 8  # back to [0, 1]
    lo, hi = data.train.offsets[0], data.train.offsets[2]
    severe = np.isin(pixels[lo:hi], (0.0, 1.0)).mean()
    clean = np.isin(pixels[data.train.offsets[2]:data.train.offsets[5]], (0.0, 1.0)).mean()
    assert severe > clean + 0.2  # part 1's training rows are corrupted, part 2's are not
    assert not np.isin(data.test.x[: data.test.offsets[2]] * 8, (0.0, 1.0)).all()
    board = load_dataset("digits", nodes=[4], **kw)
    np.testing.assert_array_equal(board.train.x, data.select([4]).train.x)
    with pytest.raises(DataError, match="need"):
        load_dataset("digits", seed=0, num_nodes=60, samples_per_node=188)  # 11,280 > 1,797 images
    with pytest.raises(DataError, match="sum to num_nodes"):
        load_dataset("digits", seed=0, num_nodes=6, parts=[2, 2])


def test_relu_mlp_gradient_matches_finite_differences():
    model = build_model("mlp", 5, 3, hidden=4, activation="relu")
    rng = np.random.default_rng(0)
    params = model.init(rng)[None, :]
    x, y, w = rng.normal(size=(1, 6, 5)) * 0.3, rng.integers(0, 3, size=(1, 6)), np.full((1, 6), 1 / 6)
    loss, grad = model.loss_and_grad(params, x, y, w)
    eps = 1e-6
    numeric = np.array([(model.loss_and_grad(params + eps * e, x, y, w)[0] - model.loss_and_grad(params - eps * e, x, y, w)[0])[0]
                        / (2 * eps) for e in np.eye(model.num_params)[:, None, :]])
    np.testing.assert_allclose(grad[0], numeric, rtol=1e-5, atol=1e-7)
    hid, _ = model._forward(params[0], x[0])
    assert (hid >= 0).all() and (hid == 0).any()
