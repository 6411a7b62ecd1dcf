"""The fence around the MQTT speed layer: what it relies on in other packages' internals, checked
against what is installed before it is used.

The speed layer (`testbed.mqtt.paho_speedups`: paho-mqtt's client; the embedded broker's mended
amqtt, `testbed.mqtt.embedded_broker`) overrides and calls private methods and attributes that
paho-mqtt and amqtt may change in any release. Each part declares what it relies on in one table
of :class:`Internal` entries; :func:`holds` checks a table (once: the part keeps its answer with
:func:`once`) and, when an entry differs, the part steps aside for the package's own code with one
warning naming what differed. pyproject.toml pins both packages to the ranges the tests ran, so a
difference means an install outside them.

``TESTBED_MQTT_SPEEDUPS=0`` (:func:`wanted`) turns paho's speed layer off without checking anything:
every client is paho's own (slower, the same results; CI runs the MQTT conformance tests so once).
``1`` or unset: on where it holds. The embedded broker's mends stay: they fix faults of amqtt 0.12's
stock broker, which is a fallback only for an amqtt they no longer fit.

Example::

    >>> differences([parameters("textwrap.indent", "text, prefix, predicate=None")])
    []
    >>> differences([parameters("textwrap.indent", "text, prefix"), uses("textwrap.indent", "nowhere")])
    ... # doctest: +NORMALIZE_WHITESPACE
    ['textwrap.indent: takes (text, prefix, predicate=None), not (text, prefix)',
     'textwrap.indent: no longer uses nowhere']
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import logging
import os
import threading
import types
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from testbed.errors import UserError

log = logging.getLogger(__name__)

#: The environment variable that turns the speed layer off ("0") or leaves it on where it holds ("1").
SWITCH = "TESTBED_MQTT_SPEEDUPS"

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Internal:
    """One thing of another package's a speed layer relies on.

    Attributes:
        what: the internal, as the warning names it (a dotted path, or the object probed).
        differs: what is found instead of what the layer was written against, or None when it is
            as declared (an exception while reading it is a difference too).
    """

    what: str
    differs: Callable[[], str | None]


def present(path: str) -> Internal:
    """The object at ``path`` (``"package.module.name"``) exists."""

    def differs() -> None:
        _resolve(path)

    return Internal(path, differs)


def parameters(path: str, expected: str) -> Internal:
    """The function at ``path`` (``"package.module.Class.method"``) takes these parameters: their
    names, kinds and defaults as a signature shows them without annotations
    (``"self, command, *args, info=None"``)."""

    def differs() -> str | None:
        found = _parameters(_resolve(path))
        return None if found == expected else f"takes ({found}), not ({expected})"

    return Internal(path, differs)


def uses(path: str, *names: str) -> Internal:
    """The code of the function at ``path`` names each of ``names`` (an attribute it sets or reads,
    a method it calls): what makes an override of that method reached, or an attribute there."""

    def differs() -> str | None:
        code = set(_code_names(_resolve(path).__code__))
        missing = [name for name in names if name not in code]
        return f"no longer uses {', '.join(missing)}" if missing else None

    return Internal(path, differs)


def attributes(what: str, make: Callable[[], object], *names: str) -> Internal:
    """The object ``make()`` returns (``what`` names it: ``"paho.mqtt.client.Client()"``) has each
    of ``names``."""

    def differs() -> str | None:
        made = make()
        missing = [name for name in names if not hasattr(made, name)]
        return f"has no {', '.join(missing)}" if missing else None

    return Internal(what, differs)


def keys(what: str, make: Callable[[], dict[str, Any]], *names: str) -> Internal:
    """The dict ``make()`` returns (``what`` names it) has exactly the keys ``names``: the layer
    builds such dicts itself, so a key added is a difference as much as one removed."""

    def differs() -> str | None:
        found = sorted(make())
        return None if found == sorted(names) else f"has keys {', '.join(found)}, not {', '.join(sorted(names))}"

    return Internal(what, differs)


def differences(table: Sequence[Internal]) -> list[str]:
    """``"what: how it differs"`` for each entry of ``table`` the installed packages do not hold."""
    found = []
    for internal in table:
        try:
            differs = internal.differs()
        except Exception as exc:  # a missing module or attribute, a probe that fails: all differences
            differs = f"cannot be read ({type(exc).__name__}: {exc})"
        if differs is not None:
            found.append(f"{internal.what}: {differs}")
    return found


def wanted(layer: str, *, fallback: str) -> bool:
    """Whether :data:`SWITCH` leaves ``layer`` (a module name, for the log) on: True unless it is
    "0" (then ``fallback``, named in an INFO line, is used instead).

    Raises:
        UserError: a value other than "0", "1" or empty.
    """
    value = os.environ.get(SWITCH, "")
    if value not in ("", "0", "1"):
        raise UserError(f"{SWITCH} must be 0 (the MQTT speed layer off) or 1 (on where it holds), not {value!r}")
    if value == "0":
        log.info("%s off (%s=0): %s instead", layer, SWITCH, fallback)
    return value != "0"


def holds(layer: str, package: str, table: Sequence[Internal], *, fallback: str) -> bool:
    """Whether the installed ``package`` (its distribution name) holds every entry of ``table``,
    which ``layer`` (a module name) relies on. Otherwise False, with one warning naming each
    difference and the ``fallback`` the caller then uses."""
    found = differences(table)
    if not found:
        return True
    log.warning("%s off: %s %s is not what it was written for (pyproject.toml pins the tested range): %s; "
                "%s instead", layer, package, _version(package), "; ".join(found), fallback)
    return False


def once(function: Callable[[], T]) -> Callable[[], T]:
    """``function`` (no arguments) answered by its first call and kept: concurrent first calls wait
    for that one, so a check warns once a process; later calls take no lock. A process forked
    meanwhile starts with a fresh lock (the thread holding the old one is not in it).
    ``.cache_clear()`` forgets the answer (tests)."""
    answers: list[T] = []
    locks = [threading.Lock()]
    os.register_at_fork(after_in_child=lambda: locks.__setitem__(0, threading.Lock()))

    @functools.wraps(function)
    def answer() -> T:
        if not answers:
            with locks[0]:
                if not answers:
                    answers.append(function())
        return answers[0]

    answer.cache_clear = answers.clear  # type: ignore[attr-defined]
    return answer


def _resolve(path: str) -> Any:
    """The object at a dotted ``path``: its longest importable module prefix, then attributes."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            found: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            found = getattr(found, name)
        return found
    raise ImportError(f"no module of {path}")


def _parameters(function: Any) -> str:
    """A function's parameters as its signature shows them, without annotations."""
    signature = inspect.signature(function)
    bare = signature.replace(parameters=[p.replace(annotation=inspect.Parameter.empty)
                                         for p in signature.parameters.values()],
                             return_annotation=inspect.Signature.empty)
    return str(bare)[1:-1]


def _code_names(code: types.CodeType) -> Iterator[str]:
    """The names a function's code uses, its nested code (comprehensions, inner functions) included."""
    yield from code.co_names
    for constant in code.co_consts:
        if isinstance(constant, types.CodeType):
            yield from _code_names(constant)


def _version(package: str) -> str:
    """The installed version of ``package``, or "(version unknown)"."""
    from importlib import metadata  # only on the way to a warning: 7 ms to import

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "(version unknown)"
