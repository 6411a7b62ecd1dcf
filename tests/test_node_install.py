"""`pip install 'dpfl-testbed[node]'` into a fresh venv installs what a board runs and nothing of the
coordinator's, and the node it installs serves a run over Mosquitto."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import venv
from pathlib import Path

import pytest

from testbed.assembly.config import load_config_text
from testbed.ledger.files import read_ledger
from testbed.orchestration.runner import run_experiment

from conftest import REPO
from conftest_mqtt import write_node_keys

#: What `dpfl-testbed[node]` may install: the package, numpy, paho-mqtt and orjson (the messages' JSON
#: headers), pydantic (the node checks the coordinator's experiment) with its own requirements,
#: threadpoolctl (one BLAS thread per host), tomli-w (the experiment's TOML), smbus2 (an INA meter's I2C bus), and the venv's own
#: pip/setuptools.
ALLOWED = {"dpfl-testbed", "numpy", "paho-mqtt", "orjson", "pydantic", "pydantic-core", "annotated-types",
           "typing-extensions", "typing-inspection", "threadpoolctl", "smbus2", "pip", "setuptools", "tomli", "tomli-w"}
#: The coordinator's packages: none may be installed, or imported by the node.
#: What a board's node never imports: the coordinator's packages, and asyncio (only the embedded
#: broker runs an event loop).
COORDINATOR = ("scipy", "matplotlib", "dp_accounting", "amqtt", "asyncio", "serial", "torch", "sionna")

#: The environment of the venv's processes: without PYTHONPATH, which would put a checkout's
#: package (or its build's egg-info, which pip takes for an installed distribution) before the venv's.
FRESH_ENV = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}

EXPERIMENT = """
[run]
name = "fresh"
seed = 4
mode = "mqtt"
[data]
num_nodes = 2
samples_per_node = 60
dim = 6
[dp_pasgd]
steps = 10
tau = 5
batch = 8
lr = 0.5
epsilon = 2.0
[privacy]
tight_accountant = "rdp"
[budget]
epsilon = 4.0
[mqtt]
emulated = false
round_timeout_s = 30.0
quorum = 2
[output]
figures = false
"""


@pytest.fixture(scope="module")
def node_venv(tmp_path_factory: pytest.TempPathFactory, built_dist) -> Path:
    """A fresh venv (no system site packages) with `dpfl-testbed[node]` installed from the wheel
    ``python -m build`` makes (not editable, not the checkout); pip may use its wheel cache."""
    wheel, _ = built_dist
    env_dir = tmp_path_factory.mktemp("node-install") / "venv"
    venv.create(env_dir, with_pip=True, system_site_packages=False)
    pip = subprocess.run([str(env_dir / "bin" / "python"), "-m", "pip", "install", "--quiet",
                          "--disable-pip-version-check", f"{wheel}[node]"], capture_output=True, text=True, timeout=900,
                         env=FRESH_ENV)
    assert pip.returncode == 0, pip.stderr[-3000:]
    return env_dir


@pytest.mark.slow
def test_node_extra_installs_only_what_a_board_runs(node_venv):
    listed = subprocess.run([str(node_venv / "bin" / "python"), "-m", "pip", "list", "--format", "json"],
                            capture_output=True, text=True, check=True, env=FRESH_ENV)
    installed = {p["name"].lower().replace("_", "-") for p in json.loads(listed.stdout)}
    assert {"dpfl-testbed", "numpy", "paho-mqtt"} <= installed
    assert installed <= ALLOWED, installed - ALLOWED


#: Run by the wheel's Python outside the checkout: the files the package reads at run time, found
#: where the installed package is, and the version its metadata and the command say.
READS_ITS_FILES = """
import importlib.metadata, json, pathlib, sys
import testbed, testbed.data.cache, testbed.watch, nodes, firmware_bridge
here = lambda module: pathlib.Path(module.__file__).parent
files = [testbed.data.cache.BUNDLED_DIR / "adult.data.xz", here(testbed.watch) / "static" / "index.html",
         here(nodes) / "profiles.toml", here(firmware_bridge) / "firmware" / "Makefile"]
print(json.dumps({"file": testbed.__file__, "missing": [str(f) for f in files if not f.is_file()],
                  "metadata": importlib.metadata.version("dpfl-testbed"), "version": testbed.__version__}))
"""


@pytest.mark.slow
def test_the_installed_wheel_reads_its_own_files_outside_the_checkout(node_venv, tmp_path):
    done = subprocess.run([str(node_venv / "bin" / "python"), "-c", READS_ITS_FILES], cwd=tmp_path,
                          capture_output=True, text=True, env=FRESH_ENV, timeout=120)
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert found["file"].startswith(str(node_venv)) and found["missing"] == []
    assert found["metadata"] == found["version"]
    said = subprocess.run([str(node_venv / "bin" / "testbed"), "--version"], cwd=tmp_path, capture_output=True,
                          text=True, env=FRESH_ENV, timeout=120)
    assert said.stdout.strip() == f"testbed {found['version']}", said.stderr


@pytest.mark.slow
def test_a_node_of_the_node_extra_serves_a_run_over_mosquitto(node_venv, mosquitto_broker, tmp_path):
    """Two nodes of the fresh venv serve a run with an ε budget (the zCDP gate runs on the board,
    the coordinator's tight RDP accountant does not); `testbed run` there is one line naming the
    extra it needs."""
    python = str(node_venv / "bin" / "python")
    keys = write_node_keys(tmp_path / "keys.json", 2)
    config = load_config_text(EXPERIMENT.replace("[output]", f'broker_url = "{mosquitto_broker.url}"\n'
                                                             f'keys = "{keys}"\n[output]'))
    probe = ("import sys; from testbed.cli import main\n"
             "try:\n    sys.exit(main(sys.argv[1:]))\n"
             "finally:\n    print(sorted(m for m in {COORDINATOR} if m in sys.modules), file=sys.stderr)\n"
             ).format(COORDINATOR=COORDINATOR)
    nodes = [subprocess.Popen([python, "-c", probe, "node", "--broker", mosquitto_broker.url, "--node-id", str(n),
                               "--meter", "model", "--state-dir", str(tmp_path / "state"), "--keys", keys],
                              cwd=tmp_path, stderr=subprocess.PIPE, text=True, env=FRESH_ENV) for n in range(2)]
    result = {}
    coordinator = threading.Thread(target=lambda: result.update(
        r=run_experiment(config, out_dir=tmp_path / "run", quiet=True)))
    coordinator.start()
    try:
        coordinator.join(timeout=120)
        errors = [p.communicate(timeout=60)[1] for p in nodes]
    finally:
        for p in nodes:
            p.kill()
            p.wait()
    assert not coordinator.is_alive()
    assert result["r"].summary["status"] == "completed", errors
    assert all(p.returncode == 0 for p in nodes), errors
    assert all(e.strip().splitlines()[-1] == "[]" for e in errors), errors  # imported none of them
    computed = {(e.node, e.round) for e in read_ledger(result["r"].run_dir / "ledger.csv") if e.kind == "compute"}
    assert computed == {(n, r) for n in range(2) for r in range(2)}
    (tmp_path / "experiment.toml").write_text(EXPERIMENT)
    run = subprocess.run([str(node_venv / "bin" / "testbed"), "run", "experiment.toml", "--mode", "sim"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120, env=FRESH_ENV)
    assert run.returncode == 2
    assert run.stderr.strip() == ("testbed: run needs scipy, matplotlib, dp-accounting, amqtt, pyserial, rich, which are "
                                  "not installed: pip install 'dpfl-testbed[coordinator]'")


def test_the_extras_checked_before_a_command_are_those_of_pyproject():
    """Each module testbed.util.extras names for an extra is a distribution of that extra (or of the
    base) in pyproject.toml."""
    import re
    import tomllib

    from testbed.util.extras import EXTRA_OF_MODULE, MODULES_OF_EXTRA

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]

    def names(requirements: list[str]) -> set[str]:
        return {re.match(r"[A-Za-z0-9_.-]+", r).group(0).lower() for r in requirements}

    base = names(project["dependencies"])
    for extra, modules in MODULES_OF_EXTRA.items():
        provided = base | names(project["optional-dependencies"][extra])
        assert {EXTRA_OF_MODULE[m][0] for m in modules} <= provided, extra
    for module, (package, extra) in EXTRA_OF_MODULE.items():
        assert package.lower() in names(project["optional-dependencies"][extra]), module
    assert not base & {"scipy", "matplotlib", "dp-accounting", "amqtt", "paho-mqtt", "pyserial"}


def test_a_missing_package_is_named_with_the_extra_that_installs_it(monkeypatch):
    import importlib.util

    from testbed.errors import UserError
    from testbed.util.extras import check_installed, missing_package_message

    assert missing_package_message(ModuleNotFoundError("x", name="dp_accounting.pld")) == (
        "needs dp-accounting, which is not installed: pip install 'dpfl-testbed[coordinator]'")
    assert missing_package_message(ModuleNotFoundError("x", name="not_ours")) is None
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "serial" else real(name, *a))
    check_installed("node", "node")
    with pytest.raises(UserError, match=r"^bridge needs pyserial, which is not installed: pip install 'dpfl-testbed\[bridge\]'$"):
        check_installed("bridge", "bridge")
