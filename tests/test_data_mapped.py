"""Lazy nodes of the file-based sets: the federation written once to the cache, memory-mapped, and a
round's nodes gathered from it (testbed.data.mapped): the eager loader's rows, a run's metrics and
ledger unchanged, the cache keyed by the files' content and never read back silently wrong."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from conftest import adult_file, needs_module
from testbed.assembly import assemble
from testbed.assembly.assemble import holds_lazily, load_data, load_evaluation_data, load_run_data
from testbed.assembly.config import load_config_text
from testbed.data import mapped
from testbed.data.lazy import LazyFederatedData
from testbed.data.vehicle import write_vehicle_mat
from testbed.errors import DataError
from testbed.ledger.files import read_ledger
from testbed.orchestration.runner import run_experiment

SPLITS = ("train", "test", "validation")
RUN = """
[run]
seed = 2
[dp_pasgd]
steps = 10
tau = 5
batch = 4
sigma = 1.0
[client_sampling]
method = "uniform"
count = 3
[output]
figures = false
"""


def vehicle_config(path, *overrides):
    return load_config_text(RUN + f'[data]\ndataset = "vehicle-2"\npath = "{path}"\nnum_nodes = 4\n', list(overrides))


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """The federations' cache directory, in this test's own $TESTBED_CACHE."""
    monkeypatch.setenv("TESTBED_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "federations"


@pytest.fixture
def vehicle(tmp_path):
    path = tmp_path / "vehicle.mat"
    write_vehicle_mat(path, sizes=[40, 55, 61, 30], dim=6, seed=1)
    return path


def assert_same_nodes(a, b):
    for split in SPLITS:
        x, y = getattr(a, split), getattr(b, split)
        np.testing.assert_array_equal(x.offsets, y.offsets)
        assert x.x.dtype == y.x.dtype and x.y.dtype == y.y.dtype
        np.testing.assert_array_equal(x.x, y.x)
        np.testing.assert_array_equal(x.y, y.y)
    assert (a.node_names, a.node_ids, a.n_classes, a.name) == (b.node_names, b.node_ids, b.n_classes, b.name)


@pytest.mark.parametrize("scaling", ["per_node", "public_bound", "pooled"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_lazy_nodes_of_a_file_are_the_eager_loaders_rows(cache, vehicle, scaling, dtype):
    config = vehicle_config(vehicle, f"data.scaling='{scaling}'", f"data.dtype='{dtype}'")
    assert holds_lazily(config)
    lazy = load_run_data(config)
    assert isinstance(lazy, LazyFederatedData) and (lazy.num_nodes, lazy.dim, lazy.n_classes) == (4, 6, 2)
    eager = load_data(config.data, config.run.seed)
    for split in SPLITS:
        np.testing.assert_array_equal(getattr(lazy, split).offsets, getattr(eager, split).offsets)
    assert_same_nodes(lazy.nodes([3, 0, 2]), eager.select([3, 0, 2]))
    assert_same_nodes(load_run_data(config).nodes(range(4)), eager)  # opened again from the cache
    assert len(list(cache.iterdir())) == 1
    with pytest.raises(DataError, match=r"nodes \[4\] are not in 0..3"):
        lazy.nodes([4])


def test_the_rows_are_read_through_memory_maps(cache, vehicle, monkeypatch):
    lazy = load_run_data(vehicle_config(vehicle))
    opened = []
    arrays = mapped.MappedFederation.arrays

    def recorded(self, split):
        opened.append(arrays(self, split))
        return opened[-1]

    monkeypatch.setattr(mapped.MappedFederation, "arrays", recorded)
    part = lazy.nodes([3, 1])
    assert len(opened) == 3 and all(isinstance(a, np.memmap) and a.mode == "r" for pair in opened for a in pair)
    assert type(part.train.x) is np.ndarray  # the gathered rows are the round's own copy, not a view of the map
    directory = next(cache.iterdir())
    assert opened[0][0].filename == directory / "train.x.npy"


def test_a_changed_file_is_a_new_cache_with_its_own_rows(cache, vehicle):
    config = vehicle_config(vehicle)
    before = load_run_data(config).nodes(range(4))
    write_vehicle_mat(vehicle, sizes=[40, 55, 61, 30], dim=6, seed=7)  # same shape, other values
    after = load_run_data(config)
    assert len(list(cache.iterdir())) == 2
    assert_same_nodes(after.nodes(range(4)), load_data(config.data, config.run.seed))
    assert not np.array_equal(after.nodes([0]).train.x, before.select([0]).train.x)
    for k, other in enumerate(("run.seed=3", "data.scaling='pooled'", "data.dtype='float32'")):
        load_run_data(vehicle_config(vehicle, other))
        assert len(list(cache.iterdir())) == 3 + k  # each its own rows
    assert not np.array_equal(load_run_data(vehicle_config(vehicle, "run.seed=3")).nodes([0]).train.x,
                              after.nodes([0]).train.x)


def test_a_cache_another_run_wrote_first_is_kept(cache, vehicle):
    config = vehicle_config(vehicle)
    lazy = load_run_data(config)
    directory = next(cache.iterdir())
    before = (directory / "train.x.npy").stat().st_mtime_ns
    mapped.write(directory, load_data(config.data, config.run.seed))  # the loser of a race
    assert [p.name for p in cache.iterdir()] == [directory.name] and (directory / "train.x.npy").stat().st_mtime_ns == before
    assert_same_nodes(lazy.nodes(range(4)), load_data(config.data, config.run.seed))


@pytest.mark.parametrize("damage", ["truncate", "no_meta", "offsets", "names", "dtype"])
def test_a_broken_cache_is_written_again(cache, vehicle, damage):
    config = vehicle_config(vehicle)
    load_run_data(config)
    directory = next(cache.iterdir())
    if damage == "truncate":
        file = directory / "train.x.npy"
        file.write_bytes(file.read_bytes()[:-100])
    elif damage == "no_meta":
        (directory / "meta.json").unlink()
    elif damage == "offsets":  # the same shape, other boundaries
        offsets = np.load(directory / "test.offsets.npy")
        offsets[1] += 1
        np.save(directory / "test.offsets.npy", offsets)
    elif damage == "names":
        (directory / "meta.json").write_text((directory / "meta.json").read_text().replace("iid-1", "iid-9"))
    else:  # float64 bytes read as int64: the same bytes, other numbers
        x = np.load(directory / "train.x.npy")
        np.save(directory / "train.x.npy", x.view(np.int64))
    assert_same_nodes(load_run_data(config).nodes(range(4)), load_data(config.data, config.run.seed))


def test_corrupt_rows_are_an_error_that_removes_the_cache(cache, vehicle):
    config = vehicle_config(vehicle)
    lazy = load_run_data(config)
    directory = next(cache.iterdir())
    x = np.load(directory / "validation.x.npy", mmap_mode="r+")
    x[lazy.validation.offsets[2], 2] += 1e-9  # one value of node 2, the file's size unchanged
    x.flush()
    del x
    lazy.nodes([1, 3])  # other nodes' rows are still good
    with pytest.raises(DataError, match=r"node 2's validation rows do not match their digest .* run again"):
        lazy.nodes([1, 2])
    assert not directory.exists()
    assert_same_nodes(load_run_data(config).nodes(range(4)), load_data(config.data, config.run.seed))


def test_an_unwritable_cache_is_one_line_naming_it(tmp_path, vehicle, monkeypatch):
    (tmp_path / "file").write_text("")
    monkeypatch.setenv("TESTBED_CACHE", str(tmp_path / "file"))
    with pytest.raises(DataError, match=r"cannot write the lazy nodes' cache .*TESTBED_CACHE"):
        load_run_data(vehicle_config(vehicle))


def lazy_and_eager_runs(text, tmp_path, monkeypatch, *overrides):
    config = load_config_text(text, list(overrides))
    assert holds_lazily(config)
    lazy = run_experiment(config, out_dir=tmp_path / "lazy", quiet=True)
    monkeypatch.setattr(assemble, "holds_lazily", lambda config: False)
    eager = run_experiment(config, out_dir=tmp_path / "eager", quiet=True)
    assert (tmp_path / "cache" / "federations").is_dir()
    return lazy, eager


def assert_same_runs(a, b):
    np.testing.assert_array_equal(np.load(a.run_dir / "final_params.npy"), np.load(b.run_dir / "final_params.npy"))
    strip = lambda rows: [{k: v for k, v in r.items() if k != "wall_s"} for r in rows]
    rows = [strip(csv.DictReader(open(r.run_dir / "metrics.csv"))) for r in (a, b)]
    assert rows[0] == rows[1] and rows[0][-1]["test_accuracy"]
    ledgers = [[e for e in read_ledger(r.run_dir / "ledger.csv") if e.kind != "compute"] for r in (a, b)]
    assert ledgers[0] == ledgers[1] and ledgers[0]
    assert a.summary["final"] == b.summary["final"]


@pytest.mark.parametrize("evaluated", [[], ["output.eval_nodes=10"]])
def test_a_sampled_adult_run_is_the_same_lazily_and_eagerly(tmp_path, cache, monkeypatch, evaluated):
    text = RUN + f'[data]\ndataset = "adult-2"\npath = "{adult_file().parent}"\nnum_nodes = 40\n'
    assert_same_runs(*lazy_and_eager_runs(text, tmp_path, monkeypatch, *evaluated))


@needs_module("sklearn", "digits")  # the digits ship with scikit-learn
def test_a_sampled_digits_run_is_the_same_lazily_and_eagerly(tmp_path, cache, monkeypatch):
    text = RUN + '[data]\ndataset = "digits"\nnum_nodes = 12\nsamples_per_node = 40\nparts = [6, 6]\n' \
                 'part_noise = ["slight", "none"]\npartition = "dirichlet"\n[model]\nkind = "logistic"\n'
    assert_same_runs(*lazy_and_eager_runs(text, tmp_path, monkeypatch))


def test_the_evaluated_nodes_of_a_lazy_file_set_are_gathered_from_it(cache, vehicle):
    config = vehicle_config(vehicle, "output.eval_nodes=2")
    lazy = load_run_data(config)
    eager = load_data(config.data, config.run.seed)
    evaluated = load_evaluation_data(config, lazy)
    assert len(evaluated.node_ids) == 2
    assert_same_nodes(evaluated, load_evaluation_data(config, eager))
