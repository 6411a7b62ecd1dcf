"""The user's cache folder: ``$TESTBED_CACHE``, else ``~/.cache/testbed``. Downloaded datasets and
lazy federations (testbed.data.cache), and the tight accountant's ε
(testbed.privacy.accountants.epsilon_cache) each keep a folder in it."""

from __future__ import annotations

import os
from pathlib import Path

#: Where the cache is; default ``~/.cache/testbed``.
CACHE_ENV = "TESTBED_CACHE"


def cache_dir() -> Path:
    """The cache: ``$TESTBED_CACHE`` or ``~/.cache/testbed``."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "testbed")
