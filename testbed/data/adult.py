"""UCI Adult (census income) with the two partitions of DP-PASGD (dp-pasgd.md §5.1).

The file is the canonical ``adult.data``: 32,561 rows, 15 comma+space separated columns, no
header, ``?`` for a missing value. Every row is kept: ``?`` is a category of its own.

Features (the paper trains "with just the categorical features"; the encoding is not stated):

- one-hot of workclass, marital-status, occupation, relationship, race, sex and native-country
  (86 columns; categories in sorted order, ``?`` included);
- education only with ``include_education=True`` (+16 columns). Default off: education is the
  Adult-1 partition key, so on every Adult-1 node its one-hot is a constant column, a node
  indicator rather than a feature; leaving it out gives Adult-1 and Adult-2 the same features and
  keeps the partition key out of the model, as in domain-split benchmarks. The paper is ambiguous
  (dp-pasgd.md §5.1), hence the option;
- with ``numeric=True`` also age, fnlwgt, capital-gain, capital-loss, hours-per-week (and
  education-num when education is included, since it is education coded as a number), each
  standardised to zero mean and unit variance over the whole file.

Scaling into the unit ball (the DP sensitivity needs ||x|| <= 1): every row is divided by the
largest row norm of the data set (:func:`testbed.data.split.scale_to_unit_ball`). With the default
one-hot features every row has norm sqrt(F) for F fields, so every row ends with norm exactly 1.

Labels: 1 for ``>50K``, 0 for ``<=50K``.

Partitions:

- ``adult-1``: one node per education level, 16 nodes, largest first (HS-grad 10,501 ...
  Preschool 51); ``node_names`` are the levels. Sizes have mean 2,035.06 and population std 2,911.4;
  the paper prints 4,367, which the data does not give (dp-pasgd.md §7.4).
- ``adult-2``: i.i.d.: rows shuffled with ``stream(seed, GLOBAL, -1, DATA)`` and cut into
  ``num_nodes`` (16) consecutive blocks of equal size, the first ``N mod num_nodes`` one larger
  (one node of 2,036, fifteen of 2,035).

Then each node is split 80/10/10 into train/test/validation (:mod:`testbed.data.split`).

Example::

    >>> data = load_adult("adult-1", path="/work/shared/datasets/adult")  # doctest: +SKIP
    >>> data.num_nodes, data.dim, data.node_names[0]  # doctest: +SKIP
    (16, 86, 'HS-grad')
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import numpy as np

from testbed.data.cache import DataFile, resolve
from testbed.data.federated import FederatedData
from testbed.data.split import scale_to_unit_ball, split_flat
from testbed.errors import DataError
from testbed.rng import GLOBAL, Purpose, stream

ADULT = DataFile(
    name="adult",
    filename="adult.data",
    url="https://archive.ics.uci.edu/ml/machine-learning-databases/adult/adult.data",
    sha256="5b00264637dbfec36bdeaab5676b0b309ff9eb788d63554ca0a249491c86603d",
    how_to_get="adult.data is the UCI Adult training file (https://archive.ics.uci.edu/dataset/2/adult).",
)

COLUMNS = (
    "age", "workclass", "fnlwgt", "education", "education-num", "marital-status", "occupation",
    "relationship", "race", "sex", "capital-gain", "capital-loss", "hours-per-week", "native-country",
    "income",
)  # fmt: skip
CATEGORICAL = ("workclass", "marital-status", "occupation", "relationship", "race", "sex", "native-country")
NUMERIC = ("age", "fnlwgt", "capital-gain", "capital-loss", "hours-per-week")
PARTITIONS = ("adult-1", "adult-2")


def _encode(values: tuple[str, ...]) -> tuple[list[str], np.ndarray]:
    """Sorted category names and each value's index among them (a dict pass: faster than np.unique)."""
    first_seen: dict[str, int] = {}
    codes = np.fromiter((first_seen.setdefault(v, len(first_seen)) for v in values), np.int64, len(values))
    names = sorted(first_seen)
    to_sorted = np.empty(len(names), dtype=np.int64)
    to_sorted[[first_seen[n] for n in names]] = np.arange(len(names))
    return names, to_sorted[codes]


def _read_columns(path: os.PathLike) -> dict[str, tuple[str, ...]]:
    """The 15 columns of adult.data as tuples of strings, by column name.

    No field validation: the file's checksum has been checked, so it is the canonical file.
    """
    rows = [line.split(", ") for line in Path(path).read_text(encoding="ascii").splitlines() if line]
    return dict(zip(COLUMNS, zip(*rows)))


def _features(cols: dict[str, tuple[str, ...]], include_education: bool, numeric: bool) -> np.ndarray:
    """One-hot (and standardised numeric) features [N, d], float64, scaled into the unit ball."""
    categorical = CATEGORICAL + (("education",) if include_education else ())
    encoded = [_encode(cols[c]) for c in categorical]
    numeric_cols: tuple[str, ...] = ()
    if numeric:
        numeric_cols = NUMERIC + (("education-num",) if include_education else ())
    n = len(cols["income"])
    width = sum(len(names) for names, _ in encoded) + len(numeric_cols)
    x = np.zeros((n, width), dtype=np.float64)
    start = 0
    for names, codes in encoded:
        x[np.arange(n), start + codes] = 1.0
        start += len(names)
    for c in numeric_cols:
        v = np.asarray(cols[c], dtype=np.float64)
        x[:, start] = (v - v.mean()) / v.std()
        start += 1
    return scale_to_unit_ball(x)


@functools.lru_cache(maxsize=4)
def _parsed(file: Path, include_education: bool, numeric: bool) -> tuple[np.ndarray, np.ndarray, tuple[str, ...]]:
    """Features, labels and the education column of a checked file, parsed once per process (a
    sweep runs many experiments on one file in the same worker). Read-only: callers index copies."""
    cols = _read_columns(file)
    x = _features(cols, include_education, numeric)
    y = (np.asarray(cols["income"]) == ">50K").astype(np.int64)
    x.flags.writeable = False
    y.flags.writeable = False
    return x, y, cols["education"]


def load_adult(
    partition: str,
    path: str | None = None,
    seed: int = 0,
    include_education: bool = False,
    numeric: bool = False,
    num_nodes: int = 16,
) -> FederatedData:
    """Load UCI Adult, partition it over nodes and split every node 80/10/10.

    Input
    -----
    partition : str
        ``"adult-1"`` (one node per education level) or ``"adult-2"`` (i.i.d.).
    path : str, optional
        adult.data, or a directory holding it; else ``$TESTBED_DATA``, the cache, or a download.
    seed : int
        Seeds the adult-2 shuffle and every node's split.
    include_education : bool
        Add the one-hot of education (and education-num if ``numeric``) to the features.
    numeric : bool
        Add the standardised numeric columns.
    num_nodes : int
        Number of adult-2 nodes; adult-1 has one node per education level, so it must be 16 there.

    Output
    ------
    data : FederatedData
        n_classes 2; x float64 of width 86 by default (102 with education, +5 or +6 numeric), every
        row norm <= 1; y int64 in {0, 1}.

    Example
    -------
    >>> data = load_adult("adult-2", path="/work/shared/datasets/adult", seed=1)  # doctest: +SKIP
    >>> data.train.sizes[:2]  # doctest: +SKIP
    array([1628, 1628])
    """
    if partition not in PARTITIONS:
        raise DataError(f"unknown Adult partition {partition!r}; valid: {', '.join(PARTITIONS)}")
    file = resolve(ADULT, path)
    x, y, education = _parsed(file, include_education, numeric)
    n = len(y)

    if partition == "adult-1":
        levels, level = _encode(education)
        if num_nodes != len(levels):
            raise DataError(
                f"adult-1 has one node per education level ({len(levels)} in {file}); num_nodes={num_nodes} "
                "is not possible (use adult-2 for another number of nodes)"
            )
        counts = np.bincount(level, minlength=len(levels))
        # Largest node first; ties (none in adult.data) by name, so the order never depends on luck.
        node_of_level = np.empty(len(levels), dtype=np.int64)
        node_order = sorted(range(len(levels)), key=lambda k: (-counts[k], levels[k]))
        node_of_level[node_order] = np.arange(len(levels))
        rows = np.argsort(node_of_level[level], kind="stable")
        sizes = counts[node_order]
        node_names = tuple(levels[k] for k in node_order)
    else:
        if not 1 <= num_nodes <= n:
            raise DataError(f"adult-2: num_nodes must be between 1 and {n}, got {num_nodes}")
        rows = stream(seed, GLOBAL, -1, Purpose.DATA).permutation(n)
        sizes = np.full(num_nodes, n // num_nodes)
        sizes[: n % num_nodes] += 1
        node_names = tuple(f"iid-{m}" for m in range(num_nodes))

    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    return split_flat(x[rows], y[rows], offsets, seed=seed, n_classes=2, name=partition, node_names=node_names)
