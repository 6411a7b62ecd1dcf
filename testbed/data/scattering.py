"""Scattering features of images: fixed, data-independent features that make private learning work.

Tramèr and Boneh ("Differentially Private Learning Needs Better Features (or Much More Data)",
ICLR 2021) show that a linear model on the wavelet scattering transform of Oyallon and Mallat
beats end-to-end private CNNs at the same ε: the features are fixed (no privacy spent on them)
and separate the classes well enough that a few noisy steps suffice. ``data.features =
"scattering"`` puts them in place of an image set's pixels, with their choices: J = 2 scales and
L = 8 angles, so an image of C×H×W gives C·81 maps of (H/4)×(W/4) (1 of order 0, J·L = 16 of order
1, L²·J(J−1)/2 = 64 of order 2). Computed by kymatio (``pip install 'dpfl-testbed[scattering]'``).

Normalisation, per image (data-independent, so no privacy is spent on statistics): each order's
block is scaled to unit norm and the row divided by √3, so every row has norm 1 (the unit ball the
algorithms' bounds assume) and orders 1 and 2, whose coefficients are far smaller than the
low-pass of order 0, weigh as much as it does. (On mnist-5k, a non-private logistic regression
reaches 0.96–0.97 with this or with per-image group normalisation, against 0.88 on pixels; DP-PASGD
at ε = 4 reaches 0.89 against 0.68 on pixels: tests/test_data_scattering.py.)

The transform of a run's rows is cached in ``$TESTBED_CACHE/features/``, keyed by the rows
themselves (their bytes, after any salt-and-pepper noise): the repeats of a sweep that share a seed
share the rows (common random numbers) and compute them once.

Example::

    >>> scattering_dim((1, 28, 28))
    3969
    >>> x = np.random.default_rng(0).random((2, 784))
    >>> f = scattering_features(x, (1, 28, 28))  # doctest: +SKIP
    >>> f.shape, np.allclose(np.linalg.norm(f, axis=1), 1)  # doctest: +SKIP
    ((2, 3969), True)
"""

from __future__ import annotations

import functools
import hashlib
import os
import tempfile
from collections.abc import Sequence

import numpy as np

from testbed.errors import DataError
from testbed.util.cache_folder import cache_dir
from testbed.util.extras import install_hint

#: Scales and angles of the transform (Tramèr and Boneh's choice for MNIST and CIFAR-10).
SCALES_J, ANGLES_L = 2, 8
#: Images transformed at once: bounds kymatio's working memory (about 2 MB per MNIST image).
_BATCH_IMAGES = 256
#: Bump when the features' definition changes: cached files of an older one are then not read.
_FORMAT = "scattering-v1"


def _orders() -> tuple[int, int, int]:
    """The number of maps of order 0, 1 and 2 per input channel."""
    return 1, SCALES_J * ANGLES_L, ANGLES_L ** 2 * SCALES_J * (SCALES_J - 1) // 2


def scattering_dim(image_shape: Sequence[int]) -> int:
    """The length of a scattering row of an image of ``image_shape`` = (channels, height, width)."""
    channels, height, width = image_shape
    step = 2 ** SCALES_J
    return channels * sum(_orders()) * (height // step) * (width // step)


@functools.lru_cache(maxsize=4)
def _transform(height: int, width: int):
    """kymatio's NumPy scattering of (height, width) images (its filters built once per shape).
    Imported from its 2-D module: ``kymatio.numpy`` imports the 3-D transform too, whose
    ``scipy.special.sph_harm`` recent SciPy removed."""
    try:
        from kymatio.scattering2d.frontend.numpy_frontend import ScatteringNumPy2D
    except ImportError as exc:
        raise DataError(f"features = \"scattering\" needs kymatio ({exc}); {install_hint('scattering')}") from None
    return ScatteringNumPy2D(J=SCALES_J, shape=(height, width), L=ANGLES_L)


def _compute(x: np.ndarray, image_shape: Sequence[int]) -> np.ndarray:
    """(n, C·H·W) pixels in [0, 1] → (n, scattering_dim) rows of norm 1, float64."""
    channels, height, width = image_shape
    if height % 2 ** SCALES_J or width % 2 ** SCALES_J:
        raise DataError(f"scattering with J = {SCALES_J} needs sides divisible by {2 ** SCALES_J}, "
                        f"not {height}x{width}")
    scatter = _transform(height, width)
    images = x.reshape(len(x), channels, height, width).astype(np.float32)
    maps = np.concatenate([scatter(images[i:i + _BATCH_IMAGES]) for i in range(0, len(x), _BATCH_IMAGES)]) \
        if len(x) else np.zeros((0, channels, sum(_orders()), height // 2 ** SCALES_J, width // 2 ** SCALES_J), np.float32)
    maps = maps.astype(np.float64)  # (n, C, 81, H/4, W/4)
    blocks, start = [], 0
    for count in _orders():
        block = maps[:, :, start:start + count].reshape(len(x), channels * count * maps.shape[3] * maps.shape[4])
        norm = np.linalg.norm(block, axis=1, keepdims=True)
        blocks.append(np.divide(block, norm, out=np.zeros_like(block), where=norm > 0))
        start += count
    # Each block is (an image's) unit norm, so the row is; an all-zero block stays zero.
    return np.concatenate(blocks, axis=1) / np.sqrt(len(blocks))


def scattering_features(x: np.ndarray, image_shape: Sequence[int]) -> np.ndarray:
    """The scattering rows of images ``x`` (n, C·H·W) with pixels in [0, 1]: (n, scattering_dim),
    float64, every row of norm 1 (or 0 for a blank image). Read from the cache when these exact
    rows were transformed before; written to it (atomically) otherwise."""
    x = np.ascontiguousarray(x, dtype=np.float64)
    digest = hashlib.blake2b(x.tobytes(), digest_size=20)
    digest.update(repr((_FORMAT, tuple(image_shape), SCALES_J, ANGLES_L, x.shape)).encode())
    file = cache_dir() / "features" / f"{_FORMAT}-{digest.hexdigest()}.npy"
    want = (len(x), scattering_dim(image_shape))
    if file.is_file():
        try:
            cached = np.load(file, allow_pickle=False)
            if cached.shape == want and cached.dtype == np.float64:
                return cached
        except (OSError, ValueError):
            pass  # a damaged cache file is computed again and replaced
    features = _compute(x, image_shape)
    file.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=file.parent, suffix=".npy.tmp")
    try:
        with os.fdopen(fd, "wb") as out:
            np.save(out, features, allow_pickle=False)
        os.replace(tmp, file)
    except OSError:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return features
