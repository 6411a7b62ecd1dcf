"""The base of every experiment-file section: a frozen, strict pydantic model that refuses unknown
keys and every number outside a range. Each section is declared by the module that uses it (an
algorithm's in its own module) and assembled into the experiment by testbed.assembly.config.

Every number a user types is finite and bounded, whoever declared the field: a field's own bounds
(``Positive``, ``Field(le=...)``) are kept, and a side it leaves open is closed at the base
(:data:`MAX_INT` for integers, :data:`MAX_FLOAT` in magnitude for floats, in lists and optional
fields too), so ``2**70`` never reaches numpy's int64 nor ``1e308`` an overflow; a float that must
be positive is at least :data:`MIN_POSITIVE`, so ``1e-308`` is never inverted. The bounds are part
of the validator, hence of the JSON Schema (``minimum``/``maximum``), and `testbed schema` writes
each field's range into its description.

A key that matters only under another key's choice (``stragglers.p`` under ``model =
"bernoulli"``) says so in its section's :attr:`Section.ONLY_WITH`; set to anything but its default
while that choice is off, it is refused in one line naming both keys, never silently ignored.

Example::

    >>> from typing import Literal
    >>> class Demo(Section):
    ...     ONLY_WITH = {"p": (OnlyWith("model", ("coin",)),)}
    ...     model: Literal["none", "coin"] = "none"
    ...     p: float = 0.0
    >>> Demo(model="coin", p=0.5).p
    0.5
    >>> Demo(p=0.5)
    Traceback (most recent call last):
    ...
    pydantic_core._pydantic_core.ValidationError: 1 validation error for Demo
      Value error, p: matters only with model = "coin"; set that, or leave p out [type=value_error, input_value={'p': 0.5}, input_type=dict]
    ...
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, Callable, ClassVar, Iterable, TypeVar

from pydantic import (AfterValidator, BaseModel, ConfigDict, Field, GetCoreSchemaHandler, GetJsonSchemaHandler, PlainValidator,
                      model_validator)
from pydantic_core import CoreSchema, PydanticCustomError

from testbed.checked.limits import MAX_FLOAT, MAX_INT, MIN_POSITIVE
from testbed.util import jsontext
from testbed.util.userfiles import NAME

T = TypeVar("T")

#: A value > 0.
Positive = Annotated[T, Field(gt=0)]
#: A value >= 0.
NonNegative = Annotated[T, Field(ge=0)]
#: A value in [0, 1].
Fraction = Annotated[float, Field(ge=0, le=1)]


def _name(value: str) -> str:
    if not NAME.fullmatch(value):
        raise ValueError("must be a name of letters, digits, '_', '.', '-' starting with a letter or digit, at most "
                         "64 characters (it names a folder: no '/', '..' or spaces)")
    return value


#: A name that becomes a path component (a run's folder): an identifier (testbed.util.userfiles.NAME).
Name = Annotated[str, AfterValidator(_name)]


@dataclass(frozen=True)
class _Choices:
    """The JSON Schema half of :func:`one_of`: the enum, from the registry when the schema is made."""

    names: Callable[[], Iterable[str]]

    def __get_pydantic_json_schema__(self, schema: CoreSchema, handler: GetJsonSchemaHandler) -> dict[str, Any]:
        out = handler(schema)
        out.update(type="string", enum=list(self.names()))
        return out


def one_of(names: Callable[[], Iterable[str]]) -> Any:
    """A string field whose choices are ``names()`` (a registry's) when a value is checked and when
    the JSON Schema is made, never a list frozen when the section was declared: an entry a plugin or
    a test registers is a choice from then on. A value outside them is refused as a ``Literal``'s is
    (the config's error names the choices)."""
    def check(value: Any) -> str:
        known = list(names())
        if value not in known:
            # In a Literal's words ("'a', 'b' or 'c'"), which the config's errors turn into theirs.
            shown = [repr(name) for name in known]
            expected = f"{', '.join(shown[:-1])} or {shown[-1]}" if len(shown) > 1 else "".join(shown)
            raise PydanticCustomError("literal_error", "Input should be {expected}", {"expected": expected})
        return value
    # The check alone (no str validator first): a number is refused naming the choices, as a Literal's is.
    return Annotated[str, PlainValidator(check), _Choices(names)]


def field_choices(cls: type[BaseModel], name: str) -> list[Any]:
    """The choices field ``name`` of ``cls`` offers now: a registry's (:func:`one_of`) or a
    ``Literal``'s; [] for a field of no fixed choices."""
    from typing import get_args

    field = cls.model_fields[name]
    for meta in field.metadata:
        if isinstance(meta, _Choices):
            return list(meta.names())
    return list(get_args(field.annotation))


@dataclass(frozen=True)
class OnlyWith:
    """A choice under which another key of the same section matters: ``key`` is one of
    ``choices`` (a tuple, or a function giving them when asked: a registry's), or (no choices)
    ``key`` is set to anything but its default."""

    key: str
    choices: tuple[Any, ...] | Callable[[], Iterable[Any]] = ()

    def _choices(self) -> tuple[Any, ...]:
        return tuple(self.choices()) if callable(self.choices) else self.choices

    def holds(self, section: "Section") -> bool:
        value = getattr(section, self.key)
        choices = self._choices()
        return value in choices if choices else value != field_default(type(section), self.key)

    def phrase(self) -> str:
        """The choice in the file's words: ``model = "bernoulli" or "deadline"``, ``mcu set``."""
        choices = self._choices()
        if not choices:
            return f"{self.key} set"
        return f"{self.key} = " + " or ".join(jsontext.dumps(choice) for choice in choices)


def field_default(cls: type[BaseModel], name: str) -> Any:
    """The value field ``name`` of ``cls`` takes when the file leaves it out."""
    return cls.model_fields[name].get_default(call_default_factory=True)


class Section(BaseModel):
    """One ``[table]`` of an experiment file: its fields are the only keys it takes. Strict: a
    string is not a number, a bool is not an integer; an integer is a fine float. Non-finite
    floats are refused."""

    # defer_build: a section's validator is built when first used, so loading an experiment costs
    # only the sections it has, however many algorithms are registered. The fields' docstrings are
    # read only for the JSON Schema (attribute_docstrings): pydantic's use_attribute_docstrings
    # parses every section's source at import, ~60 ms of every run.
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False,
                              defer_build=True)
    #: Key → the choices under which it matters (any one of them); set while none holds, it is refused.
    ONLY_WITH: ClassVar[dict[str, tuple[OnlyWith, ...]]] = {}

    @model_validator(mode="after")
    def _keys_matter(self) -> "Section":
        for name, choices in self.ONLY_WITH.items():
            if getattr(self, name) != field_default(type(self), name) and not any(c.holds(self) for c in choices):
                wanted = " or ".join(c.phrase() for c in choices)
                raise ValueError(f"{name}: matters only with {wanted}; set that, or leave {name} out")
        return self

    @classmethod
    def __get_pydantic_core_schema__(cls, source: Any, handler: GetCoreSchemaHandler) -> CoreSchema:
        # The bounds go into the validator itself (not a check after it), so the JSON Schema has them.
        return close_bounds(handler(source))


class Config(BaseModel):
    """The validated experiment: one attribute per section (``config.run.seed``, ``config.dwfl.lr``).

    Its class is made by testbed.assembly.config from the sections every registry declares (an
    algorithm's, a data set's...). What sits below the config (an algorithm's checks and planning
    hook, the planner) types an experiment and changes one through this base, without importing
    the config, which imports them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    def replace(self, **sections: dict[str, Any]) -> "Config":
        """A copy with some keys changed, e.g. ``config.replace(run={"seed": 3})``, validated as a
        file is (testbed.assembly.config.replace, which the config's class gives this method)."""
        raise NotImplementedError("an experiment's class comes from testbed.assembly.config")


def close_bounds(schema: Any) -> Any:
    """``schema`` (a pydantic core schema) with every integer and float in it bounded on both sides:
    a side a field left open gets ±:data:`MAX_INT` or ±:data:`MAX_FLOAT`, and a float's ``> 0``
    becomes ``>= MIN_POSITIVE``. Changes ``schema`` in place."""
    if isinstance(schema, list):
        for item in schema:
            close_bounds(item)
    elif isinstance(schema, dict):
        limit = {"int": MAX_INT, "float": MAX_FLOAT}.get(schema.get("type"))
        if schema.get("type") == "float" and schema.get("gt") == 0:
            del schema["gt"]
            schema["ge"] = MIN_POSITIVE
        if limit is not None:
            if "le" not in schema and "lt" not in schema:
                schema["le"] = limit
            if "ge" not in schema and "gt" not in schema:
                schema["ge"] = -limit
        for key, value in schema.items():
            if key not in ("metadata", "serialization"):
                close_bounds(value)
    return schema


def attribute_docstrings(cls: type) -> dict[str, str]:
    """Field name → the string literal right after the field in ``cls``'s body (or a base section's),
    as pydantic's ``use_attribute_docstrings`` reads them: the fields' descriptions in the JSON
    Schema, e.g. ``{"eval_every": "Evaluate the model ... every this many rounds ..."}`` for
    :class:`testbed.assembly.config.OutputSection`."""
    import ast
    import inspect
    import textwrap

    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not (isinstance(klass, type) and issubclass(klass, Section)) or klass is Section:
            continue
        try:
            body = ast.parse(textwrap.dedent(inspect.getsource(klass))).body[0].body
        except (OSError, TypeError, SyntaxError):
            continue
        for stmt, after in zip(body, body[1:]):
            if (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and isinstance(after, ast.Expr)
                    and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)):
                docs[stmt.target.id] = inspect.cleandoc(after.value.value)
    return docs
