"""D-PSGD (Lian et al., "Can Decentralized Algorithms Outperform Centralized Algorithms?",
NeurIPS 2017, Algorithm 1) on the ``[topology]`` graph over orthogonal digital links, optionally
with local DP noise on what each node sends: x_i ← W_ii x_i + Σ_{k ∈ N(i)} W_ik (x_k + n_k) − γ g_i(x_i).
The algorithm is testbed.algorithms.graph_exchange's (``kind = "dpsgd"``); docs/baselines.md."""

from __future__ import annotations

from testbed.algorithms.graph_exchange import ExchangeSection, registration


class DpsgdSection(ExchangeSection):
    """D-PSGD (Lian et al. 2017, Algorithm 1) on the [topology] graph over orthogonal digital
    links: x_i ← Σ_k W_ik x_k − γ g_i(x_i), the gradient at the node's own model before mixing,
    optionally with local DP noise on what is sent (epsilon or sigma)."""


REGISTRATION = registration("dpsgd", DpsgdSection)
