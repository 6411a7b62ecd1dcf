"""A run's directory: resolved config, per-round metrics, ledger, summary and figures.

Layout::

    RUN_DIR/config.toml     the resolved experiment (reads back with `testbed run`)
    RUN_DIR/metrics.csv     one row per round, flushed every round
    RUN_DIR/ledger.csv      every node's events, one row per event (columns: kind, node, round, ...)
    RUN_DIR/summary.json    the contract other tools read, with its own sha256 (testbed.reports.summary_file)
    RUN_DIR/checkpoint.npz  the algorithm's state after the last completed round, for --resume (testbed.reports.checkpoint)
    RUN_DIR/asked.csv       which nodes each session asked in each round, before it was sent (testbed.reports.asked)
    RUN_DIR/refusals.csv    the nodes that refused a round for their own budget (testbed.reports.refusals)
    RUN_DIR/figures/*.png   accuracy and loss against round and cost, ε per node
    RUN_DIR/.lock           the writer's lock (testbed.util.dirlock): one process writes a run directory

The checkpoint and the summary are replaced atomically (temporary file, fsync, rename) and carry a
sha256 of their content. The checkpoint also records what it covers: the sha256 of config.toml and a
:class:`~testbed.util.appendlog.Mark` (rows, bytes, sha256) of ledger.csv and metrics.csv. ``--resume``
(:meth:`RunDirectory.reopen`) trusts the directory only after checking all of it, and touches
nothing before every check passed.

A :class:`RunDirectory` holds the directory's lock from the moment it is created or reopened until
:meth:`RunDirectory.close`: a second writer (a second ``--resume``, a run into the same ``--out``,
`testbed report`) is refused in one line naming the holder's pid.
"""

from __future__ import annotations

import csv
import hashlib
import io
import logging
import os
from pathlib import Path
from typing import Any, Callable, Collection, Iterator, Mapping

import numpy as np

from testbed.checked.limits import MAX_RUN_FILE_BYTES
from testbed.errors import UserError
from testbed.ledger.files import LedgerMark, ledger_header, parse_rows, read_ledger
from testbed.reports.asked import Asked, read_asked
from testbed.reports.checkpoint import Checkpoint, StateSpec, load_checkpoint, write_checkpoint
from testbed.reports.refusals import Refusal, read_refusals
from testbed.reports.summary_file import STATUSES, SUMMARY_KEYS, UnverifiedSummary, read_summary, summary_digest
from testbed.util import jsontext
from testbed.util.appendlog import AppendLog, Mark, sha256_file, swap_file, tail_after, write_atomic
from testbed.util.dirlock import DirectoryLock
from testbed.util.jsontext import finite
from testbed.util.oneline import one_line
from testbed.util.userfiles import read_text

log = logging.getLogger(__name__)

METRIC_COLUMNS = [
    "round", "local_steps", "train_loss", "test_accuracy", "test_accuracy_pooled",
    "validation_accuracy", "cost_units", "epsilon", "bytes_total", "stragglers", "wall_s",
]
#: The metrics columns that count things (rounds, steps, bytes, nodes): read back as integers.
INTEGER_METRICS = ("round", "local_steps", "bytes_total", "stragglers")
#: Statuses of a finished run, whose figures are a result (a sweep reruns any other; compare refuses it).
FINISHED = ("completed", "stopped_budget")


class RunDirectory:
    """Creates and writes one run's directory; refuses to overwrite a finished or partial run.

    Example::

        >>> import tempfile, pathlib
        >>> from testbed.ledger.files import LedgerWriter
        >>> run = RunDirectory(pathlib.Path(tempfile.mkdtemp()) / "run")
        >>> run.write_config("[run]\\n")
        >>> run.save_checkpoint(1, {"model": np.zeros(3)}, LedgerWriter(run.ledger_path).mark())
        >>> run.load_checkpoint({"model": ((3,), np.float64)}, max_rounds=5).rounds_done
        1
    """

    def __init__(self, path: Path, *, sync: bool = True, _resumed: "Checkpoint | None" = None,
                 _lock: DirectoryLock | None = None):
        self.path = Path(path)
        self.sync = sync
        metrics = self.path / "metrics.csv"
        self.resumed = _resumed
        self.asked: list[Asked] = []  # a reopened run's asked.csv (set by reopen)
        self.refusals: list[Refusal] = []  # a reopened run's refusals.csv (set by reopen)
        self._config_sha256 = _resumed.config_sha256 if _resumed else None
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # under /proc, under a regular file, read-only: one line, no traceback
            raise UserError(f"cannot write the run directory {self.path}: {exc.strerror or exc}") from None
        self._lock = _lock or DirectoryLock(self.path)
        try:
            if _resumed is None and holds_run(self.path):  # checked under the lock: two runs into one --out
                raise UserError(f"{self.path} already holds a run; choose another --out, or --resume it"
                                + ("" if swap_file(self.path / "checkpoint.npz").exists() else
                                   " (it has no checkpoint: --resume starts it again from round 0, its ledger kept)"))
            self._metrics = AppendLog(metrics, header=_metrics_header(), sync=sync)
        except OSError as exc:
            self._lock.release()
            raise UserError(f"cannot write the run directory {self.path}: {exc.strerror or exc}") from None
        except BaseException:
            self._lock.release()
            raise

    @classmethod
    def reopen(cls, path: Path, expected: StateSpec | None = None, max_rounds: int | None = None,
               nodes: Collection[int] | None = None, sync: bool = True, setup: bool = True,
               first: "Callable[[], tuple[dict[str, np.ndarray], int]] | None" = None,
               unset: Collection[str] = ()) -> "RunDirectory":
        """An existing run's directory, checked, to append to (``testbed run --resume``).

        ``unset``: the state's arrays that mark "not set yet" with NaN (ACFL's last β̂² before its
        first round): a NaN in them is no divergence.

        A run killed before its first checkpoint resumes from round 0 when ``first`` is given
        (``first()``: the run's initial state and how many rounds it runs before its first
        checkpoint): as from a checkpoint of round 0 whose marks are the files' headers, so every
        ledger row it wrote stays charged and each round it asked (asked.csv) is charged as asked.

        Checks the checkpoint (digest, array names, shapes and dtypes against ``expected``, all
        finite, 0 <= rounds_done <= ``max_rounds``), that config.toml is the one it was written
        under, that ledger.csv and metrics.csv still hold what it marked, and that the ledger rows
        past the mark are well-formed events of ``nodes`` no later than the round being re-run.
        Only then repairs what a kill leaves: metric rows past the mark are dropped (their round
        runs again); a ledger whose last line was cut past the mark loses the rows past the mark
        (said on stderr: that round runs again and is charged again, whole). Whole rows past the
        mark stay charged, and the round run again charges what they lack
        (testbed.orchestration.charging.not_yet_charged).

        The checked checkpoint is ``run.resumed``; the ledger's events are ``run.ledger_events()``;
        the rounds its sessions asked (asked.csv, checked: testbed.reports.asked; a setup only when
        the algorithm has one, ``setup``) are ``run.asked``;
        its nodes' budget refusals (refusals.csv, checked: testbed.reports.refusals) ``run.refusals``.
        The directory's lock is taken before the checks and held until :meth:`close`.

        Raises:
            UserError: one line naming the damaged file and how, or the pid of the process that
                writes the directory now; nothing was changed.
        """
        path = Path(path)
        if not (path / "config.toml").exists():
            raise UserError(f"{path} holds no run to resume (no config.toml)")
        lock = DirectoryLock(path)  # before the checks: a writer holding it may be appending now
        try:
            synthetic = first is not None and not swap_file(path / "checkpoint.npz").exists()
            ckpt = _first_checkpoint(path, *first()) if synthetic else load_checkpoint(path, expected, max_rounds, unset)
            _check_config(path / "config.toml", ckpt)
            try:
                ledger_cut = _check_ledger(path / "ledger.csv", ckpt, nodes)
            except UserError as exc:
                if not synthetic:
                    raise
                raise UserError(f"{path / 'checkpoint.npz'}: missing: no checkpoint, and {exc} (a run that went past "
                                "its first checkpoint and lost it)") from None
            metrics_cut = _check_metrics(path / "metrics.csv", ckpt.metrics_mark)
            last_round = (max_rounds if max_rounds is not None else 2**62) - 1
            asked = read_asked(path / "asked.csv", nodes, last_round, setup=setup)
            refusals = read_refusals(path / "refusals.csv", nodes, last_round)
            # Every check passed: only now is anything in the directory changed.
            if synthetic:
                log.warning("%s: no checkpoint (killed before its first): resumed from round 0, its ledger kept", path)
            if ledger_cut:
                os.truncate(path / "ledger.csv", ckpt.ledger_mark.size_bytes)
                log.warning("%s: %s", path / "ledger.csv", ledger_cut)
            if metrics_cut:
                os.truncate(path / "metrics.csv", ckpt.metrics_mark.size_bytes)
                log.info("%s: dropped %s past the checkpoint", path / "metrics.csv", metrics_cut)
            directory = cls(path, sync=sync, _resumed=ckpt, _lock=lock)
            directory.asked, directory.refusals = asked, refusals
            return directory
        except BaseException:
            lock.release()
            raise

    def save_checkpoint(self, rounds_done: int, state: Mapping[str, np.ndarray], ledger_mark: LedgerMark,
                        rounds_ahead: int = 1) -> None:
        """The state after ``rounds_done`` rounds, replaced atomically (a kill leaves the old one).

        Args:
            state: name → numeric array, e.g. {"model": (P,)} or {"models": (N, P)}; names are
                identifiers.
            ledger_mark: what ledger.csv holds now (:meth:`LedgerWriter.mark`): rows written after
                it stay charged on resume; rows missing from it make the resume refuse.
            rounds_ahead: rounds that may run before the next checkpoint (output.checkpoint_every).

        Write the round's metrics row before its checkpoint: metrics rows past the mark are dropped
        on resume (their round runs again).
        """
        if self._config_sha256 is None:
            self._config_sha256 = sha256_file(self.path / "config.toml")
        write_checkpoint(self.path / "checkpoint.npz", Checkpoint(
            rounds_done, dict(state), ledger_mark, self._metrics.mark(), self._config_sha256, rounds_ahead),
            sync=self.sync)

    def load_checkpoint(self, expected: StateSpec | None = None, max_rounds: int | None = None) -> Checkpoint:
        """The checked last checkpoint (see :meth:`reopen` for the checks); UserError naming
        checkpoint.npz if it is missing or fails one."""
        return load_checkpoint(self.path, expected, max_rounds)

    def ledger_events(self) -> Iterator:
        """The events of ledger.csv, in order (after :meth:`reopen` checked and repaired it)."""
        try:
            yield from read_ledger(self.ledger_path)
        except (OSError, ValueError) as exc:
            raise UserError(f"{self.ledger_path}: {one_line(exc)}; refusing to resume") from None

    @property
    def ledger_path(self) -> Path:
        return self.path / "ledger.csv"

    @property
    def asked_path(self) -> Path:
        """asked.csv: the rounds each session asked, and whom (testbed.reports.asked)."""
        return self.path / "asked.csv"

    @property
    def refusals_path(self) -> Path:
        """refusals.csv: the nodes that refused a round for their budget (testbed.reports.refusals)."""
        return self.path / "refusals.csv"

    def write_config(self, toml_text: str) -> None:
        write_atomic(self.path / "config.toml", toml_text.encode(), sync=self.sync)
        self._config_sha256 = hashlib.sha256(toml_text.encode()).hexdigest()

    def append_metrics(self, row: dict[str, Any]) -> None:
        buf = io.StringIO()
        csv.DictWriter(buf, METRIC_COLUMNS).writerow(row)
        self._metrics.append(buf.getvalue(), rows=1)

    def write_summary(self, summary: dict[str, Any]) -> None:
        """Replace summary.json atomically, with a "sha256" key over the rest (see :func:`read_summary`)."""
        missing = [k for k in SUMMARY_KEYS if k not in summary]
        if missing or summary["status"] not in STATUSES:
            raise ValueError(f"summary lacks {missing} or has a bad status")
        body = finite({k: v for k, v in summary.items() if k != "sha256"})  # JSON has no NaN: null
        # What metrics.csv holds now, under the summary's digest: read_metrics trusts no other file.
        body["files"] = {"metrics.csv": self._metrics.mark().to_dict()}
        body["sha256"] = summary_digest(body)
        # Laid out to the nodes' level, each node on a line (jsontext.dumps_outline: the C encoder's speed).
        write_atomic(self.path / "summary.json", (jsontext.dumps_outline(body) + "\n").encode(), sync=self.sync)

    def close(self) -> None:
        """Close metrics.csv and release the directory's lock: call it when nothing more is
        written (the summary, the final model, the figures); again is a no-op."""
        self._metrics.close()
        self._lock.release()


def checked_config(run_dir: Path) -> Path:
    """The config.toml of a run to resume, once it is known to be the one its checkpoint was
    written under (nothing should parse it before: a damaged or edited file would be read as
    another experiment). :meth:`RunDirectory.reopen` checks it again, under the lock.

    Raises:
        UserError: one line naming config.toml (missing, or not the one of the checkpoint),
            checkpoint.npz (missing or damaged), or the pid of a process writing the directory.
    """
    run_dir = Path(run_dir)
    if not (run_dir / "config.toml").exists():
        raise UserError(f"{run_dir} holds no run to resume (no config.toml)")
    with DirectoryLock(run_dir):  # a run writing it now is named, before its files are read
        _check_config(run_dir / "config.toml", load_checkpoint(run_dir, None, None))
    return run_dir / "config.toml"


def _check_config(path: Path, ckpt: Checkpoint) -> None:
    try:
        digest = sha256_file(path)
    except OSError as exc:
        raise UserError(f"{path}: unreadable ({exc.strerror or exc}); refusing to resume") from None
    if digest != ckpt.config_sha256:
        raise UserError(f"{path}: differs from the config.toml the checkpoint was written under "
                        "(sha256 mismatch); refusing to resume")


def read_checkpoint(run_dir: Path, expected: StateSpec | None = None, max_rounds: int | None = None) -> Checkpoint:
    """A run's last checkpoint, checked as :meth:`RunDirectory.reopen` checks it (for tools and
    tests); UserError naming checkpoint.npz if it is missing or fails a check."""
    return load_checkpoint(Path(run_dir), expected, max_rounds)


def holds_run(directory: Path) -> bool:
    """Whether ``directory`` holds a run (finished or not): a run's first file is its metrics.csv."""
    return (Path(directory) / "metrics.csv").exists()


def read_metrics(run_dir: Path, summary: Mapping[str, Any] | None = None) -> list[dict[str, int | float]]:
    """The rows of a run's metrics.csv as numbers: the INTEGER_METRICS as ints, the rest as floats
    (a partial file of a killed run reads fine: a cut last line is skipped). UserError naming the
    file if it is missing or a row is not numbers (an integer column's cell not an integer).
    ``summary``: the run's summary as :func:`read_summary` returned it, when the caller has it
    (a 10,000 nodes' summary takes 0.2 s to read and check), else read here."""
    path = Path(run_dir) / "metrics.csv"
    try:
        text = read_text(path, MAX_RUN_FILE_BYTES, "")
    except UserError as exc:
        raise UserError(f"{path}: unreadable ({str(exc).removeprefix(f' {path}: ')})") from None
    _check_against_summary(Path(run_dir), path, text.encode(), summary)
    if text and not text.endswith("\n"):
        text = text[: text.rfind("\n") + 1]  # a killed run's last row may be cut
    rows = []
    reader = csv.DictReader(io.StringIO(text, newline=""))
    try:
        if reader.fieldnames is not None and list(reader.fieldnames) != METRIC_COLUMNS:
            raise ValueError("its header is not the metrics columns")
        for row in reader:
            if None in row or None in row.values():
                raise ValueError(f"line {reader.line_num}: wrong number of cells")
            # "nan": a diverged loss; "": not evaluated that round (output.eval_every)
            rows.append({k: int(v) if k in INTEGER_METRICS else float(v) for k, v in row.items() if v != ""})
    except (ValueError, csv.Error) as exc:
        raise UserError(f"{path}: damaged: {one_line(exc)}") from None
    return rows


def _check_against_summary(run_dir: Path, path: Path, data: bytes, summary: Mapping[str, Any] | None = None) -> None:
    """A finished run's file (its summary records the file's mark under its sha256) must be what
    the summary covers: :class:`UnverifiedSummary` otherwise, and whatever the summary's own
    refusal is. A run without a summary (running, killed) has nothing to check against; nor does
    a summary of an older testbed, which records no marks."""
    if summary is None:
        if not (run_dir / "summary.json").exists():
            return
        summary = read_summary(run_dir)
    files = summary.get("files")
    raw = files.get(path.name) if isinstance(files, dict) else None
    if raw is None:
        return
    try:
        mark = Mark.from_dict(raw)
    except ValueError as exc:
        raise UserError(f"{run_dir / 'summary.json'}: damaged: files.{path.name}: {exc}") from None
    if len(data) != mark.size_bytes or hashlib.sha256(data).hexdigest() != mark.sha256:
        raise UnverifiedSummary(f"{path}: unverified: it is not the file its run's summary covers ({len(data)} bytes, "
                                f"the summary recorded {mark.size_bytes} and their sha256), so none of its figures "
                                "is trusted")


def _metrics_header() -> str:
    buf = io.StringIO()
    csv.writer(buf).writerow(METRIC_COLUMNS)
    return buf.getvalue()


def _header_mark(header: str) -> Mark:
    """The mark of an append-only file that holds its header only."""
    data = header.encode()
    return Mark(0, len(data), hashlib.sha256(data).hexdigest())


def _first_checkpoint(run_dir: Path, state: dict[str, np.ndarray], rounds_ahead: int) -> Checkpoint:
    """What a run killed before its first checkpoint resumes from: round 0 from ``state`` (its
    initial state), ledger.csv and metrics.csv marked at their headers (every row past them is
    checked as rows past a checkpoint are), ``rounds_ahead`` the rounds it ran before its first
    checkpoint was due. A file the kill came before is created empty (nothing was written to it)."""
    for name, header in (("ledger.csv", ledger_header()), ("metrics.csv", _metrics_header())):
        if not (run_dir / name).exists():
            AppendLog(run_dir / name, header=header, sync=False).close()
    return Checkpoint(0, dict(state), _header_mark(ledger_header()), _header_mark(_metrics_header()),
                      sha256_file(run_dir / "config.toml"), rounds_ahead)


def _check_ledger(path: Path, ckpt: Checkpoint, nodes: Collection[int] | None) -> str | None:
    """Check ledger.csv against the checkpoint's mark; the repair to make (a sentence) or None."""
    mark = ckpt.ledger_mark
    try:
        tail = tail_after(path, mark)
    except FileNotFoundError:
        raise UserError(f"{path}: missing; it held {mark.rows} rows at the checkpoint; refusing to resume") from None
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: {one_line(exc)}; refusing to resume (it is never rewritten)") from None
    if not tail:
        return None
    if not tail.endswith(b"\n"):
        # A run killed while writing the round after the checkpoint. Keeping that round's whole rows
        # but not the cut one would let has_round() skip charging the cut event when the round runs
        # again; dropping the round whole charges it again, whole, from the same random streams.
        rows = tail.count(b"\n") + 1
        return (f"its last line was cut mid-row; dropped the {rows} row(s) written after the last checkpoint "
                f"(round {ckpt.rounds_done}, which runs again and is charged again)")
    try:
        events = parse_rows(tail.decode("utf-8"), first_line=mark.rows + 2)
    except (ValueError, UnicodeDecodeError) as exc:
        raise UserError(f"{path}: past the checkpoint: {one_line(exc)}; refusing to resume") from None
    for i, event in enumerate(events):
        line = mark.rows + 2 + i
        if nodes is not None and event.node not in nodes:
            raise UserError(f"{path}: line {line}: node {event.node} is not a node of this run; refusing to resume")
        last = ckpt.rounds_done + ckpt.rounds_ahead - 1  # the last round that may have run since
        if event.round > last:
            raise UserError(f"{path}: line {line}: round {event.round} is past the rounds run after the checkpoint "
                            f"({ckpt.rounds_done} to {last}); refusing to resume")
    return None


def _check_metrics(path: Path, mark: Mark) -> str | None:
    """Check metrics.csv against the checkpoint's mark; what lies past it (to drop) or None."""
    try:
        tail = tail_after(path, mark)
    except FileNotFoundError:
        raise UserError(f"{path}: missing; it held {mark.rows} rows at the checkpoint; refusing to resume") from None
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: {one_line(exc)}; refusing to resume") from None
    if not tail:
        return None
    rows = tail.count(b"\n") + (not tail.endswith(b"\n"))
    return f"{rows} row(s)"
