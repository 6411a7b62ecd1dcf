"""Airtime and radio energy of one transmission: analog (over the air) or digital (orthogonal).

- Analog: d real numbers go out as ceil(d / r) channel uses at ``symbol_rate_hz`` (r = 1: one real
  per channel use on the in-phase rail, the DWFL mapping; r = 2: I and Q both carry a real).
  airtime = uses / symbol rate; all senders share the same slot, so a round's OTA airtime does not
  grow with N.
- Digital: ``size_bits`` at a rate ``efficiency · B · log2(1 + SNR)`` (Shannon bound scaled by a
  rate efficiency <= 1); in an orthogonal scheme (TDMA) the slots of the senders add up.
- Energy = (transmit power + circuit power) × airtime, J. For an analog payload the actually
  radiated energy Σ s² / symbol rate is :func:`analog_signal_energy_j` (the DWFL power constraint
  bounds the amplitude coefficients, not the signal energy; dwfl.md §2.1).

Example::

    >>> cost = analog_link(num_reals=1_000_000, symbol_rate_hz=1e6, power_w=0.1)
    >>> cost.airtime_s, round(cost.energy_j, 6)
    (1.0, 0.1)
    >>> round(digital_link(8e6, power_w=0.1, channel_gain=1e-9, noise_power_w=1e-12,
    ...                    bandwidth_hz=1e6).airtime_s, 4)     # 8 Mbit at log2(101) Mbit/s
    1.2015
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
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


@dataclass(frozen=True)
class LinkCost:
    """Cost of one transmission by one sender.

    Attributes:
        airtime_s: time on air, s.
        energy_j: radio energy, J.
        rate_bps: bit rate (digital) or ``None`` (analog).
        channel_uses: number of complex channel uses.

    Example::

        >>> LinkCost(airtime_s=0.5, energy_j=0.05, rate_bps=None, channel_uses=5e5).energy_j
        0.05
    """

    airtime_s: float
    energy_j: float
    rate_bps: float | None
    channel_uses: float


def analog_channel_uses(num_reals: int, reals_per_channel_use: int = 1) -> int:
    """Complex channel uses needed for ``num_reals`` real values: ceil(d / r).

    Example::

        >>> analog_channel_uses(5, 2)
        3
    """
    if reals_per_channel_use not in (1, 2):
        raise ValueError(f"reals_per_channel_use must be 1 or 2, got {reals_per_channel_use}")
    return -(-int(num_reals) // int(reals_per_channel_use))


def analog_airtime_s(num_reals: int, symbol_rate_hz: float, reals_per_channel_use: int = 1) -> float:
    """Airtime of an analog transmission of ``num_reals`` reals: ceil(d / r) / symbol rate, s.

    Example::

        >>> analog_airtime_s(10_000, 1e6)
        0.01
    """
    if symbol_rate_hz <= 0:
        raise ValueError(f"symbol_rate_hz must be > 0, got {symbol_rate_hz}")
    return analog_channel_uses(num_reals, reals_per_channel_use) / float(symbol_rate_hz)


def radio_energy_j(power_w: Any, airtime_s: Any, circuit_power_w: Any = 0.0) -> np.ndarray:
    """Radio energy (P_tx + P_circuit) × airtime, J (broadcasts).

    Example::

        >>> float(radio_energy_j(0.1, 2.0, circuit_power_w=0.05))
        0.30000000000000004
    """
    return (np.asarray(power_w, dtype=np.float64) + np.asarray(circuit_power_w, dtype=np.float64)) * (
        np.asarray(airtime_s, dtype=np.float64)
    )


def analog_signal_energy_j(signal: np.ndarray, symbol_rate_hz: float) -> np.ndarray:
    """Radiated energy of real payloads: Σ_j s_j² / symbol rate, J, per sender.

    Each channel use lasts 1/symbol rate and carries energy |symbol|² × duration; with one or two
    reals per use the total is the sum of the squared reals either way.

    Args:
        signal: (..., d) real payload, sqrt(W) (instantaneous power s² in W).
        symbol_rate_hz: channel uses per second.

    Returns:
        (...) float64, J.

    Example::

        >>> import numpy as np
        >>> analog_signal_energy_j(np.full((2, 4), 0.5), 1e3).tolist()
        [0.001, 0.001]
    """
    s = np.asarray(signal)
    return np.einsum("...j,...j->...", s, s, dtype=np.float64) / float(symbol_rate_hz)


def analog_link(
    num_reals: int,
    symbol_rate_hz: float,
    power_w: float,
    reals_per_channel_use: int = 1,
    circuit_power_w: float = 0.0,
) -> LinkCost:
    """Airtime and energy of one analog transmission at average transmit power ``power_w``.

    Args:
        num_reals: d, reals to send.
        symbol_rate_hz: channel uses per second.
        power_w: average transmit power, W (e.g. P_k, an upper bound under DWFL's constraint).
        reals_per_channel_use: 1 (in-phase only) or 2 (I and Q).
        circuit_power_w: radio electronics power while on air, W.

    Returns:
        :class:`LinkCost` (``rate_bps`` = None).

    Example::

        >>> analog_link(2_000, 1e3, 1.0, reals_per_channel_use=2).airtime_s
        1.0
    """
    uses = analog_channel_uses(num_reals, reals_per_channel_use)
    airtime = uses / float(symbol_rate_hz)
    return LinkCost(
        airtime_s=airtime,
        energy_j=float(radio_energy_j(power_w, airtime, circuit_power_w)),
        rate_bps=None,
        channel_uses=float(uses),
    )


def snr_linear(power_w: Any, channel_gain: Any, noise_power_w: Any) -> np.ndarray:
    """Receive SNR P·|h|²/N0 (linear). ``channel_gain`` is the power gain |h|² (incl. path loss).

    Example::

        >>> round(float(snr_linear(0.1, 1e-9, 1e-12)), 9)
        100.0
    """
    return (
        np.asarray(power_w, dtype=np.float64)
        * np.asarray(channel_gain, dtype=np.float64)
        / np.asarray(noise_power_w, dtype=np.float64)
    )


def shannon_rate_bps(bandwidth_hz: Any, snr: Any, efficiency: float = 1.0) -> np.ndarray:
    """Achievable rate efficiency · B · log2(1 + SNR), bit/s.

    Example::

        >>> float(shannon_rate_bps(1e6, 3.0))
        2000000.0
    """
    if not (0.0 < efficiency <= 1.0):
        raise ValueError(f"efficiency must be in (0, 1], got {efficiency}")
    return efficiency * np.asarray(bandwidth_hz, dtype=np.float64) * np.log2(
        1.0 + np.asarray(snr, dtype=np.float64)
    )


def digital_airtime_s(size_bits: Any, bandwidth_hz: Any, snr: Any, efficiency: float = 1.0) -> np.ndarray:
    """Airtime of ``size_bits`` over a link of the given SNR: bits / rate, s (inf at zero rate).

    Example::

        >>> float(digital_airtime_s(2e6, 1e6, 3.0))
        1.0
    """
    rate = shannon_rate_bps(bandwidth_hz, snr, efficiency)
    with np.errstate(divide="ignore"):
        return np.asarray(size_bits, dtype=np.float64) / rate


def digital_link(
    size_bits: float,
    power_w: float,
    channel_gain: float,
    noise_power_w: float,
    bandwidth_hz: float,
    efficiency: float = 1.0,
    circuit_power_w: float = 0.0,
) -> LinkCost:
    """Airtime and energy of a digital transmission over one orthogonal link.

    Args:
        size_bits: payload, bit (e.g. 64·d for a float64 model).
        power_w: transmit power, W.
        channel_gain: power gain |h|² incl. path loss (linear).
        noise_power_w: receiver noise power over ``bandwidth_hz``, W (e.g. k·T·B·NF).
        bandwidth_hz: Hz.
        efficiency: rate as a fraction of the Shannon bound.
        circuit_power_w: electronics power while on air, W.

    Returns:
        :class:`LinkCost`; ``channel_uses`` = airtime × bandwidth; airtime and energy are ``inf``
        when the rate is 0.

    Example::

        >>> c = digital_link(2e6, 0.5, 1.0, 1 / 6, 1e6)
        >>> c.rate_bps, c.airtime_s, c.energy_j
        (2000000.0, 1.0, 0.5)
    """
    snr = snr_linear(power_w, channel_gain, noise_power_w)
    rate = float(shannon_rate_bps(bandwidth_hz, snr, efficiency))
    airtime = math.inf if rate <= 0 else float(size_bits) / rate
    # A link with zero rate never delivers: infinite airtime and energy (not 0 × inf = nan).
    energy = math.inf if math.isinf(airtime) else float(radio_energy_j(power_w, airtime, circuit_power_w))
    return LinkCost(
        airtime_s=airtime,
        energy_j=energy,
        rate_bps=rate,
        channel_uses=airtime * float(bandwidth_hz),
    )


def orthogonal_round_airtime_s(airtimes_s: Any) -> float:
    """Round airtime of an orthogonal (TDMA) scheme: the senders' slots add up, s.

    Example::

        >>> orthogonal_round_airtime_s([0.5, 0.25, 0.25])
        1.0
    """
    return float(np.sum(np.asarray(airtimes_s, dtype=np.float64)))
