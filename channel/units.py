"""Unit conversions at the edges: dBm <-> W and dB <-> linear.

Inside the testbed every power is in watts (``power_w``) and every gain is linear; dBm and dB appear
only in configs and plots. These are plain NumPy functions (no torch) so that a board without Sionna
can import them; they agree with :func:`sionna.phy.utils.dbm_to_watt` / ``watt_to_dbm`` /
``db_to_lin`` / ``lin_to_db`` (checked in ``tests/test_channel_units.py``).

Example::

    >>> float(dbm_to_w(60.0))
    1000.0
    >>> float(w_to_dbm(0.1))
    20.0
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

__all__ = ["dbm_to_w", "w_to_dbm", "db_to_linear", "linear_to_db"]


def dbm_to_w(power_dbm: ArrayLike) -> np.ndarray:
    """Power in dBm to watts: P_W = 10^((P_dBm − 30)/10).

    Args:
        power_dbm: any shape, dBm.

    Returns:
        Same shape, float64, W (0-d array for a scalar input).

    Example::

        >>> dbm_to_w([20, 40, 60, 80]).tolist()
        [0.1, 10.0, 1000.0, 100000.0]
    """
    return np.power(10.0, (np.asarray(power_dbm, dtype=np.float64) - 30.0) / 10.0)


def w_to_dbm(power_w: ArrayLike) -> np.ndarray:
    """Power in watts to dBm: 10·log10(P_W) + 30. Zero watts gives −inf.

    Args:
        power_w: any shape, W (>= 0).

    Returns:
        Same shape, float64, dBm.

    Example::

        >>> w_to_dbm([0.1, 1e5]).round(12).tolist()
        [20.0, 80.0]
    """
    with np.errstate(divide="ignore"):
        return 10.0 * np.log10(np.asarray(power_w, dtype=np.float64)) + 30.0


def db_to_linear(value_db: ArrayLike) -> np.ndarray:
    """A power ratio in dB to linear: 10^(x/10).

    Args:
        value_db: any shape, dB.

    Returns:
        Same shape, float64, linear power ratio.

    Example::

        >>> float(db_to_linear(20.0))
        100.0
    """
    return np.power(10.0, np.asarray(value_db, dtype=np.float64) / 10.0)


def linear_to_db(value: ArrayLike) -> np.ndarray:
    """A linear power ratio to dB: 10·log10(x). Zero gives −inf.

    Args:
        value: any shape, linear power ratio (>= 0).

    Returns:
        Same shape, float64, dB.

    Example::

        >>> float(linear_to_db(100.0))
        20.0
    """
    with np.errstate(divide="ignore"):
        return 10.0 * np.log10(np.asarray(value, dtype=np.float64))
