"""What the runner asks of the nodes, however they are reached (in this process, over MQTT).

Example::

    >>> outcome = RoundOutcome(NodeResult((), {}), RoundContext(0, 0, 2, (0, 1)).closed([]))
    >>> outcome.ctx.stragglers
    (0, 1)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Protocol

from testbed.algorithms.contract import NodeResult, RoundContext, State
from testbed.ledger.events import Event, EventBatch
from testbed.ledger.node import Totals
from testbed.streams.node_secret import RUN_SEED


@dataclass(frozen=True)
class RoundOutcome:
    """One round (or the setup), as the nodes played it.

    Attributes:
        result: the answers the server step uses (the algorithm's uplink tensors), by node.
        ctx: the round closed: ``answered`` released something that reached the server or the
            channel, ``stragglers`` did not.
        charged: (node, round) → the events the node's release caused (the answered; a release
            that arrived late; a transmission heard although its update never came).
        straggled: node → why it missed the round (testbed.ledger.events.StraggleEvent reasons).
        refused: (node, budget, would_be, limit) of nodes that refused to act.
        batches: the answered nodes' events of this round as columns (sim), charged as they are;
            ``charged`` then holds only the rest.
        on_ask: the nodes asked that neither answered nor refused, whose ``charged`` events of the
            round are its plan (testbed.orchestration.charging: charged before asked).
    """

    result: NodeResult
    ctx: RoundContext
    charged: dict[tuple[int, int], list[Event]] = field(default_factory=dict)
    straggled: dict[int, str] = field(default_factory=dict)
    refused: tuple[tuple[int, str, float, float], ...] = ()
    batches: tuple[EventBatch, ...] = ()
    on_ask: tuple[int, ...] = ()


@dataclass(frozen=True)
class Closing:
    """What the end of a run adds to its ledger, once the nodes were told it is over.

    Attributes:
        charged: (node, round) → events of releases the rounds did not charge: replies that came
            after their round closed (the last one included), and rounds a node's own ledger logged
            that never reached the coordinator (charged at the round's plan).
        reports: node → the totals of its own ledger, for the nodes that reported one; None where
            the nodes' ledgers are the runner's own (sim).
        reported_rounds: node → the rounds of this session its own ledger logged, as it reported
            them (testbed.orchestration.charging.source).
        session: the coordinator's session id (a node keeps its ledger of the run per session), or
            None in sim.
        broker: the broker the nodes met: its ``kind`` (a managed broker's name, or "external")
            and ``url`` (without credentials); None in sim.
        links: each emulated host's link and what it carried round by round (links.netns:
            testbed.orchestration.links.LinkRounds.summary); None without links.
        authentication: whether the run's messages were authenticated (testbed.mqtt.auth) and how
            many received frames did not authenticate; None in sim.
        randomness: node → the randomness its ready said keys its private draws
            (testbed.streams.node_secret.RANDOMNESS); None in sim (every node's is the run seed).
        server_randomness: what keyed the server's private draws: "server_secret" (the
            coordinator's, over MQTT with a node that has a secret) or "run_seed" (sim, emulated).
        sim_workers: the most worker processes a sim round's node steps ran in
            (testbed.orchestration.sim_workers; 0: every step in the run's process); None over MQTT.
    """

    charged: dict[tuple[int, int], list[Event]] = field(default_factory=dict)
    reports: dict[int, Totals] | None = None
    reported_rounds: dict[int, frozenset[int]] = field(default_factory=dict)
    session: str | None = None
    broker: dict[str, str] | None = None
    links: list[dict] | None = None
    authentication: dict | None = None
    randomness: dict[int, str] | None = None
    server_randomness: str = RUN_SEED
    sim_workers: int | None = None


class Nodes(Protocol):
    """The run's nodes.

    Attributes:
        session: this session's id (16 hex digits): one per process that runs (or resumes) the run.
        earlier_sessions: the run's sessions before this one (set by the runner; over MQTT the stop
            names them, and each node's report adds what it spent in them).
    """

    session: str
    earlier_sessions: tuple[str, ...]

    def setup(self, state: State, asking: Callable[[RoundContext], None] | None = None) -> RoundOutcome:
        """The algorithm's one-time setup phase on every node; ``asking`` as in :meth:`round`."""
        ...

    def round(self, state: State, round_index: int, excluded: frozenset[int],
              sampled: tuple[int, ...] | None = None, meanwhile: Callable[[], None] | None = None,
              asking: Callable[[RoundContext], None] | None = None) -> RoundOutcome:
        """Round ``round_index`` from ``state`` for the ``sampled`` nodes (None: all of them);
        ``excluded`` are emulated stragglers among them (asked nothing). ``asking(ctx)`` is called
        with the nodes about to be asked (``ctx.expected``) before anything is sent or stepped (the
        run's record of who may have released). ``meanwhile`` (the report
        of the round before: its evaluation, metrics and checkpoint) is called once, after the
        round is sent and before its replies are awaited: the server's work overlaps the nodes'."""
        ...

    def planned_release(self, node: int, ctx: RoundContext) -> list[Event]:
        """What ``node``'s release in ``ctx`` is charged when its own events never came: the plan,
        its seconds and joules the most the node was charged in one such event (at least the plan's)."""
        ...

    def deliver(self, events: list[Event]) -> None:
        """Events the server issued on nodes' behalf, for the nodes' own ledgers."""
        ...

    def close(self, status: str) -> Closing:
        """Tell the nodes the run ended with ``status``; what the end adds to the ledger."""
        ...
