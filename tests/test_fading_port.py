"""channel._torch_normal: Sionna's Rayleigh fading without torch or Sionna (issue 44), held to
Sionna's own draws bit for bit. A DWFL run draws its channel from a NumPy stream; importing torch and
Sionna for it took seconds of every run's start. The committed experiments' channels must not move,
so every draw made from a NumPy generator or an int seed must be the one Sionna's
RayleighBlockFading makes with the torch.Generator seeded the same way."""

import functools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import require_module

torch = require_module("torch", "channel")
require_module("sionna.phy.channel", "channel")

from channel._sionna import torch_generator  # noqa: E402
from channel._torch_normal import TorchCpuNormals, generator_seed  # noqa: E402
from channel import fading  # noqa: E402
from channel.fading import SIONNA_STD, rayleigh_block_fading, rician_fading, sionna_rayleigh  # noqa: E402

SEEDS = st.one_of(st.integers(0, 2**63 - 2), st.sampled_from([0, 1, 2**32 - 1, 2**32, 2**63 - 2]))
# Both of torch's paths (fewer than 16 values one at a time, with a cache across its two calls;
# 16 or more in blocks of 16, the last block drawn again) and the edges between them.
COUNTS = st.one_of(st.integers(1, 70), st.sampled_from([100, 255, 256, 1000, 1023]))


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint64)


#: The standard deviation Sionna's RayleighBlockFading draws with on this machine: torch's sqrt(0.5),
#: a unit in the last place below the correctly rounded value on the machines the committed channels
#: were drawn on (channel.fading.SIONNA_STD, which the port keeps so that they do not move), the
#: correctly rounded value on others (an AVX-512 EPYC: math.sqrt(0.5)).
TORCH_STD = torch.tensor(0.5, dtype=torch.float64).sqrt().item()


def _at_torchs_std(test):
    """``test`` with the port drawing at :data:`TORCH_STD`: Sionna's draws here, bit for bit."""
    def at_torchs_std(*args, **kwargs):
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(fading, "SIONNA_STD", TORCH_STD)
            return test(*args, **kwargs)

    return functools.wraps(test)(at_torchs_std)


@settings(max_examples=150, deadline=None)
@given(count=COUNTS, seed=SEEDS)
@_at_torchs_std
def test_the_draws_are_sionnas_bit_for_bit(count, seed):
    ours = rayleigh_block_fading((count,), seed)
    theirs = sionna_rayleigh(count, torch_generator(seed))
    np.testing.assert_array_equal(_bits(ours), _bits(theirs))


@settings(max_examples=40, deadline=None)
@given(shape=st.lists(st.integers(1, 9), min_size=1, max_size=3), seed=st.integers(0, 2**64 - 1))
@_at_torchs_std
def test_a_numpy_generator_gives_sionnas_draws_and_advances_as_before(shape, seed):
    ours_rng, theirs_rng = np.random.default_rng(seed), np.random.default_rng(seed)
    ours = rayleigh_block_fading(tuple(shape), ours_rng)
    count = int(np.prod(shape))
    theirs = sionna_rayleigh(count, torch_generator(theirs_rng)).reshape(shape)
    np.testing.assert_array_equal(_bits(ours), _bits(theirs))
    assert ours_rng.integers(2**62) == theirs_rng.integers(2**62)  # one draw taken from each
    # Rician's diffuse part is the same draw.
    k = 2.0
    los = np.sqrt(k / (k + 1.0))
    np.testing.assert_array_equal(rician_fading(tuple(shape), k, np.random.default_rng(seed)),
                                  los + np.sqrt(1.0 / (k + 1.0)) * theirs)


@settings(max_examples=60, deadline=None)
@given(counts=st.lists(st.integers(1, 40), min_size=1, max_size=4), seed=SEEDS,
       std=st.floats(1e-3, 1e3))
def test_successive_calls_are_torchs(counts, seed, std):
    ours = TorchCpuNormals(seed)
    gen = torch.Generator(device="cpu")
    gen.manual_seed(seed)
    for count in counts:  # the cache of a call of fewer than 16 values carries over to the next
        theirs = torch.normal(0.0, std, size=(count,), dtype=torch.float64, generator=gen).numpy()
        np.testing.assert_array_equal(_bits(ours.normal(count, std)), _bits(theirs))


def test_sionnas_standard_deviation_is_torchs_sqrt_of_a_half_as_the_committed_channels_drew_it():
    assert SIONNA_STD == math.nextafter(math.sqrt(0.5), 0.0)  # one unit below, as torch 2.x gave it there
    assert TORCH_STD in (SIONNA_STD, math.sqrt(0.5))  # and here: that, or the correctly rounded value


def test_the_port_draws_what_torch_draws_at_the_committed_std():
    """Where torch's sqrt(0.5) is the correctly rounded one, Sionna's own draws here differ from
    the committed channels' by that unit: the port draws torch's normals at SIONNA_STD."""
    gen = torch_generator(7)
    real, imag = (torch.normal(0.0, SIONNA_STD, size=(33,), dtype=torch.float64, generator=gen).numpy()
                  for _ in range(2))
    ours = rayleigh_block_fading((33,), 7)
    np.testing.assert_array_equal(_bits(np.concatenate([ours.real, ours.imag])), _bits(np.concatenate([real, imag])))


def test_a_torch_generator_is_run_through_sionna():
    a, b = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    np.testing.assert_array_equal(rayleigh_block_fading((2, 3), a), sionna_rayleigh(6, b).reshape(2, 3))
    assert generator_seed(7) == 7 and generator_seed(np.int64(7)) == 7
