pytest_plugins = ["conftest_mqtt", "conftest_firmware"]

import atexit
import functools
import importlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import TypeVar

import pytest
from hypothesis import HealthCheck, settings

# Property-based tests (Hypothesis) at the trust boundaries: no deadline (a 2-core machine under a
# full suite times a single example anywhere from 1 to 100 ms), and a fixed number of examples so
# CI's time is bounded; `HYPOTHESIS_PROFILE=thorough` for a long local search. The examples
# database (.hypothesis/) stays out of git.
settings.register_profile("ci", max_examples=60, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
settings.register_profile("thorough", max_examples=2000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# Every tight ε is computed, none read from the user's ε cache: a test's figures never depend on
# what an earlier run left there. tests/test_epsilon_cache.py turns it on, in a folder of its own.
os.environ["TESTBED_EPSILON_CACHE"] = "off"

REPO = Path(__file__).resolve().parents[1]
T = TypeVar("T")


def repo_pythonpath() -> str:
    """PYTHONPATH for a child interpreter: this checkout first, then whatever this one was given
    (an installed plugin's folder: tests/test_plugins.py runs the registry tests so)."""
    return os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)


@pytest.fixture
def small_config_text():
    """A fast DP-PASGD experiment: 4 synthetic nodes, no figures."""
    return """
[run]
name = "t"
seed = 1
[data]
dataset = "synthetic"
num_nodes = 4
samples_per_node = 80
dim = 8
[dp_pasgd]
steps = 20
tau = 5
batch = 8
lr = 0.5
sigma = 1.0
clip = true           # G = 1 below the logistic model's own bound 2: held by clipping (issue 39)
lipschitz = 1.0
[output]
figures = false
"""


@pytest.fixture
def small_config_file(tmp_path, small_config_text):
    path = tmp_path / "exp.toml"
    path.write_text(small_config_text)
    return path


# ---- the test signal: a missing tool skips here, fails in CI ------------------------------------

IN_CI = os.environ.get("CI") == "true"  # what CI services set; .ci/run sets it too


@pytest.fixture
def forked_hosts(monkeypatch):
    """Emulated hosts forked from this process, so that a test's monkeypatch of node code reaches
    them. The coordinator starts hosts as new interpreters once torch is imported (forking torch's
    thread pools is unsafe), which any earlier test of the session may have done; the hosts of the
    tests that use this fixture run no torch."""
    import testbed.orchestration.coordinator as coordinator
    import testbed.orchestration.emulated_hosts as emulated_hosts

    for module in (coordinator, emulated_hosts):  # the run's broker, its hosts
        monkeypatch.setattr(module, "can_fork", lambda: True)


def require_tool(name: str, available: bool, why: str) -> None:
    """Go on if ``available``; else end the test (or the module, at import) with the one line
    ``"<name>: <why>"``: a skip on a machine that lacks the tool, a failure under ``CI=true``, where
    .ci/run installs every tool the suite needs, so that CI's green means the suite ran."""
    __tracebackhide__ = True  # a skip is reported at the test's line that asked, not here
    if available:
        return
    reason = f"{name}: {why}"
    if IN_CI:
        pytest.fail(f"{reason} (CI=true, where .ci/run installs it: a skip would hide it)", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


@functools.cache
def _adult_file() -> Path | None:
    from testbed.data import cache
    from testbed.data.adult import ADULT

    root = os.environ.get(cache.DATA_ENV)
    for candidate in ([Path(root) / "adult" / "adult.data", Path(root) / "adult.data"] if root else []):
        if candidate.is_file():
            return candidate
    packed = cache.bundled_copy(ADULT)
    if packed is None:
        return None
    folder = Path(tempfile.mkdtemp(prefix="testbed-tests-data-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    cache.unpack(packed, folder / "adult" / "adult.data")
    return folder / "adult" / "adult.data"


def adult_file() -> Path:
    """The UCI ``adult.data`` the tests read: ``$TESTBED_DATA``'s (``adult/adult.data`` or
    ``adult.data``) first, else the package's copy (testbed/data/bundled/) unpacked once per session
    into a temporary ``<folder>/adult/adult.data``; its ``parent`` serves as a ``$TESTBED_DATA`` too.
    Missing, it is a missing tool: a skip here, a failure under ``CI=true``."""
    __tracebackhide__ = True
    found = _adult_file()
    require_tool("adult.data", found is not None,
                 "not in $TESTBED_DATA and the package's copy testbed/data/bundled/adult.data.xz is absent")
    return found


def require_command(command: str, install: str) -> str:
    """The path of ``command`` on PATH, or :func:`require_tool`'s skip/failure saying ``install``."""
    __tracebackhide__ = True
    path = shutil.which(command)
    require_tool(command, path is not None, f"not on PATH ({install})")
    return path


def require_module(module: str, extra: str) -> ModuleType:
    """``module`` imported, or :func:`require_tool`'s skip/failure naming the package ``extra`` that
    brings it (a pytest ``importorskip`` that fails in CI, where `make test` installs the extras)."""
    __tracebackhide__ = True
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        error = exc
    require_tool(module, False, f"cannot be imported ({error}; pip install -e '.[{extra}]')")
    raise error  # not reached: require_tool skipped or failed


def needs_command(command: str, install: str) -> pytest.MarkDecorator:
    """:func:`require_command` as a mark, for a test or a module's ``pytestmark``: checked when
    each test is set up (:func:`pytest_runtest_setup`), so collection itself never fails."""
    return pytest.mark.requires(require_command, command, install)


def needs_module(module: str, extra: str) -> pytest.MarkDecorator:
    """:func:`require_module` as a mark (see :func:`needs_command`)."""
    return pytest.mark.requires(require_module, module, extra)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "requires(check, *args): check(*args) before the test (needs_command, needs_module)")


def pytest_runtest_setup(item: pytest.Item) -> None:
    __tracebackhide__ = True
    for mark in item.iter_markers("requires"):
        check, *args = mark.args
        try:
            check(*args)
        except pytest.skip.Exception as skip:
            skip._use_item_location = True  # reported at the test, as pytest's own skipif marks are
            raise


# ---- waiting for events, not for the clock -------------------------------------------------------

def wait_until(predicate: Callable[[], T], timeout_s: float, what: str, *, poll_s: float = 0.01) -> T:
    """Poll ``predicate`` until it returns something true and return that; fail the test naming
    ``what`` after ``timeout_s``. The timeout is a bound for a hung product, not a measurement:
    give it ample room (a loaded 2-core machine delays threads by hundreds of milliseconds)."""
    deadline = time.monotonic() + timeout_s
    while not (value := predicate()):
        if time.monotonic() >= deadline:
            pytest.fail(f"timed out after {timeout_s:g} s waiting for {what}", pytrace=False)
        time.sleep(poll_s)
    return value


# ---- the package as published: python -m build's wheel and sdist ---------------------------------

#: The folders pyproject.toml's packages.find takes (with pyproject.toml and README.md: a build's inputs).
PACKAGE_DIRS = ("testbed", "nodes", "channel", "firmware_bridge")


def tracked_files(*paths: str) -> list[str]:
    """The files git tracks under ``paths`` of the checkout (what a clean clone has)."""
    import subprocess

    require_command("git", "apt-get install git")
    listed = subprocess.run(["git", "ls-files", "--", *paths], cwd=REPO, capture_output=True, text=True, check=True)
    return listed.stdout.splitlines()


@pytest.fixture(scope="session")
def built_dist(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(wheel, sdist) that ``python -m build`` makes, as CI does (.ci/run, `make dist`), from a copy
    of the checkout's tracked files (nothing written to the work tree; no network: --no-isolation)."""
    import subprocess
    import sys

    require_module("build", "test")
    root = tmp_path_factory.mktemp("dist")
    src = root / "src"
    for name in tracked_files("pyproject.toml", "README.md", *PACKAGE_DIRS):
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO / name, src / name)
    done = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(root / "dist"), str(src)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (wheel,), (sdist,) = list((root / "dist").glob("*.whl")), list((root / "dist").glob("*.tar.gz"))
    return wheel, sdist
