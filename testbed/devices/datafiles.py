"""Where the board kinds' data files are: inside the packages that run them, found without
importing those packages (devices/ is a layer below them: docs/design.md)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def package_dir(package: str) -> Path:
    """The folder of top-level ``package``, located by its import spec (its code is not run)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"the {package} package is not installed beside testbed")
    return Path(next(iter(spec.submodule_search_locations)))


def read_toml(path: Path) -> dict[str, Any]:
    with open(path, "rb") as f:
        return tomllib.load(f)
