"""A file-based set's federation written once to disk and memory-mapped: its lazy nodes' rows.

With lazy nodes (testbed.assembly.assemble.holds_lazily) a file-based set (Adult, Vehicle, the image sets)
is partitioned, scaled and split once by its own loader, and the result is written in node order
as .npy arrays under ``<cache>/federations/<dataset>-<key>/`` (the cache of
:func:`testbed.util.cache_folder.cache_dir`). Every later run opens it: :meth:`MappedFederation.nodes`
maps the arrays (``np.load(mmap_mode="r")``), gathers the asked-for nodes' rows with one fancy
index per array, so only their pages are read, and unmaps them. The rows are the eager loader's,
bit for bit; only the first run, which writes them, holds the whole federation.

The key (:func:`federation_dir`) is a sha256 of everything the rows depend on: the dataset and its
loader options, seed, scaling and dtype, the content of every file the loader reads, and the source
of the loaders themselves (testbed/data/*.py), so a changed input never reuses a stale cache.

A cache directory holds, for each split of train, test and validation, ``<split>.x.npy`` (R, d),
``<split>.y.npy`` (R,) int64 and ``<split>.offsets.npy`` (M + 1,) int64; ``digests.npy`` (3, M)
uint64, a blake2b-64 of each node's x and y bytes per split, checked whenever a node's rows are
read (a corrupt file is an error that removes the cache, never rows silently wrong); and
``meta.json`` (n_classes, name, node_names, the features' dtype, and a sha256 over them, the offsets
and the digests). It is written into a temporary directory and renamed when complete; one that is
incomplete, altered outside the rows, or does not fit together is written again.

Example::

    >>> fed = open_or_build(federation_dir({"dataset": "adult-2", "seed": 0}, [adult_file]),
    ...                     lambda: load_dataset("adult-2", seed=0))  # doctest: +SKIP
    >>> fed.nodes([3, 1]).train.sizes  # doctest: +SKIP
    array([1628, 1628])
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from testbed.data.cache import sha256_of
from testbed.data.federated import FederatedData, Split, rows_of
from testbed.data.split import SPLITS
from testbed.errors import DataError
from testbed.util.cache_folder import cache_dir
from testbed.util import jsontext


def federation_dir(params: dict[str, Any], sources: Sequence[Path]) -> Path:
    """The cache directory of the federation that ``params`` (JSON-able: ``dataset`` and whatever
    else its rows depend on) make from the files ``sources``."""
    key = hashlib.sha256(jsontext.dumps(params, sort_keys=True).encode())
    for file in sources:
        key.update(sha256_of(file).encode())
    for module in sorted(Path(__file__).parent.glob("*.py")):  # a changed loader: other rows
        key.update(module.read_bytes())
    return cache_dir() / "federations" / f"{params['dataset']}-{key.hexdigest()[:32]}"


def _digest(x: np.ndarray, y: np.ndarray) -> int:
    """blake2b-64 of one node's rows of one split (x then y bytes)."""
    h = hashlib.blake2b(np.ascontiguousarray(x).data, digest_size=8)
    h.update(np.ascontiguousarray(y).data)
    return int.from_bytes(h.digest(), "little")


def _sealed(meta: dict[str, Any], offsets: Sequence[np.ndarray], digests: np.ndarray) -> str:
    """sha256 over the description, every split's offsets and the digests: what the per-node
    digests do not cover."""
    h = hashlib.sha256(jsontext.dumps(meta, sort_keys=True).encode())
    for a in (*offsets, digests):
        h.update(np.ascontiguousarray(a).data)
    return h.hexdigest()


def write(directory: Path, data: FederatedData) -> None:
    """Write ``data`` (a whole federation, nodes 0..M-1) as the cache ``directory``, atomically."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", dir=directory.parent))
    try:
        digests = np.empty((len(SPLITS), data.num_nodes), dtype=np.uint64)
        offsets = []
        for k, name in enumerate(SPLITS):
            split: Split = getattr(data, name)
            offsets.append(np.asarray(split.offsets, dtype=np.int64))
            np.save(tmp / f"{name}.x.npy", np.ascontiguousarray(split.x))
            np.save(tmp / f"{name}.y.npy", np.ascontiguousarray(split.y, dtype=np.int64))
            np.save(tmp / f"{name}.offsets.npy", offsets[-1])
            digests[k] = [_digest(*split.node_slice(m)) for m in range(data.num_nodes)]
        np.save(tmp / "digests.npy", digests)
        meta = {"n_classes": data.n_classes, "name": data.name, "node_names": list(data.node_names),
                "dtype": str(data.train.x.dtype)}
        (tmp / "meta.json").write_text(jsontext.dumps(dict(meta, sha256=_sealed(meta, offsets, digests))))
        try:
            tmp.rename(directory)
        except OSError:  # another run wrote it first: the same rows, keep theirs
            if not (directory / "meta.json").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class MappedFederation:
    """An opened cache directory: every node's layout in memory, the rows on disk.

    Raises ValueError, KeyError or OSError when the directory is incomplete or its files do not
    fit together (:func:`open_or_build` writes it again then).
    """

    def __init__(self, directory: Path):
        self.directory = directory
        meta = json.loads((directory / "meta.json").read_text())
        sealed = meta.pop("sha256")
        self.offsets = [np.load(directory / f"{name}.offsets.npy") for name in SPLITS]
        self.digests = np.load(directory / "digests.npy")
        if sealed != _sealed(meta, self.offsets, self.digests):
            raise ValueError(f"{directory}: meta.json, the offsets or the digests were altered")
        self.n_classes: int = int(meta["n_classes"])
        self.name: str = str(meta["name"])
        self.node_names: list[str] = list(meta["node_names"])
        m = len(self.node_names)
        dims = set()
        for name, offsets in zip(SPLITS, self.offsets):
            x, y = self.arrays(name)  # np.load checks each header against the file's length
            if (offsets.shape != (m + 1,) or offsets[0] != 0 or np.any(np.diff(offsets) < 0) or x.ndim != 2
                    or x.shape[0] != offsets[-1] or y.shape != (offsets[-1],) or x.dtype != meta["dtype"]
                    or y.dtype != np.int64):
                raise ValueError(f"{directory}: {name}'s arrays do not fit its offsets")
            dims.add(x.shape[1])
        if len(dims) != 1 or self.digests.shape != (len(SPLITS), m) or self.digests.dtype != np.uint64:
            raise ValueError(f"{directory}: the splits or digests do not fit together")
        self.dim: int = dims.pop()

    @property
    def num_nodes(self) -> int:
        return len(self.node_names)

    def arrays(self, split: str) -> tuple[np.memmap, np.memmap]:
        """``split``'s x (R, d) and y (R,), memory-mapped read-only (unmapped when dropped)."""
        return (np.load(self.directory / f"{split}.x.npy", mmap_mode="r"),
                np.load(self.directory / f"{split}.y.npy", mmap_mode="r"))

    def nodes(self, node_ids: Sequence[int], keep: Sequence[str] = SPLITS) -> FederatedData:
        """The rows of ``node_ids`` (global ids, in this order) in the splits ``keep`` (the others
        none), read now and checked against their digests. Raises DataError for an id outside
        0..M-1, or (after removing the cache, which the next run writes again) for rows that do not
        match their digest."""
        ids = np.asarray(node_ids, dtype=np.int64).reshape(-1)
        if ids.size and (ids.min() < 0 or ids.max() >= self.num_nodes):
            raise DataError(f"{self.name}: nodes {ids[(ids < 0) | (ids >= self.num_nodes)].tolist()} "
                            f"are not in 0..{self.num_nodes - 1}")
        splits = []
        for k, name in enumerate(SPLITS):
            rows, offsets = rows_of(self.offsets[k], ids)
            if name not in keep:  # no rows, of the split's own types
                x_map, y_map = self.arrays(name)
                splits.append(Split(x=np.array(x_map[:0]), y=np.array(y_map[:0]), offsets=np.zeros_like(offsets)))
                continue
            x_map, y_map = self.arrays(name)
            x, y = x_map[rows], y_map[rows]
            del x_map, y_map
            for i, node in enumerate(ids.tolist()):  # per node, not per sample: K digests a round
                if _digest(x[offsets[i]:offsets[i + 1]], y[offsets[i]:offsets[i + 1]]) != self.digests[k, node]:
                    shutil.rmtree(self.directory, ignore_errors=True)
                    raise DataError(f"{self.directory}: node {node}'s {name} rows do not match their digest "
                                    "(the cache is corrupt); it has been removed: run again to write it anew")
            splits.append(Split(x=np.asarray(x), y=np.asarray(y), offsets=offsets))
        return FederatedData(*splits, n_classes=self.n_classes, name=self.name,
                             node_names=tuple(self.node_names[m] for m in ids.tolist()), node_ids=tuple(ids.tolist()))


def open_or_build(directory: Path, build: Callable[[], FederatedData]) -> MappedFederation:
    """The cache ``directory``, first written from ``build()`` (the eager loader's whole
    federation, then dropped) when it is missing, incomplete or does not fit together."""
    if directory.is_dir():
        try:
            return MappedFederation(directory)
        except (OSError, ValueError, KeyError, TypeError):
            shutil.rmtree(directory, ignore_errors=True)
    try:
        write(directory, build())
    except OSError as err:
        raise DataError(f"cannot write the lazy nodes' cache {directory} ({err}); set $TESTBED_CACHE "
                        "to a directory with room for the whole federation") from err
    return MappedFederation(directory)
