"""The design and the runs of experiments/topologies/reproduce.py: the graphs and scenarios it runs,
their seeds by power (SEEDS, BUDGET, the effects of interest), and running them into data/<scenario>.json,
from scratch (run_scenario) or adding only the seeds a file lacks (extend_scenario, after rerunning its
cheapest committed run and refusing unless that reproduces the committed record)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
DATA = HERE / "data"
sys.path.insert(0, str(HERE.parents[1]))

from testbed.reports.majority import class_shares_of_test_set as class_shares  # noqa: E402
from testbed.reports.seed_plan import first_mismatch  # noqa: E402





def topology_curves(section: str) -> dict[str, tuple[tuple[str, Any], ...]]:
    """curve → the point values of its runs: its [topology], and for the random geometric graphs the
    square their nodes stand in (a key of the algorithm's ``section``); the first is the reference."""
    area = ((f"{section}.area_m", 10.0),)
    return {
        "complete": (("topology.kind", "complete"),),
        "geometric, long range": (("topology.kind", "random_geometric"), ("topology.snr_threshold_db", -29.0), *area),
        "geometric, short range": (("topology.kind", "random_geometric"), ("topology.snr_threshold_db", -26.0), *area),
        "torus 4×4": (("topology.kind", "torus"), ("topology.rows", 4)),
        "ring": (("topology.kind", "ring"),),
    }


#: scenario → (what its runs are, for the report; its base file; what it changes in that file)
SCENARIOS: dict[str, tuple[str, str, dict[str, dict[str, Any]]]] = {
    "dwfl": ("DWFL over the air at the paper's ε", "base.toml", {}),
    # 10× the paper's ε, 100× less calibrated noise variance: do the sparse graphs learn once a looser
    # ε pays for the noise their few neighbours cannot share?
    "dwfl-eps5": ("DWFL over the air at 10× the paper's ε", "base.toml", {"dwfl": {"epsilon": 5.0}}),
    # the baselines on the same graphs and seeds at dwfl's and dwfl-eps5's guarantees, each link its own slot
    "dpsgd": ("D-PSGD over orthogonal links at the paper's ε", "base-dpsgd.toml", {"dpsgd": {"epsilon": 0.5}}),
    "gossip": ("Gossip averaging over orthogonal links at the paper's ε", "base-gossip.toml", {"gossip": {"epsilon": 0.5}}),
    "dpsgd-eps5": ("D-PSGD over orthogonal links at 10× the paper's ε", "base-dpsgd.toml", {}),
    "gossip-eps5": ("Gossip averaging over orthogonal links at 10× the paper's ε", "base-gossip.toml", {}),
}
#: (scenario, baseline scenario) compared curve by curve: over the air against orthogonal links.
VERSUS = (("dwfl", "dpsgd"), ("dwfl", "gossip"), ("dwfl-eps5", "dpsgd-eps5"), ("dwfl-eps5", "gossip-eps5"))
REFERENCE = "complete"
LAST = 10  # rounds averaged for a run's final (and first) accuracy and loss
CURVE_EVERY = 2  # rounds between the stored points of a curve
#: Seeds per scenario: the plan from the 5-seed pilot (``--plan-seeds``), capped by BUDGET.
SEEDS = {"dwfl": 8, "dwfl-eps5": 8, "dpsgd": 8, "gossip": 8, "dpsgd-eps5": 8, "gossip-eps5": 8}
#: The compute budget, seeds per scenario: one more seed of every scenario costs about 4.7 min of runs
#: (5 curves, 4 to 20 s a run, one process on the shared 2-core machine); 8 seeds, 37 min of runs for
#: the folder, is what the session regenerating it had.
BUDGET = {name: 8 for name in SEEDS}
#: What a run's record holds that is measured, not computed: wall times, and the energy of the ledger's
#: compute events (modelled from the measured compute time). An extension's check ignores them.
MEASURED = frozenset({"wall_s", "node_energy_j", "energy_j"})
#: Effects of interest (the smallest mean paired difference each family's claims are about).
#: Test accuracy: one percentage point, the resolution the findings speak in.
ACCURACY_EFFECT = 0.01
#: Training loss: 1 % of ln 10 = 2.303, the cross-entropy of a guess at chance over mnist's 10 classes
#: (the loss's scale), as one percentage point is 1 % of the accuracy's.
LOSS_EFFECT = 0.01 * float(np.log(10.0))
DIGITS = 6  # significant digits of every stored float (far below the seed noise of any metric here)


# ------------------------------------------------------------------------------------------------ running


def compact(value: Any, digits: int = DIGITS) -> Any:
    """``value`` with every float rounded to ``digits`` significant digits (recursively)."""
    if isinstance(value, float):
        return value if not np.isfinite(value) else float(f"{value:.{digits}g}")
    if isinstance(value, dict):
        return {str(k): compact(v, digits) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [compact(v, digits) for v in value]
    return value


def run_topology(config):
    """The run's :class:`testbed.topology.Topology`, drawn as the run draws it (DWFL's from its
    radio; the baselines' from their section's link budget)."""
    from testbed.topology import Topology

    algorithm = config.run.algorithm
    if algorithm == "dwfl":
        from testbed.algorithms.dwfl import topology_from_sections

        return topology_from_sections({"dwfl": config.dwfl, "topology": config.topology},
                                      config.data.num_nodes, config.run.seed)
    return Topology(config.topology, config.data.num_nodes, config.run.seed, getattr(config, algorithm).link_budget())


def node_degrees(config) -> list[int]:
    """Each node's number of neighbours in the run's (first) graph."""
    topology = run_topology(config)
    if topology.is_complete:  # never built
        return [config.data.num_nodes - 1] * config.data.num_nodes
    return topology.graph(0).degrees.tolist()


def ledger_curves(run_dir: Path, num_nodes: int, accountant: str, delta: float, rounds: list[int]) -> dict[str, list]:
    """From the run's ledger.csv, after each of ``rounds`` (1-based counts of rounds done): the mean
    over the nodes of the energy spent so far (every compute and communication event), J, and of
    the ε spent so far (each node's Gaussian releases composed by ``accountant``, as the ledger's)."""
    from testbed.ledger.events import GaussianEvent
    from testbed.ledger.files import read_ledger
    from testbed.privacy.accountants.registry import get, signature_of

    energy = np.zeros(max(rounds) + 1)
    releases: list[list[tuple[int, tuple]]] = [[] for _ in range(num_nodes)]
    for event in read_ledger(run_dir / "ledger.csv"):
        if isinstance(event, GaussianEvent):
            releases[event.node].append((event.round, (signature_of(event), event.count)))
        elif getattr(event, "energy_j", 0.0) and event.round < len(energy):
            energy[event.round] += event.energy_j
    spent = np.cumsum(energy) / num_nodes
    compose = get(accountant).epsilon
    eps = [float(np.mean([compose(_tally(items for r, items in node if r < done), delta) for node in releases]))
           for done in rounds]
    return {"energy_j": [float(spent[done - 1]) for done in rounds], "eps_mean": eps}


def _tally(items) -> list[tuple[tuple, int]]:
    """(signature, count) pairs with equal signatures summed."""
    counts: dict[tuple, int] = {}
    for signature, count in items:
        counts[signature] = counts.get(signature, 0) + count
    return list(counts.items())


def collect(run_dir: Path, curve: str, config) -> dict[str, Any]:
    """One run's record: final metrics, curves against rounds, and per node its degree, noise and ε."""
    from testbed.reports.results import read_metrics

    summary = json.loads((run_dir / "summary.json").read_text())
    rows = read_metrics(run_dir)
    acc = [r["test_accuracy"] for r in rows]
    loss = [r["train_loss"] for r in rows]
    eps = [r["epsilon"] for r in rows]
    settings = summary["algorithm_settings"]
    nodes = [summary["nodes"][str(i)] for i in range(config.data.num_nodes)]
    chance, majority = class_shares(config)
    n = config.data.num_nodes
    sub = slice(CURVE_EVERY - 1, None, CURVE_EVERY)
    if "sigma2" in settings:  # DWFL: one artificial noise variance, σ and ε per receiver
        sigma2, node_sigma, node_eps_round = settings["sigma2"], settings["privacy_sigma"], settings["epsilon_per_receiver"]
    else:  # a baseline: every node's local noise σ, the same ε per round for every release
        sigma2, node_sigma, node_eps_round = settings["sigma"] ** 2, [settings["sigma"]] * n, [settings["epsilon_round_max"]] * n
    return {
        "curve": curve, "seed": config.run.seed,
        "final_acc": float(np.mean(acc[-LAST:])), "first_acc": float(np.mean(acc[:LAST])),
        "final_loss": float(np.mean(loss[-LAST:])), "chance": chance, "majority": majority,
        # the gap of the matrix a round applies: DWFL's Ψ = (1 − η) I + η W (eq. 8), a baseline's W
        "spectral_gap": summary["topology"].get("effective_spectral_gap", summary["topology"]["spectral_gap"]),
        "sigma2": sigma2,
        "node_degree": node_degrees(config), "node_sigma": node_sigma, "node_eps_round": node_eps_round,
        "node_eps": [node["epsilon"] for node in nodes],
        "node_energy_j": [n["energy_j"] for n in nodes],
        "wall_s": summary["wall_s"],
        "acc": acc[sub], "loss": loss[sub], "eps": eps[sub],
        **ledger_curves(run_dir, n, summary["privacy"]["accountant"], config.privacy.delta,
                        [int(r["round"]) for r in rows][sub]),
    }


def _base(name: str):
    from testbed.assembly.config import load_config, replace

    what, base_file, changes = SCENARIOS[name]
    return replace(load_config(HERE / base_file), **changes)


def _run_seeds(name: str, seeds: list[int], workers: int, out: Path, only: str | None = None) -> list[dict[str, Any]]:
    """The records of every curve (or the curve ``only``) of scenario ``name`` at ``seeds``, curve by curve."""
    from testbed.orchestration.sweep import Point, point_config, run_sweep

    base = _base(name)
    rounds = getattr(base, base.run.algorithm).rounds
    start = time.monotonic()
    runs = []
    for curve, values in topology_curves(base.run.algorithm).items():
        if only is not None and curve != only:
            continue
        points = [Point(values, s) for s in seeds]
        for p in points:  # a graph that falls apart is refused before anything runs
            run_topology(point_config(base, p)).check(rounds)
        folder = out / name / _slug(curve)
        swept = run_sweep(base, points, folder, workers=workers, quiet=True)
        for p, row in zip(points, swept):
            runs.append(compact(collect(folder / row["run"], curve, point_config(base, p))))
        print(f"{name}: {curve} done ({time.monotonic() - start:.0f} s)", flush=True)
    return runs


def _record(name: str, seeds: list[int], runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Scenario ``name``'s data file: its settings, seeds and runs (ordered curve by curve, seeds in order)."""
    what, base_file, _ = SCENARIOS[name]
    base = _base(name)
    curves = topology_curves(base.run.algorithm)
    order = {c: i for i, c in enumerate(curves)}
    runs = sorted(runs, key=lambda r: (order[r["curve"]], r["seed"]))
    return compact({"scenario": name, "what": what, "base": base_file, "algorithm": base.run.algorithm,
                    "rounds": getattr(base, base.run.algorithm).rounds, "num_nodes": base.data.num_nodes,
                    "epsilon_round": getattr(base, base.run.algorithm).epsilon, "delta": base.privacy.delta,
                    "seeds": seeds, "last_rounds": LAST, "curve_every": CURVE_EVERY,
                    "curves": {c: dict(v) for c, v in curves.items()},
                    "runs_wall_s": round(sum(r["wall_s"] for r in runs), 1), "runs": runs})


def _write(name: str, record: dict[str, Any]) -> Path:
    DATA.mkdir(exist_ok=True)
    path = DATA / f"{name}.json"
    path.write_text(json.dumps(record, separators=(",", ":"), ensure_ascii=False, allow_nan=False) + "\n")
    return path


def run_scenario(name: str, seeds: int, workers: int, out: Path) -> Path:
    """Run every curve of scenario ``name`` over ``seeds`` seeds and write data/<name>.json."""
    first = _base(name).run.seed
    chosen = list(range(first, first + seeds))
    return _write(name, _record(name, chosen, _run_seeds(name, chosen, workers, out)))


def extend_scenario(name: str, seeds: int, workers: int, out: Path) -> Path:
    """Add to data/<name>.json only the seeds it lacks (up to ``seeds`` in all), after rerunning its
    cheapest committed run: SystemExit (one line) unless that rerun, and the file's settings, equal the
    committed ones (measured times aside), so the extended file is what a full regeneration would give."""
    import tempfile

    path = DATA / f"{name}.json"
    if not path.is_file():
        raise SystemExit(f"{name}: nothing to extend: {path} does not exist (run it without --extend)")
    committed = json.loads(path.read_text())
    first = _base(name).run.seed
    have = committed["seeds"]
    if have != list(range(first, first + len(have))):
        raise SystemExit(f"{name}: refusing to extend: its seeds {have} are not {first}, {first + 1}, ...")
    if seeds <= len(have):
        print(f"{name}: {len(have)} seeds committed, {seeds} asked: nothing to run", flush=True)
        return path
    cheapest = min(committed["runs"], key=lambda r: r["wall_s"])
    with tempfile.TemporaryDirectory() as scratch:  # a fresh folder: the sweep must not reuse a finished run
        rerun = _run_seeds(name, [cheapest["seed"]], 1, Path(scratch), only=cheapest["curve"])[0]
    settings = {k: v for k, v in _record(name, have, committed["runs"]).items() if k != "runs"}
    found = (first_mismatch(cheapest, rerun, MEASURED)
             or first_mismatch({k: v for k, v in committed.items() if k != "runs"}, settings, {"runs_wall_s"}))
    if found:
        raise SystemExit(f"{name}: refusing to extend: seed {cheapest['seed']} of {cheapest['curve']!r} does not "
                         f"reproduce the committed data ({found})")
    print(f"{name}: seed {cheapest['seed']} of {cheapest['curve']!r} reproduces the committed run", flush=True)
    added = list(range(first + len(have), first + seeds))
    runs = committed["runs"] + _run_seeds(name, added, workers, out)
    return _write(name, _record(name, have + added, runs))


def _slug(curve: str) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in curve.replace("×", "x")).strip("-")
