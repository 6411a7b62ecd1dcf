"""Reproduce the experiments of DWFL (Chen et al., arXiv 2109.09142, Figs. 2–6) on Adult-2, or with a
CNN on images (``--task cnn``), and the private model that learns (``--task learns``, learns.toml).

Every run is the task's base file (``base.toml``: logistic regression on Adult-2; ``base-cnn.toml``:
the small CNN of testbed.learning.torch_models on the 8×8 digits, or on CIFAR-10 with its CNN where the
CIFAR-10 files are on this machine; the paper's defaults either way: P = 60 dBm, ε = 0.5 per round,
over-the-air decentralised) with the overrides of one figure's curve, run through the testbed's sim
runner for several seeds (the same seeds for every curve: runs are paired by seed). Besides the
paper's five figures, ``eps`` measures test accuracy against the per-round ε (where learning begins).

Two phases. Running writes each scenario's compact results into ``data/<task>[-epsNx]/<scenario>.json``
(per run: seed, settings, final metrics, the loss curve subsampled; the scenario's measured wall
time); ``--scenarios fig2,eps`` runs and rewrites only those files. Reporting rewrites REPORT.md
(adult), REPORT-cnn.md (cnn, with the learns.toml section) and REPORT-cnn-eps10x.md
(``--epsilon-scale 10``) and their figures from data/ alone: ``--report-only`` does only that,
for every report whose data is committed, byte for byte (tests/test_reproductions.py).

Verdicts (testbed.reports.verdicts, docs/statistics.md), Holm-adjusted within each figure's family (one per
metric: the train loss, and the test accuracy beside it):
a trend over a setting (Figs. 2–4) by Spearman's ρ within each seed (n = seeds, a permutation p
within the seeds), a comparison of two curves (Figs. 5–6) by the paired mean difference over seeds. The metric is
the paper's, training loss of x̄ (mean of the last 10 rounds), and beside it test accuracy, with
chance and the majority share: a model at chance shows nothing about convergence.

Seeds by power, not by floor: each paired family declares its effect of interest (dwfl_seeds.ACC_EFFECT,
LOSS_EFFECT_SHARE) and says how many seeds detect it at 80 % power after Holm, from the data's sd;
a task's seeds (SEEDS, the default of ``--seeds``) are max(8, the most its families need), capped by
a compute budget (dwfl_seeds.BUDGET_MIN): ``--plan-seeds`` prints that plan from the committed data and runs
nothing. ``--extend`` adds seeds to committed data files without redoing theirs: it first runs the
cheapest committed run again and refuses unless it reproduces exactly, then runs only the missing
seeds and merges them in a full regeneration's order.

Run: ``.venv/bin/python experiments/dwfl/reproduce.py [--task adult|cnn|learns] [--seeds N]
[--rounds 40] [--jobs 1] [--scenarios fig2,...] [--epsilon-scale 10] [--extend] [--report-only]
[--plan-seeds]``
(Adult from data.path, $TESTBED_DATA, or the package's copy; CIFAR-10 from
$TESTBED_DATA or the cache, never downloaded by this script). The finished runs go to
``runs/dwfl-reproduce*/`` (not committed); a finished run found there is kept, and a run that
several figures share (the same settings and seed) runs once.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
DATA = HERE / "data"
sys.path.insert(0, str(REPO))

from testbed.reports.majority import class_shares_of_test_set as class_shares  # noqa: E402
from testbed.reports.stats import t_interval  # noqa: E402
from testbed.reports.verdicts import RULE, Family, Pending, recording, write_report  # noqa: E402

from dwfl_extend import extend_check, merge_runs  # noqa: E402  (modules beside this script)
from dwfl_plot import plot  # noqa: E402
from dwfl_seeds import describe_both, figure_families, fill_both, plan, plan_table, seeds_paragraph  # noqa: E402
from dwfl_tables import chance_note, ci_text, flag, learns, panel_table  # noqa: E402

#: task → (base file, suffix of the outputs, what the runs train on, for the report)
TASKS = {
    "adult": (HERE / "base.toml", "", "logistic regression on Adult-2 (i.i.d. split over N nodes)"),
    "cnn": (HERE / "base-cnn.toml", "-cnn", "the small CNN of `testbed.learning.torch_models` (1,370 parameters) on the "
            "8×8 digits scikit-learn ships (i.i.d. split, 59 images per node)"),
    "learns": (HERE / "learns.toml", "-learns", "DWFL at the paper's ε (0.5 per round) and channel on mnist-5k: 40 nodes of 125 images, multinomial logistic regression on the pixels (public-bound scaling), γ = 0.5, batch 64, 100 rounds (`learns.toml`)."),
}
#: The CIFAR-10 variant of the CNN task: its data and network, the paper's own set-up.
CIFAR = (["data.dataset='cifar10'", "data.samples_per_node=1000", "model.network='cifar10_cnn'"],
         "the small CNN of PyTorch's CIFAR-10 tutorial (62,006 parameters) on CIFAR-10 (i.i.d. split, "
         "1,000 images per node), as the paper")
P_DBM = (20, 40, 60, 80)
#: Per-round ε of the privacy-utility curve (N = 10, everything else the base file's).
EPS_CURVE = (0.5, 1.0, 2.0, 5.0, 10.0, 20.0, 50.0)
#: Seeds per curve of each data folder (--seeds overrides): max(8, the seeds the folder's families need for
#: their effects of interest), capped by the compute budget dwfl_seeds.BUDGET_MIN; ``--plan-seeds`` prints the plan
#: from the committed data. learns.toml's check (no family) keeps its 5.
SEEDS = {"adult": 8, "cnn": 8, "cnn-eps10x": 8, "learns": 5}
LAST = 10  # rounds averaged for a run's final loss and accuracy
CURVE_EVERY = 2  # rounds between the stored points of a loss curve

#: The three readings of Fig. 2 (dwfl.md §4.4): the literal algorithm with exact calibration, the
#: realisable update with exact calibration (the testbed's default), and the reading that
#: reproduces the paper's trend.
READINGS = {
    "A, exact calibration (literal)": ["dwfl.variant='A'", "dwfl.calibration='with_channel_noise'"],
    "B, exact calibration (default)": ["dwfl.variant='B'", "dwfl.calibration='with_channel_noise'"],
    "B, artificial-only calibration": ["dwfl.variant='B'", "dwfl.calibration='artificial_only'"],
}
TITLES = {"fig2": "Fig. 2: transmit power P (three readings of dwfl.md §4.4)", "fig3": "Fig. 3: number of workers N",
          "fig4": "Fig. 4: privacy budget ε per round", "fig5": "Fig. 5: over the air vs orthogonal",
          "fig6": "Fig. 6: centralised (PS) vs decentralised", "eps": "Test accuracy against the per-round ε (N = 10)"}


def sweeps(eps_scale: float = 1.0) -> dict[str, list[tuple[str, str, list[str]]]]:
    """scenario → [(panel, curve, overrides)]; every ε run is the paper's (the curve's name) × ``eps_scale``;
    the ε curve only at the paper's scale (its ε are its own)."""
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
    if eps_scale == 1.0:
        figs["eps"] = [("N=10", f"eps={e:g}", ["data.num_nodes=10", f"dwfl.epsilon={e}"]) for e in EPS_CURVE]
    return figs


def _sig(x: float, digits: int = 6) -> float:
    """``x`` rounded to ``digits`` significant digits (compact, platform-independent JSON)."""
    return float(f"{x:.{digits}g}")


def run_one(job: tuple[str, list[str], int, int, str, str]) -> dict:
    """One run (in this or a worker process): its final metrics, subsampled loss curve and privacy
    settings. The run's folder is named by its settings, so figures that share a run share its folder."""
    from testbed.assembly.config import load_config
    from testbed.orchestration.runner import run_experiment
    from testbed.orchestration.sweep import is_finished
    from testbed.reports.results import read_metrics

    base, overrides, seed, rounds, out_root, key = job
    all_overrides = overrides + [f"run.seed={seed}"] + ([f"dwfl.rounds={rounds}"] if rounds else [])
    cfg = load_config(base, all_overrides)
    # named by the resolved settings (less the run's name), so the same run reached by other overrides is found
    digest = hashlib.sha256(cfg.model_copy(update={"run": cfg.run.model_copy(update={"name": ""})})
                            .model_dump_json().encode()).hexdigest()[:16]
    out = Path(out_root) / f"{digest}-s{seed}"
    if not is_finished(out):  # one kept from an earlier invocation is reused
        if out.exists():
            import shutil

            shutil.rmtree(out)
        run_experiment(cfg, out_dir=out, quiet=True)
    summary = json.loads((out / "summary.json").read_text())
    rows = read_metrics(out)
    st = summary["algorithm_settings"]
    loss = [r["train_loss"] for r in rows]
    acc = [r["test_accuracy"] for r in rows]
    chance, majority = class_shares(cfg)
    return {"key": key, "seed": seed, "overrides": overrides,
            "final_loss": _sig(float(np.mean(loss[-LAST:]))), "final_acc": _sig(float(np.mean(acc[-LAST:]))),
            "chance": _sig(chance), "majority": _sig(majority),
            "sigma2": _sig(st["sigma2"]), "eps_round": _sig(st["epsilon_round_max"]),
            "eps_T": _sig(st["epsilon_composed_rdp"]), "eps_ledger": _sig(max(n["epsilon"] for n in summary["nodes"].values())),
            "snr_db": _sig(10 * np.log10(st["c"] ** 2 / st["noise_power_w"])), "wall_s": round(summary["wall_s"], 2),
            "loss": [_sig(v, 4) for v in loss[CURVE_EVERY - 1::CURVE_EVERY]]}


def data_dir(task: str, eps_scale: float) -> Path:
    return DATA / (task + (f"-eps{eps_scale:g}x" if eps_scale != 1.0 else ""))


def run_task(args: argparse.Namespace) -> None:
    """Run the task's scenarios and write each one's data file (only the scenarios run); with
    ``args.extend``, only the seeds a committed file lacks, merged into it (:func:`_extend`)."""
    base, suffix, trains_on = TASKS[args.task]
    extra: list[str] = []
    if args.task == "cnn":
        from testbed.data.cifar10 import present

        if present():
            extra, trains_on = list(CIFAR[0]), CIFAR[1]
    if args.task in ("cnn", "learns"):
        # one torch thread per process: the per-node batches are small, and two threads on a busy
        # machine made a CNN run ~4x slower here
        os.environ.setdefault("TESTBED_TORCH_THREADS", "1")
    if args.epsilon_scale != 1.0:
        suffix += f"-eps{args.epsilon_scale:g}x"
        trains_on += f"; every ε is the paper's × {args.epsilon_scale:g} (curve names give the paper's)"
        extra.append(f"dwfl.epsilon={0.5 * args.epsilon_scale}")  # the base file's ε = 0.5, scaled
    print(f"training {trains_on}", flush=True)
    out_root = str(REPO / "runs" / f"dwfl-reproduce{suffix}{'-cifar10' if extra[:1] == CIFAR[0][:1] else ''}")
    scenarios = ({"learns": [("learns.toml", "learns.toml", [])]} if args.task == "learns"
                 else sweeps(args.epsilon_scale))
    chosen = args.scenarios.split(",") if args.scenarios else list(scenarios)
    unknown = sorted(set(chosen) - set(scenarios))
    if unknown:
        raise SystemExit(f"--scenarios: unknown {', '.join(unknown)} (known: {', '.join(scenarios)})")
    rounds = 0 if args.task == "learns" else args.rounds  # learns.toml runs as written
    out = data_dir(args.task, args.epsilon_scale)
    seeds = args.seeds if args.seeds is not None else SEEDS[out.name]
    out.mkdir(parents=True, exist_ok=True)
    settings = {"task": args.task, "epsilon_scale": args.epsilon_scale, "trains_on": trains_on,
                "base": Path(base).name, "rounds": rounds or None, "last_rounds": LAST, "curve_every": CURVE_EVERY}
    committed = extend_check(out, chosen, settings, seeds, str(base), run_one, REPO) if args.extend else {}
    for scenario in (committed if args.extend else chosen):
        start = time.monotonic()
        items = scenarios[scenario]
        have = len(committed[scenario]["seeds"]) if scenario in committed else 0
        jobs = [(str(base), extra + ov, seed, rounds, out_root, [panel, curve])
                for panel, curve, ov in items for seed in range(have, seeds)]
        print(f"{scenario}: {len(jobs)} runs (seeds {have}–{seeds - 1}) on {args.jobs} process(es)", flush=True)
        if args.jobs == 1:
            results = [run_one(job) for job in jobs]
        else:
            with ProcessPoolExecutor(max_workers=args.jobs) as pool:
                results = list(pool.map(run_one, jobs))
        wall = time.monotonic() - start
        parts: dict[str, list] = {}  # an extended file: the seeds and the measured wall time of each invocation
        if scenario in committed:
            old = committed[scenario]
            results = merge_runs(old, results, items)
            parts = {"seed_parts": [*old.get("seed_parts", [have]), seeds - have],
                     "wall_parts_s": [*old.get("wall_parts_s", [old["wall_s"]]), round(wall, 1)]}
        record = {"scenario": scenario, **settings, "seeds": list(range(seeds)),
                  "wall_s": round(sum(parts.get("wall_parts_s", [wall])), 1),
                  "runs_wall_s": round(sum(r["wall_s"] for r in results), 1), **parts, "runs": results}
        path = out / f"{scenario}.json"
        path.write_text(json.dumps(record, indent=None, separators=(",", ":"), ensure_ascii=False, allow_nan=False) + "\n")
        print(f"wrote {path.relative_to(REPO)} ({path.stat().st_size // 1024} KB), {wall:.0f} s", flush=True)


# ---------------------------------------------------------------------------------------------- report


class Scenario:
    """One scenario's data file: its runs grouped by (panel, curve), seed → run."""

    def __init__(self, path: Path):
        self.record = json.loads(path.read_text())
        self.curves: dict[tuple[str, str], dict[int, dict]] = {}
        for r in self.record["runs"]:
            self.curves.setdefault(tuple(r["key"]), {})[r["seed"]] = r

    def panels(self) -> list[str]:
        return list(dict.fromkeys(p for p, _c in self.curves))

    def names(self, panel: str) -> list[str]:
        return [c for p, c in self.curves if p == panel]

    def runs(self, panel: str, curve: str) -> dict[int, dict]:
        return self.curves[(panel, curve)]

    def values(self, panel: str, curve: str, field: str) -> dict[int, float]:
        return {s: r[field] for s, r in self.runs(panel, curve).items()}


def load_task(task: str, eps_scale: float) -> dict[str, Scenario]:
    folder = data_dir(task, eps_scale)
    if not folder.is_dir():
        return {}
    return {p.stem: Scenario(p) for p in sorted(folder.glob("*.json"))}


def _families(sc: Scenario, loss_claim: str, acc_claim: str, paired: bool = False) -> tuple[Family, Family]:
    """The figure's two families (dwfl_seeds.figure_families), its effect of interest in loss from its chance."""
    return figure_families(TITLES[sc.record["scenario"]].split(":")[0], max(r["chance"] for r in sc.record["runs"]),
                           loss_claim, acc_claim, paired)


def _claim(label: str, loss_v: Pending, acc_v: Pending, note: str) -> list[str]:
    return [f"**{label}**  \ntrain loss: {loss_v.markdown()}  \ntest accuracy: {acc_v.markdown()}{note}", ""]


def _trend(fams: tuple[Family, Family], sc: Scenario, panel: str, setting, claimed_loss: str) -> tuple[Pending, Pending]:
    """Trend verdicts of final loss (claimed direction, in the loss family) and accuracy (the opposite, in the
    accuracy family) on ``setting(curve)``: each curve's runs repeat its setting over the seeds, so ρ is taken
    within each seed (n = seeds)."""
    xs, losses, accs, seeds = [], [], [], []
    for c in sc.names(panel):
        for seed, r in sc.runs(panel, c).items():
            xs.append(setting(c))
            losses.append(r["final_loss"])
            accs.append(r["final_acc"])
            seeds.append(seed)
    acc_claim = "increasing" if claimed_loss == "decreasing" else "decreasing"
    return (fams[0].trend(xs, losses, claimed_loss, units=xs, cluster=seeds),
            fams[1].trend(xs, accs, acc_claim, units=xs, cluster=seeds))


def _paired(fams: tuple[Family, Family], sc: Scenario, panel: str, better: str, worse: str) -> tuple[Pending, Pending]:
    """Paired verdicts (by seed) that ``better`` ends with lower loss (the loss family) and higher accuracy
    (the accuracy family) than ``worse``."""
    return (fams[0].paired(sc.values(panel, better, "final_loss"), sc.values(panel, worse, "final_loss"), "a<b"),
            fams[1].paired(sc.values(panel, better, "final_acc"), sc.values(panel, worse, "final_acc"), "a>b"))


def _num(curve: str) -> float:
    """The number in a curve's name: 'P=80 dBm' → 80, 'N=30' → 30, 'eps=0.5' → 0.5."""
    return float(curve.split("=")[1].split()[0])


def _eps_section(sc: Scenario, suffix: str) -> list[str]:
    panel = sc.panels()[0]
    runs = [r for c in sc.names(panel) for r in sc.runs(panel, c).values()]
    chance, majority = max(r["chance"] for r in runs), max(r["majority"] for r in runs)
    md = ["## Where learning begins: test accuracy against ε", "",
          f"N = 10, everything else the base file's, the per-round ε of eq. (11) from {EPS_CURVE[0]:g} (the paper's "
          f"default) to {EPS_CURVE[-1]:g}. Chance {chance:.3f}, majority share of the test set {majority:.3f}. "
          "A curve \"learns\" when its accuracy's 95 % interval lies above the majority share.", "",
          "| ε per round | ε over T (RDP) | n | test acc [95% CI] | final train loss [95% CI] | learns |",
          "|---|---|---|---|---|---|"]
    first = None
    for c in sc.names(panel):
        rs = list(sc.runs(panel, c).values())
        ok = learns(sc.runs(panel, c))
        if ok and first is None:
            first = c
        md.append(f"| {_num(c):g} | {max(r['eps_T'] for r in rs):.3g} | {len(rs)} | {ci_text(r['final_acc'] for r in rs)}{flag(rs)} | "
                  f"{ci_text(r['final_loss'] for r in rs)} | {'yes' if ok else 'no'} |")
    xs = [_num(c) for c in sc.names(panel) for _ in sc.runs(panel, c)]
    fam = Family("accuracy rises with ε")
    v = fam.trend(xs, [r["final_acc"] for c in sc.names(panel) for r in sc.runs(panel, c).values()], "increasing",
                  units=xs, cluster=[seed for c in sc.names(panel) for seed in sc.runs(panel, c)])
    fam.close()
    md += ["", f"Accuracy rises with ε (ρ within each seed, n = seeds; a family of one): {v.markdown()}", "",
           (f"**Learning begins at ε = {_num(first):g} per round** (the smallest ε of the grid whose accuracy "
            "interval is above the majority share)." if first else
            f"**No ε of the grid up to {EPS_CURVE[-1]:g} per round learns** (no accuracy interval above the majority "
            "share). At the largest ε the noise is small, so within these rounds the model does not leave the majority "
            "answer whatever the privacy: what holds it there is the optimisation (step size, rounds, features), not "
            "the noise; a loss verdict on it shows nothing about convergence."),
           "", f"![accuracy against ε](eps{suffix}.png)", ""]
    return md


def _learns_section(sc: Scenario) -> list[str]:
    rs = list(sc.runs("learns.toml", "learns.toml").values())
    chance, majority = max(r["chance"] for r in rs), max(r["majority"] for r in rs)
    ok = learns(sc.runs("learns.toml", "learns.toml"))
    return ["## A private DWFL model that learns (`learns.toml`)", "",
            sc.record["trains_on"], "",
            "| n | test acc [95% CI] | chance | majority share | ε/round (max, eq. 11) | ε spent, ledger (zCDP) | "
            "ε over T (RDP) | wall time per run |", "|---|---|---|---|---|---|---|---|",
            f"| {len(rs)} | {ci_text(r['final_acc'] for r in rs)}{flag(rs)} | {chance:.3f} | {majority:.3f} | "
            f"{max(r['eps_round'] for r in rs):.3g} | {max(r['eps_ledger'] for r in rs):.3g} | {max(r['eps_T'] for r in rs):.3g} | "
            f"{np.mean([r['wall_s'] for r in rs]):.1f} s |", "",
            ("The private model learns: its accuracy interval lies above the majority share." if ok else
             "**The model does not learn**: its accuracy interval is not above the majority share."), ""]


def _fig2(sc: Scenario, task: str) -> list[str]:
    """Fig. 2's section, transmit power P: a trend per reading and N."""
    fam = _families(sc, "falls with P, every panel", "rises with P, every panel")
    body: list[str] = []
    body += ["## Fig. 2: transmit power P", "",
             "> \"stronger transmitting power leads to more rapid convergence, it is reasonable since greater power",
             "> has stronger ability to resist the interference of channel noise.\"", "",
             "Claim tested: the final loss falls (accuracy rises) with P over P = 20, 40, 60, 80 dBm.", "", describe_both(fam), ""]
    for panel in sc.panels():
        lv, av = _trend(fam, sc, panel, _num, "decreasing")
        body += _claim(f"{panel}: loss falls with P?", lv, av, chance_note(sc, panel, sc.names(panel)))
        body += panel_table(sc, panel) + [""]
    s20 = float(np.mean(list(sc.values("B, exact calibration (default), N=10", "P=20 dBm", "sigma2").values())))
    s80 = float(np.mean(list(sc.values("B, exact calibration (default), N=10", "P=80 dBm", "sigma2").values())))
    body += ["**Reproduction risk (dwfl.md §4.4).** With exact calibration the total noise at the worst receiver,",
             "normalised by c², is fixed by ε: (2γ g_max)² 2 ln(1.25/δ)/ε², independent of P. More power only",
             "shrinks the channel-noise share, so the artificial noise must grow to make up for it: here σ² goes",
             f"from {s20:.4g} at 20 dBm to {s80:.4g} at 80 dBm (N = 10). Under the literal update (variant A) channel",
             "noise never reaches the models, so more power can only add noise to learning; under the realisable",
             "update (variant B) channel noise m_i/(c(N−1)) enters the models, but the total stays pinned by ε.",
             "The paper's trend can appear only when σ² is calibrated ignoring channel noise (option (i), third",
             "reading), so that channel noise is an extra that shrinks as P grows, and variant B lets it matter.", ""]
    return fill_both(fam, body)


def _fig3(sc: Scenario, task: str) -> list[str]:
    """Fig. 3's section, number of workers N: a trend per ε."""
    fam = _families(sc, "falls with N, every ε", "rises with N, every ε")
    body: list[str] = []
    body += ["## Fig. 3: number of workers N", "",
             "> \"DWFL performs better with more workers, which is consistent with our analysis.\"", "",
             "Claim tested: the final loss falls (accuracy rises) with N over N = 15, 20, 25, 30 (another N is another",
             "partition, so these runs are not paired: the rank correlation within each seed is over its own partitions).", "", describe_both(fam), ""]
    for panel in sc.panels():
        lv, av = _trend(fam, sc, panel, _num, "decreasing")
        body += _claim(f"ε = {_num(panel):g}: loss falls with N?", lv, av, chance_note(sc, panel, sc.names(panel)))
        body += panel_table(sc, panel) + [""]
    body += ["Mechanism: the calibrated noise at a receiver is fixed by ε, and a node divides what it hears by",
             "c(N−1), so its per-round noise falls like 1/(N−1) (Remark IV.1's O(1/√N) privacy in reverse).", ""]
    return fill_both(fam, body)


def _fig4(sc: Scenario, task: str) -> list[str]:
    """Fig. 4's section, privacy budget ε: a trend per N."""
    fam = _families(sc, "falls with ε, every N", "rises with ε, every N")
    body: list[str] = []
    body += ["## Fig. 4: privacy budget ε", "",
             "> \"It shows that DWFL has better convergence results with smaller privacy budget. Smaller ε means",
             "> that more noise is added, which dampens the learning process.\"", "",
             "The two sentences contradict each other (dwfl.md §7 item 10); we test the consistent reading,",
             "larger ε (less noise) converges better: the final loss falls with ε over ε = 0.1, 0.25, 0.5, 1.", "", describe_both(fam), ""]
    for panel in sc.panels():
        lv, av = _trend(fam, sc, panel, _num, "decreasing")
        body += _claim(f"N = {_num(panel):g}: loss falls with ε?", lv, av, chance_note(sc, panel, sc.names(panel)))
        body += panel_table(sc, panel) + [""]
    return fill_both(fam, body)


def _fig5(sc: Scenario, task: str) -> list[str]:
    """Fig. 5's section, over the air vs orthogonal: paired per N and ε."""
    fam = _families(sc, "over the air lower than orthogonal, every N and ε",
                    "over the air higher than orthogonal, every N and ε", paired=True)
    body: list[str] = []
    body += ["## Fig. 5: over the air vs orthogonal", "",
             "> \"[the non-orthogonal scheme] has better advantage over orthogonal scheme in the case of the same",
             "> privacy level\" ... \"converges faster in both N=10 and N=30\" ... \"the orthogonal scheme almost",
             "> failed to converge when ε = 0.1 and N=10\"", "", describe_both(fam), ""]
    for panel in sc.panels():
        for eps in (0.1, 0.5):
            a, b = f"ota_d2d, eps={eps}", f"orthogonal_d2d, eps={eps}"
            lv, av = _paired(fam, sc, panel, a, b)
            body += _claim(f"{panel.replace('N=', 'N = ')}, ε = {eps}: over the air (a) better than orthogonal (b)?", lv, av,
                           chance_note(sc, panel, [a, b]))
        body += panel_table(sc, panel) + [""]
    orth = sc.runs("N=10", "orthogonal_d2d, eps=0.1").values()
    start = float(np.mean([r["loss"][0] for r in orth]))
    end = float(np.mean([r["final_loss"] for r in orth]))
    body += [f"Orthogonal, ε = 0.1, N = 10: mean loss {start:.3f} at round {sc.record['curve_every']}, {end:.3f} at the end "
             f"({'ln 2 = 0.693' if task == 'adult' else 'ln 10 = 2.303'} is the untrained model's loss).", "",
             "Mechanism (dwfl.md §6.3): each orthogonal link must carry the whole ε-calibrated noise, which",
             "over the air is shared by the N−1 superposed senders; for the same ε the disagreement noise is",
             "about (N−1)× larger.", ""]
    return fill_both(fam, body)


def _fig6(sc: Scenario, task: str) -> list[str]:
    """Fig. 6's section, centralised vs decentralised: paired per N."""
    fam = _families(sc, "decentralised lower than centralised, every N",
                    "decentralised higher than centralised, every N", paired=True)
    body: list[str] = []
    body += ["## Fig. 6: centralised (parameter server, Seif et al.) vs decentralised", "",
             "> \"our decentralized algorithm DWFL acquires more robustness and better convergence results in",
             "> contrast with that in centralized setting.\"", "", describe_both(fam), ""]
    for panel in sc.panels():
        lv, av = _paired(fam, sc, panel, "ota_d2d", "ota_central")
        body += _claim(f"{panel.replace('N=', 'N = ')}: decentralised (a) better than centralised (b)?", lv, av,
                       chance_note(sc, panel, ["ota_d2d", "ota_central"]))
        body += panel_table(sc, panel) + [""]
    body += ["Mechanism here: the server's model takes the whole calibrated noise (divided by N) every round,",
             "while in DWFL the artificial noise sums to zero over the nodes (the zero-sum structure behind",
             "eq. 9), so x̄ only sees channel noise. The paper's explanation (more frequent exchanges) is not",
             "what drives it in our runs: both schemes exchange once per round.", ""]
    return fill_both(fam, body)


FIGURES = ("fig2", "fig3", "fig4", "fig5", "fig6")
SECTIONS = {"fig2": _fig2, "fig3": _fig3, "fig4": _fig4, "fig5": _fig5, "fig6": _fig6}


def _sections(task: str, eps_scale: float, data: dict[str, Scenario],
              learns_sc: Scenario | None) -> tuple[list[str], list[Family]]:
    """The REPORT's sections (:func:`_body`) and the families they made, closed."""
    with recording() as families:
        body = _body(task, eps_scale, data, learns_sc)
    return body, families


def report(task: str, eps_scale: float, data: dict[str, Scenario], body: list[str], plan: list[dict]) -> str:
    """The REPORT's text from the task's scenarios, its sections (:func:`_sections`) and the seeds plan
    (:func:`plan_seeds`, over every task's data)."""
    rec = next(iter(data.values())).record
    counts = {name: len(sc.record["seeds"]) for name, sc in data.items()}
    if len(set(counts.values())) == 1:
        seeds_text = f"{counts[next(iter(counts))]} seeds per curve (seeds {rec['seeds'][0]}–{rec['seeds'][-1]}, the same for every"
    else:  # an extension cut short: say which scenario has how many
        seeds_text = ("seeds per curve " + ", ".join(f"{k} in {name}" for name, k in counts.items())
                      + " (seeds 0 to that count less one, the same for every")
    tenfold = ("with every ε × 10: `REPORT-cnn-eps10x.md`." if data_dir("cnn", 10.0).is_dir() else
               "every figure with ε × 10 (`--epsilon-scale 10`, `REPORT-cnn-eps10x.md`) did not fit this session's "
               "time; the accuracy against ε below includes 10× the paper's ε (5 per round) at N = 10.")
    other = ("The same figures with a CNN on images: `REPORT-cnn.md`." if task == "adult" else
             "The same figures with logistic regression on Adult-2: `REPORT.md`; " +
             ("at the paper's ε: `REPORT-cnn.md`." if eps_scale != 1 else tenfold))
    walls = ", ".join(f"{name} {sc.record['wall_s'] / 60:.1f} min" for name, sc in data.items())
    md = [
        f"# DWFL reproduction, {rec['trains_on'].split(' (')[0]} (generated by `experiments/dwfl/reproduce.py"
        f"{' --task cnn' if task == 'cnn' else ''}{f' --epsilon-scale {eps_scale:g}' if eps_scale != 1 else ''}`)",
        "",
        "Paper: Chen, Yu, Zou, Yu, Cheng, *Decentralized Wireless Federated Learning with Differential Privacy*,",
        "arXiv 2109.09142 (extraction: `shared/papers/dwfl.md`). The paper trains a CNN on CIFAR-10 and prints",
        f"no numbers, only curves (dwfl.md §6); here: {rec['trains_on']},",
        f"{rec['rounds']} rounds, {seeds_text}",
        "curve: runs are paired by seed), Rayleigh fading drawn once, σ_m² = 1 W, δ = 1e-5, γ = 0.5,",
        f"η = 0.5, g_max = 1, batch 32 (`{rec['base']}`). A run's metrics are the training loss of the average model x̄",
        f"(\"convergence\" in the paper) and its test accuracy, each the mean of the last {rec['last_rounds']} rounds.",
        "",
        RULE + " Each figure here makes two families, one per metric (the train loss, the paper's; the test accuracy "
        "beside it), Holm-adjusted apart. Trends over a setting (Figs. 2–4) repeat each setting over the seeds: ρ within "
        "each seed (n = seeds).",
        "The paper's claims are about convergence of the loss; the accuracy verdict beside each says whether",
        "the models learn at all: where every compared curve sits at chance or the majority share, a loss",
        "verdict measures how much noise reaches x̄ and shows nothing about convergence.",
        "",
        "An accuracy whose 95 % interval holds the test set's majority share is flagged ⚑ at majority (⚑ below",
        "majority where it lies below): such a row shows no learning.",
        "",
        "ε is the paper's per-round ε (eq. 11) at the worst receiver; \"ε over T\" composes the rounds with",
        "dp-accounting (RDP), which the paper does not do. c²/σ_m² is the received model SNR (eq. 4).",
        f"Measured wall time of the runs here, one process on a 2-core machine shared with other jobs: {walls},",
        f"{sum(sc.record['wall_s'] for sc in data.values()) / 60:.1f} min in all (a run two scenarios share is counted in",
        "the first that ran it" + _parts(data) + "). " + other,
        "",
        *seeds_paragraph(next(row for row in plan if row["folder"] == data_dir(task, eps_scale).name), plan),
        "",
    ]
    return "\n".join(md + _summary(body) + body)


def _body(task: str, eps_scale: float, data: dict[str, Scenario], learns_sc: Scenario | None) -> list[str]:
    """The REPORT's sections (every family made here is closed and filled in)."""
    suffix = TASKS[task][1] + (f"-eps{eps_scale:g}x" if eps_scale != 1 else "")
    body: list[str] = []
    for name in FIGURES:
        if name in data:
            body += SECTIONS[name](data[name], task)
        else:
            body += [f"## {TITLES[name]}", "", f"*Not run here (no `data/{data_dir(task, eps_scale).name}/{name}.json`): "
                     "the set did not fit the machine's time; "
                     f"`reproduce.py{' --task cnn' if task == 'cnn' else ''}"
                     f"{f' --epsilon-scale {eps_scale:g}' if eps_scale != 1 else ''} --scenarios {name}` runs it.*", ""]
    if "eps" in data:
        body += _eps_section(data["eps"], suffix)
    if learns_sc is not None:
        body += _learns_section(learns_sc)
    figs = [f for f in (*FIGURES, "eps") if f in data]
    body += ["## Figures", "", *[f"- `{f}{suffix}.png`: {TITLES[f]}" for f in figs], ""]
    return body


def _parts(data: dict[str, Scenario]) -> str:
    """How the data files were made, where seeds were added to a pilot (``--extend``)."""
    parts = {tuple(sc.record["seed_parts"]) for sc in data.values() if "seed_parts" in sc.record}
    if not parts:
        return ""
    text = " and ".join("+".join(map(str, p)) for p in sorted(parts))
    return (f"; seeds run as {text}: a pilot, then seeds added by `--extend` after the cheapest pilot run reproduced "
            "exactly, the times of the parts summed")


def _summary(body: list[str]) -> list[str]:
    """Every verdict of the report's body under its figure, as a list to read first."""
    lines, figure = ["## Summary of the verdicts", ""], ""
    for line in body:
        if line.startswith("## "):
            figure = line[3:].split(":")[0]
        elif line.startswith("**") and "?**" in line:
            claim, rest = line.split("  \n", 1)
            loss, acc = rest.split("  \n")[:2]
            at_chance = " (at chance/majority: shows nothing about convergence)" if "No compared curve" in line else ""
            lines.append(f"- {figure}, {claim}: {loss.replace('train loss: ', 'loss ')}; "
                         f"{acc.replace('test accuracy: ', 'accuracy ')}{at_chance}")
    return lines + [""]


#: The tasks the seeds plan covers (learns.toml's check has no family to power).
PLANNED = (("cnn", 10.0), ("cnn", 1.0), ("adult", 1.0))


def plan_seeds(bodies: dict[str, tuple[list[str], list[Family]]] | None = None) -> list[dict]:
    """The seeds plan (dwfl_seeds.plan) of every folder of PLANNED with committed data, from its data and
    families (those of ``bodies``, from :func:`_sections`, where it has them: not made again)."""
    folders = []
    for task, scale in PLANNED:
        if data := load_task(task, scale):
            folder = data_dir(task, scale).name
            _lines, families = bodies[folder] if bodies and folder in bodies else _sections(task, scale, data, None)
            folders.append((folder, {name: sc.record for name, sc in data.items()}, families))
    return plan(folders)


def write_reports() -> list[Path]:
    """Every REPORT whose data is in data/, and its figures, from data/ alone."""
    written = []
    learns_data = load_task("learns", 1.0)
    tasks = {data_dir(task, scale).name: (task, scale, data) for task, scale in (("adult", 1.0), ("cnn", 1.0), ("cnn", 10.0))
             if (data := load_task(task, scale))}
    bodies = {folder: _sections(task, scale, data, learns_data.get("learns") if (task, scale) == ("cnn", 1.0) else None)
              for folder, (task, scale, data) in tasks.items()}
    plan = plan_seeds(bodies)  # every folder's families first: each REPORT states the plan over all three
    for folder, (task, scale, data) in tasks.items():
        suffix = TASKS[task][1] + (f"-eps{scale:g}x" if scale != 1 else "")
        for name, sc in data.items():
            plot(name, sc, HERE / f"{name}{suffix}.png", TITLES[name])
        for name in FIGURES:  # a figure whose scenario has no data would be stale
            if name not in data:
                (HERE / f"{name}{suffix}.png").unlink(missing_ok=True)
        path = HERE / f"REPORT{suffix}.md"
        body, families = bodies[folder]
        write_report(path, report(task, scale, data, body, plan), families)
        written.append(path)
    return written


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=None,
                    help="seeds per curve (default: the task's planned count, SEEDS; --plan-seeds says why)")
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--task", choices=sorted(TASKS), default="adult")
    ap.add_argument("--scenarios", help="comma-separated scenarios to run (default: all of the task's)")
    ap.add_argument("--epsilon-scale", type=float, default=1.0,
                    help="run every ε of the paper times this (outputs get the suffix -epsNx)")
    ap.add_argument("--report-only", action="store_true", help="rewrite every REPORT and figure from data/ only")
    ap.add_argument("--extend", action="store_true",
                    help="run only the seeds the committed data files lack and merge them in (after checking that "
                         "the cheapest committed run reproduces exactly)")
    ap.add_argument("--plan-seeds", action="store_true",
                    help="print the seeds plan (seeds needed, budget, chosen) from the committed data; run nothing")
    args = ap.parse_args(argv)
    if args.plan_seeds:
        print(plan_table(plan_seeds(), SEEDS))
        return 0
    if not args.report_only:
        run_task(args)
    for path in write_reports():
        print(f"wrote {path.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
