"""The design and the runs of experiments/scene/reproduce.py: the scenarios (an algorithm's base file),
the two curves each runs (the street canyon, and free space at the same positions), and running them
into data/<scenario>.json.

A seed's free-space twin: the canyon run of that seed places its nodes (testbed.topology.scene, on the
canyon's open ground) and its server point; the twin is the same experiment in Sionna RT's empty scene
with ``placement = "file"`` at exactly those positions (written to the run folder) and that server, so
its traced gains are Friis' between the same points and only the buildings differ. Each run is kept
in its folder (``--out``): a rerun reuses a finished run instead of running it again."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
DATA = HERE / "data"
sys.path.insert(0, str(HERE.parents[1]))

from testbed.reports.majority import class_shares_of_test_set as class_shares  # noqa: E402

#: scenario → (what its runs are, for the report; its base file)
SCENARIOS: dict[str, tuple[str, str]] = {
    "dwfl": ("DWFL over the air", "base.toml"),
    "dpsgd": ("D-PSGD over orthogonal links", "base-dpsgd.toml"),
    "gossip": ("Gossip averaging over orthogonal links", "base-gossip.toml"),
}
CANYON, FREE = "street canyon", "free space"
CURVES = (CANYON, FREE)
SEEDS = 64
LAST = 10  # rounds averaged for a run's final (and first) accuracy and loss
CURVE_EVERY = 2  # rounds between the stored points of a curve
DIGITS = 6  # significant digits of every stored float
#: Effects of interest, one per family (testbed.reports.seed_plan plans seeds from them):
#: - test accuracy, 0.02: the task runs from 0.5 (chance, about the majority share) to 0.875 (Bayes), and
#:   a site worth choosing over another for its radio would move the final accuracy by a noticeable part
#:   of that span; two percentage points are about 5 % of it, one point (the other REPORTs') is below
#:   what a deployment would act on for an 8-node network.
#: - mean degree, one neighbour: with N = 8 one neighbour more or less per node is one of seven, a change
#:   in the spectral gap (how fast averaging mixes) that the algorithms' rates feel.
#: - DWFL's calibrated noise (σ² and ε per receiver, two units in one family) and the baselines' energy
#:   per node: no effect of interest (what size matters depends on a deployment's noise and battery),
#:   so no seeds are planned from them; their verdicts are reported at the seeds the others need.
ACCURACY_EFFECT = 0.02
DEGREE_EFFECT = 1.0


def compact(value: Any, digits: int = DIGITS) -> Any:
    """``value`` with every float rounded to ``digits`` significant digits (recursively)."""
    if isinstance(value, (float, np.floating)):
        value = float(value)
        return value if not np.isfinite(value) else float(f"{value:.{digits}g}")
    if isinstance(value, dict):
        return {str(k): compact(v, digits) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [compact(v, digits) for v in value]
    if isinstance(value, np.integer):
        return int(value)
    return value


def base_tables(name: str) -> dict[str, Any]:
    """The scenario's base file as a dict of its tables."""
    return tomllib.loads((HERE / SCENARIOS[name][1]).read_text())


def _tables(name: str, curve: str, seed: int, folder: Path) -> dict[str, Any]:
    """The experiment of one run: the base at ``seed``, its traces cached under ``folder``; the
    free-space curve at the canyon run's positions and server (written to ``folder``)."""
    tables = base_tables(name)
    algorithm = tables["run"]["algorithm"]
    tables["run"]["seed"] = seed
    tables["output"]["dir"] = str(folder / "runs")
    scene = tables[algorithm]["scene"]
    scene["cache_dir"] = str(folder / "cache")
    if curve == FREE:
        positions, server = site_of(name, seed, folder)
        path = folder / "positions" / f"seed-{seed}.txt"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(f"{x!r} {y!r} {z!r}\n" for x, y, z in positions.tolist()))
        scene.update(name="empty", placement="file", positions_path=str(path), server_position_m=server.tolist())
    return tables


def site_of(name: str, seed: int, folder: Path) -> tuple[np.ndarray, np.ndarray]:
    """(N, 3) the canyon run's node positions and (3,) its server point at ``seed``, m."""
    from testbed.assembly.experiment import experiment_config
    from testbed.topology.scene import scene_geometry

    geometry = scene_geometry(experiment_config(_tables(name, CANYON, seed, folder)))
    return geometry.positions_m, geometry.server_position_m


def run_one(name: str, curve: str, seed: int, folder: Path) -> dict[str, Any]:
    """One run's record (run, or read back when its folder holds a finished run)."""
    import testbed
    from testbed.assembly.experiment import experiment_config

    tables = _tables(name, curve, seed, folder)
    run_dir = folder / name / curve.replace(" ", "-") / f"seed-{seed}"
    summary = run_dir / "summary.json"
    if not (summary.is_file() and json.loads(summary.read_text()).get("status") == "completed"):
        if run_dir.exists():
            shutil.rmtree(run_dir)
        testbed.run(tables, out=run_dir)
    return compact(collect(run_dir, curve, experiment_config(tables)))


def collect(run_dir: Path, curve: str, config) -> dict[str, Any]:
    """One run's record: final metrics, curves against rounds, the site (positions, server, traced
    gains in dB), the graph (edges, degrees, parts), per node its noise, ε and energy."""
    from testbed.assembly import assemble
    from testbed.reports.results import read_metrics
    from testbed.topology.graph import Graph
    from testbed.topology.scene import scene_geometry

    summary = json.loads((run_dir / "summary.json").read_text())
    rows = read_metrics(run_dir)
    acc = [r["test_accuracy"] for r in rows]
    loss = [r["train_loss"] for r in rows]
    n = config.data.num_nodes
    settings = summary["algorithm_settings"]
    nodes = [summary["nodes"][str(i)] for i in range(n)]
    chance, majority = class_shares(config)
    geometry = scene_geometry(config)
    edges = np.asarray(assemble.graph_view(config).edges(0), dtype=np.int64).reshape(-1, 2)
    graph = Graph.from_edges(n, edges)
    with np.errstate(divide="ignore"):
        gain_db = np.where(geometry.links.gain > 0, 10.0 * np.log10(geometry.links.gain), -np.inf)
    if "sigma2" in settings:  # DWFL: one artificial noise variance, ε per receiver
        sigma2, node_eps_round = settings["sigma2"], settings["epsilon_per_receiver"]
    else:  # a baseline: every node's local noise σ, the same ε per round for every release
        sigma2, node_eps_round = settings["sigma"] ** 2, [settings["epsilon_round_max"]] * n
    sub = slice(CURVE_EVERY - 1, None, CURVE_EVERY)
    return {
        "curve": curve, "seed": config.run.seed,
        "final_acc": float(np.mean(acc[-LAST:])), "first_acc": float(np.mean(acc[:LAST])),
        "final_loss": float(np.mean(loss[-LAST:])), "chance": chance, "majority": majority,
        "positions_m": geometry.positions_m.tolist(), "server_m": geometry.server_position_m.tolist(),
        # [receiver, sender]; a link with no path is None (JSON has no −inf)
        "gain_db": [[None if not np.isfinite(g) else float(g) for g in row] for row in gain_db],
        "edges": edges.tolist(), "node_degree": graph.degrees.tolist(),
        "parts": int(graph.components.max()) + 1, "spectral_gap": summary["topology"]["spectral_gap"],
        "sigma2": sigma2, "node_eps_round": node_eps_round,
        "node_eps": [node["epsilon"] for node in nodes], "node_energy_j": [node["energy_j"] for node in nodes],
        "wall_s": summary["wall_s"], "acc": acc[sub], "loss": loss[sub],
    }


def footprints_of_canyon(name: str) -> list[list[list[list[float]]]]:
    """The canyon's buildings from above (testbed.reports.scene_picture.footprints), kept in the data
    so that the report draws the site without Sionna RT."""
    from channel.scene.geometry import load_scene
    from testbed.reports.scene_picture import footprints
    from testbed.topology.scene import SceneSection

    tables = base_tables(name)
    section = tables[tables["run"]["algorithm"]]
    scene = load_scene(SceneSection(**section["scene"]).spec(section["carrier_hz"], section["bandwidth_hz"]))
    return [compact(f.triangles_xy.tolist()) for f in footprints(scene.objects)]


def _seeds_of_dwfl() -> tuple[list[int], list[dict[str, Any]]] | None:
    """The seeds data/dwfl.json ran and the ones DWFL refused, or None before it exists."""
    path = DATA / "dwfl.json"
    if not path.is_file():
        return None
    record = json.loads(path.read_text())
    return record["seeds"], record.get("refused", [])


def run_scenario(name: str, seeds: int, folder: Path) -> Path:
    """Run both curves of scenario ``name`` over ``seeds`` seeds and write data/<name>.json.

    DWFL takes the seeds from the base's upward, skipping a seed whose site it cannot calibrate at the
    base's ε in either curve (a receiver with one neighbour hears no other sender's artificial noise, so
    only the channel's noise protects it; testbed refuses that run at build): such a seed is recorded
    under ``refused`` with the curve and the refusal, and the next seed is tried. The baselines run at
    DWFL's seeds (data/dwfl.json, so every scenario stands at the same sites) and record DWFL's
    refusals as theirs; without data/dwfl.json, at the base's seeds upward."""
    from testbed.errors import ConfigError

    tables = base_tables(name)
    algorithm = tables["run"]["algorithm"]
    first = tables["run"]["seed"]
    dwfl = None if name == "dwfl" else _seeds_of_dwfl()
    candidates = iter(dwfl[0]) if dwfl else iter(range(first, first + 10 * seeds))
    refused: list[dict[str, Any]] = list(dwfl[1]) if dwfl else []
    chosen: list[int] = []
    start, load_start = time.monotonic(), os.getloadavg()[0]
    runs = []
    for seed in candidates:  # seed by seed: an interrupted scenario keeps whole pairs
        if len(chosen) == seeds:
            break
        pair, refusal = [], None
        for curve in CURVES:
            try:
                pair.append(run_one(name, curve, seed, folder))
            except ConfigError as error:  # DWFL only: the base's ε cannot be met at this site
                refusal = {"seed": seed, "curve": curve, "refusal": str(error)}
                break
        if refusal:
            refused.append(refusal)
            print(f"{name}: seed {seed} refused in {refusal['curve']}: {refusal['refusal']}", flush=True)
            continue
        runs += pair
        chosen.append(seed)
        print(f"{name}: seed {seed} done ({time.monotonic() - start:.0f} s)", flush=True)
    section = tables[algorithm]
    record = compact({"scenario": name, "what": SCENARIOS[name][0], "base": SCENARIOS[name][1], "algorithm": algorithm,
                      "rounds": section["rounds"], "num_nodes": tables["data"]["num_nodes"],
                      "dataset": tables["data"]["dataset"], "dim": tables["data"].get("dim"),
                      "n_classes": tables["data"].get("n_classes"), "model": tables["model"]["kind"],
                      "epsilon_round": section["epsilon"], "delta": tables["privacy"]["delta"],
                      "snr_threshold_db": tables["topology"]["snr_threshold_db"], "power_dbm": section["power_dbm"],
                      "seeds": chosen, "refused": refused, "last_rounds": LAST, "curve_every": CURVE_EVERY,
                      "elapsed_s": round(time.monotonic() - start, 1),
                      "load_average": [round(load_start, 1), round(os.getloadavg()[0], 1)],
                      "runs_wall_s": round(sum(r["wall_s"] for r in runs), 1),
                      "footprints": footprints_of_canyon(name), "runs": runs})
    DATA.mkdir(exist_ok=True)
    path = DATA / f"{name}.json"
    path.write_text(json.dumps(record, separators=(",", ":"), ensure_ascii=False, allow_nan=False) + "\n")
    return path
