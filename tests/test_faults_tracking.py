"""A tracker that fails (a full disk, a server down or gone, a hang) at any stage of a run ends that
tracker in one logged line; the run, its ledger and its summary are as without tracking."""

from __future__ import annotations

import errno
import json
import logging
import socket
import threading
import time

import pytest

pytest.importorskip("tensorboardX")
pytest.importorskip("mlflow")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

from testbed.assembly.config import load_config_text  # noqa: E402
from testbed.ledger.files import read_ledger  # noqa: E402
from testbed.orchestration.runner import run_experiment  # noqa: E402
from testbed.reports.tracking.feed import Tracking  # noqa: E402
from testbed.reports.tracking.mlflow_tracker import RUN_FILE  # noqa: E402
from testbed.reports.tracking.tensorboard_tracker import TensorBoardTracker  # noqa: E402


@pytest.fixture
def mlflow_store(tmp_path, monkeypatch):
    uri = (tmp_path / "mlruns").as_uri()
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    return uri


def run(text, path, *overrides):
    return run_experiment(load_config_text(text, list(overrides)), out_dir=path, quiet=True)


def ledger_without_times(run_dir):
    """The ledger's events with the measured seconds and joules left out (measured anew each run)."""
    return [(e.kind, e.node, e.round, getattr(e, "local_steps", None), getattr(e, "bytes_up", None))
            for e in read_ledger(run_dir / "ledger.csv")]


def tracking_lines(caplog):
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("tracking:")]


def assert_same_run(result, baseline):
    assert result.summary["status"] == baseline.summary["status"] == "completed"
    assert result.summary["rounds"] == baseline.summary["rounds"]
    assert ledger_without_times(result.run_dir) == ledger_without_times(baseline.run_dir)
    assert result.summary["final"] == baseline.summary["final"]
    assert (result.run_dir / "metrics.csv").read_text().count("\n") == (baseline.run_dir / "metrics.csv").read_text().count("\n")


@pytest.fixture
def baseline(small_config_text, tmp_path):
    return run(small_config_text, tmp_path / "baseline")


@pytest.mark.parametrize("fail_from_round", [1, 3])
def test_a_full_disk_mid_run_ends_tensorboard_only(small_config_text, tmp_path, monkeypatch, caplog, baseline,
                                                   mlflow_store, fail_from_round):
    from tensorboardX.event_file_writer import EventsWriter

    real = EventsWriter.write_event

    def write_event(self, event):
        if event.step >= fail_from_round and event.summary.value and event.summary.value[0].HasField("simple_value"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, event)

    monkeypatch.setattr(EventsWriter, "write_event", write_event)
    with caplog.at_level(logging.WARNING):
        result = run(small_config_text, tmp_path / "r", "output.tensorboard=true", "output.mlflow=true")
    assert_same_run(result, baseline)
    lines = tracking_lines(caplog)
    assert len(lines) == 1 and "tensorboard stopped (round: OSError" in lines[0] and "No space left" in lines[0]
    acc = EventAccumulator(str(result.run_dir / "tensorboard"))
    acc.Reload()
    if fail_from_round > 1:
        assert [p.step for p in acc.Scalars("train_loss")] == list(range(1, fail_from_round))
    # The other tracker went on to the end.
    from mlflow.tracking import MlflowClient

    run_id = json.loads((result.run_dir / RUN_FILE).read_text())["run_id"]
    assert len(MlflowClient(mlflow_store).get_metric_history(run_id, "train_loss")) == 4


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("uri", ["http://127.0.0.1:{port}", "http://no-such-host.invalid:5000"])
def test_an_unreachable_mlflow_server_is_one_line_and_the_run_goes_on(small_config_text, tmp_path, monkeypatch,
                                                                     caplog, baseline, uri):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri.format(port=closed_port()))
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "2")
    with caplog.at_level(logging.WARNING):
        result = run(small_config_text, tmp_path / "r", "output.mlflow=true")
    assert_same_run(result, baseline)
    lines = tracking_lines(caplog)
    assert len(lines) == 1 and lines[0].startswith("tracking: mlflow stopped (start: ")
    assert "\n" not in lines[0] and not (result.run_dir / RUN_FILE).exists()


@pytest.mark.parametrize("stage", ["log_artifact", "set_terminated"])
def test_a_store_failing_at_the_runs_end_keeps_the_summary(small_config_text, tmp_path, monkeypatch, caplog,
                                                           baseline, mlflow_store, stage):
    from mlflow.tracking import MlflowClient

    def broken(*args, **kwargs):
        raise ConnectionError("the server went away")

    monkeypatch.setattr(MlflowClient, stage, broken)
    with caplog.at_level(logging.WARNING):
        result = run(small_config_text, tmp_path / "r", "output.mlflow=true")
    assert_same_run(result, baseline)
    assert json.loads((result.run_dir / "summary.json").read_text())["status"] == "completed"
    lines = tracking_lines(caplog)
    assert lines == ["tracking: mlflow stopped (finish: ConnectionError: the server went away); "
                     "the run goes on without it"]


@pytest.mark.parametrize("stage", ["round", "finish"])
def test_a_hung_tracker_holds_up_neither_the_rounds_nor_the_runs_end_for_long(small_config_text, tmp_path,
                                                                              monkeypatch, caplog, baseline, stage):
    release = threading.Event()
    monkeypatch.setattr(TensorBoardTracker, stage, lambda self, *a: release.wait(30))
    monkeypatch.setattr(Tracking, "FINISH_WAIT_S", 0.5)
    start = time.monotonic()
    try:
        with caplog.at_level(logging.WARNING):
            result = run(small_config_text, tmp_path / "r", "output.tensorboard=true")
        took_s = time.monotonic() - start
    finally:
        release.set()
    assert_same_run(result, baseline)
    assert took_s < 15
    assert tracking_lines(caplog) == ["tracking: tensorboard still busy after 0.5 s; left unfinished (the run's files "
                                      "are complete)"]


def test_a_tracker_that_falls_behind_loses_rounds_said_once(small_config_text, tmp_path, monkeypatch, caplog,
                                                            baseline):
    seen = []
    monkeypatch.setattr(TensorBoardTracker, "round", lambda self, record: (time.sleep(0.3), seen.append(record.round)))
    monkeypatch.setattr(Tracking, "QUEUE_ROUNDS", 1)
    with caplog.at_level(logging.WARNING):
        result = run(small_config_text, tmp_path / "r", "output.tensorboard=true", "dp_pasgd.steps=40")
    assert result.summary["status"] == "completed" and result.summary["rounds"] == 8
    lines = tracking_lines(caplog)
    assert len(lines) == 1 and "fall behind" in lines[0]
    assert seen and seen == sorted(seen) and len(seen) < 8  # in order, some left out


def test_a_failed_tracker_is_closed_and_called_no_more(tmp_path):
    calls = []

    class Failing:
        def start(self, config, run_dir):
            calls.append("start")

        def round(self, record):
            calls.append("round")
            raise OSError(errno.ENOSPC, "No space left on device")

        def finish(self, summary):
            calls.append("finish")

        def close(self):
            calls.append("close")
            raise OSError("closing fails too")

    tracking = Tracking([("failing", Failing())])
    tracking._thread.start()
    tracking._queue.put(("start", (None, tmp_path)))
    from testbed.accounting.book import LedgerBook
    from testbed.accounting.budgets import Budgets

    for r in (1, 2, 3):
        tracking.round({"round": r, "train_loss": 0.1}, LedgerBook([0]), Budgets())
    tracking.finish({"status": "completed"})
    assert calls == ["start", "round", "close"] and not tracking.live


from hypothesis import given, strategies as st  # noqa: E402

STAGES = ["start", "round", "round", "round", "finish"]


@given(fail_at=st.lists(st.none() | st.integers(0, len(STAGES) - 1), min_size=1, max_size=3),
       error=st.sampled_from([OSError(errno.ENOSPC, "No space left on device"), ConnectionError("refused"),
                              ValueError("bad\nvalue"), RuntimeError("")]))
def test_each_tracker_is_called_in_order_until_its_first_failure(tmp_path_factory, fail_at, error):
    """Trackers failing at any call (or never): each gets every call in order up to its failure,
    then close() and nothing more; the others all of theirs; one one-line warning per failure."""
    from testbed.accounting.book import LedgerBook
    from testbed.accounting.budgets import Budgets

    calls = [[] for _ in fail_at]

    def tracker(i):
        class Recording:
            def __getattr__(self, stage):
                def call(*args):
                    calls[i].append(stage)
                    if stage != "close" and fail_at[i] == len(calls[i]) - 1:
                        raise error
                return call
        return Recording()

    warnings = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: warnings.append(record.getMessage())
    logger = logging.getLogger("testbed.reports.tracking.feed")
    logger.addHandler(handler)
    tracking = Tracking([(f"t{i}", tracker(i)) for i in range(len(fail_at))])
    try:
        tracking._thread.start()
        tracking._queue.put(("start", (None, tmp_path_factory.getbasetemp())))
        for r in (1, 2, 3):
            tracking.round({"round": r, "train_loss": 0.1}, LedgerBook([0, 1]), Budgets())
        tracking.finish({"status": "completed"})
    finally:
        logger.removeHandler(handler)
    for i, at in enumerate(fail_at):
        assert calls[i] == (STAGES if at is None else STAGES[:at + 1] + ["close"])
    assert len(warnings) == sum(at is not None for at in fail_at)
    assert all("\n" not in w for w in warnings)
    assert tracking.live == any(at is None for at in fail_at)
