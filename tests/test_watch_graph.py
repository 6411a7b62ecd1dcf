"""The watch page's graph of a decentralised run (its algorithm's ``graph_view`` hook, fed by
testbed.watch.feed): the current round's edges and positions as the run's topology draws them,
sent again only when the round enters another block, and nothing drawn beyond the page's limits."""

from __future__ import annotations

import json

import numpy as np
import pytest

from testbed.assembly.config import load_config_text
from testbed.orchestration.runner import run_experiment
from testbed.topology import LinkBudget, Topology, TopologySection
from testbed.watch import channel_and_graph
from testbed.watch.feed import RunFeed
from topology_cases import dwfl_text, dwfl_topology  # noqa: F401  (a fixture)


@pytest.fixture(scope="module")
def metric_lines(tmp_path_factory) -> list[bytes]:
    """metrics.csv of a 6-round DWFL run of 12 nodes (its header first)."""
    result = run_experiment(load_config_text(dwfl_text()), out_dir=tmp_path_factory.mktemp("g") / "run", quiet=True)
    return (result.run_dir / "metrics.csv").read_bytes().splitlines(keepends=True)


def _live(tmp_path, text: str, metric_lines: list[bytes], rounds: int):
    (tmp_path / "config.toml").write_text(text)
    (tmp_path / "metrics.csv").write_bytes(b"".join(metric_lines[:rounds + 1]))
    return tmp_path


def _topology(text: str) -> Topology:
    c = load_config_text(text)
    budget = LinkBudget(power_w=1000.0, noise_power_w=1e-9, carrier_hz=c.dwfl.carrier_hz, area_m=c.dwfl.area_m)
    return Topology(c.topology, c.data.num_nodes, c.run.seed, link_budget=budget)


def test_the_complete_graph_of_dwfl_by_default(tmp_path, metric_lines):
    feed = RunFeed(_live(tmp_path, dwfl_text(), metric_lines, rounds=2))
    first = feed.poll()
    graph = json.loads(json.dumps(first["graph"], allow_nan=False))
    assert graph["edges"] == np.column_stack(np.triu_indices(12, 1)).tolist()
    assert graph["positions"] is None and graph["note"] is None and graph["block"] == 0 and graph["round"] == 2
    assert feed.snapshot()["graph"] == graph
    with open(tmp_path / "metrics.csv", "ab") as f:
        f.write(metric_lines[3])
    delta = feed.poll()
    assert len(delta["metrics"]) == 1 and "graph" not in delta  # the same block: not sent again


def test_a_redrawn_graph_is_sent_when_the_round_enters_another_block(tmp_path, metric_lines, dwfl_topology):
    text = dwfl_text(topology='kind = "k_regular"\ndegree = 3\ncoherence_rounds = 2')
    topo = _topology(text)
    feed = RunFeed(_live(tmp_path, text, metric_lines, rounds=1))
    graph = feed.poll()["graph"]
    assert graph["block"] == 0 and graph["edges"] == topo.graph(0).edges().tolist()
    with open(tmp_path / "metrics.csv", "ab") as f:
        f.write(metric_lines[2])  # round 1 done: still block 0
    assert "graph" not in feed.poll()
    with open(tmp_path / "metrics.csv", "ab") as f:
        f.write(metric_lines[3])  # round 2 done: block 1
    graph = feed.poll()["graph"]
    assert graph["block"] == 1 and graph["round"] == 3 and graph["edges"] == topo.graph(2).edges().tolist()
    assert topo.graph(2) != topo.graph(0)


def test_random_geometric_positions_are_the_runs(tmp_path, metric_lines, dwfl_topology):
    text = dwfl_text(topology='kind = "random_geometric"\nsnr_threshold_db = 45.0\nspeed_mps = 3.0\ncoherence_rounds = 1\n'
                              'allow_disconnected = true')
    topo = _topology(text)
    feed = RunFeed(_live(tmp_path, text, metric_lines, rounds=4))
    graph = feed.poll()["graph"]
    assert graph["block"] == 3 and graph["positions"] == topo.positions_m(3).tolist()
    assert graph["edges"] == topo.graph(3).edges().tolist() and 0 < len(graph["edges"]) < 66


def test_beyond_the_limits_nothing_is_drawn_and_the_page_says_why(tmp_path, metric_lines, monkeypatch):
    feed = RunFeed(_live(tmp_path, dwfl_text(num_nodes=600), [metric_lines[0]], rounds=0))
    feed.poll()
    graph = feed.snapshot()["graph"]
    assert graph == {"note": f"600 nodes: more than the page draws ({channel_and_graph.MAX_GRAPH_NODES})"}
    monkeypatch.setattr(channel_and_graph, "MAX_GRAPH_EDGES", 65)  # 12 nodes, 66 edges
    live = tmp_path / "edges"
    live.mkdir()
    feed = RunFeed(_live(live, dwfl_text(), metric_lines, rounds=1))
    graph = feed.poll()["graph"]
    assert "edges" not in graph and graph["note"] == "66 edges: more than the page draws (65)"


def test_a_run_without_a_graph_sends_none(tmp_path, small_config_text):
    result = run_experiment(load_config_text(small_config_text), out_dir=tmp_path / "run", quiet=True)
    feed = RunFeed(result.run_dir)
    assert "graph" not in feed.poll()
    assert feed.snapshot()["graph"] is None


def test_a_graph_the_config_cannot_draw_is_the_pages_error_not_a_traceback(tmp_path, metric_lines, dwfl_topology):
    text = dwfl_text(topology='kind = "file"\npath = "missing.txt"')
    feed = RunFeed(_live(tmp_path, text, metric_lines, rounds=1))
    delta = feed.poll()
    assert "graph" not in delta and feed.snapshot()["graph"] is None
    assert "the graph" in delta["run"]["errors"]["config.toml"] and "topology.path" in delta["run"]["errors"]["config.toml"]
    assert delta["run"]["rounds_done"] == 1  # the rest of the run is shown
