"""A DWFL sender the alignment leaves inactive (α = β = 0: with ``pathloss = "scene"``, no traced path to
the server point) transmits zeros, so it releases nothing that round: its ledger has no Gaussian event
for it, planned or charged after, in sim and over MQTT, and the other senders' σ is what it was
(DESIGN.md "Ledger and budgets": the ledger charges what happened)."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from testbed.algorithms import RoundContext
from testbed.algorithms.contract import NodeResult
from testbed.algorithms.dwfl import Dwfl
from testbed.algorithms.dwfl_channel import Radio
from testbed.algorithms.dwfl_plan import inactive_senders
from testbed.assembly.config import load_config_text, replace
from testbed.data.synthetic import make_logistic
from testbed.learning.models import LogisticRegression
from testbed.orchestration import contract_suite as suite
from testbed.orchestration.runner import run_experiment
from testbed.privacy.accountants import epsilon, tally_of
from testbed.topology import Topology, TopologySection

from test_algorithm_contract import _text

N, DIM, SEED, ROUND = 6, 4, 7, 1
DATA = make_logistic(num_nodes=N, samples_per_node=30, dim=DIM, seed=0)
MODEL = LogisticRegression(DIM, 2)


def _alg(scheme: str, section: TopologySection, active: list[bool], digital: bool) -> Dwfl:
    """DWFL whose round-ROUND channel is 1 to every sender the mask keeps and 0 to the others (the
    coordinator's h, as a scene with no path to the server point gives it)."""
    radio = Radio(num_nodes=N, power_w=100.0, noise_power_w=0.5, fading="none", c_scale=0.6,
                  digital_orthogonal=digital)
    topology = Topology(section, N, SEED)
    alg = Dwfl(MODEL, radio, rounds=3, batch=8, lr=0.2, averaging_rate=0.5, gmax=1.0, delta=1e-5, sigma2=0.3,
               scheme=scheme, variant="B", seed=SEED, topology=topology)
    alg.accept_channel(ROUND, np.asarray(active, dtype=np.complex128))
    return alg


def _charged(events) -> set[int]:
    return {e.node for node_events in events for e in node_events if e.kind == "privacy"}


PAIRS = [(i, j) for i in range(N) for j in range(i + 1, N)]


@settings(deadline=None)
@given(scheme=st.sampled_from(["ota_d2d", "ota_central", "orthogonal_d2d"]),
       edges=st.none() | st.lists(st.sampled_from(PAIRS), min_size=1, unique=True),
       digital=st.booleans(), active=st.lists(st.booleans(), min_size=N, max_size=N).filter(any),
       answered=st.lists(st.booleans(), min_size=N, max_size=N))
def test_charged_senders_are_the_active_ones_a_receiver_hears(tmp_path_factory, scheme, edges, digital, active,
                                                              answered):
    """Any mask of active senders on the complete graph or any graph (isolated nodes too), any subset
    of them answering: the plan and the node step charge exactly the active senders that have a
    receiver; only the active ones' signals are non-zero and only they spend transmit energy; the
    server's correction charges only charged senders that answered; an inactive sender changes no
    other sender's σ."""
    if edges is None or scheme == "ota_central":  # ota_central needs the complete graph
        section, degrees = TopologySection(), np.full(N, N - 1)
    else:
        path = tmp_path_factory.mktemp("g") / "edges.txt"
        path.write_text("".join(f"{i} {j}\n" for i, j in edges))
        section = TopologySection(kind="file", path=str(path), allow_disconnected=True)
        degrees = np.bincount(np.asarray(edges).ravel(), minlength=N)
    alg = _alg(scheme, section, active, digital)
    plan = alg.plan(ROUND)
    assert inactive_senders(plan.tx).tolist() == [not a for a in active]
    assert [bool(e > 0) for e in plan.energy_j] == list(active)  # no transmit energy for zeros
    ctx = RoundContext.everyone(ROUND, SEED, N)
    ids = tuple(range(N))
    want = {j for j in ids if active[j] and degrees[j] > 0}
    assert _charged(alg.planned_batch(ids, ctx)) == want  # what budgets check before the round
    state = alg.init_state(MODEL.init(None))
    out = alg.node_step(alg.downlink(state, ctx, ids), DATA.train, ids, ctx)
    assert _charged(out.events) == want  # what the step charges
    signals = out.tensors["signal"]
    assert [bool(np.any(signals[j])) for j in ids] == list(active)  # the silent transmit zeros
    # A node that missed the round: the server charges the active ones that answered what they lacked.
    closed = ctx.closed([j for j in ids if answered[j]] or [0])
    corrections = alg.server_step(state, NodeResult((), {}), closed).events
    assert {e.node for e in corrections} <= want & set(closed.answered)
    if scheme != "orthogonal_d2d":
        # (a) an inactive sender adds no artificial noise anywhere: leaving it out moves no one's σ.
        with_all = alg.privacy_sigma(ROUND, ids)
        without = alg.privacy_sigma(ROUND, [j for j in ids if active[j]])
        np.testing.assert_array_equal(with_all, without)
    assert np.isinf(alg.privacy_sigma(ROUND, ids)[[not a for a in active]]).all()


def _privacy_rows(run_dir: Path) -> list[tuple[int, int, str, str]]:
    with (run_dir / "ledger.csv").open() as f:
        return sorted((int(r["node"]), int(r["round"]), r["sigma"], r["issuer"])
                      for r in csv.DictReader(f) if r["kind"] == "privacy")


@pytest.mark.slow
def test_a_scene_sender_with_no_path_to_the_server_is_charged_nothing_for_its_silent_rounds(tmp_path):
    """The contract's street canyon (5 walking nodes, each 2-round block re-traced): in a block where a
    node has no traced path to the server point it transmits zeros, and neither the sim's ledger nor
    the MQTT run's has a Gaussian event of it for those rounds; the summary's ε (both accountants)
    composes only the rounds it released in."""
    config = replace(load_config_text(_text("dwfl/scene")), privacy={"tight_accountant": "pld"})
    _, _, _, alg = suite._built(_text("dwfl/scene"))
    rounds = alg.rounds_planned
    graph_degrees = [alg.graph_of(t).degrees for t in range(rounds)]
    silent = {(j, t) for t in range(rounds) for j in np.flatnonzero(inactive_senders(alg.plan(t).tx)).tolist()}
    assert silent, "the case must have a sender with no path to the server point"
    expected = {(j, t) for t in range(rounds) for j in range(alg.num_nodes)
                if (j, t) not in silent and graph_degrees[t][j] > 0}

    sim = run_experiment(config, out_dir=tmp_path / "sim", quiet=True)
    rows = _privacy_rows(tmp_path / "sim")
    assert {(node, t) for node, t, _, _ in rows} == expected
    mqtt = run_experiment(replace(config, run={"mode": "mqtt"}), out_dir=tmp_path / "mqtt", quiet=True)
    assert _privacy_rows(tmp_path / "mqtt") == rows

    delta = config.privacy.delta
    for j, node in sim.summary["nodes"].items():
        events = [alg.planned_events(int(j), RoundContext.everyone(t, config.run.seed, alg.num_nodes))
                  for t in range(rounds)]
        released = [e for round_events in events for e in round_events if e.kind == "privacy"]
        assert len(released) == sum((int(j), t) in expected for t in range(rounds))
        assert node["epsilon"] == pytest.approx(epsilon("zcdp", tally_of(released), delta), rel=1e-12)
        assert node["epsilon_tight"] == pytest.approx(epsilon("pld", tally_of(released), delta), rel=1e-9)
        assert mqtt.summary["nodes"][j]["epsilon"] == node["epsilon"]
