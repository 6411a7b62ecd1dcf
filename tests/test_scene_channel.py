"""channel.scene: ray-traced links (Sionna RT) against Friis in free space and against Sionna RT's
own frequency response link by link; the cache; the loader's refusals. CI installs Sionna RT and
libllvm19 (.ci/run), so nothing here skips."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from channel import free_space_pathloss_db
from channel.scene import SceneSpec, SceneUnavailable, cached_trace, import_rt, trace_links
from channel.scene import geometry, runtime, tracing

#: Few rays: a street canyon of 4 nodes at depth 2 finds its paths with 10⁴ (and traces in 0.1 s).
CANYON = SceneSpec("simple_street_canyon", carrier_hz=3.5e9, max_depth=2, samples_per_source=10_000)
#: Four nodes in the canyon's streets (open ground, checked below), 1.5 m up.
STREETS_M = np.array([[-40.0, 0.0, 1.5], [0.0, 0.0, 1.5], [35.0, 2.0, 1.5], [-20.0, -45.0, 1.5]])


def test_free_space_gains_are_friis():
    """The empty scene, line of sight only: |h|² = (λ / (4π d))², every pair, to float32's precision."""
    spec = SceneSpec("empty", carrier_hz=2.4e9, max_depth=0, samples_per_source=1000)
    pos = np.array([[0.0, 0.0, 1.5], [10.0, 0.0, 1.5], [0.0, 37.0, 1.5], [100.0, 3.0, 20.0], [-250.0, 80.0, 5.0]])
    links = trace_links(spec, pos)
    d = np.linalg.norm(pos[:, None] - pos[None], axis=-1)
    off = ~np.eye(len(pos), dtype=bool)
    friis = 10.0 ** (-free_space_pathloss_db(d[off], spec.carrier_hz) / 10.0)
    np.testing.assert_allclose(links.gain[off], friis, rtol=1e-5)
    assert np.all(np.diag(links.gain) == 0) and np.all(links.paths[off] == 1)
    # The phase of a lone path is the carrier's over its length: h = |h| e^{−j 2π d / λ}.
    lam = 299_792_458.0 / spec.carrier_hz
    phase = np.angle(links.coefficient[off] * np.exp(2j * np.pi * d[off] / lam))
    np.testing.assert_allclose(phase, 0.0, atol=1e-3)


def test_every_link_matches_sionna_rts_own_response_of_that_link_alone():
    """Each pair traced alone (one transmitter, one receiver) through Sionna RT's own Paths.cfr at
    the carrier (baseband 0 Hz): the batched trace's coefficient, pair by pair."""
    assert geometry.open_ground(CANYON, STREETS_M[:, :2]).all()
    links = trace_links(CANYON, STREETS_M)
    rt = import_rt()
    import mitsuba as mi

    n = len(STREETS_M)
    for i in range(n):
        for k in range(i + 1, n):
            scene = geometry.load_scene(CANYON)
            scene.tx_array = scene.rx_array = rt.PlanarArray(num_rows=1, num_cols=1, pattern="iso", polarization="V")
            scene.add(rt.Transmitter("tx", position=mi.Point3f(*STREETS_M[k].tolist())))
            scene.add(rt.Receiver("rx", position=mi.Point3f(*STREETS_M[i].tolist())))
            with tracing._one_thread():
                paths = rt.PathSolver()(scene, max_depth=CANYON.max_depth, samples_per_src=CANYON.samples_per_source,
                                        seed=CANYON.solver_seed)
                h = complex(np.asarray(paths.cfr(frequencies=mi.Float([0.0]), normalize_delays=False,
                                                 out_type="numpy")).ravel()[0])
            assert links.gain[i, k] > 0
            assert abs(h) ** 2 == pytest.approx(links.gain[i, k], rel=1e-3), (i, k)
            # Sionna RT computes the carrier's phase in float32: a few 1e-4 rad at these delays.
            assert abs(h - links.coefficient[i, k]) <= 1e-3 * abs(h), (i, k)
    assert np.array_equal(links.coefficient, links.coefficient.T)  # reciprocal


def test_a_trace_is_the_same_bits_every_time():
    a, b = trace_links(CANYON, STREETS_M), trace_links(CANYON, STREETS_M)
    assert np.array_equal(a.coefficient, b.coefficient) and np.array_equal(a.paths, b.paths)


def test_the_cache_traces_a_geometry_once(tmp_path, monkeypatch):
    first = cached_trace(CANYON, STREETS_M, tmp_path)
    assert len(list(tmp_path.glob("*.npz"))) == 1

    def no_trace(*args, **kwargs):
        raise AssertionError("traced again")

    monkeypatch.setattr(tracing, "trace_links", no_trace)
    again = cached_trace(CANYON, STREETS_M, tmp_path)
    assert np.array_equal(again.coefficient, first.coefficient) and np.array_equal(again.gain, first.gain)
    # Another setting or another position is another trace.
    for spec, pos in ((CANYON.replaced(max_depth=1), STREETS_M), (CANYON, STREETS_M + [0.5, 0.0, 0.0])):
        with pytest.raises(AssertionError, match="traced again"):
            cached_trace(spec, pos, tmp_path)


def test_a_damaged_cache_file_is_traced_again(tmp_path):
    first = cached_trace(CANYON, STREETS_M, tmp_path)
    (path,) = tmp_path.glob("*.npz")
    path.write_bytes(path.read_bytes()[:100])
    assert np.array_equal(cached_trace(CANYON, STREETS_M, tmp_path).coefficient, first.coefficient)
    # A file under the right name holding another geometry's trace is not served.
    np.savez(path, key=np.array("other"), positions_m=STREETS_M, coefficient=first.coefficient * 2, paths=first.paths)
    assert np.array_equal(cached_trace(CANYON, STREETS_M, tmp_path).coefficient, first.coefficient)


def test_positions_stand_on_open_ground_and_depend_on_the_generator_alone():
    a = geometry.positions_in_open_space(CANYON, 12, np.random.default_rng(3))
    b = geometry.positions_in_open_space(CANYON, 12, np.random.default_rng(3))
    assert a.shape == (12, 3) and np.array_equal(a, b)
    assert geometry.open_ground(CANYON, a[:, :2]).all()
    ground = geometry.ground_height_m(CANYON, a[:, :2])
    np.testing.assert_allclose(a[:, 2] - ground, CANYON.antenna_height_m)
    # A roof is not open ground: the canyon's tallest building stands round (0, 25).
    assert not geometry.open_ground(CANYON, np.array([[5.0, 25.0]]))[0]
    with pytest.raises(ValueError, match="almost no open ground"):
        geometry.positions_in_open_space(CANYON, 3, np.random.default_rng(0), region=(0.0, 10.0, 20.0, 30.0))


@pytest.mark.parametrize("bad, match", [
    (dict(scene="no_such_scene"), "is not a Sionna RT scene"),
    (dict(scene="/nonexistent/scene.xml"), "scene /nonexistent/scene.xml"),
])
def test_a_bad_scene_is_one_line(bad, match):
    with pytest.raises(ValueError, match=match) as err:
        geometry.load_scene(CANYON.replaced(**bad))
    assert "\n" not in str(err.value)


def test_bad_spec_values_are_refused():
    with pytest.raises(ValueError, match="antenna_pattern"):
        SceneSpec("empty", antenna_pattern="yagi")
    with pytest.raises(ValueError, match="carrier_hz"):
        SceneSpec("empty", carrier_hz=0.0)
    with pytest.raises(ValueError, match="positions_m"):
        trace_links(CANYON, np.zeros((3, 2)))


def test_only_an_llvm_that_aborts_dr_jit_is_one_line_naming_what_to_install(monkeypatch, tmp_path):
    """Debian 12 without libllvm19: Dr.Jit would find LLVM 15 and abort the process at the first trace."""
    old = tmp_path / "libLLVM-15.so.1"
    old.write_bytes(b"")
    monkeypatch.delenv("DRJIT_LIBLLVM_PATH", raising=False)
    monkeypatch.setattr(runtime, "KNOWN_LLVM_PATHS", ("/nonexistent/libLLVM.so",))
    monkeypatch.setattr(runtime, "OLD_LLVM_GLOBS", (str(tmp_path / "libLLVM-1[45].so*"),))
    with pytest.raises(SceneUnavailable, match=r"apt-get install libllvm19") as err:
        import_rt()
    assert "\n" not in str(err.value) and "dpfl-testbed[scene]" in str(err.value)
    monkeypatch.setenv("DRJIT_LIBLLVM_PATH", str(tmp_path / "missing.so"))
    with pytest.raises(SceneUnavailable, match="is not a file"):
        import_rt()


def test_the_llvm_is_found_at_debians_path_without_the_variable(monkeypatch):
    monkeypatch.delenv("DRJIT_LIBLLVM_PATH", raising=False)
    assert runtime.llvm_path() in runtime.KNOWN_LLVM_PATHS


def test_the_spec_key_follows_a_scene_files_bytes(tmp_path):
    xml = tmp_path / "s.xml"
    xml.write_text('<scene version="2.1.0"></scene>')
    key = SceneSpec(str(xml)).key()
    xml.write_text('<scene version="2.1.0"> </scene>')
    assert SceneSpec(str(xml)).key() != key


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 5), paths=st.integers(1, 6), seed=st.integers(0, 2**32 - 1))
def test_links_are_the_same_bits_whatever_order_the_solver_lists_paths_in(n, paths, seed):
    """Summed in an order of their own values: the solver's order (which its threads change) never
    reaches the bits; every pair reciprocal, the diagonal and a pathless link zero."""
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(n, n, paths)) + 1j * rng.normal(size=(n, n, paths))
    tau = rng.uniform(1e-8, 1e-6, size=(n, n, paths))
    valid = rng.random((n, n, paths)) < 0.7
    pos = rng.normal(size=(n, 3))
    base = tracing.links_from_paths(pos, a, tau, valid, 3.5e9)
    order = rng.permuted(np.broadcast_to(np.arange(paths), (n, n, paths)), axis=-1)
    shuffled = tracing.links_from_paths(pos, *(np.take_along_axis(x, order, axis=-1) for x in (a, tau, valid)), 3.5e9)
    assert np.array_equal(base.coefficient, shuffled.coefficient)
    assert np.array_equal(base.coefficient, base.coefficient.T) and np.all(np.diag(base.coefficient) == 0)
    none = ~valid.any(axis=-1) & ~valid.any(axis=-1).T
    assert np.all(base.gain[none] == 0)


@settings(max_examples=40, deadline=None)
@given(data=st.binary(max_size=600))
def test_any_bytes_in_the_cache_are_traced_again_never_served(tmp_path_factory, data):
    """A cache file is outside input: whatever it holds, the trace served is the real one."""
    folder = tmp_path_factory.mktemp("cache")
    spec = CANYON.replaced(max_depth=1, samples_per_source=500)
    first = cached_trace(spec, STREETS_M[:2], folder)
    (path,) = folder.glob("*.npz")
    path.write_bytes(data)
    assert np.array_equal(cached_trace(spec, STREETS_M[:2], folder).coefficient, first.coefficient)
