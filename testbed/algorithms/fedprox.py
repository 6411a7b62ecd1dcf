"""FedProx (Li et al., MLSys 2020, "Federated Optimization in Heterogeneous Networks", Algorithm 2):
FedAvg whose node k approximately minimises, from the global model w_t,

    h_k(w; w_t) = F_k(w) + (μ/2) ‖w − w_t‖²                                   (eq. 2)

by the same local SGD, so each step adds the proximal term's gradient μ(w − w_t) to the data
gradient (:meth:`~testbed.algorithms.base.BaseAlgorithm.regulariser_gradient`). μ = 0 is FedAvg, bit
for bit; the sizes' setup, the weighted average, its robust rules and client sampling are FedAvg's
(testbed.algorithms.fedavg), but for a recommended robust rule: benchmarks/robust_aggregation.py
has not run FedProx, so it names none. Not private, as FedAvg.
"""

import dataclasses

import numpy as np

from testbed.algorithms import fedavg
from testbed.algorithms.contract import TensorSpec
from testbed.checked.sections import NonNegative


class FedProxSection(fedavg.FedAvgSection):
    """FedProx: FedAvg's keys and the proximal coefficient μ."""

    mu: NonNegative[float] = 0.01
    """μ of eq. (2) (0: FedAvg)."""


class FedProx(fedavg.FedAvg):
    """FedAvg with the proximal term (FedAvg's arguments, and ``mu``: μ of eq. 2)."""

    def regulariser_gradient(self, params: np.ndarray, start: np.ndarray) -> np.ndarray:
        """∇ of eq. (2)'s (μ/2)‖w − w_t‖² at w: μ(w − w_t)."""
        return self.mu * (params - start)

    def uplink_spec(self) -> dict[str, TensorSpec]:
        """FedAvg's bound while η μ <= 2: a step scales w − w_t by (1 − η μ), |1 − η μ| <= 1, so it
        moves the model no farther from w_t than the data gradient's η G; beyond that, no bound."""
        return super().uplink_spec() if self.lr * self.mu <= 2 else {"update": TensorSpec((self.model.num_params,))}


REGISTRATION = dataclasses.replace(fedavg.REGISTRATION, name="fedprox", sections={"fedprox": FedProxSection},
    build=lambda sections, ctx: fedavg.build(sections, ctx, "fedprox", FedProx), robust_choice=None,
    privacy_statements=(dataclasses.replace(fedavg.STATEMENT, name="fedprox", title="FedProx"),))
