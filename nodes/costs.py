"""What a node charges to its ledger for seconds and joules: a meter's reading where the board has
one, the device profile's model where it does not; every event says which.

Example::

    >>> from testbed.ledger.events import ComputeEvent, CommunicationEvent
    >>> costs = NodeCosts("pi-4b", meter="model")
    >>> events = [ComputeEvent(0, 0, local_steps=10), CommunicationEvent(0, 0, bytes_up=800, bytes_down=800)]
    >>> charged = costs.charge_modelled(events, host_cpu_s=0.01)
    >>> charged[0].compute_s > 0.01, charged[1].airtime_s > 0, charged[1].measured
    (True, True, False)
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import Iterator, Protocol, Sequence

from nodes.meters.base import Measurement
from nodes.meters.clock import Pacer, comm_cost, compute_cost
from nodes.meters.registry import make_meter
from testbed.devices.profiles import load_profile
from testbed.ledger.events import CommunicationEvent, ComputeEvent, Event, NodeEvents, with_fields


def has_radio_figures(event: CommunicationEvent) -> bool:
    """Whether ``event`` already carries airtime or radio energy (from the channel model).

    >>> has_radio_figures(CommunicationEvent(0, 0, bytes_up=8, bytes_down=8, airtime_s=1e-3, energy_j=2e-3))
    True
    >>> has_radio_figures(CommunicationEvent(0, 0, bytes_up=8, bytes_down=8))
    False
    """
    return event.airtime_s != 0.0 or event.energy_j != 0.0


class NodeCosts:
    """Seconds and joules of one node (or of every node of a sim run, which share one profile).

    Args:
        profile: device profile name (nodes/profiles.toml); "host" is this machine as it is.
        meter: "auto" or a registered meter (see nodes.meters.registry.make_meter).
        pacing: an emulated board sleeps so that each step takes the wall time the board would.
    """

    def __init__(self, profile: str = "host", meter: str = "auto", pacing: bool = False):
        self.profile = load_profile(profile)
        self.meter = make_meter(meter, profile)
        self.pacer = Pacer(pacing)

    @contextmanager
    def measure(self) -> Iterator[list[Measurement]]:
        """``with costs.measure() as m: <step>`` then ``m[0]``: the step's Measurement, after
        pacing the step to the board's time."""
        start = time.monotonic()
        box: list[Measurement] = []
        with self.meter.measure() as span:
            yield box
        box.append(span.result)
        self.pacer.wait(span.result.seconds, time.monotonic() - start)

    def charge(self, events: Sequence[Event], compute: Measurement) -> list[Event]:
        """``events`` with the step's compute measurement and, where needed, the link's airtime/energy.

        Each cost has one owner: a CommunicationEvent that already carries airtime or energy (from
        the channel model, e.g. DWFL's planned events) keeps them as they are, so the ledger holds
        the joules the budget check forecast. Only an event without radio figures (DP-PASGD's) gets
        the device profile's Wi-Fi model (nodes.meters.clock.comm_cost), marked ``measured=False``.
        The node field is never read: a host charges one plan for the nodes it stepped together
        (:func:`charge_by_node`).
        """
        charged = []
        for e in events:
            if isinstance(e, ComputeEvent):
                e = with_fields(e, compute_s=compute.seconds, energy_j=compute.energy_j, measured=compute.measured)
            elif isinstance(e, CommunicationEvent) and self.profile.emulated and not has_radio_figures(e):
                airtime_s, energy_j = comm_cost(e.bytes_up, e.bytes_down, self.profile)
                e = with_fields(e, airtime_s=airtime_s, energy_j=energy_j, measured=False)
            charged.append(e)
        return charged

    def charge_modelled(self, events: Sequence[Event], host_cpu_s: float) -> list[Event]:
        """As :meth:`charge` for a node whose step took ``host_cpu_s`` of host CPU in a shared
        process (sim mode): seconds and joules from the profile's model."""
        board_s, energy_j = compute_cost(host_cpu_s, self.profile)
        return self.charge(events, Measurement(board_s, energy_j, False, f"model:{self.profile.name}"))

    def close(self) -> None:
        self.meter.close()


class Charging(Protocol):
    """What charges a node's step: a :class:`NodeCosts`, or a board's costs
    (firmware_bridge.costs.BoardCosts)."""

    def charge(self, events: Sequence[Event], compute: Measurement) -> list[Event]: ...


def charge_by_node(costs: Charging, events: Sequence[Sequence[Event]] | NodeEvents, node_ids: Sequence[int],
                   compute: Measurement) -> dict[int, list[Event]]:
    """Each node's ``events`` (a step's: ``node_ids[i]``'s at ``i``) charged with its ``compute``
    share by ``costs`` (:class:`Charging`), by node.
    Where they differ only in their node field (a NodeEvents without columns: a host's nodes
    stepped on one plan) and ``costs`` is a NodeCosts, whose :meth:`NodeCosts.charge` never reads
    the node field, the plan is charged once and each node gets its copy (4 µs a node less on a
    host's round)."""
    if isinstance(costs, NodeCosts) and isinstance(events, NodeEvents) \
            and not any(batch.columns for batch in events.batches):
        plan = costs.charge([batch.template for batch in events.batches], compute)
        return {node: [with_fields(event, node=node) for event in plan] for node in events.nodes.tolist()}
    return {node: costs.charge(own, compute) for node, own in zip(node_ids, events)}
