"""Benchmark: one DWFL round through the algorithm's own code path (testbed.algorithms.dwfl).

One round (dwfl.md §3.4, variant B, the physically realisable update), from the nodes' local
models x_i' (the gradient step is not timed: it depends on the model, not on the radio):

1. channel draw: ``Dwfl.plan(t)``: h ~ CN(0, 1) per sender (Sionna RayleighBlockFading, redrawn
   every round), power alignment (eqs. 3–4, β = 1 − α), σ² calibrated for ε = 0.5 at the worst
   receiver, ledger σ and link cost;
2. ``Dwfl.transmit``: every node's artificial noise G_i ~ N(0, σ² I_d) from its own stream, signal
   sqrt(α_i P_i) x_i' + sqrt(β_i P_i) G_i (eq. 2) and what it keeps, x_i' − η(x_i' + a_i G_i);
3. ``DwflChannel.superpose``: full-duplex D2D superposition v_i = Σ_{k≠i} |h_k| s_k + m_i, O(N·d)
   (channel.d2d_superpose);
4. ``Dwfl.receive``: x_i'' = pending_i + η v_i / (c(N−1)).

Prints the median time per round for N in {10, 30, 100} and d in {1e4, 1e6}, the ratio
time(N=100)/time(N=10) at d = 1e6 (must be <= 15 for an O(N·d) round), and the peak RSS.

Run: ``.venv/bin/python benchmarks/ota_round.py [--reps 5]``
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from channel import dbm_to_w, rayleigh_block_fading  # noqa: E402
from testbed.algorithms.contract import RoundContext  # noqa: E402
from testbed.algorithms.dwfl import Dwfl  # noqa: E402
from testbed.algorithms.dwfl_channel import Radio, channel_noise_row  # noqa: E402
from testbed.learning.models import LogisticRegression  # noqa: E402
from testbed.streams.rng import Purpose, stream  # noqa: E402

POWER_W = float(dbm_to_w(60.0))  # the paper's default P = 60 dBm
NOISE_POWER_W = 1.0  # σ_m² (dwfl.md §1.2 default)
EPSILON, DELTA, GAMMA, G_MAX, ETA = 0.5, 1e-5, 0.1, 1.0, 0.5


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def build(n: int, d: int, seed: int) -> Dwfl:
    """DWFL on N nodes with a d-parameter model (logistic, 2 classes: d = 2·dim + 2)."""
    radio = Radio(num_nodes=n, power_w=POWER_W, noise_power_w=NOISE_POWER_W, fading="rayleigh", coherence_rounds=1)
    return Dwfl(LogisticRegression(d // 2 - 1, 2), radio, rounds=1_000, batch=1, lr=GAMMA, averaging_rate=ETA,
                gmax=G_MAX, delta=DELTA, epsilon=EPSILON, variant="B", seed=seed)


def one_round(alg: Dwfl, x: np.ndarray, seed: int, t: int) -> tuple[np.ndarray, dict]:
    ids = range(alg.num_nodes)
    ctx = RoundContext(t, seed, alg.num_nodes, tuple(ids)).closed(ids)
    t0 = time.perf_counter()
    alg.plan(t)
    t1 = time.perf_counter()
    signals, pending = alg.transmit(x, x, ids, t, seed)  # x becomes pending (in place)
    t2 = time.perf_counter()
    received = alg.channel.superpose(signals, alg.channel_tensors(ctx), ctx, out=signals)  # as sim does
    t3 = time.perf_counter()
    new = alg.receive(pending, received, ids, t, seed)
    t4 = time.perf_counter()
    alg._plans.clear()  # a long run keeps one small plan per block; here only the timing matters
    return new, {"total_s": t4 - t0, "setup_s": t1 - t0, "superpose_s": t3 - t2}


def self_check(seed: int = 1) -> None:
    """The algorithm's round equals dwfl.md §3.4 variant B written out naively (small case)."""
    n, d, t = 6, 1000, 3
    alg = build(n, d, seed)
    x0 = np.random.default_rng(seed).standard_normal((n, d))
    plan = alg.plan(t)
    al, h = plan.channel.alignment, plan.channel.gains
    art = np.stack([np.sqrt(plan.sigma2) * stream(seed, i, t, Purpose.NOISE).standard_normal(d) for i in range(n)])
    m = np.stack([channel_noise_row("ota_d2d", plan.channel, alg.radio, i, d, seed, t) for i in range(n)])
    payload = al.signal_amplitude[:, None] * x0 + al.noise_amplitude[:, None] * art
    a_scale = h * al.noise_amplitude / al.c
    ref = np.empty_like(x0)
    for i in range(n):
        v_i = sum(h[k] * payload[k] for k in range(n) if k != i) + m[i]
        ref[i] = x0[i] + ETA * (v_i / (al.c * (n - 1)) - (x0[i] + a_scale[i] * art[i]))
    new, _ = one_round(alg, x0.copy(), seed, t)
    np.testing.assert_allclose(new, ref, rtol=1e-9, atol=1e-9)
    print("self-check: Dwfl.transmit/propagate/receive == naive variant-B round")


def run(ns, ds, reps: int, seed: int) -> dict:
    # Warm up Sionna/torch (import and first block) outside the timings.
    rayleigh_block_fading((4,), np.random.default_rng(0))
    results = {}
    print(f"{'N':>4} {'d':>9} {'median s/round':>15} {'min s':>8} {'superpose s':>12} "
          f"{'setup ms':>9} {'reps':>5} {'peak RSS MB':>12}")
    for d in ds:
        for n in ns:
            alg = build(n, d, seed)
            x = np.random.default_rng(seed).standard_normal((n, alg.model.num_params))
            x, _ = one_round(alg, x, seed, 0)  # warm-up round (page faults)
            rounds = []
            for t in range(1, reps + 1):
                x, timing = one_round(alg, x, seed, t)
                rounds.append(timing)
            med = statistics.median(r["total_s"] for r in rounds)
            results[(n, d)] = med
            print(
                f"{n:>4} {d:>9.0e} {med:>15.4f} {min(r['total_s'] for r in rounds):>8.4f} "
                f"{statistics.median(r['superpose_s'] for r in rounds):>12.4f} "
                f"{1e3 * statistics.median(r['setup_s'] for r in rounds):>9.2f} {reps:>5} "
                f"{peak_rss_mb():>12.0f}",
                flush=True,
            )
            assert np.all(np.isfinite(x[:, :10]))
            del x
    return results


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5, help="timed rounds per configuration")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    ns, ds = (10, 30, 100), (10_000, 1_000_000)
    self_check()
    res = run(ns, ds, args.reps, args.seed)
    ratio = res[(100, 1_000_000)] / res[(10, 1_000_000)]
    print(f"time(N=100)/time(N=10) at d=1e6: {ratio:.2f} (limit 15; O(N·d) gives ~10)")
    model_mb = 100 * 1_000_000 * 8 / 1e6
    print(f"peak RSS: {peak_rss_mb():.0f} MB (models alone at N=100, d=1e6: {model_mb:.0f} MB; "
          f"a round holds ~2 such arrays: models/pending and signals/received)")
    return 0 if ratio <= 15 else 1


if __name__ == "__main__":
    raise SystemExit(main())
