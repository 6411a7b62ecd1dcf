"""DWFL's configuration (testbed.algorithms.dwfl): its ``[dwfl]`` section, the check across
sections, and what is built from the section alone: the channel half the channel emulator runs
and the view of the radio the watch page draws.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, model_validator

from testbed.algorithms.dwfl_channel import DwflChannel, RadioView, radio_from_section, topology_from_sections
from testbed.algorithms.radio_section import RadioSection
from testbed.checked.sections import NonNegative, OnlyWith, Positive, field_default
from testbed.errors import ConfigError
from testbed.topology.scene import check_blocks

if TYPE_CHECKING:
    from testbed.checked.sections import Config

VARIANTS = ("A", "B")
CALIBRATIONS = ("with_channel_noise", "artificial_only")
INITS = ("common", "zeros", "independent")


class DwflSection(RadioSection):
    """DWFL (Algorithm 1, eq. 7) and its baselines. Give ``epsilon`` (per-round target at the worst
    receiver, σ² calibrated every fading block) or ``sigma2``, not both (neither: no artificial
    noise). The radio's keys (power, noise, bandwidth, fading, path loss, area, carrier) are
    :class:`~testbed.algorithms.radio_section.RadioSection`'s, shared with the baselines."""

    ONLY_WITH = {**RadioSection.ONLY_WITH, "init_std": (OnlyWith("init", ("independent",)),)}

    scheme: Literal["ota_d2d", "orthogonal_d2d", "ota_central"] = "ota_d2d"
    variant: Literal["A", "B"] = "B"
    """B: realisable; A: the literal eq. (7), subtracting the receiver's own channel noise (an oracle)."""
    rounds: Positive[int] = 100
    batch: Positive[int] = 32
    lr: Positive[float] = 0.1
    """γ."""
    averaging_rate: float = Field(0.5, gt=0, le=1)
    """η."""
    gmax: Positive[float] = 1.0
    """Clipping norm of each node's stochastic gradient."""
    epsilon: Positive[float] | None = None
    """Per-round ε at the worst receiver."""
    sigma2: NonNegative[float] | None = None
    """σ² of the artificial noise, fixed."""
    calibration: Literal["with_channel_noise", "artificial_only"] = "with_channel_noise"
    beta: float = Field(1.0, ge=0, le=1)
    """β = 1 − α, the share of power spent on artificial noise."""
    c_scale: float = Field(1.0, gt=0, le=1)
    orthogonal_link: Literal["analog", "digital"] = "analog"
    init: Literal["common", "zeros", "independent"] = "common"
    init_std: Positive[float] = 0.1

    @model_validator(mode="after")
    def _consistent(self) -> "DwflSection":
        if self.sigma2 is not None and self.epsilon is not None:
            raise ValueError("dwfl.sigma2: give sigma2 or epsilon, not both")
        if self.scheme == "ota_central" and self.init == "independent":
            raise ValueError("dwfl.init: ota_central keeps one model at the server; use common or zeros")
        return self


def channel_from_sections(sections: dict[str, Any], num_nodes: int, seed: int) -> DwflChannel:
    """The channel half alone (the channel emulator's), from the ``[dwfl]`` section."""
    a: DwflSection = sections["dwfl"]
    return DwflChannel(radio=radio_from_section(a, num_nodes), scheme=a.scheme,
                       topology=topology_from_sections(sections, num_nodes, seed))


def view_from_sections(sections: dict[str, Any], num_nodes: int, seed: int) -> RadioView:
    """What the watch page draws of the channel of the ``[dwfl]`` section."""
    return RadioView(radio_from_section(sections["dwfl"], num_nodes), seed)


def check(config: "Config") -> None:
    """An ε budget needs noise the run chose: σ² is calibrated each fading block to the per-round
    ``dwfl.epsilon``, never to the run's ε (``budget.epsilon``), so with neither ``dwfl.epsilon``
    nor ``dwfl.sigma2`` only the channel's noise would be spent against it."""
    a: DwflSection = config.dwfl
    if a.pathloss == "none" and config.topology.kind != "random_geometric":
        # The radio's geometry matters to path loss and to the graph the radio gives, to nothing else.
        for name in ("area_m", "carrier_hz"):
            if getattr(a, name) != field_default(DwflSection, name):
                raise ConfigError(f"dwfl.{name}", 'matters only with pathloss = "free_space", "umi" or "uma" or '
                                                  '[topology] kind = "random_geometric"; set that, or leave it out')
    check_blocks("dwfl", a, config.topology)
    if config.budget.epsilon is not None and a.epsilon is None and a.sigma2 is None:
        raise ConfigError("budget.epsilon", "dwfl does not calibrate its noise to the run's epsilon; set dwfl.epsilon "
                                            "(per round) or dwfl.sigma2, or remove budget.epsilon")
