"""Estimates of the DP-PASGD bound constants (testbed.planning.estimate) on small synthetic data."""

import math

import numpy as np
import pytest

from testbed.data.synthetic import make_logistic
from testbed.errors import UserError
from testbed.learning.models import LinearSVM, LogisticRegression
from testbed.planning.estimate import estimate, noise_dimension, per_sample_gradients


@pytest.fixture(scope="module")
def data():
    return make_logistic(num_nodes=4, samples_per_node=120, dim=6, seed=3)


def test_values_positive_and_alpha_is_the_initial_loss(data):
    model = LogisticRegression(data.dim, 2, bias=True)
    params0 = model.init(None)
    est = estimate(model, data.train, params0, batch=16)
    assert est.smoothness > 0 and est.strong_convexity > 0 and est.grad_variance > 0
    assert est.strong_convexity <= est.smoothness
    # α = L(θ⁰) of eq. (4): ln 2 for two classes at θ⁰ = 0, and the mean of node losses in general.
    loss, _ = per_sample_gradients(model, params0, data.train.x, data.train.y)
    node_means = [loss[a:b].mean() for a, b in zip(data.train.offsets[:-1], data.train.offsets[1:])]
    assert est.initial_gap == pytest.approx(np.mean(node_means)) == pytest.approx(math.log(2))


def test_smoothness_is_boehning_bound_and_attained_at_zero(data):
    """At θ⁰ = 0 with two classes the Hessian equals the bound ½·S, so a finite difference matches L."""
    model = LogisticRegression(data.dim, 2, bias=False)
    est = estimate(model, data.train, np.zeros(model.num_params), batch=8)
    rng = np.random.default_rng(0)
    weights = np.repeat(1.0 / (data.train.sizes * data.num_nodes), data.train.sizes)[:, None]

    def grad(theta):
        _, g = per_sample_gradients(model, theta, data.train.x, data.train.y)
        return (g * weights).sum(axis=0)

    # Power iteration on Hessian-vector products by finite differences.
    v = rng.standard_normal(model.num_params)
    for _ in range(100):
        hv = (grad(1e-5 * v / np.linalg.norm(v)) - grad(np.zeros_like(v))) / 1e-5
        v = hv / np.linalg.norm(hv)
    top = float(v @ (grad(1e-5 * v) - grad(np.zeros_like(v))) / 1e-5)
    assert top == pytest.approx(est.smoothness, rel=1e-3)


def test_grad_variance_matches_sampled_batches_and_falls_with_batch(data):
    model = LogisticRegression(data.dim, 2)
    params0 = model.init(None)
    small, large = (estimate(model, data.train, params0, batch=b).grad_variance for b in (4, 32))
    assert large < small
    # Monte Carlo: E||g(θ⁰; batch of 4) − ∇L(θ⁰)||² over nodes.
    _, grads = per_sample_gradients(model, params0, data.train.x, data.train.y)
    parts = np.split(grads, data.train.offsets[1:-1])
    full = np.mean([p.mean(axis=0) for p in parts], axis=0)
    rng = np.random.default_rng(1)
    draws = [np.sum((p[rng.choice(len(p), 4, replace=False)].mean(axis=0) - full) ** 2)
             for _ in range(2000) for p in parts]
    assert np.mean(draws) == pytest.approx(small, rel=0.1)


def test_svm_has_no_smoothness_and_batch_must_fit(data):
    model = LinearSVM(data.dim)
    assert estimate(model, data.train, model.init(None), batch=8).smoothness is None
    with pytest.raises(UserError, match="batch"):
        estimate(model, data.train, model.init(None), batch=10_000)


@pytest.mark.parametrize("n_classes", [2, 3])
def test_noise_dimension_is_the_trace_bound_over_l(data, n_classes):
    """d_eff = tr(H̄)/L. At θ⁰ = 0 the softmax Hessian is S ⊗ (I − 11ᵀ/C)/C, Böhning's H̄ scaled by 2/C,
    so tr/λ_max of an explicit finite-difference Hessian there must equal d_eff (the ratio ignores
    the scale); the factor (I − 11ᵀ/C) contributes C − 1 to the trace and 1 to the top eigenvalue."""
    train = type(data.train)(data.train.x, data.train.y % n_classes, data.train.offsets)
    model = LogisticRegression(data.dim, n_classes, bias=True)
    d_eff = noise_dimension(model, train)
    assert 1.0 <= d_eff <= model.num_params
    assert estimate(model, train, model.init(None), batch=8).noise_dimension == pytest.approx(d_eff)
    weights = np.repeat(1.0 / (train.sizes * data.num_nodes), train.sizes)[:, None]

    def grad(theta):
        _, g = per_sample_gradients(model, theta, train.x, train.y)
        return (g * weights).sum(axis=0)

    h = 1e-6
    hessian = np.stack([(grad(h * e) - grad(-h * e)) / (2 * h) for e in np.eye(model.num_params)])
    top = np.linalg.eigvalsh((hessian + hessian.T) / 2)[-1]
    assert d_eff == pytest.approx(np.trace(hessian) / top, rel=1e-5)


def test_noise_dimension_needs_a_logistic_model(data):
    assert noise_dimension(LinearSVM(data.dim), data.train) is None
