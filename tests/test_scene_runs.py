"""pathloss = "scene" (testbed.topology.scene): the radio of a run ray traced in a Sionna RT scene.
Its keys checked like every section's; the graph from the traced gains; DWFL's channel, gossip's
link costs and PADPFL's link quality from the traces; walking nodes re-traced each block on open
ground; a run from the command line. sim == MQTT is tests/test_algorithm_contract.py's dwfl/scene
and gossip/scene."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from channel import free_space_pathloss_db
from channel.scene import geometry
from testbed.algorithms.dwfl_channel import radio_from_section, round_channel
from testbed.algorithms.gossip_channel import Links
from testbed.algorithms.impact import link_quality_weights
from testbed.assembly.config import load_config_text
from testbed.errors import ConfigError
from testbed.topology import Topology
from testbed.topology.scene import SceneKeys, SceneSection, SceneSite, scene_geometry

RADIO = 'power_dbm = 20.0\nnoise_figure_db = 7.0\ncarrier_hz = 3.5e9\n'


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("scene-cache"))


def _dwfl(cache: str, scene: str = "", topology: str = 'kind = "random_geometric"\nsnr_threshold_db = 20.0\n'
          'allow_disconnected = true\n', dwfl: str = "", nodes: int = 8):
    return load_config_text(
        f'[run]\nalgorithm = "dwfl"\nseed = 1\n[data]\ndataset = "synthetic"\nnum_nodes = {nodes}\n'
        f'samples_per_node = 20\ndim = 4\n[dwfl]\nrounds = 4\nepsilon = 1.0\nfading = "none"\npathloss = "scene"\n'
        f'{RADIO}{dwfl}[dwfl.scene]\nmax_depth = 2\nsamples_per_source = 3000\ncache_dir = "{cache}"\n{scene}'
        f'[topology]\n{topology}')


@pytest.mark.parametrize("line, key", [
    ("name = \"Street Canyon\"", "name"),
    ("placement = \"roof\"", "placement"),
    ("region_m = [10.0, 0.0, 0.0, 5.0]", "region_m"),
    ("antenna_height_m = -1.0", "antenna_height_m"),
    ("polarization = \"cross\"", "polarization"),
    ("placement = \"file\"", "positions_path"),
    ("rays = 3", "rays"),
])
def test_a_bad_scene_line_is_one_line_naming_its_key(cache, line, key):
    with pytest.raises(ConfigError) as err:
        _dwfl(cache, scene=line + "\n")
    assert key in str(err.value) and "\n" not in str(err.value)


def test_scene_keys_without_pathloss_scene_are_refused():
    with pytest.raises(ConfigError, match="scene: matters only with pathloss"):
        load_config_text('[run]\nalgorithm = "dwfl"\n[dwfl]\nrounds = 2\n[dwfl.scene]\nmax_depth = 1\n')


def test_an_unknown_scene_is_one_line_before_round_one(cache, tmp_path):
    path = tmp_path / "x.toml"
    path.write_text('[run]\nalgorithm = "dwfl"\n[data]\ndataset = "synthetic"\nnum_nodes = 4\nsamples_per_node = 20\n'
                    f'dim = 4\n[dwfl]\nrounds = 2\nbatch = 8\npathloss = "scene"\n{RADIO}[dwfl.scene]\nname = "atlantis"\n'
                    f'cache_dir = "{cache}"\n')
    out = subprocess.run([sys.executable, "-m", "testbed", "run", str(path), "--mode", "sim", "--out",
                          str(tmp_path / "run")], capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr
    assert "'atlantis' is not a Sionna RT scene" in out.stderr and "Traceback" not in out.stderr
    (refusal,) = [line for line in out.stderr.splitlines() if line.startswith("testbed:")]  # after the setup's progress
    assert refusal.startswith("testbed: config error: scene: 'atlantis'")


def test_the_graph_is_the_snr_threshold_on_the_traced_gains(cache):
    config = _dwfl(cache)
    geo = scene_geometry(config)
    assert geometry.open_ground(geo.spec, geo.positions_m[:, :2]).all()
    topology = Topology(config.topology, 8, config.run.seed, config.dwfl.link_budget())
    p, sm = config.dwfl.power_w, config.dwfl.noise_power_w_resolved
    snr_db = 10 * np.log10(np.maximum(p * geo.links.gain / (2 * sm), 1e-300))
    expected = {(i, k) for i in range(8) for k in range(i + 1, 8) if snr_db[i, k] >= 20.0}
    assert {tuple(e) for e in topology.graph(0).edges().tolist()} == expected
    # The site shadows: some pair within free space's range at this budget is not joined.
    free_range_m = config.dwfl.link_budget().range_m(20.0)
    d = np.linalg.norm(geo.positions_m[:, None, :2] - geo.positions_m[None, :, :2], axis=-1)
    assert any(d[i, k] < free_range_m for i in range(8) for k in range(i + 1, 8) if (i, k) not in expected)
    np.testing.assert_array_equal(topology.positions_m(0), geo.positions_m[:, :2])


def test_dwfls_channel_is_the_coefficient_traced_to_the_server(cache):
    config = _dwfl(cache, topology='kind = "complete"\n')
    radio = radio_from_section(config.dwfl, 8)
    geo = scene_geometry(config)
    rc = round_channel(radio, config.run.seed, 0)
    assert np.array_equal(rc.h, geo.site.server_coefficient(0)) and np.all(rc.h != 0)
    np.testing.assert_allclose(rc.gains, np.abs(rc.h))  # the phase pre-compensated
    server = geo.server_position_m
    assert geometry.open_ground(geo.spec, server[None, :2])[0]  # the canyon's middle crossing


def test_walking_nodes_are_retraced_each_block_on_open_ground(cache):
    config = _dwfl(cache, scene="speed_mps = 5.0\nround_s = 2.0\n", dwfl="coherence_rounds = 2\n",
                   topology='kind = "random_geometric"\nsnr_threshold_db = 20.0\nallow_disconnected = true\n'
                            'coherence_rounds = 2\n')
    site = scene_geometry(config).site
    positions = [site.positions_m(b).copy() for b in range(4)]
    for a, b in zip(positions, positions[1:]):
        step = np.linalg.norm(b[:, :2] - a[:, :2], axis=1)
        assert np.all(step <= 5.0 * 2.0 * 2 + 1e-9) and np.any(step > 0)
    assert all(geometry.open_ground(site.spec, p[:, :2]).all() for p in positions)
    radio = radio_from_section(config.dwfl, 8)
    h = [round_channel(radio, config.run.seed, r).h for r in range(6)]
    assert np.array_equal(h[0], h[1]) and not np.array_equal(h[1], h[2])  # a block is two rounds
    np.testing.assert_array_equal(site.positions_m(1), positions[1])  # block 1 again: the same walk
    topology = Topology(config.topology, 8, config.run.seed, config.dwfl.link_budget())
    np.testing.assert_array_equal(topology.positions_m(2), positions[1][:, :2])  # the graph walks with them


def test_gossip_slots_are_at_each_nodes_weakest_traced_link(cache):
    config = load_config_text(
        '[run]\nalgorithm = "gossip"\nseed = 1\n[data]\ndataset = "synthetic"\nnum_nodes = 8\nsamples_per_node = 20\n'
        f'dim = 4\n[gossip]\nrounds = 2\nepsilon = 1.0\nfading = "none"\npathloss = "scene"\n{RADIO}'
        f'[gossip.scene]\nmax_depth = 2\nsamples_per_source = 3000\ncache_dir = "{cache}"\n'
        '[topology]\nkind = "random_geometric"\nsnr_threshold_db = 20.0\nallow_disconnected = true\n')
    a = config.gossip
    topology = Topology(config.topology, 8, 1, a.link_budget())
    links = Links(topology, a.radio(8), 1, payload_bits=64)
    graph, gain = topology.graph(0), topology.scene_site().node_gain(0)
    cost = links.round_links(0)
    for k in range(8):
        nbrs = graph.neighbours(k)
        expected = gain[nbrs, k].min() if len(nbrs) else 0.0
        assert cost.weakest_gain[k] == pytest.approx(expected, rel=1e-12)


def test_padpfls_link_quality_reads_the_traced_uplinks(cache):
    keys = SceneKeys.of(SceneSection(max_depth=2, samples_per_source=3000, cache_dir=cache), 3.5e9, 1e6, None)
    p = link_quality_weights(6, 0, pathloss="scene", area_m=100.0, carrier_hz=3.5e9, power_dbm=20.0,
                             noise_dbm=-100.0, scene=keys)
    h = keys.site(6, 0).server_coefficient(0)
    rate = np.log2(1 + 0.1 * np.abs(h) ** 2 / 1e-13)
    np.testing.assert_allclose(p, rate / rate.sum(), rtol=1e-9)


def test_positions_from_a_file_and_a_bad_one(cache, tmp_path):
    good = tmp_path / "pos.txt"
    good.write_text("# x y [z], m\n-40 0\n0 0 2.5\n35, 2\n-20 -45\n")
    config = _dwfl(cache, scene=f'placement = "file"\npositions_path = "{good}"\n', nodes=4,
                   topology='kind = "complete"\n')
    pos = scene_geometry(config).positions_m
    np.testing.assert_allclose(pos[:, :2], [[-40, 0], [0, 0], [35, 2], [-20, -45]])
    assert pos[1, 2] == 2.5 and pos[0, 2] == pytest.approx(1.5, abs=0.05)
    bad = tmp_path / "bad.txt"
    bad.write_text("1 2\nthree 4\n")
    config = _dwfl(cache, scene=f'placement = "file"\npositions_path = "{bad}"\n', nodes=2, topology='kind = "complete"\n')
    with pytest.raises(ConfigError, match=r"bad.txt:2: expected 'x y' or 'x y z'"):
        scene_geometry(config)


@pytest.mark.parametrize("scene, topology, key", [
    ("", 'kind = "random_geometric"\nspeed_mps = 1.0\n', "topology.speed_mps"),
    ("speed_mps = 1.0\n", 'kind = "random_geometric"\ncoherence_rounds = 3\n', "topology.coherence_rounds"),
])
def test_a_scenes_nodes_are_placed_and_walked_by_the_scene_alone(cache, scene, topology, key, tmp_path):
    path = tmp_path / "x.toml"
    path.write_text('[run]\nalgorithm = "dwfl"\n[data]\ndataset = "synthetic"\nnum_nodes = 4\nsamples_per_node = 20\n'
                    f'dim = 4\n[dwfl]\nrounds = 2\nbatch = 8\npathloss = "scene"\ncoherence_rounds = 2\n{RADIO}'
                    f'[dwfl.scene]\ncache_dir = "{cache}"\n{scene}[topology]\n{topology}')
    out = subprocess.run([sys.executable, "-m", "testbed", "run", str(path), "--mode", "sim", "--out",
                          str(tmp_path / "run")], capture_output=True, text=True, timeout=300)
    assert out.returncode == 2 and f"config error: {key}:" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


def test_in_the_empty_scene_dwfls_channel_is_friis_to_the_server(cache):
    """Line of sight only, no object: each sender's gain to the server point is free space's."""
    config = _dwfl(cache, scene='name = "empty"\nregion_m = [-200.0, 200.0, -200.0, 200.0]\n', topology='kind = "complete"\n')
    radio = radio_from_section(config.dwfl, 8)
    geo = scene_geometry(config)
    d = np.linalg.norm(geo.positions_m - geo.server_position_m, axis=1)
    friis = 10.0 ** (-free_space_pathloss_db(d, 3.5e9) / 20.0)
    np.testing.assert_allclose(np.abs(round_channel(radio, config.run.seed, 0).h), friis, rtol=1e-5)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=st.text(max_size=200))
def test_any_positions_file_is_positions_or_one_line(cache, tmp_path, text):
    """A positions file is what a user typed: any text gives the nodes' positions or a ConfigError
    naming scene.positions_path in one line, never a traceback."""
    path = tmp_path / "pos.txt"
    path.write_text(text, encoding="utf-8")
    config = _dwfl(cache, scene=f'placement = "file"\npositions_path = "{path}"\n', nodes=2, topology='kind = "complete"\n')
    site = SceneSite(config.dwfl.scene, 2, 0, 3.5e9, 1e6)
    try:
        pos = site.positions_m(0)
    except ConfigError as exc:
        assert exc.key == "scene.positions_path" and "\n" not in str(exc)
    else:
        assert pos.shape == (2, 3) and np.all(np.isfinite(pos))


def test_an_indoor_region_stands_its_nodes_on_the_floor_not_the_ceiling(cache):
    """Sionna RT's box: a closed room, no open sky. placement = "region" puts the nodes on its floor."""
    config = _dwfl(cache, scene='name = "box"\nplacement = "region"\nregion_m = [-4.0, 4.0, -4.0, 4.0]\n'
                                'server_position_m = [0.0, 0.0, 2.5]\n', topology='kind = "complete"\n', nodes=4)
    geo = scene_geometry(config)
    np.testing.assert_allclose(geo.positions_m[:, 2], 1.5, atol=1e-5)  # the floor is z = 0, the ceiling 5 m up
    assert np.all(geo.links.gain[~np.eye(4, dtype=bool)] > 0)
