"""experiments/scene: what its committed data must hold for the REPORT's comparisons to mean what
they say. Within a seed the two curves stand at the same positions with the same server (the pairs
differ by the buildings only); the free-space twin's gains are Friis' between those positions; each
run's graph is the pairs whose SNR at full power clears the threshold on the recorded gains. That
``--report-only`` rewrites REPORT.md byte for byte from the data is tests/test_reproductions.py's
(it runs every experiments/*/reproduce*.py), and the last test here reruns it for this folder."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from channel import free_space_pathloss_db
from testbed.assembly.experiment import experiment_config

ROOT = Path(__file__).resolve().parents[1]
FOLDER = ROOT / "experiments" / "scene"
DATA = sorted((FOLDER / "data").glob("*.json"))
#: Stored floats have 6 significant digits: a gain within this of the threshold is not judged, dB.
ROUNDING_DB = 1e-3


def _record(path: Path) -> dict:
    return json.loads(path.read_text())


def test_every_scenario_has_data():
    assert {p.stem for p in DATA} == {"dwfl", "dpsgd", "gossip"}


def test_every_scenario_stands_at_the_sites_dwfl_runs_and_skips_only_those_it_refused():
    """The scenarios compare the same sites: DWFL's seeds, from the base's upward, less the ones whose
    site DWFL refused at the base's ε (scene_runs.run_scenario), and no seed both run and refused."""
    records = {p.stem: _record(p) for p in DATA}
    dwfl = records["dwfl"]
    refused = [r["seed"] for r in dwfl["refused"]]
    assert all("cannot be met" in r["refusal"] for r in dwfl["refused"])
    first = experiment_config(FOLDER / dwfl["base"]).run.seed
    assert sorted(dwfl["seeds"] + refused) == list(range(first, first + len(dwfl["seeds"]) + len(refused)))
    for record in records.values():
        assert record["seeds"] == dwfl["seeds"] and record["refused"] == dwfl["refused"], record["scenario"]


@pytest.mark.parametrize("path", DATA, ids=lambda p: p.stem)
def test_each_seed_runs_both_curves_at_the_same_site(path):
    record = _record(path)
    by_seed: dict[int, dict[str, dict]] = {}
    for run in record["runs"]:
        by_seed.setdefault(run["seed"], {})[run["curve"]] = run
    assert sorted(by_seed) == record["seeds"] and len(record["seeds"]) >= 8
    for seed, curves in by_seed.items():
        canyon, free = curves["street canyon"], curves["free space"]
        assert canyon["positions_m"] == free["positions_m"] and canyon["server_m"] == free["server_m"], seed
    sites = {json.dumps(by_seed[s]["street canyon"]["positions_m"]) for s in by_seed}
    assert len(sites) == len(by_seed)  # every seed its own placement


@pytest.mark.parametrize("path", DATA, ids=lambda p: p.stem)
def test_the_free_space_twin_is_friis_between_the_same_points(path):
    carrier_hz = 3.5e9
    for run in (r for r in _record(path)["runs"] if r["curve"] == "free space"):
        pos = np.array(run["positions_m"])
        d = np.linalg.norm(pos[:, None] - pos[None], axis=-1)
        gain_db = np.array([[math.nan if g is None else g for g in row] for row in run["gain_db"]])
        off = ~np.eye(len(pos), dtype=bool)
        np.testing.assert_allclose(gain_db[off], -free_space_pathloss_db(d[off], carrier_hz), atol=0.01)


@pytest.mark.parametrize("path", DATA, ids=lambda p: p.stem)
def test_each_graph_is_the_pairs_whose_snr_clears_the_threshold(path):
    record = _record(path)
    config = experiment_config(FOLDER / record["base"])
    radio = getattr(config, record["algorithm"])
    threshold_db = config.topology.snr_threshold_db
    budget_db = 10 * math.log10(radio.power_w / (2 * radio.noise_power_w_resolved))
    assert record["snr_threshold_db"] == threshold_db and record["power_dbm"] == radio.power_dbm
    for run in record["runs"]:
        edges = {tuple(e) for e in run["edges"]}
        n = len(run["positions_m"])
        for i in range(n):
            for k in range(i + 1, n):
                g = run["gain_db"][i][k]
                snr_db = -math.inf if g is None else budget_db + g
                if abs(snr_db - threshold_db) > ROUNDING_DB:
                    assert ((i, k) in edges) == (snr_db >= threshold_db), (run["curve"], run["seed"], i, k, snr_db)
        assert np.bincount(np.array(run["edges"], dtype=int).ravel(), minlength=n).tolist() == run["node_degree"]


@pytest.mark.parametrize("path", DATA, ids=lambda p: p.stem)
def test_every_scenario_runs_the_learner_and_privacy_of_its_base_file_and_free_space_learns(path):
    """The accuracy comparison means something only if the runs learn: the data are the base file's
    learner and ε (equal in both curves), and free space's final accuracy is above the majority share
    in every seed and by more than ten points on average (the REPORT's "learns" column asks the 95 %
    interval over the seeds to clear it)."""
    record = _record(path)
    config = experiment_config(FOLDER / record["base"])
    section = getattr(config, record["algorithm"])
    assert (record["dataset"], record["dim"], record["n_classes"]) == (config.data.dataset, config.data.dim,
                                                                      config.data.n_classes)
    assert (record["rounds"], record["epsilon_round"]) == (section.rounds, section.epsilon)
    free = [r for r in record["runs"] if r["curve"] == "free space"]
    assert free and all(r["final_acc"] > r["majority"] for r in free), [(r["seed"], r["final_acc"]) for r in free]
    assert np.mean([r["final_acc"] - r["majority"] for r in free]) > 0.1  # clearly, on average over the seeds


def test_report_only_rewrites_the_report_from_the_data():
    """Written anew (a new file in its place) and exactly as committed; never overwritten with
    anything else here, as other tests read it meanwhile."""
    report = FOLDER / "REPORT.md"
    committed, inode = report.read_bytes(), report.stat().st_ino
    figures = {p: p.read_bytes() for p in FOLDER.glob("fig_*.png")}
    try:
        done = subprocess.run([sys.executable, "experiments/scene/reproduce.py", "--report-only"], cwd=ROOT,
                              capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        assert report.stat().st_ino != inode and report.read_bytes() == committed
    finally:  # only what came out otherwise is put back
        for p, content in {report: committed, **figures}.items():
            if p.read_bytes() != content:
                p.write_bytes(content)
