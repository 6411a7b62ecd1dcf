"""The columnar ledger (testbed.accounting.book) against the per-node NodeLedger it replaces in the
runner: the same totals, tallies, ε, energy forecast and round bookkeeping for the same events,
whether they arrive as batches or one at a time; and batches written as the same CSV rows."""

from __future__ import annotations

import csv
import io
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from testbed.accounting.budgets import Budgets
from testbed.ledger.events import (CommunicationEvent, ComputeEvent, EventBatch, GaussianEvent, MutualInfoEvent,
                                   NodeEvents, StraggleEvent, batches_of)
from testbed.accounting.book import LedgerBook
from testbed.ledger.files import LedgerWriter, _row, read_ledger
from testbed.ledger.node import NodeLedger
from testbed.privacy.accountants import worst_epsilon

NODES = 7


def _round_events(rng: random.Random, r: int, node: int) -> list:
    """What one node may log in round r: a mixture with varied values, some rounds straggled."""
    if rng.random() < 0.2:
        return [StraggleEvent(node, r, rng.choice(["emulated", "deadline"]))]
    events = [ComputeEvent(node, r, local_steps=rng.randint(1, 5), cost_units=rng.random(), compute_s=rng.random(),
                           energy_j=rng.random()),
              CommunicationEvent(node, r, bytes_up=rng.randint(1, 99), bytes_down=80, cost_units=1.0,
                                 energy_j=rng.random())]
    if rng.random() < 0.8:
        events.append(GaussianEvent(node, r, sigma=rng.choice([1.0, 2.0]), sensitivity=0.1, count=rng.choice([1, 3]),
                                    sampling="without_replacement", sampling_rate=rng.choice([0.1, 0.2]),
                                    observer=rng.choice(["server", "peers"])))
    if rng.random() < 0.1:
        events.append(MutualInfoEvent(node, r, epsilon_nats=rng.random()))
    return events


def _both(rounds: int, seed: int = 0) -> tuple[LedgerBook, list[NodeLedger], list]:
    """A book fed by batches (one per event kind and value) and per-node ledgers fed one by one."""
    rng = random.Random(seed)
    book, ledgers, every = LedgerBook(range(NODES)), [NodeLedger(n) for n in range(NODES)], []
    for r in range(rounds):
        per_node = {n: _round_events(rng, r, n) for n in range(NODES)}
        for n, events in per_node.items():
            ledgers[n].extend(events)
            every += events
        # Batches: events of the same kind and position across nodes, their differing fields as columns.
        by_shape: dict[tuple, list[int]] = {}
        for n, events in per_node.items():
            by_shape.setdefault(tuple(type(e) for e in events), []).append(n)
        for nodes in by_shape.values():
            batched = NodeEvents.from_lists([per_node[n] for n in nodes], nodes)
            for batch in batched.batches:
                book.extend_batch(batch)
    return book, ledgers, every


@pytest.mark.parametrize("seed", [0, 1])
def test_book_holds_what_per_node_ledgers_hold(seed):
    book, ledgers, _ = _both(rounds=30, seed=seed)
    for led in ledgers:
        view = book.view(led.node)
        assert view.totals == led.totals
        assert view.by_observer == led.by_observer
        assert view.max_round_energy_j == pytest.approx(led.max_round_energy_j, abs=1e-12)
        for r in range(30):
            assert view.has_round(r) == led.has_round(r)
    eps = book.worst_epsilons("zcdp", 1e-5)
    assert eps.tolist() == [worst_epsilon("zcdp", led.by_observer, 1e-5) for led in ledgers]


def test_one_event_at_a_time_equals_batches():
    book, _, every = _both(rounds=12)
    single = LedgerBook(range(NODES))
    single.extend(every)
    for name, column in book.totals.items():
        np.testing.assert_array_equal(single.totals[name], column)
    assert [single.tally(n) for n in range(NODES)] == [book.tally(n) for n in range(NODES)]


def test_tallies_are_shared_and_compacted_over_a_long_run():
    book = LedgerBook(range(3))
    event = GaussianEvent(0, 0, sigma=1.0, sensitivity=0.1, count=1)
    for r in range(3000):
        book.extend_batch(EventBatch(GaussianEvent(0, r, 1.0, 0.1, 1), np.arange(3)))
    assert len(book._tallies) <= 2 + 64 + 1  # one live tally; the dead ones dropped as they pile up
    tallies, index = book.distinct_tallies()
    assert len(tallies) == 1 and index.tolist() == [0, 0, 0]
    assert tallies[0]["server"][event.signature] == 3000
    assert book.worst_epsilons("zcdp", 1e-5)[0] == worst_epsilon("zcdp", {"server": {event.signature: 3000}}, 1e-5)


def test_rounds_are_forgotten_once_no_rerun_can_reach_them_but_setup_is_kept():
    book = LedgerBook([3, 9])  # ids that are not row numbers
    book.extend([ComputeEvent(9, -1, 1), ComputeEvent(3, 0, 1), ComputeEvent(9, 5, 1)])
    assert book.logged([3, 9], 0).tolist() == [True, False]
    book.forget_rounds_before(5)
    assert book.logged([3, 9], 0).tolist() == [False, False]
    assert book.logged([3, 9], -1).tolist() == [False, True]
    assert book.logged([3, 9], 5).tolist() == [False, True]
    with pytest.raises(ValueError, match="node 4 is not in the book"):
        book.logged([4], 0)


def test_server_issued_events_are_kept_apart_from_the_nodes_own():
    book = LedgerBook(range(2))
    book.extend([GaussianEvent(1, 4, sigma=1.0, sensitivity=0.1, count=1, issuer="server")])
    assert book.has_server_events(1, 4) and not book.has_server_events(0, 4)
    assert not book.view(1).has_round(4)


def test_budget_check_reads_a_book_node_as_a_node_ledger():
    book, ledgers, _ = _both(rounds=10)
    planned = [ComputeEvent(0, 10, 3, cost_units=5.0), GaussianEvent(0, 10, sigma=1.0, sensitivity=0.1, count=3)]
    for limit in (0.5, 5.0, 50.0):
        budgets = Budgets(epsilon=limit, cost_units=10 * limit, energy_j=limit)
        for led in ledgers:
            events = [type(e)(**{**e.__dict__, "node": led.node}) for e in planned]
            assert budgets.would_exceed(book.view(led.node), events) == budgets.would_exceed(led, events)


def test_a_batch_is_written_as_the_rows_of_its_events(tmp_path):
    batch = EventBatch(GaussianEvent(0, 3, sigma=1.5, sensitivity=0.1, count=10, sampling="without_replacement"),
                       np.array([2, 0, 5]), {"sampling_rate": np.array([0.125, 0.25, 1.0])})
    straggled = EventBatch(StraggleEvent(0, 3, "deadline"), np.array([1]))
    late = [ComputeEvent(4, 2, 7, cost_units=0.1 + 0.2)]
    writer = LedgerWriter(tmp_path / "ledger.csv", sync=False)
    writer.write_batches([batch, straggled, *batches_of(late)])
    writer.close()
    assert list(read_ledger(tmp_path / "ledger.csv")) == batch.events() + straggled.events() + late
    written = (tmp_path / "ledger.csv").read_bytes().decode()
    assert written.endswith(_csv([_row(e) for e in batch.events() + straggled.events() + late]))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([0.0, -0.0, 5.6565581395344685e-06, 1e-300, 2.5]) |
                          st.floats(min_value=0.0, max_value=1e6, allow_nan=False),
                          st.floats(min_value=0.0, max_value=1e6, allow_nan=False)),
                min_size=1, max_size=40))
def test_a_batchs_float_columns_are_written_as_their_events_rows(tmp_path_factory, measured):
    """A float column's values, formatted once per distinct value (files._column_values), are
    the rows of the batch's events: -0.0 apart from 0.0, long reprs, repeats, above and below the
    length from which values are formatted once."""
    seconds, joules = (np.array(column) for column in zip(*measured))
    batch = EventBatch(ComputeEvent(0, 3, 2), np.arange(len(measured)), {"compute_s": seconds, "energy_j": joules})
    path = tmp_path_factory.mktemp("ledger") / "ledger.csv"
    writer = LedgerWriter(path, sync=False)
    writer.write_batches([batch])
    writer.close()
    assert path.read_bytes().decode().endswith(_csv([_row(e) for e in batch.events()]))


_EVENTS = st.builds(lambda kind, node, r, x: (ComputeEvent(node, r, 2, compute_s=x) if kind == 0 else
                                              CommunicationEvent(node, r, 800, 800, energy_j=x) if kind == 1 else
                                              StraggleEvent(node, r, "deadline")),
                    st.integers(0, 2), st.integers(0, 5), st.integers(-1, 2), st.sampled_from([0.0, 0.5, 2.0]))


@settings(max_examples=200, deadline=None)
@given(st.lists(_EVENTS, max_size=30))
def test_batches_of_groups_by_kind_round_and_occurrence(events):
    """batches_of: one batch per kind, round and occurrence of a node in them, in order of first
    appearance, each event in exactly one: its grouping without a count per node (every node once
    per kind and round, a round's replies) is the general one's."""
    groups: dict[tuple, list] = {}
    seen: dict[tuple, int] = {}
    for event in events:
        key = (type(event), event.round, event.node)
        groups.setdefault((type(event), event.round, seen.get(key, 0)), []).append(event)
        seen[key] = seen.get(key, 0) + 1
    assert [batch.events() for batch in batches_of(events)] == list(groups.values())


def _csv(rows) -> str:
    buf = io.StringIO()
    csv.writer(buf).writerows(rows)
    return buf.getvalue()


def test_node_events_read_as_the_contracts_lists():
    lists = [[ComputeEvent(n, 1, 2), GaussianEvent(n, 1, 1.0, 0.1, 2, sampling_rate=0.1 * (n + 1))] for n in (4, 6)]
    events = NodeEvents.from_lists(lists, [4, 6])
    assert list(events) == lists and events[-1] == lists[-1]
    assert list(events.batches[1].columns) == ["sampling_rate"] and not events.batches[0].columns
    assert NodeEvents.from_lists([[ComputeEvent(0, 1, 2)], []], [0, 1]) is None  # different kinds
    charged = events.batches[1].map(lambda e: GaussianEvent(**{**e.__dict__, "count": int(10 * e.sampling_rate)}))
    assert [(e.node, e.count) for e in charged.events()] == [(4, 5), (6, 7)]


@pytest.mark.parametrize("limit", [0.3, 1.7, 3.6, 30.0])  # 1.7: node 6 first by ε; 3.6: node 1 by joules
def test_budgets_screened_at_once_name_the_node_the_per_node_check_names(limit):
    book, ledgers, _ = _both(rounds=10, seed=2)
    nodes = [5, 0, 3, 6, 1]
    planned = [[ComputeEvent(n, 10, 3, cost_units=limit), CommunicationEvent(n, 10, bytes_up=50, bytes_down=80),
                GaussianEvent(n, 10, sigma=1.0, sensitivity=0.1, count=3, sampling_rate=0.1 * (1 + n % 2))]
               for n in nodes]
    for budgets in (Budgets(epsilon=limit), Budgets(cost_units=10 * limit), Budgets(energy_j=3 * limit),
                    Budgets(bytes=200 * limit), Budgets(mi_epsilon=limit / 3), Budgets(epsilon=2 * limit, bytes=300 * limit)):
        expected = next((e for n, p in zip(nodes, planned) if (e := budgets.would_exceed(ledgers[n], p))), None)
        assert budgets.first_exceeded(book, nodes, planned) == expected
        assert budgets.first_exceeded(book, nodes, NodeEvents.from_lists(planned, nodes)) == expected


def test_live_tallies_are_counted_through_merges_and_compactions():
    book, ledgers = LedgerBook(range(50)), [NodeLedger(n) for n in range(50)]
    rng = random.Random(4)
    for r in range(400):
        nodes = sorted(rng.sample(range(50), 20))
        event = GaussianEvent(0, r, rng.choice([1.0, 2.0]), 0.1, 1)
        book.extend_batch(EventBatch(event, np.array(nodes)))
        for n in nodes:
            ledgers[n].extend([GaussianEvent(n, r, event.sigma, 0.1, 1)])
        tallies, _ = book.distinct_tallies()
        assert book._live == len(tallies)
        assert len(book._tallies) <= 2 * book._live + 64 + 1  # compacted as the dead ones pile up
    assert [book.tally(n) for n in range(50)] == [led.by_observer for led in ledgers]
