"""Replay guard of the MQTT transport: a message whose (sender, round, kind, id) was seen before is
refused, in bounded memory (QoS 1 may deliver a message twice; an attacker may resend one).

Example::

    >>> from testbed.mqtt import wire
    >>> guard = ReplayGuard()
    >>> msg = wire.decode(wire.encode({"run": "r", "round": 1, "sender": "n0", "kind": "update"}))
    >>> guard.check(msg)
    >>> try:
    ...     guard.check(msg)
    ... except wire.WireError as exc:
    ...     print(exc.code)
    replay
"""

from __future__ import annotations

import collections

from testbed.mqtt.wire import Message, WireError


class ReplayGuard:
    """Rejects a message whose (sender, round, kind, msg_id) was seen before, in bounded memory.

    QoS 1 may deliver a message twice and an attacker may resend a captured one; both are dropped.
    Keys are kept per sender for that sender's latest `window_rounds` rounds only (rounds only
    grow within a run, so older keys are dead weight: an unbounded set grew ~KB per round), and a
    message of a round before that window is rejected as a replay too: it cannot be told apart
    from one, and accepting it would let an old round be replayed once its keys are forgotten.
    Windows are per sender, so one sender's jump ahead cannot push others' messages out.

    Memory: at most `max_per_round` keys per sender and round (more is a flood, not a protocol:
    the extra messages are rejected, never admitted unchecked) and `max_entries` keys overall (past
    it the oldest round of keys is forgotten; only a flood of distinct senders gets there).
    """

    def __init__(self, max_entries: int = 65536, window_rounds: int = 16, max_per_round: int = 1024):
        if window_rounds < 1 or max_per_round < 1 or max_entries < 1:
            raise ValueError("window_rounds, max_per_round and max_entries must be >= 1")
        self._max = max_entries
        self._window = window_rounds
        self._per_round = max_per_round
        self._rounds: dict[str, dict[int, set[tuple[str, str]]]] = {}  # sender -> round -> keys
        self._order: collections.OrderedDict[tuple[str, int], None] = collections.OrderedDict()  # oldest first
        self._latest: dict[str, int] = {}  # sender -> highest round seen
        self._count = 0

    @property
    def window_rounds(self) -> int:
        """How many of a sender's latest rounds are remembered; older rounds are rejected."""
        return self._window

    def check(self, msg: Message) -> None:
        """Remember `msg`; raise WireError("replay") if it was already seen, or is of a round
        before its sender's replay window."""
        latest = self._latest.get(msg.sender)
        if latest is not None and msg.round <= latest - self._window:
            raise WireError("replay", f"message {msg.msg_id} from {msg.sender!r} is of round {msg.round}, before "
                                      f"the replay window (rounds {latest - self._window + 1}..{latest})")
        rounds = self._rounds.setdefault(msg.sender, {})
        keys = rounds.get(msg.round)
        if keys is None:
            keys = rounds[msg.round] = set()
            self._order[(msg.sender, msg.round)] = None
        key = (msg.kind, msg.msg_id)
        if key in keys:
            raise WireError("replay", f"duplicate message {msg.msg_id} from {msg.sender!r} "
                                      f"(round {msg.round}, {msg.kind})")
        if len(keys) >= self._per_round:
            raise WireError("replay", f"over {self._per_round} messages from {msg.sender!r} in round {msg.round}")
        keys.add(key)
        self._count += 1
        if latest is None or msg.round > latest:
            self._latest[msg.sender] = msg.round
            first = msg.round - self._window + 1
            # Rounds are >= 0 (wire checks every header): with a window reaching back past round 0
            # (the coordinator's covers the whole run) nothing can fall out, and the scan over a
            # sender's rounds held, one more each round, is skipped (O(rounds) a reply).
            if first > 0:
                for old in [r for r in rounds if r < first]:  # at most window_rounds + a few late ones
                    self._drop(msg.sender, old)
        while self._count > self._max:
            self._drop(*next(iter(self._order)))

    def _drop(self, sender: str, round_index: int) -> None:
        self._count -= len(self._rounds[sender].pop(round_index))
        del self._order[(sender, round_index)]

    def __len__(self) -> int:
        """Keys held (bounded; see the class docstring)."""
        return self._count
