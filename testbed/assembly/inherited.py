"""The run's data, handed to the emulated hosts it forks (testbed.util.forked) instead of made again.

A forked host starts with its coordinator's memory, where the rows of every node are already
built; it used to make its own nodes' rows again from the experiment it is sent (J1's synthetic
set: 0.18 s of CPU a host for 100 nodes before its nodes could say they were ready, the coordinator
waiting). :func:`offer` keeps the run's data for the hosts about to be forked; a host's
:func:`rows` are its nodes' rows of it (read-only views where the nodes follow each other), or None,
and the host loads them as before: for another experiment, a data file of its own, a new
interpreter (nothing is offered there), or a data set whose rows for a few nodes are not by
construction those nodes' rows of the whole federation. Only a set that makes each node's rows from
that node's own stream qualifies (the registry's ``lazy``: the synthetic set, whose evaluation rows
testbed.assembly.assemble makes again the same way), and only when the run holds every split of
every node.
"""

from __future__ import annotations

from collections.abc import Sequence

from testbed.assembly.config import Config, DataSection
from testbed.assembly.evaluation import evaluated_node_ids
from testbed.data import registry as data_registry
from testbed.data.federated import FederatedData

_offered: tuple[DataSection, int, FederatedData] | None = None


def offer(config: Config, data: object) -> None:
    """Keep ``data``, what the run ``config`` holds of its nodes, for the hosts it forks next
    (forget what was offered before)."""
    global _offered
    d = config.data
    whole = isinstance(data, FederatedData) and data_registry.get(d.dataset).lazy is not None \
        and evaluated_node_ids(d.num_nodes, config.output.eval_nodes, config.run.seed) is None
    _offered = (d, config.run.seed, data) if whole else None  # type: ignore[assignment]


def rows(data: DataSection, seed: int, nodes: Sequence[int], path: str | None = None) -> FederatedData | None:
    """``nodes``' rows of the data offered in this process if it is the experiment's (``data``,
    ``seed``, no file of the host's own), else None."""
    offered = _offered
    if offered is None or path is not None or offered[0] != data or offered[1] != seed:
        return None
    position = {node: i for i, node in enumerate(offered[2].node_ids)}
    if not all(node in position for node in nodes):
        return None
    return offered[2].select([position[node] for node in nodes])
