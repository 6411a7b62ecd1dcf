"""DP-PASGD's configuration (testbed.algorithms.dp_pasgd): its ``[dp_pasgd]`` and ``[plan]``
sections, the guarantee and ε calibration they imply, the checks across sections (the model's
gradient bound, the microcontroller boards, planning's budgets) and the plan stage of
``tau = "plan"``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from pydantic import model_validator

from testbed.algorithms.aggregate import AggregationOptions
from testbed.checked.sections import NonNegative, Positive, Section
from testbed.errors import ConfigError
from testbed.learning.models import Model

if TYPE_CHECKING:
    from testbed.checked.sections import Config


class DpPasgdSection(AggregationOptions):
    """DP-PASGD (eqs. 7a–7b). Give ``sigma`` (noise std; 0 is plain PASGD) or ``epsilon`` (σ
    calibrated for ``steps`` by ``calibration``), not both. ``tau = "plan"``: τ, ``steps`` K and σ
    come from the optimal design of §7 of the paper for ``budget.cost_units`` and the ε target
    (``epsilon`` or ``budget.epsilon``), with the bound constants of ``[plan]``."""

    steps: Positive[int] = 100
    """K, local steps per node in the whole run; a multiple of tau."""
    tau: Positive[int] | Literal["plan"] = 10
    """Local steps between averagings (1: DP-SGD), or "plan"."""
    batch: Positive[int] = 32
    """Mini-batch size X."""
    lr: Positive[float] = 0.1
    """Learning rate η."""
    sigma: NonNegative[float] | None = None
    """Noise std σ per coordinate."""
    epsilon: Positive[float] | None = None
    """Target ε at privacy.delta after K steps (σ calibrated)."""
    calibration: Literal["corrected", "paper_literal"] = "corrected"
    """corrected: eq. (9) solved exactly; paper_literal: eq. (23) as printed (not private at the target)."""
    clip: bool = False
    """Clip per-sample gradients at lipschitz (not in the paper)."""
    lipschitz: Positive[float] | None = None
    """G of the sensitivity 2G/X; default: the model's own bound, or the clip norm. Without
    ``clip`` nothing enforces it, so a G below the model's own per-sample bound is refused."""
    sampling: Literal["uniform", "poisson"] = "uniform"
    c1: NonNegative[float] = 100.0
    """Cost units per round (eq. 8)."""
    c2: NonNegative[float] = 1.0
    """Cost units per local step (eq. 8)."""
    bound_updates: bool = True
    """Refuse (over MQTT) an update farther from the model than an honest node can move it:
    η τ G + η σ sqrt(τ) (sqrt(P) + 10) (exceeded by honest noise with probability < e^-50)."""

    @model_validator(mode="after")
    def _consistent(self) -> "DpPasgdSection":
        if self.tau != "plan" and self.steps % self.tau:
            raise ValueError(f"dp_pasgd.steps: K = {self.steps} is not a multiple of tau = {self.tau}")
        if self.sigma is not None and self.epsilon is not None:
            raise ValueError("dp_pasgd.sigma: give sigma or epsilon, not both")
        if self.clip and self.lipschitz is None:
            raise ValueError("dp_pasgd.lipschitz: clipping needs the clip norm G (dp_pasgd.lipschitz)")
        return self


class PlanSection(Section):
    """Constants of the DP-PASGD bound (12)–(13) for ``dp_pasgd.tau = "plan"`` and `testbed plan`;
    a missing one is estimated from the data at θ⁰ (testbed.planning.estimate)."""

    smoothness: Positive[float] | None = None
    """L."""
    strong_convexity: Positive[float] | None = None
    """λ."""
    grad_variance: NonNegative[float] | None = None
    """ξ²."""
    initial_gap: NonNegative[float] | None = None
    """α = L(θ⁰) − L*."""
    noise_dimension: Positive[float] | Literal["trace"] | None = None
    """d_eff, the dimension the noise term of B (13) is charged with: unset = the parameter count d
    (the paper); "trace" = tr(H̄)/L from Böhning's matrix bound (logistic models); or a number."""


def check_lipschitz(sections: dict[str, Any], model: Model) -> None:
    """Refuse (naming dp_pasgd.lipschitz) a G below the model's own per-sample gradient bound on
    unit-norm rows in a private run without ``clip``: nothing would hold the gradients to it, and
    the sensitivity 2G/X charged would under-count."""
    a: DpPasgdSection = sections["dp_pasgd"]
    bound = model.lipschitz_bound
    # The bound is sqrt(2)·sqrt(2) = 2.0000000000000004 for a logistic model with a bias: 2 typed is at it.
    if a.lipschitz is not None and not a.clip and a.lipschitz < bound * (1 - 1e-12) and guarantee(sections) == "dp":
        raise ConfigError("dp_pasgd.lipschitz", f"G = {a.lipschitz:g} is below the model's own per-sample gradient "
                                                f"bound {bound:.6g} and, without clip = true, nothing holds the "
                                                "gradients to it: the sensitivity 2G/X would under-count; set "
                                                "clip = true, or a G of at least the bound")


def guarantee(sections: dict[str, Any]) -> str:
    """"dp" when the uploads are noised (σ > 0, or σ calibrated from an ε target), else "none"
    (σ = 0: plain PASGD)."""
    a: DpPasgdSection = sections["dp_pasgd"]
    return "dp" if a.epsilon is not None or a.tau == "plan" or (a.sigma or 0) > 0 else "none"


def calibrate(sections: dict[str, Any], epsilon: float) -> dict[str, Any]:
    """The run's ε budget as the ε target σ is calibrated to (eq. 9, ``calibration``), when the
    section sets neither σ nor ε; unchanged otherwise."""
    a: DpPasgdSection = sections["dp_pasgd"]
    if a.sigma is not None or a.epsilon is not None:
        return sections
    return {**sections, "dp_pasgd": a.model_copy(update={"epsilon": float(epsilon)})}


def check(config: "Config") -> None:
    """Constraints across sections: planning needs budgets; the model's gradient bound."""
    a = calibrate({"dp_pasgd": config.dp_pasgd}, config.budget.epsilon)["dp_pasgd"] \
        if config.budget.epsilon is not None else config.dp_pasgd
    if a.tau == "plan":
        if config.budget.cost_units is None:
            raise ConfigError("budget.cost_units", 'tau = "plan" needs the resource budget C_th')
        if a.epsilon is None and config.budget.epsilon is None:
            raise ConfigError("dp_pasgd.epsilon", 'tau = "plan" needs a privacy target (dp_pasgd.epsilon or budget.epsilon)')
        if a.sigma is not None:
            raise ConfigError("dp_pasgd.sigma", 'tau = "plan" chooses sigma; remove it')
    if config.model.kind == "svm" and config.data.n_classes != 2 and config.data.dataset == "synthetic":
        raise ConfigError("model.kind", "the linear SVM is binary; set data.n_classes = 2")
    mcu = config.nodes.mcu
    if mcu:
        if max(mcu) >= config.data.num_nodes:
            raise ConfigError("nodes.mcu", f"node {max(mcu)} is not a node of the run (data.num_nodes = {config.data.num_nodes})")
        if config.model.kind != "logistic" or not config.model.bias:
            raise ConfigError("nodes.mcu", "a microcontroller board runs logistic regression with a bias")
        if a.clip or a.sampling != "uniform":
            raise ConfigError("nodes.mcu", "a microcontroller board runs uniform batches without clipping")
    if config.model.kind in ("mlp", "torch") and guarantee({"dp_pasgd": a}) == "dp" and not a.clip:
        raise ConfigError("dp_pasgd.clip", f"the {config.model.kind} model has no per-sample gradient bound; "
                                           "a private run must clip (dp_pasgd.clip = true, dp_pasgd.lipschitz = C)")


def plan(config: "Config", model: Model, data: Any) -> tuple["Config", dict | None]:
    from testbed.planning.resolve import resolve_plan

    return resolve_plan(config, model, data)


def planned_rounds(section: DpPasgdSection) -> int | None:
    """K // τ communication rounds (eq. 8), once the plan stage has set τ (``tau = "plan"``)."""
    steps, tau = section.steps, section.tau
    return steps // tau if isinstance(steps, int) and isinstance(tau, int) and tau > 0 else None
