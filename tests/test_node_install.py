"""`pip install 'testbed[node]'` into a fresh venv installs what a board runs and nothing of the
coordinator's, and the node it installs serves a run over Mosquitto."""

from __future__ import annotations

import json
import shutil
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

#: What `testbed[node]` may install: the package, numpy, paho-mqtt and orjson (the messages' JSON
#: headers), pydantic (the node checks the coordinator's experiment) with its own requirements,
#: threadpoolctl (one BLAS thread per host), tomli-w (the experiment's TOML), smbus2 (an INA meter's I2C bus), and the venv's own
#: pip/setuptools.
ALLOWED = {"testbed", "numpy", "paho-mqtt", "orjson", "pydantic", "pydantic-core", "annotated-types",
           "typing-extensions", "typing-inspection", "threadpoolctl", "smbus2", "pip", "setuptools", "tomli", "tomli-w"}
#: The coordinator's packages: none may be installed, or imported by the node.
#: What a board's node never imports: the coordinator's packages, and asyncio (only the embedded
#: broker runs an event loop).
COORDINATOR = ("scipy", "matplotlib", "dp_accounting", "amqtt", "asyncio", "serial", "torch", "sionna")

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
def node_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv (no system site packages) with `testbed[node]` installed from this checkout
    (a copy, so the build leaves nothing in the work tree); pip may use its wheel cache."""
    root = tmp_path_factory.mktemp("node-install")
    src = root / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    for package in ("testbed", "nodes", "channel", "firmware_bridge"):
        shutil.copytree(REPO / package, src / package, ignore=shutil.ignore_patterns("__pycache__"))
    env_dir = root / "venv"
    venv.create(env_dir, with_pip=True, system_site_packages=False)
    pip = subprocess.run([str(env_dir / "bin" / "python"), "-m", "pip", "install", "--quiet",
                          "--disable-pip-version-check", f"{src}[node]"], capture_output=True, text=True, timeout=900)
    assert pip.returncode == 0, pip.stderr[-3000:]
    return env_dir


@pytest.mark.slow
def test_node_extra_installs_only_what_a_board_runs(node_venv):
    listed = subprocess.run([str(node_venv / "bin" / "python"), "-m", "pip", "list", "--format", "json"],
                            capture_output=True, text=True, check=True)
    installed = {p["name"].lower().replace("_", "-") for p in json.loads(listed.stdout)}
    assert {"testbed", "numpy", "paho-mqtt"} <= installed
    assert installed <= ALLOWED, installed - ALLOWED


@pytest.mark.slow
def test_a_node_of_the_node_extra_serves_a_run_over_mosquitto(node_venv, mosquitto_broker, tmp_path):
    """Two nodes of the fresh venv serve a run with an ε budget (the zCDP gate runs on the board,
    the coordinator's tight RDP accountant does not); `testbed run` there is one line naming the
    extra it needs."""
    python = str(node_venv / "bin" / "python")
    keys = write_node_keys(tmp_path / "keys.json", 2)
    config = load_config_text(EXPERIMENT.replace("[output]", f'broker_url = "{mosquitto_broker.url}"\n'
                                                             f'keys = "{keys}"\n[output]'))
    probe = ("import runpy, sys; sys.argv = ['testbed'] + sys.argv[1:]\n"
             "try:\n    runpy.run_module('testbed', run_name='__main__')\n"
             "finally:\n    print(sorted(m for m in {COORDINATOR} if m in sys.modules), file=sys.stderr)\n"
             ).format(COORDINATOR=COORDINATOR)
    nodes = [subprocess.Popen([python, "-c", probe, "node", "--broker", mosquitto_broker.url, "--node-id", str(n),
                               "--meter", "model", "--state-dir", str(tmp_path / "state"), "--keys", keys],
                              cwd=tmp_path, stderr=subprocess.PIPE, text=True) for n in range(2)]
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
                         cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    assert run.stderr.strip() == ("testbed: run needs scipy, matplotlib, dp-accounting, amqtt, pyserial, rich, which are "
                                  "not installed: pip install 'testbed[coordinator]'")


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
        "needs dp-accounting, which is not installed: pip install 'testbed[coordinator]'")
    assert missing_package_message(ModuleNotFoundError("x", name="not_ours")) is None
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "serial" else real(name, *a))
    check_installed("node", "node")
    with pytest.raises(UserError, match=r"^bridge needs pyserial, which is not installed: pip install 'testbed\[bridge\]'$"):
        check_installed("bridge", "bridge")
