"""Experiment tracking: TensorBoard's event files and MLflow's store hold the run's curves, read back
with each tool's own reader (TensorBoard's EventAccumulator, MLflow's client, `mlflow ui`), and match
metrics.csv; ``epsilon`` is the figure summary.json quotes (tests/test_one_quote.py), the metrics
row's (the run's accountant's, zcdp here) beside it as ``epsilon_zcdp``."""

from __future__ import annotations

import csv
import json

import pytest

pytest.importorskip("tensorboardX")
pytest.importorskip("mlflow")
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

from testbed.assembly.config import load_config_text  # noqa: E402
from testbed.errors import ConfigError  # noqa: E402
from testbed.orchestration.runner import run_experiment  # noqa: E402
from testbed.reports import tracking  # noqa: E402
from testbed.reports.tracking.mlflow_tracker import RUN_FILE, tracking_uri  # noqa: E402


@pytest.fixture
def mlflow_store(tmp_path, monkeypatch):
    """MLflow's default store: the SQLite file mlflow.db in the working folder (tmp_path), no
    MLFLOW_TRACKING_URI and no MLFLOW_ALLOW_FILE_STORE: what a user's own client reads as it is."""
    monkeypatch.chdir(tmp_path)
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_ALLOW_FILE_STORE", "MLFLOW_EXPERIMENT_NAME"):
        monkeypatch.delenv(name, raising=False)
    return f"sqlite:///{tmp_path / 'mlflow.db'}"


def run(text, tmp_path, name="run", **output):
    overrides = [f"output.{k}={str(v).lower()}" for k, v in output.items()]
    return run_experiment(load_config_text(text, overrides), out_dir=tmp_path / name, quiet=True)


def metrics_csv(run_dir):
    return list(csv.DictReader(open(run_dir / "metrics.csv")))


def accumulator(run_dir):
    acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0, "histograms": 0, "tensors": 0})
    acc.Reload()
    return acc


def test_tensorboard_holds_every_rounds_metrics_and_node_histograms(small_config_text, tmp_path):
    result = run(small_config_text, tmp_path, tensorboard=True)
    acc = accumulator(result.run_dir)
    rows = metrics_csv(result.run_dir)
    for name in ("train_loss", "test_accuracy", "epsilon", "epsilon_zcdp", "cost_units", "bytes_total", "energy_j"):
        assert name in acc.Tags()["scalars"]
    for name, column in (("train_loss", "train_loss"), ("epsilon_zcdp", "epsilon"), ("cost_units", "cost_units"),
                         ("bytes_total", "bytes_total")):
        points = acc.Scalars(name)
        assert [p.step for p in points] == [int(r["round"]) for r in rows]
        assert [p.value for p in points] == pytest.approx([float(r[column]) for r in rows], rel=1e-6)
    # Per-node histograms: every node counted each round, ε's spread as the nodes' own (the quoted one's).
    summary = result.summary
    last = acc.Histograms("nodes/epsilon")[-1]
    assert last.step == summary["rounds"] and last.histogram_value.num == len(summary["nodes"])
    assert last.histogram_value.max == pytest.approx(summary["privacy"]["headline"]["value"], rel=1e-6)
    # Per-node series by id: node 2's cost units and bytes, each round.
    for name in ("cost_units", "bytes_total", "energy_j", "epsilon"):
        assert [p.step for p in acc.Scalars(f"nodes/{name}/2")] == [int(r["round"]) for r in rows]
    assert acc.Scalars("nodes/cost_units/2")[-1].value == pytest.approx(summary["nodes"]["2"]["cost_units"], rel=1e-6)
    assert {"config/text_summary", "summary/text_summary", "privacy_guarantees/text_summary"} <= \
        set(acc.Tags()["tensors"])
    said = acc.Tensors("privacy_guarantees/text_summary")[-1].tensor_proto.string_val[0].decode()
    assert "the server: epsilon" in said and "reproducible run: noise derivable from the run seed" in said


def test_tensorboard_with_eval_every_leaves_unevaluated_rounds_out(small_config_text, tmp_path):
    result = run(small_config_text, tmp_path, tensorboard=True, eval_every=3)
    acc = accumulator(result.run_dir)
    assert [p.step for p in acc.Scalars("test_accuracy")] == [3, 4]  # evaluated rounds and the last
    assert [p.step for p in acc.Scalars("epsilon")] == [1, 2, 3, 4]


def test_mlflow_holds_params_curves_status_and_the_run_directory(small_config_text, tmp_path, mlflow_store,
                                                                 monkeypatch):
    from mlflow.tracking import MlflowClient

    from testbed.orchestration import runner
    from testbed.streams.node_secret import SERVER_KEY_FILE, load_or_make

    nodes_of = runner.build_nodes

    def with_a_server_secret(config, algorithm, data, quiet, run_dir=None, *more, **options):
        load_or_make(run_dir, SERVER_KEY_FILE)  # as an MQTT run's coordinator makes it once a node has a secret
        return nodes_of(config, algorithm, data, quiet, run_dir, *more, **options)

    monkeypatch.setattr(runner, "build_nodes", with_a_server_secret)
    result = run(small_config_text, tmp_path, mlflow=True, tensorboard=True)
    known = json.loads((result.run_dir / RUN_FILE).read_text())
    assert known["tracking_uri"] == mlflow_store
    client = MlflowClient()  # MLflow's own default store, no argument and no environment variable
    mlrun = client.get_run(known["run_id"])
    assert mlrun.info.status == "FINISHED" and mlrun.info.run_name == "run"
    assert client.get_experiment(mlrun.info.experiment_id).name == "t"  # run.name
    params = mlrun.data.params
    assert params["dp_pasgd.sigma"] == "1.0" and params["data.num_nodes"] == "4" and params["output.mlflow"] == "True"
    # Every parameter of the resolved config, flat, as the run's config.toml holds it.
    from testbed.assembly.config import load_config, to_dict
    from testbed.reports.tracking.mlflow_tracker import flat_params

    configured = dict(flat_params(to_dict(load_config(result.run_dir / "config.toml"))))
    assert params.items() >= configured.items()
    # and what the algorithm resolved beyond it, under its section
    resolved = dict(flat_params(result.summary["algorithm_settings"], "dp_pasgd."))
    assert params == {**resolved, **configured} and params["dp_pasgd.sensitivity"] == resolved["dp_pasgd.sensitivity"]
    rows = metrics_csv(result.run_dir)
    for name, column in (("train_loss", "train_loss"), ("epsilon_zcdp", "epsilon"), ("cost_units", "cost_units")):
        history = sorted(client.get_metric_history(known["run_id"], name), key=lambda m: m.step)
        assert [m.step for m in history] == [int(r["round"]) for r in rows]
        assert [m.value for m in history] == pytest.approx([float(r[column]) for r in rows], rel=1e-12)
    # Per-node series by id.
    for node, entry in result.summary["nodes"].items():
        history = sorted(client.get_metric_history(known["run_id"], f"nodes/cost_units/{node}"), key=lambda m: m.step)
        assert [m.step for m in history] == [int(r["round"]) for r in rows]
        assert history[-1].value == pytest.approx(entry["cost_units"], rel=1e-12)
    assert mlrun.data.tags["testbed.status"] == "completed"
    # Against whom the ε holds: a sim run's noise comes from the run seed.
    [g] = result.summary["privacy_guarantees"]
    assert mlrun.data.tags["testbed.privacy.server"] == g["statement"]
    assert float(mlrun.data.tags["testbed.privacy.server.epsilon"]) == pytest.approx(g["epsilon"], rel=1e-12)
    artifacts = {a.path for a in client.list_artifacts(known["run_id"])}
    assert {"summary.json", "ledger.csv", "metrics.csv", "config.toml", "tensorboard"} <= artifacts
    assert ".lock" not in artifacts
    assert (result.run_dir / SERVER_KEY_FILE).exists() and SERVER_KEY_FILE not in artifacts  # the public's noise key
    stored = client.download_artifacts(known["run_id"], "ledger.csv", str(tmp_path / "back"))
    assert open(stored).read() == (result.run_dir / "ledger.csv").read_text()


def test_a_sigma_calibrated_to_the_budget_is_logged_as_dp_pasgd_sigma(small_config_text, tmp_path, mlflow_store):
    """The quick start sets no σ (it is calibrated to budget.epsilon): MLflow still has dp_pasgd.sigma,
    the σ the run used."""
    from mlflow.tracking import MlflowClient

    text = small_config_text.replace("sigma = 1.0\n", "") + "[budget]\nepsilon = 4.0\n"
    result = run(text, tmp_path, mlflow=True)
    params = MlflowClient().get_run(json.loads((result.run_dir / RUN_FILE).read_text())["run_id"]).data.params
    assert params["dp_pasgd.sigma"] == str(result.summary["algorithm_settings"]["sigma"])
    assert params["budget.epsilon"] == "4.0"


def test_mlflow_marks_a_budget_stopped_run_finished_with_its_status(small_config_text, tmp_path, mlflow_store):
    from mlflow.tracking import MlflowClient

    result = run(small_config_text + "[budget]\nepsilon = 4.0\n", tmp_path, mlflow=True)
    assert result.summary["status"] == "stopped_budget"
    client = MlflowClient()
    mlrun = client.get_run(json.loads((result.run_dir / RUN_FILE).read_text())["run_id"])
    assert mlrun.data.tags["testbed.status"] == "stopped_budget"
    assert len(client.get_metric_history(mlrun.info.run_id, "epsilon")) == result.summary["rounds"]


def test_the_default_store_is_mlflows_own_sqlite_file_in_the_working_folder(tmp_path, monkeypatch):
    from mlflow.tracking._tracking_service.utils import _get_default_tracking_uri

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    assert tracking_uri() == f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert _get_default_tracking_uri() == "sqlite:///mlflow.db"  # what MlflowClient() and `mlflow ui` read here


@pytest.mark.slow
def test_mlflow_ui_serves_the_run_from_its_default_store(small_config_text, tmp_path, mlflow_store):
    """`mlflow ui` from the tracking-ui extra (mlflow-skinny, Flask, flask-cors), started in the
    folder with no option, serves the run over its REST API and its page."""
    import socket
    import subprocess
    import sys
    import time
    import urllib.request

    from conftest import require_module

    require_module("flask", "tracking-ui")
    require_module("flask_cors", "tracking-ui")
    result = run(small_config_text, tmp_path, mlflow=True)
    run_id = json.loads((result.run_dir / RUN_FILE).read_text())["run_id"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ui = subprocess.Popen([sys.executable, "-m", "mlflow", "ui", "--port", str(port), "--workers", "1"], cwd=tmp_path,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        url = f"http://127.0.0.1:{port}/api/2.0/mlflow/runs/get?run_id={run_id}"
        deadline = time.monotonic() + 120  # a loaded 2-core machine starts it in 10-30 s
        while True:
            assert ui.poll() is None, ui.stderr.read().decode(errors="replace")[-2000:]
            try:
                got = json.loads(urllib.request.urlopen(url, timeout=5).read())
                break
            except OSError:
                assert time.monotonic() < deadline, "mlflow ui did not answer in 120 s"
                time.sleep(1)
        params = {p["key"]: p["value"] for p in got["run"]["data"]["params"]}
        assert params["dp_pasgd.sigma"] == "1.0" and got["run"]["info"]["status"] == "FINISHED"
        assert urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10).status == 200
    finally:
        import os
        import signal

        os.killpg(ui.pid, signal.SIGTERM)
        ui.wait(30)


@pytest.mark.parametrize("key, module", [("tensorboard", "tensorboardX"), ("mlflow", "mlflow")])
def test_a_missing_tracker_package_is_one_config_error_naming_the_extra(small_config_text, tmp_path, monkeypatch,
                                                                        key, module):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == module else real(name, *a))
    config = load_config_text(small_config_text, [f"output.{key}=true"])
    with pytest.raises(ConfigError, match=rf"output\.{key}.*pip install 'dpfl-testbed\[tracking\]'"):
        run_experiment(config, out_dir=tmp_path / "r", quiet=True)
    assert not (tmp_path / "r").exists()  # refused before anything was written
    from testbed.orchestration.sweep import grid_points, run_sweep

    with pytest.raises(ConfigError, match=rf"output\.{key}.*dpfl-testbed\[tracking\]"):  # a sweep: once, before any run
        run_sweep(config, grid_points({"dp_pasgd.tau": [5, 10]}, 1, 1), tmp_path / "sweep", quiet=True)
    assert not (tmp_path / "sweep").exists()
    tracking.check_installed(load_config_text(small_config_text))  # off: nothing to check


@pytest.mark.slow
def test_an_mqtt_run_tracks_the_same_curves_as_in_sim(small_config_text, tmp_path, mlflow_store):
    """Over MQTT (embedded broker, emulated hosts forked before the tracking thread starts) the
    trackers get the same rounds as in sim."""
    from mlflow.tracking import MlflowClient

    sim = run(small_config_text, tmp_path, "sim", tensorboard=True, mlflow=True)
    mqtt = run_experiment(load_config_text(small_config_text, ["run.mode=mqtt", "output.tensorboard=true",
                                                               "output.mlflow=true"]),
                          out_dir=tmp_path / "mqtt", quiet=True)
    assert mqtt.summary["status"] == "completed"
    for name in ("train_loss", "epsilon"):
        assert [(p.step, p.value) for p in accumulator(mqtt.run_dir).Scalars(name)] == \
            [(p.step, p.value) for p in accumulator(sim.run_dir).Scalars(name)]
    client = MlflowClient()
    ids = [json.loads((r.run_dir / RUN_FILE).read_text())["run_id"] for r in (sim, mqtt)]
    assert [sorted((m.step, m.value) for m in client.get_metric_history(i, "epsilon")) for i in ids] == \
        [sorted((m.step, m.value) for m in client.get_metric_history(ids[0], "epsilon"))] * 2


def test_a_resumed_run_logs_to_its_mlflow_run_again(small_config_text, tmp_path, mlflow_store):
    from mlflow.tracking import MlflowClient

    from run_dir_cases import run_killed

    config = load_config_text(small_config_text, ["output.mlflow=true", "output.checkpoint_every=1"])
    run_killed(config, tmp_path / "r", killed_at=3)
    run_id = json.loads((tmp_path / "r" / RUN_FILE).read_text())["run_id"]
    client = MlflowClient()
    assert client.get_run(run_id).info.status == "FAILED"
    result = run_experiment(config, out_dir=tmp_path / "r", quiet=True, resume=True)
    assert json.loads((tmp_path / "r" / RUN_FILE).read_text())["run_id"] == run_id
    mlrun = client.get_run(run_id)
    assert mlrun.info.status == "FINISHED" and mlrun.data.tags["testbed.status"] == "completed"
    assert len(client.search_runs([mlrun.info.experiment_id])) == 1
    last = {}
    for m in sorted(client.get_metric_history(run_id, "epsilon_zcdp"), key=lambda m: m.timestamp):
        last[m.step] = m.value  # a round run again after the kill is logged again
    assert last == {int(r["round"]): pytest.approx(float(r["epsilon"]), rel=1e-12) for r in metrics_csv(result.run_dir)}


@pytest.mark.parametrize("first", ["this process", "another process"])
def test_runs_racing_to_create_their_experiment_share_it(tmp_path, mlflow_store, monkeypatch, first):
    """A sweep's runs start at once: the one that finds the experiment created between its look-up
    and its create call takes the existing experiment instead of failing."""
    from mlflow.tracking import MlflowClient

    from testbed.reports.tracking.mlflow_tracker import _experiment_id

    client = MlflowClient(mlflow_store)
    if first == "another process":
        real = MlflowClient.get_experiment_by_name
        looked = []

        def late(self, name):
            looked.append(name)
            if len(looked) == 1:  # the other run creates it right after this look-up
                MlflowClient(mlflow_store).create_experiment(name)
                return None
            return real(self, name)

        monkeypatch.setattr(MlflowClient, "get_experiment_by_name", late)
    a = _experiment_id(client, "sweep")
    assert _experiment_id(client, "sweep") == a
    assert [e.name for e in MlflowClient(mlflow_store).search_experiments()].count("sweep") == 1


@pytest.mark.slow
def test_a_sweeps_runs_are_one_experiment_in_mlflow(small_config_text, tmp_path, mlflow_store):
    from mlflow.tracking import MlflowClient

    from testbed.orchestration.sweep import grid_points, run_sweep

    config = load_config_text(small_config_text, ["output.mlflow=true"])
    rows = run_sweep(config, grid_points({"dp_pasgd.tau": [5, 10]}, 2, 1), tmp_path / "sweep", workers=2, quiet=True)
    assert [r["status"] for r in rows] == ["completed"] * 4
    client = MlflowClient()
    [experiment] = [e for e in client.search_experiments() if e.name == "t"]
    runs = client.search_runs([experiment.experiment_id])
    assert sorted(r.data.params["dp_pasgd.tau"] for r in runs) == ["10", "10", "5", "5"]
    assert all(r.info.status == "FINISHED" for r in runs)
