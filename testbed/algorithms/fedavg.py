"""FedAvg (McMahan et al., AISTATS 2017, Algorithm 1): local SGD, then the average of the nodes'
models weighted by their training-set sizes; a non-private baseline.

Once, before round 1 (the contract's setup phase), every node uploads its training-set size n_k;
the server keeps the weights n_k / n (never broadcast). A size is self-reported: the server takes a
claim only if it is >= 1 and at most the node's rows in the run's partition (the setup spec refuses
one outside [1, the largest partition]; :func:`~testbed.algorithms.impact.intake_sizes`), and no
node's share of an aggregation exceeds ``max_weight_share`` (the excess goes to the others in
proportion; :func:`~testbed.algorithms.impact.cap_shares`). Each round every node runs
``local_steps`` mini-batch SGD steps from the global model (Algorithm 1's ClientUpdate with
E·n_k/B replaced by a fixed step count, the same on every node) and the server sets
w ← Σ_k (n_k / n_S) w_k over the nodes S that answered.

Example::

    >>> from testbed.learning.models import LogisticRegression
    >>> from testbed.data.synthetic import make_logistic
    >>> from testbed.algorithms.contract import RoundContext, SETUP_ROUND
    >>> data = make_logistic(num_nodes=3, samples_per_node=50, dim=4, seed=0)
    >>> alg = FedAvg(LogisticRegression(4, 2), rounds=2, local_steps=3, batch=5, lr=0.5, num_nodes=3)
    >>> state = alg.init_state(alg.model.init(None))
    >>> ctx = RoundContext(SETUP_ROUND, 0, 3, (0, 1, 2))
    >>> sizes = alg.setup_step(data.train, [0, 1, 2], ctx)
    >>> state = alg.server_setup(state, sizes, ctx.closed([0, 1, 2])).state
    >>> state["weights"].tolist()
    [0.3333333333333333, 0.3333333333333333, 0.3333333333333333]
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from testbed.algorithms.aggregate import Aggregation, bucket_stream
from testbed.algorithms.base import BaseAlgorithm, SizeSetup
from testbed.algorithms.batches import check_batches, uniform_batches
from testbed.algorithms.contract import NodeResult, RoundContext, ServerResult, State, TensorSpec
from testbed.algorithms.fedavg_section import STATEMENT, FedAvgSection
from testbed.algorithms.impact import cap_shares
from testbed.algorithms.registry import BuildContext, Registration, RobustChoice
from testbed.data.federated import Split
from testbed.learning.models import Model


class FedAvg(SizeSetup, BaseAlgorithm):
    """FedAvg with size-weighted averaging (the base's global model, broadcast, and local SGD
    update; the sizes' setup).

    Args:
        model: the model.
        rounds: communication rounds.
        local_steps: SGD steps per node per round.
        batch: mini-batch size.
        lr: learning rate.
        num_nodes: N of the run (the server's weight vector).
        aggregation: the server's rule (testbed.algorithms.aggregate; default the weighted mean).
        train_sizes: each node's training rows in the run's partition, by id: a claimed size above
            its node's is refused (None: only finite and >= 1 is checked).
        max_weight_share: the cap on one node's share of an aggregation (None: no cap).
        settings: a variant's own settings (the keys its section adds to FedAvg's, FedProx's ``mu``):
            attributes of the algorithm, reported by :meth:`describe`.
    """

    def __init__(self, model: Model, *, rounds: int, local_steps: int, batch: int, lr: float, num_nodes: int,
                 aggregation: Aggregation = Aggregation(), train_sizes: Mapping[int, int] | None = None,
                 max_weight_share: float | None = None, **settings: float):
        self.model, self.rounds_planned, self.local_steps = model, rounds, local_steps
        self.batch, self.lr, self.num_nodes = batch, lr, num_nodes
        self.train_sizes = None if train_sizes is None else {int(k): int(v) for k, v in train_sizes.items()}
        self.max_weight_share = max_weight_share
        self.aggregation = aggregation
        taken = sorted(set(settings) & (set(vars(self)) | set(dir(type(self)))))
        if taken:
            raise ValueError(f"a variant's setting may not replace FedAvg's {taken[0]!r}")
        self.settings = settings
        vars(self).update(settings)

    def state_spec(self) -> dict[str, TensorSpec]:
        return {**super().state_spec(), "weights": TensorSpec((self.num_nodes,))}

    def init_state(self, params0: np.ndarray) -> State:
        """The global model and the weights (equal until the setup brings the sizes)."""
        return {**super().init_state(params0), "weights": np.full(self.num_nodes, 1.0 / self.num_nodes)}

    def server_setup(self, state: State, result: NodeResult, ctx: RoundContext) -> ServerResult:
        """The weights n_k / n from the sizes claimed (:meth:`~SizeSetup.claimed_sizes`)."""
        sizes = self.claimed_sizes(result)
        return ServerResult({"model": state["model"], "weights": sizes / sizes.sum()})

    def shares(self, state: State, node_ids: Sequence[int]) -> np.ndarray:
        """(M,) the aggregation weights of the nodes that answered: n_k / n_S, capped at
        ``max_weight_share`` per node (:func:`cap_shares`)."""
        w = state["weights"][list(node_ids)]
        return cap_shares(w / w.sum(), self.max_weight_share)

    def node_step(self, received: Mapping[str, np.ndarray], train: Split, node_ids: Sequence[int],
                  ctx: RoundContext) -> NodeResult:
        """ClientUpdate: ``local_steps`` SGD steps from the global model on every node at once."""
        ids = tuple(int(n) for n in node_ids)
        idx = uniform_batches(train, ids, ctx.round_index, ctx.seed, self.local_steps, self.batch, ctx.secrets)
        # np.array keeps the broadcast's memory order, which the server's weighted sum rounds by.
        params = np.array(received["model"], dtype=np.float64)
        self.local_sgd(params, received["model"], train, idx, np.full(idx.shape, 1.0 / self.batch))
        return self.result(ids, {"update": params}, train, ctx)

    def server_step(self, state: State, result: NodeResult, ctx: RoundContext) -> ServerResult:
        """w ← Σ_{k∈S} (n_k / n_S) w_k over the nodes S that answered (Algorithm 1), or the
        configured robust rule (docs/robust-aggregation.md: which rules use the weights)."""
        if not result.node_ids:
            return ServerResult(state)
        w = self.shares(state, result.node_ids)
        model = self.aggregation.combine(result.tensors["update"], w / w.sum(), reference=state["model"],
                                         shuffle=bucket_stream(ctx.seed, ctx.round_index))
        return ServerResult({"model": model, "weights": state["weights"]})

    def describe(self) -> dict[str, Any]:
        return {"rounds": self.rounds_planned, "local_steps": self.local_steps, "batch": self.batch, "lr": self.lr,
                "private": False, **self.settings}


def build(sections: dict[str, Any], ctx: BuildContext, name: str = "fedavg",
          algorithm: type[FedAvg] = FedAvg) -> FedAvg:
    """FedAvg, or its variant ``algorithm``, as its section ``[name]`` says: the keys a variant's
    section adds to FedAvg's are the variant's settings (FedProx's ``mu``)."""
    a: FedAvgSection = sections[name]
    check_batches(name, ctx.data.train, ctx.data.node_ids, a.local_steps, a.batch, "local_steps")
    return algorithm(ctx.model, rounds=a.rounds, local_steps=a.local_steps, batch=a.batch, lr=a.lr,
                     num_nodes=ctx.num_nodes, aggregation=a.aggregation_rule(ctx.num_nodes, name),
                     train_sizes=dict(zip(ctx.data.node_ids, ctx.data.train.sizes.tolist())),
                     max_weight_share=a.max_weight_share,
                     **a.model_dump(exclude=set(FedAvgSection.model_fields)))


REGISTRATION = Registration(name="fedavg", sections={"fedavg": FedAvgSection}, build=build, client_sampling=True,
                            privacy_statements=(STATEMENT,),
                            robust_choice=RobustChoice("norm_clip", "O(MP), one pass; no accuracy lost without attack"))
