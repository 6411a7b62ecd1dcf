"""Small-scale fading: Rayleigh block fading (Sionna) and Rician with a K-factor.

A coefficient is complex, normalised to E|h|² = 1; large-scale gain (path loss, shadowing) is
applied separately (:mod:`channel.pathloss`). How often it changes is a :class:`FadingSchedule`:

- ``coherence_rounds=None``: time-invariant, drawn once (DWFL's model, dwfl.md §1.2);
- ``coherence_rounds=1``: redrawn every round;
- ``coherence_rounds=B``: redrawn every B rounds (block fading over rounds).

The schedule only maps a round to its fading block; the caller derives the generator for that block
(e.g. ``testbed.streams.rng.stream(seed, GLOBAL, block, Purpose.CHANNEL)``) and calls :func:`draw_fading`,
so the same seed gives the same channel everywhere.

Rayleigh draws are those of :class:`sionna.phy.channel.RayleighBlockFading` (CN(0, 1), one path,
one coefficient per block) run with an explicit ``torch.Generator`` seeded from the caller's
generator. For a NumPy generator or an integer seed, the same numbers are computed without
importing torch or Sionna (seconds of a run's start): :mod:`channel._torch_normal` reproduces
torch's generator and normal draws bit for bit (tests/test_fading_port.py holds it to Sionna's);
a ``torch.Generator`` is run through Sionna itself.

Example::

    >>> import numpy as np
    >>> sched = FadingSchedule(coherence_rounds=5)
    >>> sched.block_index(12)
    2
    >>> h = draw_fading("rayleigh", (10,), np.random.default_rng(0))
    >>> h.shape, h.dtype
    ((10,), dtype('complex128'))
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

__all__ = [
    "FADING_KINDS",
    "FadingSchedule",
    "rayleigh_block_fading",
    "rician_fading",
    "draw_fading",
]

#: The standard deviation of each of a Rayleigh coefficient's parts in Sionna's
#: ``RayleighBlockFading``: ``torch.tensor(0.5, dtype=torch.float64).sqrt()``, which torch 2.x
#: computes one unit in the last place below the correctly rounded sqrt(0.5) (math.sqrt's) on the
#: machines the committed channels were drawn on. On others (an AVX-512 EPYC) torch rounds it
#: correctly, and Sionna's own draws there differ from these by that unit: the port keeps this
#: value, so that the committed experiments' channels do not move (tests/test_fading_port.py).
SIONNA_STD = 0.7071067811865475

#: Fading kinds accepted by :func:`draw_fading`.
FADING_KINDS = ("rayleigh", "rician", "none")


@dataclass(frozen=True)
class FadingSchedule:
    """When the fading is redrawn.

    Args:
        coherence_rounds: ``None`` for a time-invariant channel (drawn once, block 0), else the
            number B >= 1 of consecutive rounds that share one draw.

    Example::

        >>> [FadingSchedule(None).block_index(t) for t in (0, 7)]
        [0, 0]
        >>> [FadingSchedule(1).block_index(t) for t in (0, 7)]
        [0, 7]
        >>> FadingSchedule(3).is_new_block(6), FadingSchedule(3).is_new_block(7)
        (True, False)
    """

    coherence_rounds: int | None = None

    def __post_init__(self) -> None:
        if self.coherence_rounds is not None and int(self.coherence_rounds) < 1:
            raise ValueError(f"coherence_rounds must be None or >= 1, got {self.coherence_rounds}")

    def block_index(self, round_index: int) -> int:
        """The fading block of a round (>= 0): 0 if time-invariant, else round // B."""
        if round_index < 0:
            raise ValueError(f"round_index must be >= 0, got {round_index}")
        if self.coherence_rounds is None:
            return 0
        return int(round_index) // int(self.coherence_rounds)

    def is_new_block(self, round_index: int) -> bool:
        """True if ``round_index`` starts a block, i.e. the channel must be (re)drawn."""
        if self.coherence_rounds is None:
            return round_index == 0
        return int(round_index) % int(self.coherence_rounds) == 0


def _shape_tuple(shape: int | Sequence[int]) -> tuple[int, ...]:
    if isinstance(shape, (int, np.integer)):
        return (int(shape),)
    return tuple(int(s) for s in shape)


def rayleigh_block_fading(shape: int | Sequence[int], rng: Any) -> np.ndarray:
    """Rayleigh block-fading coefficients h ~ CN(0, 1) (E|h|² = 1), Sionna's draws.

    The numbers of :class:`sionna.phy.channel.RayleighBlockFading` (double precision, one path, one
    block) with ``batch_size = prod(shape)`` single-antenna links and an explicit generator: its
    real parts, then its imaginary parts, each ``torch.normal(0, SIONNA_STD)``. From a NumPy
    generator or an int seed they are computed without torch (:mod:`channel._torch_normal`).

    Args:
        shape: output shape, e.g. ``(N,)`` for one gain per sender (DWFL) or ``(N_rx, N_tx)`` for a
            per-link matrix.
        rng: ``numpy.random.Generator`` (one seed is drawn from it), ``torch.Generator`` or int.

    Returns:
        complex128 array of ``shape``; |h| is Rayleigh, the phase uniform.

    Example::

        >>> import numpy as np
        >>> h = rayleigh_block_fading((4, 3), np.random.default_rng(1))
        >>> h.shape
        (4, 3)
    """
    from ._torch_normal import TorchCpuNormals, generator_seed

    shp = _shape_tuple(shape)
    count = math.prod(shp)
    if count == 0:
        return np.zeros(shp, dtype=np.complex128)
    torch = sys.modules.get("torch")  # a torch.Generator comes only from a process that imported torch
    if torch is not None and isinstance(rng, torch.Generator):
        return sionna_rayleigh(count, rng).reshape(shp)
    draws = TorchCpuNormals(generator_seed(rng))
    h = np.empty(count, dtype=np.complex128)
    h.real = draws.normal(count, SIONNA_STD)
    h.imag = draws.normal(count, SIONNA_STD)
    return h.reshape(shp)


def sionna_rayleigh(count: int, generator: Any) -> np.ndarray:
    """``count`` coefficients drawn by Sionna's ``RayleighBlockFading`` itself with the
    ``torch.Generator`` ``generator`` (imports torch and Sionna)."""
    from sionna.phy.channel import RayleighBlockFading

    from ._sionna import PRECISION, with_generator

    model = with_generator(RayleighBlockFading)(
        num_rx=1, num_rx_ant=1, num_tx=1, num_tx_ant=1, precision=PRECISION, device="cpu", generator=generator,
    )
    a, _tau = model(batch_size=count, num_time_steps=1)
    # a: [batch, num_rx, num_rx_ant, num_tx, num_tx_ant, num_paths=1, num_time_steps=1]
    return a.reshape(count).numpy().astype(np.complex128, copy=False)


def rician_fading(
    shape: int | Sequence[int],
    k_factor: float,
    rng: Any,
    los_phase_rad: float | None = 0.0,
) -> np.ndarray:
    """Rician coefficients h = sqrt(K/(K+1))·e^{jφ} + sqrt(1/(K+1))·w, w ~ CN(0, 1).

    The scattered part ``w`` comes from Sionna's Rayleigh block fading (:func:`rayleigh_block_fading`);
    the line-of-sight part is deterministic. E|h|² = 1, of which K/(K+1) is LoS and 1/(K+1) diffuse.

    Args:
        shape: output shape (see :func:`rayleigh_block_fading`).
        k_factor: K >= 0, linear (not dB); K = 0 is Rayleigh.
        rng: ``numpy.random.Generator``, ``torch.Generator`` or int. With ``los_phase_rad=None`` it
            must be a NumPy generator (the LoS phases are drawn from it first).
        los_phase_rad: phase φ of the LoS component, rad; ``None`` draws φ ~ U[0, 2π) per entry.

    Returns:
        complex128 array of ``shape``.

    Example::

        >>> import numpy as np
        >>> h = rician_fading((1000,), k_factor=3.0, rng=np.random.default_rng(2))
        >>> round(float(np.mean(h).real), 1)   # ≈ sqrt(3/4)
        0.9
    """
    k = float(k_factor)
    if not (k >= 0.0 and math.isfinite(k)):
        raise ValueError(f"k_factor must be finite and >= 0, got {k_factor}")
    shp = _shape_tuple(shape)
    if los_phase_rad is None:
        if not isinstance(rng, np.random.Generator):
            raise TypeError("los_phase_rad=None needs a numpy.random.Generator to draw the phases")
        phase = rng.uniform(0.0, 2.0 * math.pi, size=shp)
    else:
        phase = np.full(shp, float(los_phase_rad))
    diffuse = rayleigh_block_fading(shp, rng)
    return math.sqrt(k / (k + 1.0)) * np.exp(1j * phase) + math.sqrt(1.0 / (k + 1.0)) * diffuse


def draw_fading(
    kind: str,
    shape: int | Sequence[int],
    rng: Any,
    *,
    k_factor: float = 0.0,
    los_phase_rad: float | None = 0.0,
) -> np.ndarray:
    """One fading block of the given kind.

    Args:
        kind: ``"rayleigh"``, ``"rician"`` (uses ``k_factor``, ``los_phase_rad``) or ``"none"``
            (h = 1, no fading).
        shape: output shape, e.g. ``(N,)``.
        rng: the caller's generator for this block (``numpy.random.Generator``, ``torch.Generator``
            or int); unused for ``"none"``.
        k_factor: Rician K, linear.
        los_phase_rad: Rician LoS phase, rad, or ``None`` for random.

    Returns:
        complex128 array of ``shape`` with E|h|² = 1.

    Example::

        >>> import numpy as np
        >>> draw_fading("none", (3,), None).tolist()
        [(1+0j), (1+0j), (1+0j)]
    """
    if kind == "rayleigh":
        return rayleigh_block_fading(shape, rng)
    if kind == "rician":
        return rician_fading(shape, k_factor, rng, los_phase_rad=los_phase_rad)
    if kind == "none":
        return np.ones(_shape_tuple(shape), dtype=np.complex128)
    raise ValueError(f"unknown fading kind {kind!r}; expected one of {FADING_KINDS}")
