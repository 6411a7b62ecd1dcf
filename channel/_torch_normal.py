"""torch's CPU normal draws from an integer seed, bit for bit, in NumPy and the math module.

Sionna's Rayleigh fading (:mod:`channel.fading`) is two ``torch.normal`` calls on a CPU
``torch.Generator`` seeded with an integer: importing torch and Sionna for them took seconds of a
run's start (4.1 s of a 12-node DWFL run's 4.6 s, issue 44). This module computes the same numbers
without either. What torch 2.x computes (ATen: ``MT19937RNGEngine.h``, ``CPUGeneratorImpl.cpp``,
``DistributionsHelper.h``, ``TransformationHelper.h``, ``native/cpu/DistributionTemplates.h``):

- ``manual_seed(s)``: MT19937 initialised from the low 32 bits of ``s`` (Matsumoto and Nishimura's
  ``init_genrand``), the normal cache emptied;
- a double uniform in [0, 1): two 32-bit outputs a then b, ``((a << 32 | b) & (2^53 - 1)) / 2^53``;
- ``normal_(mean, std)`` of n >= 16 values: n uniforms, then each whole block of 16 by Box-Muller
  over its two halves (u1 = 1 - x[j], u2 = x[j + 8], r = sqrt(-2 ln u1), theta = 2 pi u2:
  x[j] = r cos theta, x[j + 8] = r sin theta); when 16 does not divide n, 16 fresh uniforms replace
  the last 16 values and are transformed so;
- of n < 16 values: one at a time, from the generator's cache if it holds one, else Box-Muller on
  two fresh uniforms u1, u2: r = sqrt(-2 log1p(-u2)), theta = 2 pi u1, r cos theta now and
  r sin theta kept in the cache (for the next value, also of the next call);
- each value times std plus mean; only mean 0 here (Sionna's): torch may fuse the multiply and
  the add (one rounding), which with a mean of 0 is the product's rounding either way.

ln, log1p, sin, cos and sqrt are the C library's, as torch's are: the math module's, not NumPy's
own vectorised ones, which may differ in the last bit. tests/test_fading_port.py compares this
module with torch and Sionna themselves over sizes and seeds, so a torch that draws otherwise fails
there.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

_TWO_PI = 2.0 * math.pi  # torch: 2.0f * c10::pi<double>, exact in double
_MANTISSA = np.uint64((1 << 53) - 1)
_UNIT = 1.0 / (1 << 53)
_MT_N = 624  # MT19937's words of state


def _mt19937_key(seed: int) -> np.ndarray:
    """MT19937's state after ``init_genrand(seed & 0xffffffff)``, as torch's ``mt19937(seed)``."""
    key = [seed & 0xFFFFFFFF]
    for j in range(1, _MT_N):
        prev = key[-1]
        key.append((1812433253 * (prev ^ (prev >> 30)) + j) & 0xFFFFFFFF)
    return np.array(key, dtype=np.uint32)


def generator_seed(rng: Any) -> int:
    """The integer a CPU ``torch.Generator`` is seeded with for ``rng``: a ``numpy.random.Generator``
    gives one draw in [0, 2^63 - 1) (its stream advances by one draw), an int is itself.

    Raises:
        TypeError: anything else (global random state is never used).
    """
    if isinstance(rng, np.random.Generator):
        return int(rng.integers(0, 2**63 - 1))
    if isinstance(rng, (int, np.integer)) and not isinstance(rng, bool):
        return int(rng)
    raise TypeError(
        "rng must be a numpy.random.Generator, a torch.Generator or an int seed; "
        f"got {type(rng).__name__} (global random state is never used)"
    )


class TorchCpuNormals:
    """The normal draws of ``torch.Generator(device="cpu").manual_seed(seed)``, in float64.

    Example::

        >>> g = TorchCpuNormals(0)
        >>> g.normal(3, std=1.0).round(4).tolist()   # torch.normal(0, 1, (3,), generator=...) with seed 0
        [1.541, -0.2934, -2.1788]
    """

    def __init__(self, seed: int):
        self._bits = np.random.MT19937()
        self._bits.state = {"bit_generator": "MT19937", "state": {"key": _mt19937_key(int(seed)), "pos": _MT_N}}
        self._cached: float | None = None  # torch's next_double_normal_sample

    def _uniforms(self, count: int) -> list[float]:
        raw = self._bits.random_raw(2 * count).astype(np.uint64)
        whole = (raw[0::2] << np.uint64(32)) | raw[1::2]
        return ((whole & _MANTISSA).astype(np.float64) * _UNIT).tolist()

    def normal(self, count: int, std: float) -> np.ndarray:
        """``count`` values of ``torch.normal(0.0, std, (count,), dtype=torch.float64)``."""
        if count >= 16:
            values = self._uniforms(count)
            for start in range(0, count - 15, 16):
                _box_muller_16(values, start, std)
            if count % 16:
                values[count - 16:] = self._uniforms(16)
                _box_muller_16(values, count - 16, std)
            return np.array(values, dtype=np.float64)
        out = []
        for _ in range(count):
            if self._cached is not None:
                value, self._cached = self._cached, None
            else:
                u1, u2 = self._uniforms(2)
                radius = math.sqrt(-2.0 * math.log1p(-u2))
                theta = _TWO_PI * u1
                self._cached = radius * math.sin(theta)
                value = radius * math.cos(theta)
            out.append(value * std + 0.0)  # + 0.0: torch's mean (-0.0 becomes 0.0)
        return np.array(out, dtype=np.float64)


def _box_muller_16(values: list[float], start: int, std: float) -> None:
    """torch's ``normal_fill_16`` on ``values[start:start + 16]``, in place."""
    for j in range(start, start + 8):
        u1, u2 = 1.0 - values[j], values[j + 8]
        radius = math.sqrt(-2.0 * math.log(u1))
        theta = _TWO_PI * u2
        values[j] = radius * math.cos(theta) * std + 0.0
        values[j + 8] = radius * math.sin(theta) * std + 0.0
