"""The ε figure: a bar per node for a few hundred nodes, the distribution over the nodes beyond."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from testbed.reports.plots import MAX_NODE_BARS, plot_epsilon  # noqa: E402


@pytest.mark.parametrize("nodes", [8, MAX_NODE_BARS, MAX_NODE_BARS + 1, 100_000])
def test_the_epsilon_figure_draws_a_bar_per_node_up_to_the_limit_then_a_histogram(nodes):
    eps = np.random.default_rng(0).uniform(1, 2, nodes).tolist()
    fig, ax = plt.subplots()
    plot_epsilon(ax, [str(i) for i in range(nodes)], eps, [e * 0.8 for e in eps], 2.5, 1e-5)
    bars = [p for p in ax.patches if isinstance(p, matplotlib.patches.Rectangle)]
    if nodes <= MAX_NODE_BARS:
        assert len(bars) == nodes and ax.get_xlabel() == "node"
    else:
        assert len(bars) == 40 and ax.get_ylabel() == f"nodes (of {nodes})"
        assert sum(b.get_height() for b in bars) == nodes  # every node counted once
    plt.close(fig)


def test_an_algorithm_without_a_cost_model_draws_accuracy_against_bytes_and_no_epsilon(tmp_path):
    from testbed.assembly.config import load_config_text
    from testbed.orchestration.runner import run_experiment

    text = ("[run]\nalgorithm = \"fedavg\"\n[data]\nnum_nodes = 3\nsamples_per_node = 40\ndim = 3\n"
            "[fedavg]\nrounds = 2\n[privacy]\ntight_accountant = \"none\"\n")
    result = run_experiment(load_config_text(text), out_dir=tmp_path / "r", quiet=True)
    # FedAvg adds no noise: not private, no finite ε to draw (the ε figure is for (ε, δ)-DP runs); it
    # has no cost units, so its accuracy is drawn against the bytes it sent (testbed.reports.cost_axis).
    assert {p.name for p in (result.run_dir / "figures").iterdir()} == {"progress.png", "cost.png"}


def test_the_figure_helper_draws_each_request_in_its_own_fork_and_says_a_failure(tmp_path):
    """Each requested set is drawn by a fork of the warmed-up helper, both at once; one that fails
    leaves the others drawn and its last error line is what the run logs."""
    from testbed.assembly.config import load_config_text
    from testbed.orchestration.runner import run_experiment
    from testbed.reports.plots import BackgroundFigures

    text = ("[data]\nnum_nodes = 3\nsamples_per_node = 40\ndim = 3\n"
            "[dp_pasgd]\nsteps = 4\ntau = 2\nbatch = 4\nsigma = 1.0\n[output]\nfigures = false\n")
    run_dir = run_experiment(load_config_text(text), out_dir=tmp_path / "r", quiet=True).run_dir
    assert not (run_dir / "figures").exists()
    job = BackgroundFigures()
    job.draw("progress", run_dir)
    job.draw("cost", run_dir)
    job.draw("epsilon", tmp_path / "nowhere")
    job.draw("epsilon", run_dir)
    problem = job.wait()
    assert problem is not None and "nowhere" in problem
    assert {p.name for p in (run_dir / "figures").iterdir()} == {"progress.png", "cost.png", "epsilon.png"}
