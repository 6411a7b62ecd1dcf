"""Events to and from plain dicts (JSON on the wire, the string cells of a ledger.csv row), every
field checked against its rule (type, range, choices) before an event is built: what a node
reports is never trusted as it comes.

Example::

    >>> event_from_dict({"kind": "straggle", "node": "1", "round": "4", "reason": "deadline"})
    StraggleEvent(node=1, round=4, reason='deadline')
"""

from __future__ import annotations

import math
import operator
import re
from dataclasses import dataclass, replace
from typing import Mapping

import numpy as np

from testbed.ledger.events import (ADJACENCIES, ALL_FIELDS, EVENT_TYPES, FIELDS, ISSUERS, OBSERVERS, SAMPLINGS,
                                   STRAGGLE_REASONS, Event, with_fields)
from testbed.util.frozen import frozen


_FIELD_SETS = {kind: frozenset(names) for kind, names in FIELDS.items()}


def event_to_dict(event: Event) -> dict:
    """A plain dict of an event (``kind`` plus its fields), for JSON on the wire."""
    own = event.__dict__
    if own.keys() == _FIELD_SETS[event.kind]:  # its fields alone, as __init__ and with_fields leave it
        return {"kind": event.kind, **own}
    return {"kind": event.kind, **{name: getattr(event, name) for name in FIELDS[event.kind]}}



# Beyond any physical scale of a noise std or a sensitivity; keeps their squares finite in float64.
ABSURD = 1e30
#: The physical bounds of what a node measures or models itself in one event (MEASURED_FIELDS), so
#: that a reported 1.7e308 is refused, not summed into an infinite total. A day of compute or airtime
#: is longer than any round a node takes part in (a node that stalls longer straggles); a kilowatt is
#: two orders of magnitude above any board's draw (profiles.toml: at most ~10 W).
MAX_EVENT_S = 86_400.0
MAX_POWER_W = 1_000.0
MAX_EVENT_J = MAX_EVENT_S * MAX_POWER_W
_INT_LIMIT = 2**63  # ints must fit an int64 (numpy, the wire, the C firmware)


@dataclass(frozen=True)
class FieldRule:
    """The values one event field may take: its type, then a range (closed unless ``*_open``) or
    a set of choices. Floats must be finite; bools are not ints.

    Example::

        >>> FieldRule(float, low=0.0, low_open=True, high=1.0).check("sampling_rate", "0.25")
        0.25
    """

    type: type
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    choices: tuple[str, ...] = ()

    def check(self, name: str, raw: object) -> object:
        """``raw`` (a JSON value or a CSV string) as a value of this field; ValueError naming it."""
        value = _coerce(raw, self.type, name)
        if self.choices and value not in self.choices:
            raise ValueError(f"{name} must be one of {', '.join(self.choices)}, got {_short(raw)}")
        if self.low is not None and (value < self.low or (self.low_open and value == self.low)):
            raise ValueError(f"{name} must be {'>' if self.low_open else '>='} {self.low:g}, got {_short(raw)}")
        if self.high is not None and value > self.high:
            raise ValueError(f"{name} must be <= {self.high:g}, got {_short(raw)}")
        return value


# One rule per field name, whatever the event kind: a new field or event kind is one line here.
FIELD_RULES: dict[str, FieldRule] = {
    "node": FieldRule(int, low=0),
    "round": FieldRule(int, low=-1),  # -1: the algorithm's setup phase (contract.SETUP_ROUND)
    "local_steps": FieldRule(int, low=0),
    "cost_units": FieldRule(float, low=0.0),
    "compute_s": FieldRule(float, low=0.0, high=MAX_EVENT_S),
    "airtime_s": FieldRule(float, low=0.0, high=MAX_EVENT_S),
    "wire_s": FieldRule(float, low=0.0, high=MAX_EVENT_S),
    "energy_j": FieldRule(float, low=0.0, high=MAX_EVENT_J),
    "bytes_up": FieldRule(int, low=0),
    "bytes_down": FieldRule(int, low=0),
    "measured": FieldRule(bool),
    "sigma": FieldRule(float, low=0.0, high=ABSURD),  # 0: no noise, an infinite privacy loss
    "sensitivity": FieldRule(float, low=0.0, low_open=True, high=ABSURD),
    "count": FieldRule(int, low=1),
    "adjacency": FieldRule(str, choices=ADJACENCIES),
    "sampling": FieldRule(str, choices=SAMPLINGS),
    "sampling_rate": FieldRule(float, low=0.0, low_open=True, high=1.0),
    "observer": FieldRule(str, choices=OBSERVERS),
    "issuer": FieldRule(str, choices=ISSUERS),
    "reason": FieldRule(str, choices=STRAGGLE_REASONS),
    "epsilon_nats": FieldRule(float, low=0.0, high=ABSURD),
    "clip_norm": FieldRule(float, low=0.0, high=ABSURD),
}
_KEYS = {kind: frozenset(("kind", *names)) for kind, names in FIELDS.items()}  # of event_to_dict's dict
_ANY_KINDS_FIELDS = frozenset(ALL_FIELDS)


def event_from_dict(values: Mapping) -> Event:
    """The event a dict of :func:`event_to_dict` (or a ledger.csv row of strings) describes.

    Every field is checked against :data:`FIELD_RULES` (type, range, choices). Fields of other event
    kinds are allowed only empty (a ledger.csv row has every kind's columns).

    Raises:
        ValueError: one line naming the kind and the field: an unknown kind, a missing, unexpected,
            mistyped or out-of-range field.

    Example::

        >>> event_from_dict({"kind": "compute", "node": 0, "round": 2, "local_steps": 5,
        ...                  "cost_units": 5.0, "compute_s": 0.1, "energy_j": 0.2, "measured": False})
        ComputeEvent(node=0, round=2, local_steps=5, cost_units=5.0, compute_s=0.1, energy_j=0.2, measured=False)
    """
    if not isinstance(values, (dict, Mapping)):  # dict first: an ABC check costs a microsecond
        raise ValueError(f"an event must be a mapping, got {type(values).__name__}")
    kind = values.get("kind")
    if not isinstance(kind, str) or kind not in EVENT_TYPES:
        raise ValueError(f"unknown event kind {_short(kind)}")
    own = FIELDS[kind]
    for key, raw in () if values.keys() == _KEYS[kind] else values.items():  # a dict of event_to_dict: none
        if key == "kind" or key in own:
            continue
        if key is None:  # csv.DictReader: the row has more cells than the header
            raise ValueError(f"{kind} event row has more columns than the header")
        if key in _ANY_KINDS_FIELDS and (raw is None or raw == ""):
            continue
        raise ValueError(f"{kind} event has an unexpected field {_short(key)}")
    kwargs = {}
    for name in own:
        raw = values.get(name)
        if raw is None or raw == "":
            raise ValueError(f"{kind} event lacks {name!r}")
        try:
            kwargs[name] = FIELD_RULES[name].check(name, raw)
        except ValueError as exc:
            raise ValueError(f"{kind} event: {exc}") from None
    return EVENT_TYPES[kind](**kwargs)


#: The fields of a node's event it measures or models itself (seconds, joules, and whether a meter
#: gave them); every other field is what the round's plan says.
MEASURED_FIELDS = frozenset({"compute_s", "airtime_s", "energy_j", "measured"})
# Their rules without the fixed cap, which event_within applies as a bound (the tighter one given).
_MEASURED_RULES = {name: replace(FIELD_RULES[name], high=None) for name in MEASURED_FIELDS}


def event_as_planned(values: object, planned: Event, limits: Mapping[str, float] | None = None) -> Event:
    """The event a dict of :func:`event_to_dict` describes, which must be ``planned`` in every field
    but :data:`MEASURED_FIELDS` (those checked against :data:`FIELD_RULES` and ``limits``, the
    bounds of testbed.orchestration.measured_bounds).

    Raises:
        ValueError: one line naming the kind and the field: another kind, a missing or unexpected
            field, a field that differs from the plan, a measured one out of its rule or bound.

    Example::

        >>> from testbed.ledger.events import ComputeEvent
        >>> planned = ComputeEvent(node=0, round=2, local_steps=5, cost_units=5.0)
        >>> event_as_planned({"kind": "compute", "node": 0, "round": 2, "local_steps": 5, "cost_units": 5.0,
        ...                   "compute_s": 0.1, "energy_j": 0.2, "measured": True}, planned)
        ComputeEvent(node=0, round=2, local_steps=5, cost_units=5.0, compute_s=0.1, energy_j=0.2, measured=True)
    """
    event, problems = event_within(values, planned, limits)
    if problems:
        raise ValueError(problems[0])
    return event


def event_within(values: object, planned: Event, limits: Mapping[str, float] | None = None,
                 refused_at: Mapping[str, float] | None = None) -> tuple[Event, list[str]]:
    """As :func:`event_as_planned`, but a measured field out of its rule or above its bound in
    ``limits`` (default: the rule's fixed cap) is not an error: the event returned carries
    ``refused_at``'s figure for it (default: the bound), never less than the plan's (the
    ``measured`` flag: the plan's), and the list says why, one phrase a field. What a refused reply
    released is charged this way.

    Raises:
        ValueError: what is not a measured field differs from the plan (as event_as_planned).

    Example::

        >>> from testbed.ledger.events import ComputeEvent
        >>> planned = ComputeEvent(node=0, round=2, local_steps=5)
        >>> event, why = event_within({"kind": "compute", "node": 0, "round": 2, "local_steps": 5,
        ...     "cost_units": 0.0, "compute_s": 1e308, "energy_j": 0.2, "measured": True}, planned,
        ...     {"compute_s": 3.0, "energy_j": 30.0})
        >>> event.compute_s, event.energy_j, why
        (3.0, 0.2, ['compute event: compute_s = 1e+308 is beyond its bound 3'])
    """
    kind = planned.kind
    if type(values) is not dict or values.get("kind") != kind:
        got = values.get("kind") if isinstance(values, dict) else type(values).__name__
        raise ValueError(f"a {_short(got)} event where the plan says {kind}")
    if values.keys() != _KEYS[kind]:
        raise ValueError(f"{kind} event with fields {_short(sorted(map(str, values)))}, "
                         f"not {', '.join(FIELDS[kind])}")
    plan, measured, problems = planned.__dict__, {}, []  # the fields of a frozen dataclass (see with_fields)
    for name in FIELDS[kind]:
        raw = values[name]
        if name in MEASURED_FIELDS:
            bound = FIELD_RULES[name].high if limits is None or name not in limits else limits[name]
            try:
                value = _MEASURED_RULES[name].check(name, raw)
                if bound is not None and value > bound:
                    raise ValueError(f"{name} = {value:.6g} is beyond its bound {bound:.6g}")
            except ValueError as exc:
                problems.append(f"{kind} event: {exc}")
                at = bound if refused_at is None else refused_at.get(name, plan[name])
                value = plan[name] if at is None else max(at, plan[name])
            measured[name] = value
        elif raw != plan[name] or (raw.__class__ is bool) is not (plan[name].__class__ is bool):  # True == 1
            raise ValueError(f"{kind} event with {name} = {_short(raw)}, the plan says {plan[name]!r}")
    return (with_fields(planned, **measured) if measured else planned), problems


def planned_within(values: object, planned: Event, least: Mapping[str, float], node: int | None = None) -> Event | None:
    """What :func:`event_within` returns, without a problem, for ``values`` that are ``planned`` in
    every field but the measured ones, each of those of its JSON type exactly (a float, a bool) and
    its numbers in [0, ``least``] (a name not in ``least``: its rule's cap); None for anything else,
    which event_within must decide. ``least`` no larger than event_within's ``limits`` (the bounds
    of a window that closes at once: measured_bounds.MeasuredBounds.least_limits), an event
    returned here is event_within's, with no problem: a reply's fast path, its decision the same.
    With ``node``: against ``planned`` for that node (its node field ``node``; the plan of every
    node of a round planned once, contract.planned_batch), without building that event first.
    Where one plan checks many replies, :class:`PlannedForm` is this function made once for it.

    Example::

        >>> from testbed.ledger.events import ComputeEvent
        >>> planned = ComputeEvent(node=0, round=2, local_steps=5)
        >>> values = {"kind": "compute", "node": 0, "round": 2, "local_steps": 5, "cost_units": 0.0,
        ...           "compute_s": 0.1, "energy_j": 0.2, "measured": True}
        >>> planned_within(values, planned, {"compute_s": 3.0, "energy_j": 30.0}).compute_s
        0.1
        >>> planned_within(values, planned, {"compute_s": 0.05, "energy_j": 30.0}) is None
        True
    """
    form = PlannedForm(planned)
    return form.within(values, form.least(least), node)


class PlannedForm:
    """:func:`planned_within` for one plan, its fields sorted once: the plan's fields compared as one
    tuple, the measured ones read as another (a coordinator checks every reply's events of a
    round planned once for all its nodes against one plan: 2 µs an event, where the field by
    field walk took 5).

    Example::

        >>> from testbed.ledger.events import ComputeEvent
        >>> form = PlannedForm(ComputeEvent(node=0, round=2, local_steps=5))
        >>> values = {"kind": "compute", "node": 7, "round": 2, "local_steps": 5, "cost_units": 0.0,
        ...           "compute_s": 0.1, "energy_j": 0.2, "measured": True}
        >>> form.within(values, form.least({"compute_s": 3.0, "energy_j": 30.0}), node=7).node
        7
    """

    def __init__(self, planned: Event):
        kind = planned.kind
        self.planned = planned
        self._keys = _KEYS[kind]
        fixed = ("kind", *(name for name in FIELDS[kind] if name not in MEASURED_FIELDS and name != "node"))
        self._fixed = operator.itemgetter(*fixed)  # "kind" and "round" at least: a tuple
        self._plan = tuple(planned.kind if name == "kind" else planned.__dict__[name] for name in fixed)
        #: The measured numbers' names, in the order of :meth:`least`'s bounds.
        self.numbers = tuple(n for n in FIELDS[kind] if n in MEASURED_FIELDS and _MEASURED_RULES[n].type is not bool)
        flags = tuple(n for n in FIELDS[kind] if n in MEASURED_FIELDS and _MEASURED_RULES[n].type is bool)
        self._measured_names = self.numbers + flags
        self._measured = operator.itemgetter("kind", *self._measured_names)  # a tuple even for one name
        self._measured_types = (str,) + (float,) * len(self.numbers) + (bool,) * len(flags)

    def least(self, least: Mapping[str, float]) -> tuple[float, ...]:
        """The bound of each of :attr:`numbers` (a name not in ``least``: its rule's cap)."""
        return tuple(least.get(name, FIELD_RULES[name].high) for name in self.numbers)

    def within(self, values: object, least: tuple[float, ...], node: int | None = None) -> Event | None:
        """:func:`planned_within` of ``values`` against this plan, ``least`` from :meth:`least`."""
        if values.__class__ is not dict or values.keys() != self._keys:  # type: ignore[attr-defined]
            return None
        fixed = self._fixed(values)
        # No planned field is a bool (only `measured` is, and a node measures it): a bool here is
        # refused, as True == 1 would pass the comparison.
        if fixed != self._plan or bool in map(type, fixed):
            return None
        raw_node = values["node"]  # type: ignore[index]
        if raw_node != (self.planned.node if node is None else node) or raw_node.__class__ is bool:
            return None
        measured = self._measured(values)
        if tuple(map(type, measured)) != self._measured_types:
            return None
        for value, high in zip(measured[1:], least):  # NaN fails the comparison, an infinity the bound
            if not 0.0 <= value <= high:
                return None
        changes = dict(zip(self._measured_names, measured[1:]))
        if node is not None:
            changes["node"] = node
        return frozen(type(self.planned), self.planned.__dict__, changes) if changes else self.planned


def _short(raw: object) -> str:
    text = repr(raw)
    return text if len(text) <= 40 else text[:37] + "..."


def _coerce(raw: object, kind: type, name: str) -> object:
    # A JSON value of the field's own type (every field of every reply a coordinator checks):
    # nothing to convert; anything else takes the general path, which also words the errors.
    if type(raw) is kind and (kind is not float or math.isfinite(raw)) and (  # type: ignore[arg-type]
            kind is not int or -_INT_LIMIT <= raw < _INT_LIMIT):  # type: ignore[operator]
        return raw
    if kind is bool:
        if isinstance(raw, (bool, np.bool_)):
            return bool(raw)
        if raw in ("True", "False"):
            return raw == "True"
        raise ValueError(f"{name} must be a boolean, got {_short(raw)}")
    if kind is str:
        if not isinstance(raw, str):
            raise ValueError(f"{name} must be a string, got {_short(raw)}")
        return raw
    if isinstance(raw, (bool, np.bool_)):
        raise ValueError(f"{name} must be a number, not a boolean ({_short(raw)})")
    if kind is int:
        if isinstance(raw, (int, np.integer)):
            value = int(raw)
        elif isinstance(raw, str) and re.fullmatch(r"[+-]?[0-9]{1,19}", raw.strip()):
            value = int(raw)
        else:
            raise ValueError(f"{name} must be an integer, got {_short(raw)}")
        if not -_INT_LIMIT <= value < _INT_LIMIT:
            raise ValueError(f"{name} does not fit 64 bits: {_short(raw)}")
        return value
    if isinstance(raw, (int, float, np.integer, np.floating)) or (isinstance(raw, str) and len(raw) <= 64):
        try:
            value = float(raw)
        except (ValueError, OverflowError):
            raise ValueError(f"{name} must be a number, got {_short(raw)}") from None
        if not math.isfinite(value):
            raise ValueError(f"{name} must be finite, got {_short(raw)}")
        return value
    raise ValueError(f"{name} must be a number, got {_short(raw)}")
