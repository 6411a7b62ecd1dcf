"""Property-based tests of invariants 2 (tensors) and 5 of issue 27: every upload an algorithm
declares carries bounds from public quantities, ``check_tensors`` refuses what lies outside them and
accepts every honest upload, and no self-reported number gives one node more than its capped share
of an aggregation.

Honest uploads come from each algorithm's own setup and node steps on a tiny run (the conformance
suite's experiments, tests/test_algorithm_contract.py), at generated seeds, rounds and models;
mutations replace or scale any entry (by 1e300, −1e300, 1e6, NaN...), the whole tensor, its shape
or its dtype, on any node.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from testbed.algorithms import OverTheAir, RoundContext
from testbed.algorithms.contract import SETUP_ROUND, TensorSpec, check_tensors, round_signal_spec, round_uplink_spec
from testbed.algorithms.impact import cap_shares
from testbed.assembly import assemble
from testbed.assembly.config import load_config_text, replace
from testbed.orchestration.runner import load

from test_algorithm_contract import _text

#: The conformance suite's float64 experiments, and PADPFL with each rule nodes can sway.
CASES = {
    "acfl": {}, "acfl/projection": {"acfl": {"encoding": "projection", "weights": "fixed"}},
    "dp_pasgd": {}, "fedavg": {}, "fedprox": {}, "dwfl": {}, "padpfl": {}, "dpsgd": {}, "gossip": {},
    "dwfl/rayleigh": {"dwfl": {"fading": "rayleigh", "variant": "A"}},
    "dwfl/orthogonal": {"dwfl": {"scheme": "orthogonal_d2d", "fading": "rayleigh"}},
    "dwfl/central": {"dwfl": {"scheme": "ota_central", "fading": "rayleigh"}},
    "padpfl/data_size": {"padpfl": {"impact": "data_size", "weights": None, "uploads": None,
                                    "participation": "every_round"}},
    "padpfl/unclipped": {"padpfl": {"clip": None, "epsilon": None, "uploads": None, "participation": "every_round"}},
    "padpfl/quality_score": {"padpfl": {"impact": "quality_score", "weights": None, "score_sigma": 0.05,
                                        "uploads": None, "participation": "every_round"}},
}
#: Uploads no public quantity bounds.
UNBOUNDED: set[tuple[str, str]] = set()


@functools.lru_cache(maxsize=None)
def built(case: str):
    """(config, data, model, algorithm) of ``case``, built once per test session."""
    base = case.split("/")[0]
    config = load_config_text(_text(base))
    if CASES[case]:
        config = replace(config, **CASES[case])
    data, model = load(config)
    return config, data, model, assemble.build_algorithm(config, model, data)


def uploads(case: str, seed: int, round_index: int, setup: bool):
    """[(spec, node, rows, reference)] of every node's honest upload of ``case``: the setup upload
    (``setup``) or a round's update (and the transmit signal over the air), at ``seed``'s model."""
    config, data, model, alg = built(case)
    n = data.num_nodes
    ids = tuple(range(n))
    if setup:
        ctx = RoundContext(SETUP_ROUND, seed, n, ids)
        out = alg.setup_step(data.train, ids, ctx)
        return [(alg.setup_spec(), m, out.rows(m), None) for m in ids]
    if isinstance(alg, OverTheAir):
        seed = config.run.seed  # the channel is the run's
    rng = np.random.default_rng(seed)
    state = alg.init_state(model.init(rng) * (1 + seed % 7))
    if "models" in state:  # DWFL: every node's own model, apart (a bound must hold for any spread)
        state["models"] = state["models"] + rng.normal(0.0, seed % 3, state["models"].shape)
    ctx = RoundContext.everyone(round_index, seed, n)
    down = alg.downlink(state, ctx, ids)
    out = alg.node_step(down, data.train, ids, ctx)
    sent = [{k: v[m] for k, v in down.items()} for m in ids]
    if isinstance(alg, OverTheAir):
        signal = {"signal": round_signal_spec(alg.channel, state, ctx)}
        closed = ctx.closed(ids)
        heard = alg.channel.superpose(out.tensors["signal"].copy(), alg.channel_tensors(ctx), closed)
        done = alg.node_finish({k: v.copy() for k, v in out.carry.items()}, heard, ids, closed)
        return ([(signal, m, {"signal": out.tensors["signal"][m]}, None) for m in ids]
                + [(round_uplink_spec(alg, state, ctx), m, done.rows(m), sent[m]) for m in ids])
    return [(round_uplink_spec(alg, state, ctx), m, out.rows(m), sent[m]) for m in ids]


def _bounded(case: str, name: str, spec: TensorSpec) -> bool:
    return spec.max_norm is not None or spec.value_range is not None


def refused_by_bounds(spec: TensorSpec, row: np.ndarray, reference: dict | None) -> bool:
    """The bounds' verdict on a finite row of the right shape and dtype, computed here from the
    spec's fields with numpy's own norm (independent of check_tensors' arithmetic)."""
    if spec.value_range is not None:
        low, high = spec.value_range
        slack = 1e-9 * max(abs(low), abs(high))
        if row.min() < low - slack or row.max() > high + slack:
            return True
    if spec.max_norm is None or (spec.relative_to is not None and reference is None):
        return False
    ref = None if spec.relative_to is None else reference[spec.relative_to]
    bound = spec.max_norm + (spec.norm_growth * np.linalg.norm(ref) if ref is not None else 0.0)
    with np.errstate(over="ignore"):
        norm = np.linalg.norm(row - ref if ref is not None and spec.centred else row)
    return not norm <= bound * (1 + 1e-9)


def test_every_upload_of_every_algorithm_declares_a_bound():
    assert {(c, s) for c in CASES for s in (True, False) if s and built(c)[3].has_setup} == \
        {(c, s) for c, s in UPLOADS if s}  # UPLOADS names every setup there is
    for case in CASES:
        alg = built(case)[3]
        state, ctx = alg.init_state(built(case)[2].init(None)), RoundContext.everyone(0, 4, 5)
        specs = dict(round_uplink_spec(alg, state, ctx))  # the round's bounds, from its state
        if alg.has_setup:
            specs |= alg.setup_spec()
        if isinstance(alg, OverTheAir):
            specs["signal"] = round_signal_spec(alg.channel, state, ctx)
        base = case.split("/")[0]
        for name, spec in specs.items():
            assert _bounded(case, name, spec) or (base, name) in UNBOUNDED, (case, name)


#: (case, setup upload or round update) of every upload the cases make.
UPLOADS = [(case, setup) for case in CASES for setup in (True, False)
           if not setup or case.split("/")[0] in ("acfl", "fedavg", "fedprox") or case == "padpfl/data_size"]


@given(upload=st.sampled_from(UPLOADS), seed=st.integers(0, 2**31 - 1), round_index=st.integers(0, 5))
def test_every_honest_upload_is_accepted(upload, seed, round_index):
    case, setup = upload
    for spec, node, rows, reference in uploads(case, seed, round_index, setup):
        assert check_tensors(spec, rows, reference) is None, (case, node, check_tensors(spec, rows, reference))


MUTATIONS = st.one_of(
    st.tuples(st.just("entry"), st.one_of(st.sampled_from([1e300, -1e300, 1e6, -1e6, 1e200]),
                                          st.floats(allow_nan=True, allow_infinity=True))),
    st.tuples(st.just("scale_entry"), st.sampled_from([1e6, -1e6, 1e300, 2.0, 1e-3])),
    st.tuples(st.just("scale_all"), st.sampled_from([1e6, -1e6, 1e300])),
    st.tuples(st.just("shape"), st.integers(1, 10_000)),
    st.tuples(st.just("dtype"), st.sampled_from(["float32", "complex128", "int64"])),
)


def mutate(row: np.ndarray, how: tuple, position: float) -> np.ndarray:
    kind, arg = how
    if kind == "shape":
        return np.concatenate([row.ravel(), np.zeros(arg)])
    if kind == "dtype":
        return row.astype(arg)
    out = np.array(row, dtype=np.float64)
    flat = out.reshape(-1)
    i = min(int(position * flat.size), flat.size - 1)
    with np.errstate(over="ignore", invalid="ignore"):
        if kind == "entry":
            flat[i] = arg
        elif kind == "scale_entry":
            flat[i] *= arg
        else:
            out *= arg
    return out


@given(upload=st.sampled_from(UPLOADS), node=st.sampled_from(["first", "last"]), tensor=st.integers(0, 3),
       position=st.floats(0, 1), how=MUTATIONS)
def test_a_mutated_upload_is_refused_exactly_when_it_leaves_its_declaration(upload, node, tensor, position, how):
    case, setup = upload
    rows_of = uploads(case, 11, 1, setup)
    spec, m, rows, reference = rows_of[0] if node == "first" else rows_of[-1]
    name = sorted(spec)[tensor % len(spec)]
    mutated = dict(rows, **{name: mutate(rows[name], how, position)})
    problem = check_tensors(spec, mutated, reference)
    value = mutated[name]
    base = case.split("/")[0]
    if value.shape != spec[name].shape or value.dtype != np.dtype(spec[name].dtype) or not np.isfinite(value).all():
        assert problem is not None  # malformed: refused whatever the bounds
        return
    expected = refused_by_bounds(spec[name], value, reference)
    assert (problem is not None) == expected, (case, name, how, problem)
    if (base, name) in UNBOUNDED:
        return
    if how[0] == "scale_all" and np.abs(rows[name]).max() > 0:
        assert problem is not None  # a whole upload scaled by 1e6 or more lies far outside
    if how[0] == "entry" and abs(how[1]) >= 1e150:
        assert problem is not None


# ------------------------------------------------------------------ self-reported sizes and scores

SIZE_CASES = ["fedavg", "fedprox", "padpfl/data_size"]
CLAIMS = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-2**70, 2**70).map(float),
                   st.sampled_from([1e9, -150.0, 0.0, 0.5, 1.0, 1e308]))


def _weights_after_setup(case: str, state, answered: tuple[int, ...]) -> np.ndarray:
    """The aggregation weights of the ``answered`` nodes in a round, after the setup gave ``state``."""
    config, data, model, alg = built(case)
    if case in ("fedavg", "fedprox"):
        return alg.shares(state, answered)
    return alg.round_weights(RoundContext.everyone(0, 4, data.num_nodes).closed(answered), state)[list(answered)]


@given(case=st.sampled_from(SIZE_CASES), claim=CLAIMS, node=st.sampled_from(["first", "last"]),
       answered=st.sets(st.integers(0, 4), min_size=1))
def test_a_claimed_size_is_refused_outside_the_partition_and_never_takes_more_than_the_cap(case, claim, node,
                                                                                          answered):
    config, data, model, alg = built(case)
    n = data.num_nodes
    m = 0 if node == "first" else n - 1
    declared = data.train.sizes
    ids = tuple(range(n))
    ctx = RoundContext(SETUP_ROUND, 4, n, ids)
    honest = alg.setup_step(data.train, ids, ctx)
    lie = honest.tensors["samples"].copy()
    lie[m, 0] = claim
    refused = check_tensors(alg.setup_spec(), {"samples": lie[m]}) is not None
    assert refused == (not 1.0 <= claim <= float(declared.max()))  # NaN compares False: refused
    # The setup's intake holds even for a claim that got past the spec (sim: nobody checks the
    # wire): a claim is taken only within the node's partition, a refused one counts as silent.
    result = type(honest)(ids, {"samples": lie})
    state = alg.server_setup(alg.init_state(model.init(None)), result, ctx.closed(ids)).state
    raw = state["sizes"] / state["sizes"].sum() if "sizes" in state else state["weights"]
    j = n - 1 if m == 0 else 0  # an honest node
    assert np.isfinite(raw).all() and (raw > 0).all()
    assert raw[m] / raw[j] <= declared.max() / declared[j] * (1 + 1e-12)
    if 1.0 <= claim <= declared[m]:
        assert raw[m] / raw[j] == pytest.approx(claim / declared[j], rel=1e-12)
    weights = _weights_after_setup(case, state, tuple(sorted(answered)))  # a round with stragglers too
    assert np.isfinite(weights).all() and (weights >= 0).all() and math.isclose(weights.sum(), 1.0, rel_tol=1e-12)
    assert weights.max() <= max(config_cap(config, case), 1.0 / len(answered)) + 1e-12


def config_cap(config, case: str) -> float:
    return getattr(config, case.split("/")[0]).max_weight_share


@given(scores=st.lists(st.floats(-0.5, 1.5), min_size=5, max_size=5),
       answered=st.sets(st.integers(0, 4), min_size=1), liar=st.integers(0, 4))
def test_scores_anywhere_in_their_range_never_give_one_node_more_than_the_cap(scores, answered, liar):
    config, data, model, alg = built("padpfl/quality_score")
    spec = alg.uplink_spec()["score"]
    low, high = spec.value_range
    scores[liar] = high  # the top of the allowed range
    heard = tuple(sorted(answered))
    ctx = RoundContext.everyone(2, 4, 5).closed(heard)
    from testbed.algorithms.contract import NodeResult

    reported = np.array([[scores[n]] for n in heard])
    for n, s in zip(heard, reported):
        assert (spec.problem(s) is None) == (low <= s[0] <= high)
    p = alg.round_weights(ctx, alg.init_state(model.init(None)), NodeResult(heard, {"score": reported}))
    assert math.isclose(p.sum(), 1.0, rel_tol=1e-12) and (p >= 0).all()
    assert p.max() <= max(config.padpfl.max_weight_share, 1.0 / len(heard)) + 1e-12
    assert set(np.flatnonzero(p)) <= set(heard)


@given(p=st.lists(st.floats(0, 1e6), min_size=1, max_size=30), cap=st.floats(0.01, 1.0))
def test_cap_shares_caps_every_share_and_keeps_the_order(p, cap):
    raw = np.array(p)
    weights = raw / raw.sum() if raw.any() else raw
    out = cap_shares(weights, cap)
    if not weights.any():
        assert not out.any()
        return
    k = int((weights > 0).sum())
    assert math.isclose(out.sum(), 1.0, rel_tol=1e-9) and (out >= 0).all()
    assert out.max() <= max(cap, 1.0 / k) * (1 + 1e-9)
    assert ((out > 0) == (weights > 0)).all()
    order = np.argsort(weights, kind="stable")
    assert (np.diff(out[order]) >= -1e-12).all()  # a larger weight never gets a smaller share
    if weights.max() <= cap:
        np.testing.assert_allclose(out, weights, rtol=1e-12)


@pytest.mark.parametrize("case", ["dwfl", "dpsgd", "gossip"])
def test_a_transmit_signal_scaled_past_the_power_constraint_is_refused(case):
    config, data, model, alg = built(case)
    for r in range(3):
        spec, node, rows, _ = uploads(case, 0, r, False)[0]
        assert check_tensors(spec, rows) is None
        assert check_tensors(spec, {"signal": rows["signal"] * 1e6}) is not None
