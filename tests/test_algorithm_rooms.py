"""Small rooms in testbed.algorithms (issue 42, part 4): no module over 650 lines, FedProx in at most
15 lines of code on the base's hooks, and the algorithm modules mostly math.

How "math" is measured (:func:`measure`): a module's *code lines* are its physical lines that are
not blank, comments, docstrings or imports; a code line is *math* when it lies inside a function
whose body computes on numbers (an arithmetic operator, augmented assignment or unary minus of a
variable, or a call into numpy, math or the privacy math modules) and *plumbing* otherwise
(config sections, registrations, constructors storing settings, specs, dispatch, reports that only
name settings). ``--strict`` counts only the statements that compute themselves.

    python tests/test_algorithm_rooms.py [REV]     # the table, for the worktree or a git revision
"""

from __future__ import annotations

import ast
import io
import subprocess
import sys
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "testbed" / "algorithms"
MOST_LINES = 650
ARITHMETIC = (ast.Add, ast.Sub, ast.Mult, ast.Div, ast.FloorDiv, ast.Mod, ast.Pow, ast.MatMult)
NUMERIC_MODULES = {"np", "numpy", "math", "dp", "zcdp", "scipy"}
#: The modules holding an algorithm's class (its node and server steps), by the algorithm.
ALGORITHM_MODULES = {"acfl": "acfl.py", "dp_pasgd": "dp_pasgd.py", "dwfl": "dwfl.py", "fedavg": "fedavg.py",
                     "fedprox": "fedprox.py", "padpfl": "padpfl.py", "dpsgd": "graph_exchange.py",
                     "gossip": "graph_exchange.py"}
#: Below half, and why: FedAvg's math is local SGD (the base's) and a weighted mean (aggregate's),
#: so its constructor and builder weigh; FedProx is one formula and its registration.
BELOW_HALF = {"fedavg.py", "fedprox.py"}


def computes(node: ast.AST) -> bool:
    for n in ast.walk(node):
        if isinstance(n, (ast.BinOp, ast.AugAssign)) and isinstance(n.op, ARITHMETIC):
            return True
        if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.USub) and not isinstance(n.operand, ast.Constant):
            return True
        if isinstance(n, ast.Call):
            f = n.func
            while isinstance(f, ast.Attribute):
                f = f.value
            if isinstance(f, ast.Name) and f.id in NUMERIC_MODULES:
                return True
    return False


def measure(source: str, strict: bool = False) -> tuple[int, int]:
    """(code lines, math lines) of a module's ``source`` (module docstring above)."""
    tree = ast.parse(source)
    excluded: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            excluded.update(range(node.lineno, node.end_lineno + 1))
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            for stmt in node.body:  # docstrings, and the attribute docstrings under a field
                if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) \
                        and isinstance(stmt.value.value, str):
                    excluded.update(range(stmt.lineno, stmt.end_lineno + 1))
    code: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT,
                            tokenize.ENDMARKER):
            code.update(range(tok.start[0], tok.end[0] + 1))
    code -= excluded
    math: set[int] = set()
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        if strict:
            for stmt in ast.walk(node):
                if isinstance(stmt, ast.stmt) and not hasattr(stmt, "body") and computes(stmt):
                    math.update(range(stmt.lineno, stmt.end_lineno + 1))
        elif any(computes(stmt) for stmt in node.body):
            math.update(range(node.lineno, node.end_lineno + 1))
    return len(code), len(code & math)


def modules() -> list[Path]:
    """Every module of testbed/algorithms/, its sub-folders' too (tests/test_house.py leaves them here)."""
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


@pytest.mark.parametrize("path", modules(), ids=lambda p: p.relative_to(PACKAGE).as_posix())
def test_no_module_of_the_algorithms_is_over_650_lines(path):
    assert len(path.read_text().splitlines()) <= MOST_LINES


def test_fedprox_is_at_most_15_lines_of_code_on_the_hooks():
    code, _ = measure((PACKAGE / "fedprox.py").read_text())
    imports = sum(1 for n in ast.parse((PACKAGE / "fedprox.py").read_text()).body
                  if isinstance(n, (ast.Import, ast.ImportFrom)))
    assert code + imports <= 15


@pytest.mark.parametrize("name", sorted(set(ALGORITHM_MODULES.values()) - BELOW_HALF))
def test_an_algorithm_module_is_at_least_half_math(name):
    code, math = measure((PACKAGE / name).read_text())
    assert math >= code / 2, f"{name}: {math} of {code} code lines are math"


def test_the_measure_tells_math_from_plumbing():
    source = ('import numpy as np\n\nclass S:\n    """Doc."""\n    rate: float = 0.1\n\n'
              'def step(w, g, lr):\n    """w − η g."""\n    out = w.copy()\n    out -= lr * g\n    return out\n\n'
              'def settings(a):\n    return {"rate": a.rate}\n\nREGISTRATION = dict(name="x", build=step)\n')
    # code: the class 2 lines, step 4 (its docstring and the import not counted), settings 2, the registration 1
    assert measure(source) == (9, 4)
    assert measure(source, strict=True) == (9, 1)  # only the line that computes


if __name__ == "__main__":
    rev = next((a for a in sys.argv[1:] if not a.startswith("-")), None)
    strict = "--strict" in sys.argv
    names = sorted({*ALGORITHM_MODULES.values(), *(p.relative_to(PACKAGE).as_posix() for p in modules())}
                   if rev is None else set(ALGORITHM_MODULES.values()))
    print(f"{'module':<24} {'lines':>5} {'code':>5} {'math':>5} {'share':>6}")
    for name in names:
        rel = f"testbed/algorithms/{name}"
        if rev is None:
            source = (ROOT / rel).read_text()
        else:
            found = subprocess.run(["git", "-C", str(ROOT), "show", f"{rev}:{rel}"], capture_output=True, text=True)
            if found.returncode:
                print(f"{name:<24} {'-':>5}")
                continue
            source = found.stdout
        code, math = measure(source, strict)
        print(f"{name:<24} {len(source.splitlines()):5d} {code:5d} {math:5d} {100 * math / max(code, 1):5.0f}%")
