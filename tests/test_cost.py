"""dp-pasgd.md §8 check 4: the resource cost model, eq. (8)."""

import pytest

from testbed.planning.cost import max_steps, resource_cost


def test_check4_cost_model():
    assert resource_cost(90, 10, 100, 1) == 990 <= 1000
    assert resource_cost(100, 10, 100, 1) == 1100 > 1000
    # DP-SGD (τ = 1) at C_th = 1000: 9 steps fit, 10 do not
    assert resource_cost(9, 1, 100, 1) <= 1000 < resource_cost(10, 1, 100, 1)
    assert int(max_steps(1, 1000, 100, 1)) == 9
    assert max_steps(10, 1000, 100, 1) == pytest.approx(90.909091, abs=1e-6)
    assert max_steps(20, 1000, 100, 1) == pytest.approx(166.666667, abs=1e-6)
    assert max_steps(10, 500, 100, 1) == pytest.approx(45.454545, abs=1e-6)
