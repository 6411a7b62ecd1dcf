"""PADPFL (adaptive-dp.md §5): Table I's four scenarios (the non-private impact-factor comparisons of
Figs. 2, 4, 6, 8 and the private runs of Figs. 3, 5, 7, 9), the hand-set factors of scenario 3
against the automatic rules (padpfl.impact), the learning-rate sweep behind the scenarios' lr, the
privacy-utility curve of scenario 1, learns.toml (PADPFL at the paper's ε on mnist-5k, under the
paper's assumption), scenario 1's private runs at the paper's ε under the sound default sensitivity
(part "sound") and learns_dp_sgd.toml (DP-SGD local steps, a sound ε; part "dp_sgd"), over several
seeds in sim mode.

Each part writes its own file in data/ (s1.json ... s4.json, impact.json, lr.json, curve.json,
learns.json: per run the seed, the final metrics, the ledger's ε and the curves every 5 rounds;
the part's measured wall time), so running a subset rewrites only its files; REPORT.md is then
generated from data/ alone. ``--report-only`` rewrites REPORT.md from data/ without running anything.

Seeds by power (issue 41): ``--plan-seeds`` prints, from the committed data alone, each family's effect
of interest (make_report.EFFECT_*), the seeds that detect it at 80 % power after Holm and the seeds
each part is run at: max(8, needed) over its families, capped by COMPUTE_BUDGET_MIN. A part whose
data are committed gets the missing seeds only (seeds n, n+1, ...): the committed runs are kept, after
one committed seed of its first and last variants is re-run and found to reproduce to the data's
digits (otherwise the part is refused: its committed seeds would not be the runs the new ones join).

Usage: python experiments/padpfl/reproduce.py [--parts s1,s2,...] [--seeds N] [--fresh] [--no-report]
                                              [--report-only] [--plan-seeds]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
DATA = HERE / "data"
#: Rounds at which the curves are kept (every 5th and the last).
CURVE_EVERY = 5
#: The fewest seeds of a part: 8, from which a rank test can confirm at all (stats.RANK_TEST_MIN_N) and a
#: paired t's interval is not dominated by its t quantile (t_0.975 at 7 df is 2.36, at 4 df 2.78).
MIN_SEEDS = 8
#: What one regeneration of the whole folder may cost, in minutes of this shared 2-core machine (one worker,
#: nice 15, one part at a time): the seeds by power are capped at the count every part can run within it,
#: from the wall time per seed of each part's pilot, its first batch (make_report.seed_plan). 120 min: what a
#: session can give this folder's regeneration; at the pilots' times (5 seeds of every part under a load of
#: about 12, learns_dp_sgd's 8) that is 12 seeds a part.
COMPUTE_BUDGET_MIN = 120.0

#: scenario → (non-private assignments, the personalised assignment of the private runs)
SCENARIOS = {
    "s1": (["1-1-1", "0-1-2", "0-1-1", "1-2-3", "0-0-1"], "0-1-2"),
    "s2": (["1-1-1", "0-2-1", "0-1-1", "0-1-2", "1-2-1"], "0-2-1"),
    "s3": (["1-1-1", "1-3-5", "6-16-36"], "1-3-5"),  # 6-16-36: p_i = m_i/m (training sizes)
    "s4": (["1-1-1", "follow", "fixed"], "follow"),
}
#: scenario 4 with static data (REPORT.md): "follow" weights the slightly noisy part most throughout;
#: "fixed" keeps the factors 0-1-2 of rounds 1-10 on the parts whose quality swapped after round 10.
S4 = {"follow": {"ratios": "0-1-2"},
      "fixed": {"ratios": "0-1-2", "schedule": [{"after_round": 10, "ratios": "2-1-0"}]}}

#: The automatic rules against the hand-set factors (scenario 3: the part sizes differ).
RULES = {"hand 1-1-1": {"ratios": "1-1-1"}, "hand 1-3-5": {"ratios": "1-3-5"}, "hand 6-16-36": {"ratios": "6-16-36"},
         "data_size": {"impact": "data_size"}, "reliability": {"impact": "reliability"},
         "quality_score σq=0.05": {"impact": "quality_score", "score_sigma": 0.05},
         "quality_score σq=0.5": {"impact": "quality_score", "score_sigma": 0.5},
         "link_quality": {"impact": "link_quality"}}
#: Stragglers of the rule comparison (the Bernoulli p = 0.2 half of the earlier version is not run: time).
STRAGGLERS = {"no stragglers": None}

#: The learning rates of the sweep (scenario 1's setting; the paper's is 0.02; make_report.LR_CHOSEN the one used).
LRS = (0.02, 0.5, 2.0)
#: The privacy-utility curve: scenario 1's personalised run (0-1-2) at these ε.
CURVE_EPSILONS = (20.0, 100.0, 1000.0, 10000.0, 100000.0)


# ----------------------------------------------------------------------------- the runs

def _variant(base, **padpfl):
    from testbed.assembly.config import replace

    return replace(base, padpfl=padpfl)


def scenario_variants(name: str) -> Iterator[tuple[str, object]]:
    """(label, config) of scenario ``name``: its non-private assignments, the personalised one at
    ε = 5 and 20, and identical factors at ε = 20 (the paper's reference curve)."""
    from testbed.assembly.config import load_config

    base = load_config(HERE / f"{name}.toml")
    plain, personal = SCENARIOS[name]
    for label in plain:
        keys = S4[label] if name == "s4" and label in S4 else {"ratios": label}
        yield f"non-private {label}", _variant(base, epsilon=None, clip=None, **keys)
    keys = S4[personal] if name == "s4" else {"ratios": personal}
    for eps in (5.0, 20.0):
        yield f"private {personal} eps={eps:g}", _variant(base, epsilon=eps, **keys)
    yield "private 1-1-1 eps=20", _variant(base, epsilon=20.0, ratios="1-1-1")


def rule_variants() -> Iterator[tuple[str, object]]:
    """(label, config): scenario 3's hand-set factors and the automatic rules, non-private and at
    ε = 20, for each straggler setting of STRAGGLERS."""
    from testbed.assembly.config import load_config, replace

    base = load_config(HERE / "s3.toml")
    for setting, stragglers in STRAGGLERS.items():
        for privacy, keys in (("non-private", {"epsilon": None, "clip": None}), ("eps=20", {"epsilon": 20.0})):
            for rule, rule_keys in RULES.items():
                auto = "impact" in rule_keys
                padpfl = {**keys, **rule_keys} | ({"ratios": None, "parts": None} if auto else {})
                extra = {"stragglers": stragglers} if stragglers else {}
                yield f"{setting} | {privacy} | {rule}", replace(base, padpfl=padpfl, **extra)


def lr_variants() -> Iterator[tuple[str, object]]:
    """(label, config): scenario 1 at each learning rate of LRS, non-private with equal factors and
    private 0-1-2 at ε = 20."""
    from testbed.assembly.config import load_config

    base = load_config(HERE / "s1.toml")
    for lr in LRS:
        yield f"non-private 1-1-1 lr={lr:g}", _variant(base, epsilon=None, clip=None, ratios="1-1-1", lr=lr)
        yield f"private 0-1-2 eps=20 lr={lr:g}", _variant(base, epsilon=20.0, lr=lr)


def curve_variants() -> Iterator[tuple[str, object]]:
    """(label, config): scenario 1's personalised run at each ε of CURVE_EPSILONS."""
    from testbed.assembly.config import load_config

    base = load_config(HERE / "s1.toml")
    for eps in CURVE_EPSILONS:
        yield f"eps={eps:g}", _variant(base, epsilon=eps)


def learns_variants() -> Iterator[tuple[str, object]]:
    """(label, config): learns.toml at the paper's ε = 5, and without noise for reference."""
    from testbed.assembly.config import load_config

    base = load_config(HERE / "learns.toml")
    yield "private eps=5", base
    yield "non-private", _variant(base, epsilon=None, clip=None)


def sound_variants() -> Iterator[tuple[str, object]]:
    """(label, config): scenario 1's private runs at the paper's ε (5 and 20) under the testbed's default
    sensitivity, 2B (clipped_weights: true of SGD-trained weights clipped to B), not a reproduction; and
    its non-private personalised run for reference."""
    from testbed.assembly.config import load_config, replace

    base = load_config(HERE / "s1.toml")
    sound = {"privacy": {"reproduction": False}}
    yield "non-private 0-1-2", _variant(base, epsilon=None, clip=None)
    for eps, ratios in ((5.0, "0-1-2"), (20.0, "0-1-2"), (20.0, "1-1-1")):
        yield (f"private {ratios} eps={eps:g}",
               replace(base, padpfl={"sensitivity": "clipped_weights", "epsilon": eps, "ratios": ratios}, **sound))


def dp_sgd_variants() -> Iterator[tuple[str, object]]:
    """(label, config): learns_dp_sgd.toml (DP-SGD local steps, a sound ε), and its non-private twin: the
    same data, model, rounds, steps, batch and lr with plain SGD steps and no clipping."""
    from testbed.assembly.config import load_config

    base = load_config(HERE / "learns_dp_sgd.toml")
    yield "private eps=5", base
    yield "non-private", _variant(base, local_step="sgd", sample_clip=None, epsilon=None, clip=None)


PARTS: dict[str, Callable[[], Iterator[tuple[str, object]]]] = {
    **{name: (lambda name=name: scenario_variants(name)) for name in SCENARIOS},
    "impact": rule_variants, "lr": lr_variants, "curve": curve_variants, "learns": learns_variants,
    "sound": sound_variants, "dp_sgd": dp_sgd_variants}


def _short(x: float) -> float:
    """``x`` to 6 significant digits (the data files stay small; the REPORT prints fewer)."""
    return float(f"{x:.6g}")


def majority_share(config, seed: int) -> float:
    """The largest class's share of the test rows the run is evaluated on (every node's)."""
    from testbed.assembly.assemble import load_run_data
    from testbed.assembly.config import replace

    y = np.asarray(load_run_data(replace(config, run={"seed": seed})).test.y, dtype=np.int64)
    return _short(np.bincount(y).max() / len(y))


def run_one(config, seed: int, tmp: Path) -> dict:
    """One run's record: seed, final metrics, curves every CURVE_EVERY rounds, the ledger's ε."""
    from testbed.assembly.config import replace
    from testbed.orchestration.runner import run_experiment
    from testbed.reports.results import read_metrics

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = run_experiment(replace(config, run={"seed": seed}), out_dir=tmp, quiet=True)
    rows = read_metrics(tmp)
    keep = [i for i in range(len(rows)) if i % CURVE_EVERY == 0 or i == len(rows) - 1]
    nodes = result.summary["nodes"].values()
    private = result.summary["privacy"]["private"]
    return {"seed": seed,
            "train_loss": _short(float(rows[-1]["train_loss"])), "test_accuracy": _short(float(rows[-1]["test_accuracy"])),
            "rounds": [int(rows[i]["round"]) for i in keep],
            "train_loss_curve": [_short(float(rows[i]["train_loss"])) for i in keep],
            "test_accuracy_curve": [_short(float(rows[i]["test_accuracy"])) for i in keep],
            # None: not private (no noise on the models: ε = ∞, whatever the score releases spent).
            "epsilon": _short(max(n["epsilon"] for n in nodes)) if private else None,
            "epsilon_tight": _short(max((n["epsilon_tight"] or 0.0) for n in nodes)),
            "by_observer": {o: _short(max(n["epsilon_by_observer"].get(o, 0.0) for n in nodes)) for o in ("server", "public")},
            "settings": result.summary["algorithm_settings"]}


def _noise(settings: dict) -> dict:
    """What the algorithm reports of its noise (Padpfl.describe), for the REPORT's noise table."""
    keys = ("lr", "clip", "rounds", "uploads", "participation", "min_samples", "epsilon", "sigma_client",
            "epsilon_paper_uplink", "epsilon_paper_downlink")
    out = {k: settings[k] for k in keys if k in settings}
    if settings.get("local_step") == "dp_sgd":  # the noise is DP-SGD's, on every local step
        out |= {k: settings[k] for k in ("delta", "sample_clip", "step_sigma", "step_sensitivity", "steps_charged",
                                         "epsilon_zcdp")}
    if "phases" in settings:
        out["phases"] = [{k: ph[k] for k in ("sigma_server", "sigma_total", "sigma_target")} for ph in settings["phases"]]
    return out


def run_part(part: str, seeds: int, committed: dict | None = None) -> dict:
    """Every variant of ``part`` over seeds 0 .. ``seeds`` − 1; with the part's ``committed`` record, only
    the seeds it lacks, after :func:`check_committed`. The part's record with its wall time (the sum over
    the batches of seeds that made it, each batch's kept in ``batches``)."""
    start = time.perf_counter()
    have = committed["seeds"] if committed else 0
    if committed:
        check_committed(part, committed)
    new = range(have, seeds)
    variants: dict[str, dict] = {}
    majority = list(committed["majority_share"]) if committed else []
    with tempfile.TemporaryDirectory() as tmp:
        for k, (label, config) in enumerate(PARTS[part]()):
            if len(majority) < seeds:
                majority += [majority_share(config, s) for s in new]
            runs = [run_one(config, s, Path(tmp) / f"{k}-{s}") for s in new]
            settings = [r.pop("settings") for r in runs][0]  # the same for every seed
            old = committed["variants"][label] if committed else {"noise": _noise(settings), "runs": []}
            if old["noise"] != _noise(settings):
                raise SystemExit(f"{part}: {label}'s noise differs from the committed data's; rerun the part afresh")
            variants[label] = {"noise": old["noise"], "runs": old["runs"] + runs}
            print(f"{part} {label:40} loss {np.mean([r['train_loss'] for r in runs]):.4f} "
                  f"acc {np.mean([r['test_accuracy'] for r in runs]):.3f}", flush=True)
    took = round(time.perf_counter() - start, 1)
    batches = (committed.get("batches") or [{"seeds": have, "wall_time_s": committed["wall_time_s"]}]) if committed else []
    batches = batches + [{"seeds": len(new), "wall_time_s": took}]
    return {"part": part, "seeds": seeds, "majority_share": majority,
            "wall_time_s": round(sum(b["wall_time_s"] for b in batches), 1), "batches": batches, "variants": variants}


def check_committed(part: str, committed: dict) -> None:
    """Re-run the last committed seed of the part's first and last variants; SystemExit (a one-line
    refusal) unless each reproduces its committed record to the data's digits: new seeds may join
    committed ones only if the code still makes those."""
    variants = list(PARTS[part]())
    seed = committed["seeds"] - 1
    with tempfile.TemporaryDirectory() as tmp:
        for label, config in (variants[0], variants[-1]):
            fresh = run_one(config, seed, Path(tmp) / f"check-{label}")
            fresh.pop("settings")
            if fresh != committed["variants"][label]["runs"][seed]:
                differ = sorted(k for k in fresh if fresh[k] != committed["variants"][label]["runs"][seed].get(k))
                raise SystemExit(f"{part}: {label}, seed {seed} does not reproduce its committed record ({', '.join(differ)}); "
                                 "not adding seeds to it: rerun the part afresh (--fresh)")
            print(f"{part} {label}: seed {seed} reproduces its committed record", flush=True)


def load_data() -> dict[str, dict]:
    """Every part's committed record (data/<part>.json), in PARTS' order."""
    return {p: json.loads((DATA / f"{p}.json").read_text()) for p in PARTS if (DATA / f"{p}.json").exists()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", default=",".join(PARTS), help="which parts to run (their data files only)")
    parser.add_argument("--seeds", type=int, default=None,
                        help="seeds per part (default: the plan's, --plan-seeds); a committed part gets the missing ones")
    parser.add_argument("--fresh", action="store_true", help="rerun the parts' committed seeds too")
    parser.add_argument("--report-only", action="store_true", help="rewrite REPORT.md from data/ alone")
    parser.add_argument("--plan-seeds", action="store_true", help="print the seeds by power from data/ alone")
    parser.add_argument("--no-report", action="store_true", help="write the parts' data only, not REPORT.md")
    args = parser.parse_args()
    from make_report import plan_table, report, seed_plan  # beside this file

    from testbed.reports.verdicts import recording, write_report

    if args.plan_seeds:
        print(plan_table(load_data(), list(PARTS), MIN_SEEDS, COMPUTE_BUDGET_MIN))
        return
    if args.seeds is not None and args.seeds < 2:
        parser.error(f"--seeds: at least 2 (a paired interval needs two), got {args.seeds}")
    if not args.report_only:
        DATA.mkdir(exist_ok=True)
        for part in args.parts.split(","):
            if part not in PARTS:
                parser.error(f"--parts: unknown part {part!r} (known: {', '.join(PARTS)})")
        for part in args.parts.split(","):
            data = load_data()
            committed = None if args.fresh else data.get(part)
            seeds = args.seeds or seed_plan(data, list(PARTS), MIN_SEEDS, COMPUTE_BUDGET_MIN)[part]["seeds"]
            if committed and committed["seeds"] >= seeds:
                print(f"{part}: {committed['seeds']} seeds committed, {seeds} planned: nothing to run", flush=True)
                continue
            record = run_part(part, seeds, committed)
            (DATA / f"{part}.json").write_text(json.dumps(record, ensure_ascii=False, allow_nan=False) + "\n")
    if args.no_report:
        return
    data = load_data()
    with recording() as families:
        text = report(data, (list(PARTS), MIN_SEEDS, COMPUTE_BUDGET_MIN))
    write_report(HERE / "REPORT.md", text, families)


if __name__ == "__main__":
    import sys

    sys.path.insert(0, str(HERE))
    main()
