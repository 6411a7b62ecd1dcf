"""Algorithms: one module each, on one contract (testbed.algorithms.contract), found by the
registry (testbed.algorithms.registry). Adding an algorithm is adding a module that defines
``REGISTRATION``; nothing else names it.
"""

from testbed.algorithms.contract import (
    SETUP_ROUND,
    Algorithm,
    ChannelHalf,
    NodeResult,
    OverTheAir,
    RoundContext,
    ServerResult,
    State,
    TensorSpec,
    WithSetup,
    check_tensors,
)

__all__ = ["SETUP_ROUND", "Algorithm", "ChannelHalf", "NodeResult", "OverTheAir", "RoundContext", "ServerResult",
           "State", "TensorSpec", "WithSetup", "check_tensors"]
