"""UCI Adult loader: DP-PASGD's partitions (dp-pasgd.md §5.1, §8 check 9) and file resolution."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from testbed.data import load_dataset
from testbed.data import cache
from testbed.util import cache_folder
from testbed.data.adult import ADULT, load_adult
from testbed.data.split import split_sizes
from testbed.errors import DataError

from conftest import adult_file

ADULT_FILE = adult_file()

EDUCATION_LEVELS = {
    "Bachelors", "Some-college", "11th", "HS-grad", "Prof-school", "Assoc-acdm", "Assoc-voc", "9th",
    "7th-8th", "12th", "Masters", "1st-4th", "10th", "Doctorate", "5th-6th", "Preschool",
}  # fmt: skip


@pytest.fixture(autouse=True)
def offline(monkeypatch, tmp_path):
    """No test may touch the network, a user's $TESTBED_DATA or their download cache."""

    def no_download(url, dest, timeout_s=None):
        raise OSError("network disabled in tests")

    monkeypatch.setattr(cache, "download", no_download)
    monkeypatch.delenv(cache.DATA_ENV, raising=False)
    monkeypatch.setenv(cache_folder.CACHE_ENV, str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def adult1():
    return load_adult("adult-1", path=str(ADULT_FILE), seed=0)


@pytest.fixture(scope="module")
def adult2():
    return load_adult("adult-2", path=str(ADULT_FILE), seed=0)


def node_sizes(data):
    return data.train.sizes + data.test.sizes + data.validation.sizes


def test_adult1_one_node_per_education_level(adult1):
    sizes = node_sizes(adult1)
    assert adult1.num_nodes == 16 and set(adult1.node_names) == EDUCATION_LEVELS
    assert sizes.sum() == 32_561
    assert sizes.mean() == pytest.approx(2035.0625)
    # The paper prints a std of 4,367; the data gives 2,911.4 (population), a known discrepancy.
    assert sizes.std() == pytest.approx(2911.4, abs=0.1)
    assert (np.diff(sizes) < 0).all(), "nodes are ordered by descending size"
    assert (adult1.node_names[0], sizes[0]) == ("HS-grad", 10_501)
    assert (adult1.node_names[-1], sizes[-1]) == ("Preschool", 51)


def test_adult2_sixteen_iid_nodes(adult2):
    sizes = node_sizes(adult2)
    assert adult2.num_nodes == 16 and sizes.sum() == 32_561
    assert set(sizes.tolist()) == {2035, 2036}
    # i.i.d.: every node's positive rate is near the global 24.1 %.
    rates = [adult2.train.node_slice(m)[1].mean() for m in range(16)]
    assert max(abs(r - 0.2408) for r in rates) < 0.05


@pytest.mark.parametrize("which", ["adult1", "adult2"])
def test_split_is_80_10_10_on_every_node(which, request):
    data = request.getfixturevalue(which)
    for m, n in enumerate(node_sizes(data)):
        n_train, n_test, n_val = split_sizes(int(n))
        assert (data.train.sizes[m], data.test.sizes[m], data.validation.sizes[m]) == (n_train, n_test, n_val)
        assert n_train == int(0.8 * n) and n_test == n // 10
    assert split_sizes(51) == (40, 5, 6)


@pytest.mark.parametrize("which", ["adult1", "adult2"])
def test_rows_in_unit_ball_and_binary_labels(which, request):
    data = request.getfixturevalue(which)
    assert data.dim == 86 and data.n_classes == 2
    for split in (data.train, data.test, data.validation):
        norms = np.linalg.norm(split.x, axis=1)
        assert norms.max() <= 1 + 1e-12
        # One-hot of 7 fields: every row has norm exactly 1, seven entries of 1/sqrt(7).
        np.testing.assert_allclose(norms, 1.0, atol=1e-12)
        assert ((split.x != 0).sum(axis=1) == 7).all()
        assert set(np.unique(split.y).tolist()) == {0, 1}
    positives = sum(int(s.y.sum()) for s in (data.train, data.test, data.validation))
    assert positives == 7841


@pytest.mark.parametrize(
    ("include_education", "numeric", "dim"), [(True, False, 102), (False, True, 91), (True, True, 108)]
)
def test_feature_options(include_education, numeric, dim):
    data = load_adult("adult-1", path=str(ADULT_FILE), include_education=include_education, numeric=numeric)
    assert data.dim == dim
    norms = np.linalg.norm(data.train.x, axis=1)
    assert norms.max() <= 1 + 1e-12
    # With education among the features, the partition key is a nonzero column constant on each node.
    x0 = data.train.node_slice(0)[0]
    constant_nonzero = (np.ptp(x0, axis=0) == 0) & (x0[0] != 0)
    assert constant_nonzero.any() == include_education


def test_same_seed_same_arrays_and_seed_changes_partition(adult2):
    again = load_adult("adult-2", path=str(ADULT_FILE), seed=0)
    for a, b in ((adult2.train, again.train), (adult2.test, again.test), (adult2.validation, again.validation)):
        np.testing.assert_array_equal(a.x, b.x)
        np.testing.assert_array_equal(a.y, b.y)
    other = load_adult("adult-2", path=str(ADULT_FILE), seed=1)
    assert not np.array_equal(adult2.train.x, other.train.x)


def test_adult1_seed_changes_split_not_partition(adult1):
    other = load_adult("adult-1", path=str(ADULT_FILE), seed=1)

    def node_rows(data, m):
        rows = np.concatenate([s.node_slice(m)[0] for s in (data.train, data.test, data.validation)])
        return rows[np.lexsort(rows.T)]

    assert not np.array_equal(adult1.train.x, other.train.x)
    np.testing.assert_array_equal(node_rows(adult1, 15), node_rows(other, 15))


def test_num_nodes_option():
    data = load_adult("adult-2", path=str(ADULT_FILE), num_nodes=10)
    assert set(node_sizes(data).tolist()) == {3256, 3257}
    with pytest.raises(DataError, match="adult-1 has one node per education level"):
        load_adult("adult-1", path=str(ADULT_FILE), num_nodes=10)
    with pytest.raises(DataError, match="unknown Adult partition"):
        load_adult("adult-3", path=str(ADULT_FILE))


def test_checksum_mismatch_names_file_and_hashes(tmp_path):
    corrupt = tmp_path / "adult.data"
    data = bytearray(ADULT_FILE.read_bytes())
    data[100] ^= 1
    corrupt.write_bytes(bytes(data))
    with pytest.raises(DataError) as err:
        load_adult("adult-1", path=str(corrupt))
    message = str(err.value)
    assert str(corrupt) in message and ADULT.sha256 in message and cache.sha256_of(corrupt) in message


def test_missing_file_offline_says_where_it_looked(tmp_path, monkeypatch):
    monkeypatch.setattr(cache, "BUNDLED_DIR", tmp_path / "no-bundled-copies")  # an install without it
    with pytest.raises(DataError) as err:
        load_adult("adult-1")
    message = str(err.value)
    assert "TESTBED_DATA" in message and "data.path" in message
    assert str(tmp_path / "cache" / "adult" / "adult.data") in message
    assert "network disabled" in message and "\n" not in message


def test_a_fresh_clone_offline_unpacks_the_packaged_copy_into_the_cache(tmp_path):
    """Nothing in data.path, $TESTBED_DATA or the cache, no network: the package's xz copy (CC BY 4.0,
    testbed/data/bundled/README.md) is unpacked into the cache, checked, and read from there after."""
    cached = tmp_path / "cache" / "adult" / "adult.data"
    assert cache.resolve(ADULT) == cached and cache.sha256_of(cached) == ADULT.sha256
    assert "CC BY 4.0" in (cache.BUNDLED_DIR / "README.md").read_text()
    assert cache.resolve(ADULT) == cached


def test_a_damaged_packaged_copy_never_lands_in_the_cache(tmp_path, monkeypatch):
    bundled = tmp_path / "bundled"
    bundled.mkdir()
    (bundled / "adult.data.xz").write_bytes(b"not xz")
    monkeypatch.setattr(cache, "BUNDLED_DIR", bundled)
    with pytest.raises(DataError) as err:
        cache.resolve(ADULT)
    message = str(err.value)
    assert str(bundled / "adult.data.xz") in message and "network disabled" in message and "\n" not in message
    assert not (tmp_path / "cache" / "adult" / "adult.data").exists()


def test_testbed_data_comes_before_the_packaged_copy(tmp_path, monkeypatch):
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "adult.data").symlink_to(ADULT_FILE)
    monkeypatch.setenv(cache.DATA_ENV, str(tmp_path / "data"))
    assert cache.resolve(ADULT) == tmp_path / "data" / "adult.data"
    assert not (tmp_path / "cache" / "adult" / "adult.data").exists()


def test_explicit_path_without_the_file_is_an_error(tmp_path):
    with pytest.raises(DataError, match="not found at data.path"):
        load_adult("adult-1", path=str(tmp_path))


@pytest.mark.parametrize("layout", ["adult/adult.data", "adult.data"])
def test_testbed_data_directory(layout, tmp_path, monkeypatch):
    target = tmp_path / "data" / layout
    target.parent.mkdir(parents=True)
    target.symlink_to(ADULT_FILE)
    monkeypatch.setenv(cache.DATA_ENV, str(tmp_path / "data"))
    assert cache.resolve(ADULT) == target
    # A directory given as data.path is searched the same way.
    assert cache.resolve(ADULT, tmp_path / "data") == target


def test_download_lands_in_cache_and_bad_download_is_removed(tmp_path, monkeypatch):
    cached = tmp_path / "cache" / "adult" / "adult.data"
    fetched = []

    def fake_download(url, dest, timeout_s=None):
        fetched.append(url)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ADULT_FILE, dest)

    monkeypatch.setattr(cache, "BUNDLED_DIR", tmp_path / "no-bundled-copies")  # an install without it
    monkeypatch.setattr(cache, "download", fake_download)
    assert cache.resolve(ADULT) == cached and fetched == [ADULT.url]
    assert cache.resolve(ADULT) == cached and len(fetched) == 1, "second call uses the cache"

    cached.unlink()
    monkeypatch.setattr(cache, "download", lambda url, dest, timeout_s=None: dest.write_bytes(b"<html>"))
    with pytest.raises(DataError, match="sha256"):
        cache.resolve(ADULT)
    assert not cached.exists()


def test_load_dataset_dispatch():
    data = load_dataset("adult-2", seed=0, path=str(ADULT_FILE), num_nodes=4)
    assert data.name == "adult-2" and data.num_nodes == 4
    with pytest.raises(DataError, match="valid: synthetic, adult-1, adult-2, vehicle-1, vehicle-2"):
        load_dataset("adult", seed=0)
    with pytest.raises(DataError, match="unknown option.*numerics.*valid: include_education, numeric, num_nodes"):
        load_dataset("adult-1", seed=0, path=str(ADULT_FILE), numerics=True)


# ----------------------------------------------------------------------------- scaling


def all_splits(data):
    return (data.train, data.test, data.validation)


@pytest.mark.parametrize("partition", ["adult-1", "adult-2"])
def test_one_hot_features_are_the_same_under_every_scaling(partition):
    """Every one-hot row has norm sqrt(F): pooled, per-node and public bounds are all sqrt(F)."""
    pooled = load_adult(partition, path=str(ADULT_FILE), seed=3, scaling="pooled")
    for scaling in ("per_node", "public_bound"):
        other = load_adult(partition, path=str(ADULT_FILE), seed=3, scaling=scaling)
        for a, b in zip(all_splits(pooled), all_splits(other)):
            np.testing.assert_array_equal(a.x, b.x)
            np.testing.assert_array_equal(a.y, b.y)


def test_pooled_is_the_papers_scaling():
    """Numeric columns standardised over the whole file, rows divided by the file's largest norm."""
    from testbed.data.adult import NUMERIC, _encode, _read_columns

    cols = _read_columns(ADULT_FILE)
    one_hot = []
    for c in ("workclass", "marital-status", "occupation", "relationship", "race", "sex", "native-country"):
        names, codes = _encode(cols[c])
        one_hot.append(np.eye(len(names))[codes])
    num = [np.asarray(cols[c], dtype=float) for c in NUMERIC]
    x = np.concatenate(one_hot + [((v - v.mean()) / v.std())[:, None] for v in num], axis=1)
    x /= np.linalg.norm(x, axis=1).max()
    data = load_adult("adult-1", path=str(ADULT_FILE), numeric=True, scaling="pooled")
    got = np.concatenate([s.x for s in all_splits(data)])
    key = lambda a: a[np.lexsort(np.round(a, 9).T)]  # noqa: E731  (same rows, another order)
    np.testing.assert_allclose(key(got), key(x), atol=1e-12)


@pytest.mark.parametrize("scaling", ["per_node", "public_bound"])
@pytest.mark.parametrize("partition", ["adult-1", "adult-2"])
def test_a_board_holding_one_node_gets_the_simulators_rows(partition, scaling):
    full = load_adult(partition, path=str(ADULT_FILE), seed=1, numeric=True, include_education=True, scaling=scaling)
    for m in (0, 15):
        board = load_adult(partition, path=str(ADULT_FILE), seed=1, numeric=True, include_education=True,
                           scaling=scaling, nodes=[m])
        assert board.node_ids == (m,) and board.node_names == (full.node_names[m],)
        for a, b in zip(all_splits(board), all_splits(full.select([m]))):
            np.testing.assert_array_equal(a.x, b.x)
            np.testing.assert_array_equal(a.y, b.y)


def test_per_node_numeric_columns_use_the_nodes_own_statistics():
    data = load_adult("adult-2", path=str(ADULT_FILE), seed=0, numeric=True, scaling="per_node")
    for m in range(data.num_nodes):
        x = np.concatenate([s.node_slice(m)[0] for s in all_splits(data)])
        norms = np.linalg.norm(x, axis=1)
        assert norms.max() == pytest.approx(1.0)  # the node's own largest row
        numeric = x[:, -5:] * norms.max()
        np.testing.assert_allclose(numeric.mean(axis=0), 0.0, atol=1e-9)
        # Standardised, then divided by one common factor: equal spread in every numeric column.
        np.testing.assert_allclose(numeric.std(axis=0), numeric.std(axis=0)[0], rtol=1e-9)


def test_public_bound_uses_no_statistic_of_the_data():
    """Every row divided by sqrt(F + k), the numeric part a fixed map into [0, 1]."""
    data = load_adult("adult-1", path=str(ADULT_FILE), seed=0, numeric=True, scaling="public_bound")
    x = np.concatenate([s.x for s in all_splits(data)])
    assert np.linalg.norm(x, axis=1).max() <= 1 + 1e-12
    np.testing.assert_allclose(np.linalg.norm(x[:, :-5], axis=1), np.sqrt(7 / 12), rtol=1e-12)
    assert (x[:, -5:] >= 0).all() and (x[:, -5:] <= 1 / np.sqrt(12) + 1e-15).all()


def test_load_dataset_passes_scaling_and_refuses_an_unknown_one():
    a = load_dataset("adult-2", seed=0, path=str(ADULT_FILE), numeric=True, scaling="public_bound")
    b = load_adult("adult-2", path=str(ADULT_FILE), seed=0, numeric=True, scaling="public_bound")
    np.testing.assert_array_equal(a.train.x, b.train.x)
    with pytest.raises(DataError, match="unknown scaling"):
        load_dataset("adult-2", seed=0, path=str(ADULT_FILE), scaling="global")


def test_a_missing_adult_file_is_a_missing_tool(monkeypatch, tmp_path):
    """Neither $TESTBED_DATA nor the package's copy: the tests that need Adult skip on a developer's
    machine and fail under CI=true, where a skip would hide that they never ran."""
    import functools

    import conftest

    monkeypatch.setattr(cache, "BUNDLED_DIR", tmp_path / "no-bundled-copies")
    monkeypatch.setattr(conftest, "_adult_file", functools.cache(conftest._adult_file.__wrapped__))
    monkeypatch.setattr(conftest, "IN_CI", True)
    with pytest.raises(pytest.fail.Exception, match=r"adult\.data: .*CI=true"):
        conftest.adult_file()
    monkeypatch.setattr(conftest, "IN_CI", False)
    with pytest.raises(pytest.skip.Exception, match=r"adult\.data: not in \$TESTBED_DATA"):
        conftest.adult_file()
