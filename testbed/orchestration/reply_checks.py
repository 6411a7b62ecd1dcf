"""What the coordinator takes from a node, checked before it is used: a message's session, kind
and round (``_admit``, on the network thread before any per-sender state moves), a refusal's
figures, an update's events against the round's plan in every field but the seconds and joules
the node measured, each within its physical bound (testbed.orchestration.measured_bounds); and what
a release whose own events never came is charged: the plan at the most seconds and joules the node
reported in one such event. :class:`ReplyChecks` is that part of
testbed.orchestration.coordinator.MqttNodes."""

from __future__ import annotations

import dataclasses
import time
from typing import Sequence


from testbed.accounting.budgets import BUDGET_NAME
from testbed.algorithms.contract import SETUP_ROUND, Algorithm, RoundContext, planned_batch
from testbed.assembly.config import MqttSection, NodesSection
from testbed.ledger.events import EVENT_TYPES, Event, NodeEvents, with_fields
from testbed.ledger.fields import FIELD_RULES, MEASURED_FIELDS, PlannedForm, event_within, planned_within
from testbed.mqtt import wire
from testbed.orchestration.measured_bounds import MeasuredBounds
from testbed.rounds import protocol
from testbed.util.numbers import finite_real

#: What a node may send the coordinator; anything else on its uplink is refused before it moves any state.
FROM_NODES = frozenset({protocol.UPDATE, protocol.SETUP_UPDATE, protocol.REFUSED, protocol.LEDGER, protocol.READY})
#: Per event kind, its measured or modelled numbers (seconds, joules).
MEASURED_NUMBERS = {kind: tuple(f.name for f in dataclasses.fields(cls)
                                 if f.name in MEASURED_FIELDS and FIELD_RULES[f.name].type is float)
                     for kind, cls in EVENT_TYPES.items()}


class ReplyChecks:
    """A node's replies checked against the plan (a part of
    :class:`testbed.orchestration.coordinator.MqttNodes`: its ``alg``, ``session``, ``_bounds``,
    ``_sent_at``, ``_open_round``, ``_costliest`` and ``_lock``)."""

    # What _as_planned compares a reply of a round with: that round, the form of each event of its
    # plan when every node's is that but for its node field (else None), the nodes asked, and
    # each form's least bounds by the bounds object they are of (id: one object serves every node
    # of a profile, and self._bounds keeps it alive).
    _round_plans: tuple[RoundContext, tuple[PlannedForm, ...] | None, frozenset[int],
                        dict[int, tuple[tuple[float, ...], ...]]] | None = None

    def _planned(self, node: int, ctx: RoundContext) -> list[Event]:
        if ctx.round_index == SETUP_ROUND:
            return self.alg.setup_events(node)  # type: ignore[attr-defined]
        return self.alg.planned_events(node, ctx)

    def planned_release(self, node: int, ctx: RoundContext) -> list[Event]:
        """:meth:`_planned_release`, for the runner (a node an earlier session of the run asked,
        which never answered into the ledger), under the lock the network thread notes costs under."""
        with self._lock:
            return self._planned_release(node, ctx)

    def _planned_release(self, node: int, ctx: RoundContext) -> list[Event]:
        """What a release whose own events never came (or came malformed) is charged: the plan, its
        seconds and joules the most the node reported in one such event so far (nothing known of
        them: the plan's, as a node without a meter or profile would log them)."""
        return [with_fields(e, **self._costliest[node, e.kind]) if (node, e.kind) in self._costliest else e
                for e in self._planned(node, ctx)]

    def _release_at_bound(self, node: int, ctx: RoundContext) -> list[Event]:
        """What a release is charged whose reply came (now) with events that are not the plan, so
        that they say nothing of what it spent: the plan, each measured number at its bound for the
        window the round has been open (testbed.orchestration.measured_bounds: nothing the node
        could have spent is above it), never below the most the node reported in one such event. A
        node whose profile the run does not declare has no such bound (the fixed caps are a day
        and a kilowatt): charged as a release whose events never came (:meth:`_planned_release`).
        Lock held."""
        planned = self._planned_release(node, ctx)
        sent_at = self._sent_at.get(ctx.round_index)
        bounds = self._bounds.get(node)
        if sent_at is None or bounds is None or bounds.device is None:
            return planned
        open_s = time.monotonic() - sent_at
        charged = []
        for event in planned:
            limits = bounds.limits(event, open_s)
            charged.append(with_fields(event, **{name: max(bound, getattr(event, name)) for name, bound in limits.items()})
                           if limits else event)
        return charged

    def _note_costs(self, node: int, events: list[Event]) -> None:
        """Keep the most seconds and joules ``node`` reported per event kind (lock held)."""
        for event in events:
            fields = MEASURED_NUMBERS.get(event.kind)
            if fields:
                seen = self._costliest.get((node, event.kind))
                if seen is None:  # (not setdefault: its default would be built for every reply)
                    seen = self._costliest[node, event.kind] = dict.fromkeys(fields, 0.0)
                for name in fields:
                    value = getattr(event, name)
                    if value > seen[name]:
                        seen[name] = value

    def _check_events(self, node: int, ctx: RoundContext, msg: wire.Message) -> list[Event]:
        """The update's events, refused unless they are the round's plan in every field (node, round,
        privacy, steps, bytes, cost units...) but the finite non-negative seconds and joules the node
        measured or modelled (testbed.ledger.fields.MEASURED_FIELDS), each within its physical bound
        (testbed.orchestration.measured_bounds: the node's profile and how long its round was open)."""
        events, problems = self._bounded_events(node, ctx, msg)
        if problems:
            raise wire.WireError("bad_header", "; ".join(problems))
        return events

    def _bounded_events(self, node: int, ctx: RoundContext, msg: wire.Message) -> tuple[list[Event], list[str]]:
        """The update's events, and why any measured field is refused (beyond its rule or bound);
        WireError when they are not the plan in another field. A refused field is charged at its
        bound when the node's profile and round window give one (nothing the node could have spent
        is above it), else (the fixed caps: a day, a kilowatt, no estimate of anything) as a
        release whose events never came: the most the node reported in such an event, or the plan."""
        raw = msg.meta.get("events")
        fast = self._as_planned(node, ctx, raw)
        if fast is not None:
            return fast, []
        planned = self._planned(node, ctx)
        if not isinstance(raw, list) or len(raw) != len(planned):
            kinds = [e.get("kind") if isinstance(e, dict) else e for e in raw[:10]] if isinstance(raw, list) else raw
            raise wire.WireError("bad_header", f"events {kinds!r:.200}, the plan says {[e.kind for e in planned]}")
        sent_at = self._sent_at.get(ctx.round_index)
        bounds = self._bounds.get(node, FIXED_CAPS) if sent_at is not None else FIXED_CAPS
        open_s = time.monotonic() - sent_at if sent_at is not None else 0.0
        # An honest reply's events, every measured number within its least bound (that of a window
        # closing at once), are taken as they are: the decision event_within makes at any window.
        fast = [planned_within(values, want, bounds.least_limits(want)) for values, want in zip(raw, planned)]
        if None not in fast:
            return fast, []  # type: ignore[return-value]
        derived = bounds.device is not None

        def check(values: object, want: Event) -> tuple[Event, list[str]]:
            limits = bounds.limits(want, open_s)
            return event_within(values, want, limits, None if derived else self._costliest.get((node, want.kind), {}))

        try:
            checked = [check(values, want) for values, want in zip(raw, planned)]
        except ValueError as exc:
            raise wire.WireError("bad_header", str(exc)) from None
        return [event for event, _ in checked], [why for _, problems in checked for why in problems]

    def _as_planned(self, node: int, ctx: RoundContext, raw: object) -> list[Event] | None:
        """An honest reply's events on the fast path of a round whose nodes' plans are one plan but
        for the node field (contract.planned_batch: a NodeEvents without columns, made once a round
        at its first reply, the source of the nodes' own events): each its plan's for ``node``, its
        measured numbers within their least bounds (planned_within, as each plan event's
        PlannedForm). None where the long path decides: another round's shape of plan, the setup, a
        node not asked, anything else."""
        if ctx.round_index == SETUP_ROUND or raw.__class__ is not list:
            return None
        plans = self._round_plans  # one read: the other thread may replace it meanwhile
        if plans is None or plans[0] is not ctx:
            # Planned once only where the algorithm says its nodes' plans are alike (a per-node
            # plan gathered for every node here would be the long path's work twice).
            batch = planned_batch(self.alg, ctx.expected, ctx) \
                if ctx.expected and getattr(self.alg, "uniform_plans", False) else None
            alike = isinstance(batch, NodeEvents) and not any(b.columns for b in batch.batches)
            forms = tuple(PlannedForm(b.template) for b in batch.batches) if alike else None  # type: ignore[union-attr]
            plans = self._round_plans = (ctx, forms, frozenset(ctx.expected), {})
        forms, asked, leasts = plans[1], plans[2], plans[3]
        if forms is None or node not in asked or len(raw) != len(forms):  # type: ignore[arg-type]
            return None
        sent_at = self._sent_at.get(ctx.round_index)
        bounds = self._bounds.get(node, FIXED_CAPS) if sent_at is not None else FIXED_CAPS
        least = leasts.get(id(bounds))
        if least is None:
            least = leasts[id(bounds)] = tuple(form.least(bounds.least_limits(form.planned)) for form in forms)
        events = []
        for values, form, bound in zip(raw, forms, least):  # type: ignore[call-overload]
            event = form.within(values, bound, node)
            if event is None:
                return None
            events.append(event)
        return events

    def _events_or_none(self, node: int, ctx: RoundContext, msg: wire.Message) -> tuple[list[Event] | None, list[str]]:
        """What a refused or late reply released: its events if they are the plan, a measured field
        beyond its rule or bound charged at the bound (never less than the node could have spent),
        and why; None when they are not the plan in another field."""
        try:
            events, problems = self._bounded_events(node, ctx, msg)
        except wire.WireError:
            return None, []
        if not problems:
            self._note_costs(node, events)
        return events, problems

    def _admit(self, msg: wire.Message) -> str | None:
        """What the coordinator may take from a node, checked on the network thread before the
        client moves any per-sender state (its replay window): this session's, a kind a node sends
        the coordinator, of a round already sent. Why not, or None."""
        session = protocol.session_of(msg)
        if session != self.session:
            return f"session {session!r:.24}, not this run's"
        if msg.kind not in FROM_NODES:
            return f"a {msg.kind!r:.24} is not what a node sends the coordinator"
        if msg.round > self._open_round:
            return f"round {msg.round}, not sent yet (the last sent is {self._open_round})"
        return None


FIXED_CAPS = MeasuredBounds()  # a node whose profile is not known here


def node_bounds(mqtt: MqttSection, nodes: NodesSection, node_ids: Sequence[int],
                 algorithm: Algorithm) -> dict[int, MeasuredBounds]:
    """The bounds of each node's measured fields: from the profile it is emulated with here (a
    microcontroller's board profile, else ``nodes.profile``); none for nodes started elsewhere,
    whose profile the run does not declare (the fixed caps)."""
    if not mqtt.emulated:
        return {}
    board = MeasuredBounds.of_board(nodes.mcu_profile, algorithm.flops_per_step) if nodes.mcu else FIXED_CAPS
    device = MeasuredBounds.of_profile(nodes.profile)
    return {node: board if node in set(nodes.mcu) else device for node in node_ids}


def check_refusal(msg: wire.Message) -> None:
    """A refusal names the budget a node would break and two finite figures; WireError if not."""
    budget, figures = msg.meta.get("budget"), [msg.meta.get(k) for k in ("would_be", "limit")]
    if not isinstance(budget, str) or not BUDGET_NAME.fullmatch(budget) \
            or not all(v.__class__ in (int, float) and finite_real(v) is not None for v in figures):
        raise wire.WireError("bad_header", "a refusal needs a budget name (an identifier) and finite would_be and limit")
