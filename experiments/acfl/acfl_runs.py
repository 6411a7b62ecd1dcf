"""The runs of experiments/acfl/reproduce.py: the settings of Sec. V and of the real-data runs, each
seeded scenario's data at given seeds (fig3_data, fig4_data, real_data, learns_data; pipeline_data and
mqtt_data check the pipeline), data/<scenario>.json's reading and writing, and ``extend``: only the seeds
a data file lacks, after rerunning its cheapest committed seed and refusing unless that reproduces the
committed runs."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO))

from testbed.algorithms.acfl import Acfl, AcflSection, bernoulli_answered, trajectory  # noqa: E402
from testbed.data.regression import make_regression  # noqa: E402
from testbed.learning.models import LinearRegression  # noqa: E402
from testbed.reports.seed_plan import first_mismatch  # noqa: E402
from testbed.streams.rng import GLOBAL, Purpose, stream  # noqa: E402

OUT = REPO / "runs" / "acfl-reproduce"
DATA = HERE / "data"
N, M, D, O, LR = 100, 100, 10, 10, 1e-4  # Sec. V
SIGMAS_SQ = (0.1, 1.0, 10.0)  # Fig. 3 (not given by the paper)
EPSILONS = (10.0, 2.0, 0.5, 0.1)  # Fig. 4, nats (not given by the paper)
FIG1 = dict(nodes=5, p=0.1, beta_sq=100.0, model_bound_sq=1.0, dim=100, outputs=10)  # acfl.md §5.1
FIG1_ALPHAS = (0.0, 0.25, 0.5, 1.0)
ADULT_NODES, ADULT_P = 16, 0.2
ADULT_EPSILONS = (10.0, 1.0)  # nats per device (the coded upload's ε-MI-DP, Theorem 1)
CURVE_POINTS = 40  # iterations kept per curve (log-spaced) for the figures
CHANCE = 0.1  # ten digits
SCENARIOS = ("fig3", "fig4", "pipeline", "real", "learns", "mqtt")
#: What a record holds that is measured, not computed: an extension's check ignores it.
MEASURED = frozenset({"wall_s"})
#: The order of a full regeneration's runs: fig3 loops p, then seeds; the others seeds outermost.
RUN_ORDER: dict[str, Callable[[dict], tuple]] = {"fig3": lambda r: (r["p"], r["seed"]),
                                                 "fig4": lambda r: (r["seed"],), "real": lambda r: (r["seed"],),
                                                 "learns": lambda r: (r["seed"],)}


# --- data files ----------------------------------------------------------------------------------

def _rounded(value: Any) -> Any:
    """Floats to 6 significant digits (small files, stable text), recursively."""
    if isinstance(value, float):
        return float(f"{value:.6g}")
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_rounded(v) for v in value]
    if isinstance(value, np.generic):
        return _rounded(value.item())
    return value


def write_data(name: str, record: dict) -> None:
    DATA.mkdir(exist_ok=True)
    (DATA / f"{name}.json").write_text(json.dumps(_rounded(record), indent=1, ensure_ascii=False, allow_nan=False) + "\n")


def read_data(name: str) -> dict | None:
    path = DATA / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def timed(compute: Callable[[], dict]) -> dict:
    """The scenario's record with its measured wall time (recorded, never recomputed)."""
    start = time.monotonic()
    record = compute()
    record["wall_s"] = time.monotonic() - start
    return record


def curve_points(iterations: int) -> list[int]:
    return sorted({int(round(v)) for v in np.geomspace(1, iterations + 1, CURVE_POINTS) - 1})

# --- Figs. 3 and 4 (in memory, Sec. V's synthetic least squares) --------------------------------

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


def summarise(run: dict, at: list[int]) -> dict:
    """A trajectory's final loss (mean of the last 10 iterations), α₁, α_T and its loss at ``at``."""
    return {"final_loss": float(run["loss"][-10:].mean()), "alpha_first": float(run["alpha"][0]),
            "alpha_last": float(run["alpha"][-1]), "curve": [float(run["loss"][t]) for t in at]}


def fig3_data(seeds: Sequence[int], iterations: int) -> dict:
    """ACFL and NA (α = 0.5) at p = 0.2, 0.4 and several σ₁² = σ₂²."""
    at, runs = curve_points(iterations), []
    for p in (0.2, 0.4):
        for seed in seeds:
            setting = Setting(seed, p, iterations)
            for s in SIGMAS_SQ:
                for name, weights in (("ACFL", "adaptive"), ("NA", "fixed")):
                    r = setting.run(sigma1_sq=s, sigma2_sq=s, weights=weights, alpha=0.5)
                    runs.append({"p": p, "sigma_sq": s, "method": name, "seed": seed, **summarise(r, at)})
    return {"seeds": len(seeds), "iterations": iterations, "curve_at": at, "runs": runs}


def fig4_data(seeds: Sequence[int], iterations: int) -> dict:
    """ACFL against SCFL (projection, fixed α = 0.5) at equal ε, p = 0.2."""
    at, runs = curve_points(iterations), []
    for seed in seeds:
        setting = Setting(seed, 0.2, iterations)
        for eps in EPSILONS:
            for name, encoding, weights in (("ACFL", "gram", "adaptive"), ("SCFL", "projection", "fixed")):
                s1, s2 = AcflSection(mi_epsilon=eps, encoding=encoding).noise(D, O)
                r = setting.run(sigma1_sq=s1, sigma2_sq=s2, encoding=encoding, weights=weights, alpha=0.5)
                runs.append({"epsilon": eps, "method": name, "seed": seed, "sigma1_sq": s1, **summarise(r, at)})
    return {"seeds": len(seeds), "iterations": iterations, "curve_at": at, "runs": runs}


# --- full runs ----------------------------------------------------------------------------------

def base_config(iterations: int, **sections) -> "object":
    from testbed.assembly.config import load_config_text, replace

    text = (f'[run]\nname = "acfl"\nalgorithm = "acfl"\n[data]\ndataset = "regression"\nnum_nodes = {N}\n'
            f'samples_per_node = {M}\ndim = {D}\noutputs = {O}\n[model]\nkind = "linear"\nbias = false\n'
            f'[acfl]\niterations = {iterations}\nlr = {LR}\nsigma1_sq = 1.0\nsigma2_sq = 1.0\n'
            '[stragglers]\nmodel = "bernoulli"\np = 0.2\n[privacy]\ntight_accountant = "none"\n'
            '[output]\nfigures = false\n')
    config = load_config_text(text)
    return replace(config, **sections) if sections else config


def pipeline_data(iterations: int) -> dict:
    """max |W| difference between `testbed run` (sim) and the in-memory trajectory, same seed."""
    from testbed.orchestration.runner import run_experiment
    from testbed.reports.results import read_checkpoint

    run_experiment(base_config(iterations), out_dir=OUT / "pipeline", quiet=True)
    w = read_checkpoint(OUT / "pipeline").state["W"]
    mine = Setting(0, 0.2, iterations).run(sigma1_sq=1.0, sigma2_sq=1.0)["W"]
    return {"iterations": iterations, "max_w_diff": float(np.abs(w - mine).max())}


def public_lr(rows: int) -> float:
    """η₀ = 1 / a public bound on λ_max(Σ XᵀX) ≤ Σ‖x‖²: rows in the unit ball (the loader's
    public-bound scaling) plus the bias column give ‖x‖² ≤ 2. No statistic of the data but the row count."""
    return 1.0 / (rows * 2.0)


def majority_share(y: np.ndarray) -> float:
    return float(np.bincount(y).max() / len(y))


REAL_GRID = ((ADULT_EPSILONS[0], "eta0_over_t", "ACFL"),
             *[(eps, "constant", name) for eps in ADULT_EPSILONS for name in ("ACFL", "NA")])


def real_data(seeds: Sequence[int], iterations: int, out: Path | None = None) -> dict:
    """ACFL and NA on Adult-2 (16 i.i.d. devices), one-hot least squares on the raw features,
    p = 0.2, at two ε; the paper's η₀/t once for contrast, else the constant step η₀ = :func:`public_lr`."""
    from testbed.data import load_dataset
    from testbed.orchestration.runner import run_experiment

    runs, lstsq, out = [], [], out or OUT
    for seed in seeds:
        data = load_dataset("adult-2", seed=seed, scaling="public_bound", num_nodes=ADULT_NODES)
        rows = len(data.train.x)
        model = LinearRegression(data.dim, 2, bias=True)  # the exact least squares, central and noiseless
        w = np.linalg.lstsq(model.design(data.train.x), model.targets(data.train.y), rcond=None)[0]
        lstsq.append({"seed": seed, "test_accuracy": float(model.loss_and_correct(w.ravel(), data.test.x,
                                                                                  data.test.y)[1].mean()),
                      "majority": majority_share(data.test.y), "rows": rows})
        for eps, schedule, name in REAL_GRID:
            config = base_config(iterations, run={"seed": seed},
                                 data={"dataset": "adult-2", "num_nodes": ADULT_NODES, "scaling": "public_bound"},
                                 model={"kind": "linear", "bias": True},
                                 stragglers={"model": "bernoulli", "p": ADULT_P},
                                 acfl={"weights": "adaptive" if name == "ACFL" else "fixed", "lr": public_lr(rows),
                                       "lr_schedule": schedule, "sigma1_sq": None, "sigma2_sq": None,
                                       "mi_epsilon": eps})
            s = run_experiment(config, out_dir=out / f"adult-{seed}-{eps:g}-{schedule}-{name}", quiet=True).summary
            runs.append({"seed": seed, "epsilon": eps, "schedule": schedule, "method": name,
                         "sigma_sq": s["plan"]["sigma1_sq"], "features": s["plan"]["features"],
                         "test_accuracy": s["final"]["test_accuracy"], "train_loss": s["final"]["train_loss"]})
    return {"seeds": len(seeds), "iterations": iterations, "lstsq": lstsq, "runs": runs}


def learns_data(seeds: Sequence[int], out: Path | None = None) -> dict:
    """``learns.toml`` (ACFL) and its NA twin (fixed α = 0.5) for each seed, full `testbed run` (sim):
    final test accuracy (argmax of the 10 outputs), the test split's majority share, the ledger's
    MI-DP per device, each run's wall time."""
    from testbed.assembly.config import load_config, replace
    from testbed.data import load_dataset
    from testbed.orchestration.runner import run_experiment

    base = load_config(HERE / "learns.toml")
    runs, out = [], out or OUT
    for seed in seeds:
        test_y = load_dataset("mnist-5k", seed=seed, scaling="public_bound", num_nodes=base.data.num_nodes,
                              samples_per_node=base.data.samples_per_node).test.y
        for name, weights in (("ACFL", "adaptive"), ("NA", "fixed")):
            start = time.monotonic()
            config = replace(base, run={"seed": seed}, acfl={"weights": weights})
            s = run_experiment(config, out_dir=out / f"learns-{seed}-{name}", quiet=True).summary
            runs.append({"seed": seed, "method": name, "test_accuracy": s["final"]["test_accuracy"],
                         "test_accuracy_pooled": s["final"]["test_accuracy_pooled"],
                         "majority": majority_share(test_y), "test_rows": len(test_y),
                         "ledger_mi_epsilon_nats": max(n["mi_epsilon_nats"] for n in s["nodes"].values()),
                         "sigma_sq": s["plan"]["sigma1_sq"], "features": s["plan"]["features"],
                         "curve": [[r, a] for r, a in learning_curve(out / f"learns-{seed}-{name}")],
                         "wall_s": time.monotonic() - start})
    return {"seeds": len(seeds), "iterations": base.acfl.iterations, "nodes": base.data.num_nodes,
            "samples_per_node": base.data.samples_per_node, "random_features": base.model.random_features,
            "rf_gamma": base.model.rf_gamma, "lr": base.acfl.lr, "mi_epsilon": base.acfl.mi_epsilon,
            "straggler_p": base.stragglers.p, "runs": runs}


def learning_curve(run_dir: Path) -> list[tuple[int, float]]:
    """(round, test accuracy) of every evaluated round of a run (its metrics.csv)."""
    import csv

    with open(run_dir / "metrics.csv") as f:
        return [(int(r["round"]), float(r["test_accuracy"])) for r in csv.DictReader(f) if r["test_accuracy"]]


def mqtt_data(iterations: int) -> dict:
    """20 emulated boards over MQTT (embedded broker, 2 host processes) with Bernoulli(0.2)
    stragglers, against sim: the same W and ledger."""
    from testbed.orchestration.runner import run_experiment
    from testbed.reports.results import read_checkpoint

    config = base_config(iterations, data={"num_nodes": 20})
    run_experiment(config, out_dir=OUT / "mqtt-sim", quiet=True)
    start = time.monotonic()
    s = run_experiment(base_config(iterations, data={"num_nodes": 20}, run={"mode": "mqtt"}, mqtt={"hosts": 2}),
                       out_dir=OUT / "mqtt", quiet=True).summary
    wall = time.monotonic() - start
    diff = float(np.abs(read_checkpoint(OUT / "mqtt").state["W"] - read_checkpoint(OUT / "mqtt-sim").state["W"]).max())
    return {"iterations": s["rounds"], "status": s["status"], "rounds_straggled": s["stragglers"]["rounds_straggled"],
            "max_w_diff": diff, "mqtt_wall_s": wall,
            "ledger_mi_epsilon_nats": sorted({n["mi_epsilon_nats"] for n in s["nodes"].values()})}


def extend(name: str, seeds: int, compute: Callable[[Sequence[int], Path | None], dict]) -> dict | None:
    """data/<name>.json with only its missing seeds added (``seeds`` in all), or None when none is
    missing. First reruns the committed seed whose runs were cheapest (all seeds alike where runs carry
    no time) into a scratch folder: SystemExit (one line) unless its runs equal the committed ones
    (measured times aside), so the extended file is what a full regeneration would give."""
    import tempfile

    committed = read_data(name)
    if committed is None:
        raise SystemExit(f"{name}: nothing to extend: data/{name}.json does not exist (run it without --extend)")
    have = committed["seeds"]
    if seeds <= have:
        print(f"{name}: {have} seeds committed, {seeds} asked: nothing to run", flush=True)
        return None
    cost: dict[int, float] = {}
    for r in committed["runs"]:
        cost[r["seed"]] = cost.get(r["seed"], 0.0) + r.get("wall_s", 0.0)
    if sorted(cost) != list(range(have)):
        raise SystemExit(f"{name}: refusing to extend: its seeds {sorted(cost)} are not 0, 1, ..., {have - 1}")
    cheapest = min(cost, key=lambda k: (cost[k], k))
    with tempfile.TemporaryDirectory() as scratch:
        rerun = compute([cheapest], Path(scratch))

    def of_seed(record: dict, seed: int) -> dict:
        return {k: ([r for r in v if r["seed"] == seed] if k in ("runs", "lstsq") else v)
                for k, v in record.items() if k not in ("seeds", "wall_s")}

    found = first_mismatch(of_seed(committed, cheapest), _rounded(of_seed(rerun, cheapest)), MEASURED)
    if found:
        raise SystemExit(f"{name}: refusing to extend: seed {cheapest} does not reproduce the committed data ({found})")
    print(f"{name}: seed {cheapest} reproduces the committed data", flush=True)
    added = compute(range(have, seeds), None)
    merged = {**committed, "seeds": seeds, "wall_s": committed["wall_s"] + added["wall_s"]}
    merged["runs"] = sorted(committed["runs"] + added["runs"], key=RUN_ORDER[name])  # stable: within a seed as run
    if "lstsq" in committed:
        merged["lstsq"] = sorted(committed["lstsq"] + added["lstsq"], key=lambda r: r["seed"])
    return merged
