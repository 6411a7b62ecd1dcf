"""Which round messages a host still serves: none of a round that has closed (invariant 6).

The coordinator sends round r+1 of a session only after round r closed, for every node (a node
it does not ask again, sampled out or a straggler, is no exception), so any message of a newer
round of a session tells every node of the host that each older round of that session is over.
A stop closes the round it names too (a node stalled through the end of a run runs nothing more);
the stop itself is never dropped. And a message of a newer session (a resumed run's coordinator)
closes every round of the sessions before it. A host (or a bridge) that comes back from a stall
finds several rounds in its inbox; stepping each would run, release and charge rounds nobody uses
any more (on a microcontroller, seconds of compute each). :class:`RoundFence` keeps the newest
session and its newest round, over the batch the host gathered and every batch before, and drops
the rest with one log line per batch, whichever batch a backlog arrives in: a closing message in
an earlier batch closes as one in the same batch does. (One in a later batch cannot be seen before
the round is stepped; the host gathers a backlog after a stall until its inbox is quiet, see
nodes.host, so a backlog split by the network arrives as one batch.)

A round's messages share its index: the round itself, an over-the-air round's received signal,
and the setup (wire round 0, which comes before round 0). A repeat of the newest round is not
dropped here: the node's ledger charges a round once, and an over-the-air round's second message
has the same index.

Example::

    >>> from testbed.rounds import protocol
    >>> from testbed.mqtt import wire
    >>> from testbed.mqtt.client import Inbound
    >>> def round_(i, node="0", session="s"):
    ...     raw = protocol.round_("r", session, i, "", [0, 1], {})
    ...     return Inbound("tb/r/bcast", "bcast", None, raw, wire.decode(raw), receiver=node)
    >>> fence = RoundFence()
    >>> late = [round_(3), round_(4), round_(5)]
    >>> [item.message.round for item in fence.current(late)], fence.skipped
    ([5], 2)
    >>> fence.current([round_(4, node="1")]), fence.skipped    # another node's round 4: closed too
    ([], 3)
    >>> [item.message.round for item in fence.current([round_(2, session="t")])]  # a newer session
    [2]
    >>> fence.current([round_(6)]), fence.skipped             # the older session's rounds: closed
    ([], 4)
"""

from __future__ import annotations

import collections
import logging
from typing import Callable, Iterable

from testbed.mqtt import wire
from testbed.mqtt.client import Inbound
from testbed.rounds import protocol

log = logging.getLogger(__name__)

#: The messages that belong to one round of a node (dropped once it closed).
ROUND_KINDS = frozenset({protocol.ROUND, protocol.SETUP, protocol.RECEIVED})
#: Sessions remembered (a board follows resumed runs): older entries are forgotten, and the host's
#: session fence refuses their rounds anyway.
_SESSIONS_REMEMBERED = 16


def round_order(msg: wire.Message) -> int:
    """Where ``msg`` stands among a session's messages: the setup, then each round's messages,
    each followed by a stop of that round (which closes it)."""
    if msg.kind == protocol.SETUP:
        return -1
    return 2 * msg.round + (msg.kind == protocol.STOP)


class RoundFence:
    """The newest session and its newest round a host has seen, and the round messages they make
    stale.

    Attributes:
        skipped: round messages dropped so far (rounds that had closed).
    """

    def __init__(self) -> None:
        self._session: str | None = None  # the newest session seen
        self._newest = -2  # the newest round_order seen in it (below the setup's)
        # sessions a newer one superseded: never current again (a late message of a killed coordinator)
        self._retired: collections.OrderedDict[str | None, None] = collections.OrderedDict()
        self.skipped = 0

    def current(self, items: Iterable[Inbound], admits: Callable[[str | None], bool] | None = None) -> list[Inbound]:
        """``items`` (what a host gathered, in arrival order) without the round messages of a
        closed round: one of a session older than the newest seen (in this batch or before), or
        older than the newest round of its session (any node's message, or a stop). ``admits``
        (the host's session fence): a session it refuses closes nothing and its messages are
        dropped here too."""
        items = list(items)
        refused: set[int] = set()  # of a session the host does not serve: dropped, closing nothing
        retired: set[int] = set()  # of a session a newer one superseded: closed
        last: wire.Message | None = None  # a broadcast's copies (one message object) follow each other:
        for i, item in enumerate(items):   # each is decided as the first of them was
            msg = item.message
            if msg is last and msg is not None:
                if i - 1 in refused:
                    refused.add(i)
                elif i - 1 in retired:
                    retired.add(i)
                continue
            last = msg
            if msg is None or not (msg.kind in ROUND_KINDS or msg.kind == protocol.STOP):
                continue
            session = protocol.session_of(msg)
            if admits is not None and not admits(session):
                refused.add(i)
                continue
            if session in self._retired:
                retired.add(i)
                continue
            if session != self._session:  # a newer session: every round of the one before is closed
                if self._newest > -2 or self._session is not None:
                    self._retired[self._session] = None
                    while len(self._retired) > _SESSIONS_REMEMBERED:
                        self._retired.popitem(last=False)
                self._session, self._newest = session, -2
            self._newest = max(self._newest, round_order(msg))
        kept: list[Inbound] = []
        dropped: collections.Counter[int] = collections.Counter()
        last, closed = None, False  # the message decided last, and whether its round had closed
        for i, item in enumerate(items):
            msg = item.message
            if i in refused:  # the host's session fence says why, once per session
                continue
            if msg is not None and msg.kind in ROUND_KINDS:
                if msg is not last:
                    last, closed = msg, (i in retired or protocol.session_of(msg) != self._session
                                         or round_order(msg) < self._newest)
                if closed:
                    dropped[msg.round] += 1  # the setup counts as round 0, as on the wire
                    continue
            if i in retired:  # a stop of a superseded session: nothing of it is served
                continue
            kept.append(item)
        if dropped:
            self.skipped += sum(dropped.values())
            log.warning("skipped %d message(s) of closed round(s) %s: a newer round or session came "
                        "(nothing run, nothing charged)", sum(dropped.values()), sorted(dropped))
        return kept
