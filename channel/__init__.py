"""Radio physics of the testbed: fading, path loss, noise, power control, OTA superposition, links.

Imports nothing of the testbed (docs/design.md, "Layers"). Importing ``channel`` loads only NumPy; torch
and Sionna 2.x are imported inside the functions that need them (3GPP path loss and shadowing,
complex AWGN, fading drawn from a ``torch.Generator``), so a board without Sionna can use the rest.
Rayleigh and Rician fading from a NumPy generator or a seed are Sionna's draws computed without
either (:mod:`channel._torch_normal`).

Modules:

- :mod:`channel.units`: dBm <-> W, dB <-> linear.
- :mod:`channel.fading`: Rayleigh block fading (Sionna ``RayleighBlockFading``'s draws), Rician,
  schedules (time-invariant / every round / every B rounds).
- :mod:`channel.pathloss`: 3GPP TR 38.901 UMi/UMa path loss and shadow fading from positions (Sionna
  ``UMiScenario``/``UMaScenario`` + ``LSPGenerator``), free-space path loss.
- :mod:`channel.noise`: k·T·B·NF, real AWGN (NumPy streams), complex AWGN (Sionna ``AWGN``).
- :mod:`channel.power_control`: DWFL alignment (eqs. 2–4), truncation, imperfect CSI.
- :mod:`channel.ota`: uplink and full-duplex D2D superposition (O(N·d)).
- :mod:`channel.link`: airtime and radio energy of analog and digital transmissions.
- :mod:`channel.scene`: links ray traced in a Sionna RT scene (its own layer; Sionna RT only when called).

Conventions: SI units with the unit in the name (``power_w``, ``noise_power_w``, ``airtime_s``,
``energy_j``, ``bandwidth_hz``); leading node axis (N, ...); channel coefficients complex128, model
payloads real; every random draw takes an explicit generator from the caller.

Example::

    >>> import numpy as np, channel
    >>> al = channel.align_power(np.array([1.0, 2.0]), channel.dbm_to_w(30.0))
    >>> v = channel.d2d_superpose(np.ones((2, 3)) * al.signal_amplitude[:, None],
    ...                           al.effective_gain(), 0.0, None)
    >>> (v / al.c).tolist()
    [[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]]
"""

from .fading import FADING_KINDS, FadingSchedule, draw_fading, rayleigh_block_fading, rician_fading
from .link import (
    LinkCost,
    analog_airtime_s,
    analog_channel_uses,
    analog_link,
    analog_signal_energy_j,
    digital_airtime_s,
    digital_link,
    orthogonal_round_airtime_s,
    radio_energy_j,
    shannon_rate_bps,
    snr_linear,
)
from .noise import (
    BOLTZMANN_J_PER_K,
    add_awgn_real,
    awgn_complex,
    awgn_real,
    fill_gaussian_rows,
    real_noise_variance_w,
    thermal_noise_power_w,
)
from .ota import d2d_noise_variance, d2d_superpose, d2d_superpose_per_link, sparse_superpose, uplink_superpose
from .pathloss import LargeScaleFading, d2d_pathloss_3gpp, free_space_pathloss_db, pathloss_3gpp
from .power_control import Alignment, align_power, estimate_csi, to_complex_baseband, transmit_real
from .units import db_to_linear, dbm_to_w, linear_to_db, w_to_dbm

__all__ = [
    # units
    "dbm_to_w",
    "w_to_dbm",
    "db_to_linear",
    "linear_to_db",
    # fading
    "FADING_KINDS",
    "FadingSchedule",
    "draw_fading",
    "rayleigh_block_fading",
    "rician_fading",
    # path loss
    "LargeScaleFading",
    "pathloss_3gpp",
    "d2d_pathloss_3gpp",
    "free_space_pathloss_db",
    # noise
    "BOLTZMANN_J_PER_K",
    "thermal_noise_power_w",
    "real_noise_variance_w",
    "fill_gaussian_rows",
    "awgn_real",
    "add_awgn_real",
    "awgn_complex",
    # power control
    "Alignment",
    "align_power",
    "estimate_csi",
    "transmit_real",
    "to_complex_baseband",
    # over the air
    "uplink_superpose",
    "d2d_superpose",
    "d2d_superpose_per_link",
    "sparse_superpose",
    "d2d_noise_variance",
    # links
    "LinkCost",
    "analog_channel_uses",
    "analog_airtime_s",
    "analog_signal_energy_j",
    "analog_link",
    "radio_energy_j",
    "snr_linear",
    "shannon_rate_bps",
    "digital_airtime_s",
    "digital_link",
    "orthogonal_round_airtime_s",
]
