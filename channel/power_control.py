"""Power alignment for analog over-the-air aggregation (DWFL eqs. 2–4) and its variants.

Every sender k splits its power P_k between its model (fraction α_k) and artificial Gaussian noise
(fraction β_k), and pre-compensates its channel phase, so that every model arrives with the same
real amplitude c (dwfl.md §2.1–2.3):

- eq. (2): x̃_k = e^{−jθ_k} (sqrt(α_k P_k) x_k + sqrt(β_k P_k) G_k);
- eq. (3): |h_k| sqrt(α_k P_k) = c for all k;
- eq. (4): c = min_j |h_j| sqrt(P_j), hence α_k = c² / (|h_k|² P_k) ∈ (0, 1];
- β_k <= 1 − α_k; the paper never fixes β, the default here is β_k = 1 − α_k (dwfl.md §2.3
  [IMPL-CHOICE]), a scalar ``beta`` is a fraction of the remaining power, an array is used as is.

Mapping of a real d-vector to the radio: the real payload sqrt(α_k P_k) x_k + sqrt(β_k P_k) G_k
rides the in-phase rail of d complex channel uses, multiplied by e^{−jθ̂_k} (θ̂_k the phase the
sender believes); the receiver keeps the real part. The effective real gain of sender k is then
g_k = Re(h_k e^{−jθ̂_k}) (:meth:`Alignment.effective_gain`), which is |h_k| with perfect CSI.

Options:

- ``c_scale < 1``: a common amplitude below the eq. (4) maximum, so that even the weakest sender has
  power left for artificial noise (dwfl.md §2.3);
- ``gain_threshold``: truncated channel inversion: a sender with |ĥ_k|² below the threshold stays
  silent (α = β = 0) and c is set over the active senders only;
- imperfect CSI: align on an estimate ĥ = h + e, e ~ CN(0, σ_e²) (:func:`estimate_csi`), then read
  the true effective gains with :meth:`Alignment.effective_gain`.

Example::

    >>> import numpy as np
    >>> h = np.array([1.0, 2.0, 2.0j])
    >>> al = align_power(h, power_w=1.0)
    >>> al.c, al.alpha.tolist(), al.beta.tolist()
    (1.0, [1.0, 0.25, 0.25], [0.0, 0.75, 0.75])
    >>> al.effective_gain(h).round(12).tolist()       # |h| after phase pre-compensation
    [1.0, 2.0, 2.0]
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Alignment", "align_power", "estimate_csi", "transmit_real", "to_complex_baseband"]

_TOL = 1e-12


@dataclass(frozen=True)
class Alignment:
    """The result of power alignment for N senders (all arrays have shape (N,)).

    Attributes:
        c: common received amplitude of every model, sqrt(W) (eq. 3–4, with the CSI used).
        alpha: power fraction for the model, in [0, 1]; 0 for silent senders.
        beta: power fraction for artificial noise, in [0, 1 − α]; 0 for silent senders.
        power_w: maximum transmit power P_k, W.
        phase_rad: phase θ̂_k the sender pre-compensates (transmits with e^{−jθ̂_k}), rad.
        active: False for senders silenced by truncation.
        csi: the (complex) channel the alignment was computed from (true h or an estimate ĥ).

    Example::

        >>> import numpy as np
        >>> al = align_power(np.array([1.0, 2.0]), power_w=4.0)
        >>> al.c, al.signal_amplitude.tolist(), al.noise_amplitude.tolist()
        (2.0, [2.0, 1.0], [0.0, 1.7320508075688772])
        >>> al.noise_scale().round(6).tolist()             # a_k = |h_k| sqrt(β_k P_k) / c
        [0.0, 1.732051]
    """

    c: float
    alpha: np.ndarray
    beta: np.ndarray
    power_w: np.ndarray
    phase_rad: np.ndarray
    active: np.ndarray
    csi: np.ndarray

    @property
    def signal_amplitude(self) -> np.ndarray:
        """(N,) sqrt(α_k P_k), sqrt(W): the factor on the model in eq. (2)."""
        return np.sqrt(self.alpha * self.power_w)

    @property
    def noise_amplitude(self) -> np.ndarray:
        """(N,) sqrt(β_k P_k), sqrt(W): the factor on the artificial noise G_k in eq. (2)."""
        return np.sqrt(self.beta * self.power_w)

    def effective_gain(self, h_true: Any = None) -> np.ndarray:
        """(N,) real gain g_k = Re(h_k e^{−jθ̂_k}) seen on the in-phase rail; 0 if silent.

        Args:
            h_true: (N,) complex true channel; default the CSI used (perfect CSI: g_k = |h_k|).
        """
        h = self.csi if h_true is None else np.asarray(h_true, dtype=np.complex128)
        g = np.real(h * np.exp(-1j * self.phase_rad))
        return np.where(self.active, g, 0.0)

    def received_model_amplitude(self, h_true: Any = None) -> np.ndarray:
        """(N,) g_k sqrt(α_k P_k): amplitude of model k at a receiver (== c with perfect CSI)."""
        return self.effective_gain(h_true) * self.signal_amplitude

    def noise_scale(self, h_true: Any = None) -> np.ndarray:
        """(N,) a_k = g_k sqrt(β_k P_k) / c: artificial-noise amplitude relative to c (dwfl.md §2.4)."""
        return self.effective_gain(h_true) * self.noise_amplitude / self.c


def align_power(
    h: Any,
    power_w: Any,
    *,
    beta: Any = None,
    c: float | None = None,
    c_scale: float = 1.0,
    gain_threshold: float | None = None,
) -> Alignment:
    """Power alignment of eqs. (3)–(4) with phase pre-compensation.

    Args:
        h: (N,) complex channel coefficients known to the senders (true CSI or an estimate),
            dimensionless (or including large-scale amplitude gain).
        power_w: scalar or (N,) maximum transmit power P_k, W.
        beta: ``None`` → β_k = 1 − α_k; a scalar f in [0, 1] → β_k = f (1 − α_k); an (N,) array
            → β_k as given (must satisfy 0 <= β_k <= 1 − α_k).
        c: explicit common amplitude, sqrt(W) (must not exceed the eq. (4) value); overrides
            ``c_scale``.
        c_scale: c = c_scale · min_j |h_j| sqrt(P_j) over the active senders, 0 < c_scale <= 1.
        gain_threshold: truncated channel inversion: senders with |h_k|² < threshold are silent.

    Returns:
        :class:`Alignment`.

    Raises:
        ValueError: bad shapes or values, or no sender above the threshold.

    Example::

        >>> import numpy as np
        >>> al = align_power(np.array([0.1, 1.0, 2.0]), 1.0, gain_threshold=0.5)
        >>> al.active.tolist(), al.c, al.alpha.tolist()
        ([False, True, True], 1.0, [0.0, 1.0, 0.25])
    """
    hh = np.atleast_1d(np.asarray(h, dtype=np.complex128))
    if hh.ndim != 1:
        raise ValueError(f"h must have shape (N,), got {hh.shape}")
    n = hh.shape[0]
    p = np.broadcast_to(np.asarray(power_w, dtype=np.float64), (n,)).copy()
    if np.any(p < 0) or not np.all(np.isfinite(p)):
        raise ValueError("power_w must be finite and >= 0")
    gain2 = np.abs(hh) ** 2
    active = (gain2 * p) > 0
    if gain_threshold is not None:
        active &= gain2 >= float(gain_threshold)
    if not np.any(active):
        raise ValueError("no sender is active (all below gain_threshold or with zero power/gain)")
    eff = gain2 * p
    eff_min = float(np.min(eff[active]))
    c_max = float(np.sqrt(eff_min))  # eq. (4)
    if c is None:
        if not (0.0 < c_scale <= 1.0):
            raise ValueError(f"c_scale must be in (0, 1], got {c_scale}")
        c_val = c_scale * c_max
        ratio2 = float(c_scale) ** 2  # (c / c_max)²
    else:
        c_val = float(c)
        if not (0.0 < c_val <= c_max * (1.0 + _TOL)):
            raise ValueError(f"c must be in (0, {c_max}] (eq. 4 with the active senders), got {c_val}")
        ratio2 = c_val**2 / eff_min
    alpha = np.zeros(n)
    # eq. (3): |h_k| sqrt(α_k P_k) = c, i.e. α_k = c²/(|h_k|² P_k), written as (c/c_max)² · min/eff_k
    # so that the weakest sender gets α = 1 exactly.
    alpha[active] = ratio2 * (eff_min / eff[active])
    alpha = np.minimum(alpha, 1.0)  # only rounding can push the weakest sender above 1
    rest = np.where(active, 1.0 - alpha, 0.0)
    if beta is None:
        beta_arr = rest
    else:
        b = np.asarray(beta, dtype=np.float64)
        if b.ndim == 0:
            if not (0.0 <= float(b) <= 1.0):
                raise ValueError(f"scalar beta is a fraction of 1 − α and must be in [0, 1], got {b}")
            beta_arr = float(b) * rest
        else:
            if b.shape != (n,):
                raise ValueError(f"beta must be a scalar or have shape ({n},), got {b.shape}")
            if np.any(b < 0) or np.any(b > rest + 1e-12):
                raise ValueError("beta must satisfy 0 <= beta_k <= 1 − alpha_k (power constraint, eq. 2)")
            beta_arr = np.where(active, b, 0.0)
    return Alignment(
        c=c_val,
        alpha=alpha,
        beta=beta_arr,
        power_w=p,
        phase_rad=np.angle(hh),
        active=active,
        csi=hh,
    )


def estimate_csi(h: Any, error_variance: float, rng: np.random.Generator) -> np.ndarray:
    """Imperfect CSI: ĥ = h + e with e ~ CN(0, σ_e²) i.i.d. (σ_e²/2 per real dimension).

    Args:
        h: (N,) complex true channel.
        error_variance: σ_e² = E|ĥ − h|², same unit as |h|².
        rng: ``numpy.random.Generator`` (the caller's CSI-estimation stream).

    Returns:
        (N,) complex128 estimate.

    Example::

        >>> import numpy as np
        >>> h = np.ones(200_000, complex)
        >>> e = estimate_csi(h, 0.1, np.random.default_rng(0)) - h
        >>> round(float(np.mean(np.abs(e) ** 2)), 2)
        0.1
    """
    hh = np.asarray(h, dtype=np.complex128)
    if error_variance < 0:
        raise ValueError(f"error_variance must be >= 0, got {error_variance}")
    if error_variance == 0:
        return hh.copy()
    std = np.sqrt(error_variance / 2.0)
    e = rng.standard_normal(hh.shape) + 1j * rng.standard_normal(hh.shape)
    return hh + std * e


def transmit_real(
    model: np.ndarray, noise: np.ndarray | None, alignment: Alignment, out: np.ndarray | None = None
) -> np.ndarray:
    """Real payload of eq. (2) before the phase rotation: sqrt(α_k P_k) x_k + sqrt(β_k P_k) G_k.

    Args:
        model: (N, d) float, the models x_k (or a column chunk of them).
        noise: (N, d) float, the artificial noise G_k (entries N(0, σ²)), or ``None`` for none.
        alignment: from :func:`align_power`.
        out: optional (N, d) output; may alias ``noise`` (or ``model``) to work in place.

    Returns:
        (N, d) payload, sqrt(W) units. Silent senders give rows of zeros.

    Example::

        >>> import numpy as np
        >>> al = align_power(np.array([1.0, 2.0]), 1.0)
        >>> transmit_real(np.ones((2, 2)), np.zeros((2, 2)), al).tolist()
        [[1.0, 1.0], [0.5, 0.5]]
    """
    sa = alignment.signal_amplitude
    if out is None:
        out = np.empty_like(model)
    if noise is None:
        np.multiply(model, sa[:, None], out=out)
        return out
    na = alignment.noise_amplitude
    # Row by row with one row of scratch, so that ``out`` may alias ``model`` or ``noise``.
    buf = np.empty(model.shape[1:], dtype=out.dtype)
    for i in range(model.shape[0]):
        np.multiply(model[i], sa[i], out=buf)
        np.multiply(noise[i], na[i], out=out[i])
        out[i] += buf
    return out


def to_complex_baseband(payload: np.ndarray, alignment: Alignment) -> np.ndarray:
    """Complex transmit symbols e^{−jθ̂_k} · payload_k (eq. 2), for complex channel simulation.

    Args:
        payload: (N, d) real, from :func:`transmit_real`.
        alignment: from :func:`align_power`.

    Returns:
        (N, d) complex128.

    Example::

        >>> import numpy as np
        >>> al = align_power(np.array([1j]), 1.0)
        >>> (np.array([1j]) * to_complex_baseband(np.ones((1, 1)), al)).round(12).tolist()
        [[(1+0j)]]
    """
    return payload * np.exp(-1j * alignment.phase_rad)[:, None]
