"""The model's figures a run reports (metrics.csv, summary.json's ``final``): the training loss of
eq. (4) and the accuracies, each a mean over nodes of the node's own mean, over the evaluated
nodes' rows (testbed.assembly.evaluation: which nodes those are)."""

from __future__ import annotations

from typing import Protocol, Sequence

import numpy as np

from testbed.data.federated import FederatedData, Split
from testbed.learning.models import Model
from testbed.orchestration.run_state import Run
from testbed.util.parallel import fixed_cuts, split_work


def per_node_mean(values: np.ndarray, split: Split) -> np.ndarray:
    """Mean of per-sample ``values`` over each node's rows; (N_total,) → (M,)."""
    sums = np.add.reduceat(values.astype(np.float64), split.offsets[:-1]) if len(values) else np.zeros(0)
    return sums / np.maximum(split.sizes, 1)


#: The evaluated splits, each scored row by row (:func:`per_sample`).
SPLITS = ("train", "test", "validation")
#: The blocks of rows a split is scored in: always these, wherever they are scored. A BLAS product
#: over a block of rows rounds by the block, so each row's numbers are its own only for a given cut.
BLOCKS = 2

#: A split's block of rows to score: (split name, first row, end row).
Block = tuple[str, int, int]


class RowScorer(Protocol):
    """Scores blocks of the evaluated rows in other processes (the sim's node workers, which hold
    them: testbed.orchestration.sim_nodes.SimNodes): for each block, ``model.loss_and_correct`` of
    its rows, the numbers :func:`per_sample` makes of them here."""

    def score_rows(self, model: Model, params: np.ndarray, data: FederatedData,
                   blocks: Sequence[Block]) -> list[tuple[np.ndarray, np.ndarray]] | None:
        """Each block's (loss, correct); None when it cannot (no workers, or not this model and
        these rows): they are scored here."""


def blocks(split: Split) -> list[tuple[int, int]]:
    """The (first row, end row) blocks ``split`` is scored in: :data:`BLOCKS` halves when worth
    splitting (testbed.util.parallel.fixed_cuts), else one."""
    bounds = fixed_cuts(len(split.y), split.x.size, BLOCKS)
    return list(zip(bounds[:-1], bounds[1:]))


def per_sample(model: Model, params: np.ndarray, split: Split) -> tuple[np.ndarray, np.ndarray]:
    """(loss (N,), correct (N,) bool) of one model on every sample of ``split``: its :func:`blocks`
    at once, on this process's threads (testbed.util.parallel)."""
    n = len(split.y)
    loss, correct = np.empty(n), np.empty(n, dtype=bool)

    def work(lo: int, hi: int) -> None:
        loss[lo:hi], correct[lo:hi] = model.loss_and_correct(params, split.x[lo:hi], split.y[lo:hi])

    split_work(n, work, numbers=split.x.size, fixed_parts=BLOCKS)
    return loss, correct


def evaluation_blocks(data: FederatedData) -> list[Block]:
    """Every block of rows :func:`evaluate` scores, split by split."""
    return [(name, lo, hi) for name in SPLITS for lo, hi in blocks(getattr(data, name))]


def _in_rows_dtype(params: np.ndarray, data: FederatedData) -> np.ndarray:
    """The model's parameters in the evaluated rows' dtype: on float32 features in float32 (a
    float64 model would copy them all to float64)."""
    return np.asarray(params, dtype=np.float32) if data.train.x.dtype == np.float32 else params


def _scored(model: Model, params: np.ndarray, data: FederatedData,
            scorer: RowScorer | None) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Split name → (loss, correct) of every row: by ``scorer`` where it can, else here."""
    if scorer is not None:
        jobs = evaluation_blocks(data)
        answers = scorer.score_rows(model, params, data, jobs)
        if answers is not None:
            return {name: (np.concatenate([a[0] for (n, _, _), a in zip(jobs, answers) if n == name]),
                           np.concatenate([a[1] for (n, _, _), a in zip(jobs, answers) if n == name]))
                    for name in SPLITS}
    return {name: per_sample(model, params, getattr(data, name)) for name in SPLITS}


def evaluate(model: Model, params: np.ndarray, data: FederatedData, scorer: RowScorer | None = None
             ) -> dict[str, float]:
    """Training loss of eq. (4) (mean over nodes of each node's mean loss) and accuracies (mean over
    nodes of each node's accuracy, as the paper reports; pooled over all test samples beside it).
    On float32 features (data.dtype) in float32. ``scorer``: where the rows may be scored instead
    of here (the same numbers)."""
    scored = _scored(model, _in_rows_dtype(params, data), data, scorer)
    train_loss, _ = scored["train"]
    test_loss, test_correct = scored["test"]
    _, val_correct = scored["validation"]
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
    run.metrics = evaluate(run.model, run.algorithm.eval_params(run.state), run.eval_data, run.scorer)
    if run.regression:  # a regression reports its loss (squared error) only: no accuracy to show
        run.metrics.update(dict.fromkeys(ACCURACIES, None))
    run.evaluated_at = run.rounds_done
