"""tools/move_modules.py moves a module and rewrites every reference to it, and a second run (after
merging a branch written against the old layout) changes only what is still old."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

from conftest import REPO

_spec = importlib.util.spec_from_file_location("move_modules", REPO / "tools" / "move_modules.py")
move_modules = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(move_modules)

USER = '''import pkg.low
from pkg import low, other
from pkg.low import f as g


def lazy():
    from pkg import low

    return low.f()


SCRIPT = """
from pkg import low, other
"""
'''


def _repo(tmp_path: Path) -> Path:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "low.py").write_text("def f():\n    return 1\n")
    (tmp_path / "pkg" / "other.py").write_text("")
    (tmp_path / "pkg" / "user.py").write_text(USER)
    (tmp_path / "notes.md").write_text("See `pkg.low.f` in pkg/low.py; pkg.lower is another.\n")
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run(["git", "add", "-A"], cwd=tmp_path, check=True)
    return tmp_path


def test_a_move_rewrites_imports_strings_and_prose_and_a_second_run_changes_nothing(tmp_path):
    root = _repo(tmp_path)
    (root / "pkg" / "base").mkdir()
    (root / "pkg" / "base" / "__init__.py").write_text("")
    assert move_modules.main(["pkg.low=pkg.base.low"], root) == 0
    assert not (root / "pkg" / "low.py").exists() and (root / "pkg" / "base" / "low.py").exists()
    user = (root / "pkg" / "user.py").read_text()
    assert user == USER.replace("import pkg.low\n", "import pkg.base.low\n") \
        .replace("from pkg import low, other\nfrom pkg.low", "from pkg.base import low\nfrom pkg import other\nfrom pkg.base.low") \
        .replace("    from pkg import low\n", "    from pkg.base import low\n") \
        .replace('"""\nfrom pkg import low, other\n"""', '"""\nfrom pkg.base import low\nfrom pkg import other\n"""')
    compile(user, "user.py", "exec")
    assert (root / "notes.md").read_text() == "See `pkg.base.low.f` in pkg/base/low.py; pkg.lower is another.\n"
    before = {p: p.read_text() for p in root.rglob("*") if p.is_file() and ".git" not in p.parts}
    move_modules.main(["pkg.low=pkg.base.low"], root)
    assert {p: p.read_text() for p in before} == before
