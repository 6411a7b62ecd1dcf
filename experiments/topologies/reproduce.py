"""Decentralised learning beyond the complete graph (issue 32): DWFL on the topologies a radio gives.

    python experiments/topologies/reproduce.py [--only dwfl ...] [--seeds N] [--extend] [--workers 1] [--out runs/topologies-reproduce]
    python experiments/topologies/reproduce.py --plan-seeds
    python experiments/topologies/reproduce.py --report-only

Every curve is a base file with one ``[topology]``: the complete graph (DWFL's paper), the random
geometric graph the free-space link budget gives at two SNR thresholds (two radio ranges), the 4×4
torus and the ring. Scenarios (SCENARIOS): ``dwfl`` is base.toml (DWFL over the air, ota_d2d, on
mnist-5k with N = 16: the learner of experiments/dwfl/learns.toml) at the paper's ε = 0.5 per round
at the worst receiver (eq. 11 per receiver over its neighbourhood: a receiver that hears fewer
senders needs more artificial noise), ``dwfl-eps5`` the same at ε = 5; ``dpsgd-eps5`` and
``gossip-eps5`` are the baselines over orthogonal digital links (base-dpsgd.toml, base-gossip.toml)
on the same graphs at ε = 5 per release, compared with dwfl-eps5 graph by graph (VERSUS).

Each curve is a sweep over seeds (testbed.orchestration.sweep: its folder keeps finished runs, so a
rerun only runs what is missing; one worker unless told), the same seeds for every curve, so runs
are paired by seed (a random graph is drawn from the run's seed: the random geometric curves pair
one graph per seed with the complete graph). A scenario's compact results go to data/<scenario>.json:
per run its final metrics, its curves against rounds subsampled (test accuracy and train loss of
x̄, ε spent by the most exposed node, energy per node from the ledger), and per node its degree,
artificial noise σ, ε per round at its receivers and ε spent (ledger). REPORT.md and the figures are
generated from data/ alone, which is all ``--report-only`` does (tests/test_reproductions.py).

Seeds by power (testbed.reports.seed_plan, docs/statistics.md): each scenario runs SEEDS[scenario]
seeds, the plan from the committed data (``--plan-seeds`` prints it: the seeds each family needs for
its effect of interest at 80 % power after Holm, at least 8, capped by BUDGET). ``--extend`` runs only
the seeds a scenario's data file lacks and merges them in, after rerunning its cheapest committed run
and refusing unless that reproduces the committed record (measured times and the energy computed from
them aside). The design and the runs are topology_runs.py's; this script writes the report.

Verdicts (testbed.reports.verdicts, docs/statistics.md): each sparse graph against the complete one
is a paired comparison over seeds (final accuracy and loss, mean of the last LAST rounds); learning
over the rounds is a paired comparison of each run's last LAST rounds with its first LAST; how
accuracy follows the graph is Spearman's ρ over the graphs (each graph's mean final accuracy and
spectral gap over its seeds; exact permutation p). Each table or list of verdicts is one family,
Holm-adjusted. Accuracies stand next to chance and the test set's majority share: a model at chance shows
nothing about convergence.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterable
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))  # topology_runs beside this script, also when it is imported

from topology_runs import (  # noqa: E402
    ACCURACY_EFFECT, BUDGET, DATA, LAST, LOSS_EFFECT, REFERENCE, SCENARIOS, SEEDS, VERSUS, extend_scenario, run_scenario,
)

from testbed.reports.seed_plan import ScenarioPlan, plan, plan_table  # noqa: E402
from testbed.reports.stats import majority_flag, t_interval  # noqa: E402
from testbed.reports.sweep_stats import stats_rows  # noqa: E402
from testbed.reports.verdicts import RULE, Family, Verdict, recording  # noqa: E402
from testbed.reports.plots import remove_stale_figures  # noqa: E402
from testbed.reports.verdicts import write_report as write_report_and_verdicts  # noqa: E402


# ------------------------------------------------------------------------------------------------ report


class Scenario:
    """One scenario's data file: its runs by curve, seed → run."""

    def __init__(self, path: Path):
        self.record = json.loads(path.read_text())
        self.by_curve: dict[str, dict[int, dict]] = {}
        for r in self.record["runs"]:
            self.by_curve.setdefault(r["curve"], {})[r["seed"]] = r

    @property
    def curves(self) -> list[str]:
        return list(self.by_curve)

    def runs(self, curve: str) -> list[dict]:
        return list(self.by_curve[curve].values())

    def values(self, curve: str, field: str) -> dict[int, float]:
        return {s: r[field] for s, r in self.by_curve[curve].items()}

    def all_runs(self) -> list[dict]:
        return [r for c in self.curves for r in self.runs(c)]


def load() -> dict[str, Scenario]:
    """Every scenario with data, in SCENARIOS' order."""
    return {name: Scenario(DATA / f"{name}.json") for name in SCENARIOS if (DATA / f"{name}.json").is_file()}


def _ci(values: Iterable[float], spec: str = ".4f") -> str:
    """'mean [low, high]' of the values (95 % t interval), each formatted by ``spec``."""
    s = t_interval(list(values))
    return f"{float(s.mean):{spec}} [{float(s.ci_low):{spec}}, {float(s.ci_high):{spec}}]"


def learns(runs: list[dict]) -> bool:
    """The curve's final accuracy is above its majority share: the 95 % interval's lower end above it."""
    accs = [r["final_acc"] for r in runs]
    return len(accs) > 1 and float(t_interval(accs).ci_low) > max(r["majority"] for r in runs)


def _node_values(runs: list[dict], field: str) -> list[float]:
    """A per-node field of every node of every run."""
    return [v for r in runs for v in r[field]]


def _curve_table(sc: Scenario) -> list[str]:
    lines = ["| curve | n | degree, mean (min–max) | spectral gap | test acc, last 10 rounds [95% CI] | learns | "
             "final train loss [95% CI] | noise σ², mean (median × complete's) | ε/round at a receiver (min–max) | "
             "ε spent per node, ledger: min, mean, max | energy per node [95% CI] |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in sc.curves:
        rs = sc.runs(c)
        degrees, eps, eps_round = (_node_values(rs, f) for f in ("node_degree", "node_eps", "node_eps_round"))
        sigma2 = float(np.mean([r["sigma2"] for r in rs]))
        lines.append(
            f"| {c} | {len(rs)} | {np.mean(degrees):.1f} ({min(degrees)}–{max(degrees)}) | "
            f"{np.mean([r['spectral_gap'] for r in rs]):.3f} | {_ci(r['final_acc'] for r in rs)}"
            f"{majority_flag([r['final_acc'] for r in rs], max(r['majority'] for r in rs))} | "
            f"{'yes' if learns(rs) else 'no'} | {_ci(r['final_loss'] for r in rs)} | {sigma2:.3g} ({_noise_ratio(sc, c):.3g}×) | "
            f"{min(eps_round):.3g}–{max(eps_round):.3g} | {min(eps):.3g}, {np.mean(eps):.3g}, {max(eps):.3g} | "
            f"{_ci((float(np.mean(r['node_energy_j'])) for r in rs), '.4g')} J |")
    return lines


def _noise_ratio(sc: Scenario, curve: str) -> float:
    """The median over seeds of the curve's noise variance over the complete graph's of the same seed
    (the same seed draws the same fading: the ratio is the graph's)."""
    ref = sc.values(REFERENCE, "sigma2")
    return float(np.median([v / ref[seed] for seed, v in sc.values(curve, "sigma2").items()]))


def _stats_table(sc: Scenario) -> list[str]:
    """The sweeps' statistics over seeds (testbed.reports.sweep_stats): mean, sd, t and BCa intervals."""
    rows = [{"curve": r["curve"], "seed": r["seed"], "test_accuracy": r["final_acc"],
             "epsilon_max": max(r["node_eps"]), "energy_j_max": max(r["node_energy_j"])} for r in sc.all_runs()]
    lines = ["| curve | field | n | mean | sd | 95% t interval | 95% BCa interval |", "|---|---|---|---|---|---|---|"]
    for st in stats_rows(rows, ["curve"]):
        for field in ("test_accuracy", "epsilon_max", "energy_j_max"):
            cell = {k: "–" if st[f"{field}_{k}"] is None else f"{st[f'{field}_{k}']:.4g}"
                    for k in ("mean", "sd", "ci_low", "ci_high", "bca_low", "bca_high")}
            lines.append(f"| {st['curve']} | {field} | {st['n']} | {cell['mean']} | {cell['sd']} | "
                         f"[{cell['ci_low']}, {cell['ci_high']}] | [{cell['bca_low']}, {cell['bca_high']}] |")
    return lines


def _verdicts(sc: Scenario) -> tuple[list[str], list[str], dict[str, Verdict]]:
    """(the verdict lines of the body, the same as a summary list, the verdicts by name). Four families: the
    sparse graphs against the complete one in accuracy, and in loss (one unit and one effect of interest
    each), the rise over the rounds per curve, the trends over the graphs' properties (one value per
    graph: its mean over the seeds)."""
    body, summary, pending = [], [], {}
    versus = Family("the complete graph against each sparse graph: test accuracy", effect_of_interest=ACCURACY_EFFECT)
    versus_loss = Family("the complete graph against each sparse graph: train loss", effect_of_interest=LOSS_EFFECT)
    rises = Family("accuracy rises over the rounds", effect_of_interest=ACCURACY_EFFECT)
    trends = Family("trends over the graphs")
    body += [versus.description(), "", versus_loss.description(), ""]
    for c in sc.curves:
        if c == REFERENCE:
            continue
        acc = versus.paired(sc.values(REFERENCE, "final_acc"), sc.values(c, "final_acc"), "a>b")
        loss = versus_loss.paired(sc.values(REFERENCE, "final_loss"), sc.values(c, "final_loss"), "a<b")
        pending[f"acc {c}"] = acc
        body += [f"**{REFERENCE} (a) ends more accurate than {c} (b)?**  ",
                 f"test accuracy: {acc.markdown()}  ", f"train loss (a lower): {loss.markdown()}", ""]
        summary.append(f"- {REFERENCE} more accurate than {c}: accuracy {acc.markdown()}; loss {loss.markdown()}")
    body += [rises.description(), ""]
    for c in sc.curves:
        rise = rises.paired(sc.values(c, "final_acc"), sc.values(c, "first_acc"), "a>b")
        pending[f"rise {c}"] = rise
        body += [f"**{c}: accuracy rises over the rounds (a = last {LAST} rounds, b = first {LAST})?** {rise.markdown()}", ""]
        summary.append(f"- {c}, accuracy rises over the rounds: {rise.markdown()}")
    body += [trends.description() + " A trend over a property of a graph has the graph as its unit: each curve's "
             "mean over its seeds (exact permutation p over the graphs).", ""]

    def per_graph(field) -> list[float]:
        return [float(np.mean([field(r) for r in sc.runs(c)])) for c in sc.curves]

    gap = trends.trend(per_graph(lambda r: r["spectral_gap"]), per_graph(lambda r: r["final_acc"]), "increasing",
                       units=list(sc.curves))
    pending["gap"] = gap
    body += [f"**Final accuracy rises with the spectral gap (one point per graph)?** {gap.markdown()}", ""]
    summary.append(f"- final accuracy rises with the spectral gap: {gap.markdown()}")
    degrees, sigma2 = per_graph(lambda r: min(r["node_degree"])), per_graph(lambda r: r["sigma2"])
    if len(set(degrees)) > 1 and len(set(sigma2)) > 1:
        pending["noise"] = trends.trend(degrees, sigma2, "decreasing", units=list(sc.curves))
        body += ["**The noise variance σ² falls with the graph's smallest degree (one point per graph)?** "
                 f"{pending['noise'].markdown()}", ""]
        summary.append(f"- the noise variance falls with the smallest degree: {pending['noise'].markdown()}")
    for f in (versus, versus_loss, rises, trends):
        body, summary = [f.fill(x) for x in body], [f.fill(x) for x in summary]
    return body, summary, {k: v.verdict for k, v in pending.items()}


def plot(name: str, sc: Scenario) -> list[str]:
    """The scenario's figures (against rounds: accuracy, ε, energy; per node: ε against degree); their file names."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rec = sc.record
    figure, axes = plt.subplots(1, 3, figsize=(13, 3.4))
    for c in sc.curves:
        rs = sc.runs(c)
        for ax, field in zip(axes, ("acc", "eps_mean", "energy_j")):
            curves = np.array([r[field] for r in rs])
            s = t_interval(curves.T)
            x = np.arange(1, curves.shape[1] + 1) * rec["curve_every"]
            ax.plot(x, s.mean, label=c, lw=1.2)
            ax.fill_between(x, s.ci_low, s.ci_high, alpha=0.2)
    runs = sc.all_runs()
    axes[0].axhline(max(r["majority"] for r in runs), ls="--", color="gray", lw=1, label="majority share")
    for ax, label in zip(axes, ("test accuracy of x̄", "ε spent per node, mean over nodes (ledger)",
                                "energy per node, J (ledger)")):
        ax.set_xlabel("round", fontsize=8)
        ax.set_ylabel(label, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    axes[2].set_yscale("log")  # the baselines' slots on the random geometric graphs are orders of magnitude longer
    axes[0].legend(fontsize=7)
    figure.suptitle(f"{rec['what']}: ε = {rec['epsilon_round']:g} per round, N = {rec['num_nodes']} "
                    "(mean over seeds, 95% CI)", fontsize=10)
    figure.tight_layout()
    rounds_png = f"fig_{name}_rounds.png"
    figure.savefig(HERE / rounds_png, dpi=72, metadata={"Software": None})
    plt.close(figure)
    figure, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    for c in sc.curves:
        rs = sc.runs(c)
        degrees = _node_values(rs, "node_degree")
        for ax, field in zip(axes, ("node_eps_round", "node_eps")):
            ax.scatter(degrees, _node_values(rs, field), s=10, alpha=0.5, label=c)
    for ax, label in zip(axes, ("ε per round at the node as a receiver (eq. 11)", "ε spent by the node, ledger")):
        ax.set_xlabel("node degree", fontsize=8)
        ax.set_ylabel(label, fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    figure.suptitle(f"{rec['what']}: every node of every run", fontsize=10)
    figure.tight_layout()
    nodes_png = f"fig_{name}_nodes.png"
    figure.savefig(HERE / nodes_png, dpi=72, metadata={"Software": None})
    plt.close(figure)
    return [rounds_png, nodes_png]


def section(name: str, sc: Scenario, figures: list[str]) -> tuple[list[str], list[str], dict[str, Verdict]]:
    """(the scenario's section of the REPORT, its verdicts as a summary list, the verdicts by name)."""
    rec = sc.record
    runs = sc.all_runs()
    chance, majority = max(r["chance"] for r in runs), max(r["majority"] for r in runs)
    body, summary, found = _verdicts(sc)
    walls = (f"{rec['runs_wall_s'] / 60:.1f} min for {len(runs)} runs ({np.mean([r['wall_s'] for r in runs]):.1f} s per "
             "run, one process on a 2-core machine shared with other jobs)")
    md = [f"## {rec['what']} (`data/{name}.json`, `{rec['base']}`)", "",
          f"N = {rec['num_nodes']}, {rec['rounds']} rounds, seeds {rec['seeds'][0]}–{rec['seeds'][-1]} on every curve "
          f"(paired by seed), ε = {rec['epsilon_round']:g} per round, δ = {rec['delta']:g}. Chance {chance:.3f}, "
          f"majority share of the test set {majority:.3f}; a curve learns when its accuracy's 95 % interval lies above "
          f"the majority share (an accuracy whose interval holds it is flagged ⚑ at majority). Measured wall time: "
          f"{walls}.", "",
          *_curve_table(sc), "",
          "Degree: neighbours per node (mean over nodes and seeds, min–max). Spectral gap: 1 − |λ₂| of the",
          "matrix a round applies (mean over seeds): DWFL's Ψ = (1 − η) I + η W of eq. (8), W uniform over the",
          "neighbours (the torus and the ring are bipartite: W alone has eigenvalue −1); a baseline's W",
          "(Metropolis–Hastings). Noise σ²: DWFL's artificial noise variance, set at the worst receiver",
          "(eqs. 5–7, 10–11 over its neighbourhood), one per run, beside it the median over seeds of its ratio",
          "to the complete graph's of the same seed (the same fading); a baseline's local noise per entry.",
          "ε/round at a receiver: eq. (11) at each node as a receiver. ε spent: each node's ledger over the",
          "run (zCDP, the headline accountant), charged against the worst of its receivers. Energy: compute",
          "(modelled from the measured compute time on the host profile, so it varies by a few mJ between",
          "reruns) and transmission per node over the run, from the ledger.", "",
          "### Verdicts", "", *body,
          "### Statistics of the sweeps", "",
          "Per curve over its seeds (testbed.reports.sweep_stats, as `sweep_stats.csv`): final test accuracy",
          "(mean of the last rounds), the largest ε spent by a node, the largest energy of a node.", "",
          *_stats_table(sc), "",
          *[f"![{f}]({f})" for f in figures], ""]
    return md, summary, found


def seed_plans(data: dict[str, Scenario]) -> list[ScenarioPlan]:
    """Each scenario's seeds by power from its data (testbed.reports.seed_plan), as its REPORT gives them."""
    with recording():
        return report(data, {name: [] for name in data})[1]


def seeds_section(plans: list[ScenarioPlan], data: dict[str, Scenario]) -> list[str]:
    """The REPORT's seeds by power: the plan from this data, and the budget."""
    short = [p.scenario for p in plans if p.underpowered]
    runs = sum(len(sc.record["runs"]) for sc in data.values())
    minutes = sum(sc.record["runs_wall_s"] for sc in data.values()) / 60
    return ["## Seeds by power", "",
            "Each scenario runs max(8, the seeds its families need to detect their effect of interest at 80 % power "
            "after Holm, from the sd of these runs), capped by the compute budget (testbed.reports.seed_plan; "
            "`reproduce.py --plan-seeds` prints this table from the committed data). Effects of interest: test "
            f"accuracy {ACCURACY_EFFECT:g} (one percentage point), train loss {LOSS_EFFECT:.3g} (1 % of ln 10, the "
            "loss at chance). Budget: 8 seeds per scenario, what the session regenerating the folder had: its "
            f"{runs} runs took {minutes:.1f} min (the sum of the runs' measured times, one process on this shared "
            "2-core machine; each section gives its own), so one more seed of every scenario costs about "
            f"{minutes / max(len(sc.record['seeds']) for sc in data.values()):.1f} min.", "", *plan_table(plans), "",
            (f"Underpowered for its effect of interest at the budget: {', '.join(short)}. An inconclusive verdict "
             "there is no evidence against the effect; the seeds needed are what an extension "
             "(`reproduce.py --extend --seeds N`) would run." if short else
             "Every scenario holds the seeds its families need."), ""]


def report(data: dict[str, Scenario], figures: dict[str, list[str]]) -> tuple[str, list[ScenarioPlan]]:
    """The REPORT's text, and each scenario's seeds by power from the families judged on its runs (a
    comparison of two scenarios counting for both)."""
    md = ["# Topologies: decentralised learning beyond the complete graph (generated by "
          "`experiments/topologies/reproduce.py`)", "",
          "Issue 32. The learner is `experiments/dwfl/learns.toml`'s (private DWFL on mnist-5k, multinomial",
          "logistic regression on the pixels), with N = 16 nodes of 125 images each and γ = 2, g_max = 0.25",
          "(the same sensitivity 2γ g_max as learns.toml; `base.toml` says why each setting), on five graphs:",
          "the complete graph (DWFL's paper), the random geometric graph of the free-space link budget at two",
          "radio ranges (SNR thresholds −29 dB and −26 dB, nodes in a 10 m square), the 4×4 torus and the ring.",
          "Privacy is equal across graphs: the same per-round ε at the worst receiver. The metric is the test",
          "accuracy of x̄ (the mean of the nodes' models), averaged over the last rounds.", "",
          RULE, ""]
    if not data:
        md += ["*No scenario has data yet (`data/` is empty): `reproduce.py` runs them.*", ""]
        return "\n".join(md), []
    bodies, summary, found = [], ["## Summary of the verdicts", ""], {}
    families: dict[str, list[Family]] = {name: [] for name in data}
    for name, sc in data.items():
        with recording() as made:
            body, lines, found[name] = section(name, sc, figures[name])
        families[name] += made
        bodies += body
        summary += [f"{sc.record['what']}:", "", *lines, ""]
    versus, won = _versus(data, families)
    plans = plan(families, {name: len(sc.record["seeds"]) for name, sc in data.items()}, BUDGET)
    text = md + findings(data, found, won) + summary + seeds_section(plans, data) + versus + bodies + limits(data)
    return "\n".join(text), plans


def _versus(data: dict[str, Scenario], families: dict[str, list[Family]]) -> tuple[list[str], dict[tuple[str, str], list[str]]]:
    """Over the air against orthogonal links on each graph, paired by seed (the same seed draws the
    same graph): accuracy and energy per node; and per pair of scenarios the graphs where over the air
    is shown more accurate. One family per table, added to ``families`` of both scenarios."""
    md: list[str] = []
    won: dict[tuple[str, str], list[str]] = {}
    for ota, orth in VERSUS:
        if ota not in data or orth not in data:
            continue
        a, b = data[ota], data[orth]
        md += [f"## {a.record['what']} against {b.record['what']}", "",
               "Paired by seed on each graph: a = over the air, b = the baseline. Energy per node over the run",
               "(ledger): the baseline gives each node its own slot per round, as long as its weakest link's",
               "Shannon rate needs; over the air all nodes share one superposed slot. Where neither learns, the",
               "accuracy verdict shows nothing about convergence.", "",
               "| curve | learns: a, b | test acc, verdict a > b | energy per node a [J] | energy per node b [J] | b / a |",
               "|---|---|---|---|---|---|"]
        fam = Family(f"{a.record['what']} against {b.record['what']}, every graph", effect_of_interest=ACCURACY_EFFECT)
        families[ota].append(fam)
        families[orth].append(fam)
        start = len(md)
        judged = {}
        for c in a.curves:
            if c not in b.by_curve:
                continue
            v = judged[c] = fam.paired(a.values(c, "final_acc"), b.values(c, "final_acc"), "a>b")
            ea = float(np.mean(_node_values(a.runs(c), "node_energy_j")))
            eb = float(np.mean(_node_values(b.runs(c), "node_energy_j")))
            said = f"{'yes' if learns(a.runs(c)) else 'no'}, {'yes' if learns(b.runs(c)) else 'no'}"
            md.append(f"| {c} | {said} | {v.markdown()} | {ea:.4g} | {eb:.4g} | {eb / ea:.3g} |")
        md[start:] = [fam.fill(x) for x in md[start:]] + ["", fam.description()]
        won[(ota, orth)] = [c for c, v in judged.items() if v.word == "shown"]
        geometric = [c for c, values in b.record["curves"].items() if values.get("topology.kind") == "random_geometric"]
        md += ["", f"Not like for like on {' and '.join(geometric)}: there the baseline's links carry the free-space",
               "path loss between the nodes' positions (an SNR near the graph's threshold, −29 or −26 dB, under the",
               "paper's abstract σ_m² = 1 W), so its Shannon-rate slots are long and its energy large, while DWFL's",
               "gains stay the paper's model without path loss (the graph only decides who hears whom), so its",
               "energy ignores the distance. On the complete graph, the torus and the ring both use the paper's",
               "per-sender gains.", ""] if geometric else [""]
    return md, won


def findings(data: dict[str, Scenario], found: dict[str, dict[str, Verdict]],
             won_by: dict[tuple[str, str], list[str]]) -> list[str]:
    """What the runs show, from the data and the verdicts."""
    md = ["## What the runs show", ""]
    for name, sc in data.items():
        rec, verdicts = sc.record, found[name]
        learning = [c for c in sc.curves if learns(sc.runs(c))]
        worse = [c for c in sc.curves if c != REFERENCE and verdicts[f"acc {c}"].word == "shown"]
        better = [c for c in sc.curves if c != REFERENCE and verdicts[f"acc {c}"].word == "opposite"]
        line = (f"- **{rec['what']}** (ε = {rec['epsilon_round']:g} per round): "
                + (f"above the majority share: {'; '.join(learning)}; " if learning else
                   "no curve's accuracy is above the majority share, so nothing here speaks of convergence; ")
                + (f"the complete graph ends more accurate than {'; '.join(worse)} (paired verdicts shown). "
                   if worse else "no sparse graph is shown less accurate than the complete one. ")
                + (f"The complete graph ends *less* accurate than {'; '.join(better)} (opposite). " if better else ""))
        if better and rec["algorithm"] != "dwfl":
            line += ("Consistent with where the local noise goes: with doubly stochastic W, x̄ takes "
                     "(1/N) Σ_k (1 − W_kk) n_k, and Metropolis–Hastings keeps W_kk = 1/16 on the complete graph "
                     "but 1/5 on the torus and 1/3 on the ring, so less of the noise reaches x̄ on a sparse graph. ")
        if any(_noise_ratio(sc, c) != 1.0 for c in sc.curves):
            noise = "; ".join(f"{c} {_noise_ratio(sc, c):.3g}×" for c in sc.curves if c != REFERENCE)
            line += f"At the same ε the noise variance is, against the complete graph's (median over seeds): {noise}. "
        eps = {c: _node_values(sc.runs(c), "node_eps") for c in sc.curves}
        line += ("ε spent per node over the run (ledger, mean and min–max over nodes and seeds): "
                 + "; ".join(f"{c} {np.mean(v):.3g} ({min(v):.3g}–{max(v):.3g})" for c, v in eps.items()) + ". ")
        energy = {c: float(np.mean(_node_values(sc.runs(c), "node_energy_j"))) for c in sc.curves}
        line += ("Energy per node: " + "; ".join(f"{c} {v:.4g} J" for c, v in energy.items()) + ".")
        md += [line, ""]
    for ota, orth in VERSUS:
        if ota in data and orth in data:
            a, b = data[ota], data[orth]
            curves = [c for c in a.curves if c in b.by_curve]
            won = won_by[(ota, orth)]
            same_gains = [c for c in curves if b.record["curves"][c].get("topology.kind") != "random_geometric"]
            ratios = sorted({f"{np.mean(_node_values(b.runs(c), 'node_energy_j')) / np.mean(_node_values(a.runs(c), 'node_energy_j')):.3g}"
                             for c in same_gains})
            above = [c for c in won if learns(a.runs(c))]
            md += [f"- **{a.record['what']} against {b.record['what']}**: over the air ends more accurate on "
                   f"{len(won)} of {len(curves)} graphs (paired verdicts shown: {'; '.join(won) or 'none'}; "
                   + ("over the air above the majority share on all of them" if above == won else
                      f"over the air above the majority share on {'; '.join(above) or 'none'} of them: elsewhere the "
                      "verdict says nothing about convergence")
                   + "), and on the graphs "
                   f"with the paper's gains ({'; '.join(same_gains)}) the baseline spends {', '.join(ratios)}× the energy "
                   "per node.", ""]
    md += ["Mechanism (DWFL on a graph, testbed.algorithms.dwfl): one artificial noise variance σ² for every sender,",
           "set so that the worst receiver meets ε (eqs. 10–11 over its own neighbourhood). A receiver with few",
           "neighbours hears few noisy senders, so the sparser the graph (the smaller its smallest degree), the larger",
           "σ² must be, and every node's model takes that noise, divided among fewer neighbours. Every other receiver",
           "then hears more noise than it needs: its ε per round lies below the target (the tables' min–max), and",
           "the ledger charges each sender against the worst of its own receivers, so on a sparse graph most nodes",
           "spend less ε than the target allows. Over the air a node's energy is one slot per round whatever its",
           "degree; over orthogonal links it is one slot per node per round, at the rate its weakest link allows.",
           ""]
    return md


def limits(data: dict[str, Scenario]) -> list[str]:
    """What the runs do not show."""
    rec = next(iter(data.values())).record
    return ["## What the runs do not show", "",
            f"- One learner, one data set (mnist-5k, i.i.d. split), N = {rec['num_nodes']}, {rec['rounds']} rounds: "
            "not how the gaps scale with N or rounds, with non-i.i.d. data, or with another model.",
            "- Static graphs only (no coherence_rounds, no mobility); one graph per seed for the random geometric",
            "  curves, so their intervals mix the graph's randomness with the training's.",
            "- x̄ is a virtual model: on a sparse graph no node holds it and the nodes' models disagree more; the",
            "  nodes' own accuracies are not measured here.",
            "- ε is the per-round ε at the worst receiver, equal across graphs; the ledger's ε per node shows",
            "  how far each node is from that worst case, not a tighter guarantee for the graph as a whole.",
            "- The baselines' energy on the random geometric graphs is not comparable with DWFL's (see above).",
            "- Sim only (the same runs over MQTT are the conformance suite's business, not this report's).", ""]


def write_report() -> Path:
    data = load()
    figures = {name: plot(name, sc) for name, sc in data.items()}
    remove_stale_figures(HERE, {f for names in figures.values() for f in names})
    path = HERE / "REPORT.md"
    with recording() as families:
        text, _ = report(data, figures)
    write_report_and_verdicts(path, text, families)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=REPO / "runs" / "topologies-reproduce", help="the sweeps' folder")
    parser.add_argument("--workers", type=int, default=1, help="parallel runs (default 1)")
    parser.add_argument("--seeds", type=int, help="seeds of every scenario (default: SEEDS, the plan by power)")
    parser.add_argument("--only", nargs="+", choices=list(SCENARIOS), help="run only these scenarios")
    parser.add_argument("--extend", action="store_true",
                        help="run only the seeds data/ lacks and merge them in (after checking a committed run reproduces)")
    parser.add_argument("--plan-seeds", action="store_true",
                        help="print each scenario's seeds by power from the committed data; run nothing")
    parser.add_argument("--report-only", action="store_true", help="rewrite REPORT.md and the figures from data/ alone")
    args = parser.parse_args(argv)
    if args.seeds is not None and args.seeds < 2:
        parser.error(f"--seeds must be at least 2 (a paired comparison needs two pairs), got {args.seeds}")
    if args.plan_seeds:
        print("\n".join(plan_table(seed_plans(load()))))
        return 0
    if not args.report_only:
        os.environ.setdefault("TESTBED_TORCH_THREADS", "1")
        for name in args.only or list(SCENARIOS):
            seeds = SEEDS[name] if args.seeds is None else args.seeds
            run = extend_scenario if args.extend else run_scenario
            path = run(name, seeds, args.workers, args.out)
            print(f"wrote {path}", flush=True)
    print(f"report: {write_report()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
