"""One node as the watch page shows it: its ledger and what the ledger alone does not say
(:class:`NodeView`), its state in the last completed round (online, straggling, offline, waiting,
missing, unknown once the run's coordinator is gone), what it runs on, and its row: rounds,
straggles, refusal, ε by observer, energy, cost, bytes, and its channel where there is one.
:class:`NodeRows` is that part of testbed.watch.feed.RunFeed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from testbed.ledger.node import NodeLedger
from testbed.watch.checks import json_number, one_line

#: ε figures kept for tallies seen (most nodes of a run share a few; a bound, not a leak per round).
EPS_CACHE_SIZE = 4096


@dataclass
class NodeView:
    """One node as the page shows it: its ledger and what the ledger alone does not say."""

    ledger: NodeLedger
    last_round: int = -1            # last round (0-based) with the node's own events
    straggle_round: int = -1        # last round it straggled, and why
    straggle_reason: str = ""
    measured: bool | None = None    # True once any of its costs came from a meter
    mqtt: str | None = None         # "online"/"offline" from its status topic
    mqtt_at: float | None = None    # unix time of that message
    version: int = 0


class NodeRows:
    """The node rows of a run's page (a part of :class:`testbed.watch.feed.RunFeed`: its config,
    metrics, refusals, channel and ε cache)."""

    def _epsilon(self, node: int, tally) -> float | None:
        """ε of a tally at the run's δ; None (and the ledger's problem) if its accountant cannot
        account it (a signature the run's algorithm never makes)."""
        key = tuple(sorted(tally.items()))
        if key in self._eps_cache:
            return self._eps_cache[key]
        from testbed.privacy.accountants import epsilon

        p = self.config.privacy
        try:
            eps = epsilon(p.accountant, tally, p.delta)
        except (ValueError, ArithmeticError) as exc:
            eps = None
            self._problem("ledger.csv", f"node {node}: its privacy events cannot be accounted: {one_line(exc)}")
        if len(self._eps_cache) >= EPS_CACHE_SIZE:
            self._eps_cache.clear()
        self._eps_cache[key] = eps
        return eps

    def node_state(self, view: NodeView) -> tuple[str, str | None]:
        """(online/offline/straggling/waiting/unknown, why) of a node in the last completed round;
        a status message over MQTT that says offline wins (the node is gone now). Once the run is
        killed, a node that lived in the run or was started by it (sim, emulated boards: they leave
        with their coordinator) is offline, and a real board is what its status topic says, else
        unknown: its last round says nothing of it now."""
        r = self.current_round()
        if view.mqtt == "offline":
            return "offline", "status topic"
        if self.killed:
            c = self.config
            if c.run.mode == "sim" or c.mqtt.emulated:
                return "offline", "the run's coordinator is gone (and the nodes it ran)"
            if view.mqtt == "online":
                return "online", "status topic (the run's coordinator is gone)"
            return "unknown", "the run's coordinator is gone; the board said nothing since"
        if r >= 0 and view.straggle_round == r:
            return ("offline" if view.straggle_reason == "offline" else "straggling"), view.straggle_reason
        if r >= 0 and view.last_round >= r:
            return "online", None
        if view.mqtt == "online":
            return "online", "status topic"
        return ("waiting", None) if r < 0 else ("missing", "no events this round")

    def _board(self, node: int) -> str | None:
        """What the node runs on, as the config says: its kind (sim, emulated board, real board,
        microcontroller) and profile; a real board's profile is its own (`testbed node --profile`)."""
        c = self.config
        if c is None:
            return None
        if node in c.nodes.mcu:
            return f"mcu · {c.nodes.mcu_profile}"
        if c.run.mode == "sim":
            return f"sim · {c.nodes.profile}"
        return f"emulated · {c.nodes.profile}" if c.mqtt.emulated else "board"

    def _row(self, node: int, view: NodeView) -> dict[str, Any]:
        t = view.ledger.totals
        # Not (ε, δ)-DP: ε is infinite (null), whatever other releases the ledger accounts.
        raw = {o: self._epsilon(node, tally) for o, tally in sorted(view.ledger.by_observer.items())} \
            if self.config is not None and self.guarantee == "dp" else {}
        known = [e for e in raw.values() if e is not None]
        state, why = self.node_state(view)
        last_seen = None
        if 0 <= view.last_round < len(self.metrics):
            last_seen = self.metrics[view.last_round]["wall_s"]
        board = self._board(node)
        ch = self._channel
        return {
            "id": node, "state": state, "why": why,
            "rounds": t.rounds, "straggled": t.rounds_straggled, "last_round": view.last_round + 1,
            # The round (from 1, as last_round) it refused for its own budget: asked nothing since.
            "refused_round": self.refused[node] + 1 if node in self.refused else None,
            "last_seen_s": last_seen, "status_at": view.mqtt_at,
            # An observer's ε that cannot be accounted leaves the headline unknown, not understated.
            "epsilon": json_number(max(known, default=0.0)) if len(known) == len(raw) and self.guarantee == "dp" else None,
            "epsilon_by": {o: json_number(e) for o, e in raw.items()},
            "energy_j": json_number(t.energy_j), "cost_units": json_number(t.cost_units), "bytes": t.bytes_total,
            "mi_epsilon": json_number(t.mi_epsilon_nats), "board": board, "measured": view.measured,
            "gain": ch.gain[node] if ch is not None and node < len(ch.gain) else None,
            "snr_db": ch.snr_db[node] if ch is not None and node < len(ch.snr_db) else None,
        }
