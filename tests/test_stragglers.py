"""Emulated stragglers: rates, independence per node, determinism, the deadline model, config errors."""

import math

import numpy as np
import pytest
from pydantic import ValidationError

from nodes.meters.clock import comm_cost
from nodes.stragglers import REFERENCE_HOST_FLOPS_PER_S, modelled_round_time_s
from testbed.devices.profiles import load_profile
from testbed.rounds.stragglers import StragglersSection, draw_stragglers

BERNOULLI = StragglersSection(model="bernoulli", p=0.2)


def test_bernoulli_rate_within_binomial_tolerance():
    nodes, rounds = 200, 50
    count = sum(len(draw_stragglers(BERNOULLI, seed=1, round_index=r, node_ids=range(nodes))) for r in range(rounds))
    n, p = nodes * rounds, BERNOULLI.p
    assert abs(count - n * p) < 4 * math.sqrt(n * p * (1 - p))


def test_a_nodes_draw_does_not_depend_on_the_others():
    for r in range(30):
        everyone = draw_stragglers(BERNOULLI, seed=2, round_index=r, node_ids=range(10))
        for node in (0, 3, 9):
            alone = draw_stragglers(BERNOULLI, seed=2, round_index=r, node_ids=[node])
            assert alone == ({node} & everyone)
    deadline = StragglersSection(model="deadline", deadline_s=1.0, jitter_sigma=0.5)
    times = np.linspace(0.5, 1.5, 10)
    everyone = draw_stragglers(deadline, seed=2, round_index=4, node_ids=range(10), round_time_s=times)
    for node in range(10):
        alone = draw_stragglers(deadline, seed=2, round_index=4, node_ids=[node], round_time_s=times[[node]])
        assert alone == ({node} & everyone)


def test_same_seed_same_stragglers_other_seed_other_ones():
    draws = lambda seed: [draw_stragglers(BERNOULLI, seed=seed, round_index=r, node_ids=range(50)) for r in range(5)]  # noqa: E731
    assert draws(7) == draws(7)
    assert draws(7) != draws(8)
    # rounds differ too
    assert len(set(draws(7))) > 1


def test_none_draws_nothing():
    assert draw_stragglers(StragglersSection(), seed=0, round_index=0, node_ids=range(100)) == frozenset()


def test_deadline_without_jitter_is_the_modelled_time():
    section = StragglersSection(model="deadline", deadline_s=1.0, jitter_sigma=0.0)
    times = np.array([0.2, 1.0, 1.0000001, 3.0, 0.999])
    ids = [10, 11, 12, 13, 14]
    assert draw_stragglers(section, seed=0, round_index=0, node_ids=ids, round_time_s=times) == {12, 13}


def test_deadline_jitter_spreads_and_has_mean_one():
    section = StragglersSection(model="deadline", deadline_s=1.0, jitter_sigma=0.3)
    nodes = 2000
    # Every node's modelled time exactly at the deadline: the jitter alone decides, P(exp(σz − σ²/2) > 1)
    # = P(z > σ/2) (mean-one jitter: slightly fewer than half straggle).
    hits = draw_stragglers(section, seed=3, round_index=0, node_ids=range(nodes), round_time_s=np.ones(nodes))
    from statistics import NormalDist

    expected = 1 - NormalDist().cdf(0.15)
    assert abs(len(hits) / nodes - expected) < 4 * math.sqrt(expected * (1 - expected) / nodes)
    # Far from the deadline the jitter rarely matters.
    quick = draw_stragglers(section, seed=3, round_index=0, node_ids=range(nodes), round_time_s=np.full(nodes, 0.2))
    assert len(quick) == 0


def test_deadline_needs_round_times():
    section = StragglersSection(model="deadline", deadline_s=1.0)
    with pytest.raises(ValueError, match="round_time_s"):
        draw_stragglers(section, seed=0, round_index=0, node_ids=[0, 1])
    with pytest.raises(ValueError, match="round_time_s"):
        draw_stragglers(section, seed=0, round_index=0, node_ids=[0, 1], round_time_s=np.ones(3))


def test_modelled_round_time_is_compute_plus_airtime():
    pi = load_profile("pi-zero-2w")
    t = modelled_round_time_s(pi, local_steps=5, flops_per_step=2e6, bytes_up=1616, bytes_down=1616)
    compute_s = 5 * 2e6 / REFERENCE_HOST_FLOPS_PER_S * pi.compute_time_factor
    assert t == pytest.approx(compute_s + comm_cost(1616, 1616, pi)[0], rel=1e-12)
    host = modelled_round_time_s(load_profile("host"), local_steps=5, flops_per_step=2e6, bytes_up=1616,
                                 bytes_down=1616)
    assert t > host > 0
    # A link whose airtime the channel model gives (DWFL) keeps it: one owner per cost.
    channel = modelled_round_time_s(pi, local_steps=5, flops_per_step=2e6, bytes_up=1616, bytes_down=1616,
                                    airtime_s=0.25)
    assert channel == pytest.approx(compute_s + 0.25, rel=1e-12)


@pytest.mark.parametrize("fields,field", [
    ({"model": "bernoulli", "p": 1.0}, "p"),
    ({"model": "bernoulli", "p": -0.1}, "p"),
    ({"model": "deadline"}, "deadline_s"),
    ({"model": "deadline", "deadline_s": 0.0}, "deadline_s"),
    ({"model": "deadline", "deadline_s": 1.0, "jitter_sigma": -1.0}, "jitter_sigma"),
    ({"model": "bernoulli", "probability": 0.1}, "probability"),
    ({"model": "late"}, "model"),
])
def test_config_errors_name_the_field(fields, field):
    with pytest.raises(ValidationError) as err:
        StragglersSection(**fields)
    assert field in str(err.value)


def test_section_is_frozen_and_has_a_documented_schema():
    schema = StragglersSection.model_json_schema()
    assert set(schema["properties"]) == {"model", "p", "deadline_s", "jitter_sigma"}
    assert all(prop.get("description") for prop in schema["properties"].values())
    with pytest.raises(ValidationError):
        BERNOULLI.p = 0.5


def test_draws_in_blocks_of_rounds_are_the_per_round_draws():
    from testbed.rounds.stragglers import StragglerDraws

    section = StragglersSection(model="bernoulli", p=0.3)
    every = list(range(40))
    draws = StragglerDraws(section, seed=5)
    for r in range(150):  # past two block boundaries; a sampled list (another object) in between
        ids = every if r % 7 else [3, 9, 27]
        assert draws.draw(r, ids) == draw_stragglers(section, seed=5, round_index=r, node_ids=ids)
    many = list(range(StragglerDraws.MAX_DRAWS // 2 + 1))  # a block of a single round
    assert draws.draw(3, many) == draw_stragglers(section, seed=5, round_index=3, node_ids=many)
    assert draws._straggles.shape == (1, len(many))
