"""What every meter is: a :class:`Meter` opens a :class:`Span` over an interval and reports its
:class:`Measurement`; :class:`MeterUnavailable` says why a meter cannot work here."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Measurement:
    """The cost of one interval.

    Attributes:
        seconds: CPU seconds of this process (board seconds for a modelled emulated board).
        energy_j: joules over the interval.
        measured: True when a meter gave the joules, False when a model did.
        source: which meter, e.g. "rapl:package-0", "ina260@0x40", "model:pi-4b".
    """

    seconds: float
    energy_j: float
    measured: bool
    source: str


class MeterUnavailable(Exception):
    """This meter cannot work here; the message says why."""


class Span:
    """One measured interval; ``result`` is set when the ``with`` block ends."""

    def __init__(self, meter: Meter):
        self._meter = meter
        self.result: Measurement | None = None

    def __enter__(self) -> Span:
        self._state = self._meter._begin()
        self._cpu0 = time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        cpu_s = time.process_time() - self._cpu0
        self.result = self._meter._end(self._state, cpu_s)


class Meter:
    """Base class: ``measure()`` opens a Span; subclasses read energy in ``_begin``/``_end``."""

    kind = ""
    measured = True

    @property
    def source(self) -> str:
        return self.kind

    def measure(self) -> Span:
        """A context manager measuring its block: ``with meter.measure() as s: ...; s.result``."""
        return Span(self)

    def close(self) -> None:
        """Release the meter's device, if any."""

    def _begin(self) -> Any:
        return None

    def _end(self, state: Any, cpu_s: float) -> Measurement:
        raise NotImplementedError
