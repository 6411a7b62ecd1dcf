"""Benchmark: the channel part of one DWFL round plus a plain consensus update.

One round (dwfl.md §3.4, variant B, the physically realisable update):

1. channel draw: h ~ CN(0, 1) per sender (Sionna RayleighBlockFading, redrawn every round);
2. power alignment (eqs. 3–4, β = 1 − α) and σ² calibrated for ε = 0.5 at the worst receiver;
3. every node: artificial noise G_i ~ N(0, σ² I_d) from its own stream, payload
   sqrt(α_i P_i) x_i + sqrt(β_i P_i) G_i;
4. full-duplex D2D superposition v_i = Σ_{k≠i} |h_k| payload_k + m_i, O(N·d);
5. receiver update x_i ← x_i + η (v_i / (c(N−1)) − (x_i + a_i G_i)), where
   c (x_i + a_i G_i) = |h_i| payload_i is the receiver's own contribution.

Steps 3–5 run over column chunks of the (N, d) model array, so besides the models themselves
(800 MB at N = 100, d = 1e6, float64) the temporaries are two (N, chunk) buffers. Chunking does
not change the numbers: every node's noise stream is drawn in order.

Prints the median time per round for N in {10, 30, 100} and d in {1e4, 1e6}, the ratio
time(N=100)/time(N=10) at d = 1e6 (must be <= 15 for an O(N·d) round), and the peak RSS.

Run: ``.venv/bin/python benchmarks/ota_round.py [--reps 5] [--chunk 32768]``
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

from channel import (  # noqa: E402
    FadingSchedule,
    align_power,
    d2d_superpose,
    dbm_to_w,
    fill_gaussian_rows,
    rayleigh_block_fading,
    transmit_real,
)
from testbed.privacy.dwfl import calibrate_sigma2  # noqa: E402
from testbed.rng import GLOBAL, Purpose, stream  # noqa: E402

POWER_W = float(dbm_to_w(60.0))  # the paper's default P = 60 dBm
NOISE_POWER_W = 1.0  # σ_m² (dwfl.md §1.2 default)
EPSILON, DELTA, GAMMA, G_MAX, ETA = 0.5, 1e-5, 0.1, 1.0, 0.5


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def one_round(x: np.ndarray, seed: int, t: int, sched: FadingSchedule, buf_a, buf_v, chunk: int) -> dict:
    n, d = x.shape
    t0 = time.perf_counter()
    h = rayleigh_block_fading((n,), stream(seed, GLOBAL, sched.block_index(t), Purpose.CHANNEL))
    al = align_power(h, POWER_W)
    g = al.effective_gain(h)
    sigma2 = calibrate_sigma2(EPSILON, np.abs(h), POWER_W, al.beta, NOISE_POWER_W, GAMMA, G_MAX, DELTA)
    noise_gens = [stream(seed, i, t, Purpose.NOISE) for i in range(n)]
    chan_gens = [stream(seed, i, t, Purpose.CHANNEL) for i in range(n)]
    t1 = time.perf_counter()
    superpose_s = 0.0
    coef = ETA / (al.c * (n - 1))
    self_w = ((n - 1) * g)[:, None]
    for a in range(0, d, chunk):
        b = min(a + chunk, d)
        w = b - a
        pay = buf_a[:, :w]
        v = buf_v[:, :w]
        xs = x[:, a:b]
        fill_gaussian_rows(pay, np.sqrt(sigma2), noise_gens)  # G_i
        transmit_real(xs, pay, al, out=pay)  # payload_i, in place over G_i
        ts = time.perf_counter()
        d2d_superpose(pay, g, NOISE_POWER_W, chan_gens, out=v)  # v_i, O(N·w)
        superpose_s += time.perf_counter() - ts
        # x_i += η/(c(N−1)) · (v_i − (N−1) |h_i| payload_i)
        pay *= self_w
        v -= pay
        v *= coef
        xs += v
    t2 = time.perf_counter()
    return {"total_s": t2 - t0, "setup_s": t1 - t0, "superpose_s": superpose_s}


def self_check(seed: int = 1) -> None:
    """The chunked in-place round equals dwfl.md §3.4 variant B written out naively (small case)."""
    n, d, t = 6, 1000, 3
    sched = FadingSchedule(coherence_rounds=1)
    x0 = np.random.default_rng(seed).standard_normal((n, d))
    h = rayleigh_block_fading((n,), stream(seed, GLOBAL, sched.block_index(t), Purpose.CHANNEL))
    al = align_power(h, POWER_W)
    sigma2 = calibrate_sigma2(EPSILON, np.abs(h), POWER_W, al.beta, NOISE_POWER_W, GAMMA, G_MAX, DELTA)
    art = np.stack([np.sqrt(sigma2) * stream(seed, i, t, Purpose.NOISE).standard_normal(d) for i in range(n)])
    m = np.stack([np.sqrt(NOISE_POWER_W) * stream(seed, i, t, Purpose.CHANNEL).standard_normal(d) for i in range(n)])
    payload = al.signal_amplitude[:, None] * x0 + al.noise_amplitude[:, None] * art
    a_scale = np.abs(h) * al.noise_amplitude / al.c
    ref = np.empty_like(x0)
    for i in range(n):
        v_i = sum(np.abs(h[k]) * payload[k] for k in range(n) if k != i) + m[i]
        ref[i] = x0[i] + ETA * (v_i / (al.c * (n - 1)) - (x0[i] + a_scale[i] * art[i]))
    for chunk in (128, 1000):
        x = x0.copy()
        one_round(x, seed, t, sched, np.empty((n, chunk)), np.empty((n, chunk)), chunk)
        np.testing.assert_allclose(x, ref, rtol=1e-9, atol=1e-9)
    print("self-check: chunked in-place round == naive variant-B round (chunks 128 and 1000)")


def run(ns, ds, reps: int, chunk: int, seed: int) -> dict:
    sched = FadingSchedule(coherence_rounds=1)
    # Warm up Sionna/torch (import and first block) outside the timings.
    rayleigh_block_fading((4,), np.random.default_rng(0))
    results = {}
    print(f"{'N':>4} {'d':>9} {'median s/round':>15} {'min s':>8} {'superpose s':>12} "
          f"{'setup ms':>9} {'reps':>5} {'peak RSS MB':>12}")
    for d in ds:
        for n in ns:
            x = np.random.default_rng(seed).standard_normal((n, d))
            w = min(chunk, d)
            buf_a = np.empty((n, w))
            buf_v = np.empty((n, w))
            one_round(x, seed, 0, sched, buf_a, buf_v, chunk)  # warm-up round (page faults)
            rounds = [one_round(x, seed, t, sched, buf_a, buf_v, chunk) for t in range(1, reps + 1)]
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
            del x, buf_a, buf_v
    return results


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5, help="timed rounds per configuration")
    ap.add_argument("--chunk", type=int, default=1 << 15, help="columns per chunk")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    ns, ds = (10, 30, 100), (10_000, 1_000_000)
    self_check()
    res = run(ns, ds, args.reps, args.chunk, args.seed)
    ratio = res[(100, 1_000_000)] / res[(10, 1_000_000)]
    print(f"time(N=100)/time(N=10) at d=1e6: {ratio:.2f} (limit 15; O(N·d) gives ~10)")
    model_mb = 100 * 1_000_000 * 8 / 1e6
    print(f"peak RSS: {peak_rss_mb():.0f} MB (models alone at N=100, d=1e6: {model_mb:.0f} MB; "
          f"chunk temporaries: {2 * 100 * min(args.chunk, 1_000_000) * 8 / 1e6:.0f} MB)")
    return 0 if ratio <= 15 else 1


if __name__ == "__main__":
    raise SystemExit(main())
