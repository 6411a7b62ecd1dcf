"""Figures of a run, drawn from its files alone (so `testbed report RUN_DIR` can redraw them)."""

from __future__ import annotations

import functools
import gc
import os
import sys
import threading

from pathlib import Path

from testbed.reports.cost_axis import cost_axis
from testbed.reports.headline import guarantee
from testbed.reports.results import read_metrics, read_summary


#: How a run's figures are written: PNG at 100 dpi, zlib at level 1 (a two-panel figure 122 KB where
#: level 6 made 94 KB, and written in 49 ms where it took 61: the run waits for its last figures).
_SAVED_AS = {"dpi": 100, "pil_kwargs": {"compress_level": 1}}


def draw_figures(run_dir: Path) -> list[Path]:
    """Write RUN_DIR/figures/{progress,cost,epsilon}.png; returns their paths."""
    return draw_progress(run_dir) + draw_epsilon(run_dir)


def remove_stale_figures(folder: Path, drawn: set[str]) -> None:
    """Delete ``folder``'s ``fig_*.png`` not in ``drawn`` (file names): a REPORT's figure of a scenario
    without data, or of an older version, must not outlive the REPORT that no longer shows it."""
    for stale in folder.glob("fig_*.png"):
        if stale.name not in drawn:
            stale.unlink()


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _title(summary: dict) -> str:
    return f"{summary['algorithm']} · {summary['mode']} · seed {summary['seed']} · {summary['status']}"


#: The figures :func:`draw_progress` draws: test accuracy and training loss against these.
PROGRESS_FIGURES = ("progress", "cost")


def draw_progress(run_dir: Path, names: tuple[str, ...] = PROGRESS_FIGURES) -> list[Path]:
    """Test accuracy and training loss against round and against cost spent (cost units, or bytes
    sent for an algorithm without a cost model: testbed.reports.cost_axis; no figure when neither
    grows): RUN_DIR/figures/{progress,cost}.png, those of ``names``."""
    plt = _pyplot()
    run_dir = Path(run_dir)
    summary = read_summary(run_dir)
    rows = read_metrics(run_dir, summary)
    title = _title(summary)
    out = run_dir / "figures"
    out.mkdir(exist_ok=True)
    paths = []

    against = [("round", "communication round", "progress")]
    if "cost" in names and (axis := cost_axis(rows)) is not None:
        against.append((axis["key"], axis["label"], "cost"))
    for x_key, x_label, name in (a for a in against if a[2] in names):
        # Fixed margins, not tight_layout: it re-draws the figure to measure it, doubling the cost.
        fig, (ax_acc, ax_loss) = plt.subplots(1, 2, figsize=(10, 4))
        fig.subplots_adjust(left=0.08, right=0.98, bottom=0.13, top=0.88, wspace=0.25)
        evaluated = [r for r in rows if "train_loss" in r]  # output.eval_every leaves the others blank
        xs = [r[x_key] for r in evaluated]
        scored = [r for r in evaluated if "test_accuracy" in r]  # a regression has no accuracy
        ax_acc.plot([r[x_key] for r in scored], [r["test_accuracy"] for r in scored], marker=".")
        ax_acc.set(xlabel=x_label, ylabel="test accuracy (mean over nodes)")
        if evaluated and not scored:
            ax_acc.set_title("no accuracy: a regression (its loss is beside)")
        ax_loss.plot(xs, [r["train_loss"] for r in evaluated], marker=".", color="tab:red")
        ax_loss.set(xlabel=x_label, ylabel="training loss (eq. 4)")
        for ax in (ax_acc, ax_loss):
            ax.grid(alpha=0.3)
        fig.suptitle(title)
        paths.append(out / f"{name}.png")
        fig.savefig(paths[-1], **_SAVED_AS)
        plt.close(fig)
    return paths


def draw_epsilon(run_dir: Path) -> list[Path]:
    """ε spent per node, by the run's accountant and the tight one: RUN_DIR/figures/epsilon.png; none
    for a run that is not (ε, δ)-DP."""
    plt = _pyplot()
    run_dir = Path(run_dir)
    summary = read_summary(run_dir)
    if guarantee(summary) != "dp":  # no finite ε to draw: not private, or ε-MI-DP (in the summary)
        return []
    title = _title(summary)
    out = run_dir / "figures"
    out.mkdir(exist_ok=True)
    nodes = summary["nodes"]
    ids = list(nodes)
    many = len(ids) > MAX_NODE_BARS
    fig, ax = plt.subplots(figsize=(6, 4) if many else (max(5, min(16, 0.25 * len(ids) + 3)), 4))
    fig.subplots_adjust(left=0.1, right=0.98, bottom=0.13, top=0.9)
    plot_epsilon(ax, ids, [nodes[i]["epsilon"] for i in ids], [nodes[i].get("epsilon_tight") for i in ids],
                 summary["budgets"].get("epsilon"), summary["budgets"]["delta"])
    ax.set_title(title)
    path = out / "epsilon.png"
    fig.savefig(path, **_SAVED_AS)
    plt.close(fig)
    return [path]


#: Past this many nodes the ε figure is a histogram over the nodes, not a bar per node.
MAX_NODE_BARS = 200


def plot_epsilon(ax, ids: list[str], epsilon: list[float], tight: list[float | None], budget: float | None,
                 delta: float) -> None:
    """ε spent per node on ``ax``: a bar per node (the tight accountant's as ticks), or past
    :data:`MAX_NODE_BARS` nodes the distribution over the nodes (a histogram of each accountant)."""
    has_tight = all(t is not None for t in tight)
    label = f"ε spent at δ = {delta:g}"
    if len(ids) > MAX_NODE_BARS:
        ax.hist(epsilon, bins=40, alpha=0.7, label="paper's accountant (zCDP)")
        if has_tight:
            ax.hist(tight, bins=40, histtype="step", color="k", label="tight accountant")
        if budget is not None:
            ax.axvline(budget, color="tab:red", linestyle="--", label=f"budget ε = {budget:g}")
        ax.set(xlabel=label, ylabel=f"nodes (of {len(ids)})")
    else:
        ax.bar(range(len(ids)), epsilon, label="paper's accountant (zCDP)")
        if has_tight:
            ax.plot(range(len(ids)), tight, "k_", markersize=12, label="tight accountant")
        if budget is not None:
            ax.axhline(budget, color="tab:red", linestyle="--", label=f"budget ε = {budget:g}")
        ax.set(xlabel="node", ylabel=label)
        if len(ids) <= 32:
            ax.set_xticks(range(len(ids)), ids)
    ax.legend()


class BackgroundFigures:
    """Draws a run's figures in a child process started with the run.

    Importing matplotlib takes about half a second: the child does it on the other core while the
    rounds run, then draws what it is asked (``progress`` and ``cost`` once the summary is written,
    ``epsilon`` once the tight accountant's ε is in it) while this process finishes.

    Example::

        >>> job = BackgroundFigures()                 # doctest: +SKIP
        >>> job.draw("progress", run_dir)             # doctest: +SKIP
        >>> job.draw("cost", run_dir)                 # doctest: +SKIP
        >>> job.wait()                                # doctest: +SKIP
    """

    def __init__(self) -> None:
        from testbed.util.forked import helper_process

        # A fork of this process where it can: it has numpy and the reports' modules already.
        self._proc = helper_process(__name__, [], name="testbed figures")

    def draw(self, which: str, run_dir: Path) -> None:
        """Ask for the ``which`` ("progress", "cost" or "epsilon") figure of ``run_dir``: each is
        drawn in a fork of its own, all at once."""
        self._proc.stdin.write(f"{which}\t{Path(run_dir).resolve()}\n".encode())
        self._proc.stdin.flush()

    def wait(self) -> str | None:
        """Wait for the figures; None when all were drawn, else the child's last error line."""
        self._proc.stdin.close()
        self._proc.stdout.close()  # it writes nothing there
        err = self._proc.stderr.read()
        if self._proc.wait() != 0:
            return (err.strip().splitlines() or ["the figure process failed"])[-1]
        return None

    def close(self) -> None:
        """Stop the child without waiting for figures (a failed run)."""
        if self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()


def _warm_up(plt) -> None:
    """Draw a throwaway figure with text and save it as PNG: the first figure of a process loads the
    fonts and the PNG writer, a third of its time, done here while the rounds run."""
    import io

    fig, ax = plt.subplots(figsize=(2, 1))
    ax.plot([0, 1], marker=".")
    ax.set(xlabel="x", ylabel="y", title="ε")
    fig.savefig(io.BytesIO(), format="png", **_SAVED_AS)
    plt.close(fig)


def _serve() -> int:
    """``python -m testbed.reports.plots``: import pyplot at once (in a thread at the background
    niceness), then draw each requested figure, each in a fork of this warmed-up process where
    there is fork: the run's last figures (progress, cost, then ε once the tight accountant's is in)
    are drawn on both cores while the run waits for them, not one after the other, and at the
    run's niceness, which a drawer forked from this (serving) thread keeps: at a background
    niceness they waited behind whatever else the machine runs (J1 with the other core kept busy:
    0.38 s of drawing at nice 10). 1 if any failed (its traceback on stderr)."""
    from testbed.util.forked import BACKGROUND_NICENESS, at_niceness

    failed: list[BaseException] = []

    def warm_up() -> None:  # while the rounds run: in their gaps (a thread's niceness is its own)
        at_niceness(BACKGROUND_NICENESS)
        try:
            _warm_up(_pyplot())
        except BaseException as exc:  # noqa: BLE001  raised in the serving thread, which reports it
            failed.append(exc)

    warming: threading.Thread | None = threading.Thread(target=warm_up, name="testbed-figures-warm-up")
    warming.start()
    # Each figure on its own (a figure takes 80-100 ms): three forks keep the two cores busy to the end.
    drawers = {**{name: functools.partial(draw_progress, names=(name,)) for name in PROGRESS_FIGURES},
               "epsilon": draw_epsilon}
    drawing: list[int] = []
    for line in sys.stdin:
        if warming is not None:  # the first figure asked for: drawn at this thread's niceness
            warming.join()
            warming = None
            if failed:
                raise failed[0]
            # What matplotlib made lives as long as this process: a fork's collector then never
            # walks it, and its pages stay shared (each figure's fork: 0.13 s of CPU, 0.01 less).
            gc.freeze()
        which, _, run_dir = line.rstrip("\n").partition("\t")
        if not hasattr(os, "fork"):
            drawers[which](Path(run_dir))
            continue
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # pragma: no cover  (the drawing child)
            code = 1
            try:
                drawers[which](Path(run_dir))
                code = 0
            except BaseException:  # noqa: BLE001  said on stderr, the run reports the last line
                import traceback

                traceback.print_exc()
            finally:
                sys.stderr.flush()
                os._exit(code)
        drawing.append(pid)
    codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in drawing]  # every one waited for
    return int(any(codes))


def serve(argv: list[str]) -> int:
    """The helper process (forked, or ``python -m testbed.reports.plots``): matplotlib imported in
    the background (a thread at testbed.util.forked.BACKGROUND_NICENESS, while the rounds run), the
    figures drawn at the run's own niceness: they are drawn only once the run waits for them."""
    return _serve()


if __name__ == "__main__":
    code = serve(sys.argv[1:])
    # Everything is written: leave without the interpreter's teardown of the libraries (a tenth of a
    # second that the run would wait for).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
