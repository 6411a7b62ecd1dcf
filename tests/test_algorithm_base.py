"""The algorithm base (testbed.algorithms.base): its defaults, its Gaussian release, the one batch
check every algorithm's build calls, and a tiny algorithm written here on the base that runs in
sim through the registry."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
import pytest
from hypothesis import given, strategies as st

from testbed.algorithms import registry
from testbed.algorithms.base import BaseAlgorithm, RoundCost, gaussian_release, released_events
from testbed.algorithms.batches import check_batches, uniform_batches
from testbed.algorithms.contract import RoundContext, ServerResult, check_tensors
from testbed.algorithms.registry import Registration
from testbed.assembly import assemble
from testbed.checked.sections import Positive, Section
from testbed.data.federated import Split
from testbed.errors import ConfigError
from testbed.learning.models import LogisticRegression
from testbed.ledger.events import GaussianEvent
from testbed.ledger.files import read_ledger
from testbed.streams.rng import Purpose, stream


class TinySection(Section):
    rounds: Positive[int] = 3
    batch: Positive[int] = 4
    lr: Positive[float] = 0.5


class Tiny(BaseAlgorithm):
    """FedSGD on the base: one mini-batch gradient step a round, then the plain mean."""

    local_steps = 1

    def __init__(self, model, rounds: int, batch: int, lr: float):
        self.model, self.rounds_planned, self.batch, self.lr = model, rounds, batch, lr

    def node_step(self, received, train, node_ids, ctx):
        ids = tuple(int(n) for n in node_ids)
        idx = uniform_batches(train, ids, ctx.round_index, ctx.seed, 1, self.batch)[:, 0]
        _, grad = self.model.loss_and_grad(received["model"], train.x[idx], train.y[idx],
                                           np.full(idx.shape, 1.0 / self.batch))
        return self.result(ids, {"update": received["model"] - self.lr * grad}, train, ctx)

    def server_step(self, state, result, ctx):
        return ServerResult({"model": result.tensors["update"].mean(axis=0)} if result.node_ids else state)

    def describe(self) -> dict[str, Any]:
        return {"lr": self.lr}


def _build_tiny(sections, ctx):
    a = sections["tiny"]
    check_batches("tiny", ctx.data.train, ctx.data.node_ids, 1, a.batch, "batch")
    return Tiny(ctx.model, a.rounds, a.batch, a.lr)


TINY = Registration(name="tiny", sections={"tiny": TinySection}, build=_build_tiny)


@pytest.fixture
def tiny_registered(monkeypatch):
    """The registry with the tiny algorithm in it (the config's section caches rebuilt around it)."""
    from testbed.assembly import config as config_module

    config_module._section_classes.cache_clear()
    config_module._config_model.cache_clear()
    monkeypatch.setitem(registry.registrations(), "tiny", TINY)
    yield
    monkeypatch.undo()
    config_module._section_classes.cache_clear()
    config_module._config_model.cache_clear()


# ----------------------------------------------------------------------------- the base's defaults

def test_the_base_defaults_are_one_broadcast_model_of_the_models_size():
    alg = Tiny(LogisticRegression(3, 2), rounds=4, batch=5, lr=0.1)
    p = alg.model.num_params
    state = alg.init_state(np.arange(p, dtype=float))
    ctx = RoundContext.everyone(2, 1, 3)
    down = alg.downlink(state, ctx, (0, 2))
    assert (alg.rounds, alg.flops_per_step, alg.has_setup) == (4, 6.0 * 5 * p, False)
    assert alg.state_spec()["model"].shape == (p,) and not alg.downlink_spec()["model"].per_node
    assert down["model"].shape == (2, p) and not down["model"].flags.writeable
    assert np.array_equal(alg.eval_params(state), np.arange(p))
    assert list(alg.metric_spec()) == ["samples"]
    assert [(e.kind, e.round) for e in alg.planned_events(1, ctx)] == [("compute", 2), ("communication", 2)]
    assert alg.planned_events(1, ctx)[1].bytes_up == alg.planned_events(1, ctx)[1].bytes_down == 8 * p


@given(steps=st.integers(0, 50), up=st.integers(0, 10**6), down=st.integers(0, 10**6),
       c2=st.floats(0, 100), c1=st.floats(0, 100), sigma=st.floats(0.01, 10), nodes=st.integers(1, 6),
       r=st.integers(0, 99), uniform=st.booleans())
def test_planned_events_from_the_rule_are_what_a_node_step_reports(steps, up, down, c2, c1, sigma, nodes, r, uniform):
    """Any round cost and release: the events of :func:`released_events` (what a step made) are
    the plan of every node, and the plan is its round cost's events then its releases, whether
    planned once for all or gathered node by node."""

    class Ruled(Tiny):
        uniform_plans = uniform

        def round_cost(self, node, ctx):
            return RoundCost(steps, bytes_up=up, bytes_down=down, step_cost_units=c2, round_cost_units=c1)

        def release(self, node, round_index):
            return GaussianEvent(node, round_index, sigma, 0.5 if uniform else 1.0 / (node + 1), 1)

        def releases(self, node, ctx):
            return [self.release(node, ctx.round_index)]

    alg = Ruled(LogisticRegression(2, 2), rounds=100, batch=2, lr=0.1)
    ids = tuple(range(0, 2 * nodes, 2))
    ctx = RoundContext(r, 3, 2 * nodes, ids)
    _, events = gaussian_release(np.zeros((nodes, 3)), ids, ctx, lambda n: alg.release(n, r))
    made = released_events(alg, ids, ctx, dict(zip(ids, events)))
    plans = [alg.planned_events(n, ctx) for n in ids]
    assert list(made) == list(alg.planned_batch(ids, ctx)) == plans
    compute, communication, privacy = plans[0]
    assert (compute.local_steps, compute.cost_units) == (steps, c2 * steps)
    assert (communication.bytes_up, communication.bytes_down, communication.cost_units) == (up, down, c1)
    assert privacy == alg.release(ids[0], r)


def test_planned_batch_of_no_nodes_is_empty():
    alg = Tiny(LogisticRegression(2, 2), rounds=1, batch=2, lr=0.1)
    assert len(alg.planned_batch((), RoundContext(0, 0, 2, ()))) == 0


# ----------------------------------------------------------------------------- the Gaussian release

@given(sigma=st.floats(0.0, 50.0), nodes=st.lists(st.integers(0, 10_000), min_size=1, max_size=5, unique=True),
       shape=st.lists(st.integers(1, 6), min_size=0, max_size=2), clip=st.floats(0.0, 10.0),
       r=st.integers(0, 1000), seed=st.integers(0, 2**31))
def test_the_release_event_is_the_noise_it_added(sigma, nodes, shape, clip, r, seed):
    """Each node's row gains exactly σ times its own stream's normals, and its event says that σ
    (with the mechanism's clip norm), for that node and round: never noise without its event."""
    ctx = RoundContext(r, seed, 10_001, tuple(sorted(nodes)))
    values = np.zeros((len(nodes), *shape))
    out, events = gaussian_release(values, nodes, ctx,
                                   lambda n: GaussianEvent(n, r, sigma, 2.0 * clip, 1, clip_norm=clip))
    assert out is values  # in place: no un-noised copy is left to release
    assert [(e.node, e.round, e.sigma, e.clip_norm, e.count) for e in events] == [(n, r, sigma, clip, 1) for n in nodes]
    for i, node in enumerate(nodes):
        z = stream(seed, node, r, Purpose.NOISE).standard_normal(tuple(shape))
        np.testing.assert_array_equal(out[i], sigma * z)


@given(sigmas=st.lists(st.floats(0.1, 5.0), min_size=2, max_size=4), offset=st.floats(-10, 10))
def test_each_node_is_noised_at_its_own_events_sigma(sigmas, offset):
    """Per-node σ (a mechanism whose σ depends on the node): the noise is σ_i Z_i on top of the row."""
    nodes = list(range(len(sigmas)))
    ctx = RoundContext.everyone(1, 9, len(nodes))
    out, events = gaussian_release(np.full((len(nodes), 7), offset), nodes, ctx,
                                   lambda n: GaussianEvent(n, 1, sigmas[n], 1.0, 1), purpose=Purpose.SCORE)
    for i, event in enumerate(events):
        z = stream(9, i, 1, Purpose.SCORE).standard_normal(7)
        np.testing.assert_allclose(out[i] - offset, event.sigma * z, rtol=1e-12, atol=1e-12)


def test_a_release_of_no_nodes_adds_nothing_and_charges_nothing():
    """A round in which no node held here is due (PADPFL's spread participation on a board)."""
    values = np.zeros((0, 4))
    out, events = gaussian_release(values, [], RoundContext.everyone(0, 1, 2), lambda n: GaussianEvent(n, 0, 1.0, 1.0, 1))
    assert out is values and events == []


@pytest.mark.parametrize("wrong", [
    {"node": 5}, {"round": 1}, {"count": 2}, {"issuer": "server"},
])
def test_a_release_charged_as_another_nodes_round_or_mechanism_is_refused(wrong):
    ctx = RoundContext.everyone(0, 1, 3)
    fields = {"round": 0, "sigma": 1.0, "sensitivity": 1.0, "count": 1} | {k: v for k, v in wrong.items() if k != "node"}
    values = np.zeros((2, 3))
    with pytest.raises(ValueError, match="release in round 0 charged as"):
        gaussian_release(values, [0, 1], ctx, lambda n: GaussianEvent(wrong.get("node", n), **fields))
    assert not values.any()  # refused before any noise was drawn


# ----------------------------------------------------------------------------- the batch check

def test_the_batch_check_names_the_node_id_not_its_row():
    """Rows 0..2 hold nodes 7, 3, 9 (a board, a sampled subset): node 3 is too small."""
    train = Split(x=np.zeros((22, 2)), y=np.zeros(22, dtype=np.int64), offsets=np.array([0, 10, 14, 22]))
    with pytest.raises(ConfigError, match=r"x\.batch: 5 is larger than node 3's 4 training samples$"):
        check_batches("x", train, (7, 3, 9), 2, 5, "local_steps")
    check_batches("x", train, (7, 3, 9), 2, 4, "local_steps")  # fits every node


@pytest.mark.parametrize(("algorithm", "section", "held"), [
    ("dwfl", {"dwfl": {"batch": 500, "fading": "none"}}, [3]),
    ("dwfl", {"dwfl": {"batch": 500, "fading": "none"}}, [4, 1]),
    ("fedavg", {"fedavg": {"batch": 500}}, [2, 4]),
    ("padpfl", {"padpfl": {"batch": 500}}, [1]),
    ("dp_pasgd", {"dp_pasgd": {"batch": 500, "tau": 5, "steps": 10}}, [3, 0]),
])
def test_every_build_refuses_a_batch_naming_the_node_it_holds(algorithm, section, held):
    """What a board (one node) or a subset holds: the refusal names the node's global id."""
    from testbed.assembly.config import load_config_text, replace
    from testbed.orchestration.runner import load

    config = replace(load_config_text(f'[run]\nalgorithm = "{algorithm}"\n[data]\ndataset = "synthetic"\n'
                                      'num_nodes = 5\nsamples_per_node = 40\ndim = 3\n'), **section)
    data, model = load(config)
    with pytest.raises(ConfigError, match=rf"config error: {algorithm}\.batch: 500 is larger than node {held[0]}'s"):
        assemble.build_algorithm(config, model, data.select(held))


# ----------------------------------------------------------------------------- a tiny algorithm on the base

@pytest.mark.parametrize("rounds", [2, 4])
def test_a_tiny_algorithm_on_the_base_runs_in_sim_through_the_registry(tiny_registered, tmp_path, rounds):
    from testbed.assembly.config import load_config_text
    from testbed.orchestration.runner import load, run_experiment

    config = load_config_text('[run]\nalgorithm = "tiny"\nseed = 3\n[output]\nfigures = false\n'
                              '[privacy]\ntight_accountant = "none"\n[data]\ndataset = "synthetic"\nnum_nodes = 4\n'
                              f'samples_per_node = 30\ndim = 3\n[tiny]\nrounds = {rounds}\nbatch = 6\n')
    result = run_experiment(config, out_dir=tmp_path / "r", quiet=True)
    assert (result.summary["status"], result.summary["rounds"]) == ("completed", rounds)
    ledger = list(read_ledger(tmp_path / "r" / "ledger.csv"))
    p = load(config)[1].num_params
    comms = [e for e in ledger if e.kind == "communication"]
    assert len(comms) == 4 * rounds and {(e.bytes_up, e.bytes_down) for e in comms} == {(8 * p, 8 * p)}
    assert sorted({e.round for e in ledger}) == list(range(rounds))
    data, model = load(config)  # the contract, one round by hand: planned = emitted, uploads within their spec
    alg = assemble.build_algorithm(config, model, data)
    ctx = RoundContext.everyone(0, 3, 4)
    state = alg.init_state(model.init(np.random.default_rng(0)))
    out = alg.node_step(alg.downlink(state, ctx, ctx.expected), data.train, ctx.expected, ctx)
    assert list(out.events) == [alg.planned_events(m, ctx) for m in ctx.expected]
    assert all(check_tensors(alg.uplink_spec(), out.rows(m), {"model": state["model"]}) is None for m in ctx.expected)


def test_a_tiny_algorithm_on_the_base_is_refused_a_batch_larger_than_a_node(tiny_registered):
    from testbed.assembly.config import load_config_text
    from testbed.orchestration.runner import load

    config = load_config_text('[run]\nalgorithm = "tiny"\n[data]\ndataset = "synthetic"\nnum_nodes = 3\n'
                              'samples_per_node = 10\ndim = 2\n[tiny]\nbatch = 11\n')
    data, model = load(config)
    with pytest.raises(ConfigError, match=r"config error: tiny\.batch: 11 is larger than node 2's"):
        assemble.build_algorithm(config, model, data.select([2]))


@pytest.mark.parametrize("impact", ["given", "quality_score"])
@pytest.mark.parametrize("held", [[0, 1, 2, 3], [1], [2, 3]])
def test_padpfl_releases_only_for_nodes_due_and_charges_what_it_released(impact, held):
    """Spread participation: in each round a node not due uploads zeros and is charged nothing but
    its download; a due one is noised at σ_C (and its score at σ_q) with exactly those events,
    whichever nodes this process holds (all, or a board's one, or none due)."""
    from testbed.algorithms.impact import ImpactSchedule
    from testbed.algorithms.padpfl import Padpfl
    from testbed.data.synthetic import make_logistic

    data = make_logistic(num_nodes=4, samples_per_node=40, dim=3, seed=0)
    alg = Padpfl(LogisticRegression(3, 2), schedule=ImpactSchedule([(0, np.full(4, 0.25))]), rounds=4, uploads=1,
                 participation="spread", local_steps=2, batch=4, lr=0.1, mu=0.1, clip=1.0, epsilon=5.0, delta=1e-3,
                 min_samples=32, train_sizes=data.train.sizes, num_nodes=4, impact=impact,
                 score_sigma=0.1 if impact == "quality_score" else None)
    state = alg.init_state(np.zeros(alg.model.num_params))
    seen_due = set()
    for r in range(4):
        ctx = RoundContext(r, 5, 4, tuple(held))
        out = alg.node_step(alg.downlink(state, ctx, held), data.train.select(held), held, ctx)
        assert list(out.events) == [alg.planned_events(m, ctx) for m in held]
        for i, node in enumerate(held):
            due = bool(alg.uploads_in([node], r)[0])
            seen_due |= {node} if due else set()
            kinds = [e.kind for e in out.events[i]]
            assert kinds == ["compute", "communication"] + (["privacy"] * (2 if impact == "quality_score" else 1)
                                                            if due else [])
            assert out.tensors["update"][i].any() == due
    assert seen_due == set(held)  # R = 1 of T = 4: every node is due exactly once


def _metric_problem_reference(spec, value):
    """MetricSpec.problem's rule written out: a float or an int that is a finite float64 (numpy's
    isfinite for a float; for an int, whether it is within float64's range, where numpy's isfinite
    raised past 2**63), then the spec's range and wholeness."""
    if value.__class__ not in (int, float):
        return f"value {value!r:.40} is not a finite number"
    finite = abs(value) <= sys.float_info.max if value.__class__ is int else bool(np.isfinite(value))
    if not finite:
        return f"value {value!r:.40} is not a finite number"
    return spec.problem(value)


@given(value=st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(-2**70, 2**70), st.booleans(),
                       st.none(), st.text(max_size=3),
                       st.sampled_from([10**400, -10**400, 2**63, 2**1024, 1e308, float("nan"), float("inf"),
                                        -float("inf")])),
       low=st.sampled_from([0.0, 1.0, -1e300]), high=st.sampled_from([1.0, 600.0, float("inf")]),
       integer=st.booleans())
def test_a_metric_is_refused_as_it_was_when_its_finiteness_skips_numpy(value, low, high, integer):
    """A reply's metric checked with math's isfinite for a float (numpy's scalar call is the
    costly part of the check on the coordinator's path): the reference's problem for every value a
    reply can carry, and never an error (an int past float64 was a TypeError from numpy: a
    traceback on the coordinator; tests/test_trust_big_numbers.py)."""
    from testbed.algorithms.contract import MetricSpec

    spec = MetricSpec(low=low, high=high, integer=integer)
    assert spec.problem(value) == _metric_problem_reference(spec, value)
