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
from pathlib import Path
from typing import Any, Callable

from testbed.data.federated import FederatedData, Split
from testbed.data.split import SCALINGS, check_scaling
from testbed.errors import DataError

#: Valid dataset names.
DATASETS = ("synthetic", "adult-1", "adult-2", "vehicle-1", "vehicle-2", "regression", "mnist", "digits", "cifar10")

#: Features of a flat row of the image sets (channels × height × width), known before loading.
IMAGE_FEATURES = {"mnist": 784, "digits": 64, "cifar10": 3072}

__all__ = ["DATASETS", "IMAGE_FEATURES", "SCALINGS", "FederatedData", "Split", "load_dataset", "source_files"]


def _loader(name: str) -> Callable[..., FederatedData]:
    """The function behind ``name``, with the partition already bound for the file-based sets."""
    if name == "synthetic":
        from testbed.data.synthetic import make_logistic

        return make_logistic
    if name == "regression":
        from testbed.data.regression import make_regression

        return make_regression
    if name.startswith("adult-"):
        from testbed.data.adult import load_adult

        return functools.partial(load_adult, name)
    if name in IMAGE_FEATURES:
        from testbed.data.images import load_images

        return functools.partial(load_images, name)
    from testbed.data.vehicle import load_vehicle

    return functools.partial(load_vehicle, name)


def source_files(name: str, path: str | None = None) -> list[Path]:
    """The files the loader of the file-based set ``name`` reads, found (or downloaded) as it finds
    them (``path``: config ``data.path``); what a cache of its federation is keyed by."""
    from testbed.data.cache import resolve

    if name.startswith("adult-"):
        from testbed.data.adult import ADULT

        return [resolve(ADULT, path)]
    if name.startswith("vehicle-"):
        from testbed.data.vehicle import VEHICLE

        return [resolve(VEHICLE, path)]
    if name in IMAGE_FEATURES:
        from testbed.data.images import source_files as image_files

        return image_files(name, path)
    raise DataError(f"{name} reads no file")


def load_dataset(name: str, *, seed: int, path: str | None = None, scaling: str = "per_node",
                 **options: Any) -> FederatedData:
    """Load or generate a dataset, partitioned over nodes, scaled into the unit ball and split
    80/10/10 on every node.

    Input
    -----
    name : str
        One of :data:`DATASETS`.
    seed : int
        The run's seed; it drives every random choice (synthetic draws, i.i.d. partitions, splits).
    path : str, optional
        The data file or its directory (config ``data.path``); not allowed for ``"synthetic"``.
    scaling : str
        How rows are put into the unit ball (config ``data.scaling``), one of
        :data:`testbed.data.split.SCALINGS`: ``"per_node"`` (default: each node's own statistics),
        ``"public_bound"`` (no statistic of the data) or ``"pooled"`` (statistics of the whole
        data set, as the papers do; a privacy leak between nodes). Each loader documents what it
        does for each.
    **options :
        The loader's own options: :func:`testbed.data.synthetic.make_logistic` (num_nodes,
        samples_per_node, dim, n_classes, heterogeneity, nodes, bayes_accuracy, dtype, splits),
        :func:`testbed.data.adult.load_adult` (include_education, numeric, num_nodes, nodes) or
        :func:`testbed.data.vehicle.load_vehicle` (num_nodes, nodes) or
        :func:`testbed.data.regression.make_regression` (num_nodes, samples_per_node, dim, outputs, nodes) or
        :func:`testbed.data.images.load_images` (num_nodes, samples_per_node, parts, part_samples,
        part_noise, partition, alpha, nodes). ``nodes``: only these node
        ids, e.g. a board's own (identical to selecting them from the whole federation under
        "per_node" and "public_bound").

    Output
    ------
    data : FederatedData

    Raises DataError for an unknown name or option, a missing required option, or a data file that
    is missing or corrupt.
    """
    if name not in DATASETS:
        raise DataError(f"unknown dataset {name!r}; valid: {', '.join(DATASETS)}")
    check_scaling(scaling)
    loader = _loader(name)
    if name in ("synthetic", "regression"):
        if path is not None:
            raise DataError(f"the {name} dataset is generated and reads no file, but data.path={path} is set")
    elif name == "digits":
        if path is not None:
            raise DataError(f"the digits data set comes with scikit-learn and reads no file, but data.path={path} is set")
    else:
        options["path"] = path
    params = inspect.signature(loader).parameters
    valid = [p for p in params if p not in ("seed", "path", "scaling")]
    unknown = sorted(set(options) - set(params))
    if unknown:
        raise DataError(f"{name}: unknown option(s) {', '.join(unknown)}; valid: {', '.join(valid)}")
    missing = [p for p, spec in params.items() if spec.default is spec.empty and p not in options and p != "seed"]
    if missing:
        raise DataError(f"{name}: missing option(s) {', '.join(missing)}")
    return loader(seed=seed, scaling=scaling, **options)
