"""Radio physics of a site: ray-traced channels between nodes in a Sionna RT scene.

Imports nothing of the testbed, and Sionna RT (Mitsuba 3, Dr.Jit) only inside the functions that
trace (``channel.scene.runtime.import_rt``), so importing this package costs nothing.

- :mod:`channel.scene.runtime`: finds an LLVM the CPU backend can use, imports ``sionna.rt``, or
  says in one line what to install (:class:`SceneUnavailable`).
- :mod:`channel.scene.spec`: :class:`SceneSpec`, everything that changes a trace, and its digest.
- :mod:`channel.scene.geometry`: loading a scene, its extent, its open ground (where a node may
  stand: under the open sky), positions drawn there.
- :mod:`channel.scene.radio_map`: :func:`coverage_map`, one transmitter's coverage over a plane
  (Sionna RT's radio map), for `testbed scene show --radio-map`.
- :mod:`channel.scene.tracing`: :func:`trace_links`, every node a transmitter and a receiver in one
  solver call, the N × N path gains and narrowband coefficients at the carrier;
  :func:`cached_trace`, the same through an on-disk cache keyed by (scene, positions, settings).
"""

from .runtime import SceneUnavailable, import_rt
from .spec import SceneSpec
from .tracing import TracedLinks, cached_trace, trace_links

__all__ = ["SceneSpec", "SceneUnavailable", "TracedLinks", "cached_trace", "import_rt", "trace_links"]
