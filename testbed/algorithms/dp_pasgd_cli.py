"""What the command line needs of DP-PASGD (its registration's hooks): its privacy calculator
`testbed privacy dp-pasgd`, its planner `testbed plan dp-pasgd`, and the local step `testbed
calibrate` times.

`testbed plan dp-pasgd` prints the τ, K and σ of the paper's optimal design (§7; see
testbed.planning) for an experiment file, or without one for Adult-2 logistic regression with the
settings of experiments/dp_pasgd (16 i.i.d. nodes, no bias, X = 512, η = 1) and the paper's
defaults c1 = 100, c2 = 1, δ = 1e-4. Budgets default to the file's ``budget.cost_units`` and ε
target, else to C_th = 1000 and ε = 10 (the setting of the paper's Fig. 2).
"""

from __future__ import annotations

import argparse
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from testbed.algorithms.registry import Command
from testbed.checked.arguments import COUNT, POSITIVE, PROBABILITY, Number, calculator, finite_result
from testbed.checked.limits import MAX_TEXT_FILE_BYTES
from testbed.errors import ConfigError, UserError
from testbed.privacy.statements import DELTA, PrivacyStatement
from testbed.util import jsontext
from testbed.util.userfiles import read_text

#: The experiment planned when no FILE is given.
DEFAULT_EXPERIMENT = """
[data]
dataset = "adult-2"
[model]
kind = "logistic"
bias = false
[dp_pasgd]
batch = 512
lr = 1.0
c1 = 100.0
c2 = 1.0
[privacy]
delta = 1e-4
"""
DEFAULT_COST_BUDGET = 1000.0
DEFAULT_EPSILON = 10.0
#: Flags that set a [plan] constant, by config key: its symbol and its range (those of [plan]).
NON_NEGATIVE = Number(float, ge=0)
CONSTANT_FLAGS = {"smoothness": ("L", POSITIVE), "strong_convexity": ("λ (PL constant)", POSITIVE),
                  "grad_variance": ("ξ²", NON_NEGATIVE), "initial_gap": ("α = L(θ⁰) − L*", NON_NEGATIVE)}


def _privacy_arguments(dp: argparse.ArgumentParser) -> None:
    dp.add_argument("--steps", type=COUNT, required=True, help="K, local steps per device")
    dp.add_argument("--lipschitz", type=POSITIVE, required=True, help="G, per-sample gradient bound")
    dp.add_argument("--batch", type=COUNT, required=True, help="X, mini-batch size")
    dp.add_argument("--delta", type=PROBABILITY, required=True, help="δ")
    group = dp.add_mutually_exclusive_group(required=True)
    group.add_argument("--sigma", type=POSITIVE, help="noise std per coordinate")
    group.add_argument("--epsilon", type=POSITIVE, help="target ε: prints the calibrated σ")
    dp.add_argument("--calibration", choices=["corrected", "paper_literal"], default="corrected",
                    help="σ from ε: the correct root of eq. (9), or eq. (23) as printed (not private)")
    dp.add_argument("--json", action="store_true")


@calculator
def _privacy(args: argparse.Namespace) -> int:
    from testbed.privacy import zcdp

    if args.epsilon is not None:
        sigma = zcdp.dp_pasgd_sigma(args.steps, args.lipschitz, args.batch, args.epsilon, args.delta, args.calibration)
    else:
        sigma = args.sigma
    rho = zcdp.dp_pasgd_rho(args.steps, args.lipschitz, args.batch, sigma)
    eps = zcdp.rho_to_epsilon(rho, args.delta)
    finite_result({"epsilon": eps, "rho": rho, "sigma": sigma})
    if args.json:
        print(jsontext.dumps({"epsilon": eps, "rho": rho, "sigma": sigma, "calibration": args.calibration}))
        return 0
    print(f"sigma    {sigma:.6f}" + (f"  ({args.calibration} calibration for epsilon {args.epsilon:g})"
                                      if args.epsilon is not None else ""))
    print(f"rho      {rho:.6f}  (zCDP, eq. 9)")
    print(f"epsilon  {eps:.6f}  at delta {args.delta:g}")
    if args.epsilon is not None and eps > args.epsilon * (1 + 1e-9):
        print(f"WARNING  {args.calibration} calibration spends epsilon {eps:.4g}, not {args.epsilon:g}")
    return 0


def _plan_arguments(dp: argparse.ArgumentParser) -> None:
    dp.add_argument("file", type=Path, nargs="?", help="experiment file (default: Adult-2 logistic regression)")
    dp.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                    help="override any key of the experiment, e.g. --set dp_pasgd.lr=0.2 (repeatable)")
    dp.add_argument("--cost-budget", type=POSITIVE, help=f"C_th per device (default: budget.cost_units, else "
                                                      f"{DEFAULT_COST_BUDGET:g}); in --cost-unit with --calibration")
    dp.add_argument("--epsilon", type=POSITIVE, help=f"ε_th per device (default: the file's target, else {DEFAULT_EPSILON:g})")
    dp.add_argument("--delta", type=PROBABILITY, help="δ (default: privacy.delta, 1e-4)")
    dp.add_argument("--c1", type=NON_NEGATIVE, help="cost of one round per device (default: dp_pasgd.c1, 100)")
    dp.add_argument("--c2", type=NON_NEGATIVE, help="cost of one local step per device (default: dp_pasgd.c2, 1)")
    dp.add_argument("--calibration", type=Path, help="c1 and c2 from a `testbed calibrate` file")
    dp.add_argument("--cost-unit", choices=["joules", "seconds"], default="joules",
                    help="which costs of the calibration file to plan with (default joules)")
    dp.add_argument("--variant", choices=["corrected", "paper_literal"],
                    help="σ calibration of the plan (default: dp_pasgd.calibration, corrected)")
    for key, (symbol, kind) in CONSTANT_FLAGS.items():
        dp.add_argument("--" + key.replace("_", "-"), type=kind, help=f"{symbol} (default: [plan], else estimated)")
    dp.add_argument("--json", action="store_true", help="print the plan as JSON")


def _overrides(args: argparse.Namespace, raw: dict) -> list[str]:
    """The flags as config overrides (after the user's --set), budgets defaulted where the file has none."""
    out = list(args.overrides)
    cost = args.cost_budget
    if args.calibration is not None:
        if args.c1 is not None or args.c2 is not None:
            raise UserError("--calibration gives c1 and c2; do not also pass --c1/--c2")
        if cost is None:
            raise UserError(f"--cost-budget: give the budget in {args.cost_unit} when planning from a calibration file")
        from testbed.planning.calibration import read_calibration

        c1, c2 = read_calibration(args.calibration).costs(args.cost_unit)
        out += [f"dp_pasgd.c1={c1!r}", f"dp_pasgd.c2={c2!r}"]
    if cost is None and "cost_units" not in raw.get("budget", {}):
        cost = DEFAULT_COST_BUDGET
    has_target = "epsilon" in raw.get("dp_pasgd", {}) or "epsilon" in raw.get("budget", {})
    epsilon = args.epsilon if args.epsilon is not None or has_target else DEFAULT_EPSILON
    for key, value in (("budget.cost_units", cost), ("dp_pasgd.epsilon", epsilon), ("privacy.delta", args.delta),
                       ("dp_pasgd.c1", args.c1), ("dp_pasgd.c2", args.c2)):
        if value is not None:
            out.append(f"{key}={float(value)!r}")
    if args.variant is not None:
        out.append(f"dp_pasgd.calibration={args.variant!r}")
    for key in CONSTANT_FLAGS:
        if getattr(args, key) is not None:
            out.append(f"plan.{key}={getattr(args, key)!r}")
    return out


def _plan(args: argparse.Namespace) -> int:
    from testbed.planning.resolve import make_plan, plan_inputs, plan_record
    from testbed.privacy.zcdp import SigmaCalibration

    if args.file is not None:
        if not args.file.exists():
            raise ConfigError(str(args.file), "experiment file not found")
        try:
            text, source = read_text(args.file, MAX_TEXT_FILE_BYTES, "experiment file"), str(args.file)
        except UserError as exc:
            raise ConfigError(str(args.file), str(exc).removeprefix(f"experiment file {args.file}: ")) from None
    else:
        text, source = DEFAULT_EXPERIMENT, "<built-in Adult-2 experiment>"
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(source, f"not valid TOML: {exc}") from None
    config = args.experiments.load(text, _overrides(args, raw), source=source)
    data, model = args.experiments.data_and_model(config)
    inputs = plan_inputs(config, model, data)
    chosen = SigmaCalibration(config.dp_pasgd.calibration)
    records = {v.value: plan_record(make_plan(inputs, v), inputs) for v in SigmaCalibration}
    result = dict(records[chosen.value])
    unit = args.cost_unit if args.calibration is not None else "cost units"
    result.update(cost_unit=unit, dataset=config.data.dataset, model=config.model.kind,
                  variants={v: {k: r[k] for k in ("tau", "steps", "sigma", "epsilon", "cost")} for v, r in records.items()})
    if args.calibration is not None:
        from testbed.planning.calibration import read_calibration

        cal = read_calibration(args.calibration)
        result["calibration"] = {"file": str(args.calibration), "profile": cal.profile, "model_params": cal.model_params}
    if args.json:
        print(jsontext.dumps(result))
    else:
        print(format_plan(result, model.num_params))
    return 0


def format_plan(result: dict, num_params: int) -> str:
    """The plan of :func:`_plan` as a short table for the terminal."""
    c, src = result["constants"], result["sources"]
    unit = result["cost_unit"]
    lines = [
        f"DP-PASGD plan for {result['dataset']}, {result['model']} "
        f"(d = {c['dimension']}, M = {c['num_devices']}, X = {','.join(map(str, c['batch_sizes']))}, "
        f"eta = {c['learning_rate']:g}, G = {c['lipschitz']:.4g})",
        f"budgets    C_th = {result['cost_budget']:g} {unit} (c1 = {result['c1']:g} per round, c2 = {result['c2']:g} "
        f"per step); epsilon_th = {result['epsilon_target']:g} at delta = {c['delta']:g}",
        "constants  " + "  ".join(f"{name} = {c[key]:.4g} ({src[key]})" for key, name in (
            ("smoothness", "L"), ("strong_convexity", "lambda"), ("grad_variance", "xi^2"), ("initial_gap", "alpha")))
        + (f"  d_eff = {c['noise_dimension']:.4g} ({src['noise_dimension']})" if c.get("noise_dimension") else ""),
        f"plan       tau = {result['tau']}, K = {result['steps']} steps, {result['rounds']} rounds, "
        f"sigma = {result['sigma']:.6g}, cost = {result['cost']:.6g} {unit}, "
        f"epsilon spent = {result['epsilon']:.6g} ({result['variant']})",
        f"           relaxed optimum K* = {result['steps_real']:.4g}, tau* = {result['tau_real']:.4g} (eq. 22); "
        f"bound F = {result['bound']:.4g}",
    ]
    for name, v in result["variants"].items():
        verdict = "meets the target" if v["epsilon"] <= result["epsilon_target"] * (1 + 1e-9) else "NOT private at the target"
        lines.append(f"{name + ':':<15}tau = {v['tau']}, K = {v['steps']}, sigma = {v['sigma']:.6g} "
                     f"-> really spends epsilon {v['epsilon']:.4g} ({verdict})")
    cal = result.get("calibration")
    if cal is not None:
        lines.insert(1, f"costs      from {cal['file']} (profile {cal['profile']}, {unit})")
        if cal["model_params"] != num_params:
            lines.append(f"NOTE       the calibration was measured for {cal['model_params']} parameters; "
                         f"this model has {num_params}")
    return "\n".join(lines)


PRIVACY = Command(help="ε of eq. (9) for σ, or σ for a target ε", arguments=_privacy_arguments, run=_privacy,
                  examples=("--steps 100 --lipschitz 1 --batch 32 --delta 1e-4 --sigma 1",
                            "--steps 100 --lipschitz 1 --batch 32 --delta 1e-4 --epsilon 1 --json"))
PLAN = Command(help="τ, K and σ of DP-PASGD's optimal design (eqs. 22, 24, 9)", arguments=_plan_arguments,
               run=_plan, examples=("", "experiments/quickstart.toml --cost-budget 500 --epsilon 2 --json"))


STATEMENT = PrivacyStatement(
    name="dp_pasgd", title="DP-PASGD",
    unit="record: (ε, δ)-DP of each node's training records",
    adjacency="replace one record of a node's training set (uniform batches: 2G/X per step); with "
              "sampling = \"poisson\", add or remove one record (G/X per step)",
    observers="the server, which receives each node's update after its τ noised steps (observer \"server\"); the "
              "averaged model it broadcasts, and whoever hears that, is post-processing",
    accountant="privacy.accountant (zcdp, the paper's, by default) composes each node's noised steps; the tight "
               "privacy.tight_accountant (rdp by default, pld with Poisson batches) through dp-accounting beside it",
    paper_accountant="zCDP without amplification, eq. (9) (Lemmas 2, 3); calibration = \"paper_literal\" is eq. (23) "
                     "as printed, which spends more than its target (a named erratum)",
    amplification="the tight accountant amplifies each step by its sampling rate X/m_i (without replacement, or "
                  "Poisson); that needs batches the observer cannot know (node secrets), and holds against no one "
                  "holding the seed of an emulated run; the paper's zCDP figure claims none",
    assumptions=("every per-sample gradient has norm <= G: clipped at G (dp_pasgd.clip), or, unclipped, G at least the "
                 "model's own bound on rows of norm <= 1 (the loaders scale rows so); a smaller G without clip is refused",),
    delta=DELTA,
    not_protected=("metadata: which nodes take part and when, their training-set sizes, the size and timing of "
                   "messages",
                   "floating-point side channels of the noise (Mironov 2012): the noise is a rounded float sample"),
    evidence=("tests/test_accountants.py::test_zcdp_over_the_ledger_is_eq9_whatever_tau",
              "tests/test_accountants.py::test_tight_accountants_never_exceed_the_paper_bound",
              "tests/test_models.py::test_stated_lipschitz_bound_holds_on_unit_ball",
              "tests/test_models.py::test_clipping_bounds_every_per_sample_gradient",
              "tests/test_sound_sensitivities.py::test_a_g_below_the_models_own_bound_needs_the_clip_that_enforces_it",
              "tests/test_privacy_zcdp.py::test_check3_paper_literal_eq23_is_flagged_as_not_private",
              "tests/test_privacy_audit.py::test_audit_passes_sound_dp_pasgd_and_catches_noise_for_a_sensitivity_m_times_too_small",
              "tests/test_sound_sensitivities.py::test_a_delta_at_or_above_one_over_m_is_refused_unless_a_reproduction",
              "Hu et al., DP-PASGD, eq. (9) (dp-pasgd.md §2.2-2.3); Balle, Barthe and Gaboardi 2018 (amplification "
              "by subsampling, as dp-accounting implements it)"))

MCU_STATEMENT = PrivacyStatement(
    name="mcu_logistic", title="DP-PASGD on a microcontroller board (logistic regression)",
    unit="record: (ε, δ)-DP of the board's training records",
    adjacency="replace one record (2G/X per step, uniform batches; the board does not clip, so G is the logistic "
              "model's own bound)",
    observers="the server, through the board's host bridge, which keeps the board's ledger (observer \"server\")",
    accountant="as DP-PASGD's, charged by the bridge host before the board steps",
    paper_accountant="as DP-PASGD's (eq. 9)",
    amplification="as DP-PASGD's: the tight accountant's X/m needs batches the observer cannot know; the board "
                  "draws them from a counter-based generator keyed (seed, node, round, BATCH)",
    assumptions=("rows of norm <= 1 after float32 rounding (which can exceed it by a few ulps, so G by as much)",
                 "the firmware computes the step the numpy emulation does, to float32 rounding"),
    delta=DELTA,
    not_protected=("floating-point side channels: the noise is a float32 sample of the board's generator "
                   "(Mironov 2012)",
                   "metadata, as DP-PASGD's"),
    evidence=("tests/test_firmware_golden.py::test_firmware_step_equals_numpy_emulation",
              "tests/test_firmware_bridge.py::test_a_round_on_the_board_equals_sim_and_is_charged",
              "tests/test_models.py::test_stated_lipschitz_bound_holds_on_unit_ball"))
