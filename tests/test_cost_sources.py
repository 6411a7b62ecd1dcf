"""Whether a run's seconds and joules were measured or modelled (summary.json's costs.source) is
noted from each charged batch: exactly the values its ``measured`` field takes, as np.unique says."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
from hypothesis import given, strategies as st

from testbed.ledger.events import CommunicationEvent, ComputeEvent, EventBatch, GaussianEvent
from testbed.orchestration.charging import _note_cost_source


@given(st.lists(st.booleans(), max_size=12), st.booleans(), st.booleans())
def test_a_batch_notes_the_sources_its_rows_name(column, template_measured, as_column):
    run = SimpleNamespace(cost_sources=set())
    template = ComputeEvent(0, 3, 10, measured=template_measured)
    nodes = np.arange(len(column), dtype=np.int64)
    batch = EventBatch(template, nodes, {"measured": np.array(column, dtype=bool)} if as_column else {})
    _note_cost_source(run, batch)
    rows = column if as_column else [template_measured]
    assert run.cost_sources == set(np.unique(np.asarray(rows, dtype=bool)).tolist())


def test_sources_accumulate_over_batches_and_only_costs_count():
    run = SimpleNamespace(cost_sources=set())
    two = np.arange(2, dtype=np.int64)
    _note_cost_source(run, EventBatch(GaussianEvent(0, 1, sigma=1.0, sensitivity=0.1, count=1), two, {}))  # no seconds or joules
    assert run.cost_sources == set()
    _note_cost_source(run, EventBatch(CommunicationEvent(0, 1, 10, 10, measured=True), two, {}))
    assert run.cost_sources == {True}
    _note_cost_source(run, EventBatch(ComputeEvent(0, 1, 5), two, {"measured": np.array([True, False])}))
    assert run.cost_sources == {True, False}
