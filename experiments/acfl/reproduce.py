"""Reproduce the experiments of ACFL (Li, Xiao, Skoglund, arXiv 2403.14905; acfl.md): Fig. 1 (the
analytic trade-off, the table of acfl.md §5.1), Fig. 3 (ACFL against NA), Fig. 4 (ACFL against SCFL
at equal ε), runs on real data (Adult-2, one-hot least squares, with and without random features,
the paper's step and a constant one) and one short run over MQTT with
emulated boards and Bernoulli stragglers. Writes fig1.png, fig3.png, fig4.png and REPORT.md here.

Figs. 3–4 run the algorithm's own steps in memory (``testbed.algorithms.acfl.trajectory``: the same
data, W₀, noise and stragglers as ``testbed run`` with the same seed; the script checks that once
against a full ``testbed run``). Training loss is f(W_t) of eq. (1), the sum over all devices; a
run's "final loss" is the mean of its last 10 iterations, then the mean over seeds.

The paper gives no numbers (acfl.md §5): a claim is "shown" when our numbers move the claimed way.

Run: ``.venv/bin/python experiments/acfl/reproduce.py [--seeds 3] [--iterations 1000] [--skip-mqtt]``
(Adult from $TESTBED_DATA, or /work/shared/datasets/adult when present).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))

from testbed.algorithms.acfl import Acfl, AcflSection, bernoulli_answered, trajectory  # noqa: E402
from testbed.data.regression import make_regression  # noqa: E402
from testbed.models import LinearRegression  # noqa: E402
from testbed.privacy import acfl as theory  # noqa: E402
from testbed.rng import GLOBAL, Purpose, stream  # noqa: E402

OUT = REPO / "runs" / "acfl-reproduce"
SHARED_ADULT = REPO.parent / "shared" / "datasets" / "adult"
N, M, D, O, LR = 100, 100, 10, 10, 1e-4  # Sec. V
SIGMAS_SQ = (0.1, 1.0, 10.0)  # Fig. 3 (not given by the paper)
EPSILONS = (10.0, 2.0, 0.5, 0.1)  # Fig. 4, nats (not given by the paper)
FIG1 = dict(nodes=5, p=0.1, beta_sq=100.0, model_bound_sq=1.0, dim=100, outputs=10)  # acfl.md §5.1
FIG1_ALPHAS = (0.0, 0.25, 0.5, 1.0)
ADULT_NODES, ADULT_P = 16, 0.2
ADULT_EPSILONS = (10.0, 1.0)  # nats per device (the coded upload's ε-MI-DP, Theorem 1)
ADULT_RF, ADULT_GAMMA = 200, 1.0  # random Fourier features D_rf and γ of exp(−γ‖x − x′‖²) (our choice)


def fig1() -> list[tuple]:
    """Bound 4u/(λ²T) (λ = 1, T = 1000) against ε (eq. 17) for the adaptive α* and fixed α."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = []
    for s in (1e-4, 1e-3, 1e-2, 0.1, 1.0, 10.0, 100.0):
        kw = dict(FIG1, sigma1_sq=s, sigma2_sq=s)
        rows.append((s, theory.mi_epsilon(100, 10, s, s), theory.optimal_alpha(**kw),
                     theory.convergence_bound(theory.u_tilde(**kw), 1.0, 1000),
                     *[theory.convergence_bound(theory.u_bound(a, **kw), 1.0, 1000) for a in FIG1_ALPHAS]))
    grid = np.logspace(-4, 3, 200)
    eps = theory.mi_epsilon(100, 10, grid, grid)
    kw = dict(FIG1, sigma1_sq=grid, sigma2_sq=grid)
    fig, (a, b) = plt.subplots(1, 2, figsize=(10, 4))
    for alpha in FIG1_ALPHAS[1:]:
        a.plot(eps, theory.convergence_bound(theory.u_bound(alpha, **kw), 1.0, 1000), label=f"fixed α = {alpha}")
    adaptive = theory.convergence_bound(theory.u_tilde(**kw), 1.0, 1000)
    a.plot(eps, adaptive, "k", lw=2, label="adaptive α* (eq. 36)")
    a.set(xscale="log", yscale="log", xlabel="ε (nats, eq. 17)", ylabel="bound 4u/(λ²T) (eq. 33)",
          title="(a) fixed and adaptive weights")
    a.legend()
    b.plot(eps, adaptive, "k")
    b.set(xscale="log", xlabel="ε (nats)", ylabel="bound 4ũ/(λ²T) (eq. 37)", title="(b) adaptive α*")
    fig.suptitle("Fig. 1: d = 100, o = 10, p = 0.1, N = 5, β = 10, C = 1, T = 1000, λ = 1, σ₁² = σ₂²")
    fig.tight_layout()
    fig.savefig(HERE / "fig1.png", dpi=110)
    plt.close(fig)
    return rows


class Setting:
    """One seed's data, W₀ and straggler draws (as `testbed run` draws them), shared by every
    method and σ² (common random numbers)."""

    def __init__(self, seed: int, p: float, iterations: int):
        self.seed, self.p = seed, p
        self.data = make_regression(N, M, D, O, seed=seed)
        self.model = LinearRegression(D, O)
        self.w0 = self.model.init(stream(seed, GLOBAL, -1, Purpose.INIT))
        self.answered = bernoulli_answered(seed, p, N, iterations)

    def run(self, **options) -> dict:
        alg = Acfl(self.model, num_nodes=N, iterations=len(self.answered), lr=LR, straggler_p=self.p, **options)
        return trajectory(alg, self.data, seed=self.seed, answered=self.answered, params0=self.w0)


def final(loss: np.ndarray) -> float:
    return float(loss[-10:].mean())


def fig3(seeds: int, iterations: int) -> dict:
    """ACFL and NA (α = 0.5) at p = 0.2, 0.4 and several σ₁² = σ₂²."""
    out = {}
    for p in (0.2, 0.4):
        for seed in range(seeds):
            setting = Setting(seed, p, iterations)
            for s in SIGMAS_SQ:
                for name, weights in (("ACFL", "adaptive"), ("NA", "fixed")):
                    r = setting.run(sigma1_sq=s, sigma2_sq=s, weights=weights, alpha=0.5)
                    out.setdefault((p, s, name), []).append(r)
    return out


def fig4(seeds: int, iterations: int) -> dict:
    """ACFL against SCFL (projection, fixed α = 0.5) at equal ε, p = 0.2."""
    out = {}
    for seed in range(seeds):
        setting = Setting(seed, 0.2, iterations)
        for eps in EPSILONS:
            for name, encoding, weights in (("ACFL", "gram", "adaptive"), ("SCFL", "projection", "fixed")):
                s1, s2 = AcflSection(mi_epsilon=eps, encoding=encoding).noise(D, O)
                r = setting.run(sigma1_sq=s1, sigma2_sq=s2, encoding=encoding, weights=weights, alpha=0.5)
                out.setdefault((eps, name), []).append(r)
    return out


def plot_runs(path: Path, panels: list[tuple[str, dict]], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.2), squeeze=False)
    for ax, (panel_title, curves) in zip(axes[0], panels):
        for label, (runs, style) in curves.items():
            ax.plot(np.mean([r["loss"] for r in runs], axis=0), style, label=label)
        ax.set(yscale="log", xlabel="iteration t", ylabel="training loss f(W_t) (eq. 1)", title=panel_title)
        ax.legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def base_config(iterations: int, **sections) -> "object":
    from testbed.config import load_config_text, replace

    text = (f'[run]\nname = "acfl"\nalgorithm = "acfl"\n[data]\ndataset = "regression"\nnum_nodes = {N}\n'
            f'samples_per_node = {M}\ndim = {D}\noutputs = {O}\n[model]\nkind = "linear"\nbias = false\n'
            f'[acfl]\niterations = {iterations}\nlr = {LR}\nsigma1_sq = 1.0\nsigma2_sq = 1.0\n'
            '[stragglers]\nmodel = "bernoulli"\np = 0.2\n[privacy]\ntight_accountant = "none"\n'
            '[output]\nfigures = false\n')
    config = load_config_text(text)
    return replace(config, **sections) if sections else config


def pipeline_check(iterations: int) -> float:
    """max |W| difference between `testbed run` (sim) and the in-memory trajectory, same seed."""
    from testbed.orchestration.runner import run_experiment
    from testbed.reports.results import read_checkpoint

    run_experiment(base_config(iterations), out_dir=OUT / "pipeline", quiet=True)
    w = read_checkpoint(OUT / "pipeline").state["W"]
    mine = Setting(0, 0.2, iterations).run(sigma1_sq=1.0, sigma2_sq=1.0)["W"]
    return float(np.abs(w - mine).max())


def public_lr(rows: int, random_features: int) -> float:
    """η₀ = 1 / a public bound on λ_max(Σ XᵀX) ≤ Σ‖x‖²: rows in the unit ball (the loader's
    public-bound scaling) plus the bias column give ‖x‖² ≤ 2; D_rf random features in [−1, 1]
    plus the bias give ≤ D_rf + 1. No statistic of the data but the row count."""
    return 1.0 / (rows * (2.0 if random_features == 0 else random_features + 1.0))


def real_data(iterations: int) -> dict:
    """ACFL and NA on Adult-2 (16 i.i.d. devices), one-hot least squares, p = 0.2, with and without
    the random-feature embedding, at two ε; the paper's η₀/t once for contrast, else the constant
    step η₀ = :func:`public_lr`. Keys (features, ε, schedule, method) → the run's summary."""
    from testbed.data import load_dataset
    from testbed.orchestration.runner import run_experiment

    data = load_dataset("adult-2", seed=0, scaling="public_bound", num_nodes=ADULT_NODES)
    rows = len(data.train.x)
    test_y = data.test.y
    out = {"majority": float(max(np.mean(test_y == 0), np.mean(test_y == 1))), "rows": rows}
    model = LinearRegression(data.dim, 2, bias=True)  # the exact least squares, central and noiseless
    w = np.linalg.lstsq(model.design(data.train.x), model.targets(data.train.y), rcond=None)[0]
    out["lstsq"] = float(model.loss_and_correct(w.ravel(), data.test.x, test_y)[1].mean())
    grid = [(rf, eps, "constant") for rf in (0, ADULT_RF) for eps in ADULT_EPSILONS]
    grid.insert(0, (0, ADULT_EPSILONS[0], "eta0_over_t"))
    for rf, eps, schedule in grid:
        for name, weights in (("ACFL", "adaptive"), ("NA", "fixed")):
            config = base_config(iterations, data={"dataset": "adult-2", "num_nodes": ADULT_NODES,
                                                   "scaling": "public_bound"},
                                 model={"kind": "linear", "bias": True, "random_features": rf, "rf_gamma": ADULT_GAMMA},
                                 stragglers={"model": "bernoulli", "p": ADULT_P},
                                 acfl={"weights": weights, "lr": public_lr(rows, rf), "lr_schedule": schedule,
                                       "sigma1_sq": None, "sigma2_sq": None, "mi_epsilon": eps})
            tag = f"adult-rf{rf}-eps{eps:g}-{schedule}-{name}"
            out[rf, eps, schedule, name] = run_experiment(config, out_dir=OUT / tag, quiet=True).summary
    return out


def mqtt_run(iterations: int) -> dict:
    """20 emulated boards over MQTT (embedded broker, 2 host processes) with Bernoulli(0.2)
    stragglers, against sim: the same W and ledger."""
    from testbed.orchestration.runner import run_experiment
    from testbed.reports.results import read_checkpoint

    config = base_config(iterations, data={"num_nodes": 20})
    sim = run_experiment(config, out_dir=OUT / "mqtt-sim", quiet=True).summary
    start = time.monotonic()
    mqtt = run_experiment(base_config(iterations, data={"num_nodes": 20}, run={"mode": "mqtt"}, mqtt={"hosts": 2}),
                          out_dir=OUT / "mqtt", quiet=True).summary
    wall = time.monotonic() - start
    diff = float(np.abs(read_checkpoint(OUT / "mqtt").state["W"] - read_checkpoint(OUT / "mqtt-sim").state["W"]).max())
    return {"sim": sim, "mqtt": mqtt, "max_w_diff": diff, "wall_s": wall}


def _m(runs: list[dict]) -> float:
    return float(np.mean([final(r["loss"]) for r in runs]))


def real_section(adult: dict, iterations: int) -> list[str]:
    """The real-data section of REPORT.md from :func:`real_data`'s summaries."""
    lines = ["## Real data: Adult-2, one-hot least squares (the issue's request; the paper has no real-data run)", "",
             f"{ADULT_NODES} i.i.d. devices, {adult['rows']:,} training rows in all; one-hot features with the numeric "
             "columns through fixed public maps, every row divided by a public bound (norm ≤ 1, entries ≤ 1: "
             f"Assumption 1), a bias column; o = 2 one-hot outputs, predicted class = argmax. Bernoulli stragglers "
             f"p = {ADULT_P}, {iterations} iterations, seed 0, full `testbed run` (sim) per row; noise σ₁² = σ₂² "
             "calibrated to the ε-MI-DP per device shown (Theorem 1 for that D). *RF*: "
             f"{ADULT_RF} random Fourier features cos(ωᵀx + b), γ = {ADULT_GAMMA:g}, entries in [−1, 1] (no √(2/D) "
             "factor: it would only shrink XᵀX against the fixed-variance noise), ω and b from the run's seed, "
             "applied inside the model's design so the coded set H_X = ΦᵀΦ + N₁ is over the embedded features. "
             "Step: the paper's η₀/t, or the constant η₀ (`acfl.lr_schedule = \"constant\"`, ours), "
             "η₀ = 1 / (public bound on λ_max(Σ XᵀX)) = 1/(2n) raw, 1/((D_rf + 1) n) with RF: no data statistic.",
             "", f"Majority share of the test set: **{adult['majority']:.4f}**.", "",
             "| features | D | ε (nats) | σ² | step | ACFL test acc. | NA test acc. | ACFL train loss | NA train loss |",
             "|---|---|---|---|---|---|---|---|---|"]
    for key, acfl in adult.items():
        if not isinstance(key, tuple) or key[3] != "ACFL":
            continue
        rf, eps, schedule, _ = key
        na = adult[rf, eps, schedule, "NA"]
        step = "η₀/t" if schedule == "eta0_over_t" else "constant"
        lines.append(f"| {'RF' if rf else 'raw'} | {acfl['plan']['features']} | {acfl['plan']['mi_epsilon_nats']:.3g} | "
                     f"{acfl['plan']['sigma1_sq']:.3g} | {step} | {acfl['final']['test_accuracy']:.4f} | "
                     f"{na['final']['test_accuracy']:.4f} | {acfl['final']['train_loss']:.4f} | "
                     f"{na['final']['train_loss']:.4f} |")
    paper = adult[0, ADULT_EPSILONS[0], "eta0_over_t", "ACFL"]["final"]["test_accuracy"]

    def best(method: str, rf: int) -> float:
        return max(v["final"]["test_accuracy"] for k, v in adult.items()
                   if isinstance(k, tuple) and k[2] == "constant" and k[3] == method and k[0] == rf)
    lines += ["", f"Train loss is the mean per sample of ½‖xW − y‖². With the paper's η₀/t the model stays at the "
              f"majority answer ({paper:.4f}): Σ η_t ≈ η₀ ln T, and η₀ must stay below ≈ 1/λ_max, so the weakly "
              f"curved directions of this ill-conditioned least squares barely move. The constant step learns: ACFL "
              f"reaches {best('ACFL', 0):.4f} test accuracy on the raw features ({best('ACFL', 0) - adult['majority']:+.4f} "
              f"over the majority share) and {best('ACFL', ADULT_RF):.4f} with random features; NA "
              f"{best('NA', 0):.4f} and {best('NA', ADULT_RF):.4f} (the exact least-squares solution of the raw "
              "features, computed centrally without noise, scores "
              f"{adult['lstsq']:.4f}). ACFL and NA differ little here: with n ≈ {adult['rows']:,} rows XᵀX dwarfs "
              "the coded noise at these ε, so the coded gradient is good whatever α (NA's fixed α = 0.5 shows in its "
              "train loss at ε = 1 only). The random features do not help here. With them the "
              "public-bound step is smaller (D_rf + 1 per row against the actual λ_max, a loose bound), their coded "
              "upload is larger (D² grows) and, at equal ε, their σ² larger (Theorem 1 grows with D). One seed: "
              "differences in the third decimal are within noise.", ""]
    return lines


def report(f1, f3, f4, pipeline_diff, adult, mqtt, seeds, iterations, real_iterations) -> str:
    lines = ["# ACFL reproduction (generated by `experiments/acfl/reproduce.py`)", "",
             "Li, Xiao, Skoglund, *Adaptive coded federated learning: privacy preservation and straggler mitigation*, "
             "arXiv 2403.14905 (extraction: `../shared/papers/acfl.md`). The paper prints no numbers: its figures are "
             "images and the text gives only the settings (acfl.md §5). What each claim needs and what our runs show:", "",
             f"Sec. V setting: N = {N}, m = {M}, d = o = {D}, X ~ U[−1, 1], W_true, W₀ ~ U[0, 1/30], Y = X W_true, "
             f"η_t = 1e-4/t (t from 1), full batch, {iterations} iterations, {seeds} seeds (each seed: its own data, "
             "W₀, noise and stragglers, shared by the methods it compares: common random numbers). Training loss is "
             "f(W_t) of eq. (1), the sum over devices; *final* = mean of the last 10 iterations, mean over seeds. "
             "ε is in nats.", ""]
    lines += ["## Fig. 1: the analytic trade-off (d = 100, o = 10, p = 0.1, N = 5, β = 10, C = 1, T = 1000, λ = 1)", "",
              "> \"under equivalent privacy levels, the upper bound in (33) reaches its minimum with the adaptive policy.\"",
              "", "| σ² | ε | α* | adaptive | α = 0 | α = 0.25 | α = 0.5 | α = 1 |", "|---|---|---|---|---|---|---|---|"]
    for s, eps, a, ad, *fx in f1:
        lines.append(f"| {s:g} | {eps:.2f} | {a:.4f} | {ad:.4f} | " + " | ".join(f"{v:.4f}" for v in fx) + " |")
    shown = all(r[3] <= min(r[4:]) + 1e-12 for r in f1)
    lines += ["", f"**{'Shown' if shown else 'Not shown'}.** The adaptive bound lies in [10, 10.2222] and is at or "
              "below every fixed-α curve at every ε; it equals the table of acfl.md §5.1 to its printed digits "
              "(one slip there: ε at σ² = 1e-3 is 721.96, printed 721.97; `tests/test_acfl.py`). `fig1.png`.", ""]
    lines += ["## Fig. 3: ACFL against NA (α = 0.5)", "",
              "> \"an increase in noise variances, aimed at enhancing privacy, inversely affects the learning "
              "performance of both methods\" … \"the performance deterioration in ACFL remains relatively modest in "
              "comparison to NA upon increasing the noise, while there is a pronounced decline in the learning "
              "performance of NA\"", "",
              "| p | σ₁² = σ₂² | ε (eq. 17) | ACFL final | NA final | ACFL α₁ → α_T |", "|---|---|---|---|---|---|"]
    for p in (0.2, 0.4):
        for s in SIGMAS_SQ:
            a, n = f3[p, s, "ACFL"], f3[p, s, "NA"]
            alpha0 = np.mean([r["alpha"][0] for r in a])
            alpha_t = np.mean([r["alpha"][-1] for r in a])
            lines.append(f"| {p} | {s:g} | {theory.mi_epsilon(D, O, s, s):.2f} | {_m(a):.4f} | {_m(n):.4f} | "
                         f"{alpha0:.3g} → {alpha_t:.2g} |")
    acfl_spread = max(_m(f3[p, SIGMAS_SQ[-1], "ACFL"]) / _m(f3[p, SIGMAS_SQ[0], "ACFL"]) for p in (0.2, 0.4))
    na_spread = min(_m(f3[p, SIGMAS_SQ[-1], "NA"]) / _m(f3[p, SIGMAS_SQ[0], "NA"]) for p in (0.2, 0.4))
    better = all(_m(f3[p, s, "ACFL"]) <= _m(f3[p, s, "NA"]) for p in (0.2, 0.4) for s in SIGMAS_SQ)
    lines += ["", f"**Shown{'' if better and na_spread > 2 else ' in part'}.** From σ² = {SIGMAS_SQ[0]:g} to "
              f"{SIGMAS_SQ[-1]:g} NA's final loss grows {na_spread:.1f}× or more (its fixed α keeps the fixed noise "
              f"of the coded set: a floor ≈ 0.375 σ², acfl.md §5.6); ACFL's by at most {acfl_spread:.3f}× "
              f"(ᾰ_t → 0 as the noiseless labels drive the gradients to 0). ACFL ≤ NA in every cell: "
              f"{'yes' if better else 'no'}. \"Both methods\" degrade with σ²: for ACFL the change is within "
              "seed noise at this scale. `fig3.png` (mean over seeds).", ""]
    lines += ["## Fig. 4: ACFL against SCFL at equal ε (p = 0.2)", "",
              "> \"ACFL achieves superior learning performance under equivalent privacy level\" … \"the learning "
              "performance of ACFL exhibits greater resilience and suffers less from increasing the noise variances "
              "to heighten the privacy level.\"", "",
              "SCFL's encoding and its MI-DP theorem (Theorem 2 of [24]) are not in the seeds. Ours: each device "
              "uploads X̃ = G X + N₁ (D × D) and Ỹ = G Y + N₂ (D × o), the same size as ACFL's upload, G (D × m) with "
              "unit-norm Gaussian columns (E[GᵀG] = I); the server keeps Σ X̃ᵀX̃, Σ X̃ᵀỸ (the stacked coded set's "
              "Gram), computes (Σ X̃ᵀX̃ − n D σ₁² I) W − Σ X̃ᵀỸ (unbiased over G and the noise) and aggregates with "
              "the fixed α = 0.5 and the same 1/(1−p). Its ε is a bound **derived here** (`testbed.privacy.acfl."
              "scfl_epsilon`): with G known to the server, X_jk enters only through g_j X_jk + N₁[:, k], so "
              "ε = ½ ln(1 + 1/σ₁²) per entry; σ₂² = σ₁².", "",
              "| ε (nats) | ACFL σ² | SCFL σ² | ACFL final | SCFL final |", "|---|---|---|---|---|"]
    for eps in EPSILONS:
        sa = AcflSection(mi_epsilon=eps).noise(D, O)[0]
        ss = AcflSection(mi_epsilon=eps, encoding="projection").noise(D, O)[0]
        lines.append(f"| {eps:g} | {sa:.4g} | {ss:.3g} | {_m(f4[eps, 'ACFL']):.4f} | {_m(f4[eps, 'SCFL']):.4f} |")
    wins = all(_m(f4[e, "ACFL"]) < _m(f4[e, "SCFL"]) for e in EPSILONS)
    gaps = [_m(f4[e, "SCFL"]) - _m(f4[e, "ACFL"]) for e in EPSILONS]
    widening = all(b >= a for a, b in zip(gaps, gaps[1:]))
    lines += ["", f"**{'Shown' if wins and widening else 'Shown in part' if wins else 'Not shown'}.** ACFL below SCFL "
              f"at every ε: {'yes' if wins else 'no'}; the gap widens as ε falls: {'yes' if widening else 'no'} "
              f"({', '.join(f'{g:.3g}' for g in gaps)}). SCFL's error at large ε is the projection's (a rank-D "
              "sketch of each device's data), at small ε its noise; ACFL's adaptive weight drops its coded gradient "
              "either way. The result depends on our SCFL reading. `fig4.png`.", ""]
    if adult is not None:
        lines += real_section(adult, real_iterations)
    lines += ["## Checks of the pipeline", "",
              f"- `testbed run` (sim, {iterations} iterations, seed 0, p = 0.2, σ² = 1) and the in-memory trajectory "
              f"these figures use give the same W_T: max |ΔW| = {pipeline_diff:.2g}."]
    if mqtt is not None:
        s = mqtt["mqtt"]
        lines.append(f"- Over MQTT: 20 emulated boards (embedded broker, 2 host processes), Bernoulli p = 0.2, "
                     f"{s['rounds']} iterations: status {s['status']}, {s['stragglers']['rounds_straggled']} "
                     f"node-rounds straggled, max |W_mqtt − W_sim| = {mqtt['max_w_diff']:.2g}, "
                     f"{mqtt['wall_s']:.1f} s wall; each node's ledger holds its one-time upload "
                     f"({s['nodes']['0']['mi_epsilon_nats']:.2f} nats MI-DP, Theorem 1).")
    lines += ["", "The MI-DP of Theorem 1 covers the one-time coded upload only; the gradients each device sends "
              "during training are not covered (the paper's scope), and the ledger says so.", ""]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=1000)
    parser.add_argument("--real-iterations", type=int, default=300)
    parser.add_argument("--skip-mqtt", action="store_true")
    parser.add_argument("--skip-real", action="store_true")
    args = parser.parse_args()
    if "TESTBED_DATA" not in os.environ and SHARED_ADULT.exists():
        os.environ["TESTBED_DATA"] = str(SHARED_ADULT)
    shutil.rmtree(OUT, ignore_errors=True)  # this script's own runs, redone
    OUT.mkdir(parents=True)
    f1 = fig1()
    f3 = fig3(args.seeds, args.iterations)
    plot_runs(HERE / "fig3.png", [(f"(a) p = {p}", {f"{name} σ² = {s:g}": (f3[p, s, name], ("-" if name == "ACFL" else "--"))
                                                    for s in SIGMAS_SQ for name in ("ACFL", "NA")}) for p in (0.2, 0.4)],
              "Fig. 3: ACFL (solid) and NA (dashed), mean over seeds")
    f4 = fig4(args.seeds, args.iterations)
    plot_runs(HERE / "fig4.png", [("p = 0.2", {f"{name} ε = {e:g}": (f4[e, name], ("-" if name == "ACFL" else "--"))
                                               for e in EPSILONS for name in ("ACFL", "SCFL")})],
              "Fig. 4: ACFL (solid) and SCFL (dashed) at equal ε-MI-DP, mean over seeds")
    diff = pipeline_check(args.iterations)
    adult = None if args.skip_real else real_data(args.real_iterations)
    mqtt = None if args.skip_mqtt else mqtt_run(50)
    (HERE / "REPORT.md").write_text(report(f1, f3, f4, diff, adult, mqtt, args.seeds, args.iterations,
                                           args.real_iterations))
    print((HERE / "REPORT.md").read_text())


if __name__ == "__main__":
    main()
