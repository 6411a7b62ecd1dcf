"""Instances of frozen dataclasses built without their generated ``__init__``.

A frozen dataclass's ``__init__`` stores each field through ``object.__setattr__`` (its own
``__setattr__`` refuses): 3.4 µs for a 9-field wire message, against 0.75 µs for filling the
instance's dict at once. The MQTT path builds two such objects per message received (the decoded
message and its hand-over), a coordinator 80 a round; events are copied with a field changed
several times a round per node (testbed.ledger.events.with_fields).
"""

from __future__ import annotations

from typing import Any, TypeVar

T = TypeVar("T")


def frozen(cls: type[T], fields: dict[str, Any], changes: dict[str, Any] | None = None) -> T:
    """An instance of ``cls``, a frozen dataclass whose ``__init__`` only stores its fields (no
    ``__post_init__``, no ``__slots__``), holding ``fields`` (every field of ``cls``, by name)
    with ``changes`` over them.

    Example::

        >>> import dataclasses
        >>> @dataclasses.dataclass(frozen=True)
        ... class Point:
        ...     x: int
        ...     y: int
        >>> frozen(Point, {"x": 1, "y": 2}) == Point(1, 2)
        True
    """
    instance = object.__new__(cls)
    own = instance.__dict__  # what __init__ fills
    own.update(fields)
    if changes:
        own.update(changes)
    return instance
