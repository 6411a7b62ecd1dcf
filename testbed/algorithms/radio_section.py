"""The radio keys every decentralised algorithm's section shares: transmit power, receiver noise,
bandwidth, fading and path loss, the area the nodes stand in, the carrier.

:class:`RadioSection` is a base, never a ``[table]`` of its own: an algorithm's section subclasses
it and adds its own keys (``[dpsgd]``, ``[gossip]``; testbed.algorithms.gossip). It resolves the
keys into SI units once (:meth:`RadioSection.radio`: a :class:`~testbed.algorithms.dwfl_channel.Radio`;
:meth:`RadioSection.link_budget`: the free-space budget ``[topology] kind = "random_geometric"``
draws its graph from), so every algorithm reads the same radio the same way.

Noise convention (the channel's, dwfl.md §1.2): ``noise_power_w`` is σ_m², the variance per real
entry of a receiver's noise (default 1, DWFL's paper); with ``noise_figure_db`` it is thermal,
k·T·B·NF / 2. A digital link's SNR divides by the complex noise power 2σ_m².

Example::

    >>> s = RadioSection(power_dbm=30.0, noise_figure_db=7.0, bandwidth_hz=1e6, fading="none")
    >>> s.power_w, f"{s.noise_power_w_resolved:.3g}"
    (1.0, '1e-14')
    >>> round(s.link_budget().range_m(snr_threshold_db=10.0))
    22190
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from channel import dbm_to_w, real_noise_variance_w, thermal_noise_power_w
from testbed.algorithms.dwfl_channel import Radio
from testbed.checked.sections import NonNegative, OnlyWith, Positive, Section
from testbed.topology.geometric import LinkBudget
from testbed.topology.scene import SceneKeys, SceneSection

__all__ = ["RadioSection"]


class RadioSection(Section):
    """The radio of a decentralised run. Powers in dBm here, W inside. Channel noise σ_m² per real
    entry: ``noise_power_w`` (default 1) or thermal k·T·B·NF/2 from ``noise_figure_db`` and
    ``bandwidth_hz``, not both."""

    ONLY_WITH = {"k_factor": (OnlyWith("fading", ("rician",)),), "scene": (OnlyWith("pathloss", ("scene",)),)}

    power_dbm: float = Field(60.0, ge=-50, le=100)
    """Every node's transmit power, dBm."""
    noise_power_w: Positive[float] | None = None
    """σ_m², a receiver's noise per real entry, W (absent: 1, or thermal with noise_figure_db)."""
    noise_figure_db: float | None = Field(None, ge=0, le=50)
    """Thermal receiver noise k·T·B·NF over bandwidth_hz, with this noise figure, dB."""
    bandwidth_hz: Positive[float] = 1e6
    """Bandwidth, Hz (the analog symbol rate; a digital link's Shannon rate B log2(1 + SNR))."""
    fading: Literal["rayleigh", "rician", "none"] = "rayleigh"
    """Small-scale fading of each sender's gain, redrawn every coherence_rounds."""
    k_factor: NonNegative[float] = 3.0
    """Rician K, linear."""
    coherence_rounds: Positive[int] | None = None
    """Absent: time-invariant fading; B: redrawn every B rounds."""
    pathloss: Literal["none", "free_space", "umi", "uma", "scene"] = "none"
    """Each sender's large-scale gain toward the centre of the area (free space, TR 38.901 UMi/UMa),
    or "scene": every link ray traced in the sub-table ``scene`` (Sionna RT; docs/scene.md)."""
    scene: SceneSection | None = None
    """With pathloss = "scene": the scene, the nodes' positions, antennas and the solver's settings
    (testbed.topology.scene; absent: the street canyon, nodes on its open ground)."""
    area_m: Positive[float] = 100.0
    """Side of the square the nodes stand in, m (path loss; random_geometric topologies)."""
    carrier_hz: Positive[float] = 2.4e9
    """Carrier frequency, Hz (path loss; random_geometric topologies)."""

    @model_validator(mode="after")
    def _one_noise(self) -> "RadioSection":
        if self.noise_power_w is not None and self.noise_figure_db is not None:
            raise ValueError("noise_figure_db: give noise_power_w or noise_figure_db (thermal noise), not both")
        return self

    @property
    def power_w(self) -> float:
        """P, W."""
        return float(dbm_to_w(self.power_dbm))

    @property
    def noise_power_w_resolved(self) -> float:
        """σ_m² per real entry, W: given, thermal (k·T·B·NF/2) or the paper's 1."""
        if self.noise_figure_db is not None:
            return float(real_noise_variance_w(thermal_noise_power_w(self.bandwidth_hz, self.noise_figure_db)))
        return 1.0 if self.noise_power_w is None else self.noise_power_w

    def radio(self, num_nodes: int, **extra) -> Radio:
        """The :class:`Radio` of these keys for ``num_nodes`` nodes; ``extra``: the algorithm's own
        radio fields (DWFL's ``beta``, ``c_scale``, ``digital_orthogonal``)."""
        return Radio(num_nodes=num_nodes, power_w=self.power_w, noise_power_w=self.noise_power_w_resolved,
                     bandwidth_hz=self.bandwidth_hz, fading=self.fading, k_factor=self.k_factor,
                     coherence_rounds=self.coherence_rounds, pathloss=self.pathloss, area_m=self.area_m,
                     carrier_hz=self.carrier_hz, scene=self.scene_keys(), **extra)

    def link_budget(self) -> LinkBudget:
        """The free-space budget of a link between two nodes (testbed.topology.geometric)."""
        return LinkBudget(power_w=self.power_w, noise_power_w=self.noise_power_w_resolved,
                          carrier_hz=self.carrier_hz, area_m=self.area_m, scene=self.scene_keys())

    def scene_keys(self) -> SceneKeys | None:
        """With pathloss = "scene": what the run's SceneSite is made of (testbed.topology.scene)."""
        if self.pathloss != "scene":
            return None
        return SceneKeys.of(self.scene or SceneSection(), self.carrier_hz, self.bandwidth_hz, self.coherence_rounds)
