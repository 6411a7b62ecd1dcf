"""`testbed scene show`: the picture holds every node where the run places it, with its id, every
link of the run's first graph (the traced-gain graph `testbed topology show` prints), the scene's
buildings and, asked for, a node's radio map; bad input is a one-line refusal and no file."""

from __future__ import annotations

import numpy as np
import pytest

from testbed.assembly import assemble
from testbed.assembly.experiment import experiment_config
from testbed.cli import main
from testbed.topology.scene import scene_geometry
from scene_cases import SCENE_TOML  # noqa: E402  (tests/ is on the path, as topology_cases)


@pytest.fixture()
def scene_file(tmp_path):
    path = tmp_path / "scene.toml"
    path.write_text(SCENE_TOML.format(cache=tmp_path / "cache"))
    return path


@pytest.fixture()
def drawn(monkeypatch):
    """The figures `scene show` saves, kept open for the test to read (then saved as the command would)."""
    from testbed.reports import scene_picture

    figures = []
    save = scene_picture.save_figure

    def keep(fig, path):
        figures.append(fig)
        fig.savefig(path, format="png")
        return path

    monkeypatch.setattr(scene_picture, "save_figure", keep)
    yield figures
    for fig in figures:
        save(fig, "/dev/null")  # closes it


def _collections(fig, kind):
    return [c for c in fig.axes[0].collections if isinstance(c, kind)]


def test_the_picture_holds_every_node_link_and_building(scene_file, tmp_path, drawn, capsys):
    from matplotlib.collections import LineCollection, PathCollection, PolyCollection

    out = tmp_path / "scene.png"
    assert main(["scene", "show", str(scene_file), "-o", str(out)]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {out}"
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 20_000
    (fig,) = drawn
    config = experiment_config(scene_file)
    geometry = scene_geometry(config)
    edges = assemble.graph_view(config).edges(0)
    nodes, server = _collections(fig, PathCollection)
    assert np.allclose(nodes.get_offsets(), geometry.positions_m[:, :2])
    assert np.allclose(server.get_offsets(), geometry.server_position_m[None, :2])
    assert sorted(t.get_text() for t in fig.axes[0].texts) == sorted([*map(str, range(6)), "server"])
    (links,) = _collections(fig, LineCollection)
    assert 0 < len(edges) == len(links.get_segments())
    assert np.allclose(links.get_array(), 10 * np.log10(geometry.links.gain[edges[:, 0], edges[:, 1]]))
    (buildings,) = _collections(fig, PolyCollection)
    assert len(buildings.get_paths()) > 0 and not fig.axes[0].images  # no radio map unless asked


def test_a_radio_map_is_drawn_under_the_scene(scene_file, tmp_path, drawn):
    out = tmp_path / "coverage.png"
    assert main(["scene", "show", str(scene_file), "-o", str(out), "--radio-map", "2", "--cell", "4"]) == 0
    (fig,) = drawn
    (image,) = fig.axes[0].images
    shown = image.get_array()
    assert shown.count() > 0.2 * shown.size  # most of the open streets are reached
    assert any("from node 2" in ax.get_xlabel() for ax in fig.axes[1:])


def test_refusals_are_one_line_and_write_nothing(scene_file, tmp_path, capsys):
    no_scene = tmp_path / "plain.toml"
    head, scene_keys = SCENE_TOML.format(cache=tmp_path).split("[dwfl.scene]")
    no_scene.write_text(head.replace('pathloss = "scene"', 'pathloss = "free_space"') + "[topology]"
                        + scene_keys.split("[topology]")[1])
    unknown = tmp_path / "unknown.toml"
    unknown.write_text(scene_file.read_text().replace('"simple_street_canyon"', '"no_such_scene"'))
    out = tmp_path / "x.png"
    cases = [([str(tmp_path / "missing.toml")], "missing.toml"),
             ([str(no_scene)], "has no scene"),
             ([str(scene_file), "--radio-map", "6"], "nodes 0 to 5"),
             ([str(scene_file), "--radio-map", "-1"], "--radio-map"),
             ([str(scene_file), "--cell", "0"], "--cell"),
             ([str(unknown)], "no_such_scene")]
    for argv, words in cases:
        assert main(["scene", "show", *argv, "-o", str(out)]) == 2, argv
        err = capsys.readouterr().err.strip()
        assert words in err and "\n" not in err and "Traceback" not in err, (argv, err)
        assert not out.exists()
    for bad_out, words in ((tmp_path / "x.jpg", "PNG"), (tmp_path / "no" / "dir" / "x.png", "cannot write")):
        assert main(["scene", "show", str(scene_file), "-o", str(bad_out)]) == 2
        err = capsys.readouterr().err.strip()
        assert words in err and "\n" not in err, err
        assert not bad_out.exists()
