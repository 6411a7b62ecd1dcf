"""CIFAR-10 (Krizhevsky 2009) from its "python version": the pickled batches ``data_batch_1`` ..
``data_batch_5`` and ``test_batch`` of ``cifar-10-batches-py/``, 60,000 32×32 colour images of 10
classes, read as one pool (testbed.data.images partitions it).

Where the batches come from, first found:

1. ``data.path``: a directory holding the batches (or ``cifar-10-batches-py/`` with them), or the
   archive ``cifar-10-python.tar.gz`` itself or a directory holding it (sha256 checked);
2. ``$TESTBED_DATA/cifar10/`` (or ``$TESTBED_DATA``): the same;
3. the cache, ``~/.cache/testbed/cifar10/``: the same;
4. a download of the archive from the authors' page into the cache (sha256 checked).

The batches are pickles: they are read by an unpickler that builds only dicts, lists, numbers,
bytes and numpy arrays (no other class is ever imported or called), then checked: uint8 rows of
3,072 values (1,024 red, then green, then blue: channel-major, as a CNN reshapes them) and labels
in 0..9. Members of the archive are read in memory, never extracted.

Example::

    >>> x, y = read_pool("/data/cifar10")  # doctest: +SKIP
    >>> x.shape, x.dtype, y.shape
    ((60000, 3072), dtype('uint8'), (60000,))
"""

from __future__ import annotations

import io
import os
import pickle
import tarfile
from pathlib import Path

import numpy as np

from testbed.data.cache import DATA_ENV, DataFile, resolve
from testbed.errors import DataError
from testbed.util.cache_folder import cache_dir

FOLDER = "cifar-10-batches-py"
BATCHES = ("data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5", "test_batch")
FEATURES = 3 * 32 * 32
_ARCHIVE = DataFile("cifar10", "cifar-10-python.tar.gz", url="https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
                    sha256="6d958be074577803d12ecdefd02955f39262c83c16fe9348329d7fe0b5c001ce",
                    how_to_get="CIFAR-10's python version is at https://www.cs.toronto.edu/~kriz/cifar.html.")
#: The only globals a CIFAR-10 batch refers to (numpy's array reconstruction; Python 3 protocol-2
#: pickles of bytes go through _codecs.encode).
_ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
            ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode")}


class _BatchUnpickler(pickle.Unpickler):
    """Builds plain data and numpy arrays only: any other global in the stream is refused."""

    def find_class(self, module: str, name: str):
        if (module, name) not in _ALLOWED:
            raise pickle.UnpicklingError(f"refusing {module}.{name}")
        if name == "_reconstruct":
            from numpy._core.multiarray import _reconstruct

            return _reconstruct
        return super().find_class(module, name)


def read_batch(raw: bytes, name: str) -> tuple[np.ndarray, np.ndarray]:
    """One pickled batch → (images (n, 3072) uint8, labels (n,) int64); DataError if it is not one."""
    try:
        batch = _BatchUnpickler(io.BytesIO(raw), encoding="bytes").load()
    except Exception as err:  # any malformed pickle: one line naming the file
        raise DataError(f"{name}: not a CIFAR-10 python batch ({err})") from None
    if not isinstance(batch, dict) or b"data" not in batch or b"labels" not in batch:
        raise DataError(f"{name}: not a CIFAR-10 python batch (no data and labels)")
    x, labels = batch[b"data"], batch[b"labels"]
    if not isinstance(x, np.ndarray) or x.dtype != np.uint8 or x.ndim != 2 or x.shape[1] != FEATURES:
        raise DataError(f"{name}: data must be uint8 rows of {FEATURES} pixels, got "
                        f"{getattr(x, 'dtype', type(x).__name__)} {getattr(x, 'shape', '')}")
    y = np.asarray(labels)
    if y.shape != (x.shape[0],) or not np.issubdtype(y.dtype, np.integer) or (y.size and (y.min() < 0 or y.max() > 9)):
        raise DataError(f"{name}: {x.shape[0]} images need as many labels in 0..9")
    return x, y.astype(np.int64)


def _batch_folder(directory: Path) -> Path | None:
    """The folder under ``directory`` holding all six batches, if any."""
    for folder in (directory, directory / FOLDER, directory / "cifar10", directory / "cifar10" / FOLDER):
        if all((folder / b).is_file() for b in BATCHES):
            return folder
    return None


def _from_archive(archive: Path) -> list[bytes]:
    with tarfile.open(archive, "r:gz") as tar:
        try:
            return [tar.extractfile(f"{FOLDER}/{b}").read() for b in BATCHES]  # type: ignore[union-attr]
        except (KeyError, AttributeError):
            raise DataError(f"{archive}: no {FOLDER}/ batches in the archive") from None


def batch_files(path: str | os.PathLike | None) -> list[Path]:
    """The six batch files, or the archive alone, from the first source of the module docstring
    that has them."""
    if path is not None:
        given = Path(path).expanduser()
        folder = _batch_folder(given) if given.is_dir() else None
        return [folder / b for b in BATCHES] if folder is not None else [resolve(_ARCHIVE, given)]
    for root in ([Path(os.environ[DATA_ENV]).expanduser()] if os.environ.get(DATA_ENV) else []) + [cache_dir() / "cifar10"]:
        folder = _batch_folder(root) if root.is_dir() else None
        if folder is not None:
            return [folder / b for b in BATCHES]
    return [resolve(_ARCHIVE)]


def batch_bytes(path: str | os.PathLike | None) -> list[bytes]:
    """The six batches' bytes (:func:`batch_files`, read in memory from the archive)."""
    files = batch_files(path)
    return [f.read_bytes() for f in files] if len(files) == len(BATCHES) else _from_archive(files[0])


def present(path: str | os.PathLike | None = None) -> bool:
    """Whether the batches or the archive are on this machine (``path``, $TESTBED_DATA, the cache),
    without downloading anything."""
    roots = [Path(path).expanduser()] if path is not None else []
    roots += [Path(os.environ[DATA_ENV]).expanduser()] if os.environ.get(DATA_ENV) else []
    roots.append(cache_dir() / "cifar10")
    for root in roots:
        if root.is_file() or (root.is_dir() and (_batch_folder(root) is not None or (root / _ARCHIVE.filename).is_file()
                                                 or (root / "cifar10" / _ARCHIVE.filename).is_file())):
            return True
    return False


def read_pool(path: str | os.PathLike | None = None) -> tuple[np.ndarray, np.ndarray]:
    """All 60,000 images (train batches then the test batch) as (x (n, 3072) uint8, y (n,) int64)."""
    parts = [read_batch(raw, name) for raw, name in zip(batch_bytes(path), BATCHES)]
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
