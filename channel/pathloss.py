"""Large-scale fading from node positions: 3GPP TR 38.901 UMi / UMa path loss and shadowing (Sionna).

:func:`pathloss_3gpp` places the senders as Sionna "UTs" and the receivers as Sionna "base
stations" of a :class:`sionna.phy.channel.tr38901.UMiScenario` or ``UMaScenario`` (single omni
antenna, uplink direction) and reads

- the basic path loss PL (TR 38.901 Table 7.4.1-1, LoS/NLoS) from ``scenario.basic_pathloss`` plus
  the O2I penetration loss of indoor senders, from
  :meth:`sionna.phy.channel.tr38901.LSPGenerator.sample_pathloss`;
- the shadow fading SF (log-normal, σ_SF of Table 7.5-6, spatially correlated) from the ``sf``
  large-scale parameter drawn by :class:`~sionna.phy.channel.tr38901.LSPGenerator`.

The linear power gain of a link is ``10^(−PL/10)·10^(SF/10)`` (Sionna's sign convention:
``gain = 10^(−PL/20)·sqrt(sf)``). LoS states are drawn from the LoS probability of the scenario
unless forced (i.i.d. per link: Sionna's spatially consistent LoS option is not used, and its own
LoS sampler ignores explicit generators in Sionna 2.2, so the Bernoulli draw is made here from
``scenario.los_probability``). All draws use an explicit generator from the caller.

D2D (:func:`d2d_pathloss_3gpp`): TR 38.901 has no device-to-device model; the UMi/UMa formulas are
evaluated with both ends at device height (an approximation in the spirit of TR 36.843, which uses
UMi-type street canyon path loss for outdoor D2D with 1.5 m antennas). Self-links get PL = +inf.

A NumPy-only free-space reference is in :func:`free_space_pathloss_db`.

Example::

    >>> import numpy as np
    >>> tx = np.array([[100.0, 0.0, 1.5]]); rx = np.array([[0.0, 0.0, 10.0]])
    >>> ls = pathloss_3gpp(tx, rx, 3.5e9, "umi", los=True, shadow_fading=False)
    >>> round(float(ls.pathloss_db[0, 0]), 3)     # 32.4 + 21 log10(d3D) + 20 log10(3.5)
    85.314
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "SPEED_OF_LIGHT_M_PER_S",
    "LargeScaleFading",
    "free_space_pathloss_db",
    "pathloss_3gpp",
    "d2d_pathloss_3gpp",
]

SPEED_OF_LIGHT_M_PER_S = 299_792_458.0


@dataclass(frozen=True)
class LargeScaleFading:
    """Large-scale fading of every (receiver, sender) link.

    Attributes:
        pathloss_db: (M, N) float64, dB, path loss (incl. O2I penetration) receiver m ← sender n.
        shadow_fading_db: (M, N) float64, dB, shadow fading added to the gain (zero-mean normal).
        los: (M, N) bool, line-of-sight state used for the path loss.

    Example::

        >>> import numpy as np
        >>> ls = LargeScaleFading(np.array([[100.0]]), np.array([[3.0]]), np.array([[True]]))
        >>> float(ls.gain[0, 0])                     # 10^(−97/10)
        1.9952623149688828e-10
    """

    pathloss_db: np.ndarray
    shadow_fading_db: np.ndarray
    los: np.ndarray

    @property
    def gain(self) -> np.ndarray:
        """(M, N) float64: linear power gain 10^((−PL + SF)/10); 0 for self-links."""
        return np.power(10.0, (self.shadow_fading_db - self.pathloss_db) / 10.0)

    @property
    def amplitude(self) -> np.ndarray:
        """(M, N) float64: linear amplitude gain sqrt(:attr:`gain`), multiplies a CN(0,1) fading."""
        return np.sqrt(self.gain)


def free_space_pathloss_db(distance_m: Any, carrier_frequency_hz: float) -> np.ndarray:
    """Friis free-space path loss 20·log10(4π d f / c), dB.

    Args:
        distance_m: any shape, m (> 0).
        carrier_frequency_hz: carrier frequency, Hz.

    Returns:
        Same shape as ``distance_m``, float64, dB.

    Example::

        >>> round(float(free_space_pathloss_db(100.0, 2.4e9)), 2)
        80.05
    """
    d = np.asarray(distance_m, dtype=np.float64)
    return 20.0 * np.log10(4.0 * math.pi * d * float(carrier_frequency_hz) / SPEED_OF_LIGHT_M_PER_S)


def _as_positions(pos: Any, name: str) -> np.ndarray:
    arr = np.asarray(pos, dtype=np.float64)
    if arr.ndim != 2 or arr.shape[1] != 3:
        raise ValueError(f"{name} must have shape (count, 3) [x, y, z in m], got {arr.shape}")
    return arr


def _scenario_class(scenario: str):
    from sionna.phy.channel.tr38901 import UMaScenario, UMiScenario

    classes = {"umi": UMiScenario, "uma": UMaScenario}
    try:
        return classes[scenario.lower()]
    except KeyError:
        raise ValueError(f"unknown scenario {scenario!r}; expected 'umi' or 'uma'") from None


#: Most senders one TR 38.901 call takes. Sionna's large-scale parameter generator correlates the
#: shadowing of every pair of senders, about 350 B a pair (measured: 1,000 senders 0.8 GB, 4,000
#: 5.6 GB), so memory grows with N²: 2,048 senders stay near 1.5 GB; beyond, a call is refused
#: before it allocates anything.
MAX_3GPP_SENDERS = 2048


class TooManySenders(ValueError):
    """More senders than one TR 38.901 call can hold in memory (:data:`MAX_3GPP_SENDERS`)."""


def pathloss_3gpp(
    tx_positions_m: Any,
    rx_positions_m: Any,
    carrier_frequency_hz: float,
    scenario: str = "umi",
    *,
    los: bool | np.ndarray | None = None,
    shadow_fading: bool = True,
    rng: Any = None,
    indoor: Any = None,
    o2i_model: str = "low",
    spec_version: str = "19.2",
) -> LargeScaleFading:
    """3GPP TR 38.901 path loss and shadow fading between senders and receivers, via Sionna.

    Args:
        tx_positions_m: (N, 3) float, m: sender positions [x, y, height]. Sionna "UTs"; TR 38.901
            validity: height 1.5–22.5 m.
        rx_positions_m: (M, 3) float, m: receiver positions. Sionna "base stations" (UMi: 10 m,
            UMa: 25 m high in TR 38.901).
        carrier_frequency_hz: carrier frequency, Hz (TR 38.901: 0.5–100 GHz).
        scenario: ``"umi"`` (urban micro, street canyon) or ``"uma"`` (urban macro).
        los: ``True``/``False`` force every link LoS/NLoS; an (M, N) bool array sets each link;
            ``None`` draws LoS from the scenario's LoS probability (needs ``rng``).
        shadow_fading: draw shadow fading (needs ``rng``); ``False`` gives SF = 0 dB.
        rng: ``numpy.random.Generator``, ``torch.Generator`` or int for the LoS, indoor-distance
            and shadow-fading draws. Required whenever something is random.
        indoor: (N,) bool, senders indoors (adds O2I penetration loss); default all outdoor.
        o2i_model: ``"low"`` or ``"high"`` O2I penetration model (TR 38.901 §7.4.3).
        spec_version: TR 38.901 table version used by Sionna (``"19.2"`` or ``"16.1"``).

    Returns:
        :class:`LargeScaleFading` with (M, N) arrays (receiver axis first).

    Example::

        >>> import numpy as np
        >>> tx = np.array([[50.0, 0, 1.5], [300.0, 0, 1.5]]); rx = np.array([[0.0, 0, 10.0]])
        >>> ls = pathloss_3gpp(tx, rx, 3.5e9, "umi", los=True, rng=np.random.default_rng(0))
        >>> ls.pathloss_db.shape, bool(ls.pathloss_db[0, 1] > ls.pathloss_db[0, 0])
        ((1, 2), True)
    """
    import torch
    from sionna.phy.channel.tr38901 import LSPGenerator, PanelArray

    from ._sionna import PRECISION, torch_generator, with_generator

    tx = _as_positions(tx_positions_m, "tx_positions_m")
    rx = _as_positions(rx_positions_m, "rx_positions_m")
    n_tx, n_rx = tx.shape[0], rx.shape[0]
    if n_tx > MAX_3GPP_SENDERS:
        raise TooManySenders(f"{n_tx} senders for a TR 38.901 ({scenario}) path loss: Sionna correlates every pair "
                             f"of them (about 350 B a pair), so at most {MAX_3GPP_SENDERS}; use the free-space path "
                             "loss for more")
    random_los = los is None
    indoor_arr = np.zeros(n_tx, dtype=bool) if indoor is None else np.asarray(indoor, dtype=bool)
    if indoor_arr.shape != (n_tx,):
        raise ValueError(f"indoor must have shape ({n_tx},), got {indoor_arr.shape}")
    needs_rng = random_los or shadow_fading or bool(indoor_arr.any())
    if needs_rng and rng is None:
        raise ValueError("rng is required for random LoS states, indoor distances or shadow fading")
    gen = torch_generator(rng) if rng is not None else torch_generator(0)

    fc = float(carrier_frequency_hz)
    array = PanelArray(
        num_rows_per_panel=1, num_cols_per_panel=1, polarization="single", polarization_type="V",
        antenna_pattern="omni", carrier_frequency=fc, precision=PRECISION, device="cpu",
    )
    sc = with_generator(_scenario_class(scenario))(
        fc, o2i_model, array, array, "uplink", enable_pathloss=True,
        enable_shadow_fading=shadow_fading, precision=PRECISION, device="cpu",
        spec_version=spec_version, generator=gen,
    )
    f64 = torch.float64
    if random_los:
        # Sionna 2.2 draws random LoS states with sample_bernoulli(), which always uses Sionna's
        # global generator; draw them here from Sionna's LoS probability with ours instead.
        los_arg: Any = False
    elif isinstance(los, (bool, np.bool_)):
        los_arg = bool(los)
    else:
        los_mat = np.asarray(los, dtype=bool)
        if los_mat.shape != (n_rx, n_tx):
            raise ValueError(f"los must be a bool or have shape ({n_rx}, {n_tx}), got {los_mat.shape}")
        los_arg = torch.as_tensor(los_mat).unsqueeze(0)
    sc.set_topology(
        ut_loc=torch.as_tensor(tx, dtype=f64).unsqueeze(0),
        bs_loc=torch.as_tensor(rx, dtype=f64).unsqueeze(0),
        ut_orientations=torch.zeros(1, n_tx, 3, dtype=f64),
        bs_orientations=torch.zeros(1, n_rx, 3, dtype=f64),
        ut_velocities=torch.zeros(1, n_tx, 3, dtype=f64),
        in_state=torch.as_tensor(indoor_arr).unsqueeze(0),
        los=los_arg,
    )
    if random_los:
        p_los = sc.los_probability  # [1, M, N], TR 38.901 Table 7.4.2-1
        draw = torch.rand(p_los.shape, generator=gen, dtype=f64)
        sc.set_topology(los=draw < p_los)
    lsp_gen = with_generator(LSPGenerator)(sc, generator=gen)
    lsp_gen.topology_updated_callback()
    # [batch=1, num_bs=M, num_ut=N]: receiver axis first, as LargeScaleFading wants.
    pathloss_db = lsp_gen.sample_pathloss()[0].detach().numpy().astype(np.float64)
    if shadow_fading:
        sf_lin = lsp_gen().sf[0].detach().numpy().astype(np.float64)
        shadow_db = 10.0 * np.log10(sf_lin)
    else:
        shadow_db = np.zeros((n_rx, n_tx))
    los_state = sc.los[0].detach().numpy().astype(bool)
    return LargeScaleFading(pathloss_db=pathloss_db, shadow_fading_db=shadow_db, los=los_state)


def d2d_pathloss_3gpp(
    positions_m: Any,
    carrier_frequency_hz: float,
    scenario: str = "umi",
    **kwargs: Any,
) -> LargeScaleFading:
    """Path loss and shadowing between every pair of N nodes (device-to-device), via Sionna.

    Every node is both a sender and a receiver (:func:`pathloss_3gpp` with ``rx = tx``); the
    self-link k → k gets PL = +inf, SF = 0 (gain 0). TR 38.901 defines no D2D model: the UMi/UMa
    formulas are evaluated with both ends at device height, which is outside their stated
    validity (BS height 10/25 m) and is an approximation. Shadow fading of (i←k) and (k←i) are
    drawn independently.

    Args:
        positions_m: (N, 3) float, m.
        carrier_frequency_hz: Hz.
        scenario: ``"umi"`` or ``"uma"``.
        **kwargs: as :func:`pathloss_3gpp` (``los``, ``shadow_fading``, ``rng``, ...).

    Returns:
        :class:`LargeScaleFading` with (N, N) arrays, [receiver, sender].

    Example::

        >>> import numpy as np
        >>> pos = np.array([[0.0, 0, 1.5], [40.0, 0, 1.5], [0.0, 80, 1.5]])
        >>> ls = d2d_pathloss_3gpp(pos, 2.4e9, los=True, shadow_fading=False)
        >>> bool(np.isinf(ls.pathloss_db[1, 1])), float(ls.gain[1, 1])
        (True, 0.0)
    """
    pos = _as_positions(positions_m, "positions_m")
    # Sionna evaluates the co-located self-links (distance 0) to PL = -inf without disturbing
    # the other links; they are overwritten below.
    ls = pathloss_3gpp(pos, pos, carrier_frequency_hz, scenario, **kwargs)
    pl = ls.pathloss_db.copy()
    sf = ls.shadow_fading_db.copy()
    np.fill_diagonal(pl, np.inf)
    np.fill_diagonal(sf, 0.0)
    los_state = ls.los.copy()
    np.fill_diagonal(los_state, False)
    return LargeScaleFading(pathloss_db=pl, shadow_fading_db=sf, los=los_state)
