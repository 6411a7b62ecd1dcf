"""Receiver noise: thermal noise power k·T·B·NF, and real or complex AWGN with explicit generators.

Noise-power conventions (SI, W):

- ``thermal_noise_power_w(B, NF, T)`` is the total power k·T·B·10^(NF/10) of *complex* baseband
  noise sampled at B (one complex channel use per 1/B s); each of its real and imaginary parts has
  half of it.
- The real-valued OTA model (:mod:`channel.ota`, DWFL's m_i ~ N(0, σ_m² I_d)) takes
  ``noise_power_w`` = σ_m², the variance of each *real* received entry. A real d-vector sent on the
  in-phase rail of d complex channel uses sees σ_m² = k·T·B·NF/2
  (:func:`real_noise_variance_w`); DWFL's default is simply σ_m² = 1 (dwfl.md §1.2).

Real noise is drawn with NumPy (``Generator.standard_normal``) so that a node's stream is the same in
one process (sim) and on a board (mqtt), and so that drawing a long vector in column chunks in order
gives exactly the same numbers as one draw (used by the benchmark to bound memory). Complex AWGN on a
complex baseband signal uses :class:`sionna.phy.channel.AWGN` with an explicit torch generator.

Example::

    >>> import numpy as np
    >>> round(float(thermal_noise_power_w(1e6, noise_figure_db=0.0, temperature_k=290.0)), 20)
    4.00388e-15
    >>> awgn_real((2, 3), 0.5, np.random.default_rng(0)).shape
    (2, 3)
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from .units import db_to_linear

__all__ = [
    "BOLTZMANN_J_PER_K",
    "thermal_noise_power_w",
    "real_noise_variance_w",
    "fill_gaussian_rows",
    "awgn_real",
    "add_awgn_real",
    "awgn_complex",
]

#: Boltzmann constant, J/K (exact SI value, same as ``sionna.phy.BOLTZMANN_CONSTANT``).
BOLTZMANN_J_PER_K = 1.380649e-23


def thermal_noise_power_w(
    bandwidth_hz: Any, noise_figure_db: Any = 0.0, temperature_k: Any = 290.0
) -> np.ndarray:
    """Thermal noise power k·T·B·NF of complex baseband noise in bandwidth B, W.

    Args:
        bandwidth_hz: any shape, Hz.
        noise_figure_db: receiver noise figure, dB (broadcasts with ``bandwidth_hz``).
        temperature_k: noise temperature, K (290 K reference).

    Returns:
        Broadcast shape, float64, W.

    Example::

        >>> from channel.units import w_to_dbm
        >>> round(float(w_to_dbm(thermal_noise_power_w(1.0))), 2)   # −174 dBm/Hz
        -173.98
    """
    b = np.asarray(bandwidth_hz, dtype=np.float64)
    t = np.asarray(temperature_k, dtype=np.float64)
    return BOLTZMANN_J_PER_K * t * b * db_to_linear(noise_figure_db)


def real_noise_variance_w(noise_power_w: Any) -> np.ndarray:
    """Per-real-dimension noise variance of complex noise of total power ``noise_power_w``: half.

    Args:
        noise_power_w: any shape, W, complex noise power (e.g. from :func:`thermal_noise_power_w`).

    Returns:
        Same shape, float64, W: the σ_m² to use for a real entry carried on one rail.

    Example::

        >>> float(real_noise_variance_w(2.0))
        1.0
    """
    return 0.5 * np.asarray(noise_power_w, dtype=np.float64)


def _row_generators(rng: Any, rows: int) -> Iterator[np.random.Generator] | None:
    """None for one shared generator, else an iterator over the generator of each row, in row order:
    from a sequence of ``rows`` of them, or from an iterator that yields them one at a time (each
    used before the next is taken: one re-seeded generator may stand for every row)."""
    if isinstance(rng, np.random.Generator):
        return None
    if isinstance(rng, Sequence) and not isinstance(rng, (str, bytes)):
        gens = list(rng)
        if len(gens) != rows:
            raise ValueError(f"need one generator per row: {rows} rows, got {len(gens)} generators")
        return _checked(iter(gens), rows)
    if isinstance(rng, Iterator):
        return _checked(rng, rows)
    raise TypeError(
        "rng must be a numpy.random.Generator or a sequence of them (one per row); "
        f"got {type(rng).__name__} (global random state is never used)"
    )


def _checked(gens: Iterator[Any], rows: int) -> Iterator[np.random.Generator]:
    for i in range(rows):
        g = next(gens, None)
        if g is None:
            raise ValueError(f"need one generator per row: {rows} rows, got {i} generators")
        if not isinstance(g, np.random.Generator):
            raise TypeError(f"expected numpy.random.Generator, got {type(g).__name__}")
        yield g


def fill_gaussian_rows(out: np.ndarray, std: Any, rng: Any) -> np.ndarray:
    """Fill ``out`` in place with zero-mean Gaussian entries, row ``i`` with std ``std[i]``.

    Draws row by row (leading node axis) so that each node's row can come from its own stream;
    with a single generator the rows are drawn in order from it.

    Args:
        out: (N, ...) float32/float64 array, overwritten.
        std: scalar or (N,) standard deviation per row (same unit as the signal, e.g. sqrt(W)).
        rng: one ``numpy.random.Generator``, a sequence of N of them (one per row) or an iterator
            yielding them in row order.

    Returns:
        ``out``.

    Example::

        >>> import numpy as np
        >>> buf = np.empty((2, 4))
        >>> gens = [np.random.default_rng(1), np.random.default_rng(2)]
        >>> bool((fill_gaussian_rows(buf, [0.0, 1.0], gens)[0] == 0).all())
        True
    """
    if out.ndim == 0:
        raise ValueError("out must have a leading row axis")
    rows = out.shape[0]
    gens = _row_generators(rng, rows)
    stds = np.broadcast_to(np.asarray(std, dtype=np.float64), (rows,))
    dtype = out.dtype
    if dtype not in (np.float32, np.float64):
        raise TypeError(f"out must be float32 or float64, got {dtype}")
    for i in range(rows):
        g = rng if gens is None else next(gens)
        row = out[i]
        if row.flags.c_contiguous:
            g.standard_normal(out=row, dtype=dtype)
        else:  # a column slice of a larger array: draw into a temporary
            row[...] = g.standard_normal(size=row.shape, dtype=dtype)
        if stds[i] != 1.0:
            row *= stds[i]
    return out


def awgn_real(
    shape: int | Sequence[int], noise_power_w: Any, rng: Any, dtype: Any = np.float64
) -> np.ndarray:
    """Real AWGN with per-entry variance ``noise_power_w`` (σ_m²), leading axis = receiver.

    Args:
        shape: (N, d) or any shape whose first axis is the receiver axis.
        noise_power_w: scalar or (N,) variance per entry, W.
        rng: one ``numpy.random.Generator`` or N of them (one per receiver).
        dtype: float64 (default) or float32.

    Returns:
        Array of ``shape``.

    Example::

        >>> import numpy as np
        >>> m = awgn_real((1, 100_000), 4.0, np.random.default_rng(3))
        >>> round(float(m.var()), 1)
        4.0
    """
    out = np.empty(shape, dtype=dtype)
    return fill_gaussian_rows(out, np.sqrt(np.asarray(noise_power_w, dtype=np.float64)), rng)


def add_awgn_real(x: np.ndarray, noise_power_w: Any, rng: Any, chunk: int = 1 << 16) -> np.ndarray:
    """Add real AWGN of per-entry variance ``noise_power_w`` to ``x`` in place, row by row.

    Temporary memory is one row chunk (``chunk`` entries), whatever the size of ``x``.

    Args:
        x: (N, d) float array, modified in place.
        noise_power_w: scalar or (N,) variance per entry, W.
        rng: one ``numpy.random.Generator`` or N of them (one per row).
        chunk: entries drawn at a time.

    Returns:
        ``x``.

    Example::

        >>> import numpy as np
        >>> x = np.zeros((2, 5))
        >>> add_awgn_real(x, 0.0, np.random.default_rng(0)).tolist()[0]
        [0.0, 0.0, 0.0, 0.0, 0.0]
    """
    if x.ndim != 2:
        raise ValueError(f"x must have shape (N, d), got {x.shape}")
    rows, d = x.shape
    gens = _row_generators(rng, rows)
    stds = np.broadcast_to(np.sqrt(np.asarray(noise_power_w, dtype=np.float64)), (rows,))
    buf = np.empty(min(chunk, d), dtype=x.dtype)
    for i in range(rows):
        g = rng if gens is None else next(gens)
        for a in range(0, d, chunk):
            b = min(a + chunk, d)
            tmp = buf[: b - a]
            g.standard_normal(out=tmp, dtype=x.dtype)
            tmp *= stds[i]
            x[i, a:b] += tmp
    return x


def awgn_complex(x: Any, noise_power_w: Any, rng: Any) -> np.ndarray:
    """Complex AWGN through :class:`sionna.phy.channel.AWGN`: y = x + n, n ~ CN(0, N0).

    Args:
        x: complex array, any shape (a complex baseband signal, sqrt(W) units).
        noise_power_w: N0, total complex noise power per entry, W (N0/2 per real dimension);
            scalar or broadcastable to ``x`` (Sionna pads missing trailing axes).
        rng: ``numpy.random.Generator``, ``torch.Generator`` or int.

    Returns:
        complex128 array of ``x``'s shape.

    Example::

        >>> import numpy as np
        >>> y = awgn_complex(np.zeros(50_000, complex), 2.0, np.random.default_rng(0))
        >>> round(float(np.mean(np.abs(y) ** 2)), 1)
        2.0
    """
    import torch
    from sionna.phy.channel import AWGN

    from ._sionna import PRECISION, torch_generator, with_generator

    block = with_generator(AWGN)(precision=PRECISION, device="cpu", generator=torch_generator(rng))
    xt = torch.as_tensor(np.asarray(x, dtype=np.complex128))
    no = torch.as_tensor(np.asarray(noise_power_w, dtype=np.float64))
    return block(xt, no).numpy()
