"""Golden vectors: the generator against Random123's known answers, and the firmware's node step
(built for this machine, run as a virtual board) against the numpy emulation sim uses."""

import numpy as np
import pytest

from testbed.algorithms.contract import McuTask
from testbed.algorithms.mcu_logistic import batches, node_step
from testbed.streams.counter_rng import Purpose, WordStream, floyd_sample, gaussians, philox4x32

from conftest_firmware import needs_cc


@pytest.mark.parametrize("ctr, key, out", [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
])
def test_philox_known_answers(ctr, key, out):
    assert tuple(int(w) for w in philox4x32(np.array([ctr], np.uint32), key)[0]) == out


def test_gaussians_are_standard_normal_and_floyd_is_uniform():
    g = gaussians(3, 1, 0, Purpose.NOISE, 200_000).astype(np.float64)
    assert abs(g.mean()) < 0.01 and abs(g.std() - 1) < 0.01
    counts = np.zeros(20)
    stream = WordStream(3, 1, 0, Purpose.BATCH)
    for _ in range(4000):
        pick = floyd_sample(stream, 20, 5)
        assert len(set(pick)) == 5
        counts[pick] += 1
    assert np.all(np.abs(counts / 4000 - 0.25) < 0.04)


def _inputs(n, d, c, seed):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, d))
    x /= np.maximum(1, np.linalg.norm(x, axis=1, keepdims=True))
    return x.astype(np.float32), rng.integers(0, c, n), (rng.normal(size=d * c + c) * 0.3).astype(np.float32)


@needs_cc
@pytest.mark.parametrize("n, d, c, tau, b, sigma", [(200, 8, 2, 5, 16, 1.0), (37, 5, 3, 3, 37, 0.5),
                                                    (300, 31, 7, 2, 64, 0.0), (64, 4, 3, 4, 9, 2.0)])  # the last: P = 15, odd
def test_firmware_step_equals_numpy_emulation(virtual_board, n, d, c, tau, b, sigma):
    x, y, theta = _inputs(n, d, c, n + d)
    task = McuTask(seed=12345678901, node=3, round_index=7, tau=tau, batch=b, lr=0.3, sigma=sigma, n_classes=c)
    virtual_board.provision(x, y, c)
    got = virtual_board.run(task, theta)
    want = node_step(task, theta, x, y)
    assert got.update.dtype == np.float32 and got.steps == tau and got.cycles > 0
    np.testing.assert_allclose(got.update, want, rtol=1e-5, atol=1e-5)  # float32 rounding, not bits


def test_emulated_batches_are_a_function_of_the_key_only():
    task = McuTask(seed=1, node=2, round_index=3, tau=3, batch=4, lr=0.1, sigma=1.0, n_classes=2)
    assert batches(task, 50) == batches(task, 50)
    assert batches(task, 50) != batches(McuTask(1, 2, 4, 3, 4, 0.1, 1.0, 2), 50)
