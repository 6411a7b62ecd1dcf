"""The dataset registry: every module of this package that defines ``REGISTRATION`` adds its data
sets; adding one is adding a
module, here or in an installed plugin (docs/extending.md).

A :class:`Registration` says the set's name (``data.dataset``), its loader, which keys of ``[data]``
the loader takes, what it reads (files, ``data.path``), and what the run's assembly
(testbed.assembly.assemble) and the memory check (testbed.assembly.resources) need to know of it. The config's
choices of ``data.dataset`` (its JSON Schema's enum), :func:`testbed.data.load_dataset`,
testbed.assembly.assemble and testbed.assembly.resources read this registry and never name a data set.

The registry imports every module of this package to find them (once, when the choices are first
asked), so a dataset module imports what only its loader needs (scipy, scikit-learn, torch) inside
the loader: a board that runs the synthetic task never imports them.

Example::

    >>> names()[:3]
    ['synthetic', 'adult-1', 'adult-2']
    >>> get("adult-2").takes_path, get("synthetic").takes_path
    (True, False)
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from testbed.errors import DataError
from testbed.util.registrations import GROUPS, registered_in

if TYPE_CHECKING:
    from testbed.checked.sections import Section
    from testbed.data.federated import FederatedData
    from testbed.data.lazy import LazyFederatedData


def _no_options(section: "Section") -> dict[str, Any]:
    return {}


@dataclass(frozen=True)
class Registration:
    """One data set (``data.dataset``). Its hooks read the experiment's ``[data]`` section
    (testbed.data.section.DataSection, whose choices are this registry's: so not imported here).

    Attributes:
        name: its ``data.dataset``.
        load: ``load(seed=, scaling=, [path=], **options)`` → its FederatedData, partitioned over
            the nodes, in the unit ball and split 80/10/10 on every node; ``nodes=`` (a board's own
            ids) selects nodes. Its keyword parameters are the options it takes: any other is
            refused by name (testbed.data.load_dataset).
        options: the ``[data]`` section → the keyword options of ``load`` (besides seed, scaling,
            path and nodes); they also key the cache of its lazy federation (testbed.data.mapped).
        order: its place among the choices (the JSON Schema's enum, error messages): by order,
            then name.
        source_files: ``data.path`` (or None) → the files ``load`` reads, found (or downloaded) as
            it finds them: what the cache of its lazy federation is keyed by. None: it reads no
            file, and its nodes are held whole with client sampling unless ``lazy`` says otherwise.
        no_path: why ``data.path`` is refused ("dataset is generated and reads no file"), or
            None: ``load`` takes ``path``.
        lazy: (the ``[data]`` section, seed) → its federation's layout with each node's rows made
            again, from that node's own stream, when a round samples it (testbed.data.lazy). A set
            with it also makes an evaluated subset of nodes again instead of selecting them, so a
            run evaluating a subset loads only training rows (``train_only``).
        train_only: the options that make ``load`` make only training rows (with ``lazy``).
        features: the ``[data]`` section → the length of its rows, known before loading (the
            memory check; None: at most the file-based sets' bound, testbed.assembly.resources).
        image_shape: (channels, height, width) of an image set's rows, which ``data.features``
            may replace by their scattering transform (testbed.data.scattering); None: not images.
        counted: whether the memory check counts its rows (a generator that writes straight into
            the final arrays; a file-based set is as large as its file, not counted).
    """

    name: str
    load: Callable[..., "FederatedData"]
    options: Callable[["Section"], dict[str, Any]] = _no_options
    order: int = 1000
    source_files: Callable[[str | None], list[Path]] | None = None
    no_path: str | None = None
    lazy: Callable[["Section", int], "LazyFederatedData"] | None = None
    train_only: dict[str, Any] = field(default_factory=dict)
    features: Callable[["Section"], int] | None = None
    image_shape: tuple[int, int, int] | None = None
    counted: bool = False

    @property
    def takes_path(self) -> bool:
        return self.no_path is None


def listed_order(reg: Registration) -> tuple[int, str]:
    """Where a data set is listed among the choices: by its ``order``, then its name."""
    return (reg.order, reg.name)


@functools.cache
def registrations() -> dict[str, Registration]:
    """Every data set of this package and of the installed plugins (entry points testbed.datasets), by name, in order (modules imported once, on first use)."""
    import testbed.data as package

    return registered_in(package, Registration, "data set", group=GROUPS["data set"], order=listed_order)


def names() -> list[str]:
    return list(registrations())


def image_sets() -> tuple[str, ...]:
    """The data sets of images (a registration with an ``image_shape``), in order."""
    return tuple(name for name, reg in registrations().items() if reg.image_shape is not None)


def get(name: str) -> Registration:
    """The data set ``name``; DataError (one line, naming the valid ones) for an unknown one."""
    try:
        return registrations()[name]
    except KeyError:
        raise DataError(f"unknown dataset {name!r}; valid: {', '.join(names())}") from None
