"""The modelled round time of an emulated board, for the ``deadline`` straggler model
(testbed.rounds.stragglers draws the stragglers from it).

The board's time is compute (steps × FLOPs per step at the reference host's modelled throughput,
scaled by the profile's compute_time_factor) plus link airtime (the channel model's where the
events carry it, else the profile's Wi-Fi): deterministic, no measured CPU time, so sim and MQTT
see the same stragglers.

Example::

    >>> from testbed.devices.profiles import load_profile
    >>> round(modelled_round_time_s(load_profile("host"), local_steps=10, flops_per_step=1e6,
    ...                             bytes_up=0, bytes_down=0), 6)
    0.01
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from nodes.meters.clock import comm_cost
from testbed.devices.profiles import DeviceProfile, load_profile

if TYPE_CHECKING:
    from testbed.algorithms.contract import Algorithm, RoundContext

#: Effective floating-point throughput of the REFERENCE HOST (nodes/profiles.toml: one Zen 4 EPYC
#: core) on our numpy workload, in FLOP/s. A MODEL CONSTANT, not a measurement of any run: our steps
#: are many tiny numpy calls, so call overhead, not arithmetic, bounds them. One timing of a
#: logistic-regression gradient (d = 86, K = 2, batch 32: 22 kFLOP in 33 µs of CPU) gave 0.66 GFLOP/s;
#: rounded to 1 GFLOP/s. A board's time is this host time × the profile's compute_time_factor.
REFERENCE_HOST_FLOPS_PER_S = 1.0e9

def modelled_round_time_s(profile: DeviceProfile, *, local_steps: int, flops_per_step: float, bytes_up: int,
                          bytes_down: int, airtime_s: float | None = None) -> float:
    """The board's modelled time for one round: local compute plus link airtime, in seconds.

    compute_s = local_steps · flops_per_step / REFERENCE_HOST_FLOPS_PER_S · profile.compute_time_factor;
    airtime_s = nodes.meters.clock.comm_cost(bytes_up, bytes_down, profile)[0] (Wi-Fi up, then down),
    unless the channel model already gives the link's airtime (``airtime_s``; DWFL's events carry
    it): each cost has one owner, as in nodes.costs. Deterministic (no measured CPU time), so sim and MQTT draw the same stragglers.

    Input
    -----
    profile : DeviceProfile
        The node's board (nodes/profiles.toml).
    local_steps : int
        Local steps of the round (>= 0).
    flops_per_step : float
        Floating-point operations of one local step (>= 0), e.g. ~ 6 · batch · num_params for a
        linear model's forward and backward pass.
    bytes_up, bytes_down : int
        Payload bytes sent and received in the round.
    airtime_s : float, optional
        The round's link airtime from the channel model, seconds (>= 0); replaces the profile's
        Wi-Fi airtime when given (pass a CommunicationEvent's airtime_s when it is nonzero).

    Output
    ------
    round_time_s : float, seconds

    Example
    -------
    >>> from testbed.devices.profiles import load_profile
    >>> host = load_profile("host")
    >>> round(modelled_round_time_s(host, local_steps=10, flops_per_step=1e6, bytes_up=0, bytes_down=0), 6)
    0.01
    """
    if local_steps < 0 or flops_per_step < 0 or bytes_up < 0 or bytes_down < 0:
        raise ValueError("local_steps, flops_per_step, bytes_up and bytes_down must be >= 0")
    if airtime_s is not None and not airtime_s >= 0:
        raise ValueError(f"airtime_s must be >= 0 seconds, got {airtime_s}")
    compute_s = local_steps * flops_per_step / REFERENCE_HOST_FLOPS_PER_S * profile.compute_time_factor
    link_s = comm_cost(bytes_up, bytes_down, profile)[0] if airtime_s is None else float(airtime_s)
    return compute_s + link_s


def round_times_s(profile_name: str, algorithm: "Algorithm", ctx: "RoundContext") -> np.ndarray:
    """(len(ctx.expected),) each expected node's modelled round time, s, from the round's planned
    events (steps, bytes, the channel model's airtime where the events carry it)."""
    from testbed.ledger.events import CommunicationEvent, ComputeEvent

    profile = load_profile(profile_name)
    times = np.empty(len(ctx.expected))
    for i, node in enumerate(ctx.expected):
        events = algorithm.planned_events(node, ctx)
        steps = sum(e.local_steps for e in events if isinstance(e, ComputeEvent))
        comm = [e for e in events if isinstance(e, CommunicationEvent)]
        airtime = sum(e.airtime_s for e in comm)
        times[i] = modelled_round_time_s(profile, local_steps=steps, flops_per_step=algorithm.flops_per_step,
                                         bytes_up=sum(e.bytes_up for e in comm),
                                         bytes_down=sum(e.bytes_down for e in comm),
                                         airtime_s=airtime if airtime > 0 else None)
    return times
