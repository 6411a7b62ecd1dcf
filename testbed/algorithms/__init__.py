"""Algorithms: a node step (what a node computes and sends) and a combine step (what the
coordinator or the channel makes of what the nodes sent), pure functions on arrays.

Every algorithm implements :class:`Algorithm`; ``run.algorithm`` in an experiment file names one of
ALGORITHMS, whose module provides ``from_config(config, model, data) -> Algorithm``.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, Sequence

import numpy as np

if TYPE_CHECKING:
    from testbed.config import Config
    from testbed.data.federated import FederatedData, Split
    from testbed.ledger import Event
    from testbed.models import Model

#: run.algorithm → the module that builds it.
ALGORITHMS = {"dp_pasgd": "testbed.algorithms.dp_pasgd", "dwfl": "testbed.algorithms.dwfl"}


@dataclass(frozen=True)
class NodeOutput:
    """What the nodes of one node step send, and what it cost them.

    Attributes:
        node_ids: (M,) the nodes that sent, in row order (over MQTT: those that answered in time).
        params: (M, P) float64, what each node sends (DP-PASGD: its local model after τ steps).
        events: per node, the ledger events of this round (compute, privacy, communication).
    """

    node_ids: tuple[int, ...]
    params: np.ndarray
    events: list[list["Event"]]


@dataclass(frozen=True)
class RoundResult:
    """What came back from the nodes in one round, however they were reached.

    Attributes:
        output: the answered nodes' tensors and events, in node order.
        stragglers: nodes expected but silent by the round's deadline (or gone offline).
        refused: (node, budget, would_be, limit) of nodes that refused to act.
        state: the new state when the nodes finished the round themselves (over-the-air
            algorithms over MQTT: the channel emulator ran between them, and ``output.params`` are
            their new models); None when the runner is to ``combine`` the output.
    """

    output: NodeOutput
    stragglers: tuple[int, ...] = ()
    refused: tuple[tuple[int, str, float, float], ...] = ()
    state: Any = None


class Algorithm(Protocol):
    """The contract between an algorithm and whatever runs it (sim runner, node agent).

    ``state`` is the algorithm's own (DP-PASGD: the global model, shape (P,)); ``node_step`` runs for
    the nodes ``node_ids`` at once (all of them in sim, one on a board) on their training data.

    ``over_the_air`` algorithms (DWFL) have a state of one row per node, (N, P); over MQTT each
    node gets its own row, transmits through the channel emulator, and finishes the round itself
    with ``finish(received_rows, num_senders)`` after its ``node_step``.
    """

    model: "Model"
    over_the_air: bool

    @property
    def rounds(self) -> int: ...

    def init_state(self, params0: np.ndarray) -> Any: ...

    def planned_events(self, node: int, round_index: int) -> list["Event"]: ...

    def node_step(self, state: Any, train: "Split", node_ids: Sequence[int], round_index: int,
                  seed: int) -> NodeOutput: ...

    def combine(self, output: NodeOutput, state: Any) -> Any: ...

    def eval_params(self, state: Any) -> np.ndarray: ...

    def describe(self) -> dict[str, Any]: ...


def from_config(config: "Config", model: "Model", data: "FederatedData") -> Algorithm:
    """The algorithm ``config.run.algorithm`` names, built for ``model`` and ``data``."""
    return importlib.import_module(ALGORITHMS[config.run.algorithm]).from_config(config, model, data)
