"""Charged before asked (issue 39): what the run's ledger charges a node for a round it was asked.

The rule, one for every timing: a node asked in a round is charged that round's release from the
moment it is asked. The record of the ask is written ahead: ``asked.csv`` (testbed.reports.asked)
gets the round and the nodes asked, flushed (fsynced with ``output.sync``) before the round is
sent or stepped, and the planned release is a function of that record and the run's experiment
(the algorithm's ``planned_events`` for the round as asked). When the round closes each asked
node's charge is the larger of the plan and what the node's own events say: its events when they
came (they are the plan in every field the plan fixes; the seconds and joules it measured), else
the plan at the most seconds and joules the node was seen to spend (topped up when the session
ends, :func:`charge_at_end`). So a reply that comes late, is
lost, refused for its content or never sent (a node killed after logging its release and before
sending it, an update that reaches the broker after the stop) is charged, once, as asked; a
node that refused the round for its own budget released nothing and is charged nothing. Over the
air the medium says who released: a round's release is its transmit signal, and the channel
(emulated by the coordinator) charges every sender it heard and nobody else, since a signal it
did not hear reached no one.

A session killed before its rounds closed leaves its asks in ``asked.csv``: the resume charges
them the same way (:func:`earlier_asks`, :func:`charge_asked`), and a session that ends with a
round asked and never closed (a failure mid-round) charges it at its end (:func:`charge_at_end`).
The runner hands every round's outcome to :func:`charge_round` (which calls :func:`charge_asked`),
sim or MQTT, the server's events to :func:`charge_server` and the session's end to
:func:`charge_closing`; the MQTT coordinator calls :func:`released`, :func:`unanswered` and
:func:`on_ask` as a round closes, so that a late reply finds its round charged however many rounds
later it comes.

The summary shows per node the larger of what the coordinator charged and what the node confirms
(its report at the stop, covering its ledger files across sessions), and says which stands
(:func:`source`): "confirmed by node" or "charged on ask".

Example::

    >>> from collections import Counter
    >>> ctx = RoundContext(3, 0, 4, (0, 1, 2))
    >>> unanswered(ctx, charged={0}, refused={2}, logged=lambda nodes: [False] * len(nodes))
    [1]
    >>> unanswered(ctx, charged={0}, refused={2}, logged=lambda nodes: [False] * len(nodes), over_the_air=True)
    []
    >>> source(charged_on_ask={1: {3}}, reported_rounds={1: {3}}, node=1, local=False)
    'confirmed by node'
    >>> source(charged_on_ask={1: {3}}, reported_rounds={}, node=1, local=False)
    'charged on ask'
    >>> source(charged_on_ask={1: {3}}, reported_rounds={}, node=2, local=False)
    'confirmed by node'
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Callable, Collection, Iterable, Mapping, Sequence

import numpy as np

from testbed.algorithms.contract import SETUP_ROUND, OverTheAir, RoundContext
from testbed.ledger.events import Event, EventBatch, StraggleEvent, WireEvent, batches_of, with_fields
from testbed.ledger.fields import MEASURED_FIELDS
from testbed.ledger.files import LedgerWriter
from testbed.ledger.node import SPENT_AGAIN
from testbed.orchestration.nodes_api import Closing, Nodes, RoundOutcome
from testbed.orchestration.run_state import Run
from testbed.reports.asked import Asked

log = logging.getLogger(__name__)

#: The per-node ``source`` of the summary's figures.
CONFIRMED = "confirmed by node"
ON_ASK = "charged on ask"


def unanswered(ctx: RoundContext, charged: Collection[int], refused: Collection[int],
               logged: Callable[[list[int]], Sequence[bool]], over_the_air: bool = False) -> list[int]:
    """The nodes round ``ctx`` asked (``ctx.expected``) whose release nothing charges: not
    ``charged`` this round, not ``refused`` (a budget refusal releases nothing), not ``logged``
    already (a round's own events kept from before a kill). None ``over_the_air``: the channel
    charged every sender it heard, and a signal it did not hear reached no one."""
    if over_the_air:
        return []
    left = [n for n in ctx.expected if n not in charged and n not in refused]
    return [n for n, done in zip(left, logged(left)) if not done] if left else []


def released(ctx: RoundContext, answers: Mapping[int, tuple[object, list[Event], object]], heard: Collection[int],
             content_refused: Mapping[int, list[Event] | None], wire_s: Mapping[int, float],
             planned_release: Callable[[int, RoundContext], list[Event]]) -> dict[tuple[int, int], list[Event]]:
    """(node, round) → what each release of round ``ctx`` the coordinator saw is charged (``heard``:
    the nodes that released, the answered ones or those the channel heard transmit). An answer's
    events, checked against the plan (with its share of its host's seconds on its link, ``wire_s``,
    as a WireEvent beside them). A release without a usable answer is charged the plan: a
    transmission heard although its update never came (the node died after transmitting), or an
    update refused for its content (a noisy tensor was released all the same, whatever its events
    said: ``content_refused``'s, its events when they were the plan, else the plan at the bounds of
    the round's window)."""
    r = ctx.round_index
    charged: dict[tuple[int, int], list[Event]] = {}
    for node in sorted(set(heard) | (set(content_refused) - set(answers))):
        if node in answers:
            events = answers[node][1]
            charged[(node, r)] = [*events, WireEvent(node, r, wire_s[node])] if node in wire_s else events
        else:
            charged[(node, r)] = content_refused.get(node) or planned_release(node, ctx)
    return charged


def on_ask(planned_release: Callable[[int, RoundContext], list[Event]], ctx: RoundContext,
           nodes: Sequence[int], why: str) -> dict[tuple[int, int], list[Event]]:
    """(node, round) → the plan each of ``nodes``, asked in round ``ctx`` and charged nothing else
    for it, is charged: it may have released (its events logged, its reply lost, late or never sent)."""
    if nodes:
        log.warning("round %d: node(s) %s %s: charged the round's planned release, as asked", ctx.round_index,
                    ", ".join(map(str, nodes)), why)
    return {(n, ctx.round_index): planned_release(n, ctx) for n in nodes}


def source(charged_on_ask: Mapping[int, Collection[int]], reported_rounds: Mapping[int, Collection[int]],
           node: int, local: bool) -> str:
    """Whose word the summary's figures of ``node`` stand on: "confirmed by node" when every round
    it was charged stands on its own events (those its replies carried, or its ledger's rounds as
    it reported them at the stop: ``reported_rounds``), else "charged on ask": some round was
    charged its plan without the node's events (``charged_on_ask``: node → rounds), which the
    node never confirmed (it died, its report was lost, or it never released that round: the
    coordinator's figures are then above its ledger). ``local``: sim, where the book is the nodes'
    ledger and only an earlier session's ask can stand alone."""
    asked_only = set(charged_on_ask.get(node, ()))
    if not asked_only:
        return CONFIRMED
    return CONFIRMED if not local and asked_only <= set(reported_rounds.get(node, ())) else ON_ASK


def confirmed_by_node(reported: Mapping[int, Iterable[int]], charged: Callable[[int, int], bool],
                      asked: Callable[[int, int], RoundContext],
                      planned_release: Callable[[int, RoundContext], list[Event]],
                      has_setup: bool) -> dict[tuple[int, int], list[Event]]:
    """The other half of the summary's max: (node, round) → the plan of every round a node's own
    ledger logged (``reported``: its report at the stop) that nothing ``charged`` (a reply lost,
    refused by a replay window, sent after the last round, a transmission the channel never heard),
    at the plan of the round as ``asked`` (the node's events are the plan in every field that is
    not measured; its report's totals cover the measured ones). A round the coordinator did not
    ask the node (none should exist) is charged as if the node had taken part alone, the plan with
    the least noise from others."""
    found: dict[tuple[int, int], list[Event]] = {}
    for node, rounds in sorted(reported.items()):
        for round_index in rounds:
            if charged(node, round_index):
                continue
            if round_index == SETUP_ROUND and not has_setup:  # the node's own costs (a bridge
                continue  # provisioning its board): nothing released; its totals carry them
            try:
                found[(node, round_index)] = planned_release(node, asked(node, round_index))
            except Exception as exc:  # noqa: BLE001  a report must not cost the run its end
                log.warning("node %d's ledger logged round %d, which has no plan here (%s): its totals "
                            "carry it", node, round_index, exc)
                continue
            log.warning("node %d's ledger logged round %d, which never reached the coordinator: charged as planned",
                        node, round_index)
    return found


def charge_asked(run: Run, outcome: RoundOutcome, nodes: Nodes, charged_here: set[int],
                 before_kill: list[Event]) -> tuple[list[Event], dict[int, str]]:
    """What round ``outcome`` charges on ask, beyond what its nodes' own events charge
    (``charged_here``: the nodes charged so far; ``before_kill``: its rows a killed session logged
    past the checkpoint): the plan of each node this session asked that sent nothing usable, and of
    each an earlier session asked (``run.asked_before``) that nothing charges, with each earlier
    asking session's compute and communication; and the straggle rows that go with the latter."""
    book = run.book
    straggled: dict[int, str] = {}
    fresh_events: list[Event] = []
    # Charged before asked: every node asked is charged the round, its events or its plan. Over MQTT
    # the coordinator charged the plans already (outcome.on_ask: a late reply finds them charged there).
    r = outcome.ctx.round_index
    planned = [e for n in outcome.on_ask for e in outcome.charged.get((n, r), [])]
    silent = unanswered(outcome.ctx, charged_here | set(outcome.on_ask), {n for n, *_ in outcome.refused},
                        lambda left: book.logged(left, r), over_the_air=isinstance(run.algorithm, OverTheAir))
    for events in on_ask(nodes.planned_release, outcome.ctx, silent, "sent no usable reply").values():
        planned += events
        fresh_events += events
    charged_here = charged_here | set(silent)
    if planned:
        run.estimated.append((outcome.ctx, planned))  # topped up to the session's costliest at its end
        _note_on_ask(run, planned)
    run.open_ask = None
    earlier = run.asked_before.pop(outcome.ctx.round_index, Counter())
    if earlier:
        asked = tuple(sorted(earlier))
        missing = _asked_uncharged(run, outcome.ctx, asked, charged_here)
        straggled = dict.fromkeys(missing, "asked_before_resume")
        planned = _planned_for(run, nodes, outcome.ctx, asked, missing) if missing else []
        _note_on_ask(run, planned)
        planned += _earlier_spend(run, nodes, outcome.ctx, earlier, before_kill, set(missing))
        if planned:
            run.estimated.append((_as_asked(run, outcome.ctx, asked), planned))
        fresh_events.extend(planned)
    return fresh_events, straggled


def charge_at_end(run: Run, nodes: Nodes, fresh: list[Event]) -> list[Event]:
    """What the session's end charges on ask beside the closing's ``fresh`` events: a round this
    session asked and never closed (a failure mid-round), the rounds an earlier session asked that
    this one did not run again, and the plans charged at an estimate topped up to the session's
    costliest."""
    events: list[Event] = []
    if run.open_ask is not None:  # asked, never closed: charged as asked all the same
        ctx, run.open_ask = run.open_ask, None
        closed = {e.node for e in fresh if e.round == ctx.round_index}
        silent = unanswered(ctx, closed, (), lambda left: run.book.logged(left, ctx.round_index))
        for planned in on_ask(nodes.planned_release, ctx, silent, "asked in a round the session never closed").values():
            _note_on_ask(run, planned)
            events += planned
    events += _asked_rounds_not_run(run, nodes, {(e.node, e.round) for e in [*fresh, *events]})
    return events + _estimates_topped_up(run, nodes)


def earlier_asks(asked: list[Asked], rounds_done: int, refused: set[tuple[int, int]]) -> dict[int, Counter[int]]:
    """What the earlier sessions of a resumed run asked (``asked``: asked.csv) that may hold a
    release or a spend its ledger lacks: round → node → how many sessions asked it.

    A round the resume runs again (at or past the checkpoint's ``rounds_done``) and a setup: every
    node asked (each asking session computed and sent it; a release is charged once). A round
    before the checkpoint closed: whoever it asked was charged then, its events or its plan
    (testbed.orchestration.charging). A node's refusal of the round (``refused``: (node, round)) was
    no release: not counted.

    Example::

        >>> from testbed.reports.asked import Asked
        >>> from testbed.ledger.events import ComputeEvent, StraggleEvent
        >>> found = earlier_asks([Asked("a" * 16, 1, (0, 1)), Asked("a" * 16, 3, (0, 1)),
        ...                       Asked("b" * 16, 3, (0, 1))], 3, {(1, 3)})
        >>> {r: dict(c) for r, c in found.items()}
        {3: {0: 2, 1: 1}}
    """
    refusals = Counter(refused)
    found: dict[int, Counter[int]] = {}
    for record in asked:
        if record.round < rounds_done and record.round != SETUP_ROUND:
            continue
        for node in record.nodes:
            key = (node, record.round)
            if refusals[key] > 0:
                refusals[key] -= 1
            else:
                found.setdefault(record.round, Counter())[node] += 1
    return found


def _note_on_ask(run: Run, planned: list[Event]) -> None:
    """Note the rounds ``planned`` charges nodes without their own events (the summary's ``source``)."""
    for event in planned:
        run.charged_on_ask.setdefault(event.node, set()).add(event.round)


def _asked_uncharged(run: Run, ctx: RoundContext, asked: tuple[int, ...], charged: set[int]) -> list[int]:
    """The nodes of ``asked`` (by an earlier session, round ``ctx``) that neither ``charged`` nor
    the book holds a release of."""
    left = [n for n in asked if n not in charged]
    return [n for n, done in zip(left, run.book.logged(left, ctx.round_index).tolist()) if not done] if left else []


def _as_asked(run: Run, ctx: RoundContext, asked: tuple[int, ...]) -> RoundContext:
    """Round ``ctx`` as an earlier session asked it, of the nodes ``asked``."""
    return RoundContext(ctx.round_index, run.config.run.seed, ctx.num_nodes, asked, sampled=ctx.sampled)


def _planned_for(run: Run, nodes: Nodes, ctx: RoundContext, asked: tuple[int, ...], missing: list[int],
                 quiet: bool = False) -> list[Event]:
    """The plan each of ``missing`` is charged for round ``ctx`` (as an earlier session asked it,
    with ``asked``): it may have released then, and its reply never reached the ledger."""
    earlier = _as_asked(run, ctx, asked)
    if not quiet:
        log.warning("round %d: node(s) %s, asked by an earlier session of the run, are charged nothing in this one: "
                    "charged the plan (they may have released before the resume)", ctx.round_index,
                    ", ".join(map(str, missing)))
    return [e for n in missing for e in nodes.planned_release(n, earlier)]


def _earlier_spend(run: Run, nodes: Nodes, ctx: RoundContext, earlier: Counter[int], before_kill: list[Event],
                   planned: set[int]) -> list[Event]:
    """What the earlier sessions that asked round ``ctx`` (``earlier``: node → sessions) spent on
    it and the ledger lacks: each asking session's compute and communication (testbed.ledger.
    node.SPENT_AGAIN: a round run again is spent again, its release charged once), less the
    sessions whose rows the ledger kept past the checkpoint (``before_kill``) and the one whose plan
    :func:`_planned_for` charged already (``planned``): the plan's, at the costliest this session
    saw. A node that never got to compute is over-counted, never under."""
    kept = Counter((e.node, e.kind) for e in before_kill if e.kind in SPENT_AGAIN)
    asked = tuple(sorted(earlier))
    events: list[Event] = []
    for node, sessions in sorted(earlier.items()):
        spend = [e for e in _planned_for(run, nodes, ctx, asked, [node], quiet=True) if e.kind in SPENT_AGAIN]
        per_session = Counter(e.kind for e in spend)
        logged = min((kept[node, kind] // count for kind, count in per_session.items()), default=sessions)
        events += spend * max(0, sessions - logged - (node in planned))
    return events


def _estimates_topped_up(run: Run, nodes: Nodes) -> list[Event]:
    """What the session's end adds to each plan :func:`charge_asked` charged for an earlier session's
    part of a round (``run.estimated``): the seconds and joules by which the node's costliest event,
    known now over the whole session, exceeds what was charged then (a round's first answers come
    before its costliest), as a compute event of no steps (it adds seconds and joules only)."""
    events = []
    for ctx, charged in run.estimated:
        for node in sorted({e.node for e in charged}):
            mine = [e for e in charged if e.node == node and e.kind in SPENT_AGAIN]
            sessions = sum(e.kind == "compute" for e in mine) or 1
            now = [e for e in nodes.planned_release(node, ctx) if e.kind in SPENT_AGAIN]
            first = next((e for e in mine if e.kind == "compute"), None)
            extra_s = sessions * sum(e.compute_s for e in now if e.kind == "compute") \
                - sum(e.compute_s for e in mine if e.kind == "compute")
            extra_j = sessions * sum(e.energy_j for e in now) - sum(e.energy_j for e in mine)
            if first is not None and (extra_s > 0 or extra_j > 0):
                events.append(with_fields(first, local_steps=0, cost_units=0.0, compute_s=max(extra_s, 0.0),
                                          energy_j=max(extra_j, 0.0)))
    run.estimated.clear()
    return events


def _asked_rounds_not_run(run: Run, nodes: Nodes, charged: set[tuple[int, int]]) -> list[Event]:
    """The plan of each node an earlier session asked in a round this one did not run again (a
    budget stop, a failure; a setup some nodes had logged) and that nothing charges: not the book,
    not its rows past the checkpoint's mark, not ``charged`` (the closing's)."""
    events = []
    for round_index, sessions in sorted(run.asked_before.items()):
        asked = tuple(sorted(sessions))
        past = run.past_mark.get(round_index, [])
        marked = {e.node for e in past if e.kind != StraggleEvent.kind}
        here = marked | {n for n, r in charged if r == round_index}
        ctx = RoundContext(round_index, run.config.run.seed, run.config.data.num_nodes, asked)
        missing = _asked_uncharged(run, ctx, asked, here)
        if missing:
            planned = _planned_for(run, nodes, ctx, asked, missing)
            _note_on_ask(run, planned)
            events += planned
            # One straggle row a round: not beside one past the mark.
            straggles = batches_of([StraggleEvent(n, round_index, "asked_before_resume") for n in missing])
            events += [e for batch in not_yet_charged(straggles, past) for e in batch.events()]
    run.asked_before.clear()
    return events


def charge_round(run: Run, outcome: RoundOutcome, ledger_file: LedgerWriter, nodes: Nodes) -> None:
    """Log what each node released (its own events; a round re-run after a kill is not charged
    twice; a node an earlier session asked this round that is charged nothing here, the plan) and
    who straggled, in one write."""
    book = run.book
    # This round's rows logged before a kill: charged; the round charges only what they lack. Those
    # the server issued wait for its step (charge_server).
    before_kill, by_server = split_by_issuer(run.past_mark.pop(outcome.ctx.round_index, []))
    if by_server:
        run.past_mark[outcome.ctx.round_index] = by_server
    batches = []
    for batch in outcome.batches:
        fresh = ~book.logged(batch.nodes, batch.round)
        batches.append(batch if fresh.all() else batch.take(fresh))
    by_round: dict[int, list[int]] = {}
    for node, round_index in sorted(outcome.charged):
        by_round.setdefault(round_index, []).append(node)
    fresh_events = []
    for round_index, answered in by_round.items():
        for node, done in zip(answered, book.logged(answered, round_index).tolist()):
            if not done:
                fresh_events.extend(outcome.charged[node, round_index])
    straggled = outcome.straggled
    charged_here = {n for b in batches if b.kind != StraggleEvent.kind for n in b.nodes.tolist()}
    charged_here |= {e.node for e in [*fresh_events, *before_kill] if e.kind != StraggleEvent.kind}
    asked_events, asked_straggled = charge_asked(run, outcome, nodes, charged_here, before_kill)
    fresh_events += asked_events
    straggled = {**straggled, **asked_straggled}
    r = outcome.ctx.round_index
    batches += batches_of(fresh_events)
    by_reason: dict[str, list[int]] = {}
    for node, reason in sorted(straggled.items()):
        by_reason.setdefault(reason, []).append(node)
    batches += [EventBatch(StraggleEvent(0, r, reason), np.array(nodes, dtype=np.int64))
                for reason, nodes in by_reason.items()]
    if before_kill:
        batches = not_yet_charged(batches, before_kill)
        book.extend(before_kill)
    for batch in batches:
        book.extend_batch(batch)
        _note_cost_source(run, batch)
    ledger_file.write_batches(batches)


def _note_cost_source(run: Run, batch: EventBatch) -> None:
    """Note whether ``batch``'s seconds and joules were measured or modelled (see Run.cost_sources)."""
    if batch.kind in ("compute", "communication"):
        # Which of True and False occur: np.unique's answer without its sort and numpy.ma's import
        measured = np.asarray(batch.value("measured"), dtype=bool)
        if measured.any():
            run.cost_sources.add(True)
        if not measured.all():
            run.cost_sources.add(False)


def charge_closing(run: Run, closing: Closing, nodes: Nodes) -> None:
    """What the run's end adds (late replies, rounds only the nodes' own ledgers logged, rounds an
    earlier session asked that this one did not run again): into the book and ledger.csv, and the
    checkpoint again so that it covers them; the nodes' reports kept for the summary."""
    run.node_reports, run.session, run.broker = closing.reports, closing.session, closing.broker
    run.reported_rounds, run.links = closing.reported_rounds, closing.links
    run.authentication = closing.authentication
    run.sim_workers = closing.sim_workers
    run.randomness, run.server_randomness = closing.randomness, closing.server_randomness
    fresh = [event for (node, round_index), events in sorted(closing.charged.items())
             if not run.book.logged([node], round_index)[0] for event in events]
    fresh += charge_at_end(run, nodes, fresh)
    if not fresh:
        return
    run.book.extend(fresh)
    for batch in batches_of(fresh):
        _note_cost_source(run, batch)
    ledger_file = LedgerWriter(run.directory.ledger_path, sync=run.config.output.sync)
    try:
        ledger_file.write(fresh)
        run.directory.save_checkpoint(run.rounds_done, run.state, ledger_file.mark(), 1)
    finally:
        ledger_file.close()


def charge_server(run: Run, events: list[Event], nodes: Nodes, ledger_file: LedgerWriter) -> None:
    """Events the server issued on nodes' behalf: into their ledgers here and, with their next
    round, to the nodes themselves."""
    fresh = [e for e in events if not run.book.has_server_events(e.node, e.round)]
    before_kill = [e for r in sorted({e.round for e in events}) for e in run.past_mark.pop(r, [])]
    if before_kill:  # logged before a kill (see charge_round)
        fresh = [e for batch in not_yet_charged(batches_of(fresh), before_kill) for e in batch.events()]
        run.book.extend(before_kill)
    run.book.extend(fresh)
    ledger_file.write(fresh)
    if events:
        nodes.deliver(events)


def not_yet_charged(batches: Sequence[EventBatch], before_kill: Sequence[Event]) -> list[EventBatch]:
    """The events of ``batches`` (what a round run again after a resume releases) that
    ``before_kill`` (that round's ledger rows past the checkpoint's mark: charged before the kill)
    does not already hold, matched one for one on every field but the measured ones (a node
    measures its seconds and joules anew) and, for a straggle, on its node and round alone (the
    session run again may give another reason: the node still missed the round once). Events of
    :data:`SPENT_AGAIN` kinds are never matched: the round run again spends them again.

    Rows past the mark are covered by no digest: a kill may have cut the round's rows short at a
    line end, and anything may have altered them since. A row missing or altered leaves the event
    it stood for to be charged again: the ledger may then over-count, never under-count.

    Example::

        >>> from testbed.ledger.events import ComputeEvent
        >>> batch = EventBatch(ComputeEvent(0, 3, local_steps=2), np.array([0, 1]))
        >>> from testbed.ledger.events import StraggleEvent
        >>> straggles = EventBatch(StraggleEvent(0, 3, "emulated"), np.array([0, 1]))
        >>> [b.nodes.tolist() for b in not_yet_charged([straggles], [StraggleEvent(1, 3, "emulated")])]
        [[0]]
        >>> [b.nodes.tolist() for b in not_yet_charged([batch], [ComputeEvent(1, 3, local_steps=2)])]
        [[0, 1]]
    """
    left = Counter(_planned_fields(e) for e in before_kill if e.kind not in SPENT_AGAIN)
    fresh = []
    for batch in batches:
        if batch.kind in SPENT_AGAIN:
            fresh.append(batch)
            continue
        keep = []
        for i, event in enumerate(batch.events()):
            key = _planned_fields(event)
            if left[key] > 0:
                left[key] -= 1
            else:
                keep.append(i)
        if len(keep) == len(batch):
            fresh.append(batch)
        elif keep:
            fresh.append(batch.take(np.array(keep, dtype=np.int64)))
    return fresh


def split_by_issuer(events: Sequence[Event]) -> tuple[list[Event], list[Event]]:
    """(the events a node issued, those the server issued on a node's behalf), in order."""
    by_server = [getattr(e, "issuer", "node") == "server" for e in events]
    return [e for e, s in zip(events, by_server) if not s], [e for e, s in zip(events, by_server) if s]


def _planned_fields(event: Event) -> tuple:
    if event.kind == StraggleEvent.kind:  # a node misses a round once, whatever each session saw of why
        return (event.kind, event.node, event.round)
    return (event.kind, *((name, value) for name, value in event.__dict__.items() if name not in MEASURED_FIELDS))
