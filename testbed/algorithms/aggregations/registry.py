"""The aggregation-rule registry: every module of this package that defines ``REGISTRATION`` is a
rule a server may combine the nodes' updates by; adding one is adding a module, here or in an
installed plugin (docs/extending.md). The config's choices of ``ALGORITHM.aggregation`` (its JSON
Schema's enum) and :class:`testbed.algorithms.aggregate.Aggregation` read this registry, when asked.

Example::

    >>> names()[:2], "median" in robust_names()
    (['mean', 'norm_clip'], True)
    >>> get("median").uses_weights
    False
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

from testbed.util.registrations import GROUPS, lookup, registered_in

#: The papers' rule: the weighted mean (every other rule is a robust one).
MEAN = "mean"

#: A rule: (updates (M, P), weights (M,) summing to 1 or None, reference (P,) or None, the
#: testbed.algorithms.aggregate.Aggregation with its parameters) → (P,): numpy arrays (typed Any:
#: this package sits below the module that applies it, and imports nothing of it).
Combine = Callable[[Any, Any, Any, Any], Any]


@dataclass(frozen=True)
class Rule:
    """One aggregation rule.

    Attributes:
        name: its ``aggregation`` choice.
        combine: the rule (:data:`Combine`); it sees only the rows of the nodes that answered
            (M >= 1) and must return a finite (P,) row for finite rows.
        uses_weights: whether it reads the weights' values (else each row counts alike).
        order: its place among the choices (the JSON Schema's enum, help), then its name.
    """

    name: str
    combine: Combine
    uses_weights: bool = False
    order: int = 1000


@functools.cache
def registrations() -> dict[str, Rule]:
    """Every rule of this package and of the installed plugins (testbed.aggregations), in order."""
    import testbed.algorithms.aggregations as package

    return registered_in(package, Rule, "aggregation rule", group=GROUPS["aggregation rule"],
                         order=lambda r: (r.order, r.name))


def names() -> list[str]:
    return list(registrations())


def robust_names() -> list[str]:
    """The rules other than the papers' mean."""
    return [name for name in registrations() if name != MEAN]


def get(name: str) -> Rule:
    """The rule ``name``; ValueError naming the known ones otherwise."""
    return lookup(registrations(), name, "aggregation rule", ValueError)
