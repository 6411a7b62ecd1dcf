import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from testbed.learning.models import MLP, LinearSVM, LogisticRegression, build_model

MODELS = [
    LogisticRegression(dim=5, n_classes=3),
    LogisticRegression(dim=5, n_classes=2, bias=False),
    LinearSVM(dim=5),
    MLP(dim=5, n_classes=3, hidden=4),
]


def _batch(rng, model, m=3, b=7):
    x = rng.normal(size=(m, b, model.dim))
    x /= np.maximum(1.0, np.linalg.norm(x, axis=-1, keepdims=True))
    y = rng.integers(0, model.n_classes, size=(m, b))
    w = rng.uniform(0.1, 1.0, size=(m, b))
    params = rng.normal(scale=0.3, size=(m, model.num_params))
    return params, x, y, w


@pytest.mark.parametrize("model", MODELS, ids=lambda m: f"{m.name}-{m.num_params}")
def test_gradient_matches_finite_differences(model):
    rng = np.random.default_rng(0)
    params, x, y, w = _batch(rng, model)
    loss, grad = model.loss_and_grad(params, x, y, w)
    eps = 1e-6
    for j in range(model.num_params):
        bump = np.zeros_like(params)
        bump[:, j] = eps
        up, _ = model.loss_and_grad(params + bump, x, y, w)
        down, _ = model.loss_and_grad(params - bump, x, y, w)
        np.testing.assert_allclose(grad[:, j], (up - down) / (2 * eps), atol=1e-6)


@pytest.mark.parametrize("model", MODELS, ids=lambda m: f"{m.name}-{m.num_params}")
def test_clipping_bounds_every_per_sample_gradient(model):
    rng = np.random.default_rng(1)
    params, x, y, _ = _batch(rng, model, m=2, b=6)
    params *= 10  # large weights: the MLP's unclipped gradients exceed the clip norm
    clip = 0.05
    for n in range(x.shape[1]):
        one_hot = np.zeros((2, x.shape[1]))
        one_hot[:, n] = 1.0
        _, g = model.loss_and_grad(params, x, y, one_hot, clip_norm=clip)
        assert np.all(np.linalg.norm(g, axis=1) <= clip + 1e-12)
        _, g_raw = model.loss_and_grad(params, x, y, one_hot)
        raw = np.linalg.norm(g_raw, axis=1)
        np.testing.assert_allclose(np.linalg.norm(g, axis=1), np.minimum(raw, clip), rtol=1e-9)


@pytest.mark.parametrize("model", MODELS[:3], ids=lambda m: f"{m.name}-{m.num_params}")
def test_stated_lipschitz_bound_holds_on_unit_ball(model):
    rng = np.random.default_rng(2)
    params, x, y, _ = _batch(rng, model, m=4, b=50)
    params *= 20
    x /= np.linalg.norm(x, axis=-1, keepdims=True)  # on the sphere: the worst case
    worst = 0.0
    for n in range(x.shape[1]):
        one_hot = np.zeros((4, x.shape[1]))
        one_hot[:, n] = 1.0
        _, g = model.loss_and_grad(params, x, y, one_hot)
        worst = max(worst, np.linalg.norm(g, axis=1).max())
    assert worst <= model.lipschitz_bound + 1e-12
    assert worst > 0.5 * model.lipschitz_bound  # the bound is not vacuous


def test_mlp_states_no_bound():
    assert MLP(3, 2).lipschitz_bound == np.inf


@pytest.mark.parametrize("kind", ["logistic", "svm", "mlp"])
def test_single_model_evaluation_matches_batched_loss(kind):
    model = build_model(kind, 4, 2)
    rng = np.random.default_rng(3)
    params = model.init(rng) + rng.normal(scale=0.5, size=model.num_params)
    x = rng.normal(size=(9, 4))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    y = rng.integers(0, 2, size=9)
    loss, correct = model.loss_and_correct(params, x, y)
    batched, _ = model.loss_and_grad(params[None], x[None], y[None], np.full((1, 9), 1 / 9))
    np.testing.assert_allclose(loss.mean(), batched[0], rtol=1e-12)
    assert correct.dtype == bool


def test_svm_refuses_multiclass():
    with pytest.raises(ValueError, match="binary"):
        LinearSVM(dim=3, n_classes=3)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), classes=st.integers(2, 5), clip=st.sampled_from([None, 0.1, 1.0]))
def test_the_local_steps_gradient_is_loss_and_grads_bit_for_bit(seed, classes, clip):
    """A local step takes LogisticRegression.gradient (no loss): the very gradient loss_and_grad gives."""
    rng = np.random.default_rng(seed)
    m = LogisticRegression(dim=6, n_classes=classes)
    params = rng.standard_normal((3, m.num_params)) * 3
    x = rng.standard_normal((3, 5, 6))
    y = rng.integers(0, classes, (3, 5))
    w = np.full((3, 5), 1 / 5)
    _, grad = m.loss_and_grad(params, x, y, w, clip)
    assert np.array_equal(m.gradient(params, x, y, w, clip), grad)
