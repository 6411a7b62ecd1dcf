"""The layers of DESIGN.md's table, checked on the sources: no module imports a layer above its own,
and no two modules import each other, directly or round a longer circle.

Every import counts: at module level, inside a function (a lazy import is still a dependency), and
under ``if TYPE_CHECKING:`` (a type is one too). The layer of a module is read from its path, so a
new module is placed by the folder it is put in; the table below is the one place that says which
folder is which layer.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

#: (module prefix, layer), most specific first: a module's layer is that of the first prefix it
#: starts with. A module may import its own layer and the layers below it.
LAYERS: tuple[tuple[str, int, str], ...] = (
    ("channel", 0, "radio physics"),
    ("testbed.errors", 0, "the testbed's error types"),
    ("testbed.util", 1, "utilities"),
    ("testbed.mqtt", 3, "transport"),
    ("testbed.reports", 6, "reports"),
    ("testbed.watch", 6, "reports: the live view"),
    ("testbed.orchestration", 7, "orchestration"),
    ("testbed.api", 8, "the Python API"),
    ("testbed.cli", 8, "the command line"),
    ("testbed.__main__", 8, "the command line"),
    ("testbed", 2, "core"),  # every other module of testbed/
    ("nodes", 4, "what runs on a board"),
    ("firmware_bridge", 5, "the microcontroller bridge"),
)
#: Modules placed by their whole name, before the prefixes: the package ``testbed`` itself (its
#: __init__), whose ``testbed.run``, ``load`` and ``sweep`` are the Python API's, imported on first use.
EXACT: dict[str, tuple[int, str]] = {"testbed": (8, "the package's face: the Python API")}
PACKAGES = ("channel", "testbed", "nodes", "firmware_bridge")


def layer_of(module: str) -> tuple[int, str]:
    if module in EXACT:
        return EXACT[module]
    for prefix, layer, name in LAYERS:
        if module == prefix or module.startswith(prefix + "."):
            return layer, name
    raise AssertionError(f"{module} is in no layer of the table")


def _module_of(path: Path) -> str:
    return ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")


def _sources() -> dict[str, Path]:
    return {_module_of(p): p for package in PACKAGES for p in sorted((REPO / package).rglob("*.py"))}


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The modules of this repository ``path`` imports (``from pkg import mod`` names the module)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for a in node.names:
                full = f"{node.module}.{a.name}"
                found.add(full if full in modules else node.module)
    return {m for m in found if m.split(".")[0] in PACKAGES}


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    sources = _sources()
    modules = set(sources)
    return {module: _imports(path, modules) & modules for module, path in sources.items()}


def test_every_module_has_a_layer(graph):
    for module in graph:
        layer_of(module)


def test_no_module_imports_upward(graph):
    upward = []
    for module, imported in sorted(graph.items()):
        mine, my_name = layer_of(module)
        for target in sorted(imported):
            theirs, their_name = layer_of(target)
            if theirs > mine:
                upward.append(f"{module} ({my_name}) imports {target} ({their_name})")
    assert not upward, "\n".join(upward)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_no_import_circle(graph):
    # A package's __init__ that only documents it is imported by whatever imports a module in it;
    # that is no dependency of the package on its importer, so packages' own inits are left out.
    plain = {m: {t for t in ts if not _is_package(t)} for m, ts in graph.items()}
    circles = _cycles(plain)
    assert not circles, "\n".join(" <-> ".join(c) for c in circles)


def _is_package(module: str) -> bool:
    return (REPO / module.replace(".", "/") / "__init__.py").exists()


def test_the_finder_sees_upward_imports_and_circles():
    """The checks above can fail: an upward import and a circle in a made-up graph are found."""
    made_up = {"testbed.assembly.config": {"testbed.orchestration.runner"}, "testbed.orchestration.runner": {"testbed.assembly.config"}}
    assert _cycles(made_up) == [["testbed.assembly.config", "testbed.orchestration.runner"]]
    assert layer_of("testbed.assembly.config")[0] < layer_of("testbed.orchestration.runner")[0]
