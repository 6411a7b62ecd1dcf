"""The J1 floor's step (benchmarks/j1_floor.py), which the Flower comparison's client also runs
(benchmarks/flower_j1.py), is the testbed's DP-PASGD node step: eq. (7a) τ times, with the same
batches and noise, gives the same local model."""

import sys
from pathlib import Path

import numpy as np

from testbed.algorithms.batches import uniform_batches
from testbed.algorithms.contract import RoundContext
from testbed.algorithms.dp_pasgd import DpPasgd
from testbed.data.synthetic import make_logistic
from testbed.learning.models import LogisticRegression
from testbed.streams.rng import Purpose, node_streams

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
from j1_floor import local_steps  # noqa: E402


def test_floor_local_steps_equal_the_dp_pasgd_node_step():
    dim, tau, batch, lr, sigma, seed, round_index = 5, 4, 8, 0.5, 1.0, 3, 2
    data = make_logistic(num_nodes=1, samples_per_node=100, dim=dim, seed=0)
    alg = DpPasgd(LogisticRegression(dim, 2), steps=3 * tau, tau=tau, batch=batch, lr=lr, sigma=sigma,
                  delta=1e-4, train_sizes=data.train.sizes)
    theta = np.random.default_rng(1).standard_normal(alg.model.num_params)
    ctx = RoundContext(round_index=round_index, seed=seed, num_nodes=1, expected=(0,))
    update = alg.node_step({"model": theta[None]}, data.train, (0,), ctx).tensors["update"][0]

    # The node's batches and noise, drawn from the streams the node step draws them from.
    idx = uniform_batches(data.train, (0,), round_index, seed, tau, batch)
    (noise_rng,) = node_streams(seed, (0,), round_index, Purpose.NOISE)
    noise = noise_rng.standard_normal((tau, alg.model.num_params)) * sigma
    local = theta.reshape(1, dim + 1, 2).copy()  # the flat (W row-major, then b) as W stacked on b
    local_steps(local, data.train.x[None], data.train.y[None], idx, noise.reshape(1, tau, dim + 1, 2), lr)

    assert not np.allclose(update, theta)
    np.testing.assert_allclose(local.ravel(), update, rtol=0, atol=1e-12)
