"""Client sampling: the draw, the config, a sampled run in sim and over MQTT, and what is charged."""

from collections import Counter

import numpy as np
import pytest

from testbed.assembly.config import load_config_text, replace
from testbed.errors import ConfigError
from testbed.ledger.files import read_ledger
from testbed.orchestration.runner import run_experiment
from testbed.reports.results import read_checkpoint, read_metrics
from testbed.rounds.client_sampling import ClientSamplingSection, sample_clients


def test_uniform_draws_exactly_count_nodes_and_each_node_about_equally_often():
    section = ClientSamplingSection(method="uniform", fraction=0.1)
    counts = Counter()
    for r in range(2000):
        chosen = sample_clients(section, seed=3, round_index=r, node_ids=range(50))
        assert len(chosen) == 5 and len(set(chosen)) == 5 and list(chosen) == sorted(chosen)
        counts.update(chosen)
    expected = 2000 * 5 / 50
    assert all(abs(counts[n] - expected) < 5 * np.sqrt(expected) for n in range(50))


def test_poisson_samples_each_node_with_its_probability():
    section = ClientSamplingSection(method="poisson", fraction=0.2)
    sizes = [len(sample_clients(section, seed=0, round_index=r, node_ids=range(100))) for r in range(500)]
    assert abs(np.mean(sizes) - 20) < 1.0 and min(sizes) < 20 < max(sizes)


def test_a_nodes_draw_is_its_own_whatever_the_other_nodes():
    section = ClientSamplingSection(method="poisson", fraction=0.5)
    everyone = set(sample_clients(section, seed=1, round_index=7, node_ids=range(40)))
    evens = set(sample_clients(section, seed=1, round_index=7, node_ids=range(0, 40, 2)))
    assert evens == {n for n in everyone if n % 2 == 0}


@pytest.mark.parametrize("values,key", [
    ({"method": "uniform"}, "client_sampling.fraction"),
    ({"method": "uniform", "fraction": 0.5, "count": 2}, "client_sampling.fraction"),
    ({"method": "poisson", "count": 2}, "client_sampling.fraction"),
    ({"method": "all", "fraction": 0.5}, "client_sampling.method"),
    ({"method": "uniform", "fraction": 1.5}, "client_sampling.fraction"),
    ({"method": "uniform", "count": 0}, "client_sampling.count"),
])
def test_bad_sampling_names_the_key(small_config_text, values, key):
    text = small_config_text + "[client_sampling]\n" + "".join(
        f"{k} = {v!r}\n".replace("'", '"') for k, v in values.items())
    with pytest.raises(ConfigError) as err:
        load_config_text(text)
    assert str(err.value).startswith(f"config error: {key}: "), err.value


def test_an_algorithm_that_needs_every_node_refuses_sampling():
    text = '[run]\nalgorithm = "dwfl"\n[data]\nnum_nodes = 4\n[client_sampling]\nmethod = "uniform"\ncount = 2\n'
    with pytest.raises(ConfigError, match="client_sampling.method: dwfl needs every node"):
        load_config_text(text)


def _sampled(small_config_text, **sampling):
    config = load_config_text(small_config_text.replace("num_nodes = 4", "num_nodes = 8"))
    return replace(config, client_sampling=sampling)


def test_a_node_not_sampled_spends_nothing_and_is_no_straggler(small_config_text, tmp_path):
    config = _sampled(small_config_text, method="uniform", count=3)
    result = run_experiment(config, out_dir=tmp_path / "r", quiet=True)
    events = list(read_ledger(tmp_path / "r" / "ledger.csv"))
    by_round = {}
    for e in events:
        by_round.setdefault(e.round, set()).add(e.node)
    assert all(e.kind != "straggle" for e in events)
    for r, nodes in by_round.items():
        assert nodes == set(sample_clients(config.client_sampling, seed=1, round_index=r, node_ids=range(8)))
    rounds = {int(n): s["rounds"] for n, s in result.summary["nodes"].items()}
    assert sum(rounds.values()) == 3 * result.summary["rounds"] and min(rounds.values()) < max(rounds.values())
    for n, node in result.summary["nodes"].items():
        assert node["epsilon"] > 0 and node["cost_units"] > 0 and rounds[int(n)] > 0
    # Nodes never sampled are counted, not listed: a million-node run lists the ones that took part.
    assert set(rounds) == set().union(*by_round.values())
    assert result.summary["idle_nodes"] == 8 - len(rounds)
    assert [int(row["stragglers"]) for row in read_metrics(tmp_path / "r")] == [0] * result.summary["rounds"]
    said = result.summary["client_sampling"]
    assert said["method"] == "uniform" and said["nodes_per_round"] == 3 and said["amplification_claimed"] is False


def test_emulated_stragglers_are_drawn_among_the_sampled(small_config_text, tmp_path):
    config = replace(_sampled(small_config_text, method="poisson", fraction=0.5),
                     stragglers={"model": "bernoulli", "p": 0.5})
    run_experiment(config, out_dir=tmp_path / "r", quiet=True)
    for e in read_ledger(tmp_path / "r" / "ledger.csv"):
        assert e.node in sample_clients(config.client_sampling, seed=1, round_index=e.round, node_ids=range(8))


@pytest.mark.slow
def test_sampled_sim_equals_mqtt(small_config_text, tmp_path):
    config = _sampled(small_config_text, method="uniform", fraction=0.5)
    sim = run_experiment(config, out_dir=tmp_path / "sim", quiet=True)
    mqtt = run_experiment(replace(config, run={"mode": "mqtt"}, mqtt={"hosts": 2}), out_dir=tmp_path / "mqtt",
                          quiet=True)
    assert sim.summary["status"] == mqtt.summary["status"] == "completed"
    np.testing.assert_allclose(read_checkpoint(tmp_path / "mqtt").state["model"],
                               read_checkpoint(tmp_path / "sim").state["model"], rtol=0, atol=1e-9)
    rounds = {n: s["rounds"] for n, s in sim.summary["nodes"].items()}
    assert rounds == {n: s["rounds"] for n, s in mqtt.summary["nodes"].items()}
    assert min(rounds.values()) < max(rounds.values())
