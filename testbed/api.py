"""The Python API: run an experiment, read a run back, sweep a grid, audit a run's privacy; results as
pandas tables.

``testbed.run``, ``testbed.load``, ``testbed.sweep``, ``testbed.audit``, ``testbed.compare``, ``testbed.Run`` and ``testbed.Sweep`` are
this module's, reached lazily (``import testbed`` alone imports none of it: a board's node does
not need it). The command line builds its experiments with the same function
(testbed.assembly.experiment.experiment_config) and sizes its sweeps with the same checks
(testbed.orchestration.sweep.planned_points), so a file, its overrides and a grid mean the same in
both. The guide, with examples that the tests run, is docs/api.md.

pandas is an optional extra (``pip install 'dpfl-testbed[analysis]'``): only :attr:`Run.metrics`,
:attr:`Run.ledger`, :attr:`Sweep.table` and :attr:`Sweep.stats` need it, and say so in one line
without it.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from testbed.assembly.config import Config, override_key
from testbed.assembly.experiment import Experiment, Overrides, experiment_config
from testbed.checked import inputs
from testbed.errors import UserError
from testbed.ledger.events import EVENT_TYPES
from testbed.ledger.files import LEDGER_COLUMNS, read_ledger
from testbed.orchestration.runner import default_run_dir, run_experiment
from testbed.orchestration.sweep import default_sweep_dir, planned_points, run_sweep
from testbed.reports import headline
from testbed.reports.compare import DEFAULT_METRIC, Comparison, compare as compare_sweep
from testbed.reports.majority import accuracy_flag, run_majority_share
from testbed.reports.results import INTEGER_METRICS, METRIC_COLUMNS, holds_run, read_metrics, read_summary
from testbed.reports.stats import CONFIDENCE
from testbed.reports.sweep_stats import read_stats, read_sweep, value
from testbed.util.dirlock import LOCK_NAME, DirectoryLock
from testbed.util.extras import missing_package_message

if TYPE_CHECKING:
    import pandas

    from testbed.orchestration.audit import AuditReport

def run(experiment: Experiment, *, overrides: Overrides = None, mode: str | None = None, seed: int | None = None,
        out: str | os.PathLike | None = None, overwrite: bool = False, quiet: bool = True) -> "Run":
    """Run an experiment to its end (or the first budget a node would break) and read it back.

    Args:
        experiment: a TOML file's path, a dict of its tables, or a config.
        overrides: keys to change, {"dp_pasgd.tau": 5} (or ["dp_pasgd.tau=5"], as ``--set``).
        mode: "sim" or "mqtt" (run.mode); default: the experiment's.
        seed: the run's seed (run.seed); default: the experiment's.
        out: the run directory; default: output.dir/NAME-TIME-sSEED, a new one.
        overwrite: replace the run ``out`` holds (finished, failed or killed; a run still writing
            it is refused, naming its pid). Without it, an ``out`` holding a run is refused.
        quiet: no progress bar.

    Returns:
        The finished run (:class:`Run`).

    Raises:
        UserError: one line (a config error naming its key, an ``out`` that holds a run, ...).
    """
    config = experiment_config(experiment, overrides, mode=mode, seed=seed)
    run_dir = _fresh_run_dir(config, out, overwrite)
    return Run(run_experiment(config, out_dir=run_dir, quiet=quiet).run_dir)


def _fresh_run_dir(config: Config, out: str | os.PathLike | None, overwrite: bool) -> Path:
    """The directory the run writes, checked writable and holding no run (``overwrite``: emptied)."""
    if out is None:
        inputs.output_dir(Path(config.output.dir), "output.dir")
        return default_run_dir(config)  # named to the microsecond: a new directory
    run_dir = inputs.output_dir(Path(out), "out")
    if holds_run(run_dir):
        if not overwrite:
            raise UserError(f"{run_dir} already holds a run; pass overwrite=True to replace it, or another out")
        with DirectoryLock(run_dir):  # a run still writing it is refused here, naming its pid
            _empty(run_dir)
    return run_dir


def _empty(directory: Path) -> None:
    """Remove what ``directory`` holds but its lock file (held by the caller)."""
    try:
        for entry in directory.iterdir():
            if entry.name == LOCK_NAME:
                continue
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()
    except OSError as exc:
        raise UserError(f"overwrite: cannot empty {directory}: {exc.strerror or exc}") from None


def audit(experiment: Experiment, *, canaries: int | None = None, confidence: float = 0.95, runs: int = 1,
          overrides: Overrides = None, seed: int | None = None, out: str | os.PathLike | None = None,
          overwrite: bool = False) -> "AuditReport":
    """`testbed audit` from Python: run the experiment in sim with canary gradients and bound its ε
    from below (docs/privacy.md, "Empirical audit").

    Args:
        experiment: as :func:`run`.
        overrides: as :func:`run`.
        seed: as :func:`run` (the mode is always sim).
        canaries: canaries per run (default 1000 for one run, one per node for several).
        confidence: the bound's level.
        runs: 1: the one-run bound (Steinke et al. 2023); more: the membership test over that many runs.
        out: keep the audited run(s) in this directory (default: a temporary one, removed);
            ``overwrite`` as :func:`run`.

    Returns:
        The report: ``result.epsilon`` (the lower bound), ``claimed`` (the ledger's ε per
        accountant), ``verdict``, ``lines()`` (what the command prints).

    Raises:
        UserError: one line (as the command).
    """
    import tempfile

    from testbed.orchestration.audit import audit_run

    config = experiment_config(experiment, overrides, mode="sim", seed=seed)
    if not 0.0 < confidence < 1.0 or canaries is not None and canaries < 1 or runs < 1:
        raise UserError(f"audit: need 0 < confidence < 1, canaries >= 1 and runs >= 1, got {confidence}, {canaries}, {runs}")
    if out is not None:
        return audit_run(config, _fresh_run_dir(config, out, overwrite), canaries=canaries, confidence=confidence,
                         runs=runs)
    with tempfile.TemporaryDirectory(prefix="testbed-audit-") as tmp:
        return audit_run(config, Path(tmp) / "run", canaries=canaries, confidence=confidence, runs=runs)


def load(run_dir: str | os.PathLike) -> "Run":
    """A run directory read back (one a run or ``testbed run`` wrote), its summary checked.

    Raises:
        UserError: one line: no summary.json (not a run, or one killed before it ended), or a
            damaged one.
    """
    return Run(run_dir)


class Run:
    """A finished run's directory, read as Python values.

    Attributes:
        dir: the run directory (config.toml, metrics.csv, ledger.csv, summary.json, figures/).
        summary: summary.json as a dict (checked against its sha256); its ``privacy_guarantees``
            say, per observer, the ε and whether the noise is secret from that observer, and each
            node's ``randomness`` which key its private draws came from ("node_secret", "run_seed").
    """

    def __init__(self, run_dir: str | os.PathLike):
        self.dir = Path(run_dir)
        self.summary: dict[str, Any] = read_summary(self.dir)

    def __repr__(self) -> str:
        return f"Run({str(self.dir)!r}: {self.summary['algorithm']}, {self.summary['status']}, " \
               f"{self.summary['rounds']} rounds)"

    @cached_property
    def majority_share(self) -> float | None:
        """The test accuracy of always answering the training split's most common class, averaged over
        the nodes (testbed.reports.majority; recomputed from config.toml, summary.json does not hold
        it); None for a regression."""
        if self.summary.get("task") == "regression":
            return None
        return run_majority_share(self.dir)

    @property
    def accuracy_against_majority(self) -> str:
        """The final test accuracy against :attr:`majority_share`: "at or below the majority share" (the
        model shows no learning) or "above the majority share (one run: no interval)"; "" for a
        regression."""
        accuracy = self.summary.get("final", {}).get("test_accuracy")
        return "" if accuracy is None else accuracy_flag(float(accuracy), self.majority_share)

    @property
    def quote(self) -> dict[str, Any]:
        """The run's one privacy figure to quote, summary.json's ``privacy.headline``: {measure, value,
        unit, by (the accountant), observer, secrecy}; ``value`` None for a run without noise (ε = ∞),
        nats for ε-MI-DP. The terminal's table, ``testbed runs``, the watch page, the report and the
        trackers show this figure (testbed.reports.headline.quote)."""
        return headline.quote(self.summary)

    @property
    def privacy_guarantees(self) -> list[dict[str, Any]]:
        """Per observer of the run's privacy figures: {observer, epsilon, delta, accountant,
        randomness (node ids per kind), statement}, e.g. statement "holds (noise from node
        secrets)" or "reproducible run: noise derivable from the run seed, so not private against
        anyone holding it" (testbed.privacy.secrecy); [] for a run without privacy figures or a
        summary written before they were recorded."""
        return headline.guarantees(self.summary)

    @property
    def assumptions(self) -> list[str]:
        """What the run's ε rests on beyond the mechanism it ran, one sentence each (a paper's
        reproduction's assumption, DWFL's fixed x_j^(t−1/2), ...: docs/privacy.md); [] when
        nothing, or for a summary written before they were recorded."""
        return list(self.summary.get("assumptions") or [])

    @cached_property
    def metrics(self) -> "pandas.DataFrame":
        """metrics.csv: one row per round, with integer rounds, steps, bytes and stragglers (a
        round not evaluated, output.eval_every, has NaN in its accuracy and loss)."""
        pd = _pandas("Run.metrics")
        frame = pd.DataFrame(read_metrics(self.dir), columns=METRIC_COLUMNS)
        return frame.astype({c: "int64" for c in INTEGER_METRICS} | {c: "float64" for c in METRIC_COLUMNS
                                                                      if c not in INTEGER_METRICS})

    @cached_property
    def ledger(self) -> "pandas.DataFrame":
        """ledger.csv, each row checked: one row per event (``kind``, ``node``, ``round`` and every
        kind's fields; a field another kind has is missing: pandas' NA, or NaN for a float)."""
        pd = _pandas("Run.ledger")
        path = self.dir / "ledger.csv"
        try:
            columns: dict[str, list] = {c: [] for c in LEDGER_COLUMNS}
            for event in read_ledger(path):
                for name, column in columns.items():
                    column.append(event.kind if name == "kind" else getattr(event, name, None))
        except (OSError, ValueError) as exc:
            raise UserError(f"{path}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None
        return pd.DataFrame(columns).astype(_LEDGER_DTYPES)


#: pandas' type of each ledger column: integers that every row has as int64, the others nullable.
_FIELD_TYPES = {f.name: f.type for cls in EVENT_TYPES.values() for f in dataclasses.fields(cls)}
_LEDGER_DTYPES = {"kind": "object", **{
    name: "int64" if name in ("node", "round") else {"int": "Int64", "float": "float64", "bool": "boolean",
                                                     "str": "object"}[getattr(_FIELD_TYPES[name], "__name__", _FIELD_TYPES[name])]
    for name in LEDGER_COLUMNS[1:]}}


def sweep(experiment: Experiment, grid: Mapping[str, Sequence[Any]], *, repeats: int = 1,
          out: str | os.PathLike | None = None, overrides: Overrides = None, engine: str = "local",
          workers: int | None = None, quiet: bool = True) -> "Sweep":
    """Run an experiment over the cartesian product of ``grid``, each point ``repeats`` times
    (seeds run.seed, run.seed + 1, ...), in parallel, into one folder (as ``testbed sweep``).

    Args:
        experiment: a TOML file's path, a dict of its tables, or a config.
        grid: {"section.key": [values], ...}, e.g. {"dp_pasgd.tau": [1, 5], "dp_pasgd.lr": [0.1, 0.5]}.
        repeats: runs per grid point.
        out: the sweep's folder; default: output.dir/NAME-sweep. A sweep run again into a folder
            skips its finished runs and reruns the ones a kill left half-written.
        overrides: keys to change for every run (as :func:`run`'s).
        engine: "local" (processes) or "ray" (``$RAY_ADDRESS``, else a local Ray).
        workers: parallel runs (default: the CPU count; ray: the whole cluster).
        quiet: no line per finished run.

    Returns:
        The finished sweep (:class:`Sweep`).
    """
    base = experiment_config(experiment, overrides)
    points = planned_points(base, _checked_grid(grid), repeats, workers)
    folder = Path(out) if out is not None else default_sweep_dir(base)
    run_sweep(base, points, folder, engine=engine, workers=workers, quiet=quiet)
    return Sweep(folder)


def _checked_grid(grid: Mapping[str, Sequence[Any]]) -> dict[str, list[Any]]:
    if not isinstance(grid, Mapping) or not grid:
        raise UserError('grid: a dict {"section.key": [value, ...], ...} of at least one key')
    checked = {}
    for key, values in grid.items():
        override_key(key)
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
            raise UserError(f"grid {key}: a non-empty list of values, got {values!r:.80}")
        checked[key] = list(values)
    return checked


class Sweep:
    """A sweep's folder, read as tables (``testbed.Sweep(folder)`` reads one a sweep wrote).

    Attributes:
        dir: the folder (sweep.csv, sweep_stats.csv, base.toml, a run directory per run).
    """

    def __init__(self, folder: str | os.PathLike):
        self.dir = Path(folder)
        self._rows: list[dict[str, str]] = read_sweep(self.dir)  # checked: the header and every row

    def __repr__(self) -> str:
        return f"Sweep({str(self.dir)!r}: {len(self._rows)} runs)"

    @cached_property
    def table(self) -> "pandas.DataFrame":
        """sweep.csv: one row per run, the grid's keys, then its seed, status and final figures
        (integers as integers; an empty cell is missing)."""
        return _frame(self._rows, "Sweep.table")

    @cached_property
    def stats(self) -> "pandas.DataFrame | None":
        """sweep_stats.csv: one row per grid point, ``n`` and each figure's mean, sd and 95 %
        intervals (docs/statistics.md); None when no point has more than one run."""
        rows = read_stats(self.dir)
        return _frame(rows, "Sweep.stats") if any(int(r["n"]) > 1 for r in rows) else None

    def run(self, name: str) -> Run:
        """One run of the sweep, by its name (the table's ``run`` column)."""
        if name not in {r["run"] for r in self._rows}:
            raise UserError(f"{self.dir}: no run {name!r} in sweep.csv")
        return Run(self.dir / name)

    def compare(self, a: Mapping[str, Any], b: Mapping[str, Any] | Sequence[Mapping[str, Any]], *,
                metrics: Sequence[str] = (DEFAULT_METRIC,), higher_is_better: bool | None = None,
                confidence: float = CONFIDENCE) -> list[Comparison]:
        """Paired comparison of grid point ``a`` with each of ``b`` (runs paired by seed, Holm-
        corrected over every b and metric): :func:`compare` on this sweep."""
        return compare(self, a, b, metrics=metrics, higher_is_better=higher_is_better, confidence=confidence)


def compare(sweep: "Sweep | str | os.PathLike", a: Mapping[str, Any],
            b: Mapping[str, Any] | Sequence[Mapping[str, Any]], *, metrics: Sequence[str] = (DEFAULT_METRIC,),
            higher_is_better: bool | None = None, confidence: float = CONFIDENCE) -> list[Comparison]:
    """`testbed compare` from Python, the same engine (testbed.reports.compare.compare).

    Args:
        sweep: a :class:`Sweep` or its folder.
        a: grid key → value (``{"dp_pasgd.tau": 2}``; a key's last part will do when unambiguous).
        b: one such setting or a list of them, each compared with ``a``.
        metrics: numeric columns of the sweep's table (default test_accuracy).
        higher_is_better: for every metric; None: each metric's own direction.
        confidence: of the intervals (the tests' α is 1 − confidence).

    Returns:
        One :class:`~testbed.reports.compare.Comparison` per (b, metric): the seeds paired, the paired
        statistics of a − b (``result``), Holm-corrected p-values and the ``verdict``;
        ``as_dict()`` is what ``testbed compare --json`` prints.
    """
    folder = sweep.dir if isinstance(sweep, Sweep) else Path(sweep)
    return compare_sweep(folder, a, b, metrics=list(metrics), higher_is_better=higher_is_better,
                         confidence=confidence)


def _frame(rows: list[dict[str, str]], what: str) -> "pandas.DataFrame":
    """A table's rows (CSV text) as a DataFrame: each cell the value it stands for (testbed.
    reports.sweep_stats.value), an empty one missing; the status and run names as text."""
    pd = _pandas(what)
    frame = pd.DataFrame([{k: v if k in _TEXT_COLUMNS else (None if v == "" else value(v)) for k, v in r.items()}
                          for r in rows])
    for column in frame.columns:  # numbers with missing cells (or none at all): floats with NaN
        cells = frame[column].tolist()
        if None in cells and all(c is None or _is_number(c) for c in cells):
            frame[column] = frame[column].astype("float64")
    return frame


def _is_number(cell: Any) -> bool:
    return isinstance(cell, (int, float)) and not isinstance(cell, bool)


#: Columns of a sweep's tables that are text whatever they hold.
_TEXT_COLUMNS = ("status", "run")


def _pandas(what: str):
    """pandas, or one line saying which extra installs it."""
    try:
        import pandas
    except ImportError as exc:
        raise UserError(f"{what} {missing_package_message(exc) or f'needs pandas ({exc})'}") from None
    return pandas
