"""``output.tensorboard = true``: the run's curves as TensorBoard event files in RUN_DIR/tensorboard.

Scalars per round: the metrics row (training loss, accuracies, cost units, bytes, stragglers, wall
seconds, local steps), the most joules any node spent, and ``epsilon``: the figure summary.json
quotes (the tight accountant's ε when it runs, the run's accountant's as ``epsilon_<accountant>``
beside it; ε-MI-DP in nats; none for a run without noise: feed.Quoting); each node's ε, cost units,
bytes and joules by id (``nodes/epsilon/3``, up to NODE_SERIES_MAX nodes) and as histograms per
round (``nodes/...``); the config, the figure to quote and the final summary as text. View with
``tensorboard --logdir runs`` (one run per run directory).

The events are written with tensorboardX's record writer from the tracking thread itself
(testbed.reports.tracking.feed), not its SummaryWriter: that one writes from a thread of its own, whose
failure (a full disk) would be lost instead of ending tracking in one line.

tensorboardX imports torch when it is installed (its writer accepts torch tensors): a second and
a half, once, in the tracking thread; without torch it imports numpy and protobuf only.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from testbed.reports.tracking import RoundRecord, node_series
from testbed.util import jsontext
from testbed.util.jsontext import finite

if TYPE_CHECKING:
    from testbed.assembly.config import Config

#: Seconds between flushes (each an fsync) of the event file; finish flushes the rest.
FLUSH_EVERY_S = 5.0
#: Bins of each per-node histogram, however many nodes (equal widths: "auto" costs percentiles).
HISTOGRAM_BINS = 30


class TensorBoardTracker:
    """Writes one event file under RUN_DIR/tensorboard (a resumed run adds another)."""

    def __init__(self) -> None:
        self._writer = None
        self._flushed_at = 0.0

    def start(self, config: "Config", run_dir: Path) -> None:
        from tensorboardX.event_file_writer import EventsWriter

        from testbed.assembly.config import to_toml

        logdir = Path(run_dir) / "tensorboard"
        logdir.mkdir(parents=True, exist_ok=True)
        self._writer = EventsWriter(str(logdir / "events"))
        self._text("config", "```toml\n" + to_toml(config) + "\n```", 0)
        self._flush()

    def round(self, record: RoundRecord) -> None:
        from tensorboardX.proto.summary_pb2 import Summary

        values = [Summary.Value(tag=name, simple_value=value) for name, value in record.metrics.items()]
        values += [Summary.Value(tag=tag, simple_value=value) for tag, value in node_series(record)]
        for name, per_node in record.nodes.items():
            finite = per_node[np.isfinite(per_node)]
            if finite.size:
                values.append(Summary.Value(tag=f"nodes/{name}", histo=_histogram(finite)))
        self._write(Summary(value=values), record.round)  # one event a round
        if time.monotonic() - self._flushed_at >= FLUSH_EVERY_S:
            self._flush()

    def finish(self, summary: dict[str, Any]) -> None:
        from testbed.reports import headline

        self._text("privacy_quote", f"epsilon to quote: {headline.quote_text(summary)}: {headline.privacy_text(summary)}",
                   int(summary.get("rounds", 0)))
        lines = headline.guarantee_lines(summary)
        if lines:  # against whom each privacy figure holds, where the summary's text is not read
            self._text("privacy_guarantees", "\n".join(f"- {line}" for line in lines), int(summary.get("rounds", 0)))
        self._text("summary", "```json\n" + jsontext.dumps(finite(summary), indent=2, default=str) + "\n```",
                   int(summary.get("rounds", 0)))
        self._writer.close()
        self._writer = None

    def close(self) -> None:
        if self._writer is not None:
            writer, self._writer = self._writer, None
            writer.close()

    def _text(self, tag: str, markdown: str, step: int) -> None:
        from tensorboardX.summary import text

        self._write(text(tag, markdown), step)

    def _write(self, summary, step: int) -> None:
        from tensorboardX.proto.event_pb2 import Event

        self._writer.write_event(Event(summary=summary, step=step, wall_time=time.time()))

    def _flush(self) -> None:
        self._writer.flush()
        self._flushed_at = time.monotonic()


def _histogram(values: np.ndarray):
    """TensorBoard's histogram of finite ``values``: HISTOGRAM_BINS equal bins over their range (the
    proto's ``bucket_limit`` holds each bin's right edge)."""
    from tensorboardX.proto.summary_pb2 import HistogramProto

    counts, edges = np.histogram(values, bins=HISTOGRAM_BINS)
    return HistogramProto(min=float(values.min()), max=float(values.max()), num=float(values.size),
                          sum=float(values.sum()), sum_squares=float(np.dot(values, values)),
                          bucket_limit=edges[1:].tolist(), bucket=counts.astype(float).tolist())
