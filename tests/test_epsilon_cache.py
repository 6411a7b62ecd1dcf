"""The tight accountant's ε cache (testbed.privacy.accountants.epsilon_cache): an entry is the ε its
key names or nothing, whatever the file holds; a run whose plan is cached starts no helper and
reports the ε the accountant computes, to the last digit."""

from __future__ import annotations

import json
import math
import os
from collections import Counter

import pytest
from hypothesis import given, strategies as st

from testbed.assembly.config import load_config_text
from testbed.orchestration.runner import run_experiment
from testbed.privacy.accountants import epsilon, epsilon_cache
from testbed.privacy.accountants.background import BackgroundEpsilons

SIGNATURE = (1.0, 0.0625, "replace_one", "none", 1.0)
TALLY = Counter({SIGNATURE: 10})
OTHER = Counter({SIGNATURE: 11})

SMALL = """
[run]
name = "cached"
seed = {seed}
[data]
dataset = "synthetic"
num_nodes = 4
samples_per_node = 40
dim = 3
[dp_pasgd]
steps = 20
tau = 5
batch = 4
lr = 0.3
sigma = 1.0
[privacy]
delta = 1e-4
tight_accountant = "rdp"
[output]
figures = false
"""


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TESTBED_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv(epsilon_cache.ENV, "on")
    return tmp_path / "cache" / "epsilon"


def _key(tally: Counter, delta: float = 1e-5) -> str:
    return epsilon_cache.entry_key("rdp", delta, tally.items())


@pytest.mark.parametrize("eps", [0.0, 2.504655466852571, math.inf, 1e-300])
def test_an_entry_reads_back_as_written_and_only_under_its_key(cache, eps):
    epsilon_cache.put(_key(TALLY), eps)
    assert epsilon_cache.get(_key(TALLY)) == eps
    assert epsilon_cache.get(_key(OTHER)) is None  # another count
    assert epsilon_cache.get(_key(TALLY, delta=1e-6)) is None  # another δ
    assert epsilon_cache.get(epsilon_cache.entry_key("pld", 1e-5, TALLY.items())) is None  # another accountant


def test_another_library_version_or_accounting_code_is_a_miss(cache, monkeypatch):
    epsilon_cache.put(_key(TALLY), 1.5)
    epsilon_cache.code_fingerprint.cache_clear()
    real = epsilon_cache.importlib.metadata.version
    monkeypatch.setattr(epsilon_cache.importlib.metadata, "version",
                        lambda name: "99.0" if name == "dp-accounting" else real(name))
    try:
        assert epsilon_cache.get(_key(TALLY)) is None
    finally:
        epsilon_cache.code_fingerprint.cache_clear()


RIGHT = object()  # the entry's own key, in a drawn file
VALUES = st.one_of(st.sampled_from(["1.5", "inf", "0.0", "nan", "-1.0", "-inf", "1e999", "x", ""]), st.text(max_size=8),
                   st.floats(), st.none(), st.lists(st.text(max_size=3), max_size=2))


@given(st.one_of(st.binary(max_size=200), st.tuples(st.sampled_from([RIGHT, "other", None, 3]), VALUES)))
def test_whatever_an_entry_file_holds_it_is_that_entry_or_a_miss(tmp_path_factory, drawn):
    folder = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TESTBED_CACHE", str(folder))
        patch.setenv(epsilon_cache.ENV, "on")
        key = _key(TALLY)
        path = epsilon_cache._path(key)
        path.parent.mkdir(parents=True)
        if isinstance(drawn, bytes):
            path.write_bytes(drawn)
        else:
            path.write_text(json.dumps({"key": key if drawn[0] is RIGHT else drawn[0], "value": drawn[1]}))
        got = epsilon_cache.get(key)
        if got is not None:  # only its own entry, a number written as repr, not negative, not NaN
            entry = json.loads(path.read_bytes())
            assert entry["key"] == key and isinstance(entry["value"], str) and got == float(entry["value"]) >= 0


def test_a_tally_json_cannot_write_is_not_cached(cache):
    unwritable = Counter({(1.0, math.inf, "replace_one", "none", 1.0): 3})
    assert epsilon_cache.entry_key("rdp", 1e-5, unwritable.items()) is None
    epsilon_cache.put(None, 1.0)
    assert epsilon_cache.get(None) is None and not cache.exists()


def test_an_entry_of_another_key_in_its_place_is_a_miss(cache):
    epsilon_cache._write(_key(OTHER), "1.5")
    epsilon_cache._path(_key(OTHER)).rename(epsilon_cache._path(_key(TALLY)))
    assert epsilon_cache.get(_key(TALLY)) is None


@pytest.mark.parametrize("planted", ["folder", "fifo", "oversized"])
def test_what_anyone_writing_the_cache_plants_in_an_entrys_place_is_a_miss(cache, planted):
    """A folder, a FIFO (a read would block the run) or a file past the bound (it would fill the
    run's memory) where an entry should be: a miss, and the run computes."""
    epsilon_cache.put(_key(TALLY), 1.5)
    path = epsilon_cache._path(_key(TALLY))
    path.unlink()
    if planted == "folder":
        path.mkdir()
    elif planted == "fifo":
        os.mkfifo(path)
    else:
        entry = json.dumps({"key": _key(TALLY), "value": "1.5", "pad": "x" * epsilon_cache.MAX_ENTRY_BYTES})
        path.write_text(entry)
    assert epsilon_cache.get(_key(TALLY)) is None
    job = BackgroundEpsilons("rdp", delta=1e-5)
    assert job.result([TALLY]) == [epsilon("rdp", TALLY, 1e-5)]


def test_an_unwritable_cache_is_no_error(cache):
    cache.parent.mkdir(parents=True)
    cache.write_text("a file where the folder should be")
    epsilon_cache.put(_key(TALLY), 1.0)
    assert epsilon_cache.get(_key(TALLY)) is None


def test_off_reads_and_writes_nothing(cache, monkeypatch):
    monkeypatch.setenv(epsilon_cache.ENV, "off")
    job = BackgroundEpsilons("rdp", delta=1e-5, settings={"run": {"seed": 1}})
    assert job.result([TALLY]) == [epsilon("rdp", TALLY, 1e-5)]
    assert not cache.exists()


def _count_starts(monkeypatch) -> list:
    """The helpers BackgroundEpsilons starts from now on."""
    started, real = [], BackgroundEpsilons._start
    monkeypatch.setattr(BackgroundEpsilons, "_start", lambda self: started.append(self) or real(self))
    return started


def test_a_job_takes_cached_epsilons_and_starts_no_helper_for_a_cached_plan(cache, monkeypatch):
    started = _count_starts(monkeypatch)
    experiment = {"run": {"seed": 1}}
    first = BackgroundEpsilons("rdp", delta=1e-5, settings=experiment)
    first.guess([TALLY])
    want = first.result([TALLY])
    assert len(started) == 1 and first.requests == 1 and want == [epsilon("rdp", TALLY, 1e-5)]

    again = BackgroundEpsilons("rdp", delta=1e-5, settings={"run": {"seed": 2}})
    again.guess([TALLY])
    assert again.result([TALLY]) == want and len(started) == 1 and again.requests == 0  # a seed shares the hint
    # A tally the plan did not foresee (a budget stop): computed by a helper started then, and cached
    late = BackgroundEpsilons("rdp", delta=1e-5, settings=experiment)
    late.guess([TALLY])
    assert late.result([TALLY, OTHER]) == [want[0], epsilon("rdp", OTHER, 1e-5)] and len(started) == 2
    assert epsilon_cache.get(_key(OTHER)) == epsilon("rdp", OTHER, 1e-5)


def test_a_run_of_a_cached_experiment_reports_the_computed_epsilon_without_a_helper(cache, tmp_path, monkeypatch):
    started = _count_starts(monkeypatch)
    run_experiment(load_config_text(SMALL.format(seed=1)), out_dir=tmp_path / "a", quiet=True)
    assert len(started) == 1
    cached = run_experiment(load_config_text(SMALL.format(seed=2)), out_dir=tmp_path / "b", quiet=True)
    assert len(started) == 1  # another seed, the same plan: no helper
    monkeypatch.setenv(epsilon_cache.ENV, "off")
    computed = run_experiment(load_config_text(SMALL.format(seed=2)), out_dir=tmp_path / "c", quiet=True)
    assert len(started) == 2
    tight = [(n["epsilon_tight"], n["epsilon_tight_by_observer"]) for n in cached.summary["nodes"].values()]
    assert tight == [(n["epsilon_tight"], n["epsilon_tight_by_observer"]) for n in computed.summary["nodes"].values()]
    assert all(eps > 0 for eps, _ in tight)
