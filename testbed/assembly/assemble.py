"""Builds an experiment's parts from its config: the data a set of nodes holds, the model, and the
algorithm (with its channel half and the watch page's view of it) from the algorithm registry.

Shared by the sim runner (all nodes in one process) and the node agent (one node on a board), so
both build exactly the same things from the same experiment file.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from testbed.assembly.config import Config, ModelSection
from testbed.assembly.evaluation import evaluated_node_ids
from testbed.data import registry as data_registry
from testbed.data.federated import FederatedData
from testbed.data.lazy import LazyFederatedData
from testbed.data.section import DataSection
from testbed.errors import ConfigError
from testbed.learning.models import Model, build_model

if TYPE_CHECKING:
    from testbed.algorithms.contract import Algorithm, ChannelHalf, ChannelView, GraphView
    from testbed.algorithms.registry import Registration


def _loader_options(d: DataSection, train_only: bool = False) -> dict[str, Any]:
    """The options of the ``[data]`` section that the dataset's loader takes (testbed.data.load_dataset)."""
    reg = data_registry.get(d.dataset)
    return dict(reg.options(d), **reg.train_only) if train_only else reg.options(d)


def load_data(d: DataSection, seed: int, nodes: Sequence[int] | None = None, path: str | None = None,
              train_only: bool = False) -> FederatedData:
    """The ``[data]`` section's federated data set for the run's ``seed`` (see
    testbed.data.load_dataset), or only ``nodes`` of it (a board's own), read from ``path`` when
    given instead of data.path; ``train_only``: the synthetic set without test and validation rows."""
    from testbed.data import load_dataset

    options = _loader_options(d, train_only)
    if nodes is not None:
        options["nodes"] = list(nodes)  # a board loads (or generates) only its own samples
    data = load_dataset(d.dataset, seed=seed, path=path or d.path, scaling=d.scaling, **options)
    return data.astype(d.dtype)  # the generator writes its dtype itself; a loaded set is rounded here


def holds_lazily(config: Config) -> bool:
    """Whether a run's nodes are lazy (testbed.data.lazy): with client sampling, on a set that makes
    a node's rows again from its own stream (the synthetic set) or a file-based one (its federation
    written once to the cache and memory-mapped, a node's rows gathered from it). A generated set
    that does neither (regression) is held whole. In sim the run's process then holds the rows of
    a round's sampled nodes only; over MQTT the coordinator (which steps no node) holds none but
    the evaluated nodes' (testbed.assembly.evaluation), and an emulated host makes its nodes' rows
    when they are first asked (nodes.shared_experiment.SharedExperiment): memory follows the
    sampled and the evaluated nodes, not N, and a run evaluates, plans and steps on the same rows
    in either mode."""
    reg = data_registry.get(config.data.dataset)
    return config.client_sampling.method != "all" and (reg.lazy is not None or reg.source_files is not None)


def load_run_data(config: Config) -> FederatedData | LazyFederatedData:
    """What the run's own process holds for its nodes: every node's rows, or only their layout when
    the nodes are lazy (:func:`holds_lazily`). A synthetic set evaluated on a subset of nodes
    (``output.eval_nodes``) holds only its training rows: :func:`load_evaluation_data` makes the
    evaluated nodes' own."""
    d = config.data
    reg = data_registry.get(d.dataset)
    if holds_lazily(config) and reg.lazy is not None:
        return reg.lazy(d, config.run.seed)
    if holds_lazily(config):
        from testbed.data import source_files
        from testbed.data.mapped import federation_dir

        params = dict(_loader_options(d), dataset=d.dataset, seed=config.run.seed, scaling=d.scaling, dtype=d.dtype)
        directory = federation_dir(params, source_files(d.dataset, d.path))
        return LazyFederatedData.memory_mapped(directory, lambda: load_data(d, config.run.seed))
    subset = evaluated_node_ids(d.num_nodes, config.output.eval_nodes, config.run.seed) is not None
    return load_data(d, config.run.seed, train_only=subset and reg.lazy is not None)


def load_evaluation_data(config: Config, data: FederatedData | LazyFederatedData) -> FederatedData:
    """The rows the model is evaluated on (testbed.assembly.evaluation): every node's, or the evaluated
    nodes' (``output.eval_nodes``): generated again for a set that makes a node's rows from its own
    stream (the synthetic set: the same rows), made by the lazy federation of a file-based set, else
    selected from ``data``, the whole federation's."""
    d = config.data
    regenerated = data_registry.get(d.dataset).lazy is not None
    ids = evaluated_node_ids(d.num_nodes, config.output.eval_nodes, config.run.seed)
    if isinstance(data, LazyFederatedData) and not regenerated:
        return data.nodes(data.node_ids if ids is None else ids.tolist())
    if ids is None:
        return load_data(d, config.run.seed) if isinstance(data, LazyFederatedData) else data
    if regenerated:
        return load_data(d, config.run.seed, nodes=ids.tolist())
    position = {node: i for i, node in enumerate(data.node_ids)}
    return data.select([position[int(node)] for node in ids])


def model_for(m: ModelSection, data: FederatedData | LazyFederatedData, seed: int | None = None) -> Model:
    """The ``[model]`` section's model for the features and classes of ``data``; ``seed`` (the
    run's) keys a random-feature embedding and is required with one."""
    return build_model(m.kind, data.dim, data.n_classes, bias=m.bias, hidden=m.hidden, activation=m.activation,
                       random_features=m.random_features, rf_gamma=m.rf_gamma, seed=seed, network=m.network)


def algorithm_sections(config: Config, reg: "Registration") -> dict[str, Any]:
    """The config sections the algorithm ``reg`` declared, by name: all it is built from; its noise
    calibrated to ``budget.epsilon`` where it calibrates and the sections set none (the
    registration's ``calibrate``: done here, not written into the config, so a sweep over
    ``budget.epsilon`` calibrates each point and a resumed run or a board calibrates the same)."""
    return reg.sections_for({name: getattr(config, name) for name in reg.sections}, config.budget.epsilon)


def privacy_guarantee(config: Config) -> str:
    """What the run's releases carry (testbed.algorithms.registry.GUARANTEES): "dp", "mi_dp" or "none"."""
    from testbed.algorithms import registry

    reg = registry.get(config.run.algorithm)
    return reg.guarantee(algorithm_sections(config, reg))


def build_algorithm(config: Config, model: Model, data: FederatedData | LazyFederatedData) -> "Algorithm":
    """The algorithm ``config.run.algorithm`` names, built for ``model`` and ``data``."""
    from testbed.algorithms import registry

    reg = registry.get(config.run.algorithm)
    ctx = registry.BuildContext(model=model, data=data, num_nodes=config.data.num_nodes, seed=config.run.seed,
                                delta=config.privacy.delta, mcu_nodes=frozenset(config.nodes.mcu),
                                straggler_p=config.stragglers.p if config.stragglers.model == "bernoulli" else 0.0)
    algorithm = reg.build(algorithm_sections(config, reg), ctx)
    if ctx.mcu_nodes and not hasattr(algorithm, "mcu_task"):
        raise ConfigError("nodes.mcu", f"{reg.name} has no microcontroller node step (the firmware runs "
                                       "DP-PASGD); leave nodes.mcu empty")
    return algorithm


def planned_rounds(config: Config) -> int | None:
    """The rounds the algorithm of a (planned) config will run, or None if it cannot say before."""
    from testbed.algorithms import registry

    reg = registry.get(config.run.algorithm)
    return reg.planned_rounds(algorithm_sections(config, reg))


def build_channel(config: Config) -> "ChannelHalf":
    """The channel half of the over-the-air algorithm ``config.run.algorithm`` names."""
    from testbed.algorithms import registry

    reg = registry.get(config.run.algorithm)
    if reg.channel is None:
        raise ValueError(f"{reg.name} is not an over-the-air algorithm")
    return reg.channel(algorithm_sections(config, reg), config.data.num_nodes, config.run.seed)


def channel_view(config: Config) -> "ChannelView | None":
    """The view of the channel of ``config.run.algorithm`` the watch page draws, or None for an
    algorithm with no channel; ValueError if its sections give no channel."""
    from testbed.algorithms import registry

    reg = registry.get(config.run.algorithm)
    if reg.channel_view is None:
        return None
    return reg.channel_view(algorithm_sections(config, reg), config.data.num_nodes, config.run.seed)


def graph_view(config: Config) -> "GraphView | None":
    """The view of the graph of ``config.run.algorithm`` the watch page and `testbed topology` draw,
    or None for an algorithm that is not decentralised; ConfigError if its sections give no graph."""
    from testbed.algorithms import registry

    reg = registry.get(config.run.algorithm)
    if reg.graph_view is None:
        return None
    return reg.graph_view(algorithm_sections(config, reg), config.data.num_nodes, config.run.seed)
