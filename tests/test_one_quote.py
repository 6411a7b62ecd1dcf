"""One privacy figure to quote, everywhere (issue 43, part 1): summary.json's ``privacy.headline`` is
the figure, and the terminal's table, ``testbed runs``, the watch page, the HTML report, TensorBoard,
MLflow (each read back with its own reader) and the API show that figure and no other: for an
(ε, δ)-DP run the tight accountant's ε (not the paper's beside it), for ACFL ε-MI-DP in nats, for
FedAvg ∞. Per round, the trackers' ``epsilon`` is the same figure's series, and per node by id."""

from __future__ import annotations

import html
import json
import re

import pytest

from conftest import needs_module
from testbed.api import load
from testbed.assembly.config import load_config_text
from testbed.cli import main
from testbed.cli.run import format_summary
from testbed.orchestration.runner import run_experiment
from testbed.reports import headline
from testbed.reports.html import write_report
from testbed.reports.results import read_metrics
from testbed.watch.checks import summary_view

pytestmark = [needs_module("tensorboardX", "tracking"), needs_module("mlflow", "tracking"),
              needs_module("sqlalchemy", "tracking")]

SYNTHETIC = '[data]\ndataset = "synthetic"\nnum_nodes = 4\nsamples_per_node = 60\ndim = 6\n'
CONFIGS = {
    # DP-PASGD: the paper's zCDP ε beside the tight RDP one, which is the one to quote.
    "dp": '[run]\nname = "q"\n' + SYNTHETIC + '[dp_pasgd]\nsteps = 20\ntau = 5\nbatch = 8\nlr = 0.5\nsigma = 1.0\n'
          'clip = true\nlipschitz = 1.0\n[output]\nfigures = false\n',
    "mi_dp": '[run]\nname = "q"\nalgorithm = "acfl"\n' + SYNTHETIC + '[model]\nkind = "linear"\nbias = false\n'
             '[acfl]\niterations = 5\nlr = 0.01\nsigma1_sq = 1.0\nsigma2_sq = 1.0\n[output]\nfigures = false\n',
    "none": '[run]\nname = "q"\nalgorithm = "fedavg"\n' + SYNTHETIC + '[output]\nfigures = false\n',
}
EXPECTED_TEXT = {"dp": lambda v: f"{v:.4g}", "mi_dp": lambda v: f"{v:.4g} nats", "none": lambda v: "∞"}


@pytest.fixture
def tracked(request, tmp_path, monkeypatch):
    """A finished run of the guarantee ``request.param`` with both trackers on (MLflow's default
    SQLite store in the working folder), and its MLflow run id."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    monkeypatch.delenv("MLFLOW_EXPERIMENT_NAME", raising=False)
    config = load_config_text(CONFIGS[request.param], ["output.tensorboard=true", "output.mlflow=true"])
    result = run_experiment(config, out_dir=tmp_path / "runs" / request.param, quiet=True)
    assert result.summary["status"] == "completed" and result.summary["privacy"]["guarantee"] == request.param
    return request.param, result, json.loads((result.run_dir / "mlflow_run.json").read_text())["run_id"]


@pytest.mark.parametrize("tracked", list(CONFIGS), indirect=True)
def test_every_surface_shows_the_summarys_one_figure(tracked, tmp_path, capsys):
    kind, result, mlflow_run = tracked
    summary = result.summary
    quote = summary["privacy"]["headline"]
    assert "epsilon_headline" not in summary["privacy"] and "mi_epsilon_headline" not in summary["privacy"]
    value = quote["value"]
    text = EXPECTED_TEXT[kind](value)
    assert headline.quote_text(summary) == text
    if kind == "dp":
        assert quote["by"] == "rdp" and quote["paper_by"] == "zcdp" and value < quote["paper_value"]
        assert value == max(n["epsilon_tight"] for n in summary["nodes"].values())
        paper = f"{quote['paper_value']:.4g}"
    elif kind == "mi_dp":
        assert value == max(n["mi_epsilon_nats"] for n in summary["nodes"].values()) > 0
    else:
        assert value is None and quote["observer"] is None
    if kind != "none":
        [g] = summary["privacy_guarantees"]
        assert (quote["observer"], quote["secrecy"]) == (g["observer"], g["statement"])

    # The terminal's table.
    table = format_summary(summary)
    privacy_line = next(line for line in table.splitlines() if line.startswith("privacy"))
    if kind == "none":
        assert headline.NOT_PRIVATE in privacy_line
    else:
        assert re.search(rf"epsilon(-MI-DP)? {re.escape(text)}\b", privacy_line), privacy_line
    # `testbed runs`: the same text in its epsilon column, never "-" (and never the paper's figure).
    assert main(["runs", str(tmp_path / "runs")]) == 0
    [header, row] = capsys.readouterr().out.splitlines()
    column = header.index("epsilon")
    assert row[column:].startswith(text + " "), row
    if kind == "dp":
        assert paper not in row
    assert main(["runs", str(tmp_path / "runs"), "--json"]) == 0
    [listed] = json.loads(capsys.readouterr().out)
    assert listed["epsilon"] == (value if value is not None else "inf")
    assert listed["epsilon_unit"] == ("nats" if kind == "mi_dp" else None)
    # The watch page's card.
    assert summary_view(summary)["quote"] == {"text": text, "by": quote["by"], "observer": quote["observer"]}
    # The HTML report.
    page = html.unescape(write_report(result.run_dir).read_text(encoding="utf-8"))
    assert f'<td class="left">ε to quote</td><td>{text}</td>' in page
    # The API.
    assert load(result.run_dir).quote == quote

    rows = read_metrics(result.run_dir)
    # TensorBoard, read back with its own reader.
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(result.run_dir / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    said = acc.Tensors("privacy_quote/text_summary")[-1].tensor_proto.string_val[0].decode()
    assert said.startswith(f"epsilon to quote: {text}: ")
    # MLflow, read back with its own client on its default store: no URI, no environment variable.
    from mlflow.tracking import MlflowClient

    client = MlflowClient()
    run = client.get_run(mlflow_run)
    assert run.data.tags["testbed.epsilon"] == text
    history = {key: sorted(client.get_metric_history(mlflow_run, key), key=lambda m: m.step)
               for key in ("epsilon", *(f"nodes/epsilon/{n}" for n in summary["nodes"]))}
    if kind == "none":  # ε = ∞: no series anywhere, the tag says it
        assert "epsilon" not in acc.Tags()["scalars"] and not any(history.values())
        return
    # The per-round series of the quoted figure: one point a round, ending at the quoted value.
    series = acc.Scalars("epsilon")
    assert [p.step for p in series] == [m.step for m in history["epsilon"]] == [r["round"] for r in rows]
    assert series[-1].value == pytest.approx(value, rel=1e-6)  # TensorBoard keeps float32
    assert history["epsilon"][-1].value == pytest.approx(value, rel=1e-12)
    assert all(a.value <= b.value for a, b in zip(history["epsilon"], history["epsilon"][1:]))  # spent, never refunded
    # Per node by id: each node's series ends at that node's own figure.
    own = "epsilon_tight" if kind == "dp" else "mi_epsilon_nats"
    for node, entry in summary["nodes"].items():
        assert history[f"nodes/epsilon/{node}"][-1].value == pytest.approx(entry[own], rel=1e-12)
        assert acc.Scalars(f"nodes/epsilon/{node}")[-1].value == pytest.approx(entry[own], rel=1e-6)
    if kind == "dp":  # the paper's figure stays beside it, under its accountant's name
        paper_series = sorted(client.get_metric_history(mlflow_run, "epsilon_zcdp"), key=lambda m: m.step)
        assert [m.value for m in paper_series] == pytest.approx([r["epsilon"] for r in rows], rel=1e-12)


def test_an_older_summary_without_the_field_still_quotes_one_figure():
    """A summary written before ``privacy.headline`` (its nodes' ε only): every reader takes the
    same figure from it, the tight ε when its nodes have one."""
    older = {"privacy": {}, "budgets": {"delta": 1e-5, "accountant": "zcdp"},
             "nodes": {"0": {"epsilon": 4.0, "epsilon_tight": 1.5}, "1": {"epsilon": 3.0, "epsilon_tight": 1.2}}}
    assert headline.quote(older)["value"] == 1.5 and headline.quote_text(older) == "1.5"
    assert summary_view({**older, "status": "completed", "rounds": 3})["quote"]["text"] == "1.5"
