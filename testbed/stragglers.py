"""Emulated stragglers: which nodes miss a round (placeholder section; the models land with the
straggler work)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from testbed.sections import NonNegative, Positive, Section


class StragglersSection(Section):
    model: Literal["none", "bernoulli", "deadline"] = "none"
    """none: nobody straggles by emulation; bernoulli: node i misses round t with probability p;
    deadline: a node misses the round when its modelled round time exceeds deadline_s."""
    p: float = Field(0.0, ge=0, lt=1)
    """bernoulli: probability that a node misses a round."""
    deadline_s: Positive[float] | None = None
    """deadline: the round's deadline, s."""
    jitter_sigma: NonNegative[float] = 0.25
    """deadline: sigma of the lognormal jitter on the modelled round time."""

    @model_validator(mode="after")
    def _deadline_given(self) -> "StragglersSection":
        if self.model == "deadline" and self.deadline_s is None:
            raise ValueError("stragglers.deadline_s: model = \"deadline\" needs deadline_s")
        return self
