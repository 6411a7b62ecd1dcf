"""The PyTorch backend (testbed.learning.torch_models): the node-folded step equals a loop over nodes, clipped
per-sample gradients equal a loop over samples, the clip bound holds for adversarial inputs."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import require_module

torch = require_module("torch", "channel")

from testbed.assembly import assemble
from testbed.learning.models import build_model  # noqa: E402
from testbed.learning.torch_models import TorchModel, build_network  # noqa: E402

CASES = [("cnn", 64), ("cnn", 784), ("mlp", 20), ("cifar10_cnn", 3072)]
F32 = dict(rtol=1e-4, atol=1e-6)  # float32 arithmetic, summed in different orders


def _batch(model: TorchModel, nodes: int, batch: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    params = np.stack([model.init(np.random.default_rng(seed + 1 + m)) for m in range(nodes)])
    x = rng.random((nodes, batch, model.dim)) / np.sqrt(model.dim)
    y = rng.integers(0, model.n_classes, (nodes, batch))
    w = rng.random((nodes, batch))
    return params, x, y, w / w.sum(axis=1, keepdims=True)


def _module_with(model: TorchModel, flat: np.ndarray) -> "torch.nn.Module":
    """A plain torch module holding the flat parameter vector, ordered as named_parameters."""
    module = build_network(model.network, model.dim, model.n_classes, model.hidden)
    offset = 0
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.from_numpy(flat[offset: offset + p.numel()].astype(np.float32)).view_as(p))
            offset += p.numel()
    assert offset == model.num_params
    return module


def _flat_grad(module) -> np.ndarray:
    return np.concatenate([p.grad.detach().numpy().ravel() for p in module.parameters()]).astype(np.float64)


@pytest.mark.parametrize("network,dim", CASES)
def test_the_step_equals_a_loop_over_nodes_of_plain_modules(network, dim):
    model = TorchModel(network, dim, 10)
    params, x, y, w = _batch(model, nodes=3, batch=5)
    loss, grad = model.loss_and_grad(params, x, y, w)
    for m in range(3):
        module = _module_with(model, params[m])
        per_sample = torch.nn.functional.cross_entropy(module(torch.from_numpy(x[m].astype(np.float32))),
                                                       torch.from_numpy(y[m]), reduction="none")
        total = (per_sample * torch.from_numpy(w[m].astype(np.float32))).sum()
        total.backward()
        np.testing.assert_allclose(loss[m], float(total.detach()), **F32)
        np.testing.assert_allclose(grad[m], _flat_grad(module), **F32)


@pytest.mark.parametrize("network,dim", CASES)
def test_clipped_per_sample_gradients_equal_a_loop_over_samples(network, dim):
    model = TorchModel(network, dim, 10)
    params, x, y, w = _batch(model, nodes=2, batch=6, seed=3)
    params *= 4.0  # large weights: large per-sample gradients, so the clip bites on most samples
    clip = 0.05
    loss, grad = model.loss_and_grad(params, x, y, w, clip_norm=clip)
    clipped_some = False
    for m in range(2):
        module = _module_with(model, params[m])
        want, want_loss = np.zeros(model.num_params), 0.0
        for n in range(6):
            module.zero_grad()
            sample_loss = torch.nn.functional.cross_entropy(module(torch.from_numpy(x[m, n:n + 1].astype(np.float32))),
                                                            torch.from_numpy(y[m, n:n + 1]))
            sample_loss.backward()
            g = _flat_grad(module)
            clipped_some |= np.linalg.norm(g) > clip
            want += w[m, n] * g * min(1.0, clip / np.linalg.norm(g))
            want_loss += w[m, n] * float(sample_loss.detach())
        np.testing.assert_allclose(grad[m], want, **F32)
        np.testing.assert_allclose(loss[m], want_loss, **F32)
    assert clipped_some


def _other_network() -> "torch.nn.Module":
    """Layers the registry's networks do not combine: a strided, dilated convolution followed by no
    pool, overlapping max-pool windows (3, stride 2), a ReLU after a pool, two convolutions in a row."""
    from testbed.learning.torch_models import _pixel_scale

    nn = torch.nn
    return nn.Sequential(_pixel_scale()(8.0), nn.Unflatten(1, (1, 8, 8)), nn.Conv2d(1, 4, 3, stride=2, padding=2, dilation=2),
                         nn.ReLU(), nn.Conv2d(4, 5, 2, padding=1), nn.MaxPool2d(3, stride=2), nn.ReLU(), nn.Flatten(),
                         nn.Linear(20, 6), nn.ReLU(), nn.Linear(6, 3))


@pytest.mark.parametrize("clip", [None, 0.05])
def test_the_node_folded_step_holds_for_other_layer_settings(clip):
    from testbed.learning.torch_models import _NodeFolded

    module = _other_network()
    folded = _NodeFolded(module)
    nodes, batch = 3, 5
    rng = np.random.default_rng(11)
    flat = [torch.nn.utils.parameters_to_vector(_other_network().parameters()).detach() * 3 for _ in range(nodes)]
    x = torch.from_numpy(rng.random((nodes, batch, 64)).astype(np.float32) / 8)
    y = torch.from_numpy(rng.integers(0, 3, (nodes, batch)))
    w = torch.from_numpy(rng.random((nodes, batch)).astype(np.float32))
    loss, grad = folded.loss_and_grad(torch.stack(flat), x, y, w, clip)
    clipped_some = False
    for m in range(nodes):
        torch.nn.utils.vector_to_parameters(flat[m], module.parameters())
        want = torch.zeros_like(flat[m])
        for n in range(batch):  # one sample at a time: its own gradient, clipped
            module.zero_grad()
            sample_loss = torch.nn.functional.cross_entropy(module(x[m, n:n + 1]), y[m, n:n + 1])
            sample_loss.backward()
            g = torch.nn.utils.parameters_to_vector(p.grad for p in module.parameters())
            factor = 1.0 if clip is None else min(1.0, clip / float(g.norm()))
            clipped_some |= factor < 1.0
            want += w[m, n] * factor * g
        np.testing.assert_allclose(grad[m].numpy(), want.numpy(), **F32)
    assert clipped_some == (clip is not None)


def test_a_layer_the_node_folded_step_has_no_rule_for_is_refused():
    from testbed.learning.torch_models import _NodeFolded

    with pytest.raises(ValueError, match="no rule for the layer BatchNorm"):
        _NodeFolded(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4)))


@pytest.mark.parametrize("scale", [1.0, 1e3, 1e8, 1e30])
def test_the_clip_bound_holds_for_adversarial_inputs(scale):
    """Whatever one record is (huge pixels, overflowing activations), its weighted contribution to
    the step is at most w·C: a batch of one record with weight 1 moves the gradient by <= C."""
    model = TorchModel("cnn", 64, 10)
    params, x, y, _ = _batch(model, nodes=4, batch=3, seed=5)
    params *= 50.0
    x = x * scale
    x[1] = -x[1]
    x[2, 0] = np.inf if scale == 1e30 else x[2, 0]
    clip = 0.3
    for n in range(3):
        w = np.zeros((4, 3))
        w[:, n] = 1.0
        _, grad = model.loss_and_grad(params, x, y, w, clip_norm=clip)
        assert np.isfinite(grad).all()
        assert np.linalg.norm(grad, axis=1).max() <= clip


def test_one_node_alone_equals_its_row_of_a_stack_to_float32_rounding():
    model = TorchModel("cnn", 64, 10)
    params, x, y, w = _batch(model, nodes=5, batch=8)
    for clip in (None, 0.5):
        _, together = model.loss_and_grad(params, x, y, w, clip)
        for m in range(5):
            _, alone = model.loss_and_grad(params[[m]], x[[m]], y[[m]], w[[m]], clip)
            np.testing.assert_allclose(alone[0], together[m], **F32)


def test_init_is_pytorchs_default_from_the_given_generator():
    model = TorchModel("cnn", 64, 10)
    a, b = model.init(np.random.default_rng(7)), model.init(np.random.default_rng(7))
    assert np.array_equal(a, b) and a.shape == (model.num_params,)
    conv = a[:72]  # conv 1→8, 3×3: fan-in 9, bound 1/3
    assert np.abs(conv).max() <= 1 / 3 and np.abs(conv).max() > 0.3
    with pytest.raises(ValueError, match="Generator"):
        model.init(None)


def test_loss_and_correct_agrees_with_the_training_loss():
    model = TorchModel("mlp", 20, 3)
    params, x, y, _ = _batch(model, nodes=1, batch=9)
    loss, correct = model.loss_and_correct(params[0], x[0], y[0])
    train_loss, _ = model.loss_and_grad(params, x, y, np.full((1, 9), 1 / 9))
    np.testing.assert_allclose(loss.mean(), train_loss[0], **F32)
    assert correct.dtype == bool and correct.shape == (9,)


def test_build_model_names_the_network_and_refuses_a_non_image():
    assert build_model("torch", 64, 10, network="cnn").num_params == 1370
    with pytest.raises(ValueError, match="cnn network takes images"):
        build_model("torch", 65, 10, network="cnn")
    with pytest.raises(ValueError, match="unknown network"):
        build_model("torch", 64, 10, network="resnet")


def test_an_emulated_hosts_thread_share_is_what_torch_uses():
    """The coordinator gives each emulated host TESTBED_TORCH_THREADS; torch is set to it on import."""
    import os
    import subprocess
    import sys

    code = "from testbed.learning.torch_models import torch_module; print(torch_module().get_num_threads())"
    env = dict(os.environ, TESTBED_TORCH_THREADS="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "1"


def test_importing_the_models_does_not_import_torch():
    import subprocess
    import sys

    code = ("import sys, testbed.learning.models, testbed.assembly.assemble, testbed.algorithms.dp_pasgd; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


CNN_RUN = """
[run]
name = "cnn"
algorithm = "dp_pasgd"
seed = 2
[data]
dataset = "digits"
num_nodes = 4
samples_per_node = 60
[model]
kind = "torch"
network = "cnn"
[dp_pasgd]
steps = 4
tau = 2
batch = 8
lr = 0.2
sigma = 0.5
"""


def test_a_private_torch_run_must_clip_and_its_ledger_records_the_clip_norm():
    from testbed.algorithms import RoundContext, registry
    from testbed.assembly.config import load_config_text
    from testbed.errors import ConfigError
    from testbed.orchestration.runner import load

    with pytest.raises(ConfigError, match="dp_pasgd.clip"):
        registry.get("dp_pasgd").check(load_config_text(CNN_RUN))
    config = load_config_text(CNN_RUN + "clip = true\nlipschitz = 0.7\n")
    data, model = load(config)
    alg = assemble.build_algorithm(config, model, data)
    (privacy,) = [e for e in alg.planned_events(1, RoundContext.everyone(0, 2, 4)) if e.kind == "privacy"]
    assert privacy.clip_norm == 0.7 and privacy.sensitivity == pytest.approx(2 * 0.7 / 8)  # 2C/X
    ctx = RoundContext.everyone(0, 2, 4)
    state = alg.init_state(model.init(np.random.default_rng(0)))
    out = alg.node_step(alg.downlink(state, ctx, ctx.expected), data.train, ctx.expected, ctx)
    assert out.tensors["update"].shape == (4, model.num_params) and np.isfinite(out.tensors["update"]).all()


def test_dwfl_clips_each_samples_gradient_of_a_network_at_gmax():
    from testbed.algorithms.batches import uniform_batches
    from testbed.assembly import assemble
    from testbed.assembly.config import load_config_text
    from testbed.orchestration.runner import load

    text = CNN_RUN.replace('algorithm = "dp_pasgd"', 'algorithm = "dwfl"').split("[dp_pasgd]")[0]
    config = load_config_text(text + '[dwfl]\nrounds = 2\nbatch = 8\nlr = 0.2\ngmax = 0.05\nepsilon = 1.0\n'
                                     'fading = "none"\nc_scale = 0.6\n')
    data, model = load(config)
    alg = assemble.build_algorithm(config, model, data)
    models = np.stack([model.init(np.random.default_rng(m)) for m in range(4)]) * 3.0
    payload = alg.local_step(models.copy(), data.train, [0, 1, 2, 3], 0, 2)
    idx = uniform_batches(data.train, [0, 1, 2, 3], 0, 2, steps=1, batch=8)[:, 0]
    weights = np.full(idx.shape, 1 / 8)
    _, clipped = model.loss_and_grad(models, data.train.x[idx], data.train.y[idx], weights, clip_norm=0.05)
    _, plain = model.loss_and_grad(models, data.train.x[idx], data.train.y[idx], weights)
    np.testing.assert_allclose(payload, models - 0.2 * clipped, rtol=0, atol=1e-12)
    assert np.linalg.norm(plain, axis=1).min() > 0.05  # the batch clip alone would have given another step
