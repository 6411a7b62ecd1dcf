"""dp-pasgd.md §8 checks 1–3: eq. (9), its independence of τ, and the σ calibration (both roots)."""

import math

import pytest

from testbed.privacy import zcdp


def test_check1_epsilon_of_eq9():
    rho = zcdp.dp_pasgd_rho(steps=100, lipschitz=1.0, batch=32, sigma=1.0)
    assert rho == pytest.approx(0.1953125, abs=1e-12)
    eps = zcdp.dp_pasgd_epsilon(steps=100, lipschitz=1.0, batch=32, sigma=1.0, delta=1e-4)
    assert eps == pytest.approx(2.877770, abs=1e-6)
    # the two-term form printed as eq. (9)
    literal = 2 * 100 / (32**2 * 1.0) + (2 / 32) * math.sqrt(2 * 100 * math.log(1e4))
    assert eps == pytest.approx(literal, abs=1e-12)
    assert zcdp.dp_pasgd_rho(1000, 1.0, 1, 10.0) == pytest.approx(20.0, abs=1e-12)
    assert zcdp.dp_pasgd_epsilon(1000, 1.0, 1, 10.0, 1e-5) == pytest.approx(50.348543, abs=1e-6)


def test_check2_monotone_in_steps_and_sigma():
    eps = [zcdp.dp_pasgd_epsilon(k, 1.0, 32, 1.0, 1e-4) for k in (10, 50, 100, 500)]
    assert eps == sorted(eps) and len(set(eps)) == 4
    eps = [zcdp.dp_pasgd_epsilon(100, 1.0, 32, s, 1e-4) for s in (0.5, 1.0, 2.0, 4.0)]
    assert eps == sorted(eps, reverse=True) and len(set(eps)) == 4


SIGMA = {1: 2.753393, 2: 1.410466, 4: 0.736878, 10: 0.327824}
Z = {1: 38.815599, 2: 40.743186, 4: 44.481663, 10: 55.023972}


@pytest.mark.parametrize("eps", [1, 2, 4, 10])
def test_check3_corrected_calibration(eps):
    sigma = zcdp.dp_pasgd_sigma(100, 1.0, 32, eps, 1e-4)
    assert sigma == pytest.approx(SIGMA[eps], abs=1e-6)
    assert zcdp.dp_pasgd_epsilon(100, 1.0, 32, sigma, 1e-4) == pytest.approx(eps, abs=1e-9)
    assert zcdp.z_constant(eps, 1e-4) == pytest.approx(Z[eps], abs=1e-6)
    assert zcdp.epsilon_to_rho(eps, 1e-4) == pytest.approx(eps**2 / Z[eps], rel=1e-6)


def test_check3_paper_literal_eq23_is_flagged_as_not_private():
    sigma = zcdp.dp_pasgd_sigma(100, 1.0, 32, 1.0, 1e-4, calibration="paper_literal")
    assert sigma == pytest.approx(0.0709352, abs=1e-7)
    spent = zcdp.dp_pasgd_epsilon(100, 1.0, 32, sigma, 1e-4)
    assert spent == pytest.approx(76.63, abs=0.01)
    assert spent > 10 * 1.0  # an order of magnitude past the target


def test_rho_epsilon_roundtrip():
    for rho in (1e-4, 0.02, 1.0, 30.0):
        assert zcdp.epsilon_to_rho(zcdp.rho_to_epsilon(rho, 1e-5), 1e-5) == pytest.approx(rho, rel=1e-12)
