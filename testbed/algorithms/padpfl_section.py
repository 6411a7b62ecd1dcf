"""PADPFL's configuration (testbed.algorithms.padpfl): its ``[padpfl]`` section, the impact factors'
schedule a section gives (eq. 51), and the checks across sections and the plan stage that resolves
min_i m_i before the run.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

import numpy as np
from pydantic import Field, field_validator, model_validator

from channel.pathloss import TooManySenders

from testbed.algorithms.aggregate import AggregationOptions
from testbed.algorithms.impact import ImpactSchedule, link_quality_weights, parse_ratios, ratio_weights
from testbed.checked.sections import NonNegative, OnlyWith, Positive, Section
from testbed.errors import ConfigError
from testbed.learning.models import Model
from testbed.topology.scene import SceneKeys, SceneSection

if TYPE_CHECKING:
    from testbed.checked.sections import Config

class ImpactChange(Section):
    """One change of the impact factors (eq. 51): from round index ``after_round`` on (after that
    many aggregations; Table I's scenario 4 switches after the 10th: ``after_round = 10``)."""

    after_round: Positive[int]
    ratios: str | list[NonNegative[float]] | None = None
    """Per-part ratios of the new factors ("1-1-0"), over ``padpfl.parts``."""
    weights: list[NonNegative[float]] | None = None
    """Or the new factor of every node."""

    @model_validator(mode="after")
    def _one(self) -> "ImpactChange":
        if (self.ratios is None) == (self.weights is None):
            raise ValueError("schedule: each change gives ratios or weights, exactly one")
        return self


class PadpflSection(AggregationOptions):
    """PADPFL (adaptive-dp.md): FedProx, clipped noisy uploads (eq. 8), impact-factor aggregation
    (eq. 11, or a robust rule: ``aggregation``) and server noise (eq. 13). ``epsilon`` absent: the
    non-private runs (no noise)."""

    ONLY_WITH = {**AggregationOptions.ONLY_WITH,
                 "score_temperature": (OnlyWith("impact", ("quality_score",)),),
                 "sensitivity": (OnlyWith("local_step", ("sgd",)),),
                 "sample_clip": (OnlyWith("local_step", ("dp_sgd",)),)}

    rounds: Positive[int] = 30
    """T, aggregations (broadcasts)."""
    uploads: Positive[int] | None = None
    """R, the most uploads of one client (R <= T); absent: T."""
    participation: Literal["every_round", "spread"] = "every_round"
    """every_round: all clients upload every round, so R = T (``uploads`` absent or equal to
    ``rounds``); spread: each client uploads in exactly R rounds. Either way a client makes exactly
    the R uploads eq. (8)'s σ_C pays for."""
    local_steps: Positive[int] = 10
    """Local SGD steps of FedProx per round."""
    batch: Positive[int] = 32
    lr: Positive[float] = 0.02
    """The paper's SGD learning rate."""
    mu: NonNegative[float] = 0.01
    """FedProx proximal coefficient μ (not given by the paper)."""
    clip: Positive[float] | None = None
    """B: clip every uploaded weight vector to this L2 norm; needed by a private run."""
    epsilon: Positive[float] | None = None
    """The paper's ε at privacy.delta for the uplink (eq. 8) and the downlink (eq. 13)."""
    min_samples: Positive[int] | None = None
    """min_i m_i of eqs. (8), (13); absent: the smallest node's training set (resolved before the
    run and written to config.toml, so boards get it)."""
    local_step: Literal["sgd", "dp_sgd"] = "sgd"
    """sgd: FedProx by plain mini-batch SGD, the upload's privacy from eq. (8)'s noise on the
    clipped weights (charged at ``sensitivity``); dp_sgd: every local step clips each sample's
    gradient at ``sample_clip`` C, averages over the batch X and adds N(0, σ² I) (DP-SGD, Abadi et
    al.), σ calibrated so the client's steps spend ``epsilon`` at privacy.delta (zCDP, as DP-PASGD's
    eq. 9), each step charged at 2C/X with sampling rate X/m_i; the upload (clipped to B) and the
    broadcast are post-processing of the noised steps: no eq. (8) or (13) noise."""
    sensitivity: Literal["clipped_weights", "paper_eq7"] = "clipped_weights"
    """local_step = "sgd": what one record can change of an upload, which both calibrates eqs. (8),
    (13) and is charged to the ledger. clipped_weights: 2B, true of any two weight vectors clipped
    to B, so of SGD-trained ones; paper_eq7: 2B/m_i (eq. 7), true only under eq. (6)'s assumption
    that a local model is the mean of per-sample minimisers, not of SGD: a paper reproduction's
    setting, refused without ``[privacy] reproduction = true``."""
    sample_clip: Positive[float] | None = None
    """local_step = "dp_sgd": C, the L2 bound each sample's gradient is clipped to."""
    impact: Literal["equal", "given", "data_size", "reliability", "quality_score", "link_quality"] = "equal"
    """equal: p_i = 1/N (NbAFL); given: ``weights`` or ``parts`` with ``ratios`` (the paper's, set by
    hand). Automatic rules (beyond the paper; :class:`Padpfl` says what each reveals):
    data_size: p_i ∝ n_i, the training-set sizes uploaded once in the setup phase;
    reliability: p_i ∝ (a_i + 1)/(d_i + 2), the node's smoothed share of the rounds it was due in
    that it answered so far; quality_score: p = softmax(s/τ) of node-reported scores (the broadcast
    model's accuracy on the node's own data), clipped to [0, 1] and noised with ``score_sigma``
    before they leave the node, each charged to the node's ledger; link_quality: p_i ∝ log2(1 + SNR_i)
    of the client's uplink at its mean channel gain (the ``link_*`` keys; fixed for the run)."""
    link_pathloss: Literal["free_space", "umi", "uma", "scene"] = "umi"
    """link_quality: the uplink's large-scale model (Friis, or TR 38.901 UMi/UMa with shadowing), or
    "scene": each client's link to the server ray traced in the scene of ``link_scene``."""
    link_scene: SceneSection | None = None
    """link_quality with link_pathloss = "scene": the scene, where the clients and the server stand,
    the solver's settings (testbed.topology.scene; absent: the street canyon)."""
    link_area_m: Positive[float] = 200.0
    """link_quality: side of the square the clients are dropped in (the server at its centre), m."""
    link_carrier_hz: Positive[float] = 3.5e9
    link_power_dbm: float = Field(20.0, ge=-50, le=100)
    """link_quality: every client's transmit power, dBm."""
    link_noise_dbm: float = Field(-90.0, ge=-200, le=0)
    """link_quality: the server's receiver noise power, dBm."""
    score_sigma: Positive[float] | None = None
    """quality_score: σ of the Gaussian noise on each reported score (required by that rule)."""
    score_temperature: Positive[float] = 0.1
    """quality_score: τ of the softmax p_i ∝ exp(s_i/τ)."""
    max_weight_share: float = Field(0.5, gt=0.0, le=1.0)
    """The automatic rules (data_size, reliability, quality_score, link_quality): the largest share
    of an aggregation one node may take, whatever it reports; the excess goes to the others in
    proportion (1: no cap). Given and equal factors are the operator's and are not capped."""
    parts: list[Positive[int]] | None = None
    """Clients per part, consecutive node ids (Table I: [20, 20, 20])."""
    ratios: str | list[NonNegative[float]] | None = None
    """Per-client ratio of each part in the paper's notation, "0-1-2" (normalised, §5.3)."""
    weights: list[NonNegative[float]] | None = None
    """The impact factor of every node (Σ = 1)."""
    schedule: list[ImpactChange] = Field(default_factory=list)
    """Changes of the factors after given rounds (eq. 51; scenario 4)."""

    @field_validator("sensitivity", mode="before")
    @classmethod
    def _renamed(cls, value: Any) -> Any:
        """The choices before issue 39 are refused with their new names: "paper" was the default
        and meant eq. (7), which is no longer one without saying so."""
        if value in RENAMED_SENSITIVITIES:
            raise ValueError(f'padpfl.sensitivity: "{value}" is now "{RENAMED_SENSITIVITIES[value]}"'
                             + (" (with [privacy] reproduction = true)" if value == "paper" else ""))
        return value

    @model_validator(mode="after")
    def _consistent(self) -> "PadpflSection":
        if self.uploads is not None and self.uploads > self.rounds:
            raise ValueError(f"padpfl.uploads: R = {self.uploads} exceeds rounds T = {self.rounds}")
        problem = uploads_disagree(self.rounds, self.uploads, self.participation)
        if problem:
            raise ValueError(f"padpfl.uploads: {problem}")
        if self.epsilon is not None and self.clip is None:
            raise ValueError("padpfl.clip: a private run (epsilon) needs the clipping bound B")
        if self.local_step == "dp_sgd" and (self.epsilon is None or self.sample_clip is None):
            raise ValueError('padpfl.sample_clip: local_step = "dp_sgd" needs epsilon and the per-sample clip C')
        if self.impact == "given" and (self.weights is None) == (self.ratios is None):
            raise ValueError('padpfl.impact: "given" needs weights or ratios (with parts), exactly one')
        if self.impact != "given" and (self.weights is not None or self.ratios is not None or self.schedule):
            raise ValueError('padpfl.impact: weights, ratios and schedule need impact = "given"')
        if self.link_scene is not None and self.link_pathloss != "scene":
            raise ValueError('padpfl.link_scene: matters only with link_pathloss = "scene"')
        link_keys = [k for k in ("link_pathloss", "link_area_m", "link_carrier_hz", "link_power_dbm", "link_noise_dbm")
                     if getattr(self, k) != type(self).model_fields[k].default]
        if link_keys and self.impact != "link_quality":
            raise ValueError(f'padpfl.{link_keys[0]}: the link keys are for impact = "link_quality"')
        if (self.impact == "quality_score") != (self.score_sigma is not None):
            raise ValueError('padpfl.score_sigma: the noise of the reported score, given with impact = "quality_score" '
                             "and only then")
        needs_parts = self.ratios is not None or any(c.ratios is not None for c in self.schedule)
        if needs_parts and self.parts is None:
            raise ValueError("padpfl.parts: ratios are per part; give the clients of each part")
        rounds = [c.after_round for c in self.schedule]
        if rounds != sorted(set(rounds)) or any(r >= self.rounds for r in rounds):
            raise ValueError(f"padpfl.schedule: after_round must ascend and stay below rounds = {self.rounds}")
        return self


#: Sensitivity choices before issue 39 → their names now.
RENAMED_SENSITIVITIES = {"paper": "paper_eq7", "worst_case": "clipped_weights"}

#: The sentence a run under eq. (7)'s sensitivity carries in its summary's assumptions and REPORT.
PAPER_EQ7_ASSUMPTION = ("PADPFL's uploads are charged at 2B/m_i (sensitivity = \"paper_eq7\"): under the paper's "
                        "assumption (eq. 6), not a guarantee for SGD")


#: The bandwidth a link_quality scene is traced at (the narrowband coefficient does not depend on it).
SCENE_BANDWIDTH_HZ = 1e6


def uploads_disagree(rounds: int, uploads: int | None, participation: str) -> str | None:
    """Why R = ``uploads`` does not count the uploads a client makes under ``participation`` (None
    when it does). Eq. (8) scales σ_C by R for a client revealed at most R times: a client that
    uploads every round of T > R is revealed T times, each charged at the σ_C of R, and spends
    more than the configured ε (under linear composition T/R times it)."""
    if participation == "every_round" and uploads is not None and uploads != rounds:
        return (f"R = {uploads} but every client uploads in all T = {rounds} rounds (participation = "
                f"\"every_round\"): eq. (8) would pay for {uploads} uploads of {rounds}; omit uploads (R = T) "
                f"or set participation = \"spread\" (each client uploads in exactly R rounds)")
    return None


def schedule_from_section(a: PadpflSection, num_nodes: int, seed: int) -> ImpactSchedule:
    """The impact factors of every round from a ``[padpfl]`` section (``link_quality``: from the
    channel of the run's ``seed``); ConfigError naming the key."""
    def vector(ratios: Any, weights: Any, key: str) -> np.ndarray:
        try:
            if weights is not None:
                return np.asarray(weights, dtype=np.float64)
            if sum(a.parts) != num_nodes:
                raise ConfigError("padpfl.parts", f"{sum(a.parts)} clients in the parts, {num_nodes} nodes in the run")
            return ratio_weights(a.parts, parse_ratios(ratios))
        except ValueError as exc:
            raise ConfigError(key, str(exc)) from None

    if a.impact == "link_quality":
        try:
            return ImpactSchedule([(0, link_quality_weights(
                num_nodes, seed, pathloss=a.link_pathloss, area_m=a.link_area_m, carrier_hz=a.link_carrier_hz,
                power_dbm=a.link_power_dbm, noise_dbm=a.link_noise_dbm,
                scene=SceneKeys.of(a.link_scene or SceneSection(), a.link_carrier_hz, SCENE_BANDWIDTH_HZ, None)
                if a.link_pathloss == "scene" else None))])
        except TooManySenders as exc:
            raise ConfigError("padpfl.link_pathloss", str(exc)) from None
        except ValueError as exc:
            raise ConfigError("padpfl.link_power_dbm", str(exc)) from None
    if a.impact not in ("given",):  # equal, and the placeholder of the automatic rules (set each round)
        return ImpactSchedule([(0, np.full(num_nodes, 1.0 / num_nodes))])
    phases = [(0, vector(a.ratios, a.weights, "padpfl.ratios" if a.weights is None else "padpfl.weights"))]
    phases += [(c.after_round, vector(c.ratios, c.weights, "padpfl.schedule")) for c in a.schedule]
    try:
        return ImpactSchedule(phases)
    except ValueError as exc:
        raise ConfigError("padpfl.weights" if a.weights is not None else "padpfl.schedule", str(exc)) from None


def check(config: "Config") -> None:
    """Constraints across sections: the impact factors fit the run's nodes; eq. (7)'s sensitivity
    only in a run marked as the paper's reproduction."""
    a: PadpflSection = config.padpfl
    schedule_from_section(a, config.data.num_nodes, config.run.seed)
    if a.sensitivity == "paper_eq7" and a.epsilon is not None and not config.privacy.reproduction:
        raise ConfigError("padpfl.sensitivity", '"paper_eq7" (2B/m_i, eq. 7) holds only under eq. (6)\'s assumption, '
                                                "not for SGD; set [privacy] reproduction = true to reproduce the paper")


def assumptions(sections: dict[str, Any]) -> list[str]:
    """The summary's assumptions of a PADPFL run: eq. (7)'s sensitivity, if charged."""
    a: PadpflSection = sections["padpfl"]
    return [PAPER_EQ7_ASSUMPTION] if a.sensitivity == "paper_eq7" and a.epsilon is not None else []


def plan(config: "Config", model: Model, data: Any) -> tuple["Config", dict | None]:
    """Resolve ``min_samples`` from the whole federation's data, so every board gets it."""
    smallest = int(data.train.sizes.min())
    given = config.padpfl.min_samples
    if given is not None and given > smallest:
        raise ConfigError("padpfl.min_samples", f"{given} is above the smallest node's {smallest} training samples: "
                                                "eq. (8) would under-noise it")
    return (config if given is not None else config.replace(padpfl={"min_samples": smallest})), None
