"""ACFL (testbed.algorithms.acfl, testbed.privacy.acfl): the ten checks of acfl.md §7 with the
extraction's worked numbers, the MI-DP ledger event and budget, and the config's one-line errors.
(The contract suite, sim = MQTT with stragglers included, is tests/test_algorithm_contract.py.)"""

from __future__ import annotations

import math

import numpy as np
import pytest

from testbed.accounting.budgets import Budgets
from testbed.algorithms.acfl import Acfl, AcflSection, trajectory
from testbed.algorithms.contract import SETUP_ROUND, RoundContext
from testbed.assembly.config import load_config_text
from testbed.data.regression import WEIGHT_HIGH, make_regression, true_weights
from testbed.errors import ConfigError
from testbed.learning.models import LinearRegression
from testbed.ledger.events import MutualInfoEvent
from testbed.ledger.fields import event_from_dict, event_to_dict
from testbed.ledger.node import NodeLedger
from testbed.privacy import acfl as theory

FIG1 = dict(nodes=5, p=0.1, beta_sq=100.0, model_bound_sq=1.0, dim=100, outputs=10)  # acfl.md §5.1


def _small(n=5, m=12, d=3, o=2, seed=0):
    return make_regression(num_nodes=n, samples_per_node=m, dim=d, outputs=o, seed=seed), LinearRegression(d, o)


def _alg(model, n, **kw):
    args = dict(num_nodes=n, iterations=10, lr=1.0, sigma1_sq=0.3, sigma2_sq=0.2, straggler_p=0.25)
    return Acfl(model, **{**args, **kw})


def _setup(alg, data, seed=0):
    ids = tuple(data.node_ids)
    ctx = RoundContext(SETUP_ROUND, seed, len(ids), ids).closed(ids)
    up = alg.setup_step(data.train, ids, ctx)
    return up, alg.server_setup(alg.init_state(np.zeros(alg.model.num_params)), up, ctx).state


def _true_gradients(data, w):
    x = data.train.x.reshape(data.num_nodes, -1, data.dim)
    y = data.train.y.reshape(data.num_nodes, x.shape[1], -1)
    return x.transpose(0, 2, 1) @ (x @ w - y)  # eq. (7), node by node


# 1. Encoding shapes and noise -------------------------------------------------------------------

def test_1_coded_set_shapes_full_noise_drawn_once_summed_and_exact_without_noise():
    data, model = _small()
    alg = _alg(model, 5)
    up, state = _setup(alg, data)
    hx, hy = up.tensors["HX"], up.tensors["HY"]
    assert hx.shape == (5, 3, 3) and hy.shape == (5, 3, 2)
    a, b = alg.grams(data.train, data.node_ids)
    n1 = hx - a
    assert not np.allclose(n1, n1.transpose(0, 2, 1))  # all d² entries drawn, not symmetrised
    again, _ = _setup(alg, data)
    assert np.array_equal(again.tensors["HX"], hx)  # drawn once, from the node's own stream
    np.testing.assert_allclose(state["HX"], hx.sum(axis=0), rtol=0, atol=1e-12)  # eq. (4)
    np.testing.assert_allclose(state["HY"], hy.sum(axis=0), rtol=0, atol=1e-12)
    noiseless = _alg(model, 5, sigma1_sq=0.0, sigma2_sq=0.0)
    _, clean = _setup(noiseless, data)
    clean["W"] = np.random.default_rng(1).uniform(-1, 1, (3, 2))
    np.testing.assert_allclose(noiseless.coded_gradient(clean), _true_gradients(data, clean["W"]).sum(axis=0),
                               rtol=1e-12, atol=1e-12)


def test_1_the_noise_is_reused_every_iteration():
    data, model = _small()
    alg = _alg(model, 5)
    out = trajectory(alg, data, seed=0, answered=np.ones((3, 5), bool), params0=np.zeros(6))
    _, state = _setup(alg, data)
    assert out["loss"].shape == (4,)
    # The server state after the run holds the very setup sums (never redrawn).
    ids = tuple(data.node_ids)
    ctx = RoundContext(0, 0, 5, ids).closed(ids)
    after = alg.server_step(state, alg.node_step(alg.downlink(state, ctx, ids), data.train, ids, ctx), ctx).state
    assert np.array_equal(after["HX"], state["HX"]) and np.array_equal(after["HY"], state["HY"])


# 2–3. Lemma 1 (unbiasedness) and Lemma 2 (second moment), by Monte Carlo -----------------------

def _monte_carlo(alphas, draws=3000, p=0.3):
    """G_All at a fixed W over ``draws`` independent noise and straggler draws (the implementation's
    own setup and server step; η = 1 so the step is −G_All)."""
    data, model = _small(n=4, m=10, d=2, o=2)
    w = np.array([[0.4, -0.2], [0.1, 0.3]])
    rng = np.random.default_rng(7)
    out = {a: np.empty((draws, 2, 2)) for a in alphas}
    coded = np.empty((draws, 2, 2))
    algs = {a: _alg(model, 4, weights="fixed", alpha=a, straggler_p=p, sigma1_sq=0.5, sigma2_sq=0.4) for a in alphas}
    for k in range(draws):
        heard = tuple(int(i) for i in np.flatnonzero(rng.random(4) >= p))
        first = algs[alphas[0]]
        _, state = _setup(first, data, seed=k)
        state["W"] = w
        coded[k] = first.coded_gradient(state)
        ctx = RoundContext(0, k, 4, heard).closed(heard)
        result = first.node_step(first.downlink(state, ctx, heard), data.train.select(list(heard)), heard, ctx)
        for a, alg in algs.items():
            out[a][k] = w - alg.server_step(state, result, ctx).state["W"]
    return data, w, out, coded


def test_2_and_3_aggregate_is_unbiased_and_within_lemma_2():
    alphas = (0.0, 0.3, 0.5, 1.0)
    p, n, d, o, s1, s2 = 0.3, 4, 2, 2, 0.5, 0.4
    data, w, out, coded = _monte_carlo(alphas)
    grads = _true_gradients(data, w)
    g_true = grads.sum(axis=0)
    beta_sq = float(np.max(np.einsum("mdo,mdo->m", grads, grads)))
    for a, g_all in out.items():
        se = g_all.std(axis=0) / math.sqrt(len(g_all))
        assert np.all(np.abs(g_all.mean(axis=0) - g_true) <= 4 * se + 1e-12), a  # Lemma 1, eqs. (24)-(26)
        second = float(np.einsum("kdo,kdo->k", g_all, g_all).mean())
        u = theory.u_bound(a, nodes=n, p=p, beta_sq=beta_sq, model_bound_sq=float((w**2).sum()), dim=d, outputs=o,
                           sigma1_sq=s1, sigma2_sq=s2)
        assert second <= u, a  # Lemma 2, eq. (27)
    # The noise part of E‖G_All‖² at α = 1: N d σ₁² ‖W‖² + N σ₂² o d (eqs. 31–32).
    noise = coded - g_true
    expected = n * d * s1 * float((w**2).sum()) + n * s2 * o * d
    assert float(np.einsum("kdo,kdo->k", noise, noise).mean()) == pytest.approx(expected, rel=0.06)


# 4. The adaptive policy ----------------------------------------------------------------------

def test_4_adaptive_weight_is_eq_43_over_current_non_stragglers_and_eq_36_with_constants():
    data, model = _small()
    alg = _alg(model, 5)
    _, state = _setup(alg, data)
    state["W"] = np.full((3, 2), 0.2)
    grads = _true_gradients(data, state["W"])[[0, 2, 3]]  # three non-stragglers
    alpha, beta_sq = alg.weight(state, grads, 0.25)
    b = np.mean([np.sum(g**2) for g in grads])  # eq. (42), the non-stragglers only
    c = np.sum(state["W"] ** 2)
    assert beta_sq == pytest.approx(b, rel=1e-12)
    assert alpha == pytest.approx(0.25 * b / (0.25 * b + 3 * 0.3 * c * 0.75 + 0.2 * 2 * 3 * 0.75), rel=1e-12)
    assert 0 <= alpha < 1
    # With constants in place of the estimates, eq. (43) is eq. (36), and α* minimises u on [0, 1].
    kw = dict(nodes=5, p=0.25, beta_sq=b, model_bound_sq=c, dim=3, outputs=2, sigma1_sq=0.3, sigma2_sq=0.2)
    assert alpha == pytest.approx(theory.optimal_alpha(**kw), rel=1e-12)
    grid = np.linspace(0, 1, 100001)
    assert abs(grid[np.argmin(theory.u_bound(grid, **kw))] - theory.optimal_alpha(**kw)) <= 1e-5


def test_4_all_stragglers_fallbacks():
    data, model = _small()
    empty = np.zeros((0, 3, 2))
    coded = _alg(model, 5)
    _, state = _setup(coded, data)
    assert coded.weight(state, empty, 0.25)[0] == 1.0  # "coded": α = 1
    last = _alg(model, 5, all_straggle="last")
    state["beta_sq"] = np.array([4.0])
    state["W"] = np.full((3, 2), 0.2)
    alpha, _ = last.weight(state, empty, 0.25)
    assert alpha == pytest.approx(0.25 * 4 / (0.25 * 4 + 3 * 0.3 * 0.24 * 0.75 + 0.2 * 6 * 0.75), rel=1e-12)


# 5. Closed forms and Fig. 1 -------------------------------------------------------------------

# acfl.md §5.1: σ² → (ε, α*, adaptive bound, bound at α = 0, 0.25, 0.5, 1), printed to 2 or 4 decimals.
# One slip in the extraction: ε at σ² = 1e-3 is printed 721.97, but 104.5 ln(1001) = 721.9649 → 721.96.
FIG1_TABLE = {
    1e-4: (962.49, 0.9902, 10.0022, 10.2222, 10.1251, 10.0561, 10.0022),
    1e-3: (721.96, 0.9099, 10.0200, 10.2222, 10.1264, 10.0611, 10.0220),
    1e-2: (482.28, 0.5025, 10.1106, 10.2222, 10.1387, 10.1106, 10.2200),
    0.1: (250.58, 0.0917, 10.2018, 10.2222, 10.2625, 10.6056, 12.2000),
    1: (72.43, 0.0100, 10.2200, 10.2222, 11.5000, 15.5556, 32.0000),
    10: (9.96, 0.0010, 10.2220, 10.2222, 23.8750, 65.0556, 230.0000),
    100: (1.04, 0.0001, 10.2222, 10.2222, 147.6250, 560.0556, 2210.0000),
}


@pytest.mark.parametrize("sigma_sq", list(FIG1_TABLE))
def test_5_fig1_table_and_closed_forms(sigma_sq):
    eps, alpha, adaptive, *fixed = FIG1_TABLE[sigma_sq]
    kw = dict(FIG1, sigma1_sq=sigma_sq, sigma2_sq=sigma_sq)
    a_star = theory.optimal_alpha(**kw)
    u_star = theory.u_bound(a_star, **kw)
    assert u_star == pytest.approx(theory.u_tilde(**kw), rel=1e-12)  # eq. (38) is u at eq. (36)
    bound = theory.convergence_bound(theory.u_tilde(**kw), 1.0, 1000)
    # 721.965 is printed 721.97: the table's rounding (half a unit of its last digit, plus float noise).
    assert abs(theory.mi_epsilon(100, 10, sigma_sq, sigma_sq) - eps) <= 0.005 + 1e-6
    assert abs(a_star - alpha) <= 0.00005 + 1e-9
    assert abs(bound - adaptive) <= 0.00005 + 1e-9
    for a, value in zip((0.0, 0.25, 0.5, 1.0), fixed):
        fixed_bound = theory.convergence_bound(theory.u_bound(a, **kw), 1.0, 1000)
        assert abs(fixed_bound - value) <= 0.00005 + 1e-9
        assert bound <= fixed_bound * (1 + 1e-12)  # the adaptive weight is never worse
    assert 10.0 <= bound <= 10.0 + 2 / 9 + 1e-12


def test_5_fig1_limits():
    tiny = theory.convergence_bound(theory.u_tilde(**FIG1, sigma1_sq=1e-12, sigma2_sq=1e-12), 1.0, 1000)
    huge = theory.convergence_bound(theory.u_tilde(**FIG1, sigma1_sq=1e12, sigma2_sq=1e12), 1.0, 1000)
    assert tiny == pytest.approx(4 * 5**2 * 100 / 1000, abs=1e-6)  # 4N²β²/T = 10
    assert huge == pytest.approx(4 * (5 * 100 / 0.9 + 5 * 100 * 4) / 1000, abs=1e-6)  # 10.2222…


# 6. Theorem 1 -----------------------------------------------------------------------------------

def test_6_theorem_1_values_monotone_limit_inverse_and_bits():
    # acfl.md §3.3, d = o = 10: ε = 14.5 ln(1 + 1/σ²).
    for s, eps in {0.01: 66.92, 0.1: 34.77, 0.5: 15.93, 1: 10.05, 2: 5.88, 5: 2.64, 10: 1.38}.items():
        assert abs(theory.mi_epsilon(10, 10, s, s) - eps) <= 0.005 + 1e-6
    assert theory.mi_epsilon(10, 10, 1.0, 1.0) == pytest.approx(14.5 * math.log(2), rel=1e-12)
    grid = np.logspace(-4, 6, 50)
    eps = theory.mi_epsilon(10, 10, grid, grid)
    assert np.all(np.diff(eps) < 0) and eps[-1] < 1e-4
    for ratio in (1.0, 3.0):
        for target in (0.5, 10.0, 200.0):
            s1, s2 = theory.sigma_sq_for_epsilon(10, 10, target, ratio)
            assert s2 == pytest.approx(ratio * s1, rel=1e-12)
            assert theory.mi_epsilon(10, 10, s1, s2) == pytest.approx(target, rel=1e-9)
    assert theory.mi_epsilon(10, 10, 1.0, 1.0, unit="bits") == pytest.approx(14.5, rel=1e-12)
    assert theory.sigma_sq_for_epsilon(10, 10, 14.5, unit="bits")[0] == pytest.approx(1.0, rel=1e-12)
    s = theory.scfl_sigma_sq_for_epsilon(2.0)
    assert theory.scfl_epsilon(s) == pytest.approx(2.0, rel=1e-12)


# 7. Data and protocol ----------------------------------------------------------------------------

def test_7_sec_v_data_learning_rate_and_initial_loss():
    data = make_regression(num_nodes=100, samples_per_node=100, dim=10, outputs=10, seed=0)
    assert data.train.x.shape == (10000, 10) and data.train.y.shape == (10000, 10)
    assert np.all(data.train.sizes == 100)
    assert np.abs(data.train.x).max() <= 1.0
    w = true_weights(10, 10, 0)
    assert 0 <= w.min() and w.max() <= WEIGHT_HIGH
    np.testing.assert_array_equal(data.train.y, data.train.x @ w)  # no label noise
    one = make_regression(num_nodes=100, samples_per_node=100, dim=10, outputs=10, seed=0, nodes=[37])
    np.testing.assert_array_equal(one.train.x, data.train.x[3700:3800])  # a board generates its own rows
    model = LinearRegression(10, 10)
    w0 = model.init(np.random.default_rng(3))
    assert 0 <= w0.min() and w0.max() <= 1 / 30
    losses = [0.5 * np.sum((data.train.x @ model.init(np.random.default_rng(k)).reshape(10, 10) - data.train.y) ** 2)
              for k in range(5)]
    assert 20 < np.mean(losses) < 40  # f(W₀) ≈ 30, the sum-form loss (acfl.md §5.7: E ≈ 30.9)
    alg = _alg(model, 100, lr=1e-4)
    assert [alg.learning_rate(r) for r in (0, 1, 9)] == pytest.approx([1e-4, 5e-5, 1e-5])  # t from 1
    plus_one = _alg(model, 100, lr=1e-4, lr_schedule="eta0_over_t_plus_1")
    assert plus_one.learning_rate(0) == pytest.approx(5e-5)
    theorem_2 = _alg(model, 100, lr_schedule="inverse_lambda_t", strong_convexity=2.0)
    assert theorem_2.learning_rate(4) == pytest.approx(1 / 10)


def test_7_stragglers_are_bernoulli_p_in_the_runner():
    from testbed.rounds.stragglers import StragglersSection, draw_stragglers

    section = StragglersSection(model="bernoulli", p=0.2)
    missed = sum(len(draw_stragglers(section, seed=1, round_index=r, node_ids=range(100))) for r in range(50))
    assert missed / 5000 == pytest.approx(0.2, abs=0.02)


# 8. NA -----------------------------------------------------------------------------------------

def test_8_na_is_acfl_with_a_fixed_half_on_the_same_draws():
    data, model = _small()
    acfl, na = _alg(model, 5), _alg(model, 5, weights="fixed", alpha=0.5)
    answered = np.random.default_rng(2).random((6, 5)) >= 0.25
    a = trajectory(acfl, data, seed=3, answered=answered, params0=np.zeros(6))
    b = trajectory(na, data, seed=3, answered=answered, params0=np.zeros(6))
    _, sa = _setup(acfl, data, seed=3)
    _, sb = _setup(na, data, seed=3)
    assert np.array_equal(sa["HX"], sb["HX"]) and np.array_equal(sa["HY"], sb["HY"])  # common random numbers
    assert np.all(b["alpha"] == 0.5) and not np.allclose(a["alpha"], 0.5)
    # One NA step by hand: W − η (½ G_S + ½/(1−p) Σ G_i).
    heard = (0, 2, 4)
    ctx = RoundContext(0, 3, 5, heard).closed(heard)
    res = na.node_step(na.downlink(sb, ctx, heard), data.train.select(list(heard)), heard, ctx)
    step = na.server_step(sb, res, ctx).state["W"]
    g = _true_gradients(data, sb["W"])[list(heard)].sum(axis=0)
    np.testing.assert_allclose(step, sb["W"] - 1.0 * (0.5 * na.coded_gradient(sb) + 0.5 / 0.75 * g), atol=1e-12)


# 9. Qualitative outcomes (Sec. V setting, shortened) ------------------------------------------------

def test_9_acfl_is_insensitive_to_noise_na_is_not_and_alpha_decays():
    data = make_regression(num_nodes=100, samples_per_node=100, dim=10, outputs=10, seed=0)
    model = LinearRegression(10, 10)
    w0 = model.init(np.random.default_rng(0))
    answered = np.random.default_rng(1).random((300, 100)) >= 0.2
    final = {}
    for weights in ("adaptive", "fixed"):
        for s in (0.1, 10.0):
            alg = Acfl(model, num_nodes=100, iterations=300, lr=1e-4, sigma1_sq=s, sigma2_sq=s, straggler_p=0.2,
                       weights=weights)
            out = trajectory(alg, data, seed=0, answered=answered, params0=w0)
            final[weights, s] = out["loss"][-1]
            if weights == "adaptive":
                assert out["alpha"][-1] < 0.05 * out["alpha"][0]  # ᾰ_t → 0 with noiseless labels
    assert final["fixed", 10.0] > 5 * final["fixed", 0.1]  # NA's floor grows with σ² (≈ 0.375 σ²)
    assert final["adaptive", 10.0] == pytest.approx(final["adaptive", 0.1], rel=0.1)
    assert all(final["adaptive", s] <= final["fixed", s] for s in (0.1, 10.0))


# 10. SCFL at equal ε -----------------------------------------------------------------------------

def test_10_scfl_calibrated_to_the_same_epsilon_with_the_same_upload_size():
    acfl = AcflSection(mi_epsilon=5.0)
    scfl = AcflSection(mi_epsilon=5.0, encoding="projection", weights="fixed")
    s_acfl, s_scfl = acfl.noise(10, 10), scfl.noise(10, 10)
    assert theory.mi_epsilon(10, 10, *s_acfl) == pytest.approx(5.0, rel=1e-9)
    assert theory.scfl_epsilon(s_scfl[0]) == pytest.approx(5.0, rel=1e-9)
    data = make_regression(num_nodes=100, samples_per_node=100, dim=10, outputs=10, seed=0)
    model = LinearRegression(10, 10)
    kw = dict(num_nodes=100, iterations=200, lr=1e-4, straggler_p=0.2)
    a = Acfl(model, sigma1_sq=s_acfl[0], sigma2_sq=s_acfl[1], **kw)
    b = Acfl(model, sigma1_sq=s_scfl[0], sigma2_sq=s_scfl[1], encoding="projection", weights="fixed", **kw)
    assert a.setup_spec() == b.setup_spec() and a.setup_events(0)[0] == b.setup_events(0)[0]  # same size
    assert a.setup_events(0)[1].epsilon_nats == pytest.approx(b.setup_events(0)[1].epsilon_nats, rel=1e-9)
    w0 = model.init(np.random.default_rng(0))
    answered = np.random.default_rng(1).random((200, 100)) >= 0.2
    la = trajectory(a, data, seed=0, answered=answered, params0=w0)["loss"][-1]
    lb = trajectory(b, data, seed=0, answered=answered, params0=w0)["loss"][-1]
    assert la < lb


def test_10_scfl_coded_gradient_is_unbiased_over_projections_and_noise():
    data, model = _small(n=3, m=8, d=2, o=2)
    alg = _alg(model, 3, encoding="projection", weights="fixed", sigma1_sq=0.4, sigma2_sq=0.4)
    w = np.array([[0.3, -0.1], [0.2, 0.5]])
    draws = np.empty((4000, 2, 2))
    for k in range(len(draws)):
        _, state = _setup(alg, data, seed=k)
        state["W"] = w
        draws[k] = alg.coded_gradient(state)
    g_true = _true_gradients(data, w).sum(axis=0)
    se = draws.std(axis=0) / math.sqrt(len(draws))
    assert np.all(np.abs(draws.mean(axis=0) - g_true) <= 4 * se)


# The ledger's MI-DP event and budget; config errors ---------------------------------------------

def test_mutual_info_event_round_trips_and_has_its_own_budget():
    event = MutualInfoEvent(node=2, round=SETUP_ROUND, epsilon_nats=10.05)
    assert event_from_dict(event_to_dict(event)) == event
    assert event_from_dict({k: str(v) for k, v in event_to_dict(event).items()}) == event
    for bad in (-1.0, math.inf, "x"):
        with pytest.raises(ValueError, match="epsilon_nats"):
            event_from_dict(dict(event_to_dict(event), epsilon_nats=bad))
    ledger = NodeLedger(2)
    assert Budgets(mi_epsilon=10.0).would_exceed(ledger, [event]).budget == "mi_epsilon"
    assert Budgets(mi_epsilon=10.05).would_exceed(ledger, [event]) is None
    assert Budgets(epsilon=0.1).would_exceed(ledger, [event]) is None  # never composed with (ε, δ)
    ledger.extend([event])
    assert ledger.totals.mi_epsilon_nats == 10.05 and not ledger.privacy


BASE = '[run]\nalgorithm = "acfl"\n[data]\ndataset = "regression"\nnum_nodes = 4\nsamples_per_node = 20\n' \
       'dim = 3\noutputs = 2\n[model]\nkind = "linear"\nbias = false\n[output]\nfigures = false\n'


@pytest.mark.parametrize("extra,key", [
    ('[acfl]\nmi_epsilon = 2.0\nsigma1_sq = 1.0\n', "acfl.mi_epsilon"),
    ('[acfl]\nsigma1_sq = 1.0\n', "acfl.sigma2_sq"),
    ('[acfl]\nweights = "theoretical"\n', "acfl.beta"),
    ('[stragglers]\nmodel = "deadline"\ndeadline_s = 1.0\n', "acfl.straggler_p"),
])
def test_config_errors_name_the_key(extra, key):
    with pytest.raises(ConfigError) as info:
        load_config_text(BASE + extra)
    assert info.value.key == key and "\n" not in str(info.value)


def test_linear_model_required_and_mi_budget_refused_before_round_1(tmp_path):
    from testbed.orchestration.runner import run_experiment

    with pytest.raises(ConfigError) as info:
        run_experiment(load_config_text(BASE.replace('kind = "linear"', 'kind = "logistic"')), out_dir=tmp_path / "l")
    assert info.value.key == "model.kind"

    config = load_config_text(BASE + "[acfl]\niterations = 2\n[budget]\nmi_epsilon = 1.0\n")
    with pytest.raises(ConfigError) as info:
        run_experiment(config, out_dir=tmp_path / "r", quiet=True)
    assert info.value.key == "budget.mi_epsilon"


def test_a_run_records_the_upload_and_its_mi_epsilon_per_node(tmp_path):
    from testbed.ledger.files import read_ledger
    from testbed.orchestration.runner import run_experiment

    config = load_config_text(BASE + '[acfl]\niterations = 3\nlr = 0.01\nsigma1_sq = 1.0\nsigma2_sq = 1.0\n'
                                     '[stragglers]\nmodel = "bernoulli"\np = 0.3\n')
    result = run_experiment(config, out_dir=tmp_path / "r", quiet=True)
    eps = theory.mi_epsilon(3, 2, 1.0, 1.0)
    assert all(node["mi_epsilon_nats"] == pytest.approx(eps) for node in result.summary["nodes"].values())
    assert "not covered" in result.summary["algorithm_settings"]["privacy_scope"]
    assert result.summary["algorithm_settings"]["straggler_p"] == 0.3  # [stragglers] p by default
    setup = [e for e in read_ledger(tmp_path / "r" / "ledger.csv") if e.round == SETUP_ROUND]
    assert sorted(e.kind for e in setup if e.node == 0) == ["communication", "mutual_info"]
    assert [e.bytes_up for e in setup if e.kind == "communication"] == [8 * (9 + 6)] * 4  # Remark 1


# CLI ---------------------------------------------------------------------------------------------

def _cli_json(capsys, argv):
    import json

    from testbed.cli import main

    assert main(argv + ["--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_cli_privacy_acfl_both_ways(capsys):
    out = _cli_json(capsys, ["privacy", "acfl", "--dim", "10", "--outputs", "10", "--sigma1-sq", "1", "--sigma2-sq", "1"])
    assert out["epsilon"] == pytest.approx(14.5 * math.log(2), rel=1e-12) and out["sigma1_sq"] == out["sigma2_sq"] == 1
    out = _cli_json(capsys, ["privacy", "acfl", "--dim", "10", "--outputs", "10", "--epsilon", "5", "--ratio", "2"])
    assert out["epsilon"] == pytest.approx(5.0, rel=1e-9) and out["sigma2_sq"] == pytest.approx(2 * out["sigma1_sq"])
    from testbed.cli import main

    assert main(["privacy", "acfl", "--dim", "10", "--outputs", "10", "--sigma1-sq", "1"]) == 2
    assert "--sigma2-sq" in capsys.readouterr().err


def test_cli_plan_acfl_reproduces_fig1(capsys):
    out = _cli_json(capsys, ["plan", "acfl", "--dim", "100", "--outputs", "10", "--sigma1-sq", "0.01", "--sigma2-sq",
                             "0.01", "--nodes", "5", "--straggler-p", "0.1", "--beta", "10", "--model-bound", "1",
                             "--strong-convexity", "1", "--iterations", "1000"])
    assert abs(out["alpha"] - 0.5025) <= 5e-5 and abs(out["bound"] - 10.1106) <= 5e-5
    assert abs(out["epsilon"] - 482.28) <= 5e-3


# Real data: the random-feature embedding and the constant step (beyond the paper) ----------------

def _ragged(d=3, o=2, sizes=(2, 5, 3), seed=0):
    from testbed.data.federated import Split

    rng = np.random.default_rng(seed)
    n = sum(sizes)
    return Split(x=rng.uniform(-1, 1, (n, d)), y=rng.integers(0, o, n), offsets=np.cumsum((0,) + sizes))


def test_random_features_are_bounded_deterministic_per_seed_and_approximate_the_kernel():
    from testbed.learning.models import RandomFeatures, build_model

    x = np.random.default_rng(1).uniform(-3, 3, (200, 4))  # even outside the unit ball
    phi = RandomFeatures(4, 64, gamma=0.5, seed=7)
    assert phi(x).shape == (200, 64) and np.abs(phi(x)).max() <= 1.0
    assert np.array_equal(phi(x), RandomFeatures(4, 64, gamma=0.5, seed=7)(x))  # a fresh draw, same seed
    assert not np.allclose(phi(x), RandomFeatures(4, 64, gamma=0.5, seed=8)(x))
    assert np.array_equal(phi(x[None])[0], phi(x))  # any leading axes
    wide = RandomFeatures(2, 20000, gamma=1.0, seed=0)
    a, b = np.array([[0.3, -0.2]]), np.array([[-0.1, 0.4]])
    k = 2.0 / 20000 * float((wide(a) @ wide(b).T)[0, 0])
    assert k == pytest.approx(math.exp(-np.sum((a - b) ** 2)), abs=0.02)
    m = build_model("linear", 4, 3, bias=True, random_features=64, rf_gamma=0.5, seed=7)
    assert m.features == 65 and np.array_equal(m.design(x)[:, :64], phi(x)) and np.all(m.design(x)[:, 64] == 1)
    with pytest.raises(ValueError, match="seed"):
        build_model("linear", 4, 3, random_features=64)
    with pytest.raises(ValueError, match="linear"):
        build_model("logistic", 4, 3, random_features=64, seed=0)


@pytest.mark.parametrize("embedding", [False, True])
def test_coded_set_one_node_at_a_time_equals_all_at_once_on_ragged_nodes(embedding):
    """The Grams are over the model's features (bias, embedding) of each node's own rows: padding
    rows of ragged nodes add nothing (they did, through the bias column, before the features were
    computed ahead of the padding), and a node alone (a board) uploads what it does in sim."""
    from testbed.learning.models import RandomFeatures

    train = _ragged()
    model = LinearRegression(3, 2, bias=True, embedding=RandomFeatures(3, 6, seed=4) if embedding else None)
    everyone = _alg(model, 3)
    ids = (0, 1, 2)
    ctx = RoundContext(SETUP_ROUND, 5, 3, ids).closed(ids)
    up = everyone.setup_step(train, ids, ctx).tensors["HX"]
    a, b = everyone.grams(train, ids)
    for i in ids:
        rows = slice(train.offsets[i], train.offsets[i + 1])
        x, y = model.design(train.x[rows]), model.targets(train.y[rows])
        np.testing.assert_allclose(a[i], x.T @ x, atol=1e-12)
        np.testing.assert_allclose(b[i], x.T @ y, atol=1e-12)
        alone = _alg(model, 3).setup_step(train.select([i]), (i,), ctx).tensors["HX"][0]
        np.testing.assert_array_equal(alone, up[i])


def test_a_run_with_random_features_draws_them_from_the_run_seed(tmp_path):
    from testbed.learning.models import RandomFeatures
    from testbed.orchestration.runner import run_experiment
    from testbed.reports.results import read_checkpoint

    text = BASE.replace("bias = false\n", "bias = false\nrandom_features = 5\nrf_gamma = 2.0\n").replace(
        "[run]\n", "[run]\nseed = 3\n") + ('[acfl]\niterations = 3\nlr = 0.01\nsigma1_sq = 1.0\nsigma2_sq = 1.0\n'
                                         '[stragglers]\nmodel = "bernoulli"\np = 0.3\n')
    result = run_experiment(load_config_text(text), out_dir=tmp_path / "r", quiet=True)
    assert result.summary["plan"]["features"] == 5
    model = LinearRegression(3, 2, embedding=RandomFeatures(3, 5, 2.0, seed=3))
    data = make_regression(num_nodes=4, samples_per_node=20, dim=3, outputs=2, seed=3)
    from testbed.algorithms.acfl import bernoulli_answered
    from testbed.streams.rng import GLOBAL, Purpose, stream

    alg = Acfl(model, num_nodes=4, iterations=3, lr=0.01, sigma1_sq=1.0, sigma2_sq=1.0, straggler_p=0.3)
    mine = trajectory(alg, data, seed=3, answered=bernoulli_answered(3, 0.3, 4, 3),
                      params0=model.init(stream(3, GLOBAL, -1, Purpose.INIT)))["W"]
    np.testing.assert_array_equal(read_checkpoint(tmp_path / "r").state["W"], mine)


def test_constant_step_is_eta0_throughout_and_moves_the_weakly_curved_directions():
    assert AcflSection(lr_schedule="constant").lr_schedule == "constant"
    from testbed.data.federated import FederatedData, Split

    alg = _alg(LinearRegression(2, 1), 1, lr=0.5, lr_schedule="constant", sigma1_sq=0.0, sigma2_sq=0.0,
               weights="fixed", alpha=0.0, straggler_p=0.0)
    assert [alg.learning_rate(r) for r in (0, 1, 99)] == [0.5, 0.5, 0.5]
    x = np.array([[1.0, 0.0], [0.0, 0.05]])  # curvatures 1 and 0.0025
    split = Split(x=x, y=np.array([[1.0], [0.05]]), offsets=np.array([0, 2]))
    data = FederatedData(train=split, test=split, validation=split, n_classes=1, name="toy", node_names=("a",),
                         node_ids=(0,))
    losses = {}
    for schedule in ("constant", "eta0_over_t"):
        alg = _alg(LinearRegression(2, 1), 1, lr=1.0, lr_schedule=schedule, sigma1_sq=0.0, sigma2_sq=0.0,
                   weights="fixed", alpha=0.0, straggler_p=0.0)
        losses[schedule] = trajectory(alg, data, seed=0, answered=np.ones((400, 1), bool), params0=np.zeros(2))["loss"]
    assert losses["constant"][-1] < 0.2 * losses["eta0_over_t"][-1]  # Σ η_t: 400 against ≈ 6.6
