"""Datasets and their partitions over nodes: one entry point, :func:`load_dataset`.

Loader modules are imported only when their dataset is asked for, so a board running the synthetic
task never imports scipy.

Example::

    >>> data = load_dataset("synthetic", seed=0, num_nodes=4, samples_per_node=50, dim=10)
    >>> data.num_nodes, data.dim, data.n_classes
    (4, 10, 2)
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

from testbed.data.federated import FederatedData, Split
from testbed.errors import DataError

#: Valid dataset names.
DATASETS = ("synthetic", "adult-1", "adult-2", "vehicle-1", "vehicle-2")

__all__ = ["DATASETS", "FederatedData", "Split", "load_dataset"]


def _loader(name: str) -> Callable[..., FederatedData]:
    """The function behind ``name``, with the partition already bound for the file-based sets."""
    if name == "synthetic":
        from testbed.data.synthetic import make_logistic

        return make_logistic
    if name.startswith("adult-"):
        from testbed.data.adult import load_adult

        return functools.partial(load_adult, name)
    from testbed.data.vehicle import load_vehicle

    return functools.partial(load_vehicle, name)


def load_dataset(name: str, *, seed: int, path: str | None = None, **options: Any) -> FederatedData:
    """Load or generate a dataset, partitioned over nodes and split 80/10/10 on every node.

    Input
    -----
    name : str
        One of :data:`DATASETS`.
    seed : int
        The run's seed; it drives every random choice (synthetic draws, i.i.d. partitions, splits).
    path : str, optional
        The data file or its directory (config ``data.path``); not allowed for ``"synthetic"``.
    **options :
        The loader's own options: :func:`testbed.data.synthetic.make_logistic` (num_nodes,
        samples_per_node, dim, n_classes, heterogeneity, nodes, bayes_accuracy),
        :func:`testbed.data.adult.load_adult` (include_education, numeric, num_nodes) or
        :func:`testbed.data.vehicle.load_vehicle` (num_nodes).

    Output
    ------
    data : FederatedData

    Raises DataError for an unknown name or option, a missing required option, or a data file that
    is missing or corrupt.
    """
    if name not in DATASETS:
        raise DataError(f"unknown dataset {name!r}; valid: {', '.join(DATASETS)}")
    loader = _loader(name)
    if name == "synthetic":
        if path is not None:
            raise DataError(f"the synthetic dataset is generated and reads no file, but data.path={path} is set")
    else:
        options["path"] = path
    params = inspect.signature(loader).parameters
    valid = [p for p in params if p not in ("seed", "path")]
    unknown = sorted(set(options) - set(params))
    if unknown:
        raise DataError(f"{name}: unknown option(s) {', '.join(unknown)}; valid: {', '.join(valid)}")
    missing = [p for p, spec in params.items() if spec.default is spec.empty and p not in options and p != "seed"]
    if missing:
        raise DataError(f"{name}: missing option(s) {', '.join(missing)}")
    return loader(seed=seed, **options)
