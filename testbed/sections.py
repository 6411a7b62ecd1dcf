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
    # only the sections it has, however many algorithms are registered.
    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False,
                              use_attribute_docstrings=True, defer_build=True)
