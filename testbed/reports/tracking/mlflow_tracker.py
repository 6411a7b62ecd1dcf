"""``output.mlflow = true``: the run in MLflow: every parameter of the resolved config, flat
(dotted keys: ``dp_pasgd.sigma``), and at the end what the algorithm resolved beyond it (a σ
calibrated to the ε budget, as ``dp_pasgd.sigma``), each round's metrics at step = rounds done (the metrics row, the
most joules any node spent, and ``epsilon``: the figure summary.json quotes, feed.Quoting), each
node's ε, cost units, bytes and joules by id (``nodes/epsilon/3``), the status and the figure to
quote as tags (``testbed.epsilon``: "1.618", "10.05 nats" or "∞"), and the run directory's files as
artifacts at the end.

Where: MLFLOW_TRACKING_URI (any store MLflow reaches: a server, a database, a folder); unset, the
SQLite store ``sqlite:///mlflow.db`` in the working folder, MLflow's own default, so that
``MlflowClient()`` and ``mlflow ui`` started in that folder read it with no option and no
environment variable (the store needs SQLAlchemy and Alembic: ``dpfl-testbed[tracking]``; ``mlflow ui``
also Flask: ``dpfl-testbed[tracking-ui]``). A file store (a folder, MLFLOW_TRACKING_URI=./mlruns) is
used when asked for: MLflow 3 keeps it in maintenance mode, so the tracker opts in to it
(MLFLOW_ALLOW_FILE_STORE=true unless set) and so must its readers. The experiment is
MLFLOW_EXPERIMENT_NAME, else the run's name (``run.name``). A resumed run goes on logging to its
MLflow run (RUN_DIR/mlflow_run.json).
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator
from urllib.parse import unquote, urlparse

from testbed.errors import UserError
from testbed.reports import headline
from testbed.reports.tracking import RoundRecord, node_series
from testbed.streams.node_secret import SERVER_KEY_FILE
from testbed.util import jsontext
from testbed.util.userfiles import read_text

if TYPE_CHECKING:
    from testbed.assembly.config import Config

#: The file in RUN_DIR naming the MLflow run (a resumed run logs to it again).
RUN_FILE = "mlflow_run.json"
#: MLflow's limits: params and metrics per log_batch call, characters of a param's value.
_BATCH_PARAMS, _BATCH_METRICS, _PARAM_CHARS = 100, 1000, 6000
#: Seconds the metrics of finished rounds may wait to be sent together (one call for many rounds
#: costs a round's share of a millisecond; one call a round, several).
SEND_EVERY_S = 2.0
_STATUS = {"completed": "FINISHED", "stopped_budget": "FINISHED", "failed": "FAILED"}


#: The store's file in the working folder when MLFLOW_TRACKING_URI is unset: MLflow's default.
DEFAULT_DB = "mlflow.db"


def tracking_uri() -> str:
    """MLFLOW_TRACKING_URI, else the SQLite store mlflow.db in the working folder (absolute, so a
    run's mlflow_run.json names the same store from anywhere)."""
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    return uri if uri else f"sqlite:///{Path.cwd() / DEFAULT_DB}"


def sqlite_file(uri: str) -> Path | None:
    """The database file of a ``sqlite:///`` URI, else None.

    Example::

        >>> sqlite_file("sqlite:////tmp/runs/mlflow.db"), sqlite_file("file:///tmp/mlruns")
        (PosixPath('/tmp/runs/mlflow.db'), None)
    """
    return Path(uri[len("sqlite:///"):]) if uri.startswith("sqlite:///") else None


def file_store(uri: str) -> Path | None:
    """The folder of a file store URI (``file:///...`` or a plain path), else None.

    Example::

        >>> file_store("file:///tmp/ml%20runs"), file_store("http://127.0.0.1:5000"), file_store("databricks")
        (PosixPath('/tmp/ml runs'), None, None)
    """
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        return Path(unquote(parsed.path))
    return Path(uri) if parsed.scheme == "" and uri != "databricks" else None


@contextmanager
def _creating(uri: str) -> Iterator[None]:
    """Hold a local store's creation lock: another process's run may create the same experiment at
    the same moment (a file store does not refuse a second experiment of the same name), or, on a
    new SQLite store, its tables; a server refuses a second experiment itself (see
    :func:`_experiment_id`)."""
    db = sqlite_file(uri)
    folder = db.parent if db is not None else file_store(uri)
    if folder is None:
        yield
        return
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / (f".{db.name}.testbed-create.lock" if db is not None else ".testbed-create.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield


def flat_params(tree: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, str]]:
    """(dotted key, value as text) of every leaf of a nested dict.

    Example::

        >>> list(flat_params({"run": {"seed": 1}, "dp_pasgd": {"sigma": 1.0, "lr": [0.1, 0.2]}}))
        [('run.seed', '1'), ('dp_pasgd.sigma', '1.0'), ('dp_pasgd.lr', '[0.1, 0.2]')]
    """
    for key, value in tree.items():
        if isinstance(value, dict):
            yield from flat_params(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", str(value)[:_PARAM_CHARS]


def _experiment_id(client, name: str) -> str:
    """The id of the experiment ``name``, created if missing; a sweep's runs, started at once in
    several processes, may race to create it: the loser takes the winner's."""
    from mlflow.exceptions import MlflowException

    experiment = client.get_experiment_by_name(name)
    if experiment is not None:
        return experiment.experiment_id
    try:
        return client.create_experiment(name)
    except MlflowException:
        experiment = client.get_experiment_by_name(name)
        if experiment is None:
            raise
        return experiment.experiment_id


class MlflowTracker:
    """One MLflow run per testbed run, through MlflowClient (no process-wide active run: runs of a
    sweep or a notebook do not share state)."""

    def __init__(self) -> None:
        self._client = None
        self._run_id: str | None = None
        self._run_dir: Path | None = None
        self._pending: list = []  # metrics of rounds not sent yet
        self._sent_at = 0.0

    def start(self, config: "Config", run_dir: Path) -> None:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        from testbed.assembly.config import to_dict

        uri = tracking_uri()
        if file_store(uri) is not None:
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        self._run_dir = Path(run_dir)
        with _creating(uri):  # the store is opened here: a new SQLite store makes its tables, once
            self._client = client = MlflowClient(tracking_uri=uri)
            client.search_experiments(max_results=1)
        self._run_id = self._resumed(uri)
        if self._run_id is None:
            name = os.environ.get("MLFLOW_EXPERIMENT_NAME") or config.run.name
            with _creating(uri):
                experiment_id = _experiment_id(client, name)
            run = client.create_run(experiment_id, run_name=self._run_dir.name,
                                    tags={"testbed.run_dir": str(self._run_dir.resolve()),
                                          "testbed.algorithm": config.run.algorithm, "testbed.mode": config.run.mode})
            self._run_id = run.info.run_id
            (self._run_dir / RUN_FILE).write_text(jsontext.dumps({"tracking_uri": uri, "run_id": self._run_id}) + "\n")
            params = [Param(k, v) for k, v in flat_params(to_dict(config))]
            for i in range(0, len(params), _BATCH_PARAMS):
                client.log_batch(self._run_id, params=params[i:i + _BATCH_PARAMS])
        else:
            client.update_run(self._run_id, status="RUNNING")

    def round(self, record: RoundRecord) -> None:
        from mlflow.entities import Metric

        now_ms = int(time.time() * 1000)
        # MLflow stores finite numbers only (ε = ∞ of a run without noise is in the summary's tags).
        self._pending += [Metric(k, v, now_ms, record.round) for k, v in record.metrics.items() if abs(v) < float("inf")]
        self._pending += [Metric(k, v, now_ms, record.round) for k, v in node_series(record)]
        if time.monotonic() - self._sent_at >= SEND_EVERY_S:
            self._send()

    def _send(self) -> None:
        pending, self._pending = self._pending, []
        for i in range(0, len(pending), _BATCH_METRICS):
            self._client.log_batch(self._run_id, metrics=pending[i:i + _BATCH_METRICS])
        self._sent_at = time.monotonic()

    def finish(self, summary: dict[str, Any]) -> None:
        from mlflow.entities import Param

        self._send()
        client, run_id = self._client, self._run_id
        # What the run resolved beyond its config, under its algorithm's section where the config
        # has no such key: the σ calibrated to budget.epsilon is dp_pasgd.sigma like a σ typed in.
        settings, algorithm = summary.get("algorithm_settings"), summary.get("algorithm")
        if isinstance(settings, dict) and isinstance(algorithm, str):
            logged = client.get_run(run_id).data.params
            params = [Param(k, v) for k, v in flat_params(settings, f"{algorithm}.") if k not in logged]
            for i in range(0, len(params), _BATCH_PARAMS):
                client.log_batch(run_id, params=params[i:i + _BATCH_PARAMS])
        quote = headline.quote(summary)
        # The figure to quote (summary.json's privacy.headline), as every other surface shows it.
        tags = {"testbed.status": summary.get("status"), "testbed.rounds": summary.get("rounds"),
                "testbed.epsilon": headline.quote_text(summary), "testbed.epsilon.by": quote.get("by"),
                "testbed.epsilon.observer": quote.get("observer"), "testbed.privacy": headline.privacy_text(summary)}
        # Against whom each figure holds (testbed.privacy.secrecy): per observer, its ε and statement.
        for g in headline.guarantees(summary):
            tags[f"testbed.privacy.{g['observer']}"] = g["statement"]
            tags[f"testbed.privacy.{g['observer']}.epsilon"] = g.get("epsilon")
        for key, value in tags.items():
            if value is not None:
                client.set_tag(run_id, key, str(value))
        for path in sorted(self._run_dir.iterdir()):
            # The directory's lock; and the server's secret (testbed.streams.node_secret.SERVER_KEY_FILE),
            # which keys the noise of the broadcasts a store's readers may have heard.
            if path.name.startswith(".") or path.name == SERVER_KEY_FILE:
                continue
            if path.is_dir():
                client.log_artifacts(run_id, str(path), artifact_path=path.name)
            else:
                client.log_artifact(run_id, str(path))
        client.set_terminated(run_id, status=_STATUS.get(summary.get("status"), "FAILED"))

    def close(self) -> None:
        """Nothing to release: the client holds no open store (a server that failed is left alone)."""

    def _resumed(self, uri: str) -> str | None:
        """The MLflow run a resumed run logged to, if RUN_FILE names one in this store."""
        try:
            known = json.loads(read_text(self._run_dir / RUN_FILE, 64 * 1024, RUN_FILE))
        except (UserError, ValueError):
            return None
        if not isinstance(known, dict) or known.get("tracking_uri") != uri or not isinstance(known.get("run_id"), str):
            return None
        return known["run_id"]
