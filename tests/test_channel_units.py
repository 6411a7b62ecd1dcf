"""channel.units: dBm <-> W and dB <-> linear (dwfl.md §8 check 10), cross-checked with Sionna."""

import numpy as np
import pytest

from channel.units import db_to_linear, dbm_to_w, linear_to_db, w_to_dbm

from conftest import require_module

DBM = [20.0, 40.0, 60.0, 80.0]
WATTS = [0.1, 10.0, 1000.0, 1e5]


def test_dbm_to_w_dwfl_powers():
    # dwfl.md §4.5 / §8 check 10: 20/40/60/80 dBm = 0.1/10/1000/1e5 W.
    np.testing.assert_allclose(dbm_to_w(DBM), WATTS, rtol=1e-12)
    for dbm, w in zip(DBM, WATTS):
        assert float(dbm_to_w(dbm)) == pytest.approx(w, rel=1e-12)


def test_w_to_dbm_round_trip():
    np.testing.assert_allclose(w_to_dbm(WATTS), DBM, atol=1e-12)
    x = np.linspace(-50.0, 90.0, 29)
    np.testing.assert_allclose(w_to_dbm(dbm_to_w(x)), x, atol=1e-12)
    assert w_to_dbm(0.0) == -np.inf


def test_db_linear():
    np.testing.assert_allclose(db_to_linear([0.0, 3.0, 10.0, -20.0]), [1.0, 10**0.3, 10.0, 0.01])
    np.testing.assert_allclose(linear_to_db(db_to_linear([-7.5, 0.0, 42.0])), [-7.5, 0.0, 42.0])


def test_agrees_with_sionna():
    torch = require_module("torch", "channel")
    utils = require_module("sionna.phy.utils", "channel")
    x = torch.tensor(DBM, dtype=torch.float64)
    np.testing.assert_allclose(utils.dbm_to_watt(x, precision="double").numpy(), dbm_to_w(DBM), rtol=1e-12)
    w = torch.tensor(WATTS, dtype=torch.float64)
    np.testing.assert_allclose(utils.watt_to_dbm(w, precision="double").numpy(), w_to_dbm(WATTS), atol=1e-10)
    np.testing.assert_allclose(
        utils.db_to_lin(torch.tensor(13.0, dtype=torch.float64), precision="double").item(),
        float(db_to_linear(13.0)),
        rtol=1e-12,
    )
