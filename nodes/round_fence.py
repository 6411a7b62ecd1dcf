"""Which round messages a host still serves: none of a round that has closed.

The coordinator sends round r+1 of a session only after round r closed, so a newer round of the
same session tells a node that every older one is over. A host (or a bridge) that comes back from
a stall finds several rounds in its inbox for a node; stepping each would run, release and charge
rounds nobody uses any more (on a microcontroller, seconds of compute each). :class:`RoundFence`
keeps, per node and session, the newest round seen (in the batch the host gathered, and every
round it served before) and drops the older ones with one log line per batch.

A round's messages share its index: the round itself, an over-the-air round's received signal,
and the setup (wire round 0, which comes before round 0). The stop carries the last round the
coordinator sent: it closes that round too (a node stalled through the end of a run runs nothing
more); the stop itself is never dropped. A repeat of the newest round is not dropped here: the
node's ledger charges a round once, and an over-the-air round's second message has the same index.

Example::

    >>> from testbed import protocol, wire
    >>> from testbed.mqtt.client import Inbound
    >>> def round_(i):
    ...     raw = protocol.round_("r", "s", i, "", [0], {})
    ...     return Inbound("tb/r/bcast", "bcast", None, raw, wire.decode(raw), receiver="0")
    >>> fence = RoundFence(nodes=1)
    >>> late = [round_(3), round_(4), round_(5)]
    >>> [item.message.round for item in fence.current(late)], fence.skipped
    ([5], 2)
    >>> fence.current(late[:1]), fence.skipped    # round 3 again: closed, never stepped
    ([], 3)
"""

from __future__ import annotations

import collections
import logging
from typing import Iterable

from testbed import protocol, wire
from testbed.mqtt.client import Inbound

log = logging.getLogger(__name__)

#: The messages that belong to one round of a node (dropped once it closed).
ROUND_KINDS = frozenset({protocol.ROUND, protocol.SETUP, protocol.RECEIVED})
#: Sessions remembered per node (a board follows resumed runs): older entries are forgotten, and
#: the host's session fence refuses their rounds anyway.
_SESSIONS_PER_NODE = 4


def round_order(msg: wire.Message) -> int:
    """Where ``msg`` stands among a session's messages: the setup, then each round's messages,
    each followed by a stop of that round (which closes it)."""
    if msg.kind == protocol.SETUP:
        return -1
    return 2 * msg.round + (msg.kind == protocol.STOP)


class RoundFence:
    """The newest round served per (node, session), and the round messages it makes stale.

    Args:
        nodes: the host's node count (bounds what is remembered: a few sessions per node).

    Attributes:
        skipped: round messages dropped so far (rounds that had closed).
    """

    def __init__(self, nodes: int):
        self._newest: collections.OrderedDict[tuple[str | None, str | None], int] = collections.OrderedDict()
        self._limit = max(1, nodes) * _SESSIONS_PER_NODE
        self.skipped = 0

    def current(self, items: Iterable[Inbound]) -> list[Inbound]:
        """``items`` (what a host gathered, in order) without the round messages of a round older
        than the newest of the same receiving node and session, in this batch or served before;
        the newest are remembered as served."""
        items = list(items)
        newest: dict[tuple[str | None, str | None], int] = {}
        for item in items:
            msg = item.message
            if msg is not None and (msg.kind in ROUND_KINDS or msg.kind == protocol.STOP):
                key = (item.receiver, protocol.session_of(msg))
                newest[key] = max(newest.get(key, self._newest.get(key, -2)), round_order(msg))
        kept: list[Inbound] = []
        dropped: collections.Counter[int] = collections.Counter()
        for item in items:
            msg = item.message
            if msg is not None and msg.kind in ROUND_KINDS and \
                    round_order(msg) < newest[(item.receiver, protocol.session_of(msg))]:
                dropped[msg.round] += 1  # the setup counts as round 0, as on the wire
                continue
            kept.append(item)
        for key, order in newest.items():
            self._newest[key] = order
            self._newest.move_to_end(key)
        while len(self._newest) > self._limit:
            self._newest.popitem(last=False)
        if dropped:
            self.skipped += sum(dropped.values())
            log.warning("skipped %d message(s) of closed round(s) %s: a newer round of the same session came "
                        "(nothing run, nothing charged)", sum(dropped.values()), sorted(dropped))
        return kept

