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
  education-num when education is included, since it is education coded as a number).

Scaling into the unit ball (the DP sensitivity needs ||x|| <= 1), by ``scaling``
(:data:`testbed.data.split.SCALINGS`):

- ``"per_node"`` (default): numeric columns standardised to zero mean and unit variance over the
  node's own rows, then the node's rows divided by the node's own largest row norm;
- ``"public_bound"``: no statistic of the data. Each numeric column goes through a fixed map into
  [0, 1] built from public knowledge of the census fields, not from the file (:data:`PUBLIC_MAPS`:
  age / 100, hours-per-week / 168 hours in a week, education-num / 16 codebook levels, and
  log1p(v) / log1p(cap) for the dollar amounts and the sampling weight with a fixed cap), clipped
  to [0, 1]; the one-hot part of a row has norm exactly sqrt(F) for F fields and the k numeric
  entries add at most k to its squared norm, so every row is divided by the public bound
  sqrt(F + k) (sqrt(F) without numeric columns);
- ``"pooled"`` (the papers'): numeric columns standardised over the whole file, then every row
  divided by the largest row norm of the file (:func:`testbed.data.split.scale_to_unit_ball`).

With the default one-hot features every row has norm sqrt(F), so the three give identical
features: every row ends with norm exactly 1.

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

    >>> data = load_adult("adult-1")  # the package's copy when no other is found  # doctest: +SKIP
    >>> data.num_nodes, data.dim, data.node_names[0]  # doctest: +SKIP
    (16, 86, 'HS-grad')
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from testbed.data.cache import DataFile, resolve
from testbed.data.federated import FederatedData
from testbed.data.registry import Registration
from testbed.data.split import (
    check_scaling,
    node_rows,
    scale_to_unit_ball,
    scale_to_unit_ball_per_node,
    split_flat,
    standardise_per_node,
)
from testbed.errors import DataError
from testbed.streams.rng import GLOBAL, Purpose, stream

if TYPE_CHECKING:
    from testbed.data.section import DataSection

ADULT = DataFile(
    name="adult",
    filename="adult.data",
    url="https://archive.ics.uci.edu/ml/machine-learning-databases/adult/adult.data",
    sha256="5b00264637dbfec36bdeaab5676b0b309ff9eb788d63554ca0a249491c86603d",
    how_to_get="adult.data is the UCI Adult training file (https://archive.ics.uci.edu/dataset/2/adult, CC BY 4.0).",
    bundled="adult.data.xz",
)

COLUMNS = (
    "age", "workclass", "fnlwgt", "education", "education-num", "marital-status", "occupation",
    "relationship", "race", "sex", "capital-gain", "capital-loss", "hours-per-week", "native-country",
    "income",
)  # fmt: skip
CATEGORICAL = ("workclass", "marital-status", "occupation", "relationship", "race", "sex", "native-country")
NUMERIC = ("age", "fnlwgt", "capital-gain", "capital-loss", "hours-per-week")
PARTITIONS = ("adult-1", "adult-2")

#: scaling = "public_bound": a fixed map of each numeric column into [0, 1] (then clipped to it),
#: from what is publicly known about the census field, never from the file's values.
PUBLIC_MAPS = {
    "age": lambda v: v / 100.0,  # years; a human-lifespan bound
    "fnlwgt": lambda v: np.log1p(v) / np.log1p(1e7),  # persons a record stands for; fixed cap 1e7
    "education-num": lambda v: v / 16.0,  # the codebook's 16 education levels, coded 1..16
    "capital-gain": lambda v: np.log1p(v) / np.log1p(1e5),  # US dollars, a five-digit field
    "capital-loss": lambda v: np.log1p(v) / np.log1p(1e5),  # US dollars, a five-digit field
    "hours-per-week": lambda v: v / 168.0,  # hours in a week
}


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


def _features(cols: dict[str, tuple[str, ...]], include_education: bool, numeric: bool
              ) -> tuple[np.ndarray, np.ndarray, int]:
    """Unscaled features: the one-hot part [N, d_cat] (0/1), the raw numeric columns [k, N] (each
    contiguous) and the number F of one-hot fields."""
    categorical = CATEGORICAL + (("education",) if include_education else ())
    encoded = [_encode(cols[c]) for c in categorical]
    numeric_cols = _numeric_columns(include_education, numeric)
    n = len(cols["income"])
    x = np.zeros((n, sum(len(names) for names, _ in encoded)), dtype=np.float64)
    start = 0
    for names, codes in encoded:
        x[np.arange(n), start + codes] = 1.0
        start += len(names)
    raw = np.array([np.asarray(cols[c], dtype=np.float64) for c in numeric_cols]).reshape(len(numeric_cols), n)
    return x, raw, len(categorical)


def _numeric_columns(include_education: bool, numeric: bool) -> tuple[str, ...]:
    return (NUMERIC + (("education-num",) if include_education else ())) if numeric else ()


def _pooled(one_hot: np.ndarray, raw: np.ndarray) -> np.ndarray:
    """scaling = "pooled": numeric columns standardised over the whole file, then every row divided
    by the file's largest row norm (the papers' scaling), rows in file order."""
    x = np.concatenate([one_hot, np.zeros((one_hot.shape[0], raw.shape[0]))], axis=1)
    for j, v in enumerate(raw):
        x[:, one_hot.shape[1] + j] = (v - v.mean()) / v.std()
    return scale_to_unit_ball(x)


def _scaled(one_hot: np.ndarray, raw: np.ndarray, fields: int, numeric_cols: tuple[str, ...], offsets: np.ndarray,
            scaling: str) -> np.ndarray:
    """Features of rows already in node order (node m in offsets[m]:offsets[m+1]), [N, d], scaled
    "per_node" or "public_bound"."""
    d_cat, k = one_hot.shape[1], raw.shape[0]
    x = np.empty((one_hot.shape[0], d_cat + k), dtype=np.float64)
    x[:, :d_cat] = one_hot
    x[:, d_cat:] = raw.T
    if scaling == "per_node":
        standardise_per_node(x, offsets, slice(d_cat, None))
        return scale_to_unit_ball_per_node(x, offsets)
    for j, c in enumerate(numeric_cols):
        x[:, d_cat + j] = np.clip(PUBLIC_MAPS[c](raw[j]), 0.0, 1.0)
    x /= np.sqrt(float(fields + k))  # one-hot norm² = F exactly, numeric part adds <= k
    return x


@functools.lru_cache(maxsize=4)
def _parsed(file: Path, include_education: bool, numeric: bool
            ) -> tuple[np.ndarray, np.ndarray, int, np.ndarray, tuple[str, ...]]:
    """One-hot features, raw numeric columns, F, labels and the education column of a checked file,
    parsed once per process (a sweep runs many experiments on one file in the same worker).
    Read-only: callers index copies."""
    cols = _read_columns(file)
    one_hot, raw, fields = _features(cols, include_education, numeric)
    y = (np.asarray(cols["income"]) == ">50K").astype(np.int64)
    for a in (one_hot, raw, y):
        a.flags.writeable = False
    return one_hot, raw, fields, y, cols["education"]


@functools.lru_cache(maxsize=4)
def _pooled_cached(file: Path, include_education: bool, numeric: bool) -> np.ndarray:
    one_hot, raw, _, _, _ = _parsed(file, include_education, numeric)
    x = _pooled(one_hot, raw)
    x.flags.writeable = False
    return x


def load_adult(
    partition: str,
    path: str | None = None,
    seed: int = 0,
    include_education: bool = False,
    numeric: bool = False,
    num_nodes: int = 16,
    scaling: str = "per_node",
    nodes: Sequence[int] | None = None,
) -> FederatedData:
    """Load UCI Adult, partition it over nodes, scale it into the unit ball and split every node 80/10/10.

    Input
    -----
    partition : str
        ``"adult-1"`` (one node per education level) or ``"adult-2"`` (i.i.d.).
    path : str, optional
        adult.data, or a directory holding it; else ``$TESTBED_DATA``, the cache, the package's
        copy (:data:`testbed.data.cache.BUNDLED_DIR`), or a download.
    seed : int
        Seeds the adult-2 shuffle and every node's split.
    include_education : bool
        Add the one-hot of education (and education-num if ``numeric``) to the features.
    numeric : bool
        Add the standardised numeric columns.
    num_nodes : int
        Number of adult-2 nodes; adult-1 has one node per education level, so it must be 16 there.
    scaling : str
        ``"per_node"`` (default), ``"public_bound"`` or ``"pooled"``: see the module docstring.
    nodes : sequence of int, optional
        Only these node ids (in this order), e.g. a board's own; under "per_node" and
        "public_bound" their arrays are exactly those of the whole federation's nodes.

    Output
    ------
    data : FederatedData
        n_classes 2; x float64 of width 86 by default (102 with education, +5 or +6 numeric), every
        row norm <= 1; y int64 in {0, 1}.

    Example
    -------
    >>> data = load_adult("adult-2", seed=1)  # doctest: +SKIP
    >>> data.train.sizes[:2]  # doctest: +SKIP
    array([1628, 1628])
    """
    if partition not in PARTITIONS:
        raise DataError(f"unknown Adult partition {partition!r}; valid: {', '.join(PARTITIONS)}")
    check_scaling(scaling)
    file = resolve(ADULT, path)
    one_hot, raw, fields, y, education = _parsed(file, include_education, numeric)
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

    node_ids, rows, sub_offsets = node_rows(rows, sizes, nodes, partition)
    if scaling == "pooled":
        x = _pooled_cached(file, include_education, numeric)[rows]
    else:
        x = _scaled(one_hot[rows], raw[:, rows], fields, _numeric_columns(include_education, numeric),
                    sub_offsets, scaling)
    return split_flat(x, y[rows], sub_offsets, seed=seed, n_classes=2, name=partition,
                      node_names=tuple(node_names[m] for m in node_ids), node_ids=node_ids)


def _options(d: "DataSection") -> dict[str, Any]:
    return dict(include_education=d.include_education, numeric=d.numeric)


def _files(path: str | None) -> list[Path]:
    return [resolve(ADULT, path)]


REGISTRATION = (
    Registration("adult-1", functools.partial(load_adult, "adult-1"), _options, order=10, source_files=_files),
    Registration("adult-2", functools.partial(load_adult, "adult-2"),
                 lambda d: dict(_options(d), num_nodes=d.num_nodes), order=11, source_files=_files),
)
