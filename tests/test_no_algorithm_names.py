"""Nothing outside ``testbed/algorithms/`` names an algorithm (docs/design.md, "Extension axes"): the
command line, the live view, the orchestration, the transports, the node side and the firmware
bridge reach every algorithm through its registration (testbed.algorithms.registry) and the
contract, so adding an algorithm is adding a module.

Checked on the sources' syntax trees, with the registry's names as the list: an import of a module
of testbed.algorithms other than the contract and the registry, a string equal to an algorithm's
name (``"dwfl"``, or its command-line spelling ``"dp-pasgd"``), an attribute named after one
(``config.dwfl``). Comments and docstrings that mention an algorithm as an example are prose, and
prose is free to.
"""

from __future__ import annotations

import ast
import importlib.util
import pkgutil
from pathlib import Path

import pytest
from hypothesis import given, strategies as st

import testbed.algorithms
from testbed.algorithms import registry
from testbed.util.registrations import plugin_of

REPO = Path(__file__).resolve().parents[1]
TESTBED = REPO / "testbed"
ALGORITHMS = TESTBED / "algorithms"

#: What is scanned, in one place. Packages and modules of testbed/ are found by name wherever they
#: live in testbed/ (outside testbed/algorithms/), so moving them into a layer subpackage keeps
#: them scanned; each must be found exactly once. Top-level packages are found by importlib.
TESTBED_PACKAGES = ("cli", "watch", "mqtt")
TESTBED_MODULES = ("runner", "coordinator", "channel_emulator", "sim_nodes")
TOP_PACKAGES = ("nodes", "firmware_bridge")
#: The modules of testbed.algorithms that anything may import: the contract and the registry.
OPEN_MODULES = frozenset({"contract", "registry"})
#: Every module of testbed.algorithms.
ALGORITHM_MODULES = frozenset(info.name for info in pkgutil.iter_modules(testbed.algorithms.__path__))


def _one(found: list[Path], what: str) -> Path:
    assert len(found) == 1, f"{what}: expected one, found {[str(p.relative_to(REPO)) for p in found]}"
    return found[0]


def _outside_algorithms(paths) -> list[Path]:
    return sorted(p for p in paths if ALGORITHMS not in p.parents and "__pycache__" not in p.parts)


def scanned_files() -> list[Path]:
    """The Python files that must name no algorithm."""
    files: list[Path] = []
    for name in TESTBED_PACKAGES:
        init = _one(_outside_algorithms(TESTBED.rglob(f"{name}/__init__.py")), f"package {name} in testbed/")
        files += sorted(init.parent.rglob("*.py"))
    for name in TESTBED_MODULES:
        files.append(_one(_outside_algorithms(TESTBED.rglob(f"{name}.py")), f"module {name} in testbed/"))
    for name in TOP_PACKAGES:
        spec = importlib.util.find_spec(name)
        assert spec is not None and spec.submodule_search_locations, f"package {name} not found"
        for location in spec.submodule_search_locations:
            files += sorted(Path(location).rglob("*.py"))
    return [f for f in files if "__pycache__" not in f.parts]


def algorithm_words() -> frozenset[str]:
    """Every registered algorithm's name and its command-line spelling (``dp-pasgd``)."""
    return frozenset(w for name in registry.names() for w in (name, name.replace("_", "-")))


def _named_module(module: str) -> str | None:
    """The closed module of testbed.algorithms that the dotted name ``module`` is or lies in."""
    prefix = "testbed.algorithms."
    if not module.startswith(prefix):
        return None
    first = module[len(prefix):].split(".")[0]
    return None if first in OPEN_MODULES else first


def offences(source: str, words: frozenset[str]) -> list[str]:
    """Where ``source`` names an algorithm: "line N: why", one per occurrence."""
    found = []
    for node in ast.walk(ast.parse(source)):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Import):
            found += [f"line {line}: imports {a.name}" for a in node.names if _named_module(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if _named_module(node.module):
                found.append(f"line {line}: imports from {node.module}")
            elif node.module == "testbed.algorithms":
                found += [f"line {line}: imports testbed.algorithms.{a.name}" for a in node.names
                          if a.name in ALGORITHM_MODULES - OPEN_MODULES]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in words:
            found.append(f"line {line}: the string {node.value!r}")
        elif isinstance(node, ast.Attribute) and node.attr in words:
            found.append(f"line {line}: the attribute .{node.attr}")
    return found


def test_the_scanned_places_are_found():
    files = scanned_files()
    names = {f.relative_to(REPO).as_posix() for f in files}
    # One file of each kind, so a move that loses a place fails here rather than scanning nothing.
    for expected in ("cli/__init__.py", "watch/feed.py", "mqtt/client.py", "runner.py", "coordinator.py",
                     "channel_emulator.py", "sim_nodes.py"):
        assert any(n.endswith(expected) and n.startswith("testbed/") for n in names), expected
    assert "nodes/agent.py" in names and "firmware_bridge/agent.py" in names
    assert not any(f.is_relative_to(ALGORITHMS) for f in files)


def test_the_registry_has_the_algorithms_of_the_papers():
    assert {"dp_pasgd", "dwfl", "acfl", "padpfl", "fedavg"} <= set(registry.names())


def test_nothing_outside_the_algorithms_names_one():
    words = algorithm_words()
    found = [f"{path.relative_to(REPO)} {why}" for path in scanned_files()
             for why in offences(path.read_text(), words)]
    assert not found, "\n".join(found)


FORMS = {
    "import": "import testbed.algorithms.{module}\n",
    "import_from": "from testbed.algorithms.{module} import something\n",
    "import_module": "from testbed.algorithms import {module}\n",
    "lazy_import": "def f():\n    from testbed.algorithms.{module} import x\n    return x\n",
    "string": "if config.run.algorithm == {name!r}:\n    pass\n",
    "cli_string": "psub.add_parser({cli!r})\n",
    "attribute": "x = config.{name}.lr\n",
    "getattr_string": "getattr(config, {name!r})\n",
}


@given(form=st.sampled_from(sorted(FORMS)),
       name=st.sampled_from([n for n in registry.names() if not plugin_of("algorithm", n)]))  # modules of this tree
def test_each_way_of_naming_an_algorithm_is_found(form, name):
    module = next(m for m in sorted(ALGORITHM_MODULES - OPEN_MODULES) if m.startswith(name.split("_")[0])) \
        if form in ("import", "import_from", "import_module", "lazy_import") else name
    source = FORMS[form].format(module=module, name=name, cli=name.replace("_", "-"))
    assert len(offences(source, algorithm_words())) == 1, source


@pytest.mark.parametrize("source", [
    "from testbed.algorithms import registry\nregistry.get(config.run.algorithm)\n",
    "from testbed.algorithms.contract import RoundContext\n",
    "import testbed.algorithms.registry\n",
    "from testbed.algorithms import Algorithm, RoundContext\n",
    '"""The DWFL channel, e.g. `testbed privacy dwfl`."""\n',  # prose
    "x = 'dwfl channel'\n# config.dwfl\n",
    "x = config.run.algorithm\n",
])
def test_the_contract_the_registry_and_prose_are_free(source):
    assert offences(source, algorithm_words()) == []


def test_the_live_view_page_names_no_algorithm():
    """The page's script and markup reach the channel and the graph through what the feed sends
    (the hooks' data), never by comparing the run's algorithm with a name."""
    static = _one(_outside_algorithms(TESTBED.rglob("watch/static")), "folder watch/static in testbed/")
    names = [n for name in registry.names() for n in (name, name.replace("_", "-"))]
    for page in sorted(p for p in static.rglob("*") if p.suffix in (".js", ".html")):
        text = page.read_text(encoding="utf-8")
        quoted = [n for n in names if f'"{n}"' in text or f"'{n}'" in text]
        assert not quoted, f"{page.relative_to(REPO)} names {quoted}"
