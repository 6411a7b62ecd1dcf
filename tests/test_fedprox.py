"""FedProx (testbed.algorithms.fedprox) on the base's hooks: μ = 0 is FedAvg bit for bit, and μ > 0
takes each local step along ∇F_k(w) + μ(w − w_t), the gradient of Li et al.'s eq. (2), which pulls
the local model toward the global one. (The contract suite, sim = MQTT included, runs it too:
tests/test_algorithm_contract.py.)"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from testbed.algorithms import registry
from testbed.algorithms.batches import uniform_batches
from testbed.algorithms.contract import RoundContext, check_tensors
from testbed.algorithms.fedavg import FedAvg
from testbed.algorithms.fedprox import FedProx
from testbed.assembly.config import load_config_text
from testbed.data.synthetic import make_logistic
from testbed.learning.models import LogisticRegression
from testbed.orchestration.runner import run_experiment
from testbed.reports.results import read_checkpoint, read_metrics

DATA = make_logistic(num_nodes=4, samples_per_node=60, dim=5, seed=0)
MODEL = LogisticRegression(5, 2)
IDS = (0, 1, 2, 3)


def _rounds(alg, rounds: int, seed: int) -> list[dict[str, np.ndarray]]:
    """Each round's uploads and the state after it, from θ⁰ = 0.3 everywhere."""
    state = alg.init_state(np.full(MODEL.num_params, 0.3))
    seen = []
    for r in range(rounds):
        ctx = RoundContext(r, seed, 4, IDS)
        out = alg.node_step(alg.downlink(state, ctx, IDS), DATA.train, IDS, ctx)
        state = alg.server_step(state, out, ctx.closed(out.node_ids)).state
        seen.append({"update": out.tensors["update"], **state})
    return seen


def _both(mu: float, steps: int = 3, lr: float = 0.5):
    common = dict(rounds=3, local_steps=steps, batch=8, lr=lr, num_nodes=4)
    return FedAvg(MODEL, **common), FedProx(MODEL, **common, mu=mu)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), steps=st.integers(1, 4), lr=st.floats(0.01, 2.0))
def test_mu_zero_is_fedavg_bit_for_bit(seed, steps, lr):
    fedavg, fedprox = _both(0.0, steps, lr)
    for a, b in zip(_rounds(fedavg, 3, seed), _rounds(fedprox, 3, seed)):
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def _eq2_steps(start: np.ndarray, mu: float, lr: float, steps: int, round_index: int, seed: int) -> np.ndarray:
    """Li et al.'s local solver written out: w ← w − η (∇F_k(w) + μ (w − w_t)), w_0 = w_t, on the
    batches FedAvg draws."""
    idx = uniform_batches(DATA.train, IDS, round_index, seed, steps, 8)
    w = np.repeat(start[None], 4, axis=0)
    for s in range(steps):
        rows = idx[:, s]
        _, grad = MODEL.loss_and_grad(w, DATA.train.x[rows], DATA.train.y[rows], np.full(rows.shape, 1 / 8))
        w = w - lr * (grad + mu * (w - start))
    return w


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), steps=st.integers(1, 5), mu=st.floats(0.0, 4.0), lr=st.floats(0.05, 0.5))
def test_a_local_step_follows_the_gradient_of_eq_2(seed, steps, mu, lr):
    _, fedprox = _both(mu, steps, lr)
    start = np.linspace(-1, 1, MODEL.num_params)
    ctx = RoundContext(0, seed, 4, IDS)
    out = fedprox.node_step(fedprox.downlink({"model": start, "weights": np.full(4, 0.25)}, ctx, IDS), DATA.train,
                            IDS, ctx)
    np.testing.assert_allclose(out.tensors["update"], _eq2_steps(start, mu, lr, steps, 0, seed), rtol=0, atol=1e-12)


def test_mu_pulls_the_local_model_toward_the_global_one():
    """With η μ = 1 each step after the first restarts from w_t: w_τ − w_t = −η ∇F_k(w_{τ−1}), so a
    local model ends within one step's η G of the global one however many steps it takes; a
    smaller μ pulls less, and FedAvg's (μ = 0) drifts farthest."""
    lr, steps, g = 0.5, 8, MODEL.lipschitz_bound
    start = np.full(MODEL.num_params, 0.3)
    ctx = RoundContext(0, 3, 4, IDS)
    drift = {}
    for mu in (0.0, 0.5, 1 / lr):
        alg = _both(mu, steps, lr)[1]
        out = alg.node_step(alg.downlink({"model": start, "weights": np.full(4, 0.25)}, ctx, IDS), DATA.train, IDS, ctx)
        drift[mu] = np.linalg.norm(out.tensors["update"] - start, axis=1)
    assert (drift[1 / lr] <= lr * g + 1e-12).all()
    assert (drift[1 / lr] < drift[0.5]).all() and (drift[0.5] < drift[0.0]).all()


@pytest.mark.parametrize("mu, bounded", [(0.5, True), (4.0, True), (4.5, False)])
def test_an_honest_update_is_within_the_uplink_bound_and_the_bound_is_dropped_past_eta_mu_2(mu, bounded):
    alg = _both(mu, 4, 0.5)[1]
    spec = alg.uplink_spec()
    assert (spec["update"].max_norm is not None) == bounded
    state = alg.init_state(np.full(MODEL.num_params, 0.3))
    ctx = RoundContext(0, 1, 4, IDS)
    out = alg.node_step(alg.downlink(state, ctx, IDS), DATA.train, IDS, ctx)
    for m in IDS:
        assert check_tensors(spec, out.rows(m), reference=state) is None


def test_fedprox_runs_from_a_config_and_reports_mu(tmp_path):
    text = ('[run]\nname = "prox"\nalgorithm = "{}"\nseed = 2\n[output]\nfigures = false\n'
            '[data]\ndataset = "synthetic"\nnum_nodes = 4\nsamples_per_node = 60\ndim = 5\n'
            '[{}]\nrounds = 3\nlocal_steps = 3\nbatch = 8\nlr = 0.5\n{}')
    runs = {}
    for name, section in (("fedavg", "fedavg"), ("mu0", "fedprox"), ("mu", "fedprox")):
        config = load_config_text(text.format(section, section, "mu = 0.0\n" if name == "mu0" else ""))
        out = tmp_path / name
        summary = run_experiment(config, out).summary
        runs[name] = (read_checkpoint(out).state["model"], read_metrics(out), summary)
    assert np.array_equal(runs["fedavg"][0], runs["mu0"][0])
    assert not np.array_equal(runs["fedavg"][0], runs["mu"][0])
    assert runs["mu"][2]["algorithm_settings"]["mu"] == 0.01 and "fedprox" in registry.names()
