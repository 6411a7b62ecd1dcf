"""Move modules to other folders and rewrite every reference to them, so a move is one command.

    python tools/move_modules.py testbed.rng=testbed.streams.rng testbed.wire=testbed.mqtt.wire
    python tools/move_modules.py            # the moves of the layer reorganisation: LAYER_MOVES

For each ``OLD=NEW`` pair (dotted module names): ``git mv`` the file when it is still at OLD's path
(a missing folder's ``__init__.py`` is not written: give the new folder its docstring yourself),
then in every tracked text file rewrite

- ``from PARENT import LEAF`` (and lists mixing moved and unmoved names) into imports from the new
  parents, keeping each name and its ``as`` alias, at the statement's indentation (in code, and
  one-line ones in strings, doctests and the docs);
- the dotted name ``OLD`` (imports, ``mock.patch`` targets, docstrings, the docs' prose) into NEW;
- the path ``old/path.py`` into ``new/path.py``.

Run it again after merging a branch written against the old layout: what is already moved is left
as it is (a dotted name is rewritten only where it is not already the new one). This file itself is
left alone, so its table below keeps the old names, and so are the generated REPORT*.md of
experiments/: rewrite them with their scripts' ``--report-only`` (tests/test_reproductions.py).
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: The top-level modules of testbed/ (and two of nodes/) put into the folders of their layers
#: (docs/design.md, "Layers"): old name → new name.
LAYER_MOVES = {
    "testbed.rng": "testbed.streams.rng",
    "testbed.counter_rng": "testbed.streams.counter_rng",
    "testbed.node_secret": "testbed.streams.node_secret",
    "testbed.limits": "testbed.checked.limits",
    "testbed.sections": "testbed.checked.sections",
    "testbed.arguments": "testbed.checked.arguments",
    "testbed.inputs": "testbed.checked.inputs",
    "testbed.wire": "testbed.mqtt.wire",
    "testbed.models": "testbed.learning.models",
    "testbed.torch_models": "testbed.learning.torch_models",
    "testbed.cost": "testbed.planning.cost",
    "testbed.client_sampling": "testbed.rounds.client_sampling",
    "testbed.stragglers": "testbed.rounds.stragglers",
    "testbed.protocol": "testbed.rounds.protocol",
    "testbed.config": "testbed.assembly.config",
    "testbed.experiment": "testbed.assembly.experiment",
    "testbed.assemble": "testbed.assembly.assemble",
    "testbed.resources": "testbed.assembly.resources",
    "testbed.evaluation": "testbed.assembly.evaluation",
    "testbed.budgets": "testbed.accounting.budgets",
    "testbed.ledger.book": "testbed.accounting.book",
    "nodes.clock": "nodes.meters.clock",
    "nodes.emulation": "nodes.meters.emulation",
}
TEXT_SUFFIXES = {".py", ".md", ".toml", ".txt", ".cfg", ".yml", ".yaml", ".ini", ".c", ".h", ".sh", ""}


def _path(module: str) -> Path:
    return Path(*module.split(".")).with_suffix(".py")


def _rewrite_from_imports(text: str, moves: dict[str, str]) -> str:
    """``from testbed import rng, config`` → one import per new parent, names and aliases kept."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return text
    lines = text.splitlines(keepends=True)
    edits = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module):
            continue
        if not any(f"{node.module}.{a.name}" in moves for a in node.names):
            continue
        groups: dict[str, list[str]] = {}
        for a in node.names:
            new = moves.get(f"{node.module}.{a.name}")
            parent, leaf = new.rsplit(".", 1) if new else (node.module, a.name)
            alias = a.asname or (a.name if leaf != a.name else None)
            groups.setdefault(parent, []).append(leaf + (f" as {alias}" if alias else ""))
        indent = lines[node.lineno - 1][:node.col_offset]
        new_lines = [f"{indent if i else ''}from {parent} import {', '.join(names)}\n"
                     for i, (parent, names) in enumerate(groups.items())]
        edits.append((node.lineno, node.end_lineno, node.col_offset, new_lines))
    for start, end, col, new_lines in sorted(edits, reverse=True):
        head = lines[start - 1][:col]
        lines[start - 1:end] = [head + new_lines[0]] + new_lines[1:]
    return "".join(lines)


def _rewrite_from_lines(text: str, moves: dict[str, str]) -> str:
    """The same for one-line imports the syntax tree does not see: in strings and doctests."""
    parents = sorted({old.rsplit(".", 1)[0] for old in moves}, key=len, reverse=True)
    line = re.compile(r"^(?P<lead>[ \t]*(?:>>> |\.\.\. )?)from (?P<parent>" + "|".join(map(re.escape, parents))
                      + r") import (?P<names>[\w ,]+?)[ \t]*$", re.M)

    def sub(m: re.Match) -> str:
        names = [n.strip() for n in m.group("names").split(",")]
        if not any(f"{m.group('parent')}.{n.split(' as ')[0]}" in moves for n in names):
            return m.group(0)
        tree = ast.parse(f"from {m.group('parent')} import {', '.join(names)}")
        out = _rewrite_from_imports(ast.unparse(tree) + "\n", moves).splitlines()
        return "\n".join(m.group("lead") + one for one in out)

    return line.sub(sub, text)


def _rewrite_names(text: str, moves: dict[str, str]) -> str:
    names = sorted(moves, key=len, reverse=True)
    dotted = re.compile(r"(?<![\w.])(" + "|".join(map(re.escape, names)) + r")(?!\w)")

    def dotted_sub(m: re.Match) -> str:
        old, new = m.group(1), moves[m.group(1)]
        # already moved: the text goes on with the rest of the new name
        rest = new[len(old):] if new.startswith(old) else None
        if rest and m.string.startswith(rest, m.end()):
            return old
        return new

    text = dotted.sub(dotted_sub, text)
    paths = {_path(o).as_posix(): _path(n).as_posix() for o, n in moves.items()}
    slashed = re.compile(r"(?<![\w/.])(" + "|".join(map(re.escape, sorted(paths, key=len, reverse=True))) + r")")
    return slashed.sub(lambda m: paths[m.group(1)], text)


def main(argv: list[str], root: Path = REPO) -> int:
    """Move and rewrite in the git checkout at ``root``; ``argv``: the ``OLD=NEW`` pairs."""
    moves = dict(pair.split("=", 1) for pair in argv) if argv else LAYER_MOVES
    for old, new in moves.items():
        src, dst = root / _path(old), root / _path(new)
        if src.exists() and not dst.exists():
            dst.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run(["git", "mv", str(src), str(dst)], cwd=root, check=True)
    files = subprocess.run(["git", "ls-files"], cwd=root, check=True, capture_output=True, text=True).stdout.split()
    for name in files:
        path = root / name
        skipped = path == Path(__file__).resolve() or path.name.startswith("REPORT")
        if skipped or path.suffix not in TEXT_SUFFIXES or not path.is_file() or path.is_symlink():
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        new = _rewrite_from_imports(text, moves) if path.suffix == ".py" else text
        new = _rewrite_from_lines(new, moves)
        new = _rewrite_names(new, moves)
        if new != text:
            path.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
