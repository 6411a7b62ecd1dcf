"""CIFAR-10 from its python batches (testbed.data.cifar10), on tiny generated files in the real
format, and the i.i.d. and Dirichlet partitions (testbed.data.partition)."""

from __future__ import annotations

import io
import pickle
import tarfile

import numpy as np
import pytest

from testbed.data import load_dataset
from testbed.data.cifar10 import BATCHES, FOLDER, read_batch
from testbed.data.partition import partition_rows
from testbed.errors import DataError

PER_BATCH = 20


def _batch(index: int) -> bytes:
    """A batch as the authors pickled theirs: a dict of bytes keys, uint8 rows R|G|B, list labels."""
    rng = np.random.default_rng(index)
    data = rng.integers(0, 256, (PER_BATCH, 3072), dtype=np.uint8)
    data[:, :1024] = 200 + index  # the red plane of each image: a value the test finds again
    labels = [int(v) for v in (np.arange(PER_BATCH) + index) % 10]
    return pickle.dumps({b"batch_label": b"training batch", b"labels": labels, b"data": data,
                         b"filenames": [b"img_%d.png" % i for i in range(PER_BATCH)]}, protocol=2)


@pytest.fixture
def batches(tmp_path):
    folder = tmp_path / FOLDER
    folder.mkdir()
    for i, name in enumerate(BATCHES):
        (folder / name).write_bytes(_batch(i))
    return tmp_path


def test_the_loader_reads_the_python_batches_as_one_pool(batches):
    data = load_dataset("cifar10", seed=0, path=str(batches), num_nodes=4, samples_per_node=25,
                        scaling="public_bound")
    assert data.dim == 3072 and data.n_classes == 10 and data.num_nodes == 4
    assert data.train.sizes.tolist() == [20] * 4
    x = data.train.x * np.sqrt(3072) * 255  # undo the public bound and the pixel scale
    np.testing.assert_allclose(x[:, :1024].min(axis=1), x[:, :1024].max(axis=1))  # a whole red plane
    assert set(np.round(x[:, 0]).astype(int)) <= {200 + i for i in range(6)}
    assert (np.linalg.norm(data.train.x, axis=1) <= 1 + 1e-12).all()
    direct = load_dataset("cifar10", seed=0, path=str(batches / FOLDER), num_nodes=4, samples_per_node=25,
                          scaling="public_bound")
    np.testing.assert_array_equal(direct.train.x, data.train.x)


def test_a_boards_node_is_the_federations_node(batches):
    whole = load_dataset("cifar10", seed=3, path=str(batches), num_nodes=5, samples_per_node=20,
                         partition="dirichlet", alpha=0.3)
    alone = load_dataset("cifar10", seed=3, path=str(batches), num_nodes=5, samples_per_node=20,
                         partition="dirichlet", alpha=0.3, nodes=[2])
    np.testing.assert_array_equal(alone.train.x, whole.train.select([2]).x)


def test_a_pickle_that_names_any_other_class_is_refused(tmp_path):
    class Evil:
        def __reduce__(self):
            import os
            return (os.system, ("echo pwned",))

    with pytest.raises(DataError, match="refusing"):
        read_batch(pickle.dumps({b"data": Evil(), b"labels": []}, protocol=2), "data_batch_1")
    bad = pickle.dumps({b"data": np.zeros((2, 100), np.uint8), b"labels": [0, 1]}, protocol=2)
    with pytest.raises(DataError, match="3072"):
        read_batch(bad, "data_batch_1")
    wrong_labels = pickle.dumps({b"data": np.zeros((2, 3072), np.uint8), b"labels": [0, 10]}, protocol=2)
    with pytest.raises(DataError, match="labels in 0..9"):
        read_batch(wrong_labels, "test_batch")


def test_an_archive_that_is_not_the_authors_is_refused_by_its_checksum(tmp_path):
    archive = tmp_path / "cifar-10-python.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        for i, name in enumerate(BATCHES):
            raw = _batch(i)
            info = tarfile.TarInfo(f"{FOLDER}/{name}")
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))
    with pytest.raises(DataError, match="sha256"):
        load_dataset("cifar10", seed=0, path=str(archive), num_nodes=2, samples_per_node=10)


def test_iid_and_dirichlet_partitions_hold_disjoint_rows_of_the_asked_sizes():
    labels = np.repeat(np.arange(10), 100)
    for partition in ("iid", "dirichlet"):
        rows = partition_rows(labels, [50] * 12, partition, alpha=0.1, seed=1)
        assert [len(r) for r in rows] == [50] * 12
        everything = np.concatenate(rows)
        assert len(np.unique(everything)) == len(everything)


def test_a_small_alpha_skews_the_labels_and_a_large_one_does_not():
    labels = np.repeat(np.arange(10), 500)

    def classes_per_node(alpha):
        rows = partition_rows(labels, [100] * 20, "dirichlet", alpha=alpha, seed=2)
        return np.mean([np.sum(np.bincount(labels[r], minlength=10) >= 5) for r in rows])

    assert classes_per_node(0.05) < 3 < 9 < classes_per_node(1000.0)


def test_dirichlet_never_gives_a_row_twice_when_classes_run_out():
    labels = np.repeat(np.arange(3), [5, 5, 90])
    rows = partition_rows(labels, [30, 30, 40], "dirichlet", alpha=0.05, seed=0)
    assert sorted(np.concatenate(rows).tolist()) == list(range(100))
    with pytest.raises(DataError, match="101 rows"):
        partition_rows(labels, [101], "iid", seed=0)
