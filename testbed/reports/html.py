"""`testbed report RUN_DIR --html`: one self-contained ``report.html`` of a run or of a sweep folder.

Everything is inside the file: figures as PNG data URIs (drawn by matplotlib, as `testbed report`
draws them), the style inline, no script, no remote resource. It is what one attaches to an e-mail
or puts in a paper's artefact.

A run's report: the summary, the per-node table (ε per observer against the budget, the tight
accountant's ε, joules, cost units, bytes, rounds), the figures, where the nodes stood when the run
recorded it (a radio-placed graph: testbed.topology.placement; in a scene, at their scene positions)
and the configuration (config.toml).
A sweep folder's (it holds ``sweep.csv``): the sweep table, one row per run, each grid point's
statistics over its repeats (testbed.reports.sweep_stats), and its figures (final test accuracy against ε
spent; every run's accuracy against round; each point's mean final metrics with interval bars and
mean curves against round with interval bands: testbed.reports.sweep_figures).
"""

from __future__ import annotations

import base64
import html
import io
import math
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Sequence

from testbed.checked.limits import MAX_TEXT_FILE_BYTES
from testbed.errors import UserError
from testbed.reports import headline
from testbed.reports.majority import accuracy_flag, run_majority_share
from testbed.reports.plots import _pyplot, draw_figures
from testbed.reports.results import read_metrics, read_summary
from testbed.reports.scene_picture import placement_figure
from testbed.reports.startup import time_text
from testbed.reports.sweep_figures import interval_figures
from testbed.reports.sweep_stats import grid_keys, read_sweep, stats_rows
from testbed.util.dirlock import DirectoryLock
from testbed.util.userfiles import read_text

_STYLE = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; max-width: 1200px; margin: 0 auto;
       padding: 16px 24px; color: #111; }
h1 { font-size: 24px; margin-bottom: 2px; } h2 { font-size: 18px; margin-top: 28px; border-bottom: 1px solid #ddd; }
.meta { color: #666; }
table { border-collapse: collapse; font-variant-numeric: tabular-nums; margin: 8px 0; }
th, td { border-bottom: 1px solid #e3e3e3; padding: 3px 10px; text-align: right; white-space: nowrap; }
th { background: #f3f3f3; } td.left, th.left { text-align: left; }
.over { color: #c62828; font-weight: 600; }
img { max-width: 100%; border: 1px solid #e3e3e3; border-radius: 6px; margin: 6px 0; }
pre { background: #f6f6f6; padding: 10px; border-radius: 6px; overflow-x: auto; font-size: 12px; }
.wide { overflow-x: auto; }
.status { display: inline-block; padding: 1px 10px; border-radius: 10px; background: #eee; font-size: 14px; }
"""


def write_report(path: Path) -> Path:
    """Write ``path``/report.html for a run directory (summary.json) or a sweep folder (sweep.csv);
    returns its path. UserError naming the folder if it is neither."""
    path = Path(path)
    if (path / "summary.json").exists():
        what, body_of = "run directory", _run_body
    elif (path / "sweep.csv").exists():
        what, body_of = "sweep folder", _sweep_body
    else:
        raise UserError(f"{path} has neither summary.json (a run) nor sweep.csv (a sweep folder)")
    with DirectoryLock(path, what):  # refused while a run or a sweep writes the folder: one writer
        body, title = body_of(path)
        stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        page = (f'<!doctype html>\n<html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
                f"<style>{_STYLE}</style></head><body>{body}"
                f'<p class="meta">written by testbed report --html on {stamp}</p></body></html>\n')
        out = path / "report.html"
        out.write_text(page, encoding="utf-8")
    return out


# ---------------------------------------------------------------------------------------- pieces


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _num(value: Any) -> str:
    if value is None or value == "":
        return "–"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, (int, float)):
        if isinstance(value, float) and not math.isfinite(value):
            return str(value)
        return f"{value:.4g}" if isinstance(value, float) else str(value)
    return _e(value)


def _table(headers: Sequence[str], rows: Iterable[Sequence[str]], left: int = 1) -> str:
    """An HTML table; cells are HTML already (escaped by the caller); the first ``left`` columns
    align left."""
    align = lambda i: ' class="left"' if i < left else ""  # noqa: E731
    head = "".join(f"<th{align(i)}>{_e(h)}</th>" for i, h in enumerate(headers))
    body = "".join("<tr>" + "".join(f"<td{align(i)}>{c}</td>" for i, c in enumerate(r)) + "</tr>" for r in rows)
    return f'<div class="wide"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>'


def _image(png: bytes, alt: str) -> str:
    return f'<img alt="{_e(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


def _figure_png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    _pyplot().close(fig)
    return buf.getvalue()


def _spent(value: float | None, limit: float | None) -> str:
    """A spent amount, red past its budget."""
    text = _num(value)
    return f'<span class="over">{text}</span>' if limit and value is not None and value > limit else text


# ------------------------------------------------------------------------------------------- run


def _majority_row(run_dir: Path, s: dict[str, Any]) -> list[tuple[str, str]]:
    """The row that says whether the final accuracy is above the test set's majority share."""
    accuracy = s.get("final", {}).get("test_accuracy")
    if accuracy is None or s.get("task") == "regression":
        return []
    share = run_majority_share(run_dir)
    if share is None:
        return []
    return [("majority share", _e(f"{share:.4f}: the final accuracy is {accuracy_flag(float(accuracy), share)}"))]


def _run_body(run_dir: Path) -> tuple[str, str]:
    s = read_summary(run_dir)
    b = s["budgets"]
    title = f"{s.get('name', run_dir.name)}: {s['algorithm']} · {s['mode']} · seed {s['seed']}"
    stopped = s.get("stopped")
    status = s["status"] + (f" (node {stopped['node']} would spend {stopped['budget']} {stopped['would_be']:.6g} "
                            f"> {stopped['limit']:.6g})" if stopped else "")
    nodes = s["nodes"]
    facts = [
        ("status", _e(status)), ("run directory", _e(s.get("run_dir", run_dir))),
        ("algorithm", _e(s["algorithm"])), ("mode", _e(s["mode"])), ("seed", _num(s["seed"])),
        ("dataset, model", _e(f"{s.get('dataset', '?')}, {s.get('model', '?')}")),
        ("nodes", _num(len(nodes))), ("rounds", _num(s["rounds"])),
        ("model", _e(headline.score_text(s))), *_majority_row(run_dir, s),
        ("ε to quote", _e(headline.quote_text(s))),
        ("privacy", _e(headline.privacy_text(s))),
        *(("against", _e(line)) for line in headline.guarantee_lines(s)),
        ("seconds and joules", _e(headline.cost_source(s))),
        ("budgets", _e(", ".join(f"{k} {v:g}" for k, v in b.items()
                                 if k not in ("delta", "accountant") and v is not None) or "none")),
        ("device profile", _e(s.get("profile", "host"))), ("time", _e(time_text(s))),
    ]
    if s.get("assumptions"):  # what its ε rests on (docs/privacy.md)
        facts.append(("privacy assumes", _e("; ".join(s["assumptions"]))))
    if s.get("failure"):
        facts.append(("failure", _e(s["failure"])))
    if headline.refusals(s):
        facts.append(("refusals", _e(headline.refusals_text(headline.refusals(s)))))
    observers = sorted({o for n in nodes.values() for o in n.get("epsilon_by_observer", {})})
    headers = ["node", *[f"ε {o}" for o in observers], "ε tight", "randomness", "energy (J)", "cost units", "bytes",
               "rounds", "straggled", "refused", "compute (s)"]
    refused = {r["node"]: r["round"] for r in headline.refusals(s)}
    rows = []
    for node, n in sorted(nodes.items(), key=lambda kv: int(kv[0]) if kv[0].isdigit() else kv[0]):
        by = n.get("epsilon_by_observer", {})
        rows.append([_e(node), *[_spent(by.get(o), b["epsilon"]) for o in observers], _num(n.get("epsilon_tight")),
                     _e(n.get("randomness", "not recorded")),
                     _spent(n["energy_j"], b.get("energy_j")), _spent(n["cost_units"], b.get("cost_units")),
                     _spent(n["bytes_up"] + n["bytes_down"], b.get("bytes")), _num(n["rounds"]),
                     _num(n.get("rounds_straggled", 0)),
                     _e(f"round {refused[int(node)] + 1}") if node.isdigit() and int(node) in refused else "–",
                     _num(n.get("compute_s"))])
    figures = "".join(_image(p.read_bytes(), p.stem) for p in draw_figures(run_dir))
    placement = _placement(s)
    config = read_text(run_dir / "config.toml", MAX_TEXT_FILE_BYTES, "") if (run_dir / "config.toml").exists() else ""
    body = (f"<h1>{_e(title)}</h1><p><span class=\"status\">{_e(s['status'])}</span></p>"
            f"<h2>Summary</h2>{_table(['', ''], facts)}"
            f"<h2>Figures</h2>{figures}{placement}"
            f"<h2>Nodes</h2>{_table(headers, rows)}"
            f"<h2>Configuration</h2><pre>{_e(config)}</pre>")
    return body, title


def _placement(s: dict[str, Any]) -> str:
    """The section placing the nodes where they stood (a radio-placed graph records it), or ""."""
    topology = s.get("topology")
    try:
        placed = placement_figure(topology) if isinstance(topology, dict) else None
    except ValueError as exc:  # a damaged record: the rest of the report stands
        return f'<h2>Where the nodes stand</h2><p class="meta">not drawn: the summary\'s topology.{_e(exc)}</p>'
    return "" if placed is None else f"<h2>Where the nodes stand</h2>{_image(_figure_png(placed), 'placement')}"


# ----------------------------------------------------------------------------------------- sweep


def _sweep_body(folder: Path) -> tuple[str, str]:
    rows = read_sweep(folder)
    columns = list(rows[0])
    title = f"sweep {folder.name}: {len(rows)} runs"
    table = _table(columns, ([_num(_parse(r.get(c))) for c in columns] for r in rows), left=0)
    body = (f"<h1>{_e(title)}</h1><h2>Runs</h2>{table}{_sweep_stats_table(rows)}<h2>Figures</h2>"
            + "".join(_image(png, alt) for png, alt in _sweep_figures(folder, rows)))
    return body, title


def _sweep_stats_table(rows: list[dict[str, str]]) -> str:
    """Each grid point's n and the mean [95 % t interval] of its main metrics (sweep_stats.csv has
    them all)."""
    keys = grid_keys(rows[0])
    fields = [f for f in ("test_accuracy", "train_loss", "epsilon_max") if f in rows[0]]
    cells = [[_num(s[k]) for k in keys] + [_num(s["n"])]
             + [_num(s.get(f"{f}_mean")) + (f" [{_num(s[f'{f}_ci_low'])}, {_num(s[f'{f}_ci_high'])}]"
                                        if s.get(f"{f}_ci_low") is not None else "") for f in fields]
             for s in stats_rows(rows, keys)]
    return (f"<h2>Grid points (mean [95% t interval] over repeats)</h2>"
            f"{_table([*keys, 'n', *fields], cells, left=len(keys))}")


def _parse(cell: str | None) -> Any:
    if cell is None or cell == "":
        return None
    try:
        return int(cell)
    except ValueError:
        try:
            return float(cell)
        except ValueError:
            return cell


def _sweep_figures(folder: Path, rows: list[dict[str, str]]) -> list[tuple[bytes, str]]:
    plt = _pyplot()
    figures = []
    fig, ax = plt.subplots(figsize=(7, 4))
    fig.subplots_adjust(left=0.11, right=0.97, bottom=0.13, top=0.9)
    # Only runs with a finite ε and an accuracy: a non-private run (an empty ε) has no place on the axis.
    parsed = [(_parse(r.get("epsilon_max")), _parse(r.get("test_accuracy")), r) for r in rows]
    points = [(e, a, r) for e, a, r in parsed if isinstance(e, (int, float)) and isinstance(a, (int, float))]
    ax.scatter([e for e, _, _ in points], [a for _, a, _ in points])
    for e, a, r in points:
        ax.annotate(r.get("run", ""), (e, a), fontsize=7, xytext=(3, 3), textcoords="offset points")
    ax.margins(0.15)  # room for the labels of the outermost runs
    ax.set(xlabel="ε spent (max over nodes)", ylabel="final test accuracy", title="accuracy against privacy spent")
    ax.grid(alpha=0.3)
    figures.append((_figure_png(fig), "accuracy against epsilon"))

    fig, ax = plt.subplots(figsize=(7, 4))
    fig.subplots_adjust(left=0.11, right=0.78, bottom=0.13, top=0.9)
    for r in rows:
        run_dir = folder / r.get("run", "")
        if not (run_dir / "metrics.csv").exists():
            continue
        metrics = [m for m in read_metrics(run_dir) if "test_accuracy" in m]  # evaluated rounds of a classification
        ax.plot([m["round"] for m in metrics], [m["test_accuracy"] for m in metrics], marker=".", label=r["run"])
    ax.set(xlabel="communication round", ylabel="test accuracy", title="every run's accuracy against round")
    ax.grid(alpha=0.3)
    if len(rows) <= 12:
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    figures.append((_figure_png(fig), "accuracy against round"))
    figures += [(_figure_png(fig), alt) for fig, alt in interval_figures(folder, rows)]
    return figures
