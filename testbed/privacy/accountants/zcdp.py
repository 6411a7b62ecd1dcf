"""The paper's accountant (DP-PASGD §5): zCDP composition, Lemma 3 conversion, no amplification by
sampling, replace-one adjacency. For DP-PASGD it reproduces eq. (9) exactly.

It accounts for every Gaussian composition: claiming no amplification, it needs nothing of the
sampling, and an add/remove sensitivity is doubled to a replace-one one.

Example::

    >>> round(REGISTRATION.epsilon([((1.0, 2 / 32, "replace_one", "none", 1.0), 100)], delta=1e-4), 6)
    2.87777
"""

from __future__ import annotations

from typing import Iterable

from testbed.privacy.accountants.registry import Items, Registration, Signature
from testbed.privacy.zcdp import gaussian_rho, rho_to_epsilon


def _replace_one_sensitivity(sensitivity: float, adjacency: str) -> float:
    # Replacing a record = removing one and adding one: at most twice the add/remove sensitivity.
    return sensitivity if adjacency == "replace_one" else 2.0 * sensitivity


def zcdp_rho(items: Iterable[tuple[Signature, int]]) -> float:
    """Total ρ of the (signature, count) Gaussian compositions (Lemmas 1 and 2), replace-one adjacency."""
    return sum(
        count * gaussian_rho(_replace_one_sensitivity(sens, adj), sigma)
        for (sigma, sens, adj, _sampling, _rate), count in items
    )


def _compose(items: Items, delta: float) -> float:
    return rho_to_epsilon(zcdp_rho(items), delta)


REGISTRATION = Registration(name="zcdp", order=0, refuses=lambda pairs: None, compose=_compose)
