"""The package as the index ships it (issue 42, part 5): the distribution `dpfl-testbed` (the name
`testbed` there is another project's; the import package stays `testbed`: docs/install.md), its
version written once, and `python -m build`'s wheel and sdist carrying every file the package reads."""

from __future__ import annotations

import re
import tarfile
import tomllib
import zipfile
from email.parser import HeaderParser

import pytest

import testbed
from testbed.util.extras import DISTRIBUTION, EXTRA_OF_MODULE, install_hint
from conftest import PACKAGE_DIRS, REPO, tracked_files

#: The import name and an extra in brackets, not preceded by "dpfl-": an install hint naming the
#: other project's distribution.
OTHER_PROJECTS_NAME = re.compile(r"(?<![\w-])testbed\\?\[")  # a regex's escaped bracket too


def test_the_distribution_has_its_own_name_and_one_version():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert project["project"]["name"] == DISTRIBUTION == "dpfl-testbed"
    assert project["project"]["dynamic"] == ["version"] and "version" not in project["project"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "testbed.__version__"}
    assert re.fullmatch(r"\d+\.\d+\.\d+", testbed.__version__)
    # the extras that name the package itself name the distribution
    for extra, requirements in project["project"]["optional-dependencies"].items():
        for requirement in requirements:
            assert not OTHER_PROJECTS_NAME.match(requirement), (extra, requirement)


def test_every_install_hint_names_the_distribution():
    """What a user types to get a missing package installs this project, in the messages (every extra
    a module maps to) and in every tracked text: the bare import name with extras would fetch another's."""
    for extra in {extra for _, extra in EXTRA_OF_MODULE.values()}:
        assert install_hint(extra) == f"pip install 'dpfl-testbed[{extra}]'"
    texts = [name for name in tracked_files(".") if name.endswith((".py", ".md", ".toml", ".ipynb", ".yml", "Makefile"))]
    wrong = [f"{name}:{number}" for name in texts
             for number, line in enumerate((REPO / name).read_text(errors="replace").splitlines(), 1)
             if OTHER_PROJECTS_NAME.search(line)]
    assert not wrong, wrong


@pytest.mark.slow  # python -m build: about 10 s
def test_the_wheel_and_the_sdist_carry_every_file_of_the_package(built_dist):
    wheel, sdist = built_dist
    version = testbed.__version__
    assert wheel.name == f"dpfl_testbed-{version}-py3-none-any.whl"
    assert sdist.name == f"dpfl_testbed-{version}.tar.gz"
    tracked = set(tracked_files(*PACKAGE_DIRS))
    # tests and tools are not the package; templates, schemas, data and firmware sources are
    with zipfile.ZipFile(wheel) as archive:
        in_wheel = set(archive.namelist())
        metadata = HeaderParser().parsestr(archive.read(f"dpfl_testbed-{version}.dist-info/METADATA").decode())
        entry_points = archive.read(f"dpfl_testbed-{version}.dist-info/entry_points.txt").decode()
    assert tracked - in_wheel == set(), "tracked files the wheel leaves out (pyproject.toml's package-data)"
    assert "testbed/data/bundled/adult.data.xz" in in_wheel and "testbed/watch/static/index.html" in in_wheel
    assert (metadata["Name"], metadata["Version"]) == (DISTRIBUTION, version)
    assert "testbed = testbed.cli:program" in entry_points  # main(), then out without the teardown
    with tarfile.open(sdist) as archive:
        in_sdist = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    assert tracked - in_sdist == set() and {"pyproject.toml", "README.md"} <= in_sdist
