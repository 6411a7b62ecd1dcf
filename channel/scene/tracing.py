"""The channel between every pair of nodes, ray traced in one solver call.

Every node is a transmitter and a receiver at its position; one ``PathSolver`` call traces all
N × N links (Sionna RT's batch over sources and targets), never a Python loop over pairs. Of each
link's paths (coefficients a_p, delays τ_p; Sionna RT's ``Paths.a``, which carry the antenna
patterns, the free-space factor λ/(4π d) and every interaction, but not the carrier's phase):

- the narrowband coefficient at the carrier f_c, h = Σ_p a_p e^{−j2π f_c τ_p}: the sum of the
  baseband-equivalent coefficients a_p^b (Sionna RT's ``Paths.cir``), which is the frequency
  response Ĥ(f) = Σ_p a_p^b e^{−j2π f τ_p} (``Paths.cfr``) at baseband f = 0; complex128, the phase
  computed in float64;
- the power gain |h|², linear (Friis' (λ/(4π d))² for a lone line-of-sight path).

Paths are summed in an order fixed by their values (delay, then coefficient), not the solver's
order, so the same paths give the same bits. The diagonal (a node to itself) is 0, as is a link
with no path. Arrays are [receiver, sender], as ``channel.pathloss.LargeScaleFading``'s.

Reciprocity: with the same antenna at both ends the channel i → k is the channel k → i, but the
solver shoots rays from each transmitter and may miss from one end a path it found from the other
(a few per cent of the pairs at 10⁴ rays). Each pair takes the direction whose paths carry more
power (Σ_p |a_p|², the one that missed less), for both directions: the links are symmetric, as the
graphs drawn from them are.

Determinism: Dr.Jit's threads make the solver's results vary from call to call (another path
found, another rounding); with one thread the same call gives the same bits (and on this
two-core machine was faster: 0.1 s against 0.3 s for 8 nodes). A trace runs on one thread.

:func:`cached_trace` keeps each trace in a folder keyed by (the spec's digest, the positions'
bytes): a sweep, or the processes of one run, trace each geometry once. A cache file is read back
checked (shapes, dtypes, finiteness, its own key) and a bad one is traced again.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .geometry import load_scene
from .runtime import import_rt
from .spec import SceneSpec

__all__ = ["TracedLinks", "trace_links", "cached_trace", "cache_key", "MAX_TRACED_NODES"]

#: Most nodes one trace takes: N transmitters × N receivers × paths, in memory at once.
MAX_TRACED_NODES = 1024


@dataclass(frozen=True, eq=False)
class TracedLinks:
    """The traced channel of N nodes at their positions, [receiver, sender].

    Attributes:
        positions_m: (N, 3) float64, m.
        coefficient: (N, N) complex128, the narrowband coefficient at the carrier (sum over paths).
        gain: (N, N) float64, the linear power gain |coefficient|².
        paths: (N, N) int64, how many paths each link has.
    """

    positions_m: np.ndarray
    coefficient: np.ndarray
    gain: np.ndarray
    paths: np.ndarray


def _check_positions(positions_m: np.ndarray) -> np.ndarray:
    pos = np.asarray(positions_m, dtype=np.float64)
    if pos.ndim != 2 or pos.shape[1] != 3 or not 1 <= pos.shape[0] <= MAX_TRACED_NODES:
        raise ValueError(f"positions_m must have shape (N, 3), 1 <= N <= {MAX_TRACED_NODES}; got {pos.shape}")
    if not np.all(np.isfinite(pos)):
        raise ValueError("positions_m must be finite")
    return pos


def trace_links(spec: SceneSpec, positions_m: np.ndarray) -> TracedLinks:
    """Trace every link between the N nodes at ``positions_m`` ((N, 3), m) in ``spec``'s scene.

    One solver call: N transmitters and N receivers. Raises SceneUnavailable without Sionna RT,
    ValueError (one line) for bad positions or scene."""
    import mitsuba as mi

    pos = _check_positions(positions_m)
    rt = import_rt()
    scene = load_scene(spec)  # its arrays the spec's antenna
    for i, (x, y, z) in enumerate(pos.tolist()):
        scene.add(rt.Transmitter(f"tx-{i}", position=mi.Point3f(x, y, z)))
        scene.add(rt.Receiver(f"rx-{i}", position=mi.Point3f(x, y, z)))
    with _one_thread():
        paths = rt.PathSolver()(scene, max_depth=spec.max_depth, samples_per_src=spec.samples_per_source,
                                max_num_paths_per_src=_paths_per_source(spec, len(pos)),
                                synthetic_array=True, los=spec.line_of_sight,
                                specular_reflection=spec.specular_reflection,
                                diffuse_reflection=spec.diffuse_reflection, refraction=spec.refraction,
                                diffraction=spec.diffraction, seed=spec.solver_seed)
        real, imag = paths.a
        # [rx, rx_ant, tx, tx_ant, path] → [rx, tx, path] (one port each end), float32 → float64
        a = (np.array(real, dtype=np.float64) + 1j * np.array(imag, dtype=np.float64))[:, 0, :, 0, :]
        tau = np.array(paths.tau, dtype=np.float64).reshape(a.shape)  # synthetic array: [rx, tx, path]
        valid = np.array(paths.valid, dtype=bool).reshape(a.shape)
    return links_from_paths(pos, a, tau, valid, spec.carrier_hz)


#: Room for this many paths per link in the solver's buffer (the canyon at depth 3 has at most ~15).
PATHS_PER_LINK = 100


def _paths_per_source(spec: SceneSpec, targets: int) -> int:
    """The solver's buffer of paths per transmitter: its rays, and room for :data:`PATHS_PER_LINK`
    paths to each target. Sionna RT's default (10⁶) made a 32-node trace 12x slower (28 s against
    2.3 s) for the same paths; a buffer too small would drop paths."""
    return max(spec.samples_per_source, PATHS_PER_LINK * targets, 1000)


@contextlib.contextmanager
def _one_thread():
    """Dr.Jit on one thread inside (see the module's docstring), its count restored after."""
    import drjit as dr

    before = dr.thread_count()
    dr.set_thread_count(1)
    try:
        yield
    finally:
        dr.set_thread_count(before)


def links_from_paths(positions_m: np.ndarray, a: np.ndarray, tau_s: np.ndarray, valid: np.ndarray,
                     carrier_hz: float) -> TracedLinks:
    """The :class:`TracedLinks` of traced paths: ``a`` (N, N, P) complex coefficients (without the
    carrier's phase), ``tau_s`` (N, N, P) delays, s, ``valid`` (N, N, P) which paths exist;
    [receiver, sender, path]."""
    ok = valid & np.isfinite(a) & np.isfinite(tau_s)
    tau = np.where(ok, tau_s, np.inf)
    a = np.where(ok, a * np.exp(-2j * np.pi * carrier_hz * np.where(ok, tau_s, 0.0)), 0.0)  # a_p^b
    order = np.lexsort((a.imag, a.real, tau), axis=-1)  # the paths' order by value, not the solver's
    h = np.take_along_axis(a, order, axis=-1).sum(axis=-1)
    count = valid.sum(axis=-1).astype(np.int64)
    found = (np.abs(a) ** 2).sum(axis=-1)
    # The better-traced direction of each pair for both (ties: the upper triangle's, [i, k] with i < k).
    upper = np.triu(np.ones(found.shape, dtype=bool), 1)
    keep = (found > found.T) | ((found == found.T) & upper)
    h = np.where(keep, h, h.T)
    count = np.where(keep, count, count.T)
    np.fill_diagonal(h, 0.0)
    np.fill_diagonal(count, 0)
    h = np.ascontiguousarray(h, dtype=np.complex128)
    return TracedLinks(positions_m=np.array(positions_m, dtype=np.float64), coefficient=h,
                       gain=np.abs(h) ** 2, paths=count)


def cache_key(spec: SceneSpec, positions_m: np.ndarray) -> str:
    """The cache's name for a trace: (the spec's digest, the positions' float64 bytes)."""
    pos = np.ascontiguousarray(positions_m, dtype=np.float64)
    return hashlib.sha256(spec.key().encode() + repr(pos.shape).encode() + pos.tobytes()).hexdigest()


def _read(path: Path, pos: np.ndarray, key: str) -> TracedLinks | None:
    """The trace kept at ``path``, or None when it is absent or not what it says (checked)."""
    n = pos.shape[0]
    try:
        with np.load(path, allow_pickle=False) as f:
            if str(f["key"]) != key or not np.array_equal(f["positions_m"], pos):
                return None
            h, count = np.asarray(f["coefficient"]), np.asarray(f["paths"])
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        return None
    if h.dtype != np.complex128 or h.shape != (n, n) or count.shape != (n, n) or not np.all(np.isfinite(h)):
        return None
    return TracedLinks(positions_m=pos.copy(), coefficient=h, gain=np.abs(h) ** 2, paths=count.astype(np.int64))


def cached_trace(spec: SceneSpec, positions_m: np.ndarray, cache_dir: str | Path) -> TracedLinks:
    """:func:`trace_links` through the cache folder ``cache_dir`` (made if missing): a geometry
    traced before is read back, not traced. The file is written whole or not at all (a temporary
    file renamed), so processes sharing the folder never read half a trace."""
    pos = _check_positions(positions_m)
    key = cache_key(spec, pos)
    folder = Path(cache_dir)
    path = folder / f"{key}.npz"
    kept = _read(path, pos, key)
    if kept is not None:
        return kept
    links = trace_links(spec, pos)
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{key[:16]}-", suffix=".npz")
    try:
        with os.fdopen(fd, "wb") as out:
            np.savez(out, key=np.array(key), positions_m=pos, coefficient=links.coefficient, paths=links.paths)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return links
