"""The base of every experiment-file section: a frozen, strict pydantic model that refuses unknown
keys. Each section is declared by the module that uses it (an algorithm's in its own module) and
assembled into the experiment by testbed.config.

Example::

    >>> from pydantic import Field
    >>> class Demo(Section):
    ...     rounds: Positive[int] = 3
    >>> Demo(rounds=5).rounds
    5
"""

from __future__ import annotations

from typing import Annotated, TypeVar

from pydantic import BaseModel, ConfigDict, Field

T = TypeVar("T")

#: A value > 0.
Positive = Annotated[T, Field(gt=0)]
#: A value >= 0.
NonNegative = Annotated[T, Field(ge=0)]
#: A value in [0, 1].
Fraction = Annotated[float, Field(ge=0, le=1)]


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


def attribute_docstrings(cls: type) -> dict[str, str]:
    """Field name → the string literal right after the field in ``cls``'s body (or a base section's),
    as pydantic's ``use_attribute_docstrings`` reads them: the fields' descriptions in the JSON
    Schema, e.g. ``{"eval_every": "Evaluate the model ... every this many rounds ..."}`` for
    :class:`testbed.config.OutputSection`."""
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
