"""Plugins from outside the package (issue 42, part 1): an installed distribution adds an item on
any axis through an entry point (testbed.util.registrations), as a researcher's own project would,
without a change to this repository.

Each project is installed with pip into a folder of its own (``--target``) and used from a fresh
interpreter with that folder on PYTHONPATH, so the shared environment is never changed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from testbed.cli.new import NAME, write_project
from testbed.errors import UserError
from testbed.orchestration import contract_suite as suite
from testbed.util.registrations import GROUPS

REPO = Path(__file__).resolve().parents[1]


def _install(projects: list[Path], target: Path) -> dict[str, str]:
    """pip-install ``projects`` into ``target`` (no dependencies, no build isolation: offline, the
    venv's setuptools); the environment of an interpreter that sees them and this checkout."""
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                           "--no-index", "--target", str(target), *map(str, projects)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(target), str(REPO)]))


def _run(args: list[str], env: dict[str, str], cwd: Path, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=timeout)


def _project(folder: Path, name: str, modules: dict[str, str], entry_points: dict[str, dict[str, str]]) -> Path:
    """A minimal installable project: ``modules`` (module name → source) and ``entry_points``
    (group → {entry point → module})."""
    folder.mkdir(parents=True)
    groups = "".join(f'\n[project.entry-points."{group}"]\n' + "".join(f'{ep} = "{module}"\n' for ep, module in eps.items())
                     for group, eps in entry_points.items())
    (folder / "pyproject.toml").write_text(textwrap.dedent(f'''\
        [build-system]
        requires = ["setuptools>=61"]
        build-backend = "setuptools.build_meta"
        [project]
        name = "{name}"
        version = "0.1.0"
        [tool.setuptools]
        py-modules = {json.dumps(list(modules))}
        ''') + groups)
    for module, source in modules.items():
        (folder / f"{module}.py").write_text(textwrap.dedent(source))
    return folder


# ------------------------------------------------------------------------------- testbed new

@pytest.mark.slow
@pytest.mark.parametrize("kind", ["algorithm", "dataset", "accountant"])
def test_a_project_testbed_new_writes_installs_and_passes_the_contract_suite(kind, tmp_path):
    """`testbed new KIND NAME` → pip install → its own conformance test: the contract suite on the
    newcomer (an algorithm and a data set in sim and over MQTT on the embedded broker), and the
    config offers it, with nothing of this repository changed."""
    name = f"zz_{kind}_q7"
    done = subprocess.run([sys.executable, "-m", "testbed", "new", kind, name, "--dir", str(tmp_path / "project")],
                          capture_output=True, text=True, cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=120)
    assert done.returncode == 0, done.stderr
    env = _install([tmp_path / "project"], tmp_path / "site")
    tested = _run(["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"], env, tmp_path / "project")
    assert tested.returncode == 0, tested.stdout[-3000:] + tested.stderr[-2000:]
    expected = {"algorithm": len(suite.ALGORITHM_CHECKS) + 1, "dataset": len(suite.DATASET_CHECKS),
                "accountant": len(suite.ACCOUNTANT_CHECKS)}[kind]  # the suite's checks (+ sim = MQTT)
    assert f"{expected} passed" in tested.stdout, tested.stdout[-500:]
    schema = _run(["-m", "testbed", "schema"], env, tmp_path)
    where = {"algorithm": ("RunSection", "algorithm"), "dataset": ("DataSection", "dataset"),
             "accountant": ("PrivacySection", "accountant")}[kind]
    assert name in json.loads(schema.stdout)["$defs"][where[0]]["properties"][where[1]]["enum"]


def test_testbed_new_refuses_a_bad_name_and_a_folder_in_use_in_one_line(tmp_path):
    from testbed.cli import main

    assert main(["new", "algorithm", "Not-A-Name", "--dir", str(tmp_path / "a")]) == 2
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "keep.txt").write_text("mine")
    assert main(["new", "dataset", "zz_ok_q7", "--dir", str(tmp_path / "b")]) == 2
    assert (tmp_path / "b" / "keep.txt").read_text() == "mine" and not (tmp_path / "a").exists()


@given(name=st.text(max_size=60), kind=st.sampled_from(["algorithm", "dataset", "accountant"]))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_any_typed_name_makes_a_project_or_one_line_refusal_writing_nothing(tmp_path, name, kind):
    """A name a user types (any text: paths, quotes, braces of the templates' format, control
    characters) writes a project only when it is a plain identifier; otherwise one line, and no file."""
    folder = Path(tempfile.mkdtemp(dir=tmp_path)) / "p"  # one per example: tmp_path is shared by them
    try:
        written = write_project(kind, name, folder)
    except UserError as exc:
        assert not NAME.fullmatch(name) and "\n" not in str(exc).strip()
        assert not folder.exists()
        return
    assert NAME.fullmatch(name) and written and all(f.is_relative_to(folder) for f in written)


def test_every_kind_testbed_new_writes_names_its_entry_point_group(tmp_path):
    for kind, group in (("algorithm", GROUPS["algorithm"]), ("dataset", GROUPS["data set"]),
                        ("accountant", GROUPS["accountant"])):
        written = write_project(kind, "zz_x_q7", tmp_path / kind)
        pyproject = next(p for p in written if p.name == "pyproject.toml").read_text()
        assert f'[project.entry-points."{group}"]\nzz_x_q7 = "testbed_zz_x_q7"' in pyproject


# ------------------------------------------------------------------------------- broken plugins

#: The schema's choices as a fresh interpreter sees them (every registry asked).
SCHEMA_RUN = ["-m", "testbed", "schema"]


@pytest.mark.parametrize("module, group, words", [
    ("raise RuntimeError('half written')\n", GROUPS["algorithm"],
     "failed to import: RuntimeError: half written"),
    ("REGISTRATION = None\n", GROUPS["data set"], "module zz_broken_q7 registers no data set"),
    ("from testbed.privacy.accountants import registry\n"
     "REGISTRATION = registry.Registration('rdp', 0, lambda pairs: None, lambda items, delta: 1.0)\n",
     GROUPS["accountant"], "the accountant name 'rdp' is taken by module testbed.privacy.accountants.rdp"),
    ("from testbed.algorithms.aggregations.registry import Rule\n"
     "REGISTRATION = Rule('mean', lambda u, w, r, p: u[0])\n",
     GROUPS["aggregation rule"], "the aggregation rule name 'mean' is taken by module testbed.algorithms.aggregations.mean"),
    ("from nodes.meters.model import ModelMeter\nfrom nodes.meters.registry import Registration\n"
     "REGISTRATION = Registration('zz-meter-q7', lambda o: ModelMeter(o.profile), measures_host=False, fallback=True)\n",
     GROUPS["meter"], "meter 'zz-meter-q7' claims to be the fallback, which 'model' is"),  # (testbed node --help)
    ("from testbed.devices.profiles import DeviceProfile\n"
     "REGISTRATION = DeviceProfile('zz-board-q7', 'x', -1.0, 1.0, 2.0, 1e7, 1e7, 0.5, 0.4, ('made up',))\n",
     GROUPS["board profile"], "profile 'zz-board-q7': compute_time_factor out of range"),
])
def test_a_broken_or_clashing_plugin_is_one_line_naming_its_distribution(module, group, words, tmp_path):
    project = _project(tmp_path / "p", "zz-broken-q7", {"zz_broken_q7": module}, {group: {"zz_entry_q7": "zz_broken_q7"}})
    env = _install([project], tmp_path / "site")
    # the meters are the node's choices (its --meter), not the experiment file's
    done = _run(["-m", "testbed", "node", "--help"] if group == GROUPS["meter"] else SCHEMA_RUN, env, tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(f"testbed: distribution 'zz-broken-q7' entry point 'zz_entry_q7' (group {group}): ")
    assert words in line


def test_two_plugins_taking_one_name_are_refused_naming_both(tmp_path):
    rule = "from testbed.topology.registry import Kind\nfrom testbed.topology.kinds import ring\n" \
           "REGISTRATION = Kind('zz_twice_q7', lambda t, b, rng: ring(t.num_nodes))\n"
    projects = [_project(tmp_path / n, f"zz-{n}-q7", {f"zz_{n}_q7": rule}, {GROUPS["topology kind"]: {n: f"zz_{n}_q7"}})
                for n in ("one", "two")]
    env = _install(projects, tmp_path / "site")
    done = _run(SCHEMA_RUN, env, tmp_path)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert done.stderr.strip() == (
        f"testbed: distribution 'zz-two-q7' entry point 'two' (group {GROUPS['topology kind']}): the topology kind name "
        f"'zz_twice_q7' is taken by distribution 'zz-one-q7' entry point 'one' (group {GROUPS['topology kind']})")


# ------------------------------------------------------------------------------- every axis at once

#: One item on every axis, each a throwaway name no user would pick, in one distribution.
EVERY_AXIS = {
    "zz_alg_q7": None,  # testbed new's algorithm (below)
    "zz_data_q7": None,  # testbed new's data set
    "zz_acc_q7": None,  # testbed new's accountant
    "zz_board_q7": '''
        from testbed.devices.profiles import DeviceProfile, McuProfile
        REGISTRATION = (
            DeviceProfile("zz-board-q7", "a throwaway board", 3.0, 1.0, 2.0, 1e7, 1e7, 0.5, 0.4, ("made up",)),
            McuProfile("zz-mcu-q7", "a throwaway microcontroller", 1e8, 2.0, 0.1, 0.01, 1e6, 1e6, 0.05, 0.04,
                       262144, 1048576, ("made up",)),
        )
    ''',
    "zz_meter_q7": '''
        from nodes.meters.model import ModelMeter
        from nodes.meters.registry import Registration
        REGISTRATION = Registration("zz-meter-q7", lambda options: ModelMeter(options.profile), measures_host=False,
                                    listed_at=50)
    ''',
    "zz_broker_q7": '''
        from testbed.mqtt.brokers.registry import Registration
        def _make(options):
            raise RuntimeError("a throwaway broker is never started")
        REGISTRATION = Registration("zz-broker-q7", "a throwaway", preference=99,
                                    missing=lambda: "a throwaway broker runs nowhere", make=_make)
    ''',
    "zz_star_q7": '''
        import numpy as np
        from testbed.topology.registry import Kind
        from testbed.topology.graph import Graph
        def _star(topology, block, rng):
            n = topology.num_nodes
            return Graph.from_edges(n, np.column_stack([np.zeros(n - 1, dtype=np.int64), np.arange(1, n)]))
        REGISTRATION = Kind("zz_star_q7", _star, expected_entries=lambda t: 2.0 * (t.num_nodes - 1))
    ''',
    "zz_rule_q7": '''
        from testbed.algorithms.aggregations.registry import Rule
        REGISTRATION = Rule("zz_rule_q7", lambda updates, weights, reference, params: updates.mean(axis=0))
    ''',
}
GROUP_OF = {"zz_alg_q7": "algorithm", "zz_data_q7": "data set", "zz_acc_q7": "accountant",
            "zz_board_q7": "board profile", "zz_meter_q7": "meter", "zz_broker_q7": "managed broker",
            "zz_star_q7": "topology kind", "zz_rule_q7": "aggregation rule"}
#: The tests of the registries, the schema and the CLI's choices, run with the plugin installed.
REGISTRY_TESTS = ["tests/test_registries.py", "tests/test_registry_accountants.py", "tests/test_registry_boards.py",
                  "tests/test_registry_brokers.py", "tests/test_registry_data.py", "tests/test_profiles.py",
                  "tests/test_meters.py", "tests/test_cli.py",
                  "tests/test_robust_aggregation.py", "tests/test_topology.py", "tests/test_topology_cli.py",
                  "tests/test_privacy_dwfl.py", "tests/test_config_sections.py", "tests/test_config_toml.py",
                  "tests/test_accountants.py", "tests/test_algorithm_base.py", "tests/test_algorithm_hooks.py",
                  "tests/test_honest_summaries.py", "tests/test_no_algorithm_names.py",
                  "tests/test_privacy_statements.py",
                  "tests/test_algorithm_contract.py::test_every_registered_algorithm_has_an_experiment_here"]


@pytest.fixture(scope="module")
def every_axis(tmp_path_factory) -> dict[str, str]:
    """One distribution adding an item on every axis, installed; the environment that sees it."""
    tmp = tmp_path_factory.mktemp("every_axis")
    from testbed.cli import new_templates as t

    sources = dict(EVERY_AXIS)
    for module, (template, name) in {"zz_alg_q7": (t.ALGORITHM, "zz_alg_q7"), "zz_data_q7": (t.DATASET, "zz_data_q7"),
                                     "zz_acc_q7": (t.ACCOUNTANT, "zz_acc_q7")}.items():
        sources[module] = template.format(name=name, cli=name.replace("_", "-"))
    eps: dict[str, dict[str, str]] = {}
    for module, axis in GROUP_OF.items():
        eps.setdefault(GROUPS[axis], {})[module] = module
    assert set(eps) == set(GROUPS.values())  # every axis
    project = _project(tmp / "every", "zz-every-axis-q7", sources, eps)
    return _install([project], tmp / "site")


def test_the_plugin_adds_one_item_on_every_axis(every_axis, tmp_path):
    probe = """
import json
from nodes.meters import registry as meters
from testbed.algorithms import registry as algorithms
from testbed.algorithms.aggregations import registry as rules
from testbed.data import registry as datasets
from testbed.devices import profiles
from testbed.mqtt.brokers import registry as brokers
from testbed.privacy.accountants import registry as accountants
from testbed.topology import registry as topologies
print(json.dumps([algorithms.names(), datasets.names(), accountants.names(), list(profiles.profile_names()),
                  list(profiles.mcu_profile_names()), list(meters.names()), brokers.names(), topologies.names(),
                  rules.names()]))
"""
    done = _run(["-c", probe], every_axis, tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout)
    for names, added in zip(found, ["zz_alg_q7", "zz_data_q7", "zz_acc_q7", "zz-board-q7", "zz-mcu-q7", "zz-meter-q7",
                                    "zz-broker-q7", "zz_star_q7", "zz_rule_q7"]):
        assert added in names, (added, names)


@pytest.mark.slow
def test_the_registry_schema_and_cli_tests_pass_with_an_item_on_every_axis(every_axis, tmp_path):
    """Adding one item on every axis fails no test of the registries, the schema or the CLI's
    choices: they assert the known entries are there, not that nothing else is."""
    done = _run(["-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-m", "not slow", *REGISTRY_TESTS],
                every_axis, REPO, timeout=1800)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_a_plugin_kind_is_a_choice_of_testbed_privacy_dwfl_and_draws_its_graph(every_axis, tmp_path):
    """`testbed privacy dwfl --topology zz_star_q7`: the privacy CLI reads the topology registry."""
    args = ["-m", "testbed", "privacy", "dwfl", "--gains", "1,1,1,1", "--power-w", "1", "--sigma2", "0.1",
            "--noise-var", "0.01", "--lr", "0.1", "--gmax", "1", "--delta", "1e-5", "--json"]
    star = _run([*args, "--topology", "zz_star_q7"], every_axis, tmp_path)
    ring = _run([*args, "--topology", "ring"], every_axis, tmp_path)
    assert star.returncode == ring.returncode == 0, star.stderr + ring.stderr
    assert json.loads(star.stdout) != json.loads(ring.stdout)  # the hub hears three, a leaf one
