"""PADPFL (adaptive-dp.md): the faithfulness checks of §7 (items 1-8 and 10; item 9 is the
experiments' REPORT.md), the straggler rule, spread participation, the ledger's observers and the
config errors. The paper's worked numbers (§2.5) are printed to 5 decimals: they are asserted to
half a unit of their last printed digit; exact fractions and identities to 1e-12."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from testbed.assembly import assemble

from testbed.algorithms.contract import RoundContext
from testbed.algorithms.impact import ImpactSchedule, spread_uploads
from testbed.algorithms.padpfl import Padpfl
from testbed.algorithms.padpfl_section import PadpflSection, schedule_from_section
from testbed.assembly.config import load_config_text
from testbed.data.synthetic import make_logistic
from testbed.errors import ConfigError
from testbed.learning.models import LogisticRegression
from testbed.privacy import padpfl as dp
from testbed.streams.rng import GLOBAL, Purpose, stream

C = math.sqrt(2 * math.log(125))  # δ = 0.01
S1 = dict(impact="given", parts=[20, 20, 20], ratios="0-1-2")
S2 = dict(impact="given", parts=[20, 35, 5], ratios="0-2-1")
S3 = dict(impact="given", parts=[20, 20, 20], ratios="1-3-5")
S4 = dict(impact="given", parts=[20, 20, 20], ratios="0-1-2", schedule=[{"after_round": 10, "ratios": "2-1-0"}])


def weights_of(**keys) -> ImpactSchedule:
    return schedule_from_section(PadpflSection(**keys), 60, seed=0)


def per_part(p, parts):
    ends = np.cumsum(parts)
    return [float(p[e - 1]) for e in ends]


# ----------------------------------------------------------------------------- item 1

def test_the_papers_impact_factors_come_out_exactly_and_sum_to_one():
    assert per_part(weights_of(**S1).at(0), [20, 20, 20]) == pytest.approx([0, 1 / 60, 1 / 30], abs=1e-15)
    assert per_part(weights_of(**S2).at(0), [20, 35, 5]) == pytest.approx([0, 2 / 75, 1 / 75], abs=1e-15)
    assert per_part(weights_of(**S3).at(0), [20, 20, 20]) == pytest.approx([1 / 180, 1 / 60, 1 / 36], abs=1e-15)
    s4 = weights_of(**S4)
    for r in range(30):
        assert abs(s4.at(r).sum() - 1) <= 1e-12 and s4.at(r).min() >= 0
    for case in (S1, S2, S3):
        assert abs(weights_of(**case).at(0).sum() - 1) <= 1e-12
    assert per_part(weights_of().at(0), [20, 20, 20]) == pytest.approx([1 / 60] * 3, abs=1e-15)


# ----------------------------------------------------------------------------- item 7

def test_scenario_4_switches_after_round_10_with_alpha_summing_to_zero_and_the_same_server_noise():
    s4 = weights_of(**S4)
    assert per_part(s4.at(9), [20] * 3) == pytest.approx([0, 1 / 60, 1 / 30], abs=1e-15)  # t = 10
    assert per_part(s4.at(10), [20] * 3) == pytest.approx([1 / 30, 1 / 60, 0], abs=1e-15)  # t = 11
    alpha = s4.alpha(9)
    assert abs(alpha.sum()) <= 1e-12 and np.abs(alpha).max() <= 1
    assert per_part(alpha, [20] * 3) == pytest.approx([1 / 30, 0, -1 / 30], abs=1e-15)
    assert not s4.alpha(3).any()
    args = (1.0, 30, 5, 150, 5.0, 0.01)
    # The same terms in another order: equal but for the last bit on some CPUs (numpy sums a vector
    # in SIMD blocks, so the order of its terms can change the rounding).
    assert dp.server_sigma(s4.at(9), *args) == pytest.approx(dp.server_sigma(s4.at(10), *args), rel=1e-15)
    assert dp.server_sigma(s4.at(9), *args) > 0


# ----------------------------------------------------------------------------- items 2 and 3: the numbers of §2.5

def test_c_and_kappa_as_printed():
    assert dp.gaussian_c(0.01) == pytest.approx(3.10751, abs=5e-6)
    for m, eps, kappa in ((150, 5, 0.0082867), (150, 20, 0.0020717), (50, 5, 0.0248601), (50, 20, 0.0062150)):
        assert dp.client_sigma(1.0, 1, m, eps, 0.01) == pytest.approx(kappa, abs=5e-8)


@pytest.mark.parametrize("case, threshold, largest_r, target, r1, r5", [
    (dict(), 7.7460, 3.873, 0.5, 0.48305, 0.0),
    (S1, 5.0000, 6, 1.0, 0.98601, 0.55277),
    (S2, 6.0208, 4.983, 0.8, 0.78372, 0.0),
    (S3, 5.2915, 5.669, 0.83333, 0.82027, 0.39284),
    (S4, 5.0000, 6, 1.0, 0.98601, 0.55277),
])
def test_the_table_of_section_2_5(case, threshold, largest_r, target, r1, r5):
    p = weights_of(**case).at(0)
    kappa = dp.client_sigma(1.0, 1, 150, 5.0, 0.01)
    assert dp.condition_threshold(p) == pytest.approx(threshold, abs=5e-5)
    assert 30 / dp.condition_threshold(p) == pytest.approx(largest_r, abs=5e-4)
    assert dp.target_sigma(p, 1.0, 30, 150, 5.0, 0.01) / kappa == pytest.approx(target, abs=5e-6)
    assert dp.server_sigma(p, 1.0, 30, 1, 150, 5.0, 0.01) / kappa == pytest.approx(r1, abs=5e-6)
    assert dp.server_sigma(p, 1.0, 30, 5, 150, 5.0, 0.01) / kappa == pytest.approx(r5, abs=5e-6)
    assert dp.client_sigma(1.0, 5, 150, 5.0, 0.01) == pytest.approx(5 * kappa, rel=1e-12)


@pytest.mark.parametrize("n, t, r", [(60, 30, 1), (60, 30, 3), (60, 30, 4), (10, 7, 2), (10, 6, 2), (4, 5, 2)])
def test_equal_weights_reduce_to_nbafl(n, t, r):
    b, m, eps = 1.7, 40, 3.0
    got = dp.server_sigma(np.full(n, 1 / n), b, t, r, m, eps, 0.01)
    nbafl = 2 * b * C * math.sqrt(t**2 - r**2 * n) / (n * m * eps) if t > r * math.sqrt(n) else 0.0
    assert got == pytest.approx(nbafl, rel=1e-12, abs=1e-15)
    assert (got == 0) == (t <= r * math.sqrt(n))


@pytest.mark.parametrize("sensitivity, records", [("paper_eq7", 40), ("clipped_weights", 1)])
def test_client_noise_is_one_value_whatever_p_and_the_nodes_own_size(sensitivity, records):
    """Eq. (8)'s σ_C with the Δf in force: 2B/min m_i under eq. (7) (the paper's), 2B for clipped
    weights (the default: one record can move SGD's clipped weights anywhere in the ball of B)."""
    sizes = [40, 90, 200, 55]
    p = np.array([0.0, 0.1, 0.2, 0.7])
    alg = Padpfl(LogisticRegression(3, 2), schedule=ImpactSchedule([(0, p)]), rounds=30, local_steps=1, batch=4,
                 lr=0.02, mu=0.0, clip=2.0, epsilon=5.0, delta=0.01, min_samples=40, train_sizes=sizes,
                 num_nodes=4, uploads=5, sensitivity=sensitivity)
    ctx = RoundContext.everyone(0, 0, 4)
    sigmas = {e.sigma for n in range(4) for e in alg.planned_events(n, ctx) if e.kind == "privacy"}
    assert sigmas == {2 * 2.0 * 5 * C / (records * 5.0)}  # eq. (8) with min m = 40, or Δf = 2B
    expected = [2 * 2.0 / m for m in sizes] if sensitivity == "paper_eq7" else [2 * 2.0] * 4
    assert [e.sensitivity for n in range(4) for e in alg.planned_events(n, ctx) if e.kind == "privacy"] == \
        pytest.approx(expected, rel=1e-12)  # eq. (7), the node's own m_i; or 2B


def test_the_variance_identity_holds_when_the_condition_does():
    for case in (dict(), S1, S2, S3):
        p = weights_of(**case).at(0)
        for r in (1, 2, 3):
            if not dp.server_noise_needed(p, 30, r):
                continue
            sc = dp.client_sigma(1.0, r, 150, 5.0, 0.01)
            total = dp.server_sigma(p, 1.0, 30, r, 150, 5.0, 0.01) ** 2 + float(p @ p) * sc**2
            assert total == pytest.approx(dp.target_sigma(p, 1.0, 30, 150, 5.0, 0.01) ** 2, rel=1e-12)


# ----------------------------------------------------------------------------- items 4, 5, 6 on the algorithm

def _pair(p, epsilon=5.0, clip=0.5, uploads=2, dim=100, sensitivity="paper_eq7", **kw):
    """A private PADPFL and its noiseless twin on the same data (the same batches), by default
    under the paper's sensitivity (eq. 7), whose numbers items 4-6 check."""
    data = make_logistic(num_nodes=len(p), samples_per_node=50, dim=dim, n_classes=10, seed=3)
    common = dict(schedule=ImpactSchedule([(0, np.asarray(p))]), rounds=30, local_steps=2, batch=8, lr=0.5, mu=0.1,
                  clip=clip, delta=0.01, min_samples=40, train_sizes=data.train.sizes, num_nodes=len(p),
                  uploads=uploads, sensitivity=sensitivity, **kw)
    model = LogisticRegression(dim, 10)
    return data, Padpfl(model, epsilon=epsilon, **common), Padpfl(model, epsilon=None, **common)


def _round(alg, data, r, seed=0, answered=None, state=None):
    n = data.num_nodes
    state = state or alg.init_state(np.full(alg.model.num_params, 0.05))
    ctx = RoundContext.everyone(r, seed, n)
    out = alg.node_step(alg.downlink(state, ctx, ctx.expected), data.train, ctx.expected, ctx)
    closed = ctx.closed(range(n) if answered is None else answered)
    keep = [out.node_ids.index(m) for m in closed.answered]
    from testbed.algorithms.contract import NodeResult

    heard = NodeResult(closed.answered, {"update": out.tensors["update"][keep]})
    return out, alg.server_step(state, heard, closed)


def test_clipping_comes_before_the_noise_fresh_every_round():
    p = [0.1, 0.2, 0.3, 0.4]
    data, private, plain = _pair(p)
    clean, _ = _round(plain, data, 0)
    assert np.linalg.norm(clean.tensors["update"], axis=1).max() <= 0.5 + 1e-12
    assert np.linalg.norm(clean.tensors["update"], axis=1).min() == pytest.approx(0.5)  # the clip was active
    noisy, _ = _round(private, data, 0)
    for i in range(4):
        noise = stream(0, i, 0, Purpose.NOISE).standard_normal(private.model.num_params)
        np.testing.assert_allclose(noisy.tensors["update"][i], clean.tensors["update"][i] + private.sigma_client * noise,
                                   rtol=0, atol=1e-12)
    later, _ = _round(private, data, 1)
    clean1, _ = _round(plain, data, 1)
    assert not np.allclose(later.tensors["update"] - clean1.tensors["update"],
                           noisy.tensors["update"] - clean.tensors["update"])


def test_the_server_adds_its_noise_to_the_weighted_sum_of_the_noisy_uploads():
    p = np.array([0.1, 0.2, 0.3, 0.4])
    data, private, _ = _pair(p)
    out, server = _round(private, data, 2, seed=5)
    sigma_s = private.server_sigma(p)
    assert sigma_s > 0
    expected = p @ out.tensors["update"] + sigma_s * stream(5, GLOBAL, 2, Purpose.NOISE).standard_normal(
        private.model.num_params)
    np.testing.assert_allclose(server.state["model"], expected, rtol=0, atol=1e-12)


def test_zero_weight_clients_do_not_move_the_global_model():
    data, _, plain = _pair([0.0, 0.5, 0.0, 0.5])
    state = plain.init_state(np.zeros(plain.model.num_params))
    ctx = RoundContext.everyone(0, 0, 4)
    out = plain.node_step(plain.downlink(state, ctx, ctx.expected), data.train, ctx.expected, ctx)
    tampered = out.tensors["update"].copy()
    tampered[[0, 2]] = 1e6
    from testbed.algorithms.contract import NodeResult

    a = plain.server_step(state, out, ctx.closed(range(4))).state["model"]
    b = plain.server_step(state, NodeResult(out.node_ids, {"update": tampered}), ctx.closed(range(4))).state["model"]
    np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(a, 0.5 * (out.tensors["update"][1] + out.tensors["update"][3]), rtol=0, atol=1e-15)


def test_monte_carlo_variance_of_the_broadcast_noise_is_sigma_a_squared():
    """Per coordinate, (broadcast − noiseless aggregate) has variance σ_A² (item 4)."""
    p = np.array([0.1, 0.2, 0.3, 0.4])
    data, private, plain = _pair(p, dim=300)
    diffs = []
    for seed in range(8):
        _, noisy = _round(private, data, 0, seed)
        _, clean = _round(plain, data, 0, seed)
        diffs.append(noisy.state["model"] - clean.state["model"])
    sample = np.concatenate(diffs)  # 8 × 3,010 coordinates
    target = dp.target_sigma(p, 0.5, 30, 40, 5.0, 0.01) ** 2
    assert dp.server_noise_needed(p, 30, 2)
    assert sample.var() == pytest.approx(target, rel=4 * math.sqrt(2 / sample.size))


# ----------------------------------------------------------------------------- stragglers, participation, ledger

def test_a_stragglers_weight_is_redistributed_and_the_broadcast_charged_as_it_happened():
    p = np.array([0.1, 0.2, 0.3, 0.4])
    data, private, _ = _pair(p)
    out, server = _round(private, data, 0, answered=(0, 1, 3))
    p_round = np.array([0.1, 0.2, 0.0, 0.4]) / 0.7
    rows = out.tensors["update"][[0, 1, 3]]
    sigma_s = dp.server_sigma(p_round, 0.5, 30, 2, 40, 5.0, 0.01)
    expected = p_round[[0, 1, 3]] @ rows + sigma_s * stream(0, GLOBAL, 0, Purpose.NOISE).standard_normal(rows.shape[1])
    np.testing.assert_allclose(server.state["model"], expected, rtol=0, atol=1e-12)
    sigma_b = math.sqrt(float(p_round @ p_round) * private.sigma_client**2 + sigma_s**2)
    assert [(e.node, e.observer, e.issuer) for e in server.events] == [(n, "public", "server") for n in (0, 1, 3)]
    for e in server.events:
        assert e.sigma == pytest.approx(sigma_b, rel=1e-12)
        assert e.sensitivity == pytest.approx(p_round[e.node] * 2 * 0.5 / 40, rel=1e-12)


def test_nobody_with_weight_answered_keeps_the_model_and_releases_nothing():
    data, private, _ = _pair([0.0, 0.0, 0.5, 0.5])
    state = {"model": np.full(private.model.num_params, 0.3)}
    _, server = _round(private, data, 0, answered=(0, 1), state=state)
    assert server.events == [] and server.state["model"] is state["model"]


def test_spread_participation_uploads_exactly_r_times_and_zeros_otherwise():
    ids = np.arange(60)
    due = np.stack([spread_uploads(ids, 60, r, 30, 5) for r in range(30)])
    assert (due.sum(axis=0) == 5).all() and set(due.sum(axis=1)) == {10}
    data, private, _ = _pair([0.25] * 4, participation="spread", uploads=3)
    r = next(r for r in range(30) if 0 < private.uploads_in(range(4), r).sum() < 4)
    out, server = _round(private, data, r)
    mask = private.uploads_in(range(4), r)
    assert not out.tensors["update"][~mask].any() and out.tensors["update"][mask].any()
    assert sorted(e.node for e in server.events) == np.flatnonzero(mask).tolist()
    privacy = [[e for e in ev if e.kind == "privacy"] for ev in out.events]
    assert [bool(x) for x in privacy] == mask.tolist()


def test_spread_participation_hears_every_part_of_consecutive_ids_in_every_round():
    """Table I's parts are consecutive ids; staggering by the id itself heard one part a round (the
    ratios between parts then did not matter). The interleaved offsets hear all three each round."""
    ids = np.arange(60)
    for r in range(30):
        due = spread_uploads(ids, 60, r, 30, 5)
        assert [int(due[p * 20:(p + 1) * 20].sum()) for p in range(3)] in ([3, 3, 4], [3, 4, 3], [4, 3, 3])


@given(rounds=st.integers(1, 40), uploads=st.integers(1, 40), spread=st.booleans(), epsilon=st.floats(0.1, 50))
def test_a_configured_run_makes_exactly_the_r_uploads_its_noise_pays_for(rounds, uploads, spread, epsilon):
    """Whatever T, R and participation: a [padpfl] section that loads has every client upload in
    exactly R rounds (R = T when every client uploads every round), so eq. (8)'s σ_C, scaled by R,
    spends the configured ε under the paper's linear accounting; one that would not is refused."""
    assume(uploads <= rounds)
    keys = dict(rounds=rounds, uploads=uploads, participation="spread" if spread else "every_round",
                epsilon=epsilon, clip=1.0)
    if not spread and uploads != rounds:
        with pytest.raises(ValueError, match="padpfl.uploads"):
            PadpflSection(**keys)
        return
    a = PadpflSection(**keys)
    n = 7
    alg = Padpfl(LogisticRegression(2, 2), schedule=ImpactSchedule([(0, np.full(n, 1 / n))]), rounds=a.rounds,
                 local_steps=1, batch=1, lr=0.1, mu=0.0, clip=a.clip, epsilon=a.epsilon, delta=0.01, min_samples=5,
                 train_sizes=[5] * n, num_nodes=n, uploads=a.uploads, participation=a.participation)
    made = sum(alg.uploads_in(range(n), r).astype(int) for r in range(rounds))
    assert (made == uploads).all()
    assert alg.describe()["epsilon_paper_uplink"] == pytest.approx(epsilon, rel=1e-12)


def test_clipped_weights_sensitivity_charges_2b():
    data, private, _ = _pair([0.25] * 4, sensitivity="clipped_weights")
    ctx = RoundContext.everyone(0, 0, 4)
    assert {e.sensitivity for e in private.planned_events(1, ctx) if e.kind == "privacy"} == {1.0}


RUN = """
[run]
algorithm = "padpfl"
seed = 1
[data]
num_nodes = 6
samples_per_node = 50
dim = 5
[privacy]
delta = 0.01
tight_accountant = "pld"
[output]
figures = false
[padpfl]
rounds = 4
uploads = 1
participation = "spread"
local_steps = 2
batch = 8
clip = 1.0
epsilon = 5.0
impact = "given"
parts = [2, 2, 2]
ratios = "0-1-2"
"""


def test_a_run_reports_both_observers_the_papers_accounting_and_the_resolved_min_samples(tmp_path):
    from testbed.orchestration.runner import run_experiment

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = run_experiment(load_config_text(RUN), out_dir=tmp_path / "r", quiet=True)
    assert any("epsilon < 1" in str(w.message) for w in caught)  # warned, not refused
    s = result.summary
    assert s["status"] == "completed"
    zero, heavy = s["nodes"]["0"], s["nodes"]["5"]
    assert set(heavy["epsilon_by_observer"]) == {"server", "public"}
    assert set(zero["epsilon_by_observer"]) == {"server"}  # p = 0: its data never reaches the broadcast
    assert heavy["epsilon_tight_by_observer"]["public"] < heavy["epsilon_by_observer"]["public"]
    info = s["algorithm_settings"]
    assert "min_samples = 40" in (tmp_path / "r" / "config.toml").read_text()
    assert info["epsilon_paper_uplink"] == pytest.approx(5.0, rel=1e-12)  # R = 1 upload made, R paid for
    assert info["epsilon_paper_downlink"] == pytest.approx(5.0, rel=1e-12)


# ----------------------------------------------------------------------------- item 10

def test_the_bound_falls_with_epsilon_and_grows_with_max_p():
    args = dict(mu=2.0, rho=1.0, rho_minus=0.5, gamma=0.1, dissimilarity=1.2, beta=1.0, clip=1.0, delta=0.01,
                max_samples=150, num_clients=60)
    k = dp.bound_constants(pmax=1 / 30, **args)
    assert [k.bound(1.0, 30, e) for e in (1, 5, 20)] == sorted([k.bound(1.0, 30, e) for e in (1, 5, 20)], reverse=True)
    assert dp.bound_constants(pmax=1 / 60, **args).bound(1.0, 30, 5) < k.bound(1.0, 30, 5)
    mu_bar = 1.5
    lam2 = -1 / 2 + (1.2 / 2) * (0.1 + 1.1 / mu_bar) + 1.2**2 * 1.1**2 / (2 * mu_bar**2)
    assert (k.lambda2, k.lambda1, k.lambda0) == pytest.approx((lam2, 1 + 1.2 * 1.1 / mu_bar, 0.5), rel=1e-12)
    assert k.k0 == pytest.approx(4 * 0.5 * C**2 / 30**2 / 150**2, rel=1e-12)
    assert k.k1 == pytest.approx(2 * k.lambda1 * C / 30 / 150 * math.sqrt(120 / math.pi), rel=1e-12)
    adaptive = dp.bound_constants(pmax=1 / 30, max_local_loss=2.0, **args)
    assert adaptive.k2 == pytest.approx(k.k2 + 1.0, rel=1e-12)
    with pytest.raises(ValueError):
        dp.bound_constants(pmax=0.1, **{**args, "rho_minus": 3.0})


# ----------------------------------------------------------------------------- config errors

@pytest.mark.parametrize("extra, key", [
    ('impact = "given"\nratios = "0-1-2"\n', "padpfl.parts"),
    ('impact = "given"\nparts = [2, 2, 1]\nratios = "0-1-2"\n', "padpfl.parts"),
    ('impact = "given"\nweights = [0.5, 0.5, 0.5, 0, 0, 0]\n', "padpfl.weights"),
    ('impact = "given"\nparts = [2, 2, 2]\nratios = "0-x-2"\n', "padpfl.ratios"),
    ('uploads = 9\nrounds = 4\n', "padpfl.uploads"),
    ('uploads = 2\nrounds = 4\n', "padpfl.uploads"),  # every round: 4 uploads, eq. (8) pays for 2
    ('uploads = 3\nrounds = 4\nparticipation = "every_round"\n', "padpfl.uploads"),
    ('epsilon = 1.0\n', "padpfl.clip"),
    ('impact = "given"\nparts = [2, 2, 2]\nratios = "1-1-1"\nschedule = [{after_round = 30, ratios = "0-1-1"}]\n',
     "padpfl.schedule"),
])
def test_config_errors_name_the_key(extra, key):
    text = '[run]\nalgorithm = "padpfl"\n[data]\nnum_nodes = 6\n[padpfl]\n' + extra
    with pytest.raises(ConfigError) as info:
        load_config_text(text)
    assert info.value.key == key and "\n" not in str(info.value)


def test_a_min_samples_above_the_smallest_node_is_refused(tmp_path):
    from testbed.orchestration.runner import run_experiment

    config = load_config_text(RUN.replace("uploads = 1", "uploads = 1\nmin_samples = 41"))
    with pytest.raises(ConfigError, match="under-noise") as info:
        run_experiment(config, out_dir=tmp_path / "r", quiet=True)
    assert info.value.key == "padpfl.min_samples"


# ----------------------------------------------------------------------------- `testbed privacy padpfl`

def test_privacy_cli_with_parts_gives_the_table_numbers(capsys):
    import json

    from testbed.cli import main

    args = ["privacy", "padpfl", "--parts", "20:0,20:1,20:2", "--min-samples", "150", "--clip", "1", "--rounds", "30",
            "--uploads", "5", "--epsilon", "5", "--delta", "0.01"]
    assert main(args + ["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    kappa = 2 * C / (150 * 5)
    assert out["sigma_client"] == pytest.approx(5 * kappa, rel=1e-12)
    assert out["sigma_server"] / kappa == pytest.approx(0.55277, abs=5e-6)
    assert out["sigma_total"] == pytest.approx(kappa, rel=1e-12)  # σ_A = κ T max p = κ
    assert out["c"] == pytest.approx(3.10751, abs=5e-6) and out["condition"] is True
    assert main(args) == 0
    assert "WARNING" in capsys.readouterr().out  # ε = 5 >= 1: warned, not refused


def test_privacy_cli_equal_weights_zero_branch_and_bad_input(capsys):
    import json

    from testbed.cli import main

    common = ["--min-samples", "150", "--clip", "1", "--rounds", "30", "--epsilon", "0.5", "--delta", "0.01", "--json"]
    assert main(["privacy", "padpfl", "--weights", ",".join(["0.1"] * 10), "--uploads", "10"] + common) == 0
    out = json.loads(capsys.readouterr().out)
    assert (out["condition"], out["sigma_server"]) == (False, 0.0)  # T = 30 <= R sqrt(N) = 31.6
    assert main(["privacy", "padpfl", "--weights", "0.5,0.4", "--uploads", "1"] + common) == 2
    assert "sum to 0.9" in capsys.readouterr().err


# ----------------------------------------------------------------------------- item 8: the scenario files

@pytest.mark.parametrize("name, parts, ratios", [("s1", [20, 20, 20], "0-1-2"), ("s2", [20, 35, 5], "0-2-1"),
                                                 ("s3", [20, 20, 20], "1-3-5"), ("s4", [20, 20, 20], "0-1-2")])
def test_the_scenario_files_hold_the_papers_constants(name, parts, ratios):
    from pathlib import Path

    from testbed.assembly.config import load_config

    c = load_config(Path(__file__).parent.parent / "experiments" / "padpfl" / f"{name}.toml")
    assert (c.data.num_nodes, c.padpfl.rounds, c.privacy.delta, c.padpfl.epsilon) == (60, 30, 0.01, 20.0)
    assert (c.model.kind, c.model.activation, c.data.parts, c.padpfl.parts, c.padpfl.ratios) == \
        ("mlp", "relu", parts, parts, ratios)
    assert c.data.part_samples == ([8, 20, 45] if name == "s3" else None)  # 50/120/271 scaled down by 6


# ----------------------------------------------------------------------------- automatic impact factors (beyond the paper)

def _auto(impact, sizes=(10, 30, 60), epsilon=5.0, **kw):
    """A PADPFL with an automatic rule on 3 logistic nodes of the given training sizes."""
    from testbed.data.federated import Split

    rng = np.random.default_rng(0)
    n = sum(sizes)
    x = rng.normal(size=(n, 4))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    train = Split(x=x, y=rng.integers(0, 2, n), offsets=np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64))
    alg = Padpfl(LogisticRegression(4, 2), schedule=ImpactSchedule([(0, np.full(3, 1 / 3))]), rounds=30,
                 local_steps=1, batch=4, lr=0.5, mu=0.0, clip=1.0, epsilon=epsilon, delta=0.01, min_samples=10,
                 train_sizes=list(sizes), num_nodes=3, uploads=5, impact=impact, **kw)
    return alg, train


def _step(alg, train, state, r, answered=(0, 1, 2), seed=0):
    from testbed.algorithms.contract import NodeResult

    ctx = RoundContext.everyone(r, seed, 3)
    out = alg.node_step(alg.downlink(state, ctx, ctx.expected), train, ctx.expected, ctx)
    keep = [out.node_ids.index(m) for m in answered]
    heard = NodeResult(tuple(answered), {k: v[keep] for k, v in out.tensors.items()})
    return out, heard, ctx.closed(answered), alg.server_step(state, heard, ctx.closed(answered))


def test_data_size_rule_takes_the_sizes_uploaded_once_in_the_setup_and_keeps_them_private():
    from testbed.algorithms.contract import SETUP_ROUND

    alg, train = _auto("data_size")
    assert alg.has_setup and not _auto("reliability")[0].has_setup and not Padpfl.has_setup
    state = alg.init_state(np.zeros(alg.model.num_params))
    ctx = RoundContext(SETUP_ROUND, 0, 3, (0, 1, 2))
    up = alg.setup_step(train, [0, 1, 2], ctx)
    assert [(e.kind, e.round, e.bytes_up) for ev in up.events for e in ev] == [("communication", -1, 8)] * 3
    state = alg.server_setup(state, up, ctx.closed([0, 1, 2])).state
    assert state["sizes"].tolist() == [10, 30, 60] and set(alg.downlink_spec()) == {"model"}
    r0 = RoundContext.everyone(0, 0, 3)
    assert alg.round_weights(r0.closed([0, 1, 2]), state).tolist() == pytest.approx([0.1, 0.3, 0.6], abs=1e-15)
    assert alg.round_weights(r0.closed([0, 2]), state).tolist() == pytest.approx([1 / 7, 0, 6 / 7], abs=1e-15)
    # a node silent in the setup gets the mean of the others' sizes, not zero
    silent = alg.server_setup(alg.init_state(np.zeros(alg.model.num_params)),
                              type(up)((0, 2), {"samples": up.tensors["samples"][[0, 2]]}), ctx.closed([0, 2])).state
    assert silent["sizes"].tolist() == [10, 35, 60]
    # σ_S from the p used: the broadcast's noise is that of p = (0.1, 0.3, 0.6)
    _, heard, closed, server = _step(alg, train, state, 0)
    p = np.array([0.1, 0.3, 0.6])
    expected = p @ heard.tensors["update"] + alg.server_sigma(p) * stream(0, GLOBAL, 0, Purpose.NOISE).standard_normal(
        alg.model.num_params)
    np.testing.assert_allclose(server.state["model"], expected, rtol=0, atol=1e-12)
    assert server.state["sizes"].tolist() == [10, 30, 60]


def test_reliability_rule_is_the_smoothed_share_of_rounds_answered_so_far():
    alg, train = _auto("reliability", epsilon=None)
    state = alg.init_state(np.zeros(alg.model.num_params))
    r0 = RoundContext.everyone(0, 0, 3).closed([0, 1, 2])
    assert alg.round_weights(r0, state).tolist() == pytest.approx([1 / 3] * 3, abs=1e-15)  # no history: not zero
    state = _step(alg, train, state, 0)[3].state  # everyone answers
    state = _step(alg, train, state, 1, answered=(0, 1))[3].state  # node 2 straggles
    assert state["answered"].tolist() == [2, 2, 1] and state["due"].tolist() == [2, 2, 2]
    # shares (a+1)/(d+2) = 3/4, 3/4, 2/4 → p = 3/8, 3/8, 2/8
    r2 = RoundContext.everyone(2, 0, 3).closed([0, 1, 2])
    assert alg.round_weights(r2, state).tolist() == pytest.approx([3 / 8, 3 / 8, 1 / 4], abs=1e-15)
    assert alg.round_weights(RoundContext.everyone(2, 0, 3).closed([1, 2]), state).tolist() == \
        pytest.approx([0, 3 / 5, 2 / 5], abs=1e-15)


def test_quality_score_is_clipped_noised_charged_and_turned_into_a_softmax():
    alg, train = _auto("quality_score", score_sigma=0.05, score_temperature=0.1)
    assert alg.uplink_spec()["score"].shape == (1,)
    state = alg.init_state(np.full(alg.model.num_params, 0.2))
    out, heard, closed, server = _step(alg, train, state, 3, seed=7)
    for i, m in enumerate((10, 30, 60)):
        x, y = train.node_slice(i)
        acc = float(alg.model.loss_and_correct(state["model"], x, y)[1].mean())
        z = stream(7, i, 3, Purpose.SCORE).standard_normal()
        assert out.tensors["score"][i, 0] == pytest.approx(acc + 0.05 * z, abs=1e-15)
        charged = [e for e in out.events[i] if e.kind == "privacy" and e.sigma == 0.05]
        assert [(e.observer, e.sensitivity) for e in charged] == [("server", pytest.approx(1 / m, rel=1e-15))]
        assert out.events[i] == alg.planned_events(i, RoundContext.everyone(3, 7, 3))
    s = out.tensors["score"][:, 0]
    z = np.exp(s / 0.1)
    np.testing.assert_allclose(alg.round_weights(closed, state, heard), z / z.sum(), rtol=1e-12, atol=0)
    # hand-computed: scores 0.5, 0.7, 0.9 at τ = 0.1 → p ∝ e^-4, e^-2, 1
    from testbed.algorithms.contract import NodeResult

    fake = NodeResult((0, 1, 2), {"score": np.array([[0.5], [0.7], [0.9]])})
    q = np.array([math.exp(-4), math.exp(-2), 1.0])
    np.testing.assert_allclose(alg.round_weights(closed, state, fake), q / q.sum(), rtol=1e-12, atol=0)
    assert alg.round_weights(closed, state, fake).sum() == pytest.approx(1, abs=1e-12)
    # a clipped score: an accuracy of 1 is reported as 1 + noise, never more than the spec's bound
    assert alg.uplink_spec()["score"].problem(np.array([1.0 + 0.05 * 3])) is None
    assert alg.uplink_spec()["score"].problem(np.array([2.0])) is not None


def test_quality_score_needs_its_noise_and_only_with_that_rule():
    base = '[run]\nalgorithm = "padpfl"\n[data]\nnum_nodes = 6\n[padpfl]\n'
    for extra in ('impact = "quality_score"\n', 'score_sigma = 0.1\n'):
        with pytest.raises(ConfigError) as info:
            load_config_text(base + extra)
        assert info.value.key == "padpfl.score_sigma"
    assert load_config_text(base + 'impact = "quality_score"\nscore_sigma = 0.1\n').padpfl.score_sigma == 0.1


@pytest.mark.slow
@pytest.mark.parametrize("impact", ["data_size", "reliability", "quality_score", "link_quality"])
def test_sim_equals_mqtt_for_the_automatic_rules(impact, tmp_path):
    """The contract suite's sim = MQTT check (tests/test_algorithm_contract.py) with Bernoulli
    stragglers, for each automatic rule: same final state (model, sizes, counts), same ledger."""
    from test_algorithm_contract import _config, _ledger_without_seconds

    from testbed.assembly.config import replace
    from testbed.orchestration.runner import run_experiment
    from testbed.reports.results import read_checkpoint

    keys = {"impact": impact, "weights": None} | ({"score_sigma": 0.05} if impact == "quality_score" else {})
    config = _config("padpfl", padpfl=keys, stragglers={"model": "bernoulli", "p": 0.3})
    sim = run_experiment(config, out_dir=tmp_path / "sim", quiet=True)
    mqtt = run_experiment(replace(config, run={"mode": "mqtt"}, mqtt={"hosts": 2}), out_dir=tmp_path / "mqtt",
                          quiet=True)
    assert sim.summary["status"] == mqtt.summary["status"] == "completed"
    a, b = read_checkpoint(tmp_path / "sim").state, read_checkpoint(tmp_path / "mqtt").state
    kept = {"data_size": {"sizes"}, "reliability": {"answered", "due"}, "quality_score": set(),
            "link_quality": set()}[impact]
    assert set(a) == set(b) == {"model"} | kept
    for key in a:
        np.testing.assert_allclose(b[key], a[key], rtol=0, atol=1e-9)
    assert _ledger_without_seconds(tmp_path / "sim") == _ledger_without_seconds(tmp_path / "mqtt")


def test_link_quality_weights_are_the_shannon_rates_of_the_uplinks():
    from testbed.algorithms.dwfl_channel import Radio, large_scale_amplitude
    from testbed.algorithms.impact import link_quality_weights

    p = link_quality_weights(40, 3, pathloss="free_space", area_m=500.0, carrier_hz=2.4e9, power_dbm=10.0,
                             noise_dbm=-80.0)
    radio = Radio(num_nodes=40, power_w=0.01, noise_power_w=1e-11, pathloss="free_space", area_m=500.0)
    beta2 = large_scale_amplitude(radio, 3) ** 2
    rate = np.log2(1.0 + 0.01 * beta2 / 1e-11)
    np.testing.assert_allclose(p, rate / rate.sum(), rtol=1e-12)
    assert abs(p.sum() - 1) < 1e-12 and p.max() > 1.2 * p.min()  # a nearer client weighs more
    assert (np.argsort(p) == np.argsort(beta2)).all()


def test_a_link_quality_run_aggregates_with_the_link_weights(tmp_path):
    from test_algorithm_contract import _config

    from testbed.algorithms.impact import link_quality_weights
    from testbed.orchestration.runner import load, run_experiment

    config = _config("padpfl", padpfl={"impact": "link_quality", "weights": None, "link_pathloss": "free_space"})
    result = run_experiment(config, out_dir=tmp_path / "r", quiet=True)
    assert result.summary["status"] == "completed"
    algorithm = assemble.build_algorithm(config, *reversed(load(config)))
    expected = link_quality_weights(config.data.num_nodes, config.run.seed, pathloss="free_space", area_m=200.0,
                                    carrier_hz=3.5e9, power_dbm=20.0, noise_dbm=-90.0)
    np.testing.assert_array_equal(algorithm.impact_factors(RoundContext.everyone(0, 0, config.data.num_nodes)),
                                  expected)


def test_link_keys_need_the_link_quality_rule():
    with pytest.raises(ConfigError) as info:
        load_config_text('[run]\nalgorithm = "padpfl"\n[data]\nnum_nodes = 6\n[padpfl]\nlink_area_m = 50.0\n')
    assert info.value.key == "padpfl.link_area_m"


def test_the_tight_accountant_guesses_uploads_due_in_some_rounds_only(tmp_path, monkeypatch):
    """Uploads spread over the rounds (1 of 4 per node here): the guess sums each round's own plan,
    so the run ends with the tallies the tight accountant computed while it ran (one request)."""
    from testbed.orchestration.runner import run_experiment
    from testbed.privacy.accountants import background

    requests, result_of = [], background.BackgroundEpsilons.result

    def recorded(job, tallies):
        out = result_of(job, tallies)
        requests.append(job.requests)
        return out

    monkeypatch.setattr(background.BackgroundEpsilons, "result", recorded)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = run_experiment(load_config_text(RUN), out_dir=tmp_path / "r", quiet=True)
    assert requests == [1]
    assert all(node["epsilon_tight"] > 0 for node in result.summary["nodes"].values())


# ----------------------------------------------------------------------------- learns.toml (issue 29)

def test_learns_toml_learns_at_the_papers_epsilon_within_its_budget(tmp_path):
    """experiments/padpfl/learns.toml, one seed as committed: the private model's test accuracy is
    far above the majority share of its test rows, and the ledger spends no more than ε = 5."""
    pytest.importorskip("kymatio")
    pytest.importorskip("mlxtend")
    from pathlib import Path

    from testbed.assembly.assemble import load_run_data
    from testbed.assembly.config import load_config
    from testbed.orchestration.runner import run_experiment

    config = load_config(Path(__file__).resolve().parents[1] / "experiments" / "padpfl" / "learns.toml")
    assert config.padpfl.epsilon == 5.0  # the paper's stronger level
    y = np.asarray(load_run_data(config).test.y, dtype=np.int64)
    majority = np.bincount(y).max() / len(y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = run_experiment(config, out_dir=tmp_path / "r", quiet=True)
    assert result.summary["final"]["test_accuracy"] > majority + 0.5
    assert max(n["epsilon"] for n in result.summary["nodes"].values()) <= config.padpfl.epsilon


def test_a_3gpp_link_quality_beyond_what_memory_holds_is_one_config_error():
    """Sionna's TR 38.901 generator correlates every pair of senders (memory ∝ N²): more than
    channel.pathloss.MAX_3GPP_SENDERS clients is refused before anything is allocated (a fuzzed
    config with 63,428 clients once asked for 64 GB)."""
    from channel.pathloss import MAX_3GPP_SENDERS

    text = (f'[run]\nalgorithm = "padpfl"\n[data]\nnum_nodes = {MAX_3GPP_SENDERS + 1}\n'
            '[padpfl]\nimpact = "link_quality"\nlink_pathloss = "umi"\n')
    with pytest.raises(ConfigError) as info:
        config = load_config_text(text)
        assemble.build_algorithm(config, *reversed(load(config)))
    assert info.value.key == "padpfl.link_pathloss" and "at most 2048" in str(info.value)
