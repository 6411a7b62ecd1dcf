"""The ledger's accountants: the paper's zCDP equals eq. (9); the tight ones are tighter."""

from collections import Counter

import pytest

from testbed.ledger import GaussianEvent, NodeLedger
from testbed.privacy.accountants import epsilon
from testbed.privacy.zcdp import dp_pasgd_epsilon


def _ledger(rounds, tau, sigma, sampling="without_replacement", adjacency="replace_one", sens=2 / 32):
    led = NodeLedger(node=0)
    led.extend(GaussianEvent(0, r, sigma, sens, tau, adjacency, sampling, 32 / 400) for r in range(rounds))
    return led


def test_zcdp_over_the_ledger_is_eq9_whatever_tau():
    # §8 check 2: K = 100 steps as 100 rounds of 1, 20 of 5, 10 of 10 or 5 of 20: one ε.
    expected = dp_pasgd_epsilon(100, 1.0, 32, 1.0, 1e-4)
    for tau in (1, 5, 10, 20):
        assert epsilon("zcdp", _ledger(100 // tau, tau, 1.0).privacy, 1e-4) == pytest.approx(expected, abs=1e-12)


def test_add_remove_events_are_charged_twice_the_sensitivity_by_the_paper_accountant():
    replace = _ledger(10, 10, 1.0, sens=2 / 32).privacy
    add_remove = _ledger(10, 10, 1.0, sampling="poisson", adjacency="add_remove", sens=1 / 32).privacy
    assert epsilon("zcdp", replace, 1e-4) == pytest.approx(epsilon("zcdp", add_remove, 1e-4))


@pytest.mark.parametrize("sampling,adjacency,sens", [
    ("none", "replace_one", 2 / 32),
    ("without_replacement", "replace_one", 2 / 32),
    ("poisson", "add_remove", 1 / 32),
])
def test_tight_accountants_never_exceed_the_paper_bound(sampling, adjacency, sens):
    tally = _ledger(10, 10, 2.0, sampling, adjacency, sens).privacy
    paper = epsilon("zcdp", tally, 1e-4)
    rdp = epsilon("rdp", tally, 1e-4)
    assert 0 < rdp <= paper
    if sampling != "without_replacement":
        assert 0 < epsilon("pld", tally, 1e-4) <= rdp * 1.01
    if sampling != "none":
        # amplification by sampling: far below the unsampled mechanism's ε
        unsampled = epsilon("rdp", _ledger(10, 10, 2.0, "none", adjacency, sens).privacy, 1e-4)
        assert rdp < 0.5 * unsampled


def test_pld_refuses_sampling_without_replacement():
    with pytest.raises(ValueError, match="pld"):
        epsilon("pld", _ledger(1, 1, 1.0).privacy, 1e-4)


def test_empty_tally_spends_nothing_and_zero_noise_is_infinite():
    assert epsilon("zcdp", Counter(), 1e-4) == 0.0
    assert epsilon("zcdp", _ledger(1, 1, 0.0).privacy, 1e-4) == float("inf")
