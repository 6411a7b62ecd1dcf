"""Robust aggregation (testbed.algorithms.aggregate; docs/robust-aggregation.md): each rule on a
hand-computed example; properties over generated rows with hostile rows anywhere (Hypothesis);
the config's checks; the benchmark run tiny; and an end-to-end sim run of every algorithm whose
server averages updates, with a robust rule set."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import assume, given, strategies as st
from hypothesis.extra.numpy import arrays

from testbed.assembly import assemble

from testbed.algorithms.aggregate import Aggregation
from testbed.algorithms.aggregations import registry as rules
from testbed.algorithms.aggregations.krum import krum_scores
from testbed.assembly.config import replace
from testbed.errors import ConfigError
from testbed.orchestration.runner import load, run_experiment
from testbed.reports.results import read_checkpoint

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import robust_aggregation as bench  # noqa: E402
from test_algorithm_contract import _config, _ledger_without_seconds  # noqa: E402  (the contract suite's)

#: The averaging algorithms (ACFL sums coded gradients into an unbiased estimate and DWFL has no
#: server average: docs/robust-aggregation.md says why neither takes a rule).
AVERAGING = ("dp_pasgd", "fedavg", "padpfl")
#: The built-in rules, in their listed order (a plugin's may follow).
BUILT_IN = ("mean", "norm_clip", "centred_clip", "trimmed_mean", "median", "krum", "multi_krum")
ROBUST = BUILT_IN[1:]

# ----------------------------------------------------------------------------- hand-computed

#: Krum's five points in 2-D: four close together and one far (E).
A, B, C, D, E = [0.0, 0.0], [1.0, 0.0], [0.0, 2.0], [1.0, 1.0], [10.0, 10.0]
FIVE = np.array([A, B, C, D, E])


def test_every_rule_is_registered_and_an_unknown_one_is_refused():
    assert rules.names()[:len(BUILT_IN)] == list(BUILT_IN)
    assert [r for r in BUILT_IN if rules.get(r).uses_weights] == ["mean", "norm_clip", "centred_clip"]
    with pytest.raises(ValueError, match="no aggregation rule 'zz-not-a-rule-9q'"):
        Aggregation("zz-not-a-rule-9q")


def test_the_mean_is_the_papers_weighted_mean_bit_for_bit():
    u = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    w = np.array([0.5, 0.25, 0.25])
    assert Aggregation().combine(u, w).tolist() == [2.5, 3.5]
    assert Aggregation().combine(u).tolist() == [3.0, 4.0]
    assert Aggregation().is_mean and not Aggregation("norm_clip").is_mean


def test_norm_clip_clips_changes_at_a_multiple_of_their_median_then_takes_the_weighted_mean():
    c = np.array([1.0, 1.0])
    changes = np.array([[3.0, 4.0], [0.0, 1.0], [0.0, -2.0], [6.0, 8.0]])  # norms 5, 1, 2, 10: median 3.5
    rule = Aggregation("norm_clip", clip_multiple=2.0)  # bound 7: only the last is clipped, to [4.2, 5.6]
    np.testing.assert_allclose(rule.combine(c + changes, reference=c), c + [1.8, 2.15], rtol=0, atol=1e-15)
    # Weighted, robustness comes before the weights: each weight capped at their median (0.25) and
    # renormalised, [0.125, 0.25, 0.3125, 0.3125]; each row's pull w_k ||change|| bounded by bound/M,
    # a radius of 7 min(1, 1/(4 w)): 5.6 for the last, clipped to [3.36, 4.48].
    w = np.array([0.1, 0.2, 0.3, 0.4])
    np.testing.assert_allclose(rule.combine(c + changes, w, reference=c), c + [1.425, 1.525], rtol=0, atol=1e-14)
    # Without a reference the rows are the changes themselves.
    np.testing.assert_allclose(rule.combine(changes), [1.8, 2.15], rtol=0, atol=1e-15)
    # Every change 0 (a median of 0): nothing moves, no division by zero.
    assert Aggregation("norm_clip").combine(np.tile(c, (3, 1)), reference=c).tolist() == c.tolist()


def test_trimmed_mean_and_median_per_coordinate():
    u = np.array([[1.0, -50.0], [2.0, 0.0], [3.0, 1.0], [4.0, 2.0], [100.0, 3.0]])
    assert Aggregation("trimmed_mean", trim_fraction=0.2).combine(u).tolist() == [3.0, 1.0]
    assert Aggregation("trimmed_mean", trim_fraction=0.19).combine(u).tolist() == u.mean(axis=0).tolist()  # k = 0
    assert Aggregation("median").combine(u).tolist() == [3.0, 1.0]
    assert Aggregation("median").combine(np.array([[1.0], [2.0], [10.0], [20.0]])).tolist() == [6.0]


@pytest.mark.parametrize("reference", [None, np.array([5.0, -3.0])])
def test_krum_on_five_points_in_2d(reference):
    # f = 1, k = n − f − 2 = 2 nearest. Squared distances: A–B 1, A–D 2, B–D 1, C–D 2, A–C 4, B–C 5,
    # and E at 162 (D), 164 (C), 181 (B), 200 (A): scores A 1+2, B 1+1, C 2+4, D 1+2, E 162+164.
    assert krum_scores(FIVE, 1, reference).tolist() == [3.0, 2.0, 6.0, 3.0, 326.0]
    assert Aggregation("krum", byzantine_f=1).combine(FIVE, reference=reference).tolist() == B
    # multi-Krum averages the m best: m = n − f = 4 leaves E out; m = 3 takes B, A and D.
    assert Aggregation("multi_krum", byzantine_f=1).combine(FIVE, reference=reference).tolist() == [0.5, 0.75]
    np.testing.assert_allclose(Aggregation("multi_krum", byzantine_f=1, krum_select=3).combine(FIVE, reference=reference),
                               [2 / 3, 1 / 3], rtol=0, atol=1e-15)


def test_krum_counts_an_overflowing_distance_as_infinite_and_takes_one_row_alone():
    rows = np.vstack([FIVE[:4], [[1e200, -1e200]], [[1e200, 1e200]]])  # two rows whose distances overflow
    # n = 6, k = 3: A 1+2+4, B 1+1+5, C 2+4+5, D 2+1+2 over the four finite points; the others inf.
    assert Aggregation("krum", byzantine_f=1).combine(rows, reference=np.zeros(2)).tolist() == D
    assert Aggregation("krum").combine(np.array([[7.0, 8.0]])).tolist() == [7.0, 8.0]


def test_weights_do_not_steer_the_unweighted_rules():
    w = np.array([0.96, 0.01, 0.01, 0.01, 0.01])  # all the weight on the far point E, first
    rows = FIVE[[4, 0, 1, 2, 3]]
    for rule in ("trimmed_mean", "median", "krum", "multi_krum"):
        agg = Aggregation(rule, trim_fraction=0.2, byzantine_f=1)
        assert agg.combine(rows, w).tolist() == agg.combine(rows).tolist(), rule


# ----------------------------------------------------------------------------- properties

def _rows(min_rows: int = 3, max_rows: int = 12, scale: float = 1e3):
    """(M, P) finite rows, M in [min_rows, max_rows], P in [1, 4]."""
    return st.tuples(st.integers(min_rows, max_rows), st.integers(1, 4)).flatmap(
        lambda shape: arrays(np.float64, shape, elements=st.floats(-scale, scale, allow_subnormal=False)))


@st.composite
def _attacked(draw, min_honest_over_f: int = 1):
    """(honest (H, P), hostile (f, P), order): f hostile rows of any values up to 1e6, H >= f +
    ``min_honest_over_f``, the rows interleaved by ``order``."""
    honest = draw(_rows(min_rows=2, max_rows=10))
    f = draw(st.integers(0, max(0, honest.shape[0] - min_honest_over_f)))
    hostile = draw(arrays(np.float64, (f, honest.shape[1]), elements=st.floats(-1e6, 1e6, allow_subnormal=False)))
    order = draw(st.permutations(range(honest.shape[0] + f)))
    return honest, hostile, np.asarray(order, dtype=np.int64)


def _mixed(honest: np.ndarray, hostile: np.ndarray, order: np.ndarray) -> np.ndarray:
    return np.vstack([honest, hostile])[order]


@given(rows=_rows(), data=st.data())
def test_every_rule_ignores_the_order_of_the_nodes(rows, data):
    m = rows.shape[0]
    perm = np.asarray(data.draw(st.permutations(range(m))), dtype=np.int64)
    w = data.draw(arrays(np.float64, m, elements=st.floats(0.01, 1.0)))
    w /= w.sum()
    reference = rows[0] * 0.5
    scores = np.sort(krum_scores(rows, 1, reference))
    for rule in BUILT_IN:
        agg = Aggregation(rule, trim_fraction=0.2, byzantine_f=1)
        if rule == "krum":  # a tie for the best score is broken by position
            assume(scores[1] - scores[0] > 1e-9 * (1.0 + scores[1]))
        if rule == "multi_krum":
            assume(scores[m - 1] - scores[m - 2] > 1e-9 * (1.0 + scores[m - 1]))  # m − f = M − 1 best
        np.testing.assert_allclose(agg.combine(rows[perm], w[perm], reference), agg.combine(rows, w, reference),
                                   rtol=1e-12, atol=1e-9, err_msg=rule)


@given(case=_attacked())
def test_the_median_stays_within_the_honest_rows_range_with_fewer_hostile_rows(case):
    honest, hostile, order = case
    out = Aggregation("median").combine(_mixed(honest, hostile, order))
    assert (honest.min(axis=0) <= out).all() and (out <= honest.max(axis=0)).all()


@given(case=_attacked(min_honest_over_f=2))
def test_the_trimmed_mean_stays_within_the_honest_rows_range_when_it_trims_f(case):
    honest, hostile, order = case
    rows = _mixed(honest, hostile, order)
    n, f = rows.shape[0], hostile.shape[0]
    out = Aggregation("trimmed_mean", trim_fraction=(f + 0.5) / n).combine(rows)  # floor(t n) = f, t < 1/2
    slack = 1e-12 * np.abs(honest).max(axis=0)
    assert (honest.min(axis=0) - slack <= out).all() and (out <= honest.max(axis=0) + slack).all()


@given(case=_attacked(), multiple=st.floats(0.5, 4.0))
def test_norm_clip_moves_the_model_at_most_its_multiple_of_the_largest_honest_change(case, multiple):
    honest, hostile, order = case
    reference = honest[0]
    out = Aggregation("norm_clip", clip_multiple=multiple).combine(_mixed(honest, hostile, order), reference=reference)
    largest = np.linalg.norm(honest - reference, axis=1).max()
    # The rule reads distances as sqrt(||u||² − 2 u·c + ||c||²) (no (M, P) copy of the changes): off
    # by up to sqrt(eps)·||c|| where every change is ~0, so the bound it clips to may be that much.
    slack = 4 * multiple * np.sqrt(np.finfo(float).eps) * np.linalg.norm(reference) + 1e-9
    assert np.linalg.norm(out - reference) <= multiple * largest * (1 + 1e-9) + slack


def _krum_case(honest: np.ndarray, hostile: np.ndarray) -> tuple[int, int, float]:
    """(n, k, D): the rows, Krum's neighbours and the honest rows' diameter."""
    n, f = honest.shape[0] + hostile.shape[0], hostile.shape[0]
    diameter = max(np.linalg.norm(a - b) for a in honest for b in honest)
    return n, n - f - 2, diameter


@given(case=_attacked())
def test_krum_picks_a_row_near_an_honest_one_and_multi_krum_stays_near_their_mean(case):
    # A hostile row chosen has a score at most an honest row's, <= k D², and at least one honest
    # row among its k nearest: it lies within sqrt(k) D of an honest row (Blanchard et al.'s
    # argument); multi-Krum's average of such rows is within (1 + sqrt(k)) D of the honest mean.
    honest, hostile, order = case
    n, k, diameter = _krum_case(honest, hostile)
    f = hostile.shape[0]
    assume(f < (n - 2) / 2)
    rows = _mixed(honest, hostile, order)
    chosen = Aggregation("krum", byzantine_f=f).combine(rows, reference=honest[0])
    tolerance = 1e-6 * (1.0 + np.abs(rows).max())
    assert np.linalg.norm(honest - chosen, axis=1).min() <= math.sqrt(k) * diameter + tolerance
    together = Aggregation("multi_krum", byzantine_f=f).combine(rows, reference=honest[0])
    assert np.linalg.norm(together - honest.mean(axis=0)) <= (1 + math.sqrt(k)) * diameter + tolerance


@given(case=_attacked(), gap=st.floats(0.0, 1e3))
def test_krum_picks_an_honest_row_when_the_hostile_ones_lie_apart(case, gap):
    honest, hostile, order = case
    n, k, diameter = _krum_case(honest, hostile)
    f = hostile.shape[0]
    assume(f < (n - 2) / 2)
    hostile = hostile.copy()  # every hostile row more than sqrt(k) D from every honest row
    hostile[:, 0] = honest[:, 0].max() + math.sqrt(k) * diameter + 1.0 + gap + np.abs(hostile[:, 0])
    chosen = Aggregation("krum", byzantine_f=f).combine(_mixed(honest, hostile, order))
    assert any((chosen == row).all() for row in honest)


@given(rows=_rows(min_rows=1), data=st.data())
def test_the_mean_is_unchanged(rows, data):
    w = data.draw(arrays(np.float64, rows.shape[0], elements=st.floats(0.01, 1.0)))
    w /= w.sum()
    assert np.array_equal(Aggregation().combine(rows, w, reference=rows[0]), w @ rows)
    assert np.array_equal(Aggregation().combine(rows), rows.mean(axis=0))


# ----------------------------------------------------------------------------- config

@pytest.mark.parametrize("rule", ["krum", "multi_krum"])
@pytest.mark.parametrize("name", AVERAGING)
def test_krum_with_too_many_hostile_nodes_for_n_is_a_config_error_naming_the_key(name, rule):
    config = _config(name, **{name: {"aggregation": rule, "byzantine_f": 2}})  # N = 5: f < 1.5
    data, model = load(config)
    with pytest.raises(ConfigError, match=rf"^config error: {name}\.byzantine_f: Krum tolerates f < \(N - 2\)/2"):
        assemble.build_algorithm(config, model, data)
    if rule == "multi_krum":
        config = _config(name, **{name: {"aggregation": rule, "krum_select": 6}})
        with pytest.raises(ConfigError, match=rf"^config error: {name}\.krum_select: 6 is more than the 5 nodes"):
            assemble.build_algorithm(config, model, data)
    else:  # Krum keeps one row: krum_select is multi_krum's
        with pytest.raises(ConfigError, match=rf'^config error: {name}\.krum_select: matters only with aggregation = "multi_krum"'):
            _config(name, **{name: {"aggregation": rule, "krum_select": 6}})
    assert assemble.build_algorithm(_config(name, **{name: {"aggregation": rule, "byzantine_f": 1}}), model, data)


def test_acfl_takes_no_aggregation_key():
    with pytest.raises(ConfigError, match="^config error: acfl.aggregation: unknown key"):
        _config("acfl", acfl={"aggregation": "median"})


# ----------------------------------------------------------------------------- the benchmark, tiny

def test_the_benchmark_shows_the_robust_rules_moving_the_model_less_than_the_mean(capsys):
    moved = bench.displacements(n=20, p=30, runs=1)
    for share in bench.SHARES:
        far = {rule: moved[rule, "far", share] for rule in BUILT_IN}
        assert all(far[rule] < far["mean"] for rule in ROBUST), far  # beyond a bound: every rule helps
        bound = {rule: moved[rule, "bound", share] for rule in BUILT_IN}
        assert all(bound[rule] < bound["mean"] for rule in ("trimmed_mean", "median", "multi_krum")), bound
        assert bound["norm_clip"] <= bound["mean"]
        # Krum's whole error is its own (one noisy row): the attack adds nothing to it.
        assert bound["krum"] <= moved["krum", "none", 0.0] * 1.05
    bench.main(["--rules", "--runs", "1", "--nodes", "20", "--params", "30", "--time-nodes", "20", "--time-params", "30"])
    out = capsys.readouterr().out
    assert "bound 30%" in out and all(rule in out for rule in BUILT_IN) and "(  1.0x)" in out


# ----------------------------------------------------------------------------- end to end

@pytest.mark.parametrize("name,rule", [("dp_pasgd", "krum"), ("fedavg", "norm_clip"), ("fedavg", "median"),
                                       ("padpfl", "multi_krum"), ("padpfl", "trimmed_mean")])
def test_a_sim_run_with_a_robust_rule(tmp_path, name, rule):
    keys = {"aggregation": rule, **{"trimmed_mean": {"trim_fraction": 0.2}, "norm_clip": {"clip_multiple": 0.5}}.get(rule, {})}
    robust = run_experiment(_config(name, **{name: keys}), tmp_path / "robust", quiet=True)
    plain = run_experiment(_config(name), tmp_path / "mean", quiet=True)
    assert robust.summary["status"] == plain.summary["status"] == "completed"
    a, b = read_checkpoint(tmp_path / "robust").state["model"], read_checkpoint(tmp_path / "mean").state["model"]
    assert np.isfinite(a).all() and not np.array_equal(a, b)  # the rule was applied
    if name == "padpfl":  # the public sees a post-processing of the uploads: charged the uploads' ε
        for node in robust.summary["nodes"].values():
            by = node["epsilon_by_observer"]
            assert by["public"] == pytest.approx(by["server"], rel=1e-12)
        plain_by = next(iter(plain.summary["nodes"].values()))["epsilon_by_observer"]
        assert plain_by["public"] < plain_by["server"]  # eq. (11)'s mean, with the server's noise


@pytest.mark.slow
@pytest.mark.parametrize("name,rule", [("dp_pasgd", "median"), ("fedavg", "krum"), ("padpfl", "multi_krum")])
def test_sim_equals_mqtt_with_a_robust_rule_and_stragglers(name, rule, tmp_path):
    # Over MQTT the rows arrive in any order and stragglers leave fewer of them: the same model.
    config = _config(name, stragglers={"model": "bernoulli", "p": 0.3}, **{name: {"aggregation": rule}})
    sim = run_experiment(config, out_dir=tmp_path / "sim", quiet=True)
    mqtt = run_experiment(replace(config, run={"mode": "mqtt"}, mqtt={"hosts": 2}), out_dir=tmp_path / "mqtt",
                          quiet=True)
    assert sim.summary["status"] == mqtt.summary["status"] == "completed"
    a, b = read_checkpoint(tmp_path / "sim").state, read_checkpoint(tmp_path / "mqtt").state
    for key in a:
        np.testing.assert_allclose(b[key], a[key], rtol=0, atol=1e-9)
    assert _ledger_without_seconds(tmp_path / "sim") == _ledger_without_seconds(tmp_path / "mqtt")


@pytest.mark.parametrize("rule", ["median", "multi_krum"])
@pytest.mark.parametrize("round_index,hostile", [(0, 0), (2, 4), (5, 0)], ids=["first", "middle", "last"])
def test_one_node_at_the_norm_bound_moves_a_robust_run_less_than_the_mean(rule, round_index, hostile, tmp_path,
                                                                          monkeypatch):
    # DP-PASGD declares how far an honest update lies from θ; node `hostile` sends, in one round,
    # the honest mean's change reversed at just inside that bound. The damage is the distance of
    # the final model from the same run without the attack.
    from testbed.algorithms.dp_pasgd import DpPasgd

    honest_step = DpPasgd.node_step

    def poisoned(self, received, train, node_ids, ctx):
        out = honest_step(self, received, train, node_ids, ctx)
        if ctx.round_index == round_index and hostile in out.node_ids:
            theta, rows = received["model"][0], out.tensors["update"]
            change = rows.mean(axis=0) - theta
            rows[out.node_ids.index(hostile)] = theta - 0.999 * self.update_norm_bound * change / np.linalg.norm(change)
        return out

    def final(name: str, aggregation: str, attacked: bool) -> np.ndarray:
        with monkeypatch.context() as patch:
            if attacked:
                patch.setattr(DpPasgd, "node_step", poisoned)
            run_experiment(_config("dp_pasgd", dp_pasgd={"aggregation": aggregation}), tmp_path / name, quiet=True)
        return read_checkpoint(tmp_path / name).state["model"]

    damage = {agg: np.linalg.norm(final(f"{agg}-attacked", agg, True) - final(f"{agg}-clean", agg, False))
              for agg in ("mean", rule)}
    assert damage[rule] < damage["mean"], damage


def test_run_help_names_each_averaging_algorithms_rule_as_the_docs_table_does():
    from testbed.algorithms import registry
    from testbed.cli import robust_help

    doc = (Path(__file__).resolve().parents[1] / "docs" / "robust-aggregation.md").read_text()
    start = doc.index("| algorithm | rule that holds at 10 % | cost |")
    lines = doc[start:].splitlines()[2:]
    rows = [line.split("|")[1:3] for line in lines[:next(i for i, line in enumerate(lines) if not line.startswith("|"))]]
    table = {name.strip().lower().replace("-", ""): rule.strip().strip("`") for name, rule in rows}
    chosen = {reg.name.replace("_", ""): reg.robust_choice.rule for reg in registry.offering("robust_choice")}
    assert chosen == table
    help_text = robust_help()
    for reg in registry.offering("robust_choice"):
        assert f"  {reg.name:<9} {reg.robust_choice.rule:<18}" in help_text
    # the algorithms that cannot drop a sender recommend nothing
    assert {"acfl", "dwfl"}.isdisjoint(r.name for r in registry.offering("robust_choice"))
