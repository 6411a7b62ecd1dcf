"""The layers of docs/design.md's table, checked on the sources: no module imports a layer above its
own, no two folders import each other (directly or round a longer circle), and no two modules do.

The table is read from docs/design.md (its ``| layer | folder/module prefix | what |`` table), so the
document and the test cannot drift apart: a row there is the only place that says where a folder
sits. A module's row is the one whose prefix is the longest that holds it (``testbed/mqtt/brokers/``
before ``testbed/mqtt/``); a folder holding modules needs a row of its own, so a new folder is
placed in the document before it is used, and a new top-level module of a package is refused until
it is put into a folder (or, like ``testbed/errors.py``, given a row as a file).

Every import counts: at module level, inside a function (a lazy import is still a dependency), and
under ``if TYPE_CHECKING:`` (a type is one too).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DESIGN = REPO / "docs" / "design.md"
PACKAGES = ("channel", "testbed", "nodes", "firmware_bridge")
HEADER = ("layer", "folder/module prefix", "what")


@dataclass(frozen=True)
class Row:
    layer: int
    prefix: str  # "testbed/mqtt/" (a folder) or "testbed/errors.py" (one file)
    what: str

    def holds(self, path: str) -> bool:
        return path.startswith(self.prefix) if self.prefix.endswith("/") else path == self.prefix


def read_table(text: str) -> list[Row]:
    """The rows of the layer table in ``text``, lowest layer first. AssertionError if there is no
    such table, or a row is malformed."""
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if tuple(_cells(line)) == HEADER]
    assert len(starts) == 1, f"docs/design.md: expected one table headed | {' | '.join(HEADER)} |"
    rows = []
    for line in lines[starts[0] + 2:]:
        if not line.startswith("|"):
            break
        layer, prefix, what = _cells(line)
        match = re.fullmatch(r"`([\w./]+)`", prefix)
        assert layer.isdigit() and match and what, f"docs/design.md: a malformed row: {line}"
        rows.append(Row(int(layer), match.group(1), what))
    return rows


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def row_of(path: str, rows: list[Row]) -> Row:
    held = [r for r in rows if r.holds(path)]
    assert held, f"{path} is in no layer of docs/design.md's table"
    return max(held, key=lambda r: len(r.prefix))


@pytest.fixture(scope="module")
def rows() -> list[Row]:
    return read_table(DESIGN.read_text())


def _sources() -> dict[str, str]:
    """Module name → its path from the repository's root."""
    found = {}
    for package in PACKAGES:
        for p in sorted((REPO / package).rglob("*.py")):
            rel = p.relative_to(REPO)
            found[".".join(rel.with_suffix("").parts).removesuffix(".__init__")] = rel.as_posix()
    return found


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
def sources() -> dict[str, str]:
    return _sources()


@pytest.fixture(scope="module")
def graph(sources) -> dict[str, set[str]]:
    modules = set(sources)
    return {module: _imports(REPO / path, modules) & modules for module, path in sources.items()}


def test_the_table_reads_lowest_layer_first_and_names_what_exists(rows):
    assert len(rows) >= 20, "the layer table was not found whole"
    layers = [r.layer for r in rows]
    assert layers == sorted(layers), "docs/design.md: the table lists layers lowest first"
    prefixes = [r.prefix for r in rows]
    assert len(set(prefixes)) == len(prefixes), "a prefix has two rows"
    for r in rows:
        assert (REPO / r.prefix).exists(), f"docs/design.md: {r.prefix} does not exist"


def test_every_folder_is_a_layer_and_every_module_in_one(rows, sources):
    folders = {path.rsplit("/", 1)[0] + "/" for path in sources.values()}
    for folder in sorted(folders):
        modules = [p for p in sources.values() if p.rsplit("/", 1)[0] + "/" == folder]
        # a package's root may instead give each of its modules a row (testbed/errors.py, testbed/api.py)
        assert any(r.prefix == folder for r in rows) or all(any(r.prefix == p for r in rows) for p in modules), \
            f"{folder} holds modules but has no row in docs/design.md's layer table"
    for path in sources.values():
        row_of(path, rows)


def upward_imports(graph: dict[str, set[str]], unit: dict[str, Row]) -> list[str]:
    found = []
    for module, imported in sorted(graph.items()):
        mine = unit[module]
        for target in sorted(imported):
            theirs = unit[target]
            if theirs.layer > mine.layer:
                found.append(f"{module} ({mine.prefix}, layer {mine.layer}) imports {target} "
                             f"({theirs.prefix}, layer {theirs.layer})")
    return found


def folder_graph(graph: dict[str, set[str]], unit: dict[str, Row]) -> dict[str, set[str]]:
    """Row prefix → the row prefixes its modules import (its own left out)."""
    folders: dict[str, set[str]] = {r.prefix: set() for r in unit.values()}
    for module, imported in graph.items():
        folders[unit[module].prefix] |= {unit[t].prefix for t in imported} - {unit[module].prefix}
    return folders


def test_no_module_imports_upward(graph, sources, rows):
    unit = {m: row_of(p, rows) for m, p in sources.items()}
    upward = upward_imports(graph, unit)
    assert not upward, "\n".join(upward)


def test_no_import_circle_between_folders(graph, sources, rows):
    unit = {m: row_of(p, rows) for m, p in sources.items()}
    circles = _cycles(folder_graph(graph, unit))
    assert not circles, "\n".join(" <-> ".join(c) for c in circles)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm)."""
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


def test_no_import_circle_between_modules(graph):
    # A package's __init__ that only documents it is imported by whatever imports a module in it;
    # that is no dependency of the package on its importer, so packages' own inits are left out.
    plain = {m: {t for t in ts if not _is_package(t)} for m, ts in graph.items()}
    circles = _cycles(plain)
    assert not circles, "\n".join(" <-> ".join(c) for c in circles)


def _is_package(module: str) -> bool:
    return (REPO / module.replace(".", "/") / "__init__.py").exists()


def test_the_checks_can_fail():
    """A made-up table and graph: an upward import, a circle of folders and a module in no row are
    all found, and a malformed or missing table is refused."""
    rows = read_table("| layer | folder/module prefix | what |\n|---|---|---|\n"
                      "| 1 | `a/` | low |\n| 1 | `b/` | low, beside a |\n| 2 | `a/c/` | high, inside a |\n")
    assert row_of("a/c/x.py", rows).prefix == "a/c/" and row_of("a/x.py", rows).prefix == "a/"
    with pytest.raises(AssertionError, match="no layer"):
        row_of("d/x.py", rows)
    unit = {"a.x": row_of("a/x.py", rows), "b.y": row_of("b/y.py", rows), "a.c.z": row_of("a/c/z.py", rows)}
    graph = {"a.x": {"a.c.z", "b.y"}, "b.y": {"a.x"}, "a.c.z": set()}
    assert upward_imports(graph, unit) == ["a.x (a/, layer 1) imports a.c.z (a/c/, layer 2)"]
    assert _cycles(folder_graph(graph, unit)) == [["a/", "b/"]]
    with pytest.raises(AssertionError, match="malformed"):
        read_table("| layer | folder/module prefix | what |\n|---|---|---|\n| low | `a/` | x |\n")
    with pytest.raises(AssertionError, match="expected one table"):
        read_table("| layer | prefix | what |\n")
