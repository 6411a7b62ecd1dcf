"""Parameter sweeps: many runs of one experiment, in parallel on local processes or on a Ray cluster.

A sweep is a list of points, each a set of config values plus a seed (``run.seed``); a grid sweep is
the cartesian product of ``--grid`` values, repeated with seeds base, base+1, ... Every point runs
:func:`testbed.orchestration.runner.run_experiment` in a worker (figures off, quiet) into its own folder of the
sweep's folder, named from its values. ``sweep.csv`` joins the runs' summaries, one row per point;
``sweep_stats.csv`` summarises each grid point's repeats (mean, sd, intervals: testbed.reports.sweep_stats).

Restart: a point whose folder holds a summary.json with status ``completed`` or ``stopped_budget``
is finished and is skipped; a folder left half-written by a kill (no summary, or ``failed``) is
cleared and run again. One sweep writes a sweep folder at a time (its lock, testbed.util.dirlock), and
each point's run holds its own folder's.

Example::

    >>> [p.name for p in grid_points({"dp_pasgd.tau": [1, 5]}, repeats=1, base_seed=0)]
    ['tau-1_seed-0', 'tau-5_seed-0']
"""

from __future__ import annotations

import csv
import itertools
import math
import os
import re
import shutil
from collections.abc import Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed.assembly.config import Config, load_config_text, parse_override, replace, to_toml
from testbed.assembly.resources import check_count, estimate_bytes
from testbed.checked.limits import MAX_SEED
from testbed.errors import UserError
from testbed.orchestration.runner import run_experiment  # imported here so forked workers share the parent's modules
from testbed.reports import tracking
from testbed.reports.results import FINISHED, read_summary
from testbed.reports.sweep_stats import STATS_FILE, stats_rows
from testbed.util import parallel
from testbed.util.dirlock import DirectoryLock
from testbed.util.extras import install_hint

ENGINES = ("local", "ray")
#: sweep.csv columns after the point's own values.
COLUMNS = ("seed", "status", "stopped_by", "test_accuracy", "validation_accuracy", "train_loss", "epsilon_max",
           "cost_max", "energy_j_max", "rounds", "tau", "steps", "sigma", "run")


@dataclass(frozen=True)
class Point:
    """One run of a sweep: config values ((section.key, value) pairs) and its seed."""

    values: tuple[tuple[str, Any], ...]
    seed: int

    @property
    def name(self) -> str:
        """Folder name from the values: ``key-value`` pairs (the key without its section when that is
        unambiguous) and the seed, e.g. ``tau-5_epsilon-2.0_seed-0``."""
        keys = [k for k, _ in self.values]
        shorts = [k.split(".")[-1] for k in keys]
        parts = [f"{s if shorts.count(s) == 1 else k}-{v}" for k, s, (_, v) in zip(keys, shorts, self.values)]
        return re.sub(r"[^A-Za-z0-9._=-]", "-", "_".join(parts + [f"seed-{self.seed}"]))


def parse_grid(items: Sequence[str]) -> dict[str, list[Any]]:
    """``["dp_pasgd.tau=1,5,10", ...]`` → {"dp_pasgd.tau": [1, 5, 10]}; each value read as TOML
    (else as a string, so ``data.dataset=adult-1,adult-2`` works)."""
    grid: dict[str, list[Any]] = {}
    for item in items:
        if "=" not in item:
            raise UserError(f"--grid {item!r}: expected section.key=v1,v2,...")
        key, values = item.split("=", 1)
        parsed = [parse_override(f"{key.strip()}={v}")[1] for v in values.split(",") if v.strip()]
        if not parsed:
            raise UserError(f"--grid {key.strip()}: no values")
        if key.strip() in grid:
            raise UserError(f"--grid {key.strip()}: given twice")
        grid[key.strip()] = parsed
    return grid


def grid_points(grid: dict[str, list[Any]], repeats: int, base_seed: int) -> list[Point]:
    """The cartesian product of ``grid``, each point repeated with seeds base_seed .. base_seed+repeats−1."""
    if repeats < 1:
        raise UserError(f"--repeats must be >= 1, got {repeats}")
    if "run.seed" in grid:
        raise UserError("--grid run.seed: seeds are set by --repeats (run.seed of the file is the first)")
    keys = list(grid)
    return [Point(tuple(zip(keys, combo)), base_seed + r)
            for combo in itertools.product(*(grid[k] for k in keys)) for r in range(repeats)]


#: Bytes a sweep holds per run before any starts (its point, its config's TOML, its table row).
POINT_BYTES = 16 * 1024
#: Bytes a parallel run's process holds besides its run's own estimate (interpreter, numpy, pydantic).
WORKER_BYTES = 150 * 2**20
#: How a refusal names the sweep's sizes: the Python API's keywords (the CLI passes its options).
KEYWORDS = {"grid": "grid", "repeats": "repeats", "workers": "workers"}


def planned_points(base: Config, grid: dict[str, list[Any]], repeats: int, workers: int | None = None,
                   names: dict[str, str] = KEYWORDS) -> list[Point]:
    """:func:`grid_points` of ``grid``, once the sweep is known to fit: its seeds within MAX_SEED,
    its points and its ``workers`` parallel runs within this machine's memory (checked before any
    point is made). ``names``: what the refusals call the grid, the repeats and the workers."""
    if repeats < 1:
        raise UserError(f"{names['repeats']} must be >= 1, got {repeats}")
    if base.run.seed + repeats - 1 > MAX_SEED:
        raise UserError(f"{names['repeats']} {repeats}: seeds from run.seed {base.run.seed} would pass {MAX_SEED}")
    runs = math.prod(len(values) for values in grid.values()) * repeats
    check_count(runs, POINT_BYTES, f"{names['grid']} and {names['repeats']}: a sweep of")
    if workers is not None:
        check_count(min(workers, runs), WORKER_BYTES + sum(estimate_bytes(base).values()), names["workers"])
    return grid_points(grid, repeats, base.run.seed)


def default_sweep_dir(base: Config) -> Path:
    """Where a sweep of ``base`` goes unless told: output.dir/NAME-sweep (a sweep run again into
    it skips its finished runs)."""
    return Path(base.output.dir) / f"{base.run.name}-sweep"


def point_config(base: Config, point: Point) -> Config:
    """``base`` with the point's values and seed, figures off (a sweep draws its own)."""
    sections: dict[str, dict[str, Any]] = {"run": {"seed": point.seed}, "output": {"figures": False}}
    for key, value in point.values:
        section, _, name = key.partition(".")
        sections.setdefault(section, {})[name] = value
    unknown = [s for s in sections if not hasattr(base, s)]
    if unknown:
        raise UserError(f"sweep: unknown section {unknown[0]!r} in a grid key")
    return replace(base, **sections)


def is_finished(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a finished run (summary.json with a finished status)."""
    try:  # checked: a summary without a valid sha256 is no finished run, whatever status it names
        return read_summary(run_dir)["status"] in FINISHED
    except UserError:
        return False


def run_point(config_toml: str, run_dir: str, environment: dict[str, str] | None = None,
              cores: int = 0) -> dict[str, Any]:
    """Worker: run one point (its resolved config as TOML) into ``run_dir``, with ``environment``
    (tracking.worker_environment) set in this worker process and ``cores`` its share of the
    machine (testbed.util.parallel.cores; 0: all of it); returns the summary.

    A folder that exists but is not finished was left by a kill: it is cleared first, under its
    lock (a run resumed in it by hand is not cleared under it: the point is refused instead).
    """
    os.environ.update(environment or {})
    path = Path(run_dir)
    if path.exists():
        with DirectoryLock(path):
            shutil.rmtree(path)
    with parallel.cores(cores):
        return run_experiment(load_config_text(config_toml, source=run_dir), out_dir=path, quiet=True).summary


def run_sweep(base: Config, points: Sequence[Point], out_dir: Path, engine: str = "local",
              workers: int | None = None, quiet: bool = False) -> list[dict[str, Any]]:
    """Run every point not yet finished in ``out_dir``; write and return the rows of sweep.csv.

    Args:
        base: the experiment every point starts from.
        points: the runs; their names must differ.
        out_dir: the sweep's folder (created; may hold a previous, interrupted sweep).
        engine: "local" (ProcessPoolExecutor) or "ray" (the Ray cluster of ``ray.init()``:
            $RAY_ADDRESS, an already initialised one, or a new local instance).
        workers: parallel runs (default: the CPU count for local; all of the cluster for ray).
        quiet: no line per finished run.

    Returns:
        One row per point, in the order of ``points`` (see COLUMNS).
    """
    if engine not in ENGINES:
        raise UserError(f"--engine must be one of {', '.join(ENGINES)}, got {engine!r}")
    names = [p.name for p in points]
    if len(set(names)) != len(names):
        raise UserError("sweep: two points have the same folder name; make the grid values distinct")
    tracking.check_installed(base)  # once, not in every worker
    out_dir = Path(out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot write the sweep folder {out_dir}: {exc.strerror or exc}") from None
    with DirectoryLock(out_dir, "sweep folder"):  # a second sweep into it would clear this one's runs
        return _run_points(base, points, out_dir, engine, workers, quiet)


def _run_points(base: Config, points: Sequence[Point], out_dir: Path, engine: str, workers: int | None,
                quiet: bool) -> list[dict[str, Any]]:
    (out_dir / "base.toml").write_text(to_toml(base))
    configs = {p.name: to_toml(point_config(base, p)) for p in points}  # validates every point first
    todo = [p for p in points if not is_finished(out_dir / p.name)]
    log = (lambda line: None) if quiet else print
    log(f"sweep {out_dir}: {len(points)} runs, {len(points) - len(todo)} already finished, {len(todo)} to run ({engine})")
    jobs = [(p.name, configs[p.name], str(out_dir / p.name)) for p in todo]
    environment = tracking.worker_environment(base)
    for done, (name, summary) in enumerate(_execute(jobs, engine, workers, environment), start=1):
        log(f"[{done}/{len(jobs)}] {name}: {finished_line(summary)}")
    rows = [row(p, read_summary(out_dir / p.name)) for p in points]
    write_table(rows, out_dir / "sweep.csv")
    write_table(stats_rows(rows, list(dict.fromkeys(k for p in points for k, _ in p.values))), out_dir / STATS_FILE)
    return rows


def finished_line(summary: dict[str, Any]) -> str:
    """What a sweep says of a run it saw finish: status, score and the run's own seconds (its
    set-up and rounds, summary ``setup_s`` + ``wall_s``; not the sweep's clock, which counts the
    runs before it and beside it).

    Example::

        >>> finished_line({"status": "completed", "final": {"test_accuracy": 0.8125}, "setup_s": 1.25, "wall_s": 2.0})
        'completed, test acc 0.8125 (3.2 s: set-up 1.2 s, rounds 2.0 s)'
    """
    final = summary["final"]
    score = (f"test acc {final['test_accuracy']:.4f}" if final.get("test_accuracy") is not None
             else f"test loss {final['test_loss']:.4g}" if final.get("test_loss") is not None else "not evaluated")
    setup_s, rounds_s = summary.get("setup_s") or 0.0, summary["wall_s"]
    return f"{summary['status']}, {score} ({setup_s + rounds_s:.1f} s: set-up {setup_s:.1f} s, rounds {rounds_s:.1f} s)"


def _execute(jobs: list[tuple[str, str, str]], engine: str, workers: int | None,
             environment: dict[str, str]) -> Iterator[tuple[str, dict]]:
    """Yield (name, summary) of every job as it finishes, each run with ``environment`` set."""
    if not jobs:
        return
    if engine == "ray":
        yield from _execute_ray(jobs, workers, environment)
        return
    at_once = min(workers or os.cpu_count() or 1, len(jobs))
    # Each job's share of the cores: its threads and node workers, where its experiment says one per core.
    cores = max(1, (os.cpu_count() or 1) // at_once)
    with ProcessPoolExecutor(max_workers=at_once) as pool:
        futures = {pool.submit(run_point, text, run_dir, environment, cores): name for name, text, run_dir in jobs}
        pending = set(futures)
        while pending:
            finished, pending = wait(pending, return_when=FIRST_COMPLETED)
            for future in finished:
                yield futures[future], future.result()


def _execute_ray(jobs: list[tuple[str, str, str]], workers: int | None,
                 environment: dict[str, str]) -> Iterator[tuple[str, dict]]:
    try:
        import ray
    except ImportError:
        raise UserError(f"--engine ray needs Ray: {install_hint('ray')}") from None
    if not ray.is_initialized():
        ray.init(address=os.environ.get("RAY_ADDRESS"), include_dashboard=False, log_to_driver=False)
    remote = ray.remote(num_cpus=1)(run_point)
    limit = workers or len(jobs)  # Ray queues what the cluster cannot run yet; workers caps what is in flight
    queue, in_flight = list(jobs), {}
    while queue or in_flight:
        while queue and len(in_flight) < limit:
            name, text, run_dir = queue.pop(0)
            in_flight[remote.remote(text, run_dir, environment, 1)] = name  # cores: the one CPU Ray counts it
        ready, _ = ray.wait(list(in_flight), num_returns=1)
        for ref in ready:
            yield in_flight.pop(ref), ray.get(ref)


def row(point: Point, summary: dict[str, Any]) -> dict[str, Any]:
    """One sweep.csv row: the point's values, then COLUMNS from its run's summary."""
    nodes = summary["nodes"].values()
    settings = summary.get("algorithm_settings", {})
    stopped = summary.get("stopped")
    eps = [n["epsilon"] for n in nodes if n["epsilon"] is not None]
    return {
        **dict(point.values),
        "seed": point.seed, "status": summary["status"],
        "stopped_by": stopped["budget"] if stopped else "",  # which budget stopped the run; empty: none did
        "test_accuracy": summary["final"]["test_accuracy"],
        "validation_accuracy": summary["final"].get("validation_accuracy"),
        "train_loss": summary["final"]["train_loss"],
        # Not (ε, δ)-DP (no noise; or ε-MI-DP): ε is infinite, an empty cell, never a finite number.
        "epsilon_max": max(eps) if eps and len(eps) == len(nodes) else None,
        "cost_max": max(n["cost_units"] for n in nodes),
        "energy_j_max": max(n["energy_j"] for n in nodes),
        "rounds": summary["rounds"], "tau": settings.get("tau"), "steps": settings.get("steps_planned"),
        "sigma": settings.get("sigma"), "run": point.name,
    }


def write_table(rows: list[dict[str, Any]], path: Path) -> None:
    """Write ``rows`` as CSV (columns: the union of the rows' keys, in first-seen order)."""
    columns = list(dict.fromkeys(k for r in rows for k in r))
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, columns)
        writer.writeheader()
        writer.writerows(rows)


def format_table(rows: list[dict[str, Any]]) -> str:
    """``rows`` as an aligned text table (numbers to 4 significant digits)."""
    if not rows:
        return "(no runs)"
    keys = list(dict.fromkeys(k for r in rows for k in r if k != "run"))
    cells = [[_cell(r.get(k)) for k in keys] for r in rows]
    widths = [max(len(k), *(len(c[i]) for c in cells)) for i, k in enumerate(keys)]
    lines = ["  ".join(k.ljust(w) for k, w in zip(keys, widths))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(cr, widths)) for cr in cells]
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)
