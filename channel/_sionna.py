"""Internal glue to Sionna 2.x (PyTorch): lazy imports and explicit random generators.

Sionna blocks draw from ``self.torch_rng``, which is Sionna's *global* generator
(``sionna.phy.config.torch_rng``). The testbed never uses global random state, so
:func:`with_generator` builds a subclass of a Sionna class whose ``torch_rng`` is the generator the
caller passed in. Nothing else of the Sionna class changes.

Only this module and the functions that call it import torch/Sionna, and only when called.
"""

from __future__ import annotations

import functools
from typing import Any

#: Precision passed to every Sionna object: float64 / complex128.
PRECISION = "double"


def torch_generator(rng: Any):
    """A CPU ``torch.Generator`` from the caller's random source.

    Args:
        rng: a ``torch.Generator`` (returned unchanged), a ``numpy.random.Generator`` (one 63-bit
            seed is drawn from it, so the NumPy stream advances by one draw) or an ``int`` seed.

    Returns:
        ``torch.Generator`` on the CPU.
    """
    import torch

    from ._torch_normal import generator_seed

    if isinstance(rng, torch.Generator):
        return rng
    seed = generator_seed(rng)
    gen = torch.Generator(device="cpu")
    gen.manual_seed(seed)
    return gen


@functools.lru_cache(maxsize=None)
def with_generator(cls: type) -> type:
    """Subclass of the Sionna class ``cls`` whose ``torch_rng`` is an explicit generator.

    Instances take the generator as the keyword ``generator`` and pass every other argument to
    ``cls``. The generator can be replaced later through ``obj.set_generator(gen)``.
    """

    class _WithGenerator(cls):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, generator=None, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            object.__setattr__(self, "_testbed_generator", generator)

        @property
        def torch_rng(self):  # noqa: D401 - overrides Sionna's global generator
            gen = self.__dict__.get("_testbed_generator")
            if gen is None:
                raise RuntimeError(
                    f"{cls.__name__}: no explicit generator set (the testbed never uses Sionna's "
                    "global random state)"
                )
            return gen

        def set_generator(self, generator) -> None:
            object.__setattr__(self, "_testbed_generator", generator)

    _WithGenerator.__name__ = f"{cls.__name__}WithGenerator"
    _WithGenerator.__qualname__ = _WithGenerator.__name__
    return _WithGenerator


def sionna_version() -> str:
    """The installed Sionna version (imports Sionna)."""
    import sionna

    return str(sionna.__version__)
