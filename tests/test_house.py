"""Small rooms (issue 42): no module of the repository is over MAX_LINES lines, so each can be read
as one job. A module that grows past it is split by what its parts do (see how
testbed/orchestration/coordinator.py's hosts, inbox, reply checks and outages became modules of
their own), not cut at a line number.

Counted: every Python file of the repository's code (ROOTS), tests excluded (a test module holds
the cases of one subject, however many). testbed/algorithms/ is held to the same limit, with its
own measures of how much of each algorithm module is math, by tests/test_algorithm_rooms.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MAX_LINES = 650
#: The folders of the repository that hold code (packages, scripts, tools, benchmarks, examples).
ROOTS = ("testbed", "nodes", "firmware_bridge", "channel", "tools", "benchmarks", "experiments", "examples")
#: Held to the limit by another test (tests/test_algorithm_rooms.py, with the algorithms' own measures).
ELSEWHERE = (REPO / "testbed" / "algorithms",)


def lines_of(path: Path) -> int:
    """The lines of a text file, as ``wc -l`` counts them (a last line without its newline too)."""
    return len(path.read_text(encoding="utf-8").splitlines())


def modules(roots: tuple[Path, ...], elsewhere: tuple[Path, ...] = ()) -> list[Path]:
    """Every ``.py`` file under ``roots``, but those under ``elsewhere``, and none in a hidden folder
    or a cache (a virtual environment, build output)."""
    found = []
    for root in roots:
        for path in sorted(root.rglob("*.py")):
            parts = path.relative_to(root).parts
            if any(p.startswith(".") or p in ("__pycache__", "build", "dist") for p in parts):
                continue
            if any(path.is_relative_to(e) for e in elsewhere):
                continue
            found.append(path)
    return found


def over(paths: list[Path], limit: int = MAX_LINES) -> list[str]:
    """``path: N lines`` of each of ``paths`` longer than ``limit``, longest first."""
    sizes = sorted(((lines_of(p), p) for p in paths), reverse=True)
    return [f"{p.relative_to(REPO) if p.is_relative_to(REPO) else p}: {n} lines" for n, p in sizes if n > limit]


def test_no_module_is_over_the_limit():
    found = over(modules(tuple(REPO / r for r in ROOTS), ELSEWHERE))
    assert not found, f"over {MAX_LINES} lines (split each by job):\n" + "\n".join(found)


def test_the_modules_counted_are_the_code():
    """The walk finds the modules the rooms were made of and the folders' code, and leaves out
    the tests and what another test holds."""
    names = {p.relative_to(REPO).as_posix() for p in modules(tuple(REPO / r for r in ROOTS), ELSEWHERE)}
    for expected in ("testbed/orchestration/coordinator.py", "testbed/orchestration/runner.py",
                     "testbed/mqtt/client.py", "testbed/watch/feed.py", "testbed/reports/results.py",
                     "nodes/agent.py", "firmware_bridge/agent.py", "channel/__init__.py"):
        assert expected in names, expected
    assert len(names) > 200
    assert not any(n.startswith(("tests/", "testbed/algorithms/")) for n in names)


@pytest.mark.parametrize("lines, flagged", [(MAX_LINES, False), (MAX_LINES + 1, True)])
def test_a_module_one_line_over_is_named(tmp_path, lines, flagged):
    package = tmp_path / "pkg"
    (package / ".hidden").mkdir(parents=True)
    big = package / "big.py"
    big.write_text("x = 1\n" * (lines - 1) + "x = 1")  # the last line without its newline counts
    (package / ".hidden" / "huge.py").write_text("x = 1\n" * (10 * MAX_LINES))
    assert lines_of(big) == lines
    assert over(modules((package,))) == ([f"{big}: {lines} lines"] if flagged else [])
