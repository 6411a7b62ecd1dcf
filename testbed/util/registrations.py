"""How every registry of the testbed finds its entries: each module of a package that defines
``REGISTRATION`` (one registration, or a tuple of them) registers it; adding an entry is adding a
module. The registries of algorithms, data sets, privacy accountants, meters and managed brokers
all find theirs here, so they agree on what a registration is and on how a clash is refused.

Example::

    >>> import testbed.algorithms, testbed.algorithms.registry as algorithms
    >>> found = registered_in(testbed.algorithms, algorithms.Registration, "algorithm")
    >>> "fedavg" in found
    True
    >>> lookup(found, "fedsgd", "algorithm")
    Traceback (most recent call last):
    ...
    KeyError: "no algorithm 'fedsgd'; known: acfl, dp_pasgd, dwfl, fedavg, padpfl"
"""

from __future__ import annotations

import importlib
import pkgutil
from types import ModuleType
from typing import Any, Callable, Collection, Iterable, TypeVar

R = TypeVar("R")


def registrations_of(modules: Iterable[ModuleType], kind: type[R], what: str, *,
                     order: Callable[[R], Any] | None = None, reserved: Collection[str] = ()) -> dict[str, R]:
    """The registrations of type ``kind`` that ``modules`` define as ``REGISTRATION``, by name, in
    ``order`` (a sort key; default the name).

    Raises:
        RuntimeError: two registrations share a name, or one takes a ``reserved`` name (a choice
            the config gives another meaning, such as "auto" or "none").
    """
    found: dict[str, R] = {}
    for module in modules:
        reg = getattr(module, "REGISTRATION", None)
        for one in reg if isinstance(reg, tuple) else (reg,):
            if not isinstance(one, kind):
                continue
            name = one.name  # type: ignore[attr-defined]
            if name in reserved:
                raise RuntimeError(f"a {what} named {name!r}, a name the config reserves")
            if name in found:
                raise RuntimeError(f"two {what}s named {name!r}")
            found[name] = one
    key = order or (lambda reg: reg.name)  # type: ignore[attr-defined]
    return {reg.name: reg for reg in sorted(found.values(), key=key)}  # type: ignore[attr-defined]


def registered_in(package: ModuleType, kind: type[R], what: str, *, order: Callable[[R], Any] | None = None,
                  reserved: Collection[str] = ()) -> dict[str, R]:
    """:func:`registrations_of` every module of ``package`` (each imported once, here)."""
    modules = (importlib.import_module(f"{package.__name__}.{info.name}")
               for info in pkgutil.iter_modules(package.__path__))
    return registrations_of(modules, kind, what, order=order, reserved=reserved)


def lookup(found: dict[str, R], name: str, what: str, error: Callable[[str], Exception] = KeyError) -> R:
    """``found[name]``, else ``error`` with one line naming the known ones."""
    try:
        return found[name]
    except KeyError:
        raise error(f"no {what} {name!r}; known: {', '.join(found)}") from None
