"""The Python API's documentation runs: docs/api.md's examples (doctest) and
examples/quickstart.ipynb (executed by nbclient on an IPython kernel), each in a folder of its own
that sees the repository's experiments/."""

from __future__ import annotations

import doctest
import io
import os
from pathlib import Path

import pytest

from conftest import REPO

NOTEBOOK = REPO / "examples" / "quickstart.ipynb"
#: The notebook's promise: the quick start, a 2×2 sweep and a comparison table in under 15 lines.
MAX_NOTEBOOK_LINES = 14


def _link_experiments(folder: Path) -> None:
    """A link ``folder``/experiments to the repository's (the examples' paths start there)."""
    (folder / "experiments").symlink_to(REPO / "experiments")


def test_the_examples_of_docs_api_md_run(tmp_path, monkeypatch):
    _link_experiments(tmp_path)  # the docs' paths are from the repository's root
    monkeypatch.chdir(tmp_path)
    text = (REPO / "docs" / "api.md").read_text()
    test = doctest.DocTestParser().get_doctest(text, {}, "docs/api.md", str(REPO / "docs" / "api.md"), 0)
    out = io.StringIO()
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    result = runner.run(test, out=out.write)
    assert result.failed == 0, out.getvalue()
    assert result.attempted >= 20  # the examples were found (a fence without its blank line hides them)


def _code_lines(notebook) -> list[str]:
    return [line for cell in notebook.cells if cell.cell_type == "code" for line in cell.source.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


@pytest.mark.slow  # an IPython kernel, the quick start and a sweep of 12 runs: about 20 s on 2 cores
def test_the_quickstart_notebook_runs_and_is_short(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    assert len(_code_lines(notebook)) <= MAX_NOTEBOOK_LINES, _code_lines(notebook)
    assert not any(cell.get("outputs") for cell in notebook.cells if cell.cell_type == "code"), \
        "commit the notebook without outputs"
    _link_experiments(tmp_path)  # the notebook's are from examples/: ../experiments
    work = tmp_path / "examples"
    work.mkdir()
    # The kernel imports this checkout's testbed, whatever the venv's editable install points at.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    client = nbclient.NotebookClient(notebook, timeout=120, kernel_name="python3",
                                     resources={"metadata": {"path": str(work)}})
    client.execute(env=env)
    outputs = {i: "".join(o.get("text", "") or o.get("data", {}).get("text/plain", "") for o in cell.outputs)
               for i, cell in enumerate(notebook.cells) if cell.cell_type == "code"}
    last = outputs[max(outputs)]
    assert "dp_pasgd.tau" in last and "dp_pasgd.epsilon" in last, last  # the comparison table
    assert (work / "runs" / "quickstart" / "summary.json").exists()
    assert len(list((work / "runs" / "sweep").glob("*/summary.json"))) == 12
