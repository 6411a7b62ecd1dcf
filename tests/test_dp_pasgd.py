"""DP-PASGD's node and server steps: dp-pasgd.md §8 checks 7 (reductions) and 8 (sync, noise)."""

import numpy as np
import pytest

from testbed.algorithms import RoundContext
from testbed.algorithms.dp_pasgd import DpPasgd
from testbed.data.synthetic import make_logistic
from testbed.learning.models import LogisticRegression, MLP

from algo_steps import node_step, run_round

M, DIM = 4, 6


@pytest.fixture(scope="module")
def data():
    return make_logistic(num_nodes=M, samples_per_node=60, dim=DIM, seed=3)


def _alg(data, tau, sigma, steps=None, **kw):
    return DpPasgd(LogisticRegression(DIM, 2), steps=steps or 4 * tau, tau=tau, batch=8, lr=0.3, delta=1e-4,
                   train_sizes=data.train.sizes, sigma=sigma, **kw)


def _run(alg, data, seed=5):
    state = alg.init_state(alg.model.init(None))
    for r in range(alg.rounds):
        state = run_round(alg, state, data, r, seed)
    return state["model"]


def _step(alg, theta, train, ids, r, seed):
    return node_step(alg, {"model": theta}, train, ids, r, seed, num_nodes=M).tensors["update"]


def test_check7_sigma0_tau1_is_distributed_minibatch_sgd(data):
    """Eq. (5): θ^k = θ^{k-1} − η (1/M) Σ_m g(θ^{k-1}; X_m), on the same mini-batches."""
    alg = _alg(data, tau=1, sigma=0.0)
    theta = alg.model.init(None)
    for r in range(alg.rounds):
        idx, w = alg._draw_batches(data.train, list(range(M)), r, 5)
        stacked = np.repeat(theta[None], M, axis=0)
        _, grads = alg.model.loss_and_grad(stacked, data.train.x[idx[:, 0]], data.train.y[idx[:, 0]], w[:, 0])
        theta = theta - alg.lr * grads.mean(axis=0)
    np.testing.assert_allclose(_run(alg, data), theta, atol=1e-12)


@pytest.mark.parametrize("tau", [2, 5])
def test_check7_sigma0_is_pasgd_node_by_node(data, tau):
    """Eqs. (6a)-(6b), each device stepping on its own (one node at a time, as on a board)."""
    alg = _alg(data, tau=tau, sigma=0.0)
    theta = alg.model.init(None)
    for r in range(alg.rounds):
        locals_ = []
        for m in range(M):
            one = data.train.select([m])
            idx, w = alg._draw_batches(data.train, list(range(M)), r, 5)
            local = theta.copy()
            for step in range(tau):
                rows = idx[m, step] - data.train.offsets[m]
                _, g = alg.model.loss_and_grad(local[None], one.x[rows][None], one.y[rows][None], w[m, step][None])
                local = local - alg.lr * g[0]
            locals_.append(local)
        theta = np.mean(locals_, axis=0)
    np.testing.assert_allclose(_run(alg, data), theta, atol=1e-12)


def test_one_node_at_a_time_equals_all_nodes_stacked(data):
    """The identity the mqtt mode relies on: a node's step alone gives its row of the stacked step."""
    alg = _alg(data, tau=3, sigma=0.7)
    theta = np.linspace(-0.1, 0.1, alg.model.num_params)
    stacked = _step(alg, theta, data.train, list(range(M)), 2, 9)
    for m in range(M):
        alone = _step(alg, theta, data.train.select([m]), [m], 2, 9)
        np.testing.assert_allclose(alone[0], stacked[m], atol=1e-12)


def test_check8_noise_variance_of_the_average(data):
    """Per step, the averaged model carries noise of per-coordinate variance η²(1/M²)Σσ_m²."""
    wide = make_logistic(num_nodes=M, samples_per_node=60, dim=500, seed=3)
    kw = dict(steps=1, tau=1, batch=8, lr=0.3, delta=1e-4, train_sizes=wide.train.sizes)
    noisy = DpPasgd(LogisticRegression(500, 2), sigma=2.0, **kw)
    clean = DpPasgd(LogisticRegression(500, 2), sigma=0.0, **kw)
    theta = np.zeros(noisy.model.num_params)
    diffs, per_node = [], []
    for r in range(20):
        a = _step(noisy, theta, wide.train, list(range(M)), r, 1)
        b = _step(clean, theta, wide.train, list(range(M)), r, 1)
        diffs.append(a.mean(axis=0) - b.mean(axis=0))
        per_node.append(a - b)
    var = np.var(np.concatenate(diffs))
    expected = 0.3**2 * (M * 2.0**2) / M**2
    assert var == pytest.approx(expected, rel=0.05)
    # fresh noise per device: the nodes' noise vectors are uncorrelated
    corr = np.corrcoef(np.concatenate(per_node, axis=1))
    assert np.abs(corr[~np.eye(M, dtype=bool)]).max() < 0.05


def test_check8_rounds_and_noisy_steps_per_device(data):
    alg = _alg(data, tau=5, sigma=1.0, steps=20)
    events = [e for r in range(alg.rounds) for e in alg.planned_events(0, RoundContext.everyone(r, 5, M))]
    assert sum(e.local_steps for e in events if e.kind == "compute") == 20
    assert sum(1 for e in events if e.kind == "communication") == 20 // 5
    assert sum(e.count for e in events if e.kind == "privacy") == 20


def test_same_seed_same_numbers_other_seed_other_numbers(data):
    alg = _alg(data, tau=2, sigma=1.0)
    np.testing.assert_array_equal(_run(alg, data, seed=1), _run(alg, data, seed=1))
    assert not np.allclose(_run(alg, data, seed=1), _run(alg, data, seed=2))


def test_calibrated_sigma_meets_the_target(data):
    alg = _alg(data, tau=2, sigma=None, epsilon=2.0, steps=10, lipschitz=1.0)
    from testbed.privacy.zcdp import dp_pasgd_epsilon

    assert dp_pasgd_epsilon(10, 1.0, 8, alg.sigma, 1e-4) == pytest.approx(2.0, abs=1e-9)


def test_poisson_sampling_runs_and_declares_its_sampling(data):
    alg = _alg(data, tau=2, sigma=1.0, sampling="poisson")
    idx, w = alg._draw_batches(data.train, list(range(M)), 0, 1)
    # expected batch 8 of 48 rows: the weights sum to |batch|/8 per step, about 1 on average
    assert 0.5 < w.sum(axis=2).mean() < 1.5
    event = [e for e in alg.planned_events(0, RoundContext.everyone(0, 1, M)) if e.kind == "privacy"][0]
    assert (event.sampling, event.adjacency) == ("poisson", "add_remove")
    assert np.isfinite(_run(alg, data)).all()


def test_clipped_mlp_step(data):
    alg = DpPasgd(MLP(DIM, 2, hidden=4), steps=4, tau=2, batch=8, lr=0.3, delta=1e-4,
                  train_sizes=data.train.sizes, epsilon=5.0, clip_norm=0.5)
    assert alg.lipschitz == 0.5
    params = alg.model.init(np.random.default_rng(0))
    assert np.isfinite(_step(alg, params, data.train, list(range(M)), 0, 1)).all()


def test_update_norm_bound_holds_for_honest_nodes_and_refuses_a_poisoned_one(data):
    """Over many rounds no honest update leaves the bound; a scaled one does (TensorSpec check)."""
    from testbed.algorithms.contract import check_tensors

    alg = _alg(data, tau=3, sigma=2.0, steps=60)
    spec = alg.uplink_spec()
    assert spec["update"].max_norm == pytest.approx(
        0.3 * 3 * alg.model.lipschitz_bound + 0.3 * 2.0 * np.sqrt(3) * (np.sqrt(alg.model.num_params) + 10))
    theta = np.linspace(-0.2, 0.2, alg.model.num_params)
    worst = 0.0
    for r in range(20):
        updates = _step(alg, theta, data.train, list(range(M)), r, 1)
        for row in updates:
            assert check_tensors(spec, {"update": row}, {"model": theta}) is None
            worst = max(worst, float(np.linalg.norm(row - theta)))
    assert worst < spec["update"].max_norm
    poisoned = theta + 1e6 * np.ones_like(theta)
    assert "above the bound" in check_tensors(spec, {"update": poisoned}, {"model": theta})
    assert _alg(data, tau=3, sigma=2.0, steps=60, bound_updates=False).uplink_spec()["update"].max_norm is None


@pytest.mark.parametrize("rule", ["trimmed_mean", "median"])
def test_robust_aggregation_resists_one_poisoned_node(data, rule):
    from testbed.algorithms.aggregate import Aggregation
    from testbed.algorithms.contract import NodeResult, RoundContext as Ctx

    alg = _alg(data, tau=1, sigma=0.0, aggregation=Aggregation(rule, trim_fraction=0.25))
    updates = np.tile(np.arange(alg.model.num_params, dtype=float), (M, 1))
    updates[2] = 1e6
    out = alg.server_step({"model": np.zeros(alg.model.num_params)}, NodeResult(tuple(range(M)), {"update": updates}),
                          Ctx.everyone(0, 0, M)).state["model"]
    np.testing.assert_allclose(out, np.arange(alg.model.num_params))
