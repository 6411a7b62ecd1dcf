"""The ε a tight accountant computed, kept on disk: a sweep's seeds and a run's repeats account the
same mechanism again, and its helper's import of dp-accounting and its bound (about half a second
of CPU on the other core, 4-6 % of job J1's wall time) become a file read.

An entry is the ε at δ of one tally (signature → count) by one built-in accountant, under the code
that computed it: its key names the sources of this package, where every built-in accountant and
its translation into dp-accounting live, and the versions of the libraries it runs on (a plugin's
accountant is never cached: its code is elsewhere). An upgrade or a change of that code computes
anew. A hint per experiment (its settings but the seed and the output's) lists the tallies its last
run planned, so that a run whose plan is known does not start the helper at all.

Only the tight ε reported beside the enforced one comes from here: the budgets are held by the
run's ``privacy.accountant``, computed in the run.

Where: ``$TESTBED_CACHE/epsilon`` (default ``~/.cache/testbed/epsilon``, testbed.util.cache_folder);
``TESTBED_EPSILON_CACHE=off`` turns it off. What is read back is checked: an entry that is not the
one its name says (another key, not a number, NaN, negative) is a miss, computed and written again;
a cache that cannot be written is no error (the run computes, as without it).

Example::

    >>> tally = (((1.0, 0.1, "replace_one", "none", 1.0), 10),)
    >>> entry_key("rdp", 1e-5, tally) == entry_key("rdp", 1e-6, tally)
    False
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.metadata
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any, Iterable

from testbed.errors import UserError
from testbed.util.cache_folder import cache_dir
from testbed.util.userfiles import read_bytes

log = logging.getLogger(__name__)

#: Set to off (or 0, false, no) to compute every tight ε.
ENV = "TESTBED_EPSILON_CACHE"
#: The libraries a built-in accountant's numbers come from.
LIBRARIES = ("dp-accounting", "scipy", "numpy")
#: The largest entry read: a hint lists a plan's tallies' keys (about 300 bytes each).
MAX_ENTRY_BYTES = 4 << 20
_PACKAGE = Path(__file__).resolve().parent
_OFF = ("0", "off", "false", "no")


def enabled() -> bool:
    return os.environ.get(ENV, "on").strip().lower() not in _OFF


def folder() -> Path:
    return cache_dir() / "epsilon"


def cacheable(kind: str) -> bool:
    """Whether accountant ``kind``'s ε may be cached: a built-in one (its code is this package's)."""
    from testbed.privacy.accountants.registry import get as registration

    compose = registration(kind).compose
    return enabled() and getattr(compose, "func", compose).__module__.startswith(f"{__package__}.")  # a partial's function


@functools.cache
def code_fingerprint() -> str:
    """What a built-in accountant's ε is a function of besides its arguments: this package's
    sources, the versions of :data:`LIBRARIES`, the interpreter's and the machine's kind."""
    digest = hashlib.sha256()
    for path in sorted(_PACKAGE.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    for library in LIBRARIES:
        try:
            version = importlib.metadata.version(library)
        except importlib.metadata.PackageNotFoundError:
            version = "absent"
        digest.update(f"{library}={version};".encode())
    import platform  # here: the registry imports this module in every run

    digest.update(f"python={sys.version_info[:2]};machine={platform.machine()}".encode())
    return digest.hexdigest()


def entry_key(kind: str, delta: float, tally: Iterable[tuple[tuple, int]]) -> str | None:
    """The key of accountant ``kind``'s ε at ``delta`` of ``tally``'s (signature, count) items; None
    (not cached) for a signature with a number JSON cannot write (an infinite σ or sensitivity)."""
    items = sorted((list(signature), count) for signature, count in tally)
    return _dumps(["epsilon", kind, repr(delta), items, code_fingerprint()])


def hint_key(kind: str, delta: float, settings: dict[str, Any]) -> str | None:
    """The key of the tallies an experiment plans, from its ``settings`` (the config as a dict)
    less its seed and output: every seed of a sweep shares it. A hint only says whether to start
    the helper at once; the ε themselves are always the entries of the tallies the run made."""
    kept = {section: values for section, values in settings.items() if section != "output"}
    kept["run"] = {k: v for k, v in kept.get("run", {}).items() if k != "seed"}
    return _dumps(["plan", kind, repr(delta), kept, code_fingerprint()])


def _dumps(value: Any) -> str | None:
    try:
        return json.dumps(value, separators=(",", ":"), sort_keys=True, default=str, allow_nan=False)
    except ValueError:  # a non-finite number
        return None


def _path(key: str) -> Path:
    return folder() / f"{hashlib.sha256(key.encode()).hexdigest()[:40]}.json"


def _read(key: str) -> Any:
    """The value written under ``key``, or None when there is none or it is not that entry (a
    regular file of at most :data:`MAX_ENTRY_BYTES`, testbed.util.userfiles: not a FIFO that
    would block the run, not a file that would fill its memory)."""
    try:
        entry = json.loads(read_bytes(_path(key), MAX_ENTRY_BYTES, "ε cache entry"))
    except (UserError, ValueError):  # absent, unreadable, not a bounded regular file, not JSON
        return None
    if not isinstance(entry, dict) or entry.get("key") != key:
        return None
    return entry.get("value")


def _write(key: str, value: Any) -> None:
    """``value`` under ``key``, whole or not at all (a file renamed into place); never raises."""
    path = _path(key)
    temporary = path.with_name(f"{path.stem}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        temporary.write_text(json.dumps({"key": key, "value": value}, allow_nan=False))
        os.replace(temporary, path)
    except OSError as exc:
        log.debug("the ε cache %s is not written: %s", path.parent, exc)
        with contextlib.suppress(OSError):
            temporary.unlink(missing_ok=True)


def get(key: str | None) -> float | None:
    """The ε cached under ``key`` (an :func:`entry_key`), or None."""
    value = None if key is None else _read(key)
    if not isinstance(value, str):
        return None
    try:
        epsilon = float(value)  # written as repr: ∞ included, every digit kept
    except ValueError:
        return None
    return epsilon if epsilon >= 0 else None  # NaN is not >= 0


def put(key: str | None, epsilon: float) -> None:
    if key is not None and epsilon >= 0:
        _write(key, repr(float(epsilon)))


def planned(hint: str) -> list[str] | None:
    """The entry keys the experiment of ``hint`` (a :func:`hint_key`) planned last time, or None."""
    value = _read(hint)
    return value if isinstance(value, list) and all(isinstance(k, str) for k in value) else None


def plan(hint: str, keys: list[str | None]) -> None:
    """The entry keys the experiment of ``hint`` plans (a tally without a key: no hint)."""
    if None not in keys:
        _write(hint, sorted(keys))  # type: ignore[type-var]


def known(keys: Iterable[str | None]) -> dict[str, float]:
    """Those of ``keys`` whose ε is cached, with it."""
    found = {key: get(key) for key in keys}
    return {key: eps for key, eps in found.items() if eps is not None}
