"""BaseAlgorithm's local step (testbed.algorithms.base.BaseAlgorithm.local_sgd) and its hooks: a
variant that overrides ``local_gradient`` or ``regulariser_gradient`` changes the step as its formula
says and nothing else. (FedProx's term: tests/test_fedprox.py.)"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from testbed.algorithms.contract import RoundContext
from testbed.algorithms.fedavg import FedAvg
from testbed.data.synthetic import make_logistic
from testbed.learning.models import LogisticRegression

DATA = make_logistic(num_nodes=3, samples_per_node=40, dim=4, seed=1)
MODEL = LogisticRegression(4, 2)
IDS = (0, 1, 2)


class Doubled(FedAvg):
    """∇F_k doubled: the same steps as FedAvg at twice η (2g·η and g·2η are one rounding)."""

    def local_gradient(self, params, x, y, weights, clip_norm=None):
        return 2.0 * super().local_gradient(params, x, y, weights, clip_norm)


class Pulled(FedAvg):
    """A constant regulariser gradient c: each step moves the model by a further −η c."""

    def regulariser_gradient(self, params, start):
        return np.full_like(params, 0.25)


def _update(alg, seed: int) -> np.ndarray:
    ctx = RoundContext(0, seed, 3, IDS)
    start = {"model": np.linspace(-0.5, 0.5, MODEL.num_params), "weights": np.full(3, 1 / 3)}
    return alg.node_step(alg.downlink(start, ctx, IDS), DATA.train, IDS, ctx).tensors["update"]


@settings(max_examples=15, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), steps=st.integers(1, 4), lr=st.floats(0.01, 1.0))
def test_a_local_gradient_hook_is_the_gradient_the_steps_take(seed, steps, lr):
    common = dict(rounds=1, local_steps=steps, batch=8, num_nodes=3)
    assert np.array_equal(_update(Doubled(MODEL, lr=lr, **common), seed), _update(FedAvg(MODEL, lr=2 * lr, **common), seed))


def test_a_regulariser_hook_is_added_to_every_step():
    """One step: w_1 = w_0 − η (∇F(w_0) + c), so the regulariser moves it by exactly −η c."""
    common = dict(rounds=1, local_steps=1, batch=8, lr=0.5, num_nodes=3)
    np.testing.assert_allclose(_update(Pulled(MODEL, **common), 5) - _update(FedAvg(MODEL, **common), 5), -0.125,
                               rtol=0, atol=1e-15)


def test_a_variants_setting_never_replaces_what_fedavg_holds():
    with pytest.raises(ValueError, match="'rounds_planned'"):
        FedAvg(MODEL, rounds=1, local_steps=1, batch=8, lr=0.5, num_nodes=3, rounds_planned=1.0)
    with pytest.raises(ValueError, match="'node_step'"):
        FedAvg(MODEL, rounds=1, local_steps=1, batch=8, lr=0.5, num_nodes=3, node_step=1.0)
