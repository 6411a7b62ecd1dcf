"""DWFL and its baselines: dwfl.md §8 checks 2–4 and 6–7, variants A/B, calibration, runs, config, CLI."""

import dataclasses
import json

import numpy as np
import pytest

from testbed.algorithms import RoundContext
from testbed.algorithms.dwfl import Dwfl
from testbed.algorithms.dwfl_channel import Radio, channel_noise_row
from testbed.assembly import assemble
from testbed.assembly.config import load_config_text
from testbed.cli import main
from testbed.data.synthetic import make_logistic
from testbed.learning.models import LogisticRegression
from testbed.orchestration.runner import run_experiment
from testbed.privacy import dwfl as dp
from testbed.streams.rng import Purpose, stream

from algo_steps import run_round

N, DIM, SEED, ROUND = 6, 5, 3, 2
DATA = make_logistic(num_nodes=N, samples_per_node=60, dim=DIM, seed=0)
MODEL = LogisticRegression(DIM, 2)


def _alg(noise_power_w=1.0, sigma2=None, epsilon=0.5, eta=0.5, variant="A", scheme="ota_d2d", init="independent",
         **radio):
    # No fading: gains are 1 and c_scale < 1 leaves every node power for artificial noise (β_k > 0),
    # so the tests stay fast (no Sionna) while every noise term is exercised.
    r = Radio(num_nodes=N, power_w=100.0, noise_power_w=noise_power_w, fading="none", c_scale=0.6, **radio)
    return Dwfl(MODEL, r, rounds=5, batch=8, lr=0.2, averaging_rate=eta, gmax=1.0, delta=1e-5,
                epsilon=None if sigma2 is not None else epsilon, sigma2=sigma2,
                scheme=scheme, variant=variant, init=init, init_std=0.3, seed=SEED)


def _round(alg):
    """One round from an independent initialisation: (X', X'') with X' the local steps."""
    state = alg.init_state(MODEL.init(None))
    payload = alg.local_step(state["models"], DATA.train, list(range(N)), ROUND, SEED)
    return payload, run_round(alg, state, DATA, ROUND, SEED)["models"]


def _psi(eta):
    w = (np.ones((N, N)) - np.eye(N)) / (N - 1)
    return (1 - eta) * np.eye(N) + eta * w


@pytest.mark.parametrize("eta", [0.5, (N - 1) / N])
def test_noiseless_round_is_psi_and_its_eigenvalues(eta):
    """§8 check 2: σ = σ_m = 0 gives X'' = Ψ X' (rows are nodes); eig Ψ = 1, 1 − ηN/(N−1)."""
    payload, new = _round(_alg(noise_power_w=0.0, sigma2=0.0, eta=eta))
    psi = _psi(eta)
    np.testing.assert_allclose(new, psi @ payload, rtol=1e-12, atol=1e-12)
    eig = np.sort(np.linalg.eigvalsh(psi))
    np.testing.assert_allclose(eig, np.sort([1.0] + [1 - eta * N / (N - 1)] * (N - 1)), atol=1e-12)
    if eta == (N - 1) / N:  # exact averaging in one round
        np.testing.assert_allclose(new, np.broadcast_to(payload.mean(0), new.shape), atol=1e-12)


def test_average_follows_exact_sgd_in_variant_a_and_not_in_b():
    """§8 check 3 (eq. 9): variant A keeps mean_i x_i'' = mean_i x_i' with all noise on; in variant B
    the mean moves by η/(c(N−1)) mean_i m_i, and A and B differ by exactly that per receiver."""
    a, b = _alg(variant="A"), _alg(variant="B")
    payload, new_a = _round(a)
    _, new_b = _round(b)
    assert a.plan(ROUND).sigma2 > 0
    np.testing.assert_allclose(new_a.mean(0), payload.mean(0), rtol=0, atol=1e-12)
    plan = a.plan(ROUND)
    m = np.stack([channel_noise_row("ota_d2d", plan.channel, a.radio, i, payload.shape[1], SEED, ROUND)
                  for i in range(N)])
    scale = 0.5 / (plan.channel.alignment.c * (N - 1))
    np.testing.assert_allclose(new_b - new_a, scale * m, rtol=0, atol=1e-12)
    assert np.abs(new_b.mean(0) - payload.mean(0)).max() > 1e-3


def test_matrix_form_eq8():
    """§8 check 4: variant A's update is Ψ X' + (Ψ − I) Φ with Φ's rows a_k G_k."""
    alg = _alg(variant="A")
    payload, new = _round(alg)
    plan = alg.plan(ROUND)
    g = np.stack([stream(SEED, k, ROUND, Purpose.NOISE).standard_normal(payload.shape[1]) for k in range(N)])
    phi = plan.channel.alignment.noise_scale()[:, None] * np.sqrt(plan.sigma2) * g
    psi = _psi(0.5)
    np.testing.assert_allclose(new, psi @ payload + (psi - np.eye(N)) @ phi, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("calibration,count", [("with_channel_noise", True), ("artificial_only", False)])
def test_ota_calibration_round_trip(calibration, count):
    """§8 check 7: the calibrated σ² gives max_i ε_i == target (eq. 11); artificial_only ignores σ_m²."""
    alg = _alg(noise_power_w=30.0)
    alg.calibration = calibration
    plan = alg.plan(0)
    al = plan.channel.alignment
    expect = dp.calibrate_sigma2(0.5, dp.RoundSetting(plan.channel.gains, al.power_w, al.beta, 30.0, 0.2, 1.0, 1e-5,
                                                      c=al.c), count_channel_noise=count)
    assert plan.sigma2 == pytest.approx(expect)
    assert plan.epsilon.max() == pytest.approx(0.5) if count else plan.epsilon.max() < 0.5
    # the ledger's σ is the worst receiver's: its ε is the largest over the other receivers
    ev = alg.planned_events(0, RoundContext.everyone(0, SEED, N))[2]
    assert alg.sensitivity * dp.gaussian_factor(1e-5) / ev.sigma == pytest.approx(plan.epsilon[1:].max())


@pytest.mark.parametrize("scheme", ["orthogonal_d2d", "ota_central"])
def test_baselines_respect_their_calibration(scheme):
    alg = _alg(scheme=scheme, variant="B", init="common" if scheme == "ota_central" else "independent")
    plan = alg.plan(0)
    assert plan.sigma2 > 0
    assert plan.epsilon.max() == pytest.approx(0.5)
    ev = alg.planned_events(0, RoundContext.everyone(0, SEED, N))[2]
    assert alg.sensitivity * dp.gaussian_factor(1e-5) / ev.sigma == pytest.approx(0.5)
    payload, new = _round(alg)
    assert np.all(np.isfinite(new))
    if scheme == "ota_central":  # the server broadcasts one model
        np.testing.assert_array_equal(new, np.broadcast_to(new[0], new.shape))
    else:  # N slots per round instead of one
        ota = _alg().plan(0)
        assert plan.airtime_s[0] == pytest.approx(N * ota.airtime_s[0])


def test_orthogonal_noise_is_larger_than_over_the_air():
    """dwfl.md §6.3: for the same ε the orthogonal disagreement noise is ~(N−1)× DWFL's."""
    spread = {}
    for scheme in ("ota_d2d", "orthogonal_d2d"):
        payload, new = _round(_alg(scheme=scheme, variant="A", noise_power_w=1e-6))
        exact = _psi(0.5) @ payload
        spread[scheme] = np.var(new - exact)
    assert spread["orthogonal_d2d"] > 2 * spread["ota_d2d"]


def test_infeasible_target_names_the_key():
    """Equal gains and c_scale = 1 leave every β_k = 0: no artificial noise can meet ε."""
    from testbed.errors import ConfigError

    cfg = load_config_text(f'[run]\nalgorithm = "dwfl"\n[data]\nnum_nodes = {DATA.num_nodes}\n[dwfl]\n'
                           'epsilon = 0.5\nfading = "none"\nbatch = 8\nnoise_power_w = 1e-6\n')
    with pytest.raises(ConfigError, match="dwfl.epsilon"):
        assemble.build_algorithm(cfg, MODEL, DATA)


SMALL = """
[run]
name = "dwfl-t"
algorithm = "dwfl"
seed = 4
[data]
dataset = "synthetic"
num_nodes = 5
samples_per_node = 60
dim = 6
[dwfl]
rounds = 6
batch = 8
lr = 0.3
epsilon = 0.5
fading = "none"
c_scale = 0.7
[privacy]
delta = 1e-5
[output]
figures = false
"""


def test_same_seed_same_numbers(tmp_path):
    cfg = load_config_text(SMALL)
    runs = [run_experiment(cfg, out_dir=tmp_path / name, quiet=True) for name in ("a", "b")]
    other = run_experiment(load_config_text(SMALL, ["run.seed=5"]), out_dir=tmp_path / "c", quiet=True)
    pa, pb, pc = (np.load(r.run_dir / "final_params.npy") for r in (*runs, other))
    np.testing.assert_array_equal(pa, pb)
    assert not np.allclose(pa, pc)


def test_testbed_run_end_to_end(tmp_path, capsys):
    """`testbed run FILE` on a DWFL file (Rayleigh fading, the default) writes summary.json."""
    path = tmp_path / "dwfl.toml"
    path.write_text(SMALL.replace('fading = "none"\nc_scale = 0.7\n', 'coherence_rounds = 2\n'))
    assert main(["run", str(path), "--out", str(tmp_path / "r")]) == 0
    assert "eps/round" in capsys.readouterr().out
    s = json.loads((tmp_path / "r" / "summary.json").read_text())
    assert s["algorithm"] == "dwfl" and s["status"] == "completed" and s["rounds"] == 6
    st = s["algorithm_settings"]
    assert st["epsilon_round_max"] == pytest.approx(0.5)
    assert len(st["epsilon_per_receiver"]) == 5
    assert st["epsilon_composed_pld"] <= st["epsilon_composed_rdp"] + 1e-9
    node = s["nodes"]["0"]
    assert node["rounds"] == 6 and node["energy_j"] > 0 and node["epsilon"] > 0.5


@pytest.mark.parametrize("override,key,words", [
    ("dwfl.scheme='mesh'", "dwfl.scheme", "must be one of"),
    ("dwfl.variant='C'", "dwfl.variant", "must be one of"),
    ("dwfl.averaging_rate=1.5", "dwfl.averaging_rate", "<= 1"),
    ("dwfl.sigma2=1.0", "dwfl.sigma2", "not both"),
    ("dwfl.coherence_rounds=0", "dwfl.coherence_rounds", "> 0"),
    ("dwfl.noise_figure_db=7.0", "dwfl.noise_figure_db", "not both"),
    ("dwfl.batch=500", "dwfl.batch", "larger than node"),
    ("dwfl.power_dbm='high'", "dwfl.power_dbm", "must be a number"),
])
def test_config_errors_name_the_key(tmp_path, capsys, override, key, words):
    path = tmp_path / "dwfl.toml"
    path.write_text(SMALL)
    extra = ["--set", "dwfl.noise_power_w=1.0"] if "noise_figure" in override else []
    code = main(["run", str(path), "--set", override, *extra, "--out", str(tmp_path / "r"), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1
    assert key in err and words in err


def test_cli_worked_example(capsys):
    """§8 check 6 and 7 through `testbed privacy dwfl` (dwfl.md §4.5)."""
    base = ["privacy", "dwfl", "--gains", ",".join(["1"] + ["2"] * 9), "--power-w", "1", "--noise-var", "1",
            "--lr", "0.1", "--gmax", "1", "--delta", "1e-5", "--json"]
    assert main(base + ["--sigma2", "1"]) == 0
    out = json.loads(capsys.readouterr().out)
    np.testing.assert_allclose(out["epsilon"], [0.183116] + [0.193792] * 9, atol=1e-6)
    np.testing.assert_allclose(out["epsilon_orthogonal"], [0.968961] * 10, atol=1e-6)
    assert out["sigma_z2"] == pytest.approx(3.012346, abs=1e-6)
    assert main(base + ["--epsilon", "0.5"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["sigma2"] == pytest.approx(0.114814, abs=1e-6)
    assert max(out["epsilon"]) == pytest.approx(0.5)
    assert main(base[:-1] + ["--sigma2", "1"]) == 0
    assert "0.193792" in capsys.readouterr().out


def _naive_sigma(alg, senders, node):
    """σ of ``node``'s release at its worst receiver when only ``senders`` transmit (eq. 10 by
    hand: every receiver other than the node hears the senders other than itself)."""
    plan = alg.plan(ROUND)
    al, g = plan.channel.alignment, plan.channel.gains
    b = g**2 * al.beta * al.power_w * plan.sigma2
    if alg.scheme == "ota_central":
        return np.sqrt((sum(b[k] for k in senders) + alg.radio.noise_power_w) / al.c**2)
    noise = [sum(b[k] for k in senders if k != i) + alg.radio.noise_power_w for i in range(N) if i != node]
    return np.sqrt(min(noise) / al.c**2)


@pytest.mark.parametrize("scheme", ["ota_d2d", "ota_central", "orthogonal_d2d"])
def test_silent_senders_are_charged_what_the_receivers_really_heard(scheme):
    """The plan assumes every expected node transmits; the server step charges each real sender
    the difference, so planned plus correction compose to eq. (10) over the senders heard (never
    less). Orthogonal slots do not depend on the others: nothing to correct."""
    from testbed.algorithms.contract import NodeResult
    from testbed.privacy.accountants import epsilon, tally_of

    alg = _alg(scheme=scheme, variant="B", init="common")
    state = alg.init_state(MODEL.init(None))
    ctx = RoundContext.everyone(ROUND, SEED, N).closed([0, 2, 3, 5])  # 1 and 4 fell silent
    events = alg.server_step(state, NodeResult((), {}), ctx).events
    if scheme == "orthogonal_d2d":
        assert events == []
        return
    assert sorted(e.node for e in events) == [0, 2, 3, 5]
    for e in events:
        assert (e.issuer, e.observer, e.round, e.sensitivity) == ("server", "peers", ROUND, alg.sensitivity)
        planned = [p for p in alg.planned_events(e.node, RoundContext.everyone(ROUND, SEED, N)) if p.kind == "privacy"]
        heard = _naive_sigma(alg, [0, 2, 3, 5], e.node)
        assert planned[0].sigma > heard  # fewer senders, less noise
        combined = epsilon("zcdp", tally_of(planned + [e]), 1e-5)
        truth = epsilon("zcdp", tally_of([dataclasses.replace(planned[0], sigma=heard)]), 1e-5)
        assert combined == pytest.approx(truth, rel=1e-9)
        assert combined >= truth * (1 - 1e-12)
