"""The model's figures a run reports (metrics.csv, summary.json's ``final``): the training loss of
eq. (4) and the accuracies, each a mean over nodes of the node's own mean, over the evaluated
nodes' rows (testbed.assembly.evaluation: which nodes those are)."""

from __future__ import annotations

import numpy as np

from testbed.data.federated import FederatedData, Split
from testbed.learning.models import Model
from testbed.orchestration.run_state import Run
from testbed.util.parallel import split_work


def per_node_mean(values: np.ndarray, split: Split) -> np.ndarray:
    """Mean of per-sample ``values`` over each node's rows; (N_total,) → (M,)."""
    sums = np.add.reduceat(values.astype(np.float64), split.offsets[:-1]) if len(values) else np.zeros(0)
    return sums / np.maximum(split.sizes, 1)


def per_sample(model: Model, params: np.ndarray, split: Split) -> tuple[np.ndarray, np.ndarray]:
    """(loss (N,), correct (N,) bool) of one model on every sample of ``split``: two halves of the
    rows at once (testbed.util.parallel). Always the same halves, whatever the threads: the
    product of a block of rows with the model rounds by the block, so each row's numbers are its
    own only for a given cut."""
    n = len(split.y)
    loss, correct = np.empty(n), np.empty(n, dtype=bool)

    def work(lo: int, hi: int) -> None:
        loss[lo:hi], correct[lo:hi] = model.loss_and_correct(params, split.x[lo:hi], split.y[lo:hi])

    split_work(n, work, numbers=split.x.size, fixed_parts=2)
    return loss, correct


def evaluate(model: Model, params: np.ndarray, data: FederatedData) -> dict[str, float]:
    """Training loss of eq. (4) (mean over nodes of each node's mean loss) and accuracies (mean over
    nodes of each node's accuracy, as the paper reports; pooled over all test samples beside it).
    On float32 features (data.dtype) in float32: a float64 model would copy them all to float64."""
    if data.train.x.dtype == np.float32:
        params = np.asarray(params, dtype=np.float32)
    train_loss, _ = per_sample(model, params, data.train)
    test_loss, test_correct = per_sample(model, params, data.test)
    _, val_correct = per_sample(model, params, data.validation)
    return {
        "train_loss": float(per_node_mean(train_loss, data.train).mean()),
        "test_loss": float(per_node_mean(test_loss, data.test).mean()),
        "test_accuracy": float(per_node_mean(test_correct, data.test).mean()),
        "test_accuracy_pooled": float(test_correct.mean()),
        "validation_accuracy": float(per_node_mean(val_correct, data.validation).mean()),
    }


#: The accuracies of :func:`evaluate`: meaningless for a regression (its targets are not labels).
ACCURACIES = ("test_accuracy", "test_accuracy_pooled", "validation_accuracy")


def is_regression(data: FederatedData) -> bool:
    """Whether the task is a regression: its targets are real vectors, not class labels."""
    return not np.issubdtype(data.test.y.dtype, np.integer)


def evaluate_run(run: Run) -> None:
    """The model of ``run.state`` evaluated into ``run.metrics``, at ``run.rounds_done``."""
    run.metrics = evaluate(run.model, run.algorithm.eval_params(run.state), run.eval_data)
    if run.regression:  # a regression reports its loss (squared error) only: no accuracy to show
        run.metrics.update(dict.fromkeys(ACCURACIES, None))
    run.evaluated_at = run.rounds_done
