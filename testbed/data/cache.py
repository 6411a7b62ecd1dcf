"""Find a dataset file: an explicit path, then ``$TESTBED_DATA``, then the cache, then the copy
shipped with the package, then the network.

Resolution order for a file ``<name>/<filename>`` (e.g. ``adult/adult.data``):

1. ``path`` (config ``data.path``): the file itself, or a directory holding ``<filename>`` or
   ``<name>/<filename>``. A path that holds neither is an error, never silently skipped.
2. ``$TESTBED_DATA/<name>/<filename>``, then ``$TESTBED_DATA/<filename>``.
3. The cache: ``$TESTBED_CACHE/<name>/<filename>``, default ``~/.cache/testbed/<name>/<filename>``.
4. The package's compressed copy (``testbed/data/bundled/<filename>.xz``, for small files whose
   licence allows it: see the README there), unpacked into the cache, so a fresh clone runs offline.
5. A download from the file's canonical URL into the cache (short timeout; written to a temporary
   file and renamed, so an interrupted download never leaves a truncated file behind).

Whatever the source, a known sha256 is checked; a mismatch is a :class:`DataError`.

Example::

    >>> spec = DataFile("adult", "adult.data", url=None, sha256=None, how_to_get="copy it by hand")
    >>> resolve(spec, "data/adult").name  # doctest: +SKIP
    'adult.data'
"""

from __future__ import annotations

import hashlib
import http.client
import lzma
import os
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed.errors import DataError
from testbed.util.cache_folder import cache_dir

#: Directory of dataset files the user provides.
DATA_ENV = "TESTBED_DATA"
DOWNLOAD_TIMEOUT_S = 20.0
#: Compressed copies shipped with the package (source and licence in its README.md).
BUNDLED_DIR = Path(__file__).resolve().parent / "bundled"


@dataclass(frozen=True)
class DataFile:
    """What a loader needs to find one file.

    Attributes:
        name: dataset folder, e.g. ``"adult"``.
        filename: file name, e.g. ``"adult.data"``.
        url: canonical download URL, or None when there is no source to trust.
        sha256: expected hex digest, or None when unknown.
        how_to_get: one sentence telling the user where the file comes from.
        bundled: file name of an xz-compressed copy in :data:`BUNDLED_DIR`, or None.
    """

    name: str
    filename: str
    url: str | None
    sha256: str | None
    how_to_get: str
    bundled: str | None = None


# sha256 of files already read, by what identifies their content (path, inode, size, mtime): a
# lazy file set's run checks a file (resolve), keys its cache by it and may load it, one read.
_digests: dict[tuple, str] = {}


def sha256_of(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks once per process while it is unchanged."""
    st = os.stat(path)
    key = (str(Path(path).resolve()), st.st_ino, st.st_size, st.st_mtime_ns)
    if key not in _digests:
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        _digests[key] = digest.hexdigest()
    return _digests[key]


def _write_atomically(dest: Path, stream: Any) -> None:
    """Copy the binary ``stream`` to ``dest`` through a temporary file in the same directory, then
    rename: two processes writing at once, or one interrupted, never leave a truncated file behind."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
    try:
        with os.fdopen(fd, "wb") as out:
            for block in iter(lambda: stream.read(1 << 20), b""):
                out.write(block)
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def download(url: str, dest: Path, timeout_s: float = DOWNLOAD_TIMEOUT_S) -> None:
    """Fetch ``url`` to ``dest`` atomically.

    Raises OSError (including urllib's URLError and timeouts) when offline or the server fails, or
    http.client.HTTPException when the connection breaks mid-transfer.
    """
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        _write_atomically(dest, response)


def unpack(source: Path, dest: Path) -> None:
    """Decompress the xz file ``source`` to ``dest`` atomically."""
    with lzma.open(source) as packed:
        _write_atomically(dest, packed)


def bundled_copy(spec: DataFile) -> Path | None:
    """The package's compressed copy of ``spec``'s file, or None when it ships none."""
    if spec.bundled is None:
        return None
    packed = BUNDLED_DIR / spec.bundled
    return packed if packed.is_file() else None


def _check(spec: DataFile, path: Path) -> Path:
    if spec.sha256 is not None:
        actual = sha256_of(path)
        if actual != spec.sha256:
            raise DataError(
                f"{path}: sha256 {actual} does not match the expected {spec.sha256} for {spec.filename} "
                f"(corrupt or a different file); replace it with the original. {spec.how_to_get}"
            )
    return path


def _in_directory(spec: DataFile, directory: Path) -> Path | None:
    for candidate in (directory / spec.name / spec.filename, directory / spec.filename):
        if candidate.is_file():
            return candidate
    return None


def resolve(spec: DataFile, path: str | os.PathLike | None = None) -> Path:
    """The local path of a dataset file, downloading it into the cache if needed and possible.

    Input
    -----
    spec : DataFile
        The file to find.
    path : str or PathLike, optional
        The file, or a directory holding it (config ``data.path``).

    Output
    ------
    path : Path
        An existing file whose sha256 matches ``spec.sha256`` (when known).

    Raises DataError when the file is nowhere to be found or downloaded, or its checksum is wrong;
    the message says where the loader looked and how to provide the file.
    """
    if path is not None:
        given = Path(path).expanduser()
        if given.is_file():
            return _check(spec, given)
        found = _in_directory(spec, given) if given.is_dir() else None
        if found is None:
            raise DataError(
                f"{spec.filename} not found at data.path={given} (expected the file, or a directory "
                f"holding {spec.filename} or {spec.name}/{spec.filename}). {spec.how_to_get}"
            )
        return _check(spec, found)

    looked: list[str] = []
    data_root = os.environ.get(DATA_ENV)
    if data_root:
        found = _in_directory(spec, Path(data_root).expanduser())
        if found is not None:
            return _check(spec, found)
        looked.append(f"${DATA_ENV}={data_root}")
    else:
        looked.append(f"${DATA_ENV} (unset)")

    cached = cache_dir() / spec.name / spec.filename
    if cached.is_file():
        return _check(spec, cached)
    looked.append(str(cached))

    packed = bundled_copy(spec)
    if packed is not None:
        try:
            unpack(packed, cached)
            return _check(spec, cached)
        except (OSError, lzma.LZMAError, DataError) as err:
            # A damaged copy must not poison the cache; the download below may still succeed.
            cached.unlink(missing_ok=True)
            looked.append(f"{packed} ({err})")

    if spec.url is None:
        raise DataError(
            f"{spec.filename} not found (looked in {', '.join(looked)}); there is no download source. "
            f"{spec.how_to_get} Then set data.path to it or put it in ${DATA_ENV}/{spec.name}/{spec.filename}."
        )
    try:
        download(spec.url, cached)
    except (OSError, http.client.HTTPException) as err:
        raise DataError(
            f"{spec.filename} not found (looked in {', '.join(looked)}) and the download from {spec.url} "
            f"failed ({err}); set data.path to the file or put it in ${DATA_ENV}/{spec.name}/{spec.filename}."
        ) from err
    try:
        return _check(spec, cached)
    except DataError:
        # A bad download must not poison the cache for the next run.
        cached.unlink(missing_ok=True)
        raise
