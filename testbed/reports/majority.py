"""The accuracy of always answering the most common class: what a classifier's accuracy is judged
against (a model at or below it has learned nothing the class frequencies do not give).

The share is the test accuracy of predicting the training split's most common class, averaged over
the nodes as a run's test accuracy is. A run's share is recomputed from its config.toml (the data
and the partition are public draws of the run's seed, so the same rows come back); summary.json does
not record it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np


def majority_share(data: Any) -> float | None:
    """The node-averaged test share of the training split's most common class; None without labels
    or test rows (a regression's targets are not classes)."""
    y_train, test = np.asarray(data.train.y), data.test
    if y_train.size == 0 or np.asarray(test.y).size == 0 or not np.issubdtype(y_train.dtype, np.integer):
        return None
    majority = np.bincount(y_train).argmax()
    bounds = np.asarray(test.offsets)
    shares = [np.mean(test.y[a:b] == majority) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]
    return float(np.mean(shares)) if shares else None


def run_majority_share(run_dir: str | Path) -> float | None:
    """The majority share of a run's test rows, from its config.toml; None for a regression or a run
    without a config."""
    from testbed.assembly.assemble import load_data
    from testbed.assembly.config import load_config

    path = Path(run_dir) / "config.toml"
    if not path.exists():
        return None
    config = load_config(path)
    return majority_share(load_data(config.data, config.run.seed))


def accuracy_flag(accuracy: float, share: float | None) -> str:
    """One run's accuracy against the share: "at or below the majority share" (it shows no learning) or
    "above the majority share (one run: no interval)"; "" without a share. Repeats judge it with an
    interval (testbed.reports.stats.majority_flag)."""
    if share is None:
        return ""
    if accuracy <= share:
        return "at or below the majority share"
    return "above the majority share (one run: no interval)"


_TEST_SHARES: dict[str, tuple[float, float]] = {}


def class_shares_of_test_set(config: Any) -> tuple[float, float]:
    """(chance 1/classes, the pooled share of the test set's most common class) of a classification
    run's config, loaded once per data section and seed (the experiments' tables print both beside
    an accuracy)."""
    from testbed.assembly.assemble import load_data

    key = f"{config.data.model_dump_json()}|{config.run.seed}"
    if key not in _TEST_SHARES:
        data = load_data(config.data, config.run.seed)
        shares = np.bincount(data.test.y, minlength=data.n_classes) / len(data.test.y)
        _TEST_SHARES[key] = (1.0 / data.n_classes, float(shares.max()))
    return _TEST_SHARES[key]
