"""Per-node work split over two threads (testbed.util.parallel) gives the values one thread gives:
each node draws from its own stream, whatever thread runs it."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import testbed.util.parallel as parallel
from testbed.algorithms.batches import uniform_batches
from testbed.assembly.config import load_config_text
from testbed.data.synthetic import make_logistic
from testbed.errors import UserError
from testbed.orchestration.runner import run_experiment

SMALL = """
[data]
num_nodes = 9
samples_per_node = 60
dim = 7
[dp_pasgd]
steps = 6
tau = 3
batch = 8
sigma = 1.0
[output]
figures = false
[privacy]
tight_accountant = "none"
"""


def _everything(tmp_path, name: str) -> tuple[np.ndarray, ...]:
    """A data set, a round's batches and a short run's final model."""
    data = make_logistic(num_nodes=9, samples_per_node=60, dim=7, seed=3)
    batches = uniform_batches(data.train, list(range(9)), round_index=2, seed=3, steps=4, batch=8)
    result = run_experiment(load_config_text(SMALL), out_dir=tmp_path / name, quiet=True)
    return data.train.x, data.train.y, batches, np.load(result.run_dir / "final_params.npy")


def test_data_batches_and_a_run_do_not_depend_on_the_threads(tmp_path, monkeypatch):
    monkeypatch.setattr(parallel.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(parallel, "MIN_NUMBERS", 10**18)  # one thread
    single = _everything(tmp_path, "one")
    monkeypatch.setattr(parallel, "MIN_NUMBERS", 0)  # two threads, whatever the size
    for a, b in zip(single, _everything(tmp_path, "two")):
        np.testing.assert_array_equal(a, b)


def test_an_error_in_either_half_reaches_the_caller_after_both_halves_ended(monkeypatch):
    monkeypatch.setattr(parallel.os, "cpu_count", lambda: 2)
    done = []

    def work(lo, hi):
        if lo == 0:
            raise ValueError("first half")
        done.append((lo, hi))

    with pytest.raises(ValueError, match="first half"):
        parallel.split_work(4, work, numbers=10**9)
    assert sorted(done) == [(1, 2), (2, 3), (3, 4)]  # every other part ran to its end


# ----------------------------------------------------------------------- any split, the same bits

def _cuts_from(data):
    """parallel.cuts as Hypothesis draws them: any cut points in [0, count], empty parts too."""
    def cuts(count: int, parts: int) -> list[int]:
        inner = data.draw(st.lists(st.integers(0, count), min_size=parts - 1, max_size=parts - 1), label="cuts")
        return [0, *sorted(inner), count]
    return cuts


def _one_round(num_nodes: int, algorithm: str) -> tuple[np.ndarray, dict]:
    """One node step of ``algorithm`` on ``num_nodes`` nodes (the stacked update, and the evaluation
    of the first node's model), as the threads split it now."""
    from testbed.algorithms.contract import RoundContext
    from testbed.assembly import assemble
    from testbed.orchestration.model_evaluation import evaluate
    from testbed.orchestration.runner import load

    cfg = load_config_text(f"[run]\nalgorithm = \"{algorithm}\"\n[data]\nnum_nodes = {num_nodes}\n"
                           "samples_per_node = 40\ndim = 5\n" + _SECTIONS[algorithm])
    data, model = load(cfg)
    alg = assemble.build_algorithm(cfg, model, data)
    ids = tuple(data.node_ids)
    state = alg.init_state(model.init(None))
    ctx = RoundContext(1, 0, len(ids), ids)
    result = alg.node_step(alg.downlink(state, ctx, ids), data.train, ids, ctx)
    stacked = np.concatenate([np.asarray(v, dtype=np.float64).reshape(len(ids), -1)
                              for _, v in sorted(result.tensors.items())], axis=1)
    return stacked, evaluate(model, stacked[0, :model.num_params], data)


_SECTIONS = {
    "dp_pasgd": "[dp_pasgd]\nsteps = 6\ntau = 3\nbatch = 4\nsigma = 1.0\n",
    "padpfl": "[padpfl]\nrounds = 2\nlocal_steps = 3\nbatch = 4\n",
    "fedavg": "[fedavg]\nrounds = 2\nlocal_steps = 3\nbatch = 4\n",
    "dwfl": '[dwfl]\nrounds = 2\nbatch = 4\nlr = 0.2\nepsilon = 1.0\nfading = "rayleigh"\nc_scale = 0.6\n',
}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(num_nodes=st.integers(2, 9), parts=st.integers(2, 5), algorithm=st.sampled_from(sorted(_SECTIONS)),
       data=st.data())
def test_any_split_of_the_nodes_gives_the_bits_one_thread_gives(num_nodes, parts, algorithm, data):
    """The data, the local steps with their noise and batches (BaseAlgorithm.local_sgd: under
    DP-PASGD's and PADPFL's own split node steps, split itself under FedAvg's), cut anywhere into
    any number of parts, and the evaluation (its fixed halves) on any number of threads, equal one
    thread's."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(parallel, "MIN_NUMBERS", 0)
        patch.setattr(parallel, "threads", lambda: 1)
        single = _one_round(num_nodes, algorithm)
        patch.setattr(parallel, "threads", lambda: parts)
        patch.setattr(parallel, "cuts", _cuts_from(data))
        split = _one_round(num_nodes, algorithm)
    np.testing.assert_array_equal(single[0], split[0])
    assert single[1] == split[1]


def test_run_threads_chooses_the_split_and_a_run_is_the_same_whatever_it_is(tmp_path, monkeypatch):
    monkeypatch.setattr(parallel, "MIN_NUMBERS", 0)
    monkeypatch.setattr(parallel, "_threads", 0)  # what the runs set, undone after
    outputs, real = [], parallel.cuts
    for threads in (1, 3):
        seen = []
        monkeypatch.setattr(parallel, "cuts", lambda count, parts: seen.append(parts) or real(count, parts))
        cfg = load_config_text(SMALL + f"[run]\nthreads = {threads}\n")
        result = run_experiment(cfg, out_dir=tmp_path / str(threads), quiet=True)
        assert set(seen) == (set() if threads == 1 else {parallel.PARTS_PER_THREAD * 3})
        metrics = [line.rsplit(",", 1)[0] for line in (result.run_dir / "metrics.csv").read_text().splitlines()]
        outputs.append((np.load(result.run_dir / "final_params.npy"), metrics))  # wall_s, the last column, aside
    np.testing.assert_array_equal(outputs[0][0], outputs[1][0])
    assert outputs[0][1] == outputs[1][1]


def test_threads_refused_out_of_range():
    with pytest.raises(UserError, match="threads"):
        load_config_text("[run]\nthreads = -1\n")
    with pytest.raises(ValueError, match="threads"):
        parallel.set_threads(-2)


def test_work_cut_in_fixed_parts_is_cut_there_whatever_the_threads(monkeypatch):
    monkeypatch.setattr(parallel, "MIN_NUMBERS", 0)
    for threads in (1, 2, 5):
        monkeypatch.setattr(parallel, "threads", lambda: threads)
        spans = []
        parallel.split_work(7, lambda lo, hi: spans.append((lo, hi)), numbers=1, fixed_parts=2)
        assert sorted(spans) == [(0, 3), (3, 7)]


def test_split_work_within_a_part_runs_in_that_part(monkeypatch):
    """A node step split into parts calls a split helper (local_sgd): it runs in the part's own
    thread, not on the pool the parts occupy (which would wait forever)."""
    monkeypatch.setattr(parallel, "MIN_NUMBERS", 0)
    monkeypatch.setattr(parallel, "threads", lambda: 2)
    out = np.zeros(8)

    def outer(lo, hi):
        def inner(a, b):
            out[lo + a:lo + b] += 1
        parallel.split_work(hi - lo, inner, numbers=10**9)

    parallel.split_work(8, outer, numbers=10**9)
    assert out.tolist() == [1.0] * 8


def test_many_cores_take_parts_worth_a_thread(monkeypatch):
    """Each part carries half of MIN_NUMBERS at least: small work on a many-core machine is not cut
    into parts that cost more to hand over than they save."""
    monkeypatch.setattr(parallel, "threads", lambda: 8)
    for numbers, parts in ((parallel.MIN_NUMBERS - 1, 1), (parallel.MIN_NUMBERS, 2), (2 * parallel.MIN_NUMBERS, 4),
                           (100 * parallel.MIN_NUMBERS, 8 * parallel.PARTS_PER_THREAD)):
        spans = []
        parallel.split_work(100, lambda lo, hi: spans.append((lo, hi)), numbers=numbers)
        assert len(spans) == parts and sorted(spans)[0][0] == 0 and sorted(spans)[-1][1] == 100


def test_testbed_threads_from_the_environment_is_checked(monkeypatch, caplog):
    monkeypatch.setenv("TESTBED_THREADS", "3")
    assert parallel._from_environment() == 3
    for bad in ("two", "-1", "9" * 40):
        monkeypatch.setenv("TESTBED_THREADS", bad)
        assert parallel._from_environment() == 0  # one per core, and one line saying so
    assert sum("TESTBED_THREADS" in r.getMessage() for r in caplog.records) == 3
    assert all("\n" not in r.getMessage() for r in caplog.records)


# ----------------------------------------------------------------------- parts taken, not dealt

def test_a_thread_given_less_of_a_core_takes_fewer_parts(monkeypatch):
    """A pool thread held up in its part (another process on its core) leaves the remaining parts
    to the caller's thread, which does not wait on it for them."""
    import threading
    import time

    monkeypatch.setattr(parallel, "MIN_NUMBERS", 0)
    monkeypatch.setattr(parallel, "threads", lambda: 2)
    ran: list[tuple[int, str]] = []

    def work(lo, hi):
        # The caller's parts take a while, so the pool thread surely starts one; that one stalls.
        time.sleep(0.05 if threading.current_thread() is threading.main_thread() else 0.5)
        ran.append((lo, threading.current_thread().name))

    parallel.split_work(8, work, numbers=10**9)
    assert sorted(lo for lo, _ in ran) == [0, 2, 4, 6]  # 2 parts a thread, each run once
    assert sum(name != threading.main_thread().name for _, name in ran) == 1


@settings(max_examples=50, deadline=None)
@given(count=st.integers(2, 40), threads=st.integers(2, 6), failing=st.sets(st.integers(0, 39)))
def test_every_part_runs_once_and_the_first_failure_in_order_is_raised(count, threads, failing):
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(parallel, "MIN_NUMBERS", 0)
        patch.setattr(parallel, "threads", lambda: threads)
        covered = np.zeros(count, dtype=int)

        def work(lo, hi):
            covered[lo:hi] += 1
            if lo in failing:
                raise ValueError(f"part at {lo}")

        starts = sorted({c for c in parallel.cuts(count, min(count, parallel.PARTS_PER_THREAD * threads))[:-1]})
        failed = [lo for lo in starts if lo in failing]
        if failed:
            with pytest.raises(ValueError, match=f"part at {failed[0]}$"):
                parallel.split_work(count, work, numbers=10**9)
        else:
            parallel.split_work(count, work, numbers=10**9)
    assert covered.tolist() == [1] * count
