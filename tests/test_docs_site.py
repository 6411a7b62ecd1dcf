"""The documentation site (issue 42, part 6): every page of docs/ is a chapter of mkdocs.yml's nav
and every nav entry a page; `mkdocs build --strict` passes (a broken link or anchor, a page left
out, an API reference naming nothing fails it); and the README, the front page, stays one: short,
its links whole, its quick start commands true."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import yaml

from conftest import REPO, require_command, require_module

DOCS = REPO / "docs"
README = (REPO / "README.md").read_text()


def nav_pages(entries) -> list[str]:
    """The page files a mkdocs nav names, in order."""
    pages = []
    for entry in entries:
        value = next(iter(entry.values())) if isinstance(entry, dict) else entry
        pages += nav_pages(value) if isinstance(value, list) else [value]
    return pages


def test_every_page_is_in_the_nav_and_every_entry_is_a_page():
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    nav = nav_pages(config["nav"])
    files = sorted(str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md"))
    assert len(nav) == len(set(nav)), "a page twice in the nav"
    assert sorted(nav) == files, (set(files) - set(nav), set(nav) - set(files))
    assert config["strict"] is True and nav[0] == "index.md"


@pytest.mark.slow  # mkdocs and mkdocstrings: about 10 s
def test_the_site_builds_strictly(tmp_path):
    require_module("mkdocs", "docs")
    require_module("mkdocstrings_handlers.python", "docs")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    api = (tmp_path / "site" / "reference" / "api" / "index.html").read_text()
    for name in ("run", "load", "sweep", "Run"):  # the API reference holds the public names' docstrings
        assert f'id="testbed.api.{name}"' in api, name


def test_the_readme_is_a_front_page_whose_links_hold():
    assert len(README.splitlines()) <= 200
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README)
    local = [link for link in links if "://" not in link]
    assert local and all((REPO / link).exists() for link in local), [l for l in local if not (REPO / l).exists()]
    assert "docs/img/overview.svg" in local  # a picture
    for chapter in ("install", "usage", "api", "experiment-files", "algorithms", "guarantees", "privacy", "mqtt",
                    "lab", "reliability", "benchmarks", "layout"):  # where the README's text went
        assert f"docs/{chapter}.md" in local, chapter


def _quick_start_blocks() -> list[list[str]]:
    section = README[README.index("## Quick start"):README.index("\n## ", README.index("## Quick start") + 1)]
    blocks = re.findall(r"```sh\n(.*?)```", section, re.S)
    return [[line.split("#")[0].strip() for line in block.splitlines() if line.split("#")[0].strip()]
            for block in blocks]


def test_the_quick_starts_two_commands_are_the_makefiles():
    assert _quick_start_blocks()[0] == ["make demo", "make test"]
    make = require_command("make", "apt-get install make")
    for target, command in (("demo", "testbed run experiments/quickstart.toml"), ("test", "-m pytest")):
        planned = subprocess.run([make, "-n", target], cwd=REPO, capture_output=True, text=True, timeout=60)
        assert planned.returncode == 0 and command in planned.stdout, planned.stdout + planned.stderr


@pytest.mark.slow  # the quick start in sim and its report, and DWFL in the street canyon: about 30 s
def test_the_quick_starts_next_commands_run_as_written(tmp_path):
    """The block after `make demo`, in a folder with the checkout's experiments/: each command as
    written (`testbed watch`, a server, is only parsed)."""
    from testbed.cli import build_parser

    (tmp_path / "experiments").symlink_to(REPO / "experiments")
    (tmp_path / "examples").symlink_to(REPO / "examples")
    commands = _quick_start_blocks()[1]
    assert [c.split()[:2] for c in commands] == [["testbed", "run"], ["testbed", "report"], ["testbed", "watch"],
                                                 ["testbed", "privacy"], ["testbed", "run"],  # the scene,
                                                 ["testbed", "scene"]]  # and its picture
    for command in commands:
        argv = command.split()[1:]
        if argv[0] == "watch":
            assert build_parser("watch").parse_args(argv).command == "watch"
            continue
        done = subprocess.run([sys.executable, "-m", "testbed", *argv], cwd=tmp_path, capture_output=True, text=True,
                              timeout=600)
        assert done.returncode == 0, (command, done.stderr[-2000:])
    assert (tmp_path / "runs" / "qs" / "summary.json").exists() and (tmp_path / "runs" / "qs" / "report.html").exists()
    assert list((tmp_path / "runs").glob("scene-dwfl-*/summary.json"))  # examples/scene_dwfl.toml ran
    assert (tmp_path / "scene.png").read_bytes()[:4] == b"\x89PNG"  # and its picture was drawn
