"""Summaries that cannot mislead (issue 30): a run whose releases carry no noise reports ε = ∞ ("not
private": JSON null) everywhere, never a finite ε; ACFL's headline is its ε-MI-DP in nats; a
regression reports its loss, not an accuracy; the summary table names the ε to quote, where costs
came from and where the run's files are; ``budget.epsilon`` calibrates the noise of an algorithm
that calibrates, and is a config error on a run without noise; the sweep table says which budget
stopped a run.
"""

from __future__ import annotations

import csv
import json
import math
import re

import pytest
from hypothesis import given, strategies as st

from test_algorithm_contract import EXPERIMENTS, _text
from testbed.privacy.secrecy import REPRODUCIBLE
from testbed.util.registrations import plugin_of
from testbed.algorithms import registry
from testbed.assembly import assemble
from testbed.assembly.config import load_config, load_config_text, replace
from testbed.cli.run import format_summary
from testbed.errors import ConfigError
from testbed.orchestration.run_summary import privacy_headline
from testbed.orchestration.runner import run_experiment
from testbed.orchestration.sweep import grid_points, row, run_sweep
from testbed.privacy.secrecy import REPRODUCIBLE
from testbed.reports import headline
from testbed.reports.html import write_report
from testbed.reports.results import read_metrics, read_summary
from testbed.watch.feed import RunFeed

#: The keys that turn each case of the contract's EXPERIMENTS into a run without noise, where the
#: algorithm has one (ACFL's coded upload and DWFL's channel always carry noise).
WITHOUT_NOISE = {
    "dp_pasgd": {"dp_pasgd": {"sigma": 0.0}},
    "fedavg": {},
    "dpsgd": {"dpsgd": {"epsilon": None}},
    "gossip": {"gossip": {"epsilon": None}},
    "padpfl": {"padpfl": {"epsilon": None}},
}
#: A number printed as an ε: "epsilon 1.23", "ε 0.5", "epsilon      0 .. 0".
EPSILON_NUMBER = re.compile(r"(epsilon|ε)\s+[0-9]")


def _variants() -> list[tuple[str, dict]]:
    """(case, overrides) of every registered algorithm as the contract runs it, and without noise."""
    cases = [(name, {}) for name in EXPERIMENTS if "/" not in name]
    cases += [(name, overrides) for name, overrides in WITHOUT_NOISE.items() if overrides]
    return cases


def _config(name: str, overrides: dict):
    config = load_config_text(_text(name))
    if not overrides:
        return config
    raw = {section: {k: v for k, v in getattr(config, section).model_dump().items()} for section in overrides}
    for section, values in overrides.items():
        raw[section].update(values)
        raw[section] = {k: v for k, v in raw[section].items() if v is not None}
    from testbed.assembly.config import build_config, to_dict

    full = to_dict(config, used_only=False)
    full.update(raw)
    return build_config(full)


def test_every_algorithm_is_covered():
    assert {name for name, _ in _variants()} == {n for n in registry.names() if not plugin_of("algorithm", n)}


@pytest.mark.parametrize("case", _variants(), ids=lambda c: f"{c[0]}{'-no-noise' if c[1] else ''}")
def test_a_finite_epsilon_appears_only_in_a_private_run(case, tmp_path):
    """summary.json, metrics.csv, the table, the sweep row, the HTML report and the watch feed."""
    name, overrides = case
    config = replace(_config(name, overrides), output={"figures": True})
    kind = assemble.privacy_guarantee(config)
    result = run_experiment(config, out_dir=tmp_path / "r", quiet=True)
    s = read_summary(result.run_dir)
    dp = kind == "dp"
    assert s["privacy"]["guarantee"] == kind and s["privacy"]["private"] == (kind != "none")
    assert (s["privacy"]["headline"]["value"] is not None) == dp or kind == "mi_dp"
    for node in s["nodes"].values():
        assert (node["epsilon"] is not None) == dp and (node["epsilon_tight"] is None or dp)
        assert all(math.isfinite(e) for e in node["epsilon_by_observer"].values()) and (bool(node["epsilon_by_observer"]) == dp)
    epsilons = [m["epsilon"] for m in read_metrics(result.run_dir)]
    assert all(math.isfinite(e) for e in epsilons) if dp else all(e == math.inf for e in epsilons)
    table = format_summary(s)
    assert bool(EPSILON_NUMBER.search(table)) == dp, table
    # (a reproducible run's secrecy line says its ε is "not private against anyone holding" the seed)
    assert (headline.NOT_PRIVATE in table) == (kind == "none")
    sweep_row = row(grid_points({}, 1, 0)[0], s)
    assert (sweep_row["epsilon_max"] is not None) == dp
    html = write_report(result.run_dir).read_text()
    assert bool(re.search(r"privacy</t[dh]><td>epsilon [0-9]", html)) == dp
    assert (tmp_path / "r" / "figures" / "epsilon.png").exists() == dp
    feed = RunFeed(result.run_dir)
    feed.poll()
    snapshot = json.loads(json.dumps(feed.snapshot(), allow_nan=False))  # JSON as the page gets it
    assert snapshot["budgets"]["guarantee"] == kind
    assert all((n["epsilon"] is not None) == dp and (bool(n["epsilon_by"]) == dp) for n in snapshot["nodes"])
    assert all((m["epsilon"] is not None) == dp for m in snapshot["metrics"])


def _nodes(epsilons: list[float], nats: list[float]) -> dict[str, dict]:
    return {str(i): {"epsilon": e, "epsilon_tight": None, "mi_epsilon_nats": m, "cost_units": 1.0, "energy_j": 0.1,
                     "compute_s": 0.01, "epsilon_by_observer": {"server": e}}
            for i, (e, m) in enumerate(zip(epsilons, nats))}


@given(kind=st.sampled_from(registry.GUARANTEES),
       epsilons=st.lists(st.floats(0, 1e6), min_size=1, max_size=6),
       tight=st.none() | st.floats(0, 1e6), nats=st.floats(0, 1e3))
def test_the_headline_is_finite_iff_its_guarantee_is(kind, epsilons, tight, nats):
    """Whatever a ledger holds, the summary's privacy figures, the table and the sweep row show a
    finite ε exactly for an (ε, δ)-DP run (the tight one, when it ran, with the paper's beside), and
    ε-MI-DP in nats exactly for an ε-MI-DP one."""
    nodes = _nodes(epsilons, [nats] * len(epsilons))
    for node in nodes.values():
        node["epsilon_tight"] = tight
        if kind != "dp":  # as the runner writes them
            node.update(epsilon=None, epsilon_by_observer={}, epsilon_tight=None)
    privacy = privacy_headline(kind, nodes, 1e-4, "zcdp", "rdp")
    summary = {"privacy": privacy, "nodes": nodes, "budgets": {"delta": 1e-4, "accountant": "zcdp", "cost_units": None},
               "final": {"test_accuracy": 0.5, "train_loss": 0.1}, "run_dir": "/r", "status": "completed",
               "algorithm": "a", "mode": "sim", "seed": 0, "rounds": 1}
    quoted = headline.epsilon_to_quote(summary)
    if kind == "dp":
        assert "epsilon_headline" not in privacy  # one figure: privacy.headline
        assert quoted == privacy["headline"]["value"] == (tight if tight is not None else max(epsilons))
        assert privacy["headline"].get("paper_value") == (max(epsilons) if tight is not None else None)
    else:
        assert quoted is None
        assert not EPSILON_NUMBER.search(format_summary(summary))
    if kind == "mi_dp":
        assert privacy["headline"]["value"] == nats
    assert privacy["headline"]["unit"] == {"dp": "at delta 0.0001", "mi_dp": "nats", "none": None}[kind]
    assert (row(grid_points({}, 1, 0)[0], summary)["epsilon_max"] is not None) == (kind == "dp")


# ------------------------------------------------------------------ budget.epsilon: calibrate or refuse


@pytest.mark.parametrize("name,overrides,hint", [
    ("fedavg", {}, "not private"),
    ("dp_pasgd", {"dp_pasgd": {"sigma": 0.0}}, "not private"),
    ("padpfl", {"padpfl": {"epsilon": None}}, "not private"),
    ("acfl", {}, "budget.mi_epsilon"),
])
def test_an_epsilon_budget_on_a_run_without_noise_is_a_config_error(name, overrides, hint):
    config = _config(name, overrides)
    with pytest.raises(ConfigError) as caught:
        replace(config, budget={"epsilon": 4.0})
    assert caught.value.key == "budget.epsilon" and hint in str(caught.value)
    assert "\n" not in str(caught.value)


def test_dwfl_refuses_an_epsilon_budget_it_would_not_calibrate_to():
    config = _config("dwfl", {"dwfl": {"epsilon": None}})
    with pytest.raises(ConfigError, match="dwfl.epsilon"):
        replace(config, budget={"epsilon": 4.0})
    assert replace(_config("dwfl", {}), budget={"epsilon": 40.0}).budget.epsilon == 40.0  # its own ε target: a budget




#: Each case's noise: as the contract runs it, without noise, or (DP-PASGD) with no σ and no ε.
NOISE = {"as given": {}, "none": None, "unset": {"dp_pasgd": {"sigma": None}}}


def _releases_noise(config) -> bool:
    """Whether the built algorithm plans a (ε, δ) release (a GaussianEvent) for any node in its
    first round or its setup (PADPFL's spread uploads: not every node uploads in round 0): the
    ledger's view, not the registration's."""
    from testbed.algorithms.contract import RoundContext
    from testbed.orchestration.runner import load

    data, model = load(config)
    alg = assemble.build_algorithm(config, model, data)
    first = RoundContext.everyone(0, config.run.seed, data.num_nodes)
    events = [e for node in range(data.num_nodes) for e in alg.planned_events(node, first)]
    events += [e for node in range(data.num_nodes) for e in alg.setup_events(node)] if alg.has_setup else []
    return any(e.kind == "privacy" for e in events)


@given(case=st.sampled_from([name for name in EXPERIMENTS if "/" not in name]), noise=st.sampled_from(sorted(NOISE)),
       budget=st.none() | st.floats(0.5, 50.0))
def test_an_epsilon_budget_is_accepted_iff_the_run_releases_noise(case, noise, budget):
    """``budget.epsilon`` is accepted exactly when the run, as built (calibrated to it where the
    algorithm calibrates), releases through (ε, δ) noise; refused in one line naming the key
    otherwise. ACFL (ε-MI-DP) is refused too: its budget is budget.mi_epsilon."""
    overrides = WITHOUT_NOISE.get(case, {}) if noise == "none" else NOISE[noise] if case == "dp_pasgd" else {}
    base = _config(case, overrides)
    if budget is None:
        assert (assemble.privacy_guarantee(base) == "dp") == _releases_noise(base)
        return
    try:
        config = replace(base, budget={"epsilon": budget})
    except ConfigError as exc:
        assert exc.key == "budget.epsilon"
        assert not _releases_noise(base)
        return
    assert _releases_noise(config) and assemble.privacy_guarantee(config) == "dp"


@pytest.mark.parametrize("epsilon,accountant", [(1.0, "zcdp"), (4.0, "rdp")])
def test_an_epsilon_budget_calibrates_dp_pasgd_and_the_run_completes(epsilon, accountant, tmp_path):
    """No σ and no ε in [dp_pasgd]: σ is calibrated to budget.epsilon, the run completes within it,
    and config.toml keeps the budget (not a calibrated copy) so a sweep over it calibrates each point."""
    text = _text("dp_pasgd").replace("sigma = 0.8\n", "")
    config = replace(load_config_text(text), budget={"epsilon": epsilon}, privacy={"accountant": accountant})
    assert config.dp_pasgd.epsilon is None and assemble.privacy_guarantee(config) == "dp"
    result = run_experiment(config, out_dir=tmp_path / "r", quiet=True)
    s = result.summary
    assert s["status"] == "completed" and s["stopped"] is None
    assert s["privacy"]["epsilon_target"] == epsilon
    paper = max(n["epsilon"] for n in s["nodes"].values())  # the run's accountant's, which calibrated σ
    assert paper <= epsilon * (1 + 1e-9)
    if accountant == "zcdp":  # the calibration is the paper's zCDP bound, met exactly
        assert paper == pytest.approx(epsilon, rel=1e-9)
    assert "epsilon" not in load_config(result.run_dir / "config.toml").dp_pasgd.model_dump(exclude_none=True)


def test_the_readmes_sweep_over_budget_epsilon_completes_and_says_what_stopped_a_run(tmp_path):
    """docs/usage.md's sweep (the quickstart over τ and budget.epsilon) completes in every run; a cost
    budget that stops a run is named in stopped_by, empty where none did."""
    base = load_config("experiments/quickstart.toml", ["run.mode='sim'", "output.figures=false"])
    rows = run_sweep(base, grid_points({"dp_pasgd.tau": [10, 30], "budget.epsilon": [1, 4]}, 1, 0), tmp_path / "s",
                     workers=2, quiet=True)
    assert [r["status"] for r in rows] == ["completed"] * 4 and all(r["stopped_by"] == "" for r in rows)
    assert [r["epsilon_max"] for r in rows] == pytest.approx([1, 4, 1, 4], rel=1e-9)
    stopped = run_sweep(base, grid_points({"dp_pasgd.tau": [5, 10]}, 1, 0), tmp_path / "c", workers=2, quiet=True)
    assert [(r["status"], r["stopped_by"]) for r in stopped] == [("stopped_budget", "cost_units"), ("completed", "")]
    with open(tmp_path / "c" / "sweep.csv", newline="") as f:
        assert [r["stopped_by"] for r in csv.DictReader(f)] == ["cost_units", ""]


# ------------------------------------------------------------------ ACFL and regressions


@pytest.mark.parametrize("dataset", ["regression", "synthetic"])
def test_acfl_headlines_its_mi_dp_and_a_regression_its_loss(dataset, tmp_path):
    """ACFL's headline is ε-MI-DP in nats from its mutual-information ledger; on the regression set
    the summary, metrics.csv and the table have no accuracy and show the loss; on a classification
    set (one-hot labels) the accuracy stays."""
    data = ('[data]\ndataset = "regression"\nnum_nodes = 5\nsamples_per_node = 40\ndim = 4\noutputs = 3\n'
            if dataset == "regression" else '[data]\ndataset = "synthetic"\nnum_nodes = 5\nsamples_per_node = 40\ndim = 4\n')
    text = ('[run]\nalgorithm = "acfl"\n' + data + '[model]\nkind = "linear"\nbias = false\n'
            '[acfl]\niterations = 5\nlr = 0.01\nsigma1_sq = 1.0\nsigma2_sq = 1.0\n[privacy]\ntight_accountant = "none"\n')
    result = run_experiment(load_config_text(text), out_dir=tmp_path / "r", quiet=True)
    s = result.summary
    nats = max(n["mi_epsilon_nats"] for n in s["nodes"].values())
    assert nats > 0 and s["privacy"]["headline"] == {"measure": "epsilon-MI-DP", "value": nats, "unit": "nats",
                                                     "by": "mutual-information ledger", "observer": "server",
                                                     "secrecy": REPRODUCIBLE}
    table = format_summary(s)
    assert f"epsilon-MI-DP {nats:.4g} nats" in table
    regression = dataset == "regression"
    assert s["task"] == ("regression" if regression else "classification")
    assert (s["final"]["test_accuracy"] is None) == regression and s["final"]["test_loss"] > 0
    assert ("test acc" in table) != regression and ("test loss" in table) == regression
    with open(result.run_dir / "metrics.csv", newline="") as f:
        assert all((r["test_accuracy"] == "") == regression and r["train_loss"] != "" for r in csv.DictReader(f))


# ------------------------------------------------------------------ the table


@pytest.mark.parametrize("tight", ["rdp", "none"])
def test_the_table_names_the_epsilon_to_quote_the_costs_source_and_the_files(tight, tmp_path):
    config = load_config_text(_text("dp_pasgd").replace('tight_accountant = "none"', f'tight_accountant = "{tight}"'))
    result = run_experiment(config, out_dir=tmp_path / "my run", quiet=True)
    s = result.summary
    table = format_summary(s).splitlines()
    privacy = next(line for line in table if line.startswith("privacy"))
    paper = max(n["epsilon"] for n in s["nodes"].values())
    if tight == "rdp":
        quoted = max(n["epsilon_tight"] for n in s["nodes"].values())
        assert s["privacy"]["headline"]["value"] == quoted < paper and s["privacy"]["headline"]["by"] == "rdp"
        assert f"epsilon {quoted:.4g}" in privacy and "quote this" in privacy and f"zcdp {paper:.4g}" in privacy
    else:
        assert s["privacy"]["headline"]["value"] == paper and "quote" not in privacy
        assert f"epsilon {paper:.4g}" in privacy
    assert "modelled by the host profile" in next(line for line in table if line.startswith("energy"))
    run_dir = str(result.run_dir)
    assert table[-4:] == [f"figures      {run_dir}/figures", f"ledger       {run_dir}/ledger.csv",
                          f"report       {run_dir}/report.html: testbed report '{run_dir}' --html",
                          f"watch        testbed watch '{run_dir}'"]


@pytest.mark.parametrize("source,words", [
    ("modelled", "modelled by the pi-zero-2w profile"),
    ("measured", "measured"),
    ("measured and modelled", "measured on metered nodes, modelled by the pi-zero-2w profile on the others"),
])
def test_the_table_says_measured_or_modelled(source, words):
    assert headline.cost_source({"costs": {"source": source}, "profile": "pi-zero-2w"}) == words


@pytest.mark.parametrize("guarantee,words", [("none", "loss 0.5000 not private"), ("mi_dp", "loss 0.5000 MI-ε 10.05 nats"),
                                             ("dp", "loss 0.5000 ε 0.25")])
def test_the_progress_line_shows_the_runs_own_privacy_figure(guarantee, words):
    import io

    from testbed.accounting.book import LedgerBook
    from testbed.ledger.events import MutualInfoEvent
    from testbed.reports.progress import Progress

    book = LedgerBook([0, 1])
    if guarantee == "mi_dp":
        book.extend([MutualInfoEvent(1, -1, 10.05)])
    out = io.StringIO()
    p = Progress(2, stream=out, guarantee=guarantee)
    for r in (1, 2):
        p.update(r, 0.5, 0.25 if guarantee == "dp" else math.inf, {"epsilon": 0.0, "cost_units": 0, "bytes_total": 0}, book)
    assert out.getvalue().splitlines()[-1].endswith(words)
