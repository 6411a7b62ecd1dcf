"""Reproduce the experiments of DWFL (Chen et al., arXiv 2109.09142, Figs. 2–6) on Adult-2, or with a
CNN on images (``--task cnn``).

Every run is the task's base file (``base.toml``: logistic regression on Adult-2; ``base-cnn.toml``:
the small CNN of testbed.torch_models on the 8×8 digits, or on CIFAR-10 with its CNN where the
CIFAR-10 files are on this machine; the paper's defaults either way: P = 60 dBm, ε = 0.5 per round,
over-the-air decentralised) with the overrides of one figure's curve, run through the testbed's sim
runner for several seeds. The script writes one PNG per figure and ``REPORT.md`` (``REPORT-cnn.md``,
``figN-cnn.png`` for the CNN; each claim of the paper quoted, and whether these runs show it, with
numbers) into this folder; the runs themselves go to ``runs/dwfl-reproduce[-cnn]/`` (not committed); a finished run found there is kept, so a rerun
after an interruption (or after a change to the report) only runs what is missing.

The paper gives no numbers (dwfl.md §6): a claim is "shown" when the final training loss (mean of
the last 10 rounds, mean over seeds) moves the claimed way by more than 2 %.

Run: ``.venv/bin/python experiments/dwfl/reproduce.py [--task adult|cnn] [--seeds 3] [--rounds 100] [--jobs 2]``
(Adult from data.path, $TESTBED_DATA, or /work/shared/datasets/adult when present; CIFAR-10 from
$TESTBED_DATA or the cache, never downloaded by this script).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))

#: task → (base file, suffix of the outputs, what the runs train on, for the report)
TASKS = {
    "adult": (HERE / "base.toml", "", "logistic regression on Adult-2 (i.i.d. split over N nodes)"),
    "cnn": (HERE / "base-cnn.toml", "-cnn", "the small CNN of `testbed.torch_models` (1,370 parameters) on the "
            "8×8 digits scikit-learn ships (i.i.d. split, 59 images per node)"),
}
#: The CIFAR-10 variant of the CNN task: its data and network, the paper's own set-up.
CIFAR = (["data.dataset='cifar10'", "data.samples_per_node=1000", "model.network='cifar10_cnn'"],
         "the small CNN of PyTorch's CIFAR-10 tutorial (62,006 parameters) on CIFAR-10 (i.i.d. split, "
         "1,000 images per node), as the paper")
SHARED_ADULT = REPO.parent / "shared" / "datasets" / "adult"
TOL = 0.02  # relative change in final loss that counts as a difference
P_DBM = (20, 40, 60, 80)

#: The three readings of Fig. 2 (dwfl.md §4.4): the literal algorithm with exact calibration, the
#: realisable update with exact calibration (the testbed's default), and the reading that
#: reproduces the paper's trend.
READINGS = {
    "A, exact calibration (literal)": ["dwfl.variant='A'", "dwfl.calibration='with_channel_noise'"],
    "B, exact calibration (default)": ["dwfl.variant='B'", "dwfl.calibration='with_channel_noise'"],
    "B, artificial-only calibration": ["dwfl.variant='B'", "dwfl.calibration='artificial_only'"],
}


def sweeps(eps_scale: float = 1.0) -> dict[str, list[tuple[str, str, list[str]]]]:
    """figure → [(panel, curve, overrides)]; every ε run is the paper's (the curve's name) × ``eps_scale``."""
    figs: dict[str, list] = {"fig2": [], "fig3": [], "fig4": [], "fig5": [], "fig6": []}
    for reading, ov in READINGS.items():
        for n in (10, 30):
            for p in P_DBM:
                figs["fig2"].append((f"{reading}, N={n}", f"P={p} dBm", ov + [f"data.num_nodes={n}", f"dwfl.power_dbm={p}"]))
    for eps in (0.1, 0.5):
        for n in (15, 20, 25, 30):
            figs["fig3"].append((f"eps={eps}", f"N={n}", [f"data.num_nodes={n}", f"dwfl.epsilon={eps * eps_scale}"]))
    for n in (10, 30):
        for eps in (0.1, 0.25, 0.5, 1.0):
            figs["fig4"].append((f"N={n}", f"eps={eps}", [f"data.num_nodes={n}", f"dwfl.epsilon={eps * eps_scale}"]))
        for eps in (0.1, 0.5):
            for scheme in ("ota_d2d", "orthogonal_d2d"):
                figs["fig5"].append((f"N={n}", f"{scheme}, eps={eps}",
                                     [f"data.num_nodes={n}", f"dwfl.epsilon={eps * eps_scale}", f"dwfl.scheme='{scheme}'"]))
        for scheme in ("ota_d2d", "ota_central"):
            figs["fig6"].append((f"N={n}", scheme, [f"data.num_nodes={n}", f"dwfl.scheme='{scheme}'"]))
    return figs


def run_one(job: tuple[str, str, str, list[str], int, int, str, str]) -> dict:
    """One run (in a worker process): its loss curve, accuracy and privacy settings."""
    from testbed.config import load_config
    from testbed.orchestration.runner import run_experiment
    from testbed.orchestration.sweep import is_finished
    from testbed.reports.results import read_metrics

    fig, panel, curve, overrides, seed, rounds, base, out_root = job
    slug = "".join(ch if ch.isalnum() else "-" for ch in f"{panel}-{curve}").strip("-")
    cfg = load_config(base, overrides + [f"run.seed={seed}", f"dwfl.rounds={rounds}"])
    out = Path(out_root) / fig / f"{slug}-s{seed}"
    if is_finished(out):  # kept from an earlier invocation: a rerun only redraws and rewrites
        summary = json.loads((out / "summary.json").read_text())
    else:
        if out.exists():
            import shutil

            shutil.rmtree(out)
        summary = run_experiment(cfg, out_dir=out, quiet=True).summary
    rows = read_metrics(out)
    st = summary["algorithm_settings"]
    return {"fig": fig, "panel": panel, "curve": curve, "seed": seed,
            "loss": [r["train_loss"] for r in rows], "acc": [r["test_accuracy"] for r in rows],
            "sigma2": st["sigma2"], "eps_round": st["epsilon_round_max"], "eps_T": st["epsilon_composed_rdp"],
            "c": st["c"], "noise_w": st["noise_power_w"]}


def collect(results: list[dict]) -> dict:
    """(fig, panel, curve) → mean loss curve, final loss, final accuracy, σ² over seeds."""
    table: dict = {}
    for r in results:
        table.setdefault((r["fig"], r["panel"], r["curve"]), []).append(r)
    out = {}
    for key, runs in table.items():
        loss = np.mean([r["loss"] for r in runs], axis=0)
        out[key] = {"loss": loss, "final": float(np.mean([np.mean(r["loss"][-10:]) for r in runs])),
                    "acc": float(np.mean([np.mean(r["acc"][-10:]) for r in runs])),
                    "sigma2": float(np.mean([r["sigma2"] for r in runs])),
                    "eps_round": max(r["eps_round"] for r in runs), "eps_T": max(r["eps_T"] for r in runs),
                    "snr_db": float(np.mean([10 * np.log10(r["c"] ** 2 / r["noise_w"]) for r in runs]))}
    return out


def plot(fig: str, title: str, agg: dict, suffix: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = list(dict.fromkeys(p for (f, p, _c) in agg if f == fig))
    cols = 2
    rows = -(-len(panels) // cols)
    figure, axes = plt.subplots(rows, cols, figsize=(9, 2.9 * rows), squeeze=False)
    for ax, panel in zip(axes.flat, panels):
        for (f, p, curve), v in agg.items():
            if f == fig and p == panel:
                ax.plot(np.arange(1, len(v["loss"]) + 1), v["loss"], label=curve, lw=1.2)
        ax.set_title(panel, fontsize=9)
        ax.set_xlabel("round", fontsize=8)
        ax.set_ylabel("train loss of x̄", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(panels):]:
        ax.axis("off")
    figure.suptitle(title, fontsize=10)
    figure.tight_layout()
    path = HERE / f"{fig}{suffix}.png"
    figure.savefig(path, dpi=72)
    plt.close(figure)
    return path


def verdict(better: float, worse: float) -> str:
    """'yes' if ``better`` (final loss of the claimed-better curve) is lower by more than TOL."""
    change = (worse - better) / worse
    if change > TOL:
        return f"**yes** ({change:+.0%})"
    if change < -TOL:
        return f"**opposite** ({change:+.0%})"
    return f"**no difference** ({change:+.0%})"


def _table(agg: dict, fig: str, panel: str, curves: list[str]) -> list[str]:
    lines = ["| curve | final train loss | test acc | σ² | ε/round (max) | ε over T (RDP) | c²/σ_m² (dB) |",
             "|---|---|---|---|---|---|---|"]
    for c in curves:
        v = agg[(fig, panel, c)]
        lines.append(f"| {c} | {v['final']:.4f} | {v['acc']:.4f} | {v['sigma2']:.4g} | {v['eps_round']:.3g} | "
                     f"{v['eps_T']:.3g} | {v['snr_db']:.1f} |")
    return lines


def report(agg: dict, seeds: int, rounds: int, wall_s: float, task: str, trains_on: str, suffix: str,
           eps_scale: float = 1.0) -> str:
    L = lambda fig, panel, curve: agg[(fig, panel, curve)]["final"]  # noqa: E731
    base = TASKS[task][0]
    other = ("The same figures with a CNN on images: `REPORT-cnn.md`." if task == "adult" else
             "The same figures with logistic regression on Adult-2: `REPORT.md`; with every ε × 10: "
             "`REPORT-cnn-eps10x.md`. Test accuracy of the untrained CNN, and of a constant guess on the digits' "
             "10 balanced classes, is about 0.1.")
    md = [
        f"# DWFL reproduction, {trains_on.split(' (')[0]} (generated by `experiments/dwfl/reproduce.py"
        f"{' --task cnn' if task == 'cnn' else ''}{f' --epsilon-scale {eps_scale:g}' if eps_scale != 1 else ''}`)",
        "",
        "Paper: Chen, Yu, Zou, Yu, Cheng, *Decentralized Wireless Federated Learning with Differential Privacy*,",
        "arXiv 2109.09142 (extraction: `shared/papers/dwfl.md`). The paper trains a CNN on CIFAR-10 and prints",
        f"no numbers, only curves (dwfl.md §6); here: {trains_on},",
        f"{rounds} rounds, {seeds} seeds per curve, Rayleigh fading drawn once, σ_m² = 1 W, δ = 1e-5, γ = 0.5,",
        f"η = 0.5, g_max = 1, batch 32 (`{base.name}`). The metric is the training loss of the average model x̄",
        "(mean of the last 10 rounds, mean over seeds): \"convergence rate\" in the paper. A claim is **yes**",
        f"when the claimed-better curve ends more than {TOL:.0%} lower, **opposite** when more than {TOL:.0%} higher.",
        "ε is the paper's per-round ε (eq. 11) at the worst receiver; \"ε over T\" composes the rounds with",
        "dp-accounting (RDP), which the paper does not do. c²/σ_m² is the received model SNR (eq. 4).",
        f"Whole set: {wall_s / 60:.1f} min on this machine. {other}",
        "",
    ]
    header = len(md)
    # Fig. 2
    md += ["## Fig. 2: transmit power P", "",
           "> \"stronger transmitting power leads to more rapid convergence, it is reasonable since greater power",
           "> has stronger ability to resist the interference of channel noise.\"", ""]
    for reading in READINGS:
        for n in (10, 30):
            panel = f"{reading}, N={n}"
            md.append(f"**{panel}**: P = 80 dBm better than 20 dBm? "
                      + verdict(L("fig2", panel, "P=80 dBm"), L("fig2", panel, "P=20 dBm")))
            md += [""] + _table(agg, "fig2", panel, [f"P={p} dBm" for p in P_DBM]) + [""]
    s20 = agg[("fig2", "B, exact calibration (default), N=10", "P=20 dBm")]["sigma2"]
    s80 = agg[("fig2", "B, exact calibration (default), N=10", "P=80 dBm")]["sigma2"]
    md += ["**Reproduction risk (dwfl.md §4.4).** With exact calibration the total noise at the worst receiver,",
           "normalised by c², is fixed by ε: (2γ g_max)² 2 ln(1.25/δ)/ε², independent of P. More power only",
           "shrinks the channel-noise share, so the artificial noise must grow to make up for it: here σ² goes",
           f"from {s20:.4g} at 20 dBm to {s80:.4g} at 80 dBm (N = 10). Under the literal update (variant A) channel",
           "noise never reaches the models, so more power can only add noise to learning; under the realisable",
           "update (variant B) channel noise m_i/(c(N−1)) enters the models, but the total stays pinned by ε.",
           "The paper's trend appears only when σ² is calibrated ignoring channel noise (option (i), third",
           "reading), so that channel noise is an extra that shrinks as P grows, and variant B lets it matter.",
           "Read the three tables above against each other for what our runs show.", ""]
    # Fig. 3
    md += ["## Fig. 3: number of workers N", "",
           "> \"DWFL performs better with more workers, which is consistent with our analysis.\"", ""]
    for eps in (0.1, 0.5):
        panel = f"eps={eps}"
        md.append(f"**ε = {eps}**: N = 30 better than N = 15? " + verdict(L("fig3", panel, "N=30"), L("fig3", panel, "N=15")))
        md += [""] + _table(agg, "fig3", panel, [f"N={n}" for n in (15, 20, 25, 30)]) + [""]
    md += ["Mechanism: the calibrated noise at a receiver is fixed by ε, and a node divides what it hears by",
           "c(N−1), so its per-round noise falls like 1/(N−1) (Remark IV.1's O(1/√N) privacy in reverse).", ""]
    # Fig. 4
    md += ["## Fig. 4: privacy budget ε", "",
           "> \"It shows that DWFL has better convergence results with smaller privacy budget. Smaller ε means",
           "> that more noise is added, which dampens the learning process.\"", "",
           "The two sentences contradict each other (dwfl.md §7 item 10); we test the consistent reading,",
           "larger ε (less noise) converges better.", ""]
    for n in (10, 30):
        panel = f"N={n}"
        md.append(f"**N = {n}**: ε = 1 better than ε = 0.1? " + verdict(L("fig4", panel, "eps=1.0"), L("fig4", panel, "eps=0.1")))
        md += [""] + _table(agg, "fig4", panel, [f"eps={e}" for e in (0.1, 0.25, 0.5, 1.0)]) + [""]
    # Fig. 5
    md += ["## Fig. 5: over the air vs orthogonal", "",
           "> \"[the non-orthogonal scheme] has better advantage over orthogonal scheme in the case of the same",
           "> privacy level\" ... \"converges faster in both N=10 and N=30\" ... \"the orthogonal scheme almost",
           "> failed to converge when ε = 0.1 and N=10\"", ""]
    for n in (10, 30):
        panel = f"N={n}"
        for eps in (0.1, 0.5):
            md.append(f"**N = {n}, ε = {eps}**: over the air better than orthogonal? "
                      + verdict(L("fig5", panel, f"ota_d2d, eps={eps}"), L("fig5", panel, f"orthogonal_d2d, eps={eps}")))
        md += [""] + _table(agg, "fig5", panel, [f"{s}, eps={e}" for e in (0.1, 0.5) for s in ("ota_d2d", "orthogonal_d2d")]) + [""]
    start = agg[("fig5", "N=10", "orthogonal_d2d, eps=0.1")]["loss"][0]
    end = L("fig5", "N=10", "orthogonal_d2d, eps=0.1")
    md += [f"Orthogonal, ε = 0.1, N = 10: loss {start:.3f} after round 1, {end:.3f} at the end "
           f"({'does not converge' if end >= start else 'decreases'}; "
           f"{'ln 2 = 0.693' if task == 'adult' else 'ln 10 = 2.303'} is the untrained model's loss).", "",
           "Mechanism (dwfl.md §6.3): each orthogonal link must carry the whole ε-calibrated noise, which",
           "over the air is shared by the N−1 superposed senders; for the same ε the disagreement noise is",
           "about (N−1)× larger.", ""]
    # Fig. 6
    md += ["## Fig. 6: centralised (parameter server, Seif et al.) vs decentralised", "",
           "> \"our decentralized algorithm DWFL acquires more robustness and better convergence results in",
           "> contrast with that in centralized setting.\"", ""]
    for n in (10, 30):
        panel = f"N={n}"
        md.append(f"**N = {n}**: decentralised better than centralised? "
                  + verdict(L("fig6", panel, "ota_d2d"), L("fig6", panel, "ota_central")))
        md += [""] + _table(agg, "fig6", panel, ["ota_d2d", "ota_central"]) + [""]
    md += ["Mechanism here: the server's model takes the whole calibrated noise (divided by N) every round,",
           "while in DWFL the artificial noise sums to zero over the nodes (the zero-sum structure behind",
           "eq. 9), so x̄ only sees channel noise. The paper's explanation (more frequent exchanges) is not",
           "what drives it in our runs: both schemes exchange once per round.", "",
           "## Figures", "", *[f"- `{f}{suffix}.png`" for f in ("fig2", "fig3", "fig4", "fig5", "fig6")], ""]
    return "\n".join(md[:header] + _summary(md[header:]) + md[header:])


def _summary(body: list[str]) -> list[str]:
    """Every verdict line of the report's body under its figure, as a list to read first."""
    lines, figure = ["## Summary of the verdicts", ""], ""
    for line in body:
        if line.startswith("## "):
            figure = line[3:].split(":")[0]
        elif line.startswith("**") and "? **" in line:
            lines.append(f"- {figure}, {line}")
    return lines + [""]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=100)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--task", choices=sorted(TASKS), default="adult")
    ap.add_argument("--epsilon-scale", type=float, default=1.0,
                    help="run every ε of the paper times this (outputs get the suffix -epsNx)")
    args = ap.parse_args(argv)
    base, suffix, trains_on = TASKS[args.task]
    extra: list[str] = []
    if args.task == "adult" and "TESTBED_DATA" not in os.environ and SHARED_ADULT.exists():
        os.environ["TESTBED_DATA"] = str(SHARED_ADULT)
    if args.task == "cnn":
        from testbed.data.cifar10 import present

        if present():
            extra, trains_on = list(CIFAR[0]), CIFAR[1]
        print(f"training {trains_on}", flush=True)
        # two worker processes on two cores: torch's own threads would oversubscribe them
        os.environ.setdefault("TESTBED_TORCH_THREADS", str(max(1, (os.cpu_count() or 1) // args.jobs)))
    if args.epsilon_scale != 1.0:
        suffix += f"-eps{args.epsilon_scale:g}x"
        trains_on += f"; every ε is the paper's × {args.epsilon_scale:g} (curve names give the paper's)"
        extra.append(f"dwfl.epsilon={0.5 * args.epsilon_scale}")  # base.toml's ε = 0.5, scaled
    # the CIFAR-10 runs apart from the digits' (a finished run found in the folder is kept)
    out_root = str(REPO / "runs" / f"dwfl-reproduce{suffix}{'-cifar10' if extra[:1] == CIFAR[0][:1] else ''}")
    start = time.monotonic()
    jobs = [(fig, panel, curve, extra + ov, seed, args.rounds, str(base), out_root)
            for fig, items in sweeps(args.epsilon_scale).items() for panel, curve, ov in items for seed in range(args.seeds)]
    print(f"{len(jobs)} runs on {args.jobs} processes", flush=True)
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        results = []
        for i, r in enumerate(pool.map(run_one, jobs, chunksize=2), 1):
            results.append(r)
            if i % 20 == 0:
                print(f"  {i}/{len(jobs)} runs, {time.monotonic() - start:.0f} s", flush=True)
    agg = collect(results)
    titles = {"fig2": "Fig. 2: transmit power P (three readings of dwfl.md §4.4)", "fig3": "Fig. 3: number of workers N",
              "fig4": "Fig. 4: privacy budget ε per round", "fig5": "Fig. 5: over the air vs orthogonal",
              "fig6": "Fig. 6: centralised (PS) vs decentralised"}
    for fig, title in titles.items():
        path = plot(fig, title, agg, suffix)
        print(f"wrote {path.relative_to(REPO)} ({path.stat().st_size // 1024} KB)")
    spent = Path(out_root) / "wall_s.txt"  # summed over the invocations that ran into the runs' folder
    wall = time.monotonic() - start + (float(spent.read_text()) if spent.exists() else 0.0)
    spent.write_text(f"{wall:.1f}")
    (HERE / f"REPORT{suffix}.md").write_text(report(agg, args.seeds, args.rounds, wall, args.task, trains_on, suffix,
                                                             args.epsilon_scale))
    print(f"wrote experiments/dwfl/REPORT{suffix}.md; {len(jobs)} runs in {wall:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
