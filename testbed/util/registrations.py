"""How every registry of the testbed finds its entries: each module of a package that defines
``REGISTRATION`` (one registration, or a tuple of them) registers it, and so does each module an
installed distribution names under the registry's entry-point group (``testbed.algorithms``,
``testbed.datasets``, ...: :data:`GROUPS`). Adding an entry is adding a module, in this package or
in a project of one's own (docs/extending.md); the registries of every axis find theirs here, so
they agree on what a registration is and on how a clash is refused.

A plugin is taken exactly as a built-in module is. One that fails to import, registers nothing of
its axis, or takes a name already taken (by a built-in or by another plugin) is refused with
:class:`PluginError`, one line naming the distribution and the entry point, which the command line
prints without a traceback.

Example::

    >>> import testbed.algorithms, testbed.algorithms.registry as algorithms
    >>> found = registered_in(testbed.algorithms, algorithms.Registration, "algorithm", group=GROUPS["algorithm"])
    >>> "fedavg" in found
    True
    >>> lookup({"fedavg": 1, "dwfl": 2}, "fedsgd", "algorithm")
    Traceback (most recent call last):
    ...
    KeyError: "no algorithm 'fedsgd'; known: fedavg, dwfl"
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from dataclasses import dataclass
from importlib.metadata import EntryPoint, entry_points
from types import ModuleType
from typing import Any, Callable, Collection, Iterable, TypeVar

from testbed.errors import UserError

R = TypeVar("R")

#: The entry-point group of each axis: an installed distribution adds an entry by naming, under the
#: group, a module whose ``REGISTRATION`` is taken as a built-in module's.
GROUPS = {
    "algorithm": "testbed.algorithms",
    "data set": "testbed.datasets",
    "accountant": "testbed.accountants",
    "board profile": "testbed.board_profiles",
    "meter": "testbed.meters",
    "managed broker": "testbed.brokers",
    "topology kind": "testbed.topologies",
    "aggregation rule": "testbed.aggregations",
}


#: axis → name → the plugin that registered it ("" for a built-in), as the registries found them.
_PLUGINS: dict[str, dict[str, str]] = {}


class PluginError(UserError):
    """An installed plugin the testbed cannot take: it fails to import, registers nothing of its
    axis, or takes a name that is taken. One line, naming the distribution and the entry point."""


@dataclass(frozen=True)
class Source:
    """Where registrations come from: a built-in module, or a plugin's entry point."""

    module: ModuleType
    #: "" for a built-in module; else "distribution 'NAME' entry point 'EP' (group GROUP)".
    plugin: str = ""

    def __str__(self) -> str:
        return self.plugin or f"module {getattr(self.module, '__name__', '?')}"


def registrations_of(modules: Iterable[ModuleType | Source], kind: type[R], what: str, *,
                     order: Callable[[R], Any] | None = None, reserved: Collection[str] = (),
                     found: dict[str, tuple[R, str]] | None = None, others: tuple[type, ...] = ()) -> dict[str, R]:
    """The registrations of type ``kind`` that ``modules`` define as ``REGISTRATION``, by name, in
    ``order`` (a sort key; default the name). ``found``: entries known already (name →
    (registration, where from)), whose names the modules' may not take again. ``others``: the
    types another registry of the same entry-point group takes (a plugin registering only those
    registers nothing here, and is not refused for it).

    Raises:
        PluginError: a plugin registers nothing of ``kind``, or takes a name that is taken or reserved.
        RuntimeError: two built-in modules share a name, or one takes a ``reserved`` name (a choice
            the config gives another meaning, such as "auto" or "none").
    """
    seen: dict[str, tuple[R, str]] = dict(found or {})
    for item in modules:
        source = item if isinstance(item, Source) else Source(item)
        reg = getattr(source.module, "REGISTRATION", None)
        regs = reg if isinstance(reg, tuple) else (reg,)
        ours = [one for one in regs if isinstance(one, kind)]
        if source.plugin and not any(isinstance(one, (kind, *others)) for one in regs):
            raise PluginError(f"{source}: module {source.module.__name__} registers no {what} (its REGISTRATION holds none)")
        for one in ours:
            name = one.name  # type: ignore[attr-defined]
            error = PluginError if source.plugin else RuntimeError
            if name in reserved:
                raise error(f"{source}: the {what} name {name!r} is one the config reserves")
            if name in seen:
                raise error(f"{source}: the {what} name {name!r} is taken by {seen[name][1]}")
            seen[name] = (one, str(source))
    for name, (_, where) in seen.items():
        _PLUGINS.setdefault(what, {})[name] = where if where.startswith("distribution ") else ""
    key = order or (lambda reg: reg.name)  # type: ignore[attr-defined]
    return {reg.name: reg for reg in sorted((reg for reg, _ in seen.values()), key=key)}  # type: ignore[attr-defined]


def plugin_of(what: str, name: str) -> str:
    """The plugin that registered the ``what`` named ``name`` ("distribution 'D' entry point 'E'
    (group G)"), or "" for a built-in entry (or one no registry has found)."""
    return _PLUGINS.get(what, {}).get(name, "")


def plugin_sources(group: str) -> list[Source]:
    """The modules installed distributions name under the entry-point ``group``, imported, in the
    order of (distribution, entry point) names.

    Raises:
        PluginError: one fails to import (its error in the line).
    """
    sources = []
    for ep in sorted(_installed_entry_points().select(group=group), key=lambda ep: (_distribution(ep), ep.name)):
        label = f"distribution {_distribution(ep)!r} entry point {ep.name!r} (group {group})"
        try:
            loaded = ep.load()
        except Exception as exc:  # whatever a third party's module raises on import: one line, never a traceback
            raise PluginError(f"{label}: {ep.value} failed to import: {type(exc).__name__}: {exc}") from None
        if not isinstance(loaded, ModuleType):
            raise PluginError(f"{label}: {ep.value} is not a module (name a module that defines REGISTRATION)")
        sources.append(Source(loaded, label))
    return sources


@functools.lru_cache(maxsize=1)
def _installed_entry_points():
    """Every installed distribution's entry points, read once a process: reading them opens every
    distribution's metadata (a fifth of a second of a run's start under load, once for each of the
    registries a run reads). A plugin installed later is found by the next process."""
    return entry_points()


def _distribution(ep: EntryPoint) -> str:
    return ep.dist.name if ep.dist is not None else "?"


def package_modules(package: ModuleType) -> list[ModuleType]:
    """Every module of ``package`` (each imported once, here)."""
    return [importlib.import_module(f"{package.__name__}.{info.name}") for info in pkgutil.iter_modules(package.__path__)]


def registered_in(package: ModuleType | None, kind: type[R], what: str, *, group: str | None = None,
                  order: Callable[[R], Any] | None = None, reserved: Collection[str] = (),
                  builtin: dict[str, R] | None = None, others: tuple[type, ...] = ()) -> dict[str, R]:
    """:func:`registrations_of` every module of ``package`` (None: none), the registrations
    ``builtin`` gives by name (an axis kept as data, such as the board profiles' files), and every
    module the installed distributions name under the entry-point ``group`` (one of
    :data:`GROUPS`; None: no plugins)."""
    known = {name: (reg, "a built-in entry") for name, reg in (builtin or {}).items()}
    modules: list[ModuleType | Source] = list(package_modules(package)) if package is not None else []
    if group is not None:
        modules += plugin_sources(group)
    return registrations_of(modules, kind, what, order=order, reserved=reserved, found=known, others=others)


def lookup(found: dict[str, R], name: str, what: str, error: Callable[[str], Exception] = KeyError) -> R:
    """``found[name]``, else ``error`` with one line naming the known ones."""
    try:
        return found[name]
    except KeyError:
        raise error(f"no {what} {name!r}; known: {', '.join(found)}") from None
