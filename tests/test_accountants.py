"""The ledger's accountants: the paper's zCDP equals eq. (9); the tight ones are tighter."""

from collections import Counter

import pytest

from testbed.ledger.events import GaussianEvent
from testbed.util.registrations import plugin_of
from testbed.ledger.node import NodeLedger
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


# ----------------------------------------------------------------------------- static support table

import itertools
import math

from testbed.ledger.events import ADJACENCIES, SAMPLINGS
from testbed.privacy.accountants import registry, supports, unsupported_reason

#: The built-in accountants (all on dp-accounting) with every sampling and adjacency; a plugin's
#: accountant answers for itself (testbed.orchestration.contract_suite.ACCOUNTANT_CHECKS).
COMBINATIONS = list(itertools.product([n for n in registry.names() if not plugin_of("accountant", n)], SAMPLINGS,
                                      ADJACENCIES))


def _event(sampling, adjacency, sigma=2.0):
    rate = 1.0 if sampling == "none" else 0.05
    return GaussianEvent(0, 0, sigma, 1 / 32, 3, adjacency, sampling, rate)


def _dp_accounting_supports(accountant, sampling, adjacency):
    """dp-accounting's own answer, under the neighbouring relation the event's sensitivity is for."""
    import dp_accounting
    from dp_accounting import dp_event

    if accountant == "zcdp":
        return True  # ours: no amplification claimed, every Gaussian composes
    relation = {"replace_one": dp_accounting.NeighboringRelation.REPLACE_ONE,
                "add_remove": dp_accounting.NeighboringRelation.ADD_OR_REMOVE_ONE}[adjacency]
    cls = dp_accounting.rdp.RdpAccountant if accountant == "rdp" else dp_accounting.pld.PLDAccountant
    gaussian = dp_event.GaussianDpEvent(2.0)
    event = {"none": gaussian, "poisson": dp_event.PoissonSampledDpEvent(0.05, gaussian),
             "without_replacement": dp_event.SampledWithoutReplacementDpEvent(1000, 50, gaussian)}[sampling]
    # The testbed's one restriction beyond dp-accounting's: a Poisson tally is accounted under
    # add/remove, so a replace-one sensitivity is refused (dp-accounting's PLD would take it).
    return cls(neighboring_relation=relation).supports(event) and not (sampling == "poisson" and adjacency == "replace_one")


@pytest.mark.parametrize("accountant,sampling,adjacency", COMBINATIONS)
def test_static_support_table_agrees_with_dp_accounting(accountant, sampling, adjacency):
    assert supports(accountant, _event(sampling, adjacency)) == _dp_accounting_supports(accountant, sampling, adjacency)


@pytest.mark.parametrize("accountant,sampling,adjacency", COMBINATIONS)
def test_supported_means_a_finite_epsilon_unsupported_means_refused(accountant, sampling, adjacency):
    tally = Counter({_event(sampling, adjacency).signature: 3})
    reason = unsupported_reason(accountant, [_event(sampling, adjacency)])
    if reason is None:
        assert 0 < epsilon(accountant, tally, 1e-5) < math.inf
    else:
        assert accountant in reason and "\n" not in reason
        with pytest.raises(ValueError) as err:
            epsilon(accountant, tally, 1e-5)
        assert str(err.value) == reason


def test_mixed_tallies():
    wor, poisson = _event("without_replacement", "replace_one"), _event("poisson", "add_remove")
    none_ar = _event("none", "add_remove")
    assert unsupported_reason("zcdp", [wor, poisson]) is None
    assert "one neighbouring relation" in unsupported_reason("rdp", [wor, poisson])
    assert "pld" in unsupported_reason("pld", [wor, poisson])
    assert unsupported_reason("rdp", [wor, none_ar]) is None
    assert unsupported_reason("pld", [poisson, none_ar]) is None
    assert unsupported_reason("rdp", []) is None
    with pytest.raises(ValueError, match="one neighbouring relation"):
        epsilon("rdp", Counter({wor.signature: 1, poisson.signature: 1}), 1e-5)
    with pytest.raises(ValueError, match="unknown accountant"):
        supports("moments", wor)


def test_static_check_imports_nothing_slow():
    import subprocess
    import sys

    code = ("import sys; from testbed.privacy.accountants import unsupported_reason; "
            "unsupported_reason('pld', [(1.0, 0.1, 'replace_one', 'without_replacement', 0.1)]); "
            "print('dp_accounting' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_the_background_accountant_answers_from_its_guess_and_computes_only_what_it_missed():
    from testbed.privacy.accountants.background import BackgroundEpsilons

    planned, other = _ledger(10, 10, 1.0).privacy, _ledger(7, 10, 1.0).privacy
    job = BackgroundEpsilons("rdp", delta=1e-5)
    job.guess([planned])
    assert job.result([planned, planned]) == [epsilon("rdp", planned, 1e-5)] * 2
    assert job.requests == 1  # the guess held: nothing computed at the end
    missed = BackgroundEpsilons("rdp", delta=1e-5)
    missed.guess([planned])
    assert missed.result([other, planned]) == [epsilon("rdp", other, 1e-5), epsilon("rdp", planned, 1e-5)]
    assert missed.requests == 2


@pytest.mark.parametrize("sigma", [1e6, 1e12, 1e15, 1e300])
@pytest.mark.parametrize("sampling,adjacency", [("without_replacement", "replace_one"), ("poisson", "add_remove")])
def test_a_huge_noise_multiplier_is_epsilon_near_zero_not_an_exception(sigma, sampling, adjacency):
    """dp-accounting's sampled-without-replacement path failed with 'math domain error' from a
    multiplier of ~1e12 (dp_pasgd.sigma = 1e15); the multiplier is clamped where both accountants compute."""
    event = GaussianEvent(0, 0, sigma=sigma, sensitivity=1.0, count=10, sampling=sampling, sampling_rate=0.1,
                          adjacency=adjacency)
    eps = epsilon("rdp", Counter({event.signature: 10}), 1e-5)
    assert 0.0 <= eps < 1e-3
