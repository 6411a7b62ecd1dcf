"""Scale in sim: vectorised generation, lazy nodes under client sampling, output.eval_nodes,
data.dtype = "float32", and the memory check following the sampled count."""

from __future__ import annotations

import numpy as np
import pytest

from testbed.algorithms import batches
from testbed.algorithms.contract import RoundContext
from testbed.assembly import assemble, resources
from testbed.assembly.assemble import holds_lazily, load_evaluation_data, load_run_data
from testbed.assembly.config import load_config_text
from testbed.assembly.evaluation import evaluated_node_ids
from testbed.data import synthetic
from testbed.data.lazy import LazyFederatedData
from testbed.data.split import SplitWriter, split_sizes
from testbed.data.synthetic import lazy_logistic, make_logistic, true_model
from testbed.errors import ConfigError
from testbed.orchestration.model_evaluation import evaluate
from testbed.orchestration.runner import load, run_experiment
from testbed.orchestration.sim_nodes import SimNodes
from testbed.reports.results import read_metrics
from testbed.streams.rng import Purpose, stream
from testbed.util import memory

SAMPLED = "[client_sampling]\nmethod = \"uniform\"\ncount = 3\n"


def node_rows_by_the_definition(seed, node, n, w, h):
    """Node ``node``'s (x, y) straight from the generative model of testbed.data.synthetic, one node
    and one stream at a time: u, then g, then the label uniforms."""
    dim, k = w.shape
    rng = stream(seed, node, -1, Purpose.DATA)
    u = rng.standard_normal(dim)
    u /= np.linalg.norm(u)
    x = rng.standard_normal((n, dim)) * (1.0 / np.sqrt(dim)) + h * u
    x /= np.sqrt(np.einsum("ij,ij->i", x, x))[:, None]
    logits = x @ w
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    cdf = np.cumsum(p / p.sum(axis=1, keepdims=True), axis=1)
    y = np.minimum((rng.random(n)[:, None] >= cdf).sum(axis=1), k - 1)
    return x, y


@pytest.mark.parametrize("chunk_bytes", [1, 5000, 1 << 20])
@pytest.mark.parametrize("h", [0.0, 0.8])
def test_vectorised_generation_gives_each_nodes_own_rows_whatever_the_chunk(monkeypatch, chunk_bytes, h):
    monkeypatch.setattr(synthetic, "_CHUNK_BYTES", chunk_bytes)  # one node, a few, all per chunk
    seed, n, dim = 4, 23, 7
    data = make_logistic(9, n, dim, n_classes=3, seed=seed, heterogeneity=h)
    w = true_model(dim, 3, seed)
    n_train, n_test, _ = split_sizes(n)
    for m in range(9):
        x, y = node_rows_by_the_definition(seed, m, n, w, h)
        perm = stream(seed, m, -1, Purpose.SPLIT).permutation(n)
        np.testing.assert_array_equal(data.train.node_slice(m)[0], x[perm[:n_train]])
        np.testing.assert_array_equal(data.train.node_slice(m)[1], y[perm[:n_train]])
        np.testing.assert_array_equal(data.validation.node_slice(m)[0], x[perm[n_train + n_test:]])


def test_write_many_is_write_node_by_node():
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((5, 12, 3)), rng.integers(0, 2, (5, 12))
    one, many = (SplitWriter([12] * 5, dim=3, seed=2, node_ids=[8, 1, 6, 3, 0]) for _ in range(2))
    for m in range(5):
        one.write(m, x[m], y[m])
    many.write_many(0, x[:2], y[:2])
    many.write_many(2, x[2:], y[2:])
    a, b = one.finish(2, "t"), many.finish(2, "t")
    for split in ("train", "test", "validation"):
        np.testing.assert_array_equal(getattr(a, split).x, getattr(b, split).x)
        np.testing.assert_array_equal(getattr(a, split).y, getattr(b, split).y)
    with pytest.raises(ValueError, match="expected 12 samples"):
        SplitWriter([12, 11], dim=3, seed=0).write_many(0, x[:2], y[:2])


def test_float32_data_are_the_float64_data_rounded():
    a = make_logistic(6, 40, 5, seed=3)
    b = make_logistic(6, 40, 5, seed=3, dtype="float32")
    assert b.train.x.dtype == np.float32
    np.testing.assert_array_equal(b.train.x, a.train.x.astype(np.float32))
    np.testing.assert_array_equal(b.train.y, a.train.y)


def test_lazy_nodes_are_the_nodes_of_the_whole_federation():
    lazy = lazy_logistic(num_nodes=12, samples_per_node=30, dim=4, n_classes=2, seed=5,
                                       heterogeneity=0.5)
    full = make_logistic(12, 30, 4, seed=5, heterogeneity=0.5)
    for split in ("train", "test", "validation"):
        np.testing.assert_array_equal(getattr(lazy, split).offsets, getattr(full, split).offsets)
    part = lazy.nodes([11, 2])
    np.testing.assert_array_equal(part.train.x, full.select([11, 2]).train.x)
    assert part.node_ids == (11, 2) and (lazy.num_nodes, lazy.dim, lazy.n_classes) == (12, 4, 2)


def test_a_sampled_run_holds_its_nodes_lazily_in_sim_and_over_mqtt(small_config_text):
    for mode in ("sim", "mqtt"):  # over MQTT: the coordinator's rows (tests/test_lazy_rows_mqtt.py)
        config = load_config_text(small_config_text + SAMPLED, [f"run.mode='{mode}'"])
        assert holds_lazily(config) and isinstance(load_run_data(config), LazyFederatedData)
    assert not holds_lazily(load_config_text(small_config_text))


def test_a_lazy_round_releases_what_the_eager_round_releases(small_config_text):
    config = load_config_text(small_config_text + SAMPLED, ["data.num_nodes=9"])
    lazy, model = load(config)
    eager = make_logistic(9, 80, 8, seed=1)
    alg = assemble.build_algorithm(config, model, eager)
    state = alg.init_state(model.init(None))
    out = [SimNodes(alg, data, seed=1, profile="host").round(state, 2, frozenset({4}), sampled=(0, 4, 7))
           for data in (lazy, eager)]
    assert out[0].result.node_ids == out[1].result.node_ids == (0, 7)
    np.testing.assert_array_equal(out[0].result.tensors["update"], out[1].result.tensors["update"])


def test_evaluated_nodes_are_a_fixed_seeded_subset():
    ids = evaluated_node_ids(1_000_000, 50, seed=3)
    assert len(set(ids.tolist())) == 50 and ids.tolist() == sorted(ids.tolist()) and ids.max() < 1_000_000
    np.testing.assert_array_equal(ids, evaluated_node_ids(1_000_000, 50, seed=3))
    assert not np.array_equal(ids, evaluated_node_ids(1_000_000, 50, seed=4))
    assert evaluated_node_ids(10, None, 0) is None and evaluated_node_ids(10, 10, 0) is None


@pytest.mark.parametrize("sampled", [False, True])
def test_a_run_with_eval_nodes_reports_the_metrics_of_those_nodes(small_config_text, tmp_path, sampled):
    text = small_config_text + (SAMPLED if sampled else "")
    config = load_config_text(text, ["data.num_nodes=12", "output.eval_nodes=4"])
    result = run_experiment(config, out_dir=tmp_path / "r", quiet=True)
    params = np.load(tmp_path / "r" / "final_params.npy")
    data = make_logistic(12, 80, 8, seed=1)
    ids = evaluated_node_ids(12, 4, seed=1).tolist()
    _, model = load(config)
    expected = evaluate(model, params, data.select(ids))
    assert result.summary["final"] == pytest.approx(expected, rel=1e-12)
    assert evaluate(model, params, data) != expected  # not every node's
    assert len(read_metrics(tmp_path / "r")) == 4


@pytest.mark.parametrize("sampled", [False, True])
def test_only_the_evaluated_nodes_hold_test_rows(small_config_text, sampled):
    config = load_config_text(small_config_text + (SAMPLED if sampled else ""),
                              ["data.num_nodes=12", "output.eval_nodes=4"])
    held, _ = load(config)
    assert held.test.sizes.tolist() == ([8] * 12 if sampled else [0] * 12)  # lazy: a layout, no rows
    if not sampled:
        np.testing.assert_array_equal(held.train.x, make_logistic(12, 80, 8, seed=1).train.x)
    evaluated = load_evaluation_data(config, held)
    chosen = make_logistic(12, 80, 8, seed=1).select(evaluated_node_ids(12, 4, seed=1).tolist())
    for split in ("train", "test", "validation"):
        np.testing.assert_array_equal(getattr(evaluated, split).x, getattr(chosen, split).x)


def test_batches_drawn_in_blocks_of_nodes_are_each_nodes_own(monkeypatch):
    train = make_logistic(7, 30, 2, seed=0).train
    monkeypatch.setattr(batches, "_KEY_BLOCK_BYTES", 8 * 5 * 24 * 3)  # blocks of 3 nodes
    idx = batches.uniform_batches(train, [3, 9, 4, 0, 1, 2, 8], round_index=2, seed=1, steps=5, batch=6)
    for i, node in enumerate([3, 9, 4, 0, 1, 2, 8]):
        keys = stream(1, node, 2, Purpose.BATCH).random((5, 24))
        mine = np.sort(idx[i] - train.offsets[i], axis=1)
        np.testing.assert_array_equal(mine, np.sort(np.argsort(keys, axis=1)[:, :6], axis=1))


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_dp_pasgd_steps_a_block_of_nodes_at_a_time_with_each_nodes_own_result(small_config_text, monkeypatch, dtype):
    from testbed.algorithms import dp_pasgd

    config = load_config_text(small_config_text, ["data.num_nodes=9", f"data.dtype='{dtype}'", "dp_pasgd.clip=true"])
    data, model = load(config)
    alg = assemble.build_algorithm(config, model, data)
    ctx = RoundContext(1, 1, 9, tuple(range(9)))
    state = {"model": alg.init_state(model.init(None))["model"] + 0.1}
    updates = []
    for block_bytes in (dp_pasgd._BLOCK_BYTES, 1, 3000):  # all nodes, one node, a few per block
        monkeypatch.setattr(dp_pasgd, "_BLOCK_BYTES", block_bytes)
        updates.append(alg.node_step(alg.downlink(state, ctx, ctx.expected), data.train, ctx.expected, ctx)
                       .tensors["update"])
    np.testing.assert_array_equal(updates[0], updates[1])
    np.testing.assert_array_equal(updates[0], updates[2])


def test_float32_and_float64_runs_agree_to_float32_rounding(small_config_text, tmp_path):
    params = {}
    for dtype in ("float64", "float32"):
        config = load_config_text(small_config_text, [f"data.dtype='{dtype}'", "dp_pasgd.steps=40"])
        run_experiment(config, out_dir=tmp_path / dtype, quiet=True)
        params[dtype] = np.load(tmp_path / dtype / "final_params.npy")
    assert params["float64"].dtype == params["float32"].dtype == np.float64  # the server's model
    gap = np.abs(params["float32"] - params["float64"]).max()
    assert 0 < gap < 1e-4 * np.abs(params["float64"]).max(), gap  # float32 steps, not float64 ones


def test_a_float32_node_step_runs_in_float32(small_config_text):
    config = load_config_text(small_config_text, ["data.dtype='float32'"])
    data, model = load(config)
    assert data.train.x.dtype == np.float32
    alg = assemble.build_algorithm(config, model, data)
    ctx = RoundContext(0, 1, 4, (0, 1, 2, 3))
    out = alg.node_step(alg.downlink(alg.init_state(model.init(None)), ctx, ctx.expected), data.train, ctx.expected, ctx)
    update = out.tensors["update"]
    np.testing.assert_array_equal(update, update.astype(np.float32))  # every value a float32


def test_the_memory_check_follows_the_sampled_count(small_config_text, monkeypatch):
    big = ["data.num_nodes=1000000", "data.samples_per_node=500", "data.dim=100"]
    sampled = load_config_text(small_config_text + SAMPLED, big + ["output.eval_nodes=10"])
    parts = resources.estimate_bytes(sampled)
    assert parts["data"] == 3 * 500 * 808 and parts["evaluation"] == 10 * 500 * 808
    half = resources.estimate_bytes(load_config_text(small_config_text + SAMPLED,
                                                     big + ["output.eval_nodes=10", "data.dtype='float32'"]))
    assert half["data"] == 3 * 500 * 408
    everyone = resources.estimate_bytes(load_config_text(small_config_text, big))
    assert everyone["data"] == 1_000_000 * 500 * 808 and everyone["evaluation"] == 0
    monkeypatch.setattr(memory, "available_bytes", lambda: 2**34)
    resources.check_fits(sampled)
    with pytest.raises(ConfigError, match=r"^config error: output.eval_nodes: evaluating 1,000,000 nodes needs"):
        resources.check_fits(load_config_text(small_config_text + SAMPLED, big))
