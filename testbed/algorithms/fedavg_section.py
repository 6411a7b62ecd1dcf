"""FedAvg's configuration and privacy statement (testbed.algorithms.fedavg): its ``[fedavg]``
section, which FedProx's extends (testbed.algorithms.fedprox), and what `testbed privacy fedavg`
says of it.
"""

from __future__ import annotations

from pydantic import Field

from testbed.algorithms.aggregate import AggregationOptions
from testbed.checked.sections import Positive
from testbed.privacy.statements import PrivacyStatement


class FedAvgSection(AggregationOptions):
    """FedAvg: ``rounds`` rounds of ``local_steps`` SGD steps of ``batch`` samples at ``lr``."""

    rounds: Positive[int] = 20
    local_steps: Positive[int] = 5
    """Local SGD steps per node and round."""
    batch: Positive[int] = 32
    lr: Positive[float] = 0.1
    max_weight_share: float = Field(0.5, gt=0.0, le=1.0)
    """The largest share of an aggregation one node may take, whatever size it reports; the excess
    goes to the others in proportion (1: no cap)."""


STATEMENT = PrivacyStatement(
    name="fedavg", title="FedAvg",
    unit="none: not private (no noise; the summary says \"not private\", ε infinite)",
    adjacency="none",
    observers="the server sees each node's local model in the clear; anyone who hears the broadcast, the average",
    accountant="none: an ε budget on it is a config error",
    paper_accountant="none (McMahan et al.'s FedAvg is a non-private baseline)",
    amplification="none",
    assumptions=(),
    delta="not used",
    not_protected=("everything a local model reveals of its data (membership, reconstruction)",
                   "the training-set sizes n_k uploaded once"),
    evidence=("tests/test_honest_summaries.py::test_a_finite_epsilon_appears_only_in_a_private_run",
              "tests/test_honest_summaries.py::test_an_epsilon_budget_on_a_run_without_noise_is_a_config_error"))
