"""The algorithm contract, held to every registered algorithm (testbed.algorithms.registry).

For each: all nodes stacked equals one node at a time; the events a step emits are the events
planned for it; a budget refuses at the boundary; a checkpoint then ``--resume`` equals an
uninterrupted run; sim equals MQTT on the embedded broker, with and without Bernoulli stragglers.
The checks are testbed.orchestration.contract_suite's, which a plugin's own test runs on its
algorithm (`testbed new algorithm`: docs/extending.md).

A new algorithm adds its small experiment to EXPERIMENTS, nothing else.
"""

from __future__ import annotations

import pytest

from testbed.algorithms import registry
from testbed.assembly.config import load_config_text, replace
from testbed.orchestration import contract_suite as suite
from testbed.orchestration.runner import run_experiment
from testbed.util.registrations import plugin_of

COMMON = suite.COMMON
SYNTHETIC = '[data]\ndataset = "synthetic"\nnum_nodes = 5\nsamples_per_node = 60\ndim = 6\n'
#: The 8x8 digits and the small CNN of testbed.learning.torch_models (float32, all nodes stepped at once).
DIGITS_CNN = ('[data]\ndataset = "digits"\nnum_nodes = 5\nsamples_per_node = 60\n'
              '[model]\nkind = "torch"\nnetwork = "cnn"\n')

#: Five nodes on the street canyon's open ground, few rays (a trace of 0.1 s, cached for the suite).
SCENE = ('[dwfl.scene]\nmax_depth = 2\nsamples_per_source = 2000\n'
         '[topology]\nkind = "random_geometric"\nsnr_threshold_db = 0.0\nallow_disconnected = true\n')

#: A few rounds of every registered algorithm, and of the ones that train deep models with a CNN
#: ("name/cnn"). A case is its algorithm's section plus, for the CNN, the data and model above.
EXPERIMENTS = {
    "dp_pasgd": SYNTHETIC + '[dp_pasgd]\nsteps = 12\ntau = 2\nbatch = 8\nlr = 0.5\nsigma = 0.8\n',
    "dwfl": SYNTHETIC + '[dwfl]\nrounds = 6\nbatch = 8\nlr = 0.2\nepsilon = 1.0\nfading = "none"\nc_scale = 0.6\n',
    "dpsgd": SYNTHETIC + '[dpsgd]\nrounds = 6\nbatch = 8\nlr = 0.2\nepsilon = 1.0\nfading = "none"\n'
                         '[topology]\nkind = "ring"\n',
    "gossip": SYNTHETIC + '[gossip]\nrounds = 6\nbatch = 8\nlr = 0.2\nepsilon = 1.0\nfading = "rayleigh"\n'
                          'coherence_rounds = 2\n[topology]\nkind = "k_regular"\ndegree = 2\n',
    # Robust rules at the receivers (issue 40): each node gets its neighbours' payloads apart.
    "gossip/clip": SYNTHETIC + '[gossip]\nrounds = 6\nbatch = 8\nlr = 0.2\nepsilon = 1.0\nfading = "rayleigh"\n'
                               'aggregation = "self_centred_clip"\nclip_multiple = 0.05\n[topology]\nkind = "ring"\n',
    "dpsgd/trimmed_mean": SYNTHETIC + '[dpsgd]\nrounds = 6\nbatch = 8\nlr = 0.2\nepsilon = 1.0\nfading = "none"\n'
                                      'aggregation = "trimmed_mean"\n[topology]\nkind = "complete"\n',
    "dpsgd/median": SYNTHETIC + '[dpsgd]\nrounds = 6\nbatch = 8\nlr = 0.2\nsigma = 0.1\nfading = "none"\n'
                                'aggregation = "median"\n[topology]\nkind = "k_regular"\ndegree = 2\n',
    "fedavg": SYNTHETIC + '[fedavg]\nrounds = 6\nlocal_steps = 3\nbatch = 8\nlr = 0.5\n',
    "fedprox": SYNTHETIC + '[fedprox]\nrounds = 6\nlocal_steps = 3\nbatch = 8\nlr = 0.5\nmu = 0.5\n',
    "acfl": SYNTHETIC + '[model]\nkind = "linear"\n[acfl]\niterations = 6\nlr = 0.01\nsigma1_sq = 0.5\nsigma2_sq = 0.5\n',
    "padpfl": SYNTHETIC + '[padpfl]\nrounds = 6\nuploads = 2\nparticipation = "spread"\nlocal_steps = 3\nbatch = 8\nlr = 0.5\nclip = 2.0\n'
                          'epsilon = 20.0\nimpact = "given"\nweights = [0.1, 0.2, 0.3, 0.2, 0.2]\n',
    "dp_pasgd/cnn": DIGITS_CNN + '[dp_pasgd]\nsteps = 12\ntau = 2\nbatch = 8\nlr = 0.2\nsigma = 0.05\nclip = true\n'
                                 'lipschitz = 1.0\n',
    # DWFL on a ring (issue 32): each node hears its two neighbours, Rayleigh fading, variant A.
    "dwfl/ring": SYNTHETIC + '[dwfl]\nrounds = 6\nbatch = 8\nlr = 0.2\nepsilon = 1.0\nfading = "rayleigh"\n'
                             'variant = "A"\n[topology]\nkind = "ring"\n',
    # The radio ray traced in Sionna RT's street canyon (issue 45): the graph from the traced gains,
    # each sender's channel the coefficient traced to the server point; gossip's slots at each
    # node's weakest traced link.
    # DWFL's nodes walk: each two-round block re-traced, the graph redrawn with it.
    "dwfl/scene": SYNTHETIC + '[dwfl]\nrounds = 6\nbatch = 8\nlr = 0.2\nepsilon = 1.0\nfading = "none"\nc_scale = 0.6\n'
                              'pathloss = "scene"\npower_dbm = 20.0\nnoise_figure_db = 7.0\ncoherence_rounds = 2\n'
                              + SCENE.replace("samples_per_source = 2000\n", "samples_per_source = 2000\nspeed_mps = 10.0\n")
                              + 'coherence_rounds = 2\n',
    "gossip/scene": SYNTHETIC + '[gossip]\nrounds = 6\nbatch = 8\nlr = 0.2\nepsilon = 1.0\nfading = "rayleigh"\n'
                                'pathloss = "scene"\npower_dbm = 20.0\nnoise_figure_db = 7.0\n'
                                + SCENE.replace("dwfl.scene", "gossip.scene"),
    "padpfl/scene": SYNTHETIC + '[padpfl]\nrounds = 6\nlocal_steps = 3\nbatch = 8\nlr = 0.5\nclip = 2.0\nepsilon = 20.0\n'
                                'impact = "link_quality"\nlink_pathloss = "scene"\n'
                                '[padpfl.link_scene]\nmax_depth = 2\nsamples_per_source = 2000\n',
    "dwfl/cnn": DIGITS_CNN + '[dwfl]\nrounds = 6\nbatch = 8\nlr = 0.2\nepsilon = 1.0\nfading = "none"\nc_scale = 0.6\n',
    # PADPFL with DP-SGD local steps (issue 39): per-sample clipped, noised steps, each charged.
    "padpfl/dp_sgd": SYNTHETIC + '[padpfl]\nrounds = 6\nlocal_steps = 3\nbatch = 8\nlr = 0.5\nclip = 2.0\n'
                                 'epsilon = 20.0\nlocal_step = "dp_sgd"\nsample_clip = 1.0\nimpact = "equal"\n',
    "padpfl/cnn": DIGITS_CNN + '[padpfl]\nrounds = 6\nuploads = 2\nparticipation = "spread"\nlocal_steps = 3\nbatch = 8\nlr = 0.2\nclip = 5.0\n'
                               'epsilon = 20.0\nimpact = "given"\nweights = [0.1, 0.2, 0.3, 0.2, 0.2]\n',
}
CASES = list(EXPERIMENTS)
ATOL_STACKED, ATOL_MODES = suite.ATOL_STACKED, suite.ATOL_MODES
#: The algorithms built in; a plugin's is held to the contract by its own test (contract_suite).
ALGORITHMS = [name for name in registry.names() if not plugin_of("algorithm", name)]


def _config(name: str, **sections):
    config = load_config_text(_text(name))
    return replace(config, **sections) if sections else config


def _text(name: str) -> str:
    algorithm = name.split("/")[0]
    return COMMON.replace('name = "contract"', f'name = "contract"\nalgorithm = "{algorithm}"') + EXPERIMENTS[name]


_dtype = suite._dtype


def _built(name: str):
    return suite._built(_text(name))


_ledger_without_seconds = suite.ledger_without_seconds


def test_every_registered_algorithm_has_an_experiment_here():
    assert set(ALGORITHMS) == {name.split("/")[0] for name in CASES}, \
        "add the new algorithm's small experiment to EXPERIMENTS"


@pytest.mark.parametrize("check", suite.ALGORITHM_CHECKS, ids=suite.check_name)
@pytest.mark.parametrize("name", CASES)
def test_the_contract(name, check, tmp_path):
    """Each check of the suite (testbed.orchestration.contract_suite) on each case."""
    check(_text(name), tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("stragglers", [None, {"model": "bernoulli", "p": 0.3}], ids=["all", "bernoulli"])
@pytest.mark.parametrize("name", CASES)
def test_sim_equals_mqtt_on_the_embedded_broker(name, stragglers, tmp_path):
    suite.check_sim_equals_mqtt(_text(name), tmp_path, stragglers=stragglers)


@pytest.mark.slow
@pytest.mark.parametrize("name", ALGORITHMS)
def test_every_node_confirms_its_ledger_over_mosquitto(name, mosquitto_broker, tmp_path):
    """Over Mosquitto too (the contract's MQTT runs above use the embedded broker): each node's
    own ledger, reported at the stop, is at most what the summary says of it."""
    config = replace(_config(name), run={"mode": "mqtt"}, mqtt={"hosts": 2, "broker_url": mosquitto_broker.url},
                     stragglers={"model": "bernoulli", "p": 0.3})
    result = run_experiment(config, out_dir=tmp_path / "mqtt", quiet=True)
    assert result.summary["status"] == "completed"
    assert {n["ledger_check"] for n in result.summary["nodes"].values()} <= {"confirmed", "raised"}
