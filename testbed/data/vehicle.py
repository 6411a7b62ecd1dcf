"""The Vehicle sensor set (Duarte & Hu 2004) in MOCHA's ``vehicle.mat`` layout, DP-PASGD's partitions.

File layout (MOCHA, Smith et al. 2017, and the loaders of Ditto and q-FFL that read the same file):

- ``X``: a cell array with one cell per sensor (23 sensors; stored 23 x 1, read in Python as
  ``mat["X"][i][0]``); ``X{i}`` is an n_i x 100 double matrix, one row per sample;
- ``Y``: a cell array of the same shape; ``Y{i}`` is n_i x 1 with labels in {-1, +1}.

Any cell shape with one cell per sensor is accepted (cells are taken in MATLAB's linear order).
Labels {-1, +1} (or {0, 1}) map to {0, 1}. No checksum or download source is known, so the file
must be provided (config ``data.path`` or ``$TESTBED_DATA/vehicle/vehicle.mat``).

Scaling into the unit ball (the DP sensitivity needs ||x|| <= 1), by ``scaling``
(:data:`testbed.data.split.SCALINGS`):

- ``"per_node"`` (default): each node standardises every column over its own rows (a column
  constant on the node becomes 0 there; a one-row node gets all zeros), then divides its rows by
  its own largest row norm;
- ``"public_bound"``: the features (acoustic and seismic spectral measurements of unknown units)
  have no public bound, so no row can be divided by one. Instead a fixed map that uses no
  statistic: the signed logarithm sign(x) log1p(|x|) per entry (it compresses spectral energies
  spanning orders of magnitude and is close to the identity for |x| << 1), then every row is
  clipped to norm <= 1 (:func:`testbed.data.split.clip_to_unit_ball`: longer rows are projected
  onto the unit sphere, keeping their direction). No row's features depend on any other row;
- ``"pooled"`` (the papers'): standardised per column over all samples of the file (so Vehicle-1
  and Vehicle-2 hold the same feature vectors), then every row divided by the largest row norm of
  the file (:func:`testbed.data.split.scale_to_unit_ball`).

Partitions:

- ``vehicle-1``: one node per sensor, in file order (``node_names`` ``"sensor-0"`` ...); the paper
  reports 23 nodes with mean 1,899 and std 349 samples.
- ``vehicle-2``: i.i.d.: all samples shuffled with ``stream(seed, GLOBAL, -1, DATA)`` and cut into
  ``num_nodes`` (23) equal blocks, the first ``N mod num_nodes`` one larger (23 x 1,899 in the paper).

Then each node is split 80/10/10 (:mod:`testbed.data.split`).

Example::

    >>> write_vehicle_mat("/tmp/vehicle.mat", sizes=[30, 40, 50], dim=4)
    >>> load_vehicle("vehicle-1", path="/tmp/vehicle.mat").train.sizes
    array([24, 32, 40])
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Sequence

import numpy as np

from testbed.data.cache import DataFile, resolve
from testbed.data.federated import FederatedData
from testbed.data.registry import Registration
from testbed.data.split import (
    check_scaling,
    clip_to_unit_ball,
    node_rows,
    scale_to_unit_ball,
    scale_to_unit_ball_per_node,
    split_flat,
    standardise_per_node,
)
from testbed.errors import DataError
from testbed.streams.rng import GLOBAL, Purpose, stream

VEHICLE = DataFile(
    name="vehicle",
    filename="vehicle.mat",
    url=None,
    sha256=None,
    how_to_get=(
        "vehicle.mat is the Vehicle Sensor data set (Duarte & Hu 2004) as packaged for MOCHA "
        "(Smith et al. 2017): cell arrays X (n_i x 100 features) and Y (n_i x 1 labels in {-1,+1}), "
        "one cell per sensor."
    ),
)
PARTITIONS = ("vehicle-1", "vehicle-2")


def _cells(file: Path, mat: dict, key: str) -> list[np.ndarray]:
    cells = mat.get(key)
    if not isinstance(cells, np.ndarray) or cells.dtype != object:
        raise DataError(f"{file}: no cell array {key!r} (expected MOCHA's vehicle.mat with cell arrays X and Y)")
    return [np.asarray(c) for c in cells.ravel(order="F")]


def _read(file: Path) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Per-sensor features [n_i, d] float64 and labels [n_i] int64 in {0, 1}, validated."""
    import scipy.io  # here, not at import: the registry imports this module on every node

    try:
        mat = scipy.io.loadmat(file)
    except NotImplementedError as err:  # scipy's answer to MATLAB v7.3 (HDF5) files
        raise DataError(f"{file}: {err}; save it with MATLAB's -v7 option") from err
    except (scipy.io.matlab.MatReadError, ValueError, OSError) as err:
        raise DataError(f"{file}: not a readable .mat file ({err})") from err
    xs, ys = _cells(file, mat, "X"), _cells(file, mat, "Y")
    if len(xs) != len(ys) or not xs:
        raise DataError(f"{file}: X has {len(xs)} cells and Y {len(ys)}; expected one per sensor in both")
    dim = xs[0].shape[1] if xs[0].ndim == 2 else -1
    features, labels = [], []
    for i, (x, y) in enumerate(zip(xs, ys)):
        if x.ndim != 2 or x.shape[1] != dim or y.size != x.shape[0]:
            raise DataError(
                f"{file}: sensor {i}: X{{i}} is {x.shape} and Y{{i}} {y.shape}; "
                f"expected n x {dim} features and n labels"
            )
        x = x.astype(np.float64)
        if not np.isfinite(x).all():
            raise DataError(f"{file}: sensor {i}: X{{i}} holds NaN or infinite values")
        y = y.ravel()
        values = set(np.unique(y).tolist())
        if not (values <= {-1, 1} or values <= {0, 1}):
            raise DataError(f"{file}: sensor {i}: labels {sorted(values)[:4]}, expected -1/+1 (or 0/1)")
        features.append(x)
        labels.append((y > 0).astype(np.int64))
    return features, labels


def _standardise(x: np.ndarray) -> np.ndarray:
    """Zero mean, unit variance per column, in place; constant columns become 0."""
    x -= x.mean(axis=0)
    std = x.std(axis=0)
    x /= np.where(std > 0, std, 1.0)
    return x


def _public_bound(x: np.ndarray) -> np.ndarray:
    """scaling = "public_bound": signed log1p per entry, then rows clipped to norm <= 1, in place."""
    np.copysign(np.log1p(np.abs(x)), x, out=x)
    return clip_to_unit_ball(x)


def load_vehicle(
    partition: str,
    path: str | None = None,
    seed: int = 0,
    num_nodes: int | None = None,
    scaling: str = "per_node",
    nodes: Sequence[int] | None = None,
) -> FederatedData:
    """Load the Vehicle sensor set, partition it over nodes, scale it into the unit ball and split
    every node 80/10/10.

    Input
    -----
    partition : str
        ``"vehicle-1"`` (one node per sensor) or ``"vehicle-2"`` (i.i.d.).
    path : str, optional
        vehicle.mat, or a directory holding it; else ``$TESTBED_DATA`` or the cache.
    seed : int
        Seeds the vehicle-2 shuffle and every node's split.
    num_nodes : int, optional
        Number of vehicle-2 nodes; default the number of sensors (23). Vehicle-1 has one node per
        sensor, so any other value is an error there.
    scaling : str
        ``"per_node"`` (default), ``"public_bound"`` or ``"pooled"``: see the module docstring.
    nodes : sequence of int, optional
        Only these node ids (in this order), e.g. a board's own; under "per_node" and
        "public_bound" their arrays are exactly those of the whole federation's nodes.

    Output
    ------
    data : FederatedData
        n_classes 2; x float64 [., d] (d = 100 for the real file), every row norm <= 1; y int64 in {0, 1}.

    Example
    -------
    >>> write_vehicle_mat("/tmp/vehicle.mat", sizes=[30, 40, 50], dim=4)
    >>> load_vehicle("vehicle-2", path="/tmp/vehicle.mat", seed=3).train.sizes
    array([32, 32, 32])
    """
    if partition not in PARTITIONS:
        raise DataError(f"unknown Vehicle partition {partition!r}; valid: {', '.join(PARTITIONS)}")
    check_scaling(scaling)
    file = resolve(VEHICLE, path)
    xs, ys = _read(file)
    x = np.concatenate(xs)
    if scaling == "pooled":  # before the partition, in file order: the papers' numbers exactly
        x = scale_to_unit_ball(_standardise(x))
    y = np.concatenate(ys)
    n = len(y)

    if partition == "vehicle-1":
        if num_nodes is not None and num_nodes != len(xs):
            raise DataError(
                f"vehicle-1 has one node per sensor ({len(xs)} in {file}); num_nodes={num_nodes} is not possible"
            )
        sizes = np.array([len(y_i) for y_i in ys])
        rows = np.arange(n)
        node_names = tuple(f"sensor-{i}" for i in range(len(xs)))
    else:
        m = len(xs) if num_nodes is None else num_nodes
        if not 1 <= m <= n:
            raise DataError(f"vehicle-2: num_nodes must be between 1 and {n}, got {m}")
        rows = stream(seed, GLOBAL, -1, Purpose.DATA).permutation(n)
        sizes = np.full(m, n // m)
        sizes[: n % m] += 1
        node_names = tuple(f"iid-{k}" for k in range(m))

    node_ids, rows, sub_offsets = node_rows(rows, sizes, nodes, partition)
    x = x[rows]
    if scaling == "per_node":
        scale_to_unit_ball_per_node(standardise_per_node(x, sub_offsets), sub_offsets)
    elif scaling == "public_bound":
        _public_bound(x)
    return split_flat(x, y[rows], sub_offsets, seed=seed, n_classes=2, name=partition,
                      node_names=tuple(node_names[m] for m in node_ids), node_ids=node_ids)


def write_vehicle_mat(path: str | os.PathLike, sizes: Sequence[int], dim: int = 100, seed: int = 0) -> None:
    """Write a small synthetic file in MOCHA's vehicle.mat layout, for tests and offline demos.

    Sensor i gets sizes[i] samples from ``stream(seed, i, -1, DATA)``: labels -1/+1 with a
    sensor-specific positive rate, features N(y * mu + c_i, I) with mu shared (from the GLOBAL stream)
    and c_i a sensor offset, so the task is learnable and the sensors are non-i.i.d.

    Input
    -----
    path : str or PathLike
        Output .mat file (MATLAB v5 format).
    sizes : sequence of int
        Samples per sensor; the real file has 23 sensors.
    dim : int
        Features per sample (100 in the real file).
    seed : int
        Seed of the generated values.

    Output
    ------
    None; the file holds X and Y as len(sizes) x 1 cell arrays of double matrices,
    X{i} [sizes[i], dim] and Y{i} [sizes[i], 1] in {-1, +1}.

    Example
    -------
    >>> import scipy.io
    >>> write_vehicle_mat("/tmp/vehicle.mat", sizes=[5, 7], dim=3)
    >>> scipy.io.loadmat("/tmp/vehicle.mat")["X"][1][0].shape
    (7, 3)
    """
    import scipy.io

    mu = stream(seed, GLOBAL, -1, Purpose.DATA).standard_normal(dim) / np.sqrt(dim)
    x_cells = np.empty((len(sizes), 1), dtype=object)
    y_cells = np.empty((len(sizes), 1), dtype=object)
    for i, n in enumerate(sizes):
        rng = stream(seed, i, -1, Purpose.DATA)
        offset = 0.5 * rng.standard_normal(dim)
        positive_rate = rng.uniform(0.3, 0.7)
        y = np.where(rng.random(n) < positive_rate, 1.0, -1.0)
        x_cells[i, 0] = y[:, None] * mu + offset + rng.standard_normal((n, dim))
        y_cells[i, 0] = y[:, None]
    scipy.io.savemat(path, {"X": x_cells, "Y": y_cells})


def _files(path: str | None) -> list[Path]:
    return [resolve(VEHICLE, path)]


REGISTRATION = tuple(Registration(name, functools.partial(load_vehicle, name), order=20 + i, source_files=_files)
                     for i, name in enumerate(PARTITIONS))
