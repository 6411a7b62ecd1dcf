"""Where a scene run's nodes stand, in what the run leaves and in the live view: its summary records the
scene positions, server and first graph (testbed.topology.placement), the HTML report draws the nodes
there (from the summary alone), the watch page's graph is sent at the same positions; a damaged
record in a summary is one line in the report, not a traceback."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import testbed
from testbed.assembly import assemble
from testbed.assembly.experiment import experiment_config
from testbed.reports.html import write_report
from testbed.reports.scene_picture import placement_figure
from testbed.topology.scene import scene_geometry
from testbed.watch.feed import RunFeed
from scene_cases import SCENE_TOML


@pytest.fixture(scope="module")
def scene_run(tmp_path_factory):
    """A finished 2-round DWFL run of 6 nodes in the street canyon, and its config."""
    folder = tmp_path_factory.mktemp("placed")
    text = SCENE_TOML.format(cache=folder / "cache")
    (folder / "exp.toml").write_text(text)
    config = experiment_config(folder / "exp.toml")
    return testbed.run(config, out=folder / "run").dir, config


def test_the_summary_records_the_scene_positions_server_and_graph(scene_run):
    run_dir, config = scene_run
    record = json.loads((run_dir / "summary.json").read_text())["topology"]
    geometry = scene_geometry(config)
    assert record["scene"] == "simple_street_canyon"
    np.testing.assert_allclose(record["positions_m"], geometry.positions_m, atol=5e-4)
    np.testing.assert_allclose(record["server_m"], geometry.server_position_m, atol=5e-4)
    assert record["edges"] == assemble.graph_view(config).edges(0).tolist()


def test_the_html_report_draws_the_nodes_at_their_scene_positions(scene_run):
    from matplotlib.collections import LineCollection, PathCollection

    run_dir, config = scene_run
    page = write_report(run_dir).read_text()
    assert "<h2>Where the nodes stand</h2><img" in page
    record = json.loads((run_dir / "summary.json").read_text())["topology"]
    fig = placement_figure(record)
    nodes, server = [c for c in fig.axes[0].collections if isinstance(c, PathCollection)]
    np.testing.assert_allclose(nodes.get_offsets(), scene_geometry(config).positions_m[:, :2], atol=5e-4)
    np.testing.assert_allclose(server.get_offsets()[0], record["server_m"][:2])
    (links,) = [c for c in fig.axes[0].collections if isinstance(c, LineCollection)]
    assert len(links.get_segments()) == len(record["edges"])
    assert "simple_street_canyon" in fig.axes[0].get_title()
    import matplotlib.pyplot as plt

    plt.close(fig)


def test_the_watch_page_sends_the_graph_at_the_scene_positions(scene_run):
    run_dir, config = scene_run
    graph = json.loads(json.dumps(RunFeed(run_dir).poll()["graph"], allow_nan=False))
    assert graph["positions"] == scene_geometry(config).positions_m[:, :2].tolist()
    assert graph["edges"] == assemble.graph_view(config).edges(0).tolist()


def test_a_run_without_a_radio_placed_graph_records_and_draws_no_placement():
    assert placement_figure({"kind": "ring", "mean_degree": 2.0}) is None


def test_a_graph_without_links_is_drawn_with_its_nodes():
    import matplotlib.pyplot as plt

    fig = placement_figure({"positions_m": [[0.0, 0.0], [5.0, 1.0]], "edges": []})
    assert "0 links" in fig.axes[0].get_title() and sorted(t.get_text() for t in fig.axes[0].texts) == ["0", "1"]
    plt.close(fig)


GOOD = {"positions_m": [[0.0, 0.0, 1.5], [10.0, 5.0, 1.5]], "edges": [[0, 1]], "server_m": [1.0, 1.0, 10.0]}


@pytest.mark.parametrize("damage", [
    {"positions_m": [[0.0, "x"]]}, {"positions_m": [[0.0]]}, {"positions_m": [[0.0, 1.0], [1.0, 2.0, 3.0]]},
    {"positions_m": "here"}, {"positions_m": [[1e400, 0.0]]}, {"positions_m": [[True, 0.0]]},
    {"positions_m": [[0.0, 0.0]] * 501}, {"positions_m": [[10**400, 0.0]]}, {"edges": [[0, 2]]}, {"edges": [[0, -1]]}, {"edges": [[0, 1, 1]]},
    {"edges": "all"}, {"edges": [[0.5, 1]]}, {"server_m": [1.0]}, {"server_m": "up"}],
    ids=lambda d: json.dumps(d)[:40])
def test_a_damaged_placement_record_is_one_line(damage, tmp_path):
    with pytest.raises(ValueError) as caught:
        placement_figure({**GOOD, **damage})
    assert "\n" not in str(caught.value) and len(str(caught.value)) < 200


def test_the_report_of_a_damaged_record_says_so_and_stands(scene_run, tmp_path):
    from testbed.reports.summary_file import summary_digest

    run_dir, _ = scene_run
    copy = tmp_path / "run"
    copy.mkdir()
    for f in run_dir.iterdir():
        if f.is_file():
            (copy / f.name).write_bytes(f.read_bytes())
    summary = json.loads((copy / "summary.json").read_text())
    summary["topology"]["edges"] = [[0, 99]]
    body = {k: v for k, v in summary.items() if k != "sha256"}
    (copy / "summary.json").write_text(json.dumps({**body, "sha256": summary_digest(body)}))
    page = write_report(copy).read_text()
    assert "not drawn: the summary's topology.edges must be" in page and "<h2>Nodes</h2>" in page


_JSON = st.recursive(st.none() | st.booleans() | st.integers(-10, 10) | st.integers() | st.floats(allow_nan=True)
                     | st.text(max_size=3),
                     lambda inner: st.lists(inner, max_size=4), max_leaves=12)


@settings(max_examples=150, deadline=None)
@given(positions=_JSON, edges=_JSON, server=_JSON)
def test_any_record_a_file_may_hold_is_drawn_or_refused_in_one_line(positions, edges, server):
    """Whatever JSON a summary's topology holds, placement_figure draws it, finds nothing to draw, or
    raises ValueError (one line): never another exception."""
    import matplotlib.pyplot as plt

    try:
        fig = placement_figure({"positions_m": positions, "edges": edges, "server_m": server})
    except ValueError as exc:
        assert "\n" not in str(exc)
    else:
        if fig is not None:
            plt.close(fig)
