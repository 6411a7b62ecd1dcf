"""Which nodes the model is evaluated on (``output.eval_nodes``), and their data.

Evaluation is a pass over the evaluated nodes' train, test and validation rows
(testbed.orchestration.model_evaluation's ``evaluate``). By default that is every node.
``output.eval_nodes = k`` evaluates on k nodes only: a fixed subset, k distinct node ids drawn uniformly once per run from
``stream(seed, GLOBAL, -1, EVAL)``, the same every round and in sim and over MQTT, so the metrics of
a run follow one population. Their rows are made once and held for the whole run
(testbed.assembly.assemble.load_evaluation_data); the other nodes' test and validation rows are then not
held at all for the synthetic set, and with lazy nodes (client sampling, testbed.data.lazy) the
evaluated rows are the only ones held besides the round's sampled nodes', so a federation of a
million nodes is evaluated on k of them (the accuracies are then a sample
mean over k nodes, with its sampling error: ~0.5/sqrt(k) at most).

Example::

    >>> evaluated_node_ids(num_nodes=10, eval_nodes=3, seed=0)
    array([1, 6, 8])
    >>> evaluated_node_ids(num_nodes=10, eval_nodes=None, seed=0) is None
    True
"""

from __future__ import annotations

import numpy as np

from testbed.streams.rng import GLOBAL, Purpose, stream


def evaluated_node_ids(num_nodes: int, eval_nodes: int | None, seed: int) -> np.ndarray | None:
    """The ids (k,) ascending of the evaluated nodes, or None for every node (unset, or k >= N)."""
    if eval_nodes is None or eval_nodes >= num_nodes:
        return None
    picked = stream(seed, GLOBAL, -1, Purpose.EVAL).choice(num_nodes, size=eval_nodes, replace=False)
    return np.sort(picked)
