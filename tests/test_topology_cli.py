"""`testbed topology show`: what it prints is the run's graph (the topology a run of the same file
draws), its --edges file runs again as kind = "file" to the same graph, and a bad input is a
one-line refusal."""

from __future__ import annotations

import numpy as np
import pytest

from testbed.assembly.config import load_config_text
from testbed.cli import main
from testbed.topology import LinkBudget, Topology, mixing_weights, spectral_gap
from topology_cases import dwfl_text, dwfl_topology  # noqa: F401  (a fixture)


def _show(capsys, path, *extra) -> dict[str, str]:
    assert main(["topology", "show", str(path), *extra]) == 0
    lines = capsys.readouterr().out.splitlines()
    return dict(line.split(": ", 1) for line in lines if not line.startswith("wrote "))


def _write(tmp_path, text, name="exp.toml"):
    path = tmp_path / name
    path.write_text(text)
    return path


def test_the_default_is_the_complete_graph(tmp_path, capsys):
    shown = _show(capsys, _write(tmp_path, dwfl_text(num_nodes=12)))
    assert shown["kind"] == "complete" and shown["nodes"] == "12" and shown["connected"] == "yes"
    assert shown["edges"].startswith("66 (round 1, block 0") and shown["degrees"] == "min 11, mean 11, max 11"
    # DWFL's auto rule is uniform (over the air): that rule's gap alone, 1 − 1/(N − 1).
    assert shown["mixing"] == "uniform (auto: the algorithm's, over the air)"
    assert shown["spectral gap"] == "0.909090909091 (uniform)"


GOSSIP = """
[run]
name = "g"
algorithm = "{algorithm}"
seed = 3
[data]
dataset = "synthetic"
num_nodes = 8
samples_per_node = 40
dim = 4
[{algorithm}]
rounds = 4
batch = 8
lr = 0.2
epsilon = 1.0
fading = "none"
[topology]
kind = "ring"
[output]
figures = false
"""


@pytest.mark.parametrize("algorithm", ["gossip", "dpsgd"])
def test_an_exchange_over_separate_links_shows_the_one_mixing_it_uses(tmp_path, capsys, algorithm):
    """gossip and D-PSGD weight the graph by Metropolis-Hastings under auto: that rule, and its gap,
    are the ones shown (the run's own W, testbed.topology.Topology.mixing)."""
    from testbed.algorithms.gossip_channel import DEFAULT_MIXING

    text = GOSSIP.format(algorithm=algorithm)
    shown = _show(capsys, _write(tmp_path, text))
    assert shown["mixing"] == "metropolis_hastings (auto: the algorithm's, over separate links)"
    c = load_config_text(text)
    w = Topology(c.topology, 8, c.run.seed).mixing(0, DEFAULT_MIXING)
    assert shown["spectral gap"] == f"{round(spectral_gap(w), 12):.12g} (metropolis_hastings)"


def test_a_ring_written_out_runs_again_as_the_same_graph(tmp_path, capsys, dwfl_topology):
    path = _write(tmp_path, dwfl_text(num_nodes=10, topology='kind = "ring"\nmixing = "metropolis_hastings"'))
    edges = tmp_path / "ring.txt"
    shown = _show(capsys, path, "--round", "4", "--edges", str(edges))
    lines = edges.read_text().splitlines()
    assert lines[0].startswith("#") and lines[1:] == ["0 1", "0 9"] + [f"{i} {i + 1}" for i in range(1, 9)]
    assert shown["degrees"] == "min 2, mean 2, max 2" and shown["mixing"] == "metropolis_hastings"
    expected_gap = 1 - (1 / 3 + 2 / 3 * np.cos(2 * np.pi / 10))
    assert float(shown["spectral gap"].split()[0]) == pytest.approx(expected_gap, abs=1e-11)
    again = _show(capsys, _write(tmp_path, dwfl_text(num_nodes=10, topology=f'kind = "file"\npath = "{edges.name}"\n'
                                                                               'mixing = "metropolis_hastings"'), "f.toml"),
                  "--round", "4")
    assert {k: again[k] for k in ("edges", "degrees", "connected", "spectral gap")} == \
        {k: shown[k] for k in ("edges", "degrees", "connected", "spectral gap")}


def test_a_redrawn_graph_is_the_rounds_own(tmp_path, capsys, dwfl_topology):
    text = dwfl_text(num_nodes=16, topology='kind = "k_regular"\ndegree = 3\ncoherence_rounds = 2\nmixing = "uniform"')
    path = _write(tmp_path, text)
    c = load_config_text(text)
    topo = Topology(c.topology, 16, c.run.seed)
    for round_number in (1, 2, 3):
        out = tmp_path / f"r{round_number}.txt"
        shown = _show(capsys, path, "--round", str(round_number), "--edges", str(out))
        pairs = np.loadtxt(out, dtype=np.int64, comments="#")
        assert pairs.tolist() == topo.graph(round_number - 1).edges().tolist()
        gap = spectral_gap(mixing_weights(topo.graph(round_number - 1), "uniform"))
        assert shown["spectral gap"] == f"{round(gap, 12):.12g} (uniform)"
        assert shown["edges"] == f"24 (round {round_number}, block {(round_number - 1) // 2} of every 2 rounds)"
    assert (tmp_path / "r1.txt").read_text().splitlines()[1:] == (tmp_path / "r2.txt").read_text().splitlines()[1:]
    assert (tmp_path / "r1.txt").read_text().splitlines()[1:] != (tmp_path / "r3.txt").read_text().splitlines()[1:]


def test_random_geometric_says_its_range(tmp_path, capsys, dwfl_topology):
    text = dwfl_text(topology='kind = "random_geometric"\nsnr_threshold_db = 45.0\nallow_disconnected = true')
    shown = _show(capsys, _write(tmp_path, text))
    c = load_config_text(text)
    budget = LinkBudget(power_w=1000.0, noise_power_w=1e-9, carrier_hz=c.dwfl.carrier_hz, area_m=c.dwfl.area_m)
    assert shown["range"].startswith(f"{budget.range_m(45.0):.6g} m (free space: SNR >= 45 dB")
    g = Topology(c.topology, 12, c.run.seed, link_budget=budget).graph(0)
    assert shown["edges"].startswith(f"{g.num_edges} (round 1")


def _refused(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("testbed: ") and "Traceback" not in err
    return err


def test_bad_input_is_a_one_line_refusal(tmp_path, capsys, small_config_file, dwfl_topology):
    assert "dp_pasgd is not a decentralised algorithm" in _refused(capsys, ["topology", "show", str(small_config_file)])
    assert "not found" in _refused(capsys, ["topology", "show", str(tmp_path / "none.toml")])
    path = _write(tmp_path, dwfl_text())
    assert "--round" in _refused(capsys, ["topology", "show", str(path), "--round", "0"])
    assert "cannot write" in _refused(capsys, ["topology", "show", str(path), "--edges", str(tmp_path)])
    garbage = _write(tmp_path, "0 1\n1 two\n", "g.txt")
    err = _refused(capsys, ["topology", "show", str(path), "--set", "topology.kind=file", "--set", f"topology.path={garbage}"])
    assert "topology.path" in err and ":2:" in err
    err = _refused(capsys, ["topology", "show", str(path), "--set", "topology.kind=ring", "--set", "topology.degree=3"])
    assert "topology.degree" in err
