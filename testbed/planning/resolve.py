"""From an experiment's config to a DP-PASGD plan: the one place that turns ``tau = "plan"`` into τ, K, σ.

The bound constants of (12)–(13) come from the config: η = ``dp_pasgd.lr``, X = ``dp_pasgd.batch``,
G = ``dp_pasgd.lipschitz`` or the model's bound, d = the model's parameter count, M = the number of
nodes, δ = ``privacy.delta``; L, λ, ξ², α from ``[plan]`` when given, else estimated from the
training data at θ⁰ (:mod:`testbed.planning.estimate`); d_eff of the noise term from
``[plan] noise_dimension`` (unset: d, the paper's bound). Budgets: C_th = ``budget.cost_units`` in
the unit of ``dp_pasgd.c1``/``c2``; ε_th = ``dp_pasgd.epsilon`` or else ``budget.epsilon``. The σ
calibration of the plan is ``dp_pasgd.calibration``.

Both the runner (``tau = "plan"`` in a run file) and `testbed plan` go through :func:`plan_inputs`
and :func:`make_plan`, so a run and the command line plan the same design for the same file.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from testbed.checked.sections import Config
from testbed.data.federated import FederatedData
from testbed.errors import ConfigError, UserError
from testbed.learning.models import Model
from testbed.planning.dp_pasgd import BoundConstants, Plan, plan
from testbed.planning.estimate import estimate
from testbed.privacy.zcdp import SigmaCalibration
from testbed.streams.rng import GLOBAL, Purpose, stream

#: BoundConstants field → the config key that sets it (for error messages).
_KEYS = {
    "learning_rate": "dp_pasgd.lr", "smoothness": "plan.smoothness", "strong_convexity": "plan.strong_convexity",
    "grad_variance": "plan.grad_variance", "initial_gap": "plan.initial_gap", "lipschitz": "dp_pasgd.lipschitz",
    "batch_sizes": "dp_pasgd.batch", "delta": "privacy.delta", "dimension": "model", "num_devices": "data.num_nodes",
    "noise_dimension": "plan.noise_dimension",
}
#: The [plan] keys that may be estimated.
_ESTIMATED = ("smoothness", "strong_convexity", "grad_variance", "initial_gap")


@dataclasses.dataclass(frozen=True)
class PlanInputs:
    """Everything :func:`testbed.planning.dp_pasgd.plan` needs, with where each constant came from.

    Attributes:
        constants: the bound constants.
        sources: "given" or "estimated" for each of L, λ, ξ², α (by BoundConstants field name).
        cost_budget: C_th per device, in the unit of c1 and c2.
        epsilon: ε_th per device at ``constants.delta``.
        c1, c2: cost of one round and of one local step.
    """

    constants: BoundConstants
    sources: dict[str, str]
    cost_budget: float
    epsilon: float
    c1: float
    c2: float


def plan_inputs(config: Config, model: Model, data: FederatedData) -> PlanInputs:
    """The planning problem the config describes (budgets from ``[budget]``/``[dp_pasgd]``).

    Raises:
        ConfigError: naming the key when a budget is missing or a constant is out of range.
    """
    a = config.dp_pasgd
    if config.budget.cost_units is None:
        raise ConfigError("budget.cost_units", "planning needs the resource budget C_th")
    epsilon = a.epsilon if a.epsilon is not None else config.budget.epsilon
    if epsilon is None:
        raise ConfigError("dp_pasgd.epsilon", "planning needs a privacy target (dp_pasgd.epsilon or budget.epsilon)")
    lipschitz = a.lipschitz if a.lipschitz is not None else model.lipschitz_bound
    if not math.isfinite(lipschitz):
        raise ConfigError("dp_pasgd.lipschitz", f"the {model.name} model has no gradient bound; give the clip norm G")
    given = {name: getattr(config.plan, name) for name in _ESTIMATED}
    sources = {name: "given" if value is not None else "estimated" for name, value in given.items()}
    noise_dim = config.plan.noise_dimension
    if noise_dim is not None:  # unset: the paper's d (BoundConstants' default)
        given["noise_dimension"] = None if noise_dim == "trace" else noise_dim
        sources["noise_dimension"] = "estimated" if noise_dim == "trace" else "given"
    if None in given.values():
        params0 = model.init(stream(config.run.seed, GLOBAL, -1, Purpose.INIT))  # θ⁰ as the runner draws it
        found = estimate(model, data.train, params0, a.batch)
        for name, value in given.items():
            if value is None:
                value = getattr(found, name)
                if value is None:
                    raise ConfigError(f"plan.{name}", f"cannot be estimated for model.kind = {model.name}; give it")
                given[name] = value
    try:
        constants = BoundConstants(
            learning_rate=a.lr, lipschitz=lipschitz, batch_sizes=a.batch, delta=config.privacy.delta,
            dimension=model.num_params, num_devices=data.num_nodes, **given,
        )
    except ValueError as exc:
        field = str(exc).split()[0].removeprefix("BoundConstants.")
        raise ConfigError(_KEYS.get(field, "plan"), str(exc)) from None
    return PlanInputs(constants, sources, float(config.budget.cost_units), float(epsilon), a.c1, a.c2)


def make_plan(inputs: PlanInputs, variant: SigmaCalibration | str) -> Plan:
    """The design of §7 of the paper for ``inputs`` with σ calibration ``variant``.

    Raises:
        UserError: when no plan exists (e.g. C_th below c1 + c2, or (21e) failing at τ = 1).
    """
    try:
        return plan(inputs.constants, inputs.cost_budget, inputs.epsilon, inputs.c1, inputs.c2, variant)
    except ValueError as exc:
        raise UserError(f"plan: {exc}") from None


def plan_record(result: Plan, inputs: PlanInputs) -> dict[str, Any]:
    """A JSON-ready record of a plan and of the constants it was made with (summary["plan"])."""
    constants = dataclasses.asdict(inputs.constants)
    constants["batch_sizes"] = sorted(set(constants["batch_sizes"]))
    return {
        "tau": result.tau, "steps": result.steps, "rounds": result.rounds, "sigma": max(result.sigma),
        "epsilon": result.epsilon_spent, "epsilon_target": result.epsilon_target, "cost": result.cost,
        "cost_budget": result.cost_budget, "c1": inputs.c1, "c2": inputs.c2, "variant": result.variant.value,
        "steps_real": result.steps_real, "tau_real": result.tau_real, "bound": result.bound,
        "feasible": result.feasible, "meets_privacy_target": result.meets_privacy_target,
        "constants": constants, "sources": inputs.sources,
    }


def resolve_plan(config: Config, model: Model, data: FederatedData) -> tuple[Config, dict[str, Any] | None]:
    """Replace ``dp_pasgd.tau = "plan"`` by the planned τ, K (``steps``) and ε target (σ follows from
    them by ``dp_pasgd.calibration``, as the plan's σ does); other configs come back unchanged.

    Returns:
        The resolved config and the plan's record (None when nothing was planned).
    """
    if config.run.algorithm != "dp_pasgd" or config.dp_pasgd.tau != "plan":
        return config, None
    inputs = plan_inputs(config, model, data)
    result = make_plan(inputs, config.dp_pasgd.calibration)
    resolved = config.replace(dp_pasgd={"tau": result.tau, "steps": result.steps, "epsilon": inputs.epsilon})
    return resolved, plan_record(result, inputs)
