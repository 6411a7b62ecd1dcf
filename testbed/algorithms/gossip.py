"""Gossip averaging with local differential privacy on the ``[topology]`` graph over orthogonal
digital links: x_i' = x_i − γ clip(g_i); each node sends x_i' + n_i, n_i ~ N(0, σ² I) from its own
noise stream; x_i'' = W_ii x_i' + Σ_{k ∈ N(i)} W_ik (x_k' + n_k). The algorithm is
testbed.algorithms.graph_exchange's (``kind = "gossip"``); docs/baselines.md."""

from __future__ import annotations

from testbed.algorithms.graph_exchange import ExchangeSection, registration


class GossipSection(ExchangeSection):
    """Gossip averaging with local DP on the [topology] graph over orthogonal digital links:
    x_i' = x_i − γ g_i, each node sends x_i' + N(0, σ² I) (epsilon or sigma), and
    x_i'' = W_ii x_i' + Σ_{k ∈ N(i)} W_ik (x_k' + n_k), its own model weighted exactly."""


REGISTRATION = registration("gossip", GossipSection)
