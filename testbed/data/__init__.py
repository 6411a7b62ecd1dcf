"""Datasets and their partitions over nodes: one entry point, :func:`load_dataset`.

Each data set is one module of this package that registers it (testbed.data.registry); what only
its loader needs (scipy, scikit-learn) is imported when it loads, so a board running the synthetic
task never imports scipy.

Example::

    >>> data = load_dataset("synthetic", seed=0, num_nodes=4, samples_per_node=50, dim=10)
    >>> data.num_nodes, data.dim, data.n_classes
    (4, 10, 2)
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

from testbed.data import registry
from testbed.data.federated import FederatedData, Split
from testbed.data.split import SCALINGS, check_scaling
from testbed.errors import DataError

__all__ = ["SCALINGS", "FederatedData", "Split", "load_dataset", "source_files"]


def source_files(name: str, path: str | None = None) -> list[Path]:
    """The files the loader of the file-based set ``name`` reads, found (or downloaded) as it finds
    them (``path``: config ``data.path``); what a cache of its federation is keyed by."""
    reg = registry.get(name)
    if reg.source_files is None:
        raise DataError(f"{name} reads no file")
    return reg.source_files(path)


def load_dataset(name: str, *, seed: int, path: str | None = None, scaling: str = "per_node",
                 **options: Any) -> FederatedData:
    """Load or generate a dataset, partitioned over nodes, scaled into the unit ball and split
    80/10/10 on every node.

    Input
    -----
    name : str
        A registered data set (testbed.data.registry).
    seed : int
        The run's seed; it drives every random choice (synthetic draws, i.i.d. partitions, splits).
    path : str, optional
        The data file or its directory (config ``data.path``); refused by a set that reads none
        (``no_path`` of its registration, e.g. ``"synthetic"``).
    scaling : str
        How rows are put into the unit ball (config ``data.scaling``), one of
        :data:`testbed.data.split.SCALINGS`: ``"per_node"`` (default: each node's own statistics),
        ``"public_bound"`` (no statistic of the data) or ``"pooled"`` (statistics of the whole
        data set, as the papers do; a privacy leak between nodes). Each loader documents what it
        does for each.
    **options :
        The loader's own options: the keyword parameters of its registration's ``load``
        (testbed.data.registry), e.g. :func:`testbed.data.synthetic.make_logistic`'s num_nodes,
        samples_per_node, dim, n_classes, heterogeneity, nodes, bayes_accuracy, dtype, splits.
        ``nodes``: only these node ids, e.g. a board's own (identical to selecting them from the
        whole federation under "per_node" and "public_bound").

    Output
    ------
    data : FederatedData

    Raises DataError for an unknown name or option, a missing required option, or a data file that
    is missing or corrupt.
    """
    reg = registry.get(name)
    check_scaling(scaling)
    loader = reg.load
    if reg.takes_path:
        options["path"] = path
    elif path is not None:
        raise DataError(f"the {name} {reg.no_path}, but data.path={path} is set")
    params = inspect.signature(loader).parameters
    valid = [p for p in params if p not in ("seed", "path", "scaling")]
    unknown = sorted(set(options) - set(params))
    if unknown:
        raise DataError(f"{name}: unknown option(s) {', '.join(unknown)}; valid: {', '.join(valid)}")
    missing = [p for p, spec in params.items() if spec.default is spec.empty and p not in options and p != "seed"]
    if missing:
        raise DataError(f"{name}: missing option(s) {', '.join(missing)}")
    return loader(seed=seed, scaling=scaling, **options)
