"""Analog over-the-air superposition of real payloads (after phase pre-compensation).

All senders transmit in the same slot; what a receiver gets is the gain-weighted sum of the payloads
plus its own noise. Payloads are real (N, d) arrays (the in-phase rail of d complex channel uses, see
:mod:`channel.power_control`); gains are the real effective gains g_k (|h_k| with perfect CSI);
noise is real with per-entry variance ``noise_power_w`` (σ_m²).

- :func:`uplink_superpose`: every node to one receiver (server): y = Σ_k g_k s_k + m.
- :func:`d2d_superpose`: DWFL's full-duplex D2D slot (eq. 1): each receiver i gets
  v_i = Σ_{k≠i} g_k s_k + m_i. One gain per *sender* (the paper's model), so it is computed in
  O(N·d) as the total sum minus the receiver's own contribution, never as N separate sums.
- :func:`sparse_superpose`: a D2D slot on a graph: receiver i hears only its neighbours,
  v_i = Σ_{k∈N(i)} L_ik s_k + m_i, one sparse (N, N) matrix L of link weights (scipy CSR; its
  nonzeros are the graph's 2E directed links) times the payloads: O(E·d), never N×N dense.
- :func:`d2d_superpose_per_link`: the general case with one gain per (receiver, sender) link (e.g.
  path loss from positions). Each receiver then sees a different combination, which is a matrix
  product and costs O(N²·d) (done in column chunks through BLAS).

Random draws: ``rng`` is one ``numpy.random.Generator`` or a sequence of N of them, one per
receiver (its ``(seed, node, round, CHANNEL)`` stream). With one generator per receiver, calling a
function on consecutive column chunks of the payload gives exactly the same result as one call on
the whole, so a caller can bound memory by chunking.

Example::

    >>> import numpy as np
    >>> s = np.array([[1.0, 2.0], [10.0, 20.0], [100.0, 200.0]])
    >>> d2d_superpose(s, np.ones(3), 0.0, None).tolist()
    [[110.0, 220.0], [101.0, 202.0], [11.0, 22.0]]
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .noise import _row_generators

__all__ = [
    "uplink_superpose",
    "d2d_superpose",
    "d2d_superpose_per_link",
    "sparse_superpose",
    "d2d_noise_variance",
]


def _check(signals: np.ndarray, gains: Any) -> tuple[np.ndarray, np.ndarray]:
    if signals.ndim != 2:
        raise ValueError(f"signals must have shape (N, d), got {signals.shape}")
    g = np.asarray(gains, dtype=np.float64)
    if g.shape != (signals.shape[0],):
        raise ValueError(f"gains must have shape ({signals.shape[0]},), got {g.shape}")
    return signals, g


def _noise_std(noise_power_w: Any, rows: int) -> np.ndarray:
    var = np.broadcast_to(np.asarray(noise_power_w, dtype=np.float64), (rows,))
    if np.any(var < 0):
        raise ValueError("noise_power_w must be >= 0")
    return np.sqrt(var)


def uplink_superpose(
    signals: np.ndarray, gains: Any, noise_power_w: float, rng: np.random.Generator | None
) -> np.ndarray:
    """Multiple-access to one receiver: y = Σ_k g_k s_k + m, m ~ N(0, σ_m² I_d). O(N·d).

    Args:
        signals: (N, d) real payloads, sqrt(W).
        gains: (N,) real effective gains (0 for silent senders).
        noise_power_w: σ_m², per-entry noise variance at the receiver, W.
        rng: the receiver's ``numpy.random.Generator`` (may be ``None`` if σ_m² = 0).

    Returns:
        (d,) float64 received signal.

    Example::

        >>> import numpy as np
        >>> uplink_superpose(np.ones((3, 2)), np.array([1.0, 2.0, 3.0]), 0.0, None).tolist()
        [6.0, 6.0]
    """
    s, g = _check(signals, gains)
    y = g @ s  # BLAS gemv: O(N·d)
    y = np.asarray(y, dtype=np.float64)
    if noise_power_w > 0:
        if rng is None:
            raise ValueError("rng is required when noise_power_w > 0")
        y += np.sqrt(noise_power_w) * rng.standard_normal(y.shape)
    return y


def d2d_superpose(
    signals: np.ndarray,
    gains: Any,
    noise_power_w: Any,
    rng: Any,
    out: np.ndarray | None = None,
) -> np.ndarray:
    """Full-duplex D2D slot (eq. 1 with per-sender gains): v_i = Σ_{k≠i} g_k s_k + m_i. O(N·d).

    Computes the total T = Σ_k g_k s_k once (O(N·d)) and each receiver as T − g_i s_i + m_i.
    Extra memory: one d-vector for T and one for the noise row, besides ``out``.

    Args:
        signals: (N, d) real payloads, sqrt(W) (float64 or float32).
        gains: (N,) real effective gains g_k (|h_k| with perfect CSI; 0 for silent senders).
        noise_power_w: scalar or (N,) σ_m² per receiver, per entry, W.
        rng: one ``numpy.random.Generator`` or N of them (one per receiver, a sequence or an
            iterator in row order); may be ``None`` when every σ_m² is 0.
        out: optional (N, d) output; may be ``signals`` itself (overwritten in place).

    Returns:
        (N, d) received signals, row i for receiver i.

    Example::

        >>> import numpy as np
        >>> v = d2d_superpose(np.eye(3), np.array([1.0, 2.0, 3.0]), 0.0, None)
        >>> v.tolist()
        [[0.0, 2.0, 3.0], [1.0, 0.0, 3.0], [1.0, 2.0, 0.0]]
    """
    s, g = _check(signals, gains)
    n, d = s.shape
    std = _noise_std(noise_power_w, n)
    noisy = bool(np.any(std > 0))
    if noisy and rng is None:
        raise ValueError("rng is required when noise_power_w > 0")
    gens = _row_generators(rng, n) if noisy else None
    if out is None:
        out = np.empty_like(s)
    elif out.shape != s.shape:
        raise ValueError(f"out must have shape {s.shape}, got {out.shape}")
    total = np.asarray(g @ s, dtype=out.dtype)  # Σ_k g_k s_k, BLAS gemv, O(N·d)
    buf = np.empty(d, dtype=out.dtype) if noisy else None
    for i in range(n):
        row = out[i]
        np.multiply(s[i], -g[i], out=row)  # −g_i s_i (reads s[i] before overwriting if aliased)
        row += total
        gen = rng if gens is None else next(gens)  # every row draws its own, in row order
        if noisy and std[i] > 0:
            gen.standard_normal(out=buf, dtype=out.dtype)
            buf *= std[i]
            row += buf
    return out


def sparse_superpose(
    signals: np.ndarray, links: Any, noise_power_w: Any, rng: Any, out: np.ndarray | None = None
) -> np.ndarray:
    """A D2D slot on a graph: v_i = Σ_k L_ik s_k + m_i with L sparse. O(nnz(L)·d).

    The receivers' sums are one sparse-times-dense product (scipy's CSR kernel: one axpy of length
    d per link, no N×N dense matrix and no (E, d) gather), then each receiver's noise is added from
    its own generator, in the order :func:`d2d_superpose` draws it. ``links`` may hold only some of
    the receivers (rows a..b of the graph's): the caller can then split the receivers into blocks
    that stay in cache, or over cores, and each row is the same as in one call for all.

    Args:
        signals: (N, d) real payloads, sqrt(W).
        links: (R, N) sparse link weights [receiver, sender] (a ``scipy.sparse.csr_array``; silent
            senders may keep their weights: their rows of ``signals`` are zero). R = N for every
            receiver of the graph.
        noise_power_w: scalar or (R,) σ_m² per receiver, per entry, W.
        rng: one ``numpy.random.Generator`` or R of them (a sequence or an iterator, one taken per
            receiver in row order), ``None`` for no noise (every σ_m² must then be 0). Given
            generators, every receiver draws its row (one of σ_m² = 0 adds zeros): what a receiver
            draws never depends on the others' σ_m², nor on which block it is computed in.
        out: optional (R, d) float64 output (not ``signals``: the product reads every row of it).

    Returns:
        (R, d) float64 received signals: ``out``, or a new array.

    Example::

        >>> import numpy as np, scipy.sparse
        >>> ring = scipy.sparse.csr_array(np.array([[0.0, 1.0, 2.0], [1.0, 0.0, 0.0], [2.0, 0.0, 0.0]]))
        >>> sparse_superpose(np.eye(3), ring, 0.0, None).tolist()
        [[0.0, 1.0, 2.0], [1.0, 0.0, 0.0], [2.0, 0.0, 0.0]]
    """
    if signals.ndim != 2:
        raise ValueError(f"signals must have shape (N, d), got {signals.shape}")
    n, d = signals.shape
    r = links.shape[0]
    if links.ndim != 2 or links.shape[1] != n:
        raise ValueError(f"links must have shape (R, {n}), got {links.shape}")
    if out is not None and (out.shape != (r, d) or out.dtype != np.float64):
        raise ValueError(f"out must be a ({r}, {d}) float64 array, got {out.shape} {out.dtype}")
    if out is not None and np.may_share_memory(out, signals):  # bounds only: shares_memory may solve for long
        raise ValueError("out must not overlap signals: the product reads every row of them")
    received = links @ signals
    if out is None:
        out = np.asarray(received, dtype=np.float64)
    else:
        out[...] = received
    std = _noise_std(noise_power_w, r)
    if rng is not None:
        from .noise import add_awgn_real

        add_awgn_real(out, std**2, rng, chunk=max(1, d))
    elif np.any(std > 0):
        raise ValueError("rng is required when noise_power_w > 0")
    return out


def d2d_superpose_per_link(
    signals: np.ndarray,
    gain_matrix: Any,
    noise_power_w: Any,
    rng: Any,
    chunk: int = 1 << 15,
) -> np.ndarray:
    """D2D slot with one gain per link: v_i = Σ_{k≠i} G[i, k] s_k + m_i. O(N²·d).

    Use this only when gains depend on the receiver (e.g. path loss from positions); with
    per-sender gains (DWFL's model) use :func:`d2d_superpose`, which is O(N·d). The diagonal of
    ``gain_matrix`` is ignored (a node does not receive itself).

    Args:
        signals: (N, d) real payloads, sqrt(W).
        gain_matrix: (N, N) real effective gains, [receiver, sender].
        noise_power_w: scalar or (N,) σ_m² per receiver, W.
        rng: one ``numpy.random.Generator`` or N of them; ``None`` if σ_m² = 0.
        chunk: columns per matrix product (bounds the temporaries).

    Returns:
        (N, d) received signals.

    Example::

        >>> import numpy as np
        >>> G = np.array([[0.0, 2.0], [3.0, 0.0]])
        >>> d2d_superpose_per_link(np.eye(2), G, 0.0, None).tolist()
        [[0.0, 2.0], [3.0, 0.0]]
    """
    if signals.ndim != 2:
        raise ValueError(f"signals must have shape (N, d), got {signals.shape}")
    n, d = signals.shape
    gm = np.array(gain_matrix, dtype=np.float64)
    if gm.shape != (n, n):
        raise ValueError(f"gain_matrix must have shape ({n}, {n}), got {gm.shape}")
    np.fill_diagonal(gm, 0.0)
    out = np.empty_like(signals)
    for a in range(0, d, chunk):
        b = min(a + chunk, d)
        np.matmul(gm, signals[:, a:b], out=out[:, a:b])
    std = _noise_std(noise_power_w, n)
    if np.any(std > 0):
        from .noise import add_awgn_real

        if rng is None:
            raise ValueError("rng is required when noise_power_w > 0")
        add_awgn_real(out, std**2, rng)
    return out


def d2d_noise_variance(
    gains: Any, noise_amplitude: Any, artificial_variance: float, noise_power_w: Any
) -> np.ndarray:
    """Per-entry variance of the noise in v_i: Σ_{k≠i} g_k² β_k P_k σ² + σ_m² (eq. 10). O(N).

    Args:
        gains: (N,) real effective gains g_k.
        noise_amplitude: (N,) sqrt(β_k P_k), sqrt(W).
        artificial_variance: σ², per-entry variance of the artificial noise G_k.
        noise_power_w: scalar or (N,) σ_m², W.

    Returns:
        (N,) σ_s,i², W.

    Example::

        >>> import numpy as np
        >>> d2d_noise_variance([1.0, 2.0, 2.0], [0.0, 0.75**0.5, 0.75**0.5], 1.0, 1.0).round(9).tolist()
        [7.0, 4.0, 4.0]
    """
    g = np.asarray(gains, dtype=np.float64)
    b = (g * np.asarray(noise_amplitude, dtype=np.float64)) ** 2 * float(artificial_variance)
    return (b.sum() - b) + np.broadcast_to(np.asarray(noise_power_w, dtype=np.float64), g.shape)
