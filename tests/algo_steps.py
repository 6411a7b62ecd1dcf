"""Test helpers: one algorithm step or round on the new contract, without a runner."""

from __future__ import annotations

from typing import Sequence

from testbed.algorithms.contract import NodeResult, RoundContext, State
from testbed.data.federated import FederatedData, Split
from testbed.orchestration.sim_nodes import SimNodes


def node_step(alg, state: State, train: Split, node_ids: Sequence[int], round_index: int, seed: int,
              num_nodes: int | None = None) -> NodeResult:
    """The algorithm's node step for ``node_ids`` (all of them expected) from ``state``."""
    n = num_nodes if num_nodes is not None else len(node_ids)
    ctx = RoundContext(round_index, seed, n, tuple(range(n)))
    return alg.node_step(alg.downlink(state, ctx, node_ids), train, node_ids, ctx)


def run_round(alg, state: State, data: FederatedData, round_index: int, seed: int,
              excluded: frozenset[int] = frozenset()) -> State:
    """One whole sim round (node step, the channel if any, server step): the new state."""
    outcome = SimNodes(alg, data, seed, "host").round(state, round_index, excluded)
    return alg.server_step(state, outcome.result, outcome.ctx).state
