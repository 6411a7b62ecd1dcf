"""Hostile nodes inside the declared bounds against every averaging algorithm, run in sim: the
harness of ``benchmarks/robust_aggregation.py`` (docs/robust-aggregation.md, "How far hostile nodes
move the model").

One case is (algorithm, rule, attack, hostile share, seed). The algorithm is built from a small
experiment (:data:`EXPERIMENTS`: 10 nodes of synthetic data) with the rule, and its rounds are
driven here step by step exactly as the sim runner does (downlink, node step, the exchange for
gossip and D-PSGD, server step), without the ledger and files; after each node step the hostile
nodes' rows are replaced by the attack's, fitted inside the round's declared bounds
(:func:`inside`). The hostile nodes are drawn per seed from a public stream.

Attacks (each hostile node knows every honest node's row of the round, the worst case):

- ``reversal``: every hostile node sends the honest rows' mean change reversed, at 0.99 of the bound
  (identical attackers);
- ``sign_flip``: each hostile node sends its own honest change reversed at 0.99 of the bound
  (diverse attackers: each row different);
- ``alie``: "a little is enough" (Baruch et al., NeurIPS 2019): the honest mean minus z honest
  standard deviations per coordinate, z = Φ⁻¹((N − s)/N), s = ⌊N/2 + 1⌋ − f (identical);
- ``ipm``: inner-product manipulation (Xie, Koyejo and Gupta, UAI 2020): −ε times the honest mean
  change, ε = :data:`IPM_EPSILON` (identical);
- ``score`` (PADPFL with impact = "quality_score" only): ``reversal``, and each hostile node reports
  a quality score of 1.0, the most the server accepts, to take the largest share it can.

For the server algorithms a row's "change" is from the model the node was sent; for gossip and
D-PSGD the hostile node's payload s is the attack (its change from the honest payloads' mean), and
the model it reports back runs 0.99 of its declared step bound in the same direction each round
(so that bounds computed from the models grow with it, as the issue found).

What is measured after the run, by the evaluated model (the server's; for gossip and D-PSGD the
honest nodes' mean, the attacker's own row being no model anyone uses): its test accuracy, and its
distance to the model of the same seed run clean under the paper's rule.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any

import numpy as np

from testbed.algorithms.contract import OverTheAir, RoundContext, round_signal_spec, round_uplink_spec
from testbed.assembly import assemble
from testbed.assembly.config import load_config_text
from testbed.orchestration.runner import load
from testbed.streams.rng import GLOBAL, Purpose, stream

#: The averaging algorithms (ACFL and DWFL are out: docs/robust-aggregation.md says why).
ALGORITHMS = ("fedavg", "dp_pasgd", "padpfl", "gossip", "dpsgd")
SERVER_RULES = ("mean", "norm_clip", "centred_clip", "centred_clip+bucket2", "trimmed_mean", "median", "krum",
                "multi_krum")
GRAPH_RULES = ("mean", "self_centred_clip", "trimmed_mean", "median")
ATTACKS = ("reversal", "sign_flip", "alie", "ipm", "score")
SHARES = (0.1, 0.3)
#: The share of the bound every attack is sent at (the issue's 0.99).
AT_BOUND = 0.99
#: ε of the inner-product manipulation.
IPM_EPSILON = 0.5
NUM_NODES = 10

_COMMON = """
[run]
name = "robust-bench"
algorithm = "{algorithm}"
seed = {seed}
[output]
figures = false
[privacy]
tight_accountant = "none"
[data]
dataset = "synthetic"
num_nodes = 10
samples_per_node = 200
dim = 10
heterogeneity = 0.5
"""
#: Each algorithm's small experiment (its section; the rule's keys are added per case).
EXPERIMENTS = {
    "fedavg": '[fedavg]\nrounds = 12\nlocal_steps = 3\nbatch = 16\nlr = 0.5\n',
    "dp_pasgd": '[dp_pasgd]\nsteps = 24\ntau = 2\nbatch = 16\nlr = 0.5\nsigma = 0.3\n',
    "padpfl": '[padpfl]\nrounds = 12\nlocal_steps = 3\nbatch = 16\nlr = 0.5\nclip = 2.0\nepsilon = 20.0\n'
              'sensitivity = "worst_case"\nimpact = "quality_score"\nscore_sigma = 0.01\n',
    "gossip": '[gossip]\nrounds = 20\nbatch = 16\nlr = 0.2\nsigma = 0.02\nfading = "none"\n'
              '[topology]\nkind = "k_regular"\ndegree = 4\n',
    "dpsgd": '[dpsgd]\nrounds = 20\nbatch = 16\nlr = 0.2\nfading = "none"\n[topology]\nkind = "k_regular"\ndegree = 4\n',
}


def rules_of(algorithm: str) -> tuple[str, ...]:
    """The rules the grid runs for ``algorithm`` (the receivers' for gossip and D-PSGD)."""
    return GRAPH_RULES if algorithm in ("gossip", "dpsgd") else SERVER_RULES


def attacks_of(algorithm: str) -> tuple[str, ...]:
    """The attacks the grid runs for ``algorithm`` (the lying score only where a score is reported)."""
    return ATTACKS if algorithm == "padpfl" else ATTACKS[:-1]


def rule_keys(algorithm: str, rule: str, hostile: int) -> str:
    """The section keys of ``rule``, configured by a defender who knows how many nodes are hostile."""
    if rule == "mean":
        return ""
    if rule == "centred_clip+bucket2":
        return 'aggregation = "centred_clip"\nbucket_size = 2\n'
    keys = f'aggregation = "{rule}"\n'
    if rule == "trimmed_mean" and algorithm not in ("gossip", "dpsgd"):
        keys += f"trim_fraction = {min(max(hostile, 1) / NUM_NODES, 0.45)}\n"
    if rule in ("krum", "multi_krum"):
        keys += f"byzantine_f = {max(hostile, 1)}\n"
    return keys


def experiment_text(algorithm: str, rule: str, hostile: int, seed: int) -> str:
    section = EXPERIMENTS[algorithm]
    head, _, tail = section.partition("[topology]")
    text = head + rule_keys(algorithm, rule, hostile) + ("[topology]" + tail if tail else "")
    return _COMMON.format(algorithm=algorithm, seed=seed) + text


@dataclass(frozen=True)
class Outcome:
    """What a run ends with: the evaluated model's test accuracy and the model."""

    accuracy: float
    model: np.ndarray


def inside(row: np.ndarray, spec: Any, reference: np.ndarray | None) -> np.ndarray:
    """``row`` moved inside the spec's bounds at :data:`AT_BOUND` of them: its distance from
    ``reference`` (a relative bound) or its norm scaled down, its entries clipped to the range."""
    base = reference if spec.relative_to is not None and reference is not None else np.zeros_like(row)
    change = row - base
    if spec.max_norm is not None:
        norm = float(np.linalg.norm(change))
        if norm > AT_BOUND * spec.max_norm:
            change *= AT_BOUND * spec.max_norm / norm
    out = base + change
    if spec.value_range is not None:
        low, high = spec.value_range
        out = np.clip(out, AT_BOUND * low, AT_BOUND * high)
    return out


def _unit(v: np.ndarray) -> np.ndarray:
    n = float(np.linalg.norm(v))
    return v / n if n > 0 else v


def attack_rows(attack: str, honest: np.ndarray, own: np.ndarray, reference: np.ndarray, bound: float | None,
                n: int, f: int) -> np.ndarray:
    """(f, P) the hostile rows before fitting: ``honest`` (H, P) the honest rows, ``own`` (f, P)
    the hostile nodes' own honest rows, ``reference`` the point changes are measured from."""
    changes = honest - reference
    mean = changes.mean(axis=0)
    far = 1e6 * (bound if bound else 1.0)  # past any bound: :func:`inside` brings it to 0.99 of it
    if attack in ("reversal", "score"):
        return np.tile(reference - far * _unit(mean), (f, 1))
    if attack == "sign_flip":
        return np.stack([reference - far * _unit(row - reference) for row in own])
    if attack == "alie":
        s = n // 2 + 1 - f
        z = statistics.NormalDist().inv_cdf((n - s) / n)
        return np.tile(reference + mean - z * changes.std(axis=0), (f, 1))
    if attack == "ipm":
        return np.tile(reference - IPM_EPSILON * mean, (f, 1))
    raise ValueError(f"unknown attack {attack!r}")


def hostile_nodes(seed: int, n: int, f: int) -> np.ndarray:
    """The f hostile nodes of n, per seed, from a public stream."""
    return np.sort(stream(seed, GLOBAL, -1, Purpose.STRAGGLER).choice(n, size=f, replace=False))


def run_case(algorithm: str, rule: str, attack: str | None, share: float, seed: int,
             loaded: dict[int, Any]) -> Outcome:
    """One run of the grid's experiment; ``attack`` None: clean. ``loaded`` caches each seed's data and model."""
    f = int(round(share * NUM_NODES)) if attack else 0
    text = experiment_text(algorithm, rule, int(round(share * NUM_NODES)), seed)
    return run_text(text, attack, hostile_nodes(seed, NUM_NODES, f), loaded)


def run_text(text: str, attack: str | None, bad: np.ndarray, loaded: dict[int, Any]) -> Outcome:
    """Run the experiment ``text`` in sim with the nodes ``bad`` sending ``attack`` (None: nobody)."""
    config = load_config_text(text)
    seed, n = config.run.seed, config.data.num_nodes
    if seed not in loaded:
        loaded[seed] = load(config)
    data, model = loaded[seed]
    alg = assemble.build_algorithm(config, model, data)
    state = alg.init_state(model.init(stream(seed, GLOBAL, -1, Purpose.INIT)))
    ids = tuple(range(n))
    bad = np.asarray(bad if attack else [], dtype=np.int64)
    good = np.setdiff1d(np.arange(n), bad)
    f = len(bad)
    graph = isinstance(alg, OverTheAir)
    for r in range(alg.rounds):
        ctx = RoundContext.everyone(r, seed, n)
        down = alg.downlink(state, ctx, ids)
        out = alg.node_step(down, data.train, ids, ctx)
        ctx = ctx.closed(out.node_ids)  # every node answers: nobody straggles here
        if graph:
            if f:
                _poison_payloads(alg, state, ctx, out, attack, bad, good)
            heard = alg.channel.superpose(out.tensors["signal"], alg.channel_tensors(ctx), ctx)
            out = alg.node_finish(out.carry, heard, ids, ctx)
            if f:
                _poison_own_rows(alg, state, ctx, down, out, bad, good)
        elif f:
            _poison_updates(alg, state, ctx, down, out, attack, bad, good)
        state = alg.server_step(state, out, ctx).state
    params = state["models"][good].mean(axis=0) if graph else alg.eval_params(state)
    _, correct = model.loss_and_correct(params, data.test.x, data.test.y)
    return Outcome(float(np.mean(correct)), params)


def _poison_updates(alg, state, ctx, down, out, attack, bad, good) -> None:
    spec = round_uplink_spec(alg, state, ctx)["update"]
    rows = out.tensors["update"]
    reference = np.asarray(down["model"][0] if np.ndim(down["model"]) > 1 else down["model"])
    hostile = attack_rows(attack, rows[good], rows[bad], reference, spec.max_norm, len(rows), len(bad))
    for k, node in enumerate(bad):
        rows[node] = inside(hostile[k], spec, reference)
    if attack == "score" and "score" in out.tensors:
        out.tensors["score"][bad] = 1.0


def _poison_payloads(alg, state, ctx, out, attack, bad, good) -> None:
    spec = round_signal_spec(alg.channel, state, ctx)
    signals = out.tensors["signal"]
    # Changes from the origin: the payloads are models, and "reversed" is the honest models' sign flipped.
    origin = np.zeros(signals.shape[1])
    hostile = attack_rows(attack, signals[good], signals[bad], origin, spec.max_norm, len(signals), len(bad))
    for k, node in enumerate(bad):
        signals[node] = inside(hostile[k], spec, None)


def _poison_own_rows(alg, state, ctx, down, out, bad, good) -> None:
    spec = round_uplink_spec(alg, state, ctx)["model"]
    sent = down["model"]
    honest_mean = out.tensors["model"][good].mean(axis=0)
    for node in bad:
        away = _unit(sent[node] - honest_mean) if np.any(sent[node] != honest_mean) else _unit(np.ones_like(honest_mean))
        out.tensors["model"][node] = sent[node] + AT_BOUND * spec.max_norm * away


def distance(a: np.ndarray, b: np.ndarray) -> float:
    """‖a − b‖ of two models."""
    return float(np.linalg.norm(a - b))
