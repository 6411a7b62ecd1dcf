"""Charged before asked (issue 39): what the run's ledger charges a node for a round it was asked.

The rule, one for every timing: a node asked in a round is charged that round's release from the
moment it is asked. The record of the ask is written ahead: ``asked.csv`` (testbed.reports.asked)
gets the round and the nodes asked, flushed (fsynced with ``output.sync``) before the round is
sent or stepped, and the planned release is a function of that record and the run's experiment
(the algorithm's ``planned_events`` for the round as asked). When the round closes each asked
node's charge is the larger of the plan and what the node's own events say: its events when they
came (they are the plan in every field the plan fixes; the seconds and joules it measured), else
the plan at the most seconds and joules the node was seen to spend (topped up when the session
ends, :func:`testbed.orchestration.runner._estimates_topped_up`). So a reply that comes late, is
lost, refused for its content or never sent (a node killed after logging its release and before
sending it, an update that reaches the broker after the stop) is charged, once, as asked; a
node that refused the round for its own budget released nothing and is charged nothing. Over the
air the medium says who released: a round's release is its transmit signal, and the channel
(emulated by the coordinator) charges every sender it heard and nobody else, since a signal it
did not hear reached no one.

A session killed before its rounds closed leaves its asks in ``asked.csv``: the resume charges
them the same way (testbed.orchestration.runner.earlier_asks), and a session that ends with a round asked and never
closed (a failure mid-round) charges it at its end.

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
from typing import Callable, Collection, Mapping, Sequence

from testbed.algorithms.contract import RoundContext
from testbed.ledger.events import Event

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
