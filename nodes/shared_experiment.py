"""An emulated host's shared experiment: the data of all the nodes it serves loaded together and
one algorithm built, once per experiment file, for their stacked steps (nodes.agent.step_nodes),
as sim builds them for all nodes; each node keeps its own experiment for everything else."""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from testbed.algorithms.contract import Algorithm, NodeResult, RoundContext
from testbed.assembly import assemble, inherited
from testbed.assembly.assemble import load_data, model_for
from testbed.assembly.config import Config, load_config_text
from testbed.data import registry as data_registry
from testbed.data.federated import FederatedData, Split
from testbed.data.lazy import KeptNodes, LazyFederatedData, training_rows


class SharedExperiment:
    """The experiment of all the nodes one emulated host serves, built once per experiment file
    (their data loaded together, one algorithm) for their stacked steps (nodes.agent.step_nodes),
    as sim builds it for all nodes; each node keeps its own experiment for everything else.

    Args:
        nodes: the global ids of the host's nodes.
        data_path: where the data file is (overrides the experiment's data.path).
    """

    def __init__(self, nodes: Sequence[int], data_path: str | None = None):
        self.nodes = [int(n) for n in nodes]
        self.data_path = data_path
        self._built: dict[str, tuple[FederatedData | LazyFederatedData, Algorithm, dict[int, int]]] = {}
        self._configs: dict[str, Config] = {}

    def config(self, key: str, config_text: str) -> Config:
        """The experiment file whose sha256 is ``key``, read once for all the host's nodes (a
        Config is frozen; reading it is ~2 ms, once per node of a host before)."""
        if key not in self._configs:  # only the latest is kept, as for the steps
            self._configs = {key: load_config_text(config_text, source="the coordinator's experiment")}
        return self._configs[key]

    def step(self, key: str, config: Config, received: dict[str, np.ndarray], node_ids: list[int],
             ctx: RoundContext) -> NodeResult:
        """The algorithm's node_step for ``node_ids`` (some of the host's nodes) of the experiment
        file whose sha256 is ``key`` (``config``, built from it)."""
        train, algorithm = self._rows(key, config, node_ids)
        return algorithm.node_step(received, train, node_ids, ctx)

    def setup_step(self, key: str, config: Config, node_ids: list[int], ctx: RoundContext) -> NodeResult:
        """The algorithm's setup_step for ``node_ids``, as :meth:`step`."""
        train, algorithm = self._rows(key, config, node_ids)
        return algorithm.setup_step(train, node_ids, ctx)  # type: ignore[attr-defined]  # WithSetup, admitted

    def _rows(self, key: str, config: Config, node_ids: list[int]) -> tuple[Split, Algorithm]:
        data, algorithm, position = self._built_for(key, config)
        return training_rows(data, node_ids, position), algorithm

    def data_of(self, key: str, config: Config, node: int) -> FederatedData | LazyFederatedData:
        """``node``'s rows of the host's data, read-only views: a host holds its nodes' data once;
        lazy nodes: its layout, its rows made when first stepped and kept by the host."""
        data, _, position = self._built_for(key, config)
        return data.only(node, data.make) if isinstance(data, LazyFederatedData) else data.select([position[node]])

    def _built_for(self, key: str, config: Config) -> tuple[FederatedData | LazyFederatedData, Algorithm,
                                                             dict[int, int]]:
        if key not in self._built:  # only the latest is kept: a new one means the old run is over
            data = self._load(config)
            algorithm = assemble.build_algorithm(config, model_for(config.model, data, config.run.seed), data)
            self._built = {key: (data, algorithm, {node: i for i, node in enumerate(self.nodes)})}
        return self._built[key]

    def _load(self, config: Config) -> FederatedData | LazyFederatedData:
        """The host's nodes' data: every row at once, or with lazy nodes (a run that samples its
        nodes, on a set that makes a node's rows from its own stream: assemble.holds_lazily) the
        federation's layout, its nodes' training rows made when a step first asks for them (the
        same rows: testbed.data.synthetic draws a node from its own stream alone) and kept."""
        d, seed = config.data, config.run.seed
        lazy = data_registry.get(d.dataset).lazy
        if lazy is None or self.data_path is not None or not assemble.holds_lazily(config):
            return inherited.rows(d, seed, self.nodes, self.data_path) \
                or load_data(d, seed, nodes=self.nodes, path=self.data_path)
        kept = KeptNodes(lambda ids: load_data(d, seed, nodes=ids, train_only=True))
        return dataclasses.replace(lazy(d, seed), make=kept.nodes)
