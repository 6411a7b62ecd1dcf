"""Client sampling: which nodes take part in a round, drawn from each node's own counter.

The ``[client_sampling]`` section (:class:`ClientSamplingSection`):

- ``all`` (default): every node, every round;
- ``uniform``: exactly ``count`` nodes (or ``round(fraction · N)``, at least one), uniformly
  without replacement: the nodes of the ``count`` smallest keys;
- ``poisson``: each node independently with probability ``fraction`` (a round may sample none).

Node i's key in round t is the first uniform of its Philox counter (seed, i, t, CLIENTS)
(testbed.streams.counter_rng.uniform_keys, the u of uniform_pairs), vectorised over the nodes: sim and the MQTT coordinator
sample the same nodes, and a key never depends on which other nodes exist.

A node not sampled is not asked, spends nothing and is no straggler; emulated stragglers are
drawn among the sampled nodes. Privacy: each node's ledger counts its own releases, made only in
the rounds that sampled it; **no amplification by client sampling is claimed**. DP-PASGD's privacy
is record-level, per node, against the server: whether the server sampled a node does not hide
that node's records from the server, which sees every release the node makes (amplification by
client sampling is a user-level, central-DP argument about an aggregate, which the ledger does not
make).

Example::

    >>> section = ClientSamplingSection(method="uniform", count=3)
    >>> sample_clients(section, seed=0, round_index=5, node_ids=range(10))
    (1, 3, 4)
    >>> sample_clients(ClientSamplingSection(), seed=0, round_index=5, node_ids=range(10)) is None
    True
"""

from __future__ import annotations

from typing import Literal, Sequence

import numpy as np
from pydantic import Field, model_validator

from testbed.checked.sections import Section
from testbed.streams.counter_rng import uniform_keys
from testbed.streams.rng import Purpose


class ClientSamplingSection(Section):
    """The ``[client_sampling]`` section: which nodes each round asks."""

    method: Literal["all", "uniform", "poisson"] = Field(
        "all",
        description='"all" (every node every round), "uniform" (count nodes, or round(fraction N), without '
        'replacement) or "poisson" (each node with probability fraction).',
    )
    fraction: float | None = Field(
        None, gt=0.0, le=1.0, description="uniform: the share of the N nodes per round; poisson: each node's probability.",
    )
    count: int | None = Field(None, ge=1, description="uniform: the nodes per round (instead of fraction).")

    @model_validator(mode="after")
    def _one_size(self) -> "ClientSamplingSection":
        if self.method == "all" and (self.fraction is not None or self.count is not None):
            raise ValueError('method: is "all" but fraction or count is set; choose "uniform" or "poisson"')
        if self.method == "uniform" and (self.fraction is None) == (self.count is None):
            raise ValueError('fraction: method "uniform" takes exactly one of fraction and count')
        if self.method == "poisson" and (self.fraction is None or self.count is not None):
            raise ValueError('fraction: method "poisson" takes fraction (each node\'s probability), not count')
        return self

    def per_round(self, num_nodes: int) -> float:
        """The nodes a round asks: exactly (all, uniform) or in expectation (poisson)."""
        if self.method == "all":
            return float(num_nodes)
        if self.method == "poisson":
            return float(self.fraction) * num_nodes  # type: ignore[arg-type]
        return float(_uniform_count(self, num_nodes))

    def describe(self, num_nodes: int) -> dict:
        """What the summary says of the sampling and of the privacy it claims."""
        return {"method": self.method, "fraction": self.fraction, "count": self.count,
                "nodes_per_round": self.per_round(num_nodes), "amplification_claimed": False}


def _uniform_count(section: ClientSamplingSection, num_nodes: int) -> int:
    if section.count is not None:
        return min(section.count, num_nodes)
    return max(1, min(num_nodes, round(float(section.fraction) * num_nodes)))  # type: ignore[arg-type]


def sample_clients(section: ClientSamplingSection, *, seed: int, round_index: int,
                   node_ids: Sequence[int]) -> tuple[int, ...] | None:
    """The nodes of ``node_ids`` that round ``round_index`` samples, ascending; None for ``all``.

    Input: node_ids (N,) the run's nodes. Output: the sampled ids (M,), M = count for uniform.
    """
    if section.method == "all":
        return None
    ids = np.asarray(node_ids, dtype=np.int64)  # a million ids: one conversion, no Python loop
    if ids.size == 0:
        return ()
    keys = uniform_keys(seed, ids, round_index, Purpose.CLIENTS)
    if section.method == "poisson":
        chosen = ids[keys <= section.fraction]
    else:
        count = _uniform_count(section, ids.size)
        chosen = ids[np.argpartition(keys, count - 1)[:count]] if count < ids.size else ids
    return tuple(sorted(chosen.tolist()))
