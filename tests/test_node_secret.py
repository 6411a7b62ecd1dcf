"""Secret randomness by construction (issue 39, part 1): a board's private draws (DP noise,
mini-batches, noised scores, DWFL's artificial noise) are keyed by a secret made on the board, which
the coordinator never holds; an emulated node keeps its run-seed key bit for bit.

The adversary is the server: whoever runs the coordinator holds the run's seed, the experiment,
every message a node sends it and every file of the run directory. :func:`test_the_server_cannot_regenerate_a_secret_keyed_release`
plays it: it recomputes each release from all of that, and must succeed for a run-seed node (so the
test can fail) and fail for a node with a secret, whose owner still reproduces it from the key file.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from testbed.algorithms import RoundContext, WithSetup
from testbed.algorithms.batches import node_keys, uniform_batches
from testbed.algorithms.contract import SETUP_ROUND
from testbed.assembly import assemble
from testbed.assembly.config import load_config_text, replace, to_toml
from testbed.cli import main
from testbed.errors import UserError
from testbed.mqtt import wire
from testbed.orchestration.runner import load, run_experiment
from testbed.privacy.secrecy import HOLDS, REPRODUCIBLE
from testbed.rounds import protocol
from testbed.streams.node_secret import KEY_FILE, NODE_SECRET, RUN_SEED, NodeSecret, load_or_make
from testbed.streams.rng import PRIVATE_PURPOSES, Purpose, node_streams, stream

from conftest import REPO
from conftest_mqtt import with_board_keys
from conftest_firmware import needs_cc
from nodes.agent import NodeAgent, _scope
from test_algorithm_contract import CASES, _built

SECRETS = {n: NodeSecret(bytes([n + 1]) * 32) for n in range(8)}


def _differs(a: np.ndarray, b: np.ndarray) -> bool:
    return not np.allclose(a, b, rtol=0, atol=1e-9)


# ------------------------------------------------------------------ streams


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**63 - 1), node=st.integers(0, 2**31), round_index=st.integers(-1, 2**31),
       purpose=st.sampled_from(sorted(PRIVATE_PURPOSES)), a=st.binary(min_size=32, max_size=32),
       b=st.binary(min_size=32, max_size=32))
def test_a_nodes_private_streams_under_two_secrets_never_coincide(seed, node, round_index, purpose, a, b):
    """Two secrets give two streams, and neither is the run seed's (what the coordinator can make)."""
    draws = {key: stream(seed, node, round_index, purpose, None if key is None else NodeSecret(key)).integers(
        0, 2**63, size=4).tolist() for key in {a, b, None}}
    assert len({tuple(d) for d in draws.values()}) == len(draws)
    # node_streams (the stacked path) is stream() node by node, secrets or not
    ids = [node, node + 1]
    secrets = {node: NodeSecret(a)}
    got = [g.integers(0, 2**63, size=4).tolist() for g in node_streams(seed, ids, round_index, purpose, secrets)]
    assert got == [stream(seed, n, round_index, purpose, secrets.get(n)).integers(0, 2**63, size=4).tolist()
                   for n in ids]


@settings(max_examples=50, deadline=None)
@given(seed=st.integers(0, 2**32), node=st.integers(0, 1000), round_index=st.integers(-1, 1000),
       purpose=st.sampled_from(sorted(set(Purpose) - PRIVATE_PURPOSES)), key=st.binary(min_size=32, max_size=32))
def test_a_public_stream_is_the_run_seeds_whatever_the_secret(seed, node, round_index, purpose, key):
    """Data, initialisation, channel, topology...: the same on a board with a secret as in sim."""
    assert stream(seed, node, round_index, purpose, NodeSecret(key)).random(3).tolist() == \
        stream(seed, node, round_index, purpose).random(3).tolist()


def test_a_secret_shows_nowhere_in_its_repr_and_is_never_pickled():
    import pickle

    secret = NodeSecret(bytes(range(32)))
    assert bytes(range(32)).hex() not in repr(secret) + str(secret)
    with pytest.raises(TypeError):
        pickle.dumps(secret)


# ------------------------------------------------------------------ algorithms


@pytest.mark.parametrize("name", CASES)
def test_a_board_with_its_own_key_gives_other_noise_and_the_same_plan(name):
    """Every node's release under its own secret differs from the run seed's, and its events (the
    ε it is charged, the plan) are the same."""
    config, data, model, alg = _built(name)
    state = alg.init_state(model.init(np.random.default_rng(1)))
    n = data.num_nodes
    ids = tuple(range(n))
    plain, keyed = RoundContext.everyone(1, config.run.seed, n), \
        RoundContext(1, config.run.seed, n, ids, secrets={i: SECRETS[i] for i in ids})
    steps = []
    if isinstance(alg, WithSetup) and alg.has_setup:
        setup = [RoundContext(SETUP_ROUND, config.run.seed, n, ids, secrets=c.secrets) for c in (plain, keyed)]
        steps.append([alg.setup_step(data.train, ids, c) for c in setup])
    steps.append([alg.node_step(alg.downlink(state, c, ids), data.train, ids, c) for c in (plain, keyed)])
    changed, drawing = set(), set()
    for without, with_secret in steps:
        assert list(without.events) == list(with_secret.events)  # same ε, same plan
        # A node draws in a step when it releases noise or trains (PADPFL's nodes not due do neither)
        drawing |= {m for m in ids if any(e.kind == "privacy" or getattr(e, "local_steps", 0) > 0
                                          for e in without.events[m])}
        for key, value in without.tensors.items():
            changed |= {m for m in ids if _differs(value[m], with_secret.tensors[key][m])}
        # A silent sender (DWFL's α = β = 0: no traced path to the server point) transmits zeros
        # whatever it drew: nothing of it to differ.
        drawing -= {m for m in ids if not any(np.any(t[m]) for t in (*without.tensors.values(),
                                                                      *with_secret.tensors.values()))}
    assert drawing and changed == drawing, f"nodes {sorted(drawing - changed)} released the same under a secret"


def test_a_secret_changes_each_nodes_batches_and_only_that_nodes():
    config, data, _, _ = _built("dp_pasgd")
    ids = list(range(data.num_nodes))
    plain = uniform_batches(data.train, ids, 2, config.run.seed, 3, 8)
    keyed = uniform_batches(data.train, ids, 2, config.run.seed, 3, 8, {0: SECRETS[0]})
    assert not np.array_equal(plain[0], keyed[0]) and np.array_equal(plain[1:], keyed[1:])
    poisson = node_keys(data.train, ids, 2, config.run.seed, 3, {1: SECRETS[1]})
    assert not np.array_equal(poisson[1], node_keys(data.train, ids, 2, config.run.seed, 3)[1])


def test_a_microcontrollers_round_key_comes_from_its_bridges_secret():
    """The firmware takes a 64-bit key: the bridge sends one derived from the board's secret."""
    from testbed.algorithms import mcu_logistic

    config = load_config_text('[run]\nseed = 5\n[data]\nnum_nodes = 2\nsamples_per_node = 40\ndim = 3\n'
                              '[nodes]\nmcu = [1]\n[dp_pasgd]\nsteps = 4\ntau = 2\nbatch = 4\nsigma = 1.0\n')
    data, model = load(config)
    alg = assemble.build_algorithm(config, model, data)
    plain = RoundContext.everyone(0, 5, 2)
    keyed = RoundContext(0, 5, 2, (0, 1), secrets={1: SECRETS[1]})
    assert alg.mcu_task(1, plain).seed == 5
    task = alg.mcu_task(1, keyed)
    assert task.seed == SECRETS[1].philox_seed(5, 1, 0) != 5
    rows = slice(data.train.offsets[1], data.train.offsets[2])
    x, y = data.train.x[rows], data.train.y[rows]
    theta = np.zeros(model.num_params)
    assert _differs(mcu_logistic.node_step(task, theta, x, y), mcu_logistic.node_step(alg.mcu_task(1, plain), theta, x, y))


# ------------------------------------------------------------------ the server's attack

DP_PASGD = ('[run]\nname = "secret"\nseed = 11\nalgorithm = "{alg}"\n[data]\nnum_nodes = 3\nsamples_per_node = 40\n'
            'dim = 4\n[privacy]\ntight_accountant = "none"\n')
ATTACKED = {
    "dp_pasgd": '[dp_pasgd]\nsteps = 6\ntau = 2\nbatch = 4\nlr = 0.5\nsigma = 1.0\n',
    "padpfl": '[padpfl]\nrounds = 3\nuploads = 3\nlocal_steps = 2\nbatch = 4\nlr = 0.5\nclip = 2.0\nepsilon = 20.0\n'
              'impact = "quality_score"\nscore_sigma = 0.1\n',
}


def _serve(agent: NodeAgent, config_text: str, rounds: int, num_nodes: int, params0: np.ndarray) -> list[bytes]:
    """Drive ``agent`` through a prepare, ``rounds`` rounds (a model a round) and the stop, as the
    coordinator would; returns every byte it sent back (what the coordinator receives)."""
    run, session, ids = "r", "a1b2c3d4e5f60718", list(range(num_nodes))
    replies = [agent.handle(wire.decode(protocol.prepare(run, session, config_text, ids)))]
    model = np.asarray(params0, dtype=np.float64)
    for r in range(rounds):
        replies.append(agent.handle(wire.decode(protocol.round_(run, session, r, config_text, ids, {"model": model}))))
        model = model + 0.01 * (r + 1)  # the coordinator's next model: any, the server chose it
    replies.append(agent.handle(wire.decode(protocol.stop(run, session, "completed", rounds - 1))))
    return [reply.payload for reply in replies if reply is not None]


def _releases(payloads: list[bytes]) -> dict[int, dict[str, np.ndarray]]:
    msgs = [wire.decode(p) for p in payloads]
    return {m.round: dict(m.tensors) for m in msgs if m.kind == protocol.UPDATE}


#: The private draws each attacked algorithm's node step makes.
DRAWS = {"dp_pasgd": (Purpose.NOISE, Purpose.BATCH), "padpfl": (Purpose.NOISE, Purpose.BATCH, Purpose.SCORE)}


class _AllBut:
    """A key (as rng.stream reads one) that gives a node's true streams except for ``purpose``,
    which comes from ``guess`` (None: the run seed's key, what the coordinator can make)."""

    def __init__(self, true: NodeSecret, purpose: Purpose, guess: NodeSecret | None):
        self.true, self.purpose, self.guess = true, purpose, guess

    def stream_words(self, seed: int, node: int, round_index: int, purpose: int) -> list[int]:
        if purpose != self.purpose:
            return self.true.stream_words(seed, node, round_index, purpose)
        if self.guess is None:
            return [seed, node + 1, round_index + 1, int(purpose)]  # testbed.streams.rng.stream's run-seed key
        return self.guess.stream_words(seed, node, round_index, purpose)


@pytest.mark.parametrize("alg", sorted(ATTACKED))
def test_the_server_cannot_regenerate_a_secret_keyed_release(alg, tmp_path, caplog):
    """The server holds the experiment (seed included), each model it sent, each byte node 1 sent
    back and the node's ledger report; it regenerates the node's draws from the seed (and, trying
    harder, from a key made of any of those bytes) and recomputes the release. For a run-seed node
    the recomputation is the release (its noise is known, the attack succeeds); for a node with a
    secret no attempt comes near, while the board's owner, with the key file, reproduces it."""
    caplog.set_level(logging.DEBUG)
    text = DP_PASGD.format(alg=alg) + ATTACKED[alg]
    config = load_config_text(text)
    data, model = load(config)
    if alg == "padpfl":  # what the runner resolves before it sends the experiment: min_i m_i
        config = replace(config, padpfl={"min_samples": int(np.diff(data.train.offsets).min())})
    config_text = to_toml(config)
    params0 = model.init(stream(config.run.seed, -1, -1, Purpose.INIT))
    rounds = assemble.build_algorithm(config, model, data).rounds
    node, n = 1, config.data.num_nodes
    state_dir = tmp_path / "board"
    secret = load_or_make(state_dir)
    heard = {kind: _serve(NodeAgent(node, state_dir=state_dir / kind, secret=s), config_text, rounds, n, params0)
             for kind, s in ((NODE_SECRET, secret), (RUN_SEED, None))}

    def recompute(r: int, sent_model: np.ndarray, key: NodeSecret | None) -> dict[str, np.ndarray]:
        alg_ = assemble.build_algorithm(config, model, data)  # the server builds what sim builds
        ctx = RoundContext(r, config.run.seed, n, tuple(range(n)), secrets=None if key is None else {node: key})
        return alg_.node_step({"model": sent_model[None]}, data.train.select([node]), [node], ctx).rows(node)

    def matches(released: dict[int, dict[str, np.ndarray]], key: NodeSecret | None) -> bool:
        model_r = np.asarray(params0, dtype=np.float64)
        hits = []
        for r in range(rounds):
            if r in released:
                got = recompute(r, model_r, key)
                hits.append(all(np.allclose(got[k], v, rtol=0, atol=1e-9) for k, v in released[r].items()))
            model_r = model_r + 0.01 * (r + 1)
        assert hits, "the node released nothing"
        return all(hits)

    seeded, secret_released = _releases(heard[RUN_SEED]), _releases(heard[NODE_SECRET])
    assert matches(seeded, None), "the server failed to regenerate a run-seed node's noise"
    assert set(seeded) == set(secret_released)  # the same rounds: the plan does not depend on the key
    # Everything the server holds: the messages, the experiment, the node's ledger report. Each
    # blob tried as a key too (a hash of it), beside the run seed itself.
    held = heard[NODE_SECRET] + [config_text.encode()]
    attempts = [None] + [NodeSecret(hashlib.sha256(blob).digest()) for blob in held]
    assert not any(matches(secret_released, key) for key in attempts)
    # A stronger server, handed the node's true streams of every purpose but one, guesses that one
    # (from the seed or any held blob): each private draw the release rests on must be secret alone
    # (noise known but batches secret would still let it subtract the noise).
    owned = secret.for_run(_scope("r", protocol.experiment_key(config_text)))  # the owner derives it from the key
    for purpose in DRAWS[alg]:
        assert not any(matches(secret_released, _AllBut(owned, purpose, key)) for key in attempts), purpose.name
        assert matches(secret_released, _AllBut(owned, purpose, owned))  # the hybrid itself is sound
    assert matches(secret_released, owned)  # the owner of node-secret.key reproduces its draws
    # Another run (same seed, another run id) draws other noise: the server cannot pair two runs' releases.
    assert not matches(secret_released, secret.for_run(_scope("another run", protocol.experiment_key(config_text))))
    assert not matches(secret_released, secret.for_run(_scope("r", protocol.experiment_key(config_text + "#"))))
    # The key is in no byte the server receives, and in no log line.
    raw = (state_dir / KEY_FILE).read_bytes()
    for form in (raw, raw.hex().encode(), base64.b64encode(raw), raw.hex().upper().encode()):
        assert not any(form in blob for blob in held)
        assert form.decode("latin-1") not in caplog.text
    ready = [wire.decode(p) for p in heard[NODE_SECRET] if wire.decode(p).kind == protocol.READY]
    assert [protocol.randomness_of(m) for m in ready] == [NODE_SECRET]


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.binary(min_size=32, max_size=32))
def test_a_secret_never_appears_in_a_message_or_a_log_line(key, caplog):
    caplog.clear()
    caplog.set_level(logging.DEBUG)
    text = DP_PASGD.format(alg="dp_pasgd") + ATTACKED["dp_pasgd"]
    config = load_config_text(text)
    data, model = load(config)
    sent = _serve(NodeAgent(0, secret=NodeSecret(key)), to_toml(config), 2, 3, np.zeros(model.num_params))
    for form in (key, key.hex().encode(), base64.b64encode(key)):
        assert not any(form in blob for blob in sent)
        assert form.decode("latin-1") not in caplog.text


# ------------------------------------------------------------------ the ready message


def test_a_ready_says_its_randomness_and_anything_else_is_refused():
    key = "ab" * 32
    assert protocol.randomness_of(wire.decode(protocol.ready("r", "s1", 0, key, NODE_SECRET))) == NODE_SECRET
    old = wire.decode(wire.encode({"run": "r", "round": 0, "sender": "0", "kind": protocol.READY,
                                   "meta": {"session": "s1", "experiment": key}}))
    assert protocol.ready_of(old) == key and protocol.randomness_of(old) == RUN_SEED  # said nothing: the weaker
    for bad in ("secret", "", None, 1, ["node_secret"]):
        msg = wire.decode(wire.encode({"run": "r", "round": 0, "sender": "0", "kind": protocol.READY,
                                       "meta": {"session": "s1", "experiment": key, "randomness": bad}}))
        with pytest.raises(wire.WireError):
            protocol.ready_of(msg)


# ------------------------------------------------------------------ the key file


def test_the_key_is_made_once_with_mode_0600(tmp_path):
    first = load_or_make(tmp_path / "state")
    path = tmp_path / "state" / KEY_FILE
    assert path.stat().st_mode & 0o777 == 0o600 and path.stat().st_size == 32
    assert load_or_make(tmp_path / "state") == first
    assert os.listdir(tmp_path / "state") == [KEY_FILE]  # no temporary left


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o644, 0o660, 0o700 | 0o004])
def test_a_key_others_may_read_is_refused(tmp_path, mode):
    load_or_make(tmp_path)
    (tmp_path / KEY_FILE).chmod(mode)
    with pytest.raises(UserError, match="lets others read it") as info:
        load_or_make(tmp_path)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("size", [0, 16, 31, 33, 64])
def test_a_key_of_the_wrong_size_is_refused(tmp_path, size):
    path = tmp_path / KEY_FILE
    path.write_bytes(os.urandom(size))
    path.chmod(0o600)
    with pytest.raises(UserError, match=f"{size} bytes, not 32"):
        load_or_make(tmp_path)


def test_a_key_that_is_not_a_file_is_refused(tmp_path):
    (tmp_path / KEY_FILE).mkdir(mode=0o700)
    with pytest.raises(UserError, match="node secret"):
        load_or_make(tmp_path)


def test_concurrent_first_starts_share_one_whole_key(tmp_path):
    got: list[NodeSecret] = []
    threads = [threading.Thread(target=lambda: got.append(load_or_make(tmp_path / "s"))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 8 and all(s == got[0] for s in got)


def test_testbed_node_refuses_a_readable_key_in_one_line_and_reproducible_makes_none(tmp_path, capsys):
    state = tmp_path / "state"
    load_or_make(state)
    (state / KEY_FILE).chmod(0o644)
    assert main(["node", "--broker", "mqtt://127.0.0.1:9", "--node-id", "1", "--state-dir", str(state),
                 "--no-auth"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "node secret" in err and "lets others read it" in err
    other = tmp_path / "other"
    assert main(["node", "--broker", "mqtt://127.0.0.1:9", "--node-id", "1", "--state-dir", str(other),
                 "--reproducible", "--no-auth"]) == 2  # refused to connect, after deciding on its randomness
    assert not (other / KEY_FILE).exists()


# ------------------------------------------------------------------ a run says whose randomness


def test_a_sim_run_says_its_noise_is_derivable_from_the_seed(tmp_path):
    config = load_config_text(DP_PASGD.format(alg="dp_pasgd") + ATTACKED["dp_pasgd"])
    summary = run_experiment(config, out_dir=tmp_path / "r", quiet=True).summary
    assert {n["randomness"] for n in summary["nodes"].values()} == {RUN_SEED}
    [g] = summary["privacy_guarantees"]
    assert g["observer"] == "server" and g["statement"] == REPRODUCIBLE
    assert g["epsilon"] == pytest.approx(summary["privacy"]["headline"]["value"])
    assert summary["privacy"]["headline"]["observer"] == "server" and summary["privacy"]["headline"]["secrecy"] == REPRODUCIBLE
    assert g["randomness"] == {NODE_SECRET: [], RUN_SEED: [0, 1, 2]}
    from testbed.api import Run
    from testbed.cli.run import format_summary

    assert Run(tmp_path / "r").privacy_guarantees == summary["privacy_guarantees"]
    from testbed.watch.feed import RunFeed

    feed = RunFeed(tmp_path / "r")
    feed.poll()
    assert feed.snapshot()["run"]["secrecy"] == [f"the server: epsilon {g['epsilon']:.4g} (zcdp): {REPRODUCIBLE}"]
    assert f"against      the server: epsilon {g['epsilon']:.4g} (zcdp): {REPRODUCIBLE}" in format_summary(summary)


def test_a_mixed_run_over_mqtt_says_it_per_node(embedded_broker, tmp_path, board_keys):
    """Node 0 is a board with its own secret, nodes 1-3 run --reproducible: the summary names each
    node's randomness and says both sentences, each with its nodes; the ε of every node is sim's
    (the same plan), the model is not (node 0's noise is its own)."""
    url = embedded_broker.url
    config = replace(load_config_text(DP_PASGD.format(alg="dp_pasgd").replace("num_nodes = 3", "num_nodes = 4")
                                      + ATTACKED["dp_pasgd"]),
                     run={"mode": "mqtt"}, mqtt=with_board_keys({"broker_url": url, "emulated": False,
                                                                 "round_timeout_s": 30.0, "connect_timeout_s": 60.0}))

    def node(n: int, *extra: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "testbed", "node", "--broker", url, "--node-id", str(n),
                                 "--state-dir", str(tmp_path / f"board{n}"), "--quiet", *extra], cwd=REPO,
                                stderr=subprocess.DEVNULL)

    procs = [node(0)] + [node(n, "--reproducible") for n in (1, 2, 3)]
    try:
        result = run_experiment(config, out_dir=tmp_path / "mqtt", quiet=True)
    finally:
        for p in procs:
            p.kill()
            p.wait()
    summary = result.summary
    assert summary["status"] == "completed"
    assert {k: n["randomness"] for k, n in summary["nodes"].items()} == \
        {"0": NODE_SECRET, "1": RUN_SEED, "2": RUN_SEED, "3": RUN_SEED}
    [g] = summary["privacy_guarantees"]
    assert g["randomness"] == {NODE_SECRET: [0], RUN_SEED: [1, 2, 3]}
    assert g["statement"] == f"{HOLDS} for nodes 0; {REPRODUCIBLE} for nodes 1, 2, 3"
    assert (tmp_path / "board0" / KEY_FILE).exists() and not (tmp_path / "board1" / KEY_FILE).exists()
    key = (tmp_path / "board0" / KEY_FILE).read_bytes()
    for path in (tmp_path / "mqtt").rglob("*"):  # nothing the coordinator stored holds it
        if path.is_file():
            assert key not in path.read_bytes() and key.hex().encode() not in path.read_bytes()
    sim = run_experiment(replace(config, run={"mode": "sim"}), out_dir=tmp_path / "sim", quiet=True).summary
    for k in summary["nodes"]:
        assert summary["nodes"][k]["epsilon"] == pytest.approx(sim["nodes"][k]["epsilon"], rel=1e-12)
    assert _differs(np.load(tmp_path / "mqtt" / "final_params.npy"), np.load(tmp_path / "sim" / "final_params.npy"))


# ------------------------------------------------------------------ a microcontroller behind its bridge


@needs_cc
def test_a_board_behind_its_bridge_draws_from_the_bridges_secret(tmp_path):
    """The C firmware (a virtual board) runs the round under the Philox key the bridge derives from
    the board's secret: its update is the emulation's under that secret, not the run seed's."""
    from firmware_bridge.agent import BridgeAgent
    from firmware_bridge.virtual import HostBoard
    from test_firmware_bridge import _config, _round, _update

    cfg = _config()
    theta = np.linspace(-0.2, 0.2, 10)
    secret = load_or_make(tmp_path / "bridge")
    data, model = load(cfg)

    def emulated(secrets):
        alg = assemble.build_algorithm(cfg, model, data)
        ctx = RoundContext(0, cfg.run.seed, 3, (0, 1, 2), secrets=secrets)
        return alg.node_step({"model": np.tile(theta, (3, 1))}, data.train, [0, 1, 2], ctx).tensors["update"][1]

    with HostBoard(profile="nrf52840") as board:
        agent = BridgeAgent(1, board.url, state_dir=tmp_path / "bridge", secret=secret)
        try:
            update = _update(agent.handle(_round(cfg, 0, theta))).tensors["update"]
        finally:
            agent.close()
    run_secret = secret.for_run(_scope("testbed", protocol.experiment_key(to_toml(cfg))))  # _round's run and experiment
    np.testing.assert_allclose(update, emulated({1: run_secret}), rtol=1e-5, atol=1e-6)
    assert _differs(update, emulated(None))


def test_a_node_file_may_say_reproducible_and_testbed_nodes_always_is():
    from nodes import board_config
    from testbed.cli import build_parser

    assert board_config.parse_board_config("reproducible = true\n", "node.toml") == {"reproducible": True}
    with pytest.raises(Exception, match="reproducible"):
        board_config.parse_board_config('reproducible = "yes"\n', "node.toml")
    parser = build_parser()
    assert parser.parse_args(["nodes", "--broker", "mqtt://h:1", "--count", "2"]).reproducible is True
    assert parser.parse_args(["node", "--broker", "mqtt://h:1", "--node-id", "0"]).reproducible is None  # file, else a secret


@pytest.mark.usefixtures("forked_hosts")
@pytest.mark.parametrize("said", [(NODE_SECRET,), (RUN_SEED,), (NODE_SECRET, RUN_SEED), (RUN_SEED, NODE_SECRET),
                                  (NODE_SECRET, NODE_SECRET), ()])
def test_the_coordinator_keeps_the_weaker_claim_of_a_nodes_readys(said, monkeypatch):
    """Node 2's readys say these kinds in turn (none: it never answered): it counts as node_secret
    only if each said so; the other (emulated) nodes say run_seed."""
    from loopback_coordinator import loopback
    from test_faults_ready import NODES, _prepared_parts
    from testbed.orchestration.coordinator import MqttNodes

    config, algorithm = _prepared_parts()

    def tamper(node, msg, reply):
        if node != 2 or msg.kind != protocol.PREPARE:
            return [(reply, 0)]
        honest = wire.decode(reply)
        return [(protocol.ready(honest.run, honest.meta["session"], 2, honest.meta["experiment"], kind), 0)
                for kind in said]

    with loopback(monkeypatch, NODES, tamper):
        nodes = MqttNodes(config.mqtt, config.nodes, to_toml(config), NODES, algorithm, seed=config.run.seed,
                          quiet=True)
        try:
            nodes._live(frozenset())
        finally:
            closing = nodes.close("completed")
    expected = {n: RUN_SEED for n in NODES if n != 2}
    if said:
        expected[2] = NODE_SECRET if set(said) == {NODE_SECRET} else RUN_SEED
    assert closing.randomness == expected


def test_a_claim_of_secret_noise_in_a_resumed_run_says_it_rests_on_this_sessions_word():
    from testbed.privacy.secrecy import EARLIER_SESSIONS, privacy_guarantees

    nodes = {"0": {"epsilon_by_observer": {"server": 1.0}}, "1": {"epsilon_by_observer": {"server": 2.0}}}
    both = {0: NODE_SECRET, 1: NODE_SECRET}
    assert privacy_guarantees("dp", nodes, both, 1e-5, "rdp")[0]["statement"] == HOLDS
    assert privacy_guarantees("dp", nodes, both, 1e-5, "rdp", resumed=True)[0]["statement"] == \
        f"{HOLDS} {EARLIER_SESSIONS}"
    seeded = {0: RUN_SEED, 1: RUN_SEED}  # the weaker claim needs no such word
    assert privacy_guarantees("dp", nodes, seeded, 1e-5, "rdp", resumed=True)[0]["statement"] == REPRODUCIBLE


# ------------------------------------------------------------------ the server's own noise


def _tapped_padpfl_run(monkeypatch, out: Path, said: str):
    """A PADPFL run over MQTT (loopback, honest agents) whose nodes' readys say ``said``; returns
    its summary, the broadcast models by round (what the public hears: the round messages) and each
    node's upload by round (to judge the public's guess by)."""
    from loopback_coordinator import loopback
    from test_trust_coordinator import NODES, _config

    broadcasts: dict[int, np.ndarray] = {}
    uploads: dict[int, dict[int, np.ndarray]] = {}

    def tap(node, msg, reply):
        if msg.kind == protocol.ROUND:
            broadcasts[msg.round] = np.asarray(msg.tensors["model"], dtype=np.float64)
        sent = wire.decode(reply)
        if sent.kind == protocol.UPDATE:
            uploads.setdefault(sent.round, {})[node] = np.asarray(sent.tensors["update"], dtype=np.float64)
        if msg.kind == protocol.PREPARE:
            return [(protocol.ready(sent.run, sent.meta["session"], node, sent.meta["experiment"], said), 0)]
        return [(reply, 0)]

    with loopback(monkeypatch, NODES, tap):
        summary = run_experiment(_config("padpfl"), out_dir=out, quiet=True).summary
    return summary, broadcasts, uploads


def _public_guess_hits(config_text: str, broadcasts, uploads, key: NodeSecret | None) -> list[bool]:
    """The public's attack: it holds the seed (every round's experiment carries it) and every
    broadcast; it regenerates the server's noise of each broadcast, round r's N(0, σ_S²) from
    ``stream(seed, GLOBAL, r, NOISE)`` under ``key`` (None: the run seed's), and subtracts it. Per
    broadcast with server noise, whether what is left is the noiseless mean Σ p'_i x~_i (judged from
    the uploads, which the public does not need)."""
    from testbed.streams.rng import GLOBAL

    config = load_config_text(config_text)
    data, model = load(config)
    alg = assemble.build_algorithm(config, model, data)
    hits = []
    for r, got in sorted(uploads.items()):
        ctx = RoundContext(r, config.run.seed, alg.num_nodes, tuple(range(alg.num_nodes))).closed(sorted(got))
        p = alg.round_weights(ctx)
        sigma_s = alg.server_sigma(p)
        if r + 1 not in broadcasts or not p.any() or sigma_s == 0:
            continue
        mean = sum(p[n] * got[n] for n in np.flatnonzero(p))
        guess = broadcasts[r + 1] - sigma_s * stream(config.run.seed, GLOBAL, r, Purpose.NOISE, key).standard_normal(mean.shape[0])
        hits.append(bool(np.allclose(guess, mean, rtol=0, atol=1e-9)))
    assert hits, "no broadcast carried server noise"
    return hits


@pytest.mark.usefixtures("forked_hosts")
def test_the_public_cannot_regenerate_the_servers_noise_once_a_node_has_a_secret(monkeypatch, tmp_path):
    """PADPFL's server adds σ_S to each broadcast, charged against the public. In an emulated run
    (readys say run_seed) the public, holding the seed and every broadcast, regenerates that noise
    and subtracts it (the attack succeeds: the test can fail); once a node says it has a secret the
    coordinator draws it from its own secret (server-secret.key, mode 0600, in the run directory the
    public does not hold) and no guess from the seed or the experiment comes near, while whoever
    holds the key file reproduces it. The public's statement names the server's randomness."""
    from testbed.privacy.secrecy import SERVER_HOLDS
    from testbed.streams.node_secret import SERVER_KEY_FILE, SERVER_SECRET

    seeded, broadcasts, uploads = _tapped_padpfl_run(monkeypatch, tmp_path / "emulated", RUN_SEED)
    config_text = (tmp_path / "emulated" / "config.toml").read_text()
    assert all(_public_guess_hits(config_text, broadcasts, uploads, None))
    assert not (tmp_path / "emulated" / SERVER_KEY_FILE).exists()
    public = {g["observer"]: g for g in seeded["privacy_guarantees"]}["public"]
    assert public["server_randomness"] == RUN_SEED and public["statement"] == REPRODUCIBLE

    secret, broadcasts, uploads = _tapped_padpfl_run(monkeypatch, tmp_path / "secret", NODE_SECRET)
    assert secret["status"] == "completed"
    key_path = tmp_path / "secret" / SERVER_KEY_FILE
    assert key_path.stat().st_mode & 0o777 == 0o600
    attempts = [None, *(NodeSecret(hashlib.sha256(blob).digest()) for blob in
                        (config_text.encode(), *(b.tobytes() for b in broadcasts.values())))]
    assert not any(any(_public_guess_hits(config_text, broadcasts, uploads, key)) for key in attempts)
    assert all(_public_guess_hits(config_text, broadcasts, uploads, load_or_make(key_path.parent, SERVER_KEY_FILE)))
    guarantees = {g["observer"]: g for g in secret["privacy_guarantees"]}
    assert guarantees["public"]["server_randomness"] == SERVER_SECRET
    assert guarantees["public"]["statement"] == SERVER_HOLDS
    assert "server_randomness" not in guarantees["server"] and guarantees["server"]["statement"] == HOLDS
    # The same plan: every ε is the emulated run's (the key changes the noise, not its σ).
    for k, node in secret["nodes"].items():
        assert node["epsilon_by_observer"] == pytest.approx(seeded["nodes"][k]["epsilon_by_observer"], rel=1e-12)


def test_a_figure_on_the_servers_noise_names_the_servers_randomness():
    """The public's entry of a run whose broadcasts carry server noise: secret only if both the
    nodes' and the server's are; a run-seed server's noise is everyone's to subtract; the server's
    own entry (uploads: no server noise) is unchanged."""
    from testbed.privacy.secrecy import SERVER_HOLDS, SERVER_REPRODUCIBLE, privacy_guarantees
    from testbed.streams.node_secret import SERVER_SECRET

    nodes = {str(n): {"epsilon_by_observer": {"server": 1.0, "public": 0.5}} for n in range(3)}
    secret, mixed = dict.fromkeys(range(3), NODE_SECRET), {0: NODE_SECRET, 1: RUN_SEED, 2: RUN_SEED}

    def said(randomness, server, observers=frozenset({"public"})) -> dict[str, str]:
        return {g["observer"]: g["statement"] for g in privacy_guarantees(
            "dp", nodes, randomness, 1e-5, "rdp", server_randomness=server, server_observers=observers)}

    assert said(secret, SERVER_SECRET) == {"server": HOLDS, "public": SERVER_HOLDS}
    assert said(secret, RUN_SEED) == {"server": HOLDS, "public": SERVER_REPRODUCIBLE}
    assert said(dict.fromkeys(range(3), RUN_SEED), RUN_SEED) == {"server": REPRODUCIBLE, "public": REPRODUCIBLE}
    assert said(dict.fromkeys(range(3), RUN_SEED), SERVER_SECRET)["public"] == REPRODUCIBLE
    assert said(mixed, SERVER_SECRET)["public"] == f"{SERVER_HOLDS} for nodes 0; {REPRODUCIBLE} for nodes 1, 2"
    assert said(secret, RUN_SEED, frozenset()) == {"server": HOLDS, "public": HOLDS}  # no server noise
