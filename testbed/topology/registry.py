"""The topology-kind registry: every module of this package that defines ``REGISTRATION`` is a kind
of ``[topology] kind``; adding one is adding a module, here or in an installed plugin
(docs/extending.md). The section's choices (and JSON Schema), which of its keys matter with which
kind, :class:`testbed.topology.Topology`, its descriptions and `testbed privacy dwfl --topology`
read this registry when asked and never name a kind (but the complete graph, which algorithms
keep a dense path for).

Example::

    >>> {"complete", "ring", "k_regular"} <= set(names())
    True
    >>> get("k_regular").random, get("ring").random
    (True, False)
    >>> "degree" in get("k_regular").keys
    True
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

from testbed.util.registrations import GROUPS, lookup, registered_in

#: The complete graph: DWFL's paper's, which the algorithms keep a dense path for (never drawn as a
#: graph unless an algorithm needs one).
COMPLETE = "complete"


@dataclass(frozen=True)
class Kind:
    """One kind of topology. Its hooks take the run's :class:`testbed.topology.topology.Topology`
    and its ``[topology]`` section (typed Any here: this module is imported by both, and imports
    neither).

    Attributes:
        name: its ``[topology] kind``.
        draw: (the Topology, its coherence block, the block's public stream) → the block's graph;
            ValueError (one line) for parameters that give no graph. A kind that is not ``random``
            ignores the stream, and draws the same graph every block.
        keys: the ``[topology]`` keys it reads besides kind, mixing and allow_disconnected: any of
            them set under another kind is refused.
        size_key: the key named when its graph is refused for its size or parameters.
        random: drawn at random, so ``coherence_rounds`` redraws it.
        placed_by_radio: it places the nodes and joins those the radio's link budget reaches (it
            needs one: an algorithm with a radio, or an experiment file's for the CLI).
        expected_entries: (the Topology) → about how many directed entries (2E) its graph holds,
            checked against the adjacency limit before anything is drawn; None: not known ahead.
        check: (the section) → why it is incomplete (one line, "key: ..."), or None.
        details: (the Topology) → lines `testbed topology show` adds (label → text).
        order: its place among the choices, then its name.
    """

    name: str
    draw: Callable[[Any, int, Any], Any]
    keys: tuple[str, ...] = ()
    size_key: str = "kind"
    random: bool = False
    placed_by_radio: bool = False
    expected_entries: Callable[[Any], float | None] = lambda topology: None
    check: Callable[[Any], str | None] = lambda section: None
    details: Callable[[Any], dict[str, str]] = lambda topology: {}
    order: int = 1000


@functools.cache
def registrations() -> dict[str, Kind]:
    """Every kind of this package and of the installed plugins (testbed.topologies), in order."""
    import testbed.topology as package

    return registered_in(package, Kind, "topology kind", group=GROUPS["topology kind"], order=lambda r: (r.order, r.name))


def names() -> list[str]:
    return list(registrations())


def random_names() -> list[str]:
    """The kinds drawn at random (``coherence_rounds`` redraws them)."""
    return [name for name, kind in registrations().items() if kind.random]


def reading(key: str) -> Callable[[], list[str]]:
    """The kinds that read ``key``, as a function asked when a section is checked."""
    return lambda: [name for name, kind in registrations().items() if key in kind.keys]


def get(name: str) -> Kind:
    return lookup(registrations(), name, "topology kind", ValueError)
