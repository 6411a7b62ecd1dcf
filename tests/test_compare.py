"""`testbed compare` and testbed.reports.compare.compare on sweep tables: pairing by seed, the statistics
against scipy, Holm over several comparisons, which way is better per metric, and the CLI (text and
--json) giving what the function gives."""

import csv
import json

import numpy as np
import pytest
import scipy.stats

from testbed.cli import main
from testbed.reports.compare import compare, format_comparisons, parse_setting
from testbed.reports.stats import holm

SEEDS = (0, 1, 2, 3, 4)
ACCURACY = {1: [0.80, 0.82, 0.79, 0.85, 0.81], 5: [0.75, 0.78, 0.76, 0.80, 0.74], 10: [0.80, 0.83, 0.78, 0.84, 0.82]}
LOSS = {1: [0.40, 0.38, 0.41, 0.35, 0.39], 5: [0.45, 0.43, 0.44, 0.41, 0.46], 10: [0.40, 0.37, 0.42, 0.36, 0.38]}


def write_sweep(folder, accuracy=ACCURACY, loss=LOSS, seeds=SEEDS, lrs=(0.1,)):
    """A sweep.csv as `testbed sweep --grid dp_pasgd.tau=1,5,10 [--grid dp_pasgd.lr=...]` writes it;
    the rows in seed-major order (the table's order must not matter)."""
    folder.mkdir(parents=True, exist_ok=True)
    columns = ["dp_pasgd.tau", "dp_pasgd.lr", "seed", "status", "test_accuracy", "validation_accuracy", "train_loss",
               "epsilon_max", "cost_max", "energy_j_max", "rounds", "tau", "steps", "sigma", "run"]
    with open(folder / "sweep.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, columns)
        writer.writeheader()
        for i, seed in enumerate(seeds):
            for tau in accuracy:
                for lr in lrs:
                    writer.writerow({"dp_pasgd.tau": tau, "dp_pasgd.lr": lr, "seed": seed, "status": "completed",
                                     "test_accuracy": accuracy[tau][i], "validation_accuracy": "",
                                     "train_loss": loss[tau][i], "epsilon_max": 2.0, "cost_max": 900.0,
                                     "energy_j_max": 1.5, "rounds": 9, "tau": tau, "steps": 90, "sigma": 1.0,
                                     "run": f"tau-{tau}_lr-{lr}_seed-{seed}"})
    return folder


@pytest.fixture
def sweep(tmp_path):
    return write_sweep(tmp_path / "sweep")


def test_one_comparison_is_scipys_paired_statistics(sweep):
    (c,) = compare(sweep, {"dp_pasgd.tau": 1}, {"dp_pasgd.tau": 5})
    a, b = np.array(ACCURACY[1]), np.array(ACCURACY[5])
    r = c.result
    assert c.metric == "test_accuracy" and c.higher_is_better and c.seeds == SEEDS and r.n == 5
    assert r.mean == pytest.approx(np.mean(a - b)) and r.sd == pytest.approx(np.std(a - b, ddof=1))
    ref = scipy.stats.ttest_rel(a, b)
    assert r.p_t == pytest.approx(ref.pvalue) and r.p_wilcoxon == pytest.approx(scipy.stats.wilcoxon(a, b).pvalue)
    assert (r.ci_low, r.ci_high) == pytest.approx(tuple(ref.confidence_interval(0.95)))
    assert c.p_t_holm == r.p_t and c.verdict == "a better"  # one comparison: Holm changes nothing


def test_pairs_are_matched_by_seed_not_by_row_order(tmp_path):
    shuffled = write_sweep(tmp_path / "s", seeds=(4, 2, 0, 3, 1))  # the same values, other seeds' order
    (c,) = compare(shuffled, {"tau": 1}, {"tau": 5})
    assert c.seeds == (0, 1, 2, 3, 4)
    (plain,) = compare(write_sweep(tmp_path / "p"), {"tau": 1}, {"tau": 5})
    assert c.result.mean == pytest.approx(plain.result.mean)  # pairs are pairs whichever order
    # A different pairing (a's seeds against b's shifted by one) would give another sd: not this one.
    a, b = np.array(ACCURACY[1]), np.array(ACCURACY[5])
    assert c.result.sd == pytest.approx(np.std(a - b, ddof=1))
    assert c.result.sd != pytest.approx(np.std(a - np.roll(b, 1), ddof=1))


def test_direction_per_metric_and_the_override(sweep):
    acc, loss = compare(sweep, {"tau": 5}, {"tau": 1}, metrics=["test_accuracy", "train_loss"])
    assert (acc.verdict, loss.verdict) == ("b better", "b better")  # tau 5: lower accuracy, higher loss
    assert loss.result.mean > 0 and not loss.higher_is_better
    (flipped,) = compare(sweep, {"tau": 5}, {"tau": 1}, metrics=["train_loss"], higher_is_better=True)
    assert flipped.verdict == "a better"
    (rounds,) = compare(sweep, {"tau": 5}, {"tau": 1}, metrics=["rounds"], higher_is_better=False)
    assert rounds.verdict == "no difference detected (n=5)" and rounds.result.p_t == 1.0


def test_several_comparisons_are_one_holm_family(sweep):
    comparisons = compare(sweep, {"tau": 1}, [{"tau": 5}, {"tau": 10}], metrics=["test_accuracy", "train_loss"])
    assert [(c.b["dp_pasgd.tau"], c.metric) for c in comparisons] == [
        (5, "test_accuracy"), (5, "train_loss"), (10, "test_accuracy"), (10, "train_loss")]
    raw = [c.result.p_t for c in comparisons]
    assert [c.p_t_holm for c in comparisons] == pytest.approx(holm(raw).tolist())
    assert [c.p_wilcoxon_holm for c in comparisons] == pytest.approx(holm([c.result.p_wilcoxon for c in comparisons]).tolist())
    assert all(c.p_t_holm >= c.result.p_t for c in comparisons)
    tau10 = [c for c in comparisons if c.b["dp_pasgd.tau"] == 10]
    assert [c.verdict for c in tau10] == ["no difference detected (n=5)"] * 2


def test_a_difference_within_the_noise_is_not_detected_and_says_what_n_could(tmp_path):
    noisy = {1: [0.80, 0.70, 0.90, 0.75, 0.85], 5: [0.78, 0.74, 0.86, 0.77, 0.82], 10: ACCURACY[10]}
    (c,) = compare(write_sweep(tmp_path / "s", accuracy=noisy), {"tau": 1}, {"tau": 5})
    assert c.verdict == "no difference detected (n=5)" and c.result.ci_low < 0 < c.result.ci_high
    assert c.result.min_detectable > abs(c.result.mean)


def test_a_key_without_its_section_and_values_as_typed(tmp_path):
    folder = write_sweep(tmp_path / "s", lrs=(0.1, 0.5))
    (c,) = compare(folder, parse_setting(["tau=1", "lr=0.10"], "--a"), parse_setting(["dp_pasgd.tau=5", "lr=.1"], "--b"))
    assert c.a == {"dp_pasgd.tau": 1, "dp_pasgd.lr": 0.1} and c.b == {"dp_pasgd.tau": 5, "dp_pasgd.lr": 0.1}


def test_cli_text_and_json_are_the_functions(sweep, capsys):
    argv = ["compare", str(sweep), "--a", "tau=1", "--b", "tau=5", "--b", "tau=10", "--metric", "test_accuracy",
            "--metric", "train_loss"]
    assert main(argv) == 0
    text = capsys.readouterr().out
    comparisons = compare(sweep, {"tau": 1}, [{"tau": 5}, {"tau": 10}], metrics=["test_accuracy", "train_loss"])
    assert text.strip() == format_comparisons(comparisons)
    assert "verdict: a better" in text and "Holm over 4" in text and "smallest effect detectable at 80% power" in text
    assert main(argv + ["--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == [c.as_dict() for c in comparisons]
    assert printed[0]["verdict"] == "a better" and printed[0]["n"] == 5 and printed[0]["seeds"] == list(SEEDS)
    assert {"mean", "ci_low", "ci_high", "p_t", "p_wilcoxon", "p_t_holm", "min_detectable"} <= set(printed[0])


def test_cli_lower_is_better_for_a_metric_without_a_direction(sweep, capsys):
    assert main(["compare", str(sweep), "--a", "tau=1", "--b", "tau=5", "--metric", "tau", "--lower-is-better"]) == 0
    assert "tau (lower is better), 5 pairs by seed" in capsys.readouterr().out


def test_values_by_seed_from_the_sweeps_rows_or_its_table(sweep):
    from testbed.reports.compare import values_by_seed
    from testbed.reports.sweep_stats import read_sweep
    from testbed.reports.verdicts import paired_verdict

    table = read_sweep(sweep)
    typed = [{"dp_pasgd.tau": int(r["dp_pasgd.tau"]), "dp_pasgd.lr": 0.1, "seed": int(r["seed"]),
              "test_accuracy": float(r["test_accuracy"]), "status": r["status"], "run": r["run"]} for r in table]
    for rows in (table, typed):
        a = values_by_seed(rows, {"dp_pasgd.tau": 1}, "test_accuracy")
        b = values_by_seed(rows, {"dp_pasgd.tau": 5}, "test_accuracy")
        assert a == dict(zip(SEEDS, ACCURACY[1])) and b == dict(zip(SEEDS, ACCURACY[5]))
        (c,) = compare(sweep, {"tau": 1}, {"tau": 5})
        v = paired_verdict(a, b, "a>b")
        assert (v.word, v.n, v.effect, v.ci_low, v.ci_high) == ("shown", 5, c.result.mean, c.result.ci_low, c.result.ci_high)


def test_the_rank_test_is_shown_from_eight_seeds_on(tmp_path):
    """Below stats.RANK_TEST_MIN_N pairs the signed-rank p is too coarse to stand beside the t test
    (at n = 5 it cannot go below 0.0625): the text says so instead of printing it."""
    five = format_comparisons(compare(write_sweep(tmp_path / "five"), {"tau": 1}, {"tau": 5}))
    assert "Wilcoxon not shown below n=8 (at n=5 its smallest two-sided p is 0.0625)" in five
    rng = np.random.default_rng(0)
    eight = {tau: (0.8 + 0.01 * tau + 0.01 * rng.standard_normal(8)).round(4).tolist() for tau in (1, 5)}
    loss = {tau: [0.4] * 8 for tau in (1, 5)}
    (c,) = compare(write_sweep(tmp_path / "eight", eight, loss, seeds=tuple(range(8))), {"tau": 1}, {"tau": 5})
    assert f"Wilcoxon {c.result.p_wilcoxon:.3g}" in format_comparisons([c])
