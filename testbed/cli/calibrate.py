"""`testbed calibrate`: the joules and seconds of one local step (c2) and one round (c1) here.

DP-PASGD's cost model charges c1 per communication round and c2 per local step (eq. 8); the
planner reads them, in joules or seconds, from the TOML file this command writes.

- c2: one DP-PASGD local step through the real code path (``DpPasgd.node_step`` with τ = 1 on one
  node: logistic model with d features, batch 32, Gaussian noise, update), timed in blocks of
  steps long enough for a meter to resolve, per step.
- c1: encode the model, publish it at QoS 1, receive the reply (the client decodes and validates
  it) through a broker: ``--broker URL``, or an embedded amqtt broker on loopback. The echo peer
  that answers (the coordinator's part) runs in a child process, with the embedded broker, so its
  CPU time is not charged to the node.

With ``--profile host`` (this device as it is) seconds and joules come from the meter: CPU seconds
for a step, the wall time of the round trip (the real link) for a round. With a board profile the
board is emulated: the model meter scales CPU seconds by the board's compute_time_factor and
charges its active power, and a round adds the Wi-Fi airtime and radio energy of the messages'
bytes (nodes/meters/clock.py). Every figure is the median over ``--repeats``.

Example::

    testbed calibrate --profile pi-zero-2w --model-size 100 --repeats 20 --out calibration.toml
"""

from __future__ import annotations

import argparse
import contextlib
import math
import multiprocessing
import statistics
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from nodes.meters import registry as meters
from testbed.checked.arguments import COUNT, Number
from testbed.errors import UserError
from testbed.util import jsontext

#: Batch of a local step (the paper's X = 32) and the node id used for the round trip.
BATCH = 32
NODE = "calibrate"
#: A block of steps lasts at least this many host CPU seconds, so one measurement resolves it.
MIN_BLOCK_CPU_S = 0.05
REPLY_TIMEOUT_S = 10.0
#: The most measurements per cost: each is a block of steps and a round trip, seconds apiece.
MAX_REPEATS = 10_000
#: Bytes a local step holds per feature of the model: 200 samples of float64 and their copies.
_STEP_BYTES_PER_FEATURE = 200 * 8 * 4


def register(sub: argparse._SubParsersAction) -> None:
    cal = sub.add_parser("calibrate", help="measure the joules and seconds of a local step (c2) and a round (c1)")
    cal.add_argument("--profile", default="host",
                     help="device profile: 'host' (this device, measured) or an emulated board (default: host)")
    cal.add_argument("--model-size", type=COUNT, default=100, metavar="D",
                     help="features d of the logistic model, 2d + 2 parameters (default: 100)")
    cal.add_argument("--broker", metavar="URL", help="broker for the round trip (default: an embedded one on loopback)")
    *others, last = meters.kinds()
    cal.add_argument("--meter", default="auto", help=f"{', '.join(others)} or {last} (default: auto)")
    cal.add_argument("--out", type=Path, default=Path("calibration.toml"), help="the TOML file to write")
    cal.add_argument("--repeats", type=Number(int, ge=1, le=MAX_REPEATS), default=20,
                     help="measurements per cost; the median is kept")
    cal.set_defaults(handler=_calibrate)


@dataclass(frozen=True)
class Cost:
    """Median seconds and joules of one step or one round."""

    seconds: float
    joules: float


@dataclass(frozen=True)
class Calibration:
    """What `testbed calibrate` found (the TOML keeps profile, model_params, measured, c1, c2)."""

    profile: str
    model_params: int
    measured: bool
    c1: Cost
    c2: Cost
    meter: str
    repeats: int
    broker: str
    message_bytes: int
    round_trip_s: float


def calibrate(profile_name: str = "host", model_size: int = 100, *, broker_url: str | None = None,
              repeats: int = 20, meter_kind: str = "auto") -> Calibration:
    """Measure c1 and c2 on this device for ``profile_name``.

    Args:
        profile_name: "host" or a board profile (nodes/profiles.toml).
        model_size: d, features of the logistic model (2d + 2 parameters).
        broker_url: broker of the round trip; None starts an embedded one on loopback.
        repeats: measurements per cost (>= 1); medians are reported.
        meter_kind: see nodes.meters.registry.make_meter.
    Returns:
        The Calibration (seconds in s, joules in J, per step and per round).
    Raises:
        UserError: bad arguments, an unavailable meter, an unreachable broker, no reply.
    """
    from testbed.assembly.resources import check_count
    from testbed.devices.profiles import load_profile

    if repeats < 1 or model_size < 1:
        raise UserError(f"--repeats and --model-size must be >= 1, got {repeats} and {model_size}")
    check_count(model_size, _STEP_BYTES_PER_FEATURE, "--model-size")  # before the data are made
    profile = load_profile(profile_name)
    meter = meters.make_meter(meter_kind, profile)
    try:
        step, params = _step_cost(meter, model_size, repeats)
        c1, broker, message_bytes, round_trip_s = _round_cost(meter, profile, params, broker_url, repeats)
    finally:
        meter.close()
    return Calibration(profile.name, params.size, meter.measured, c1, step, meter.source, repeats,
                       broker, message_bytes, round_trip_s)


def _step_cost(meter: Any, model_size: int, repeats: int) -> tuple[Cost, Any]:
    """c2 and the model's initial parameters."""
    from testbed.data.synthetic import make_logistic
    from testbed.learning.models import LogisticRegression

    data = make_logistic(num_nodes=1, samples_per_node=200, dim=model_size, seed=0)
    model = LogisticRegression(model_size, 2)
    steps = _calibrated_step()(model, data, BATCH)
    params = model.init(None)
    steps(params, 3)  # warm-up: first-call allocations and imports are not a step's cost
    start = time.process_time()
    steps(params, 10)
    per_step_s = max((time.process_time() - start) / 10, 1e-7)
    block = max(1, math.ceil(MIN_BLOCK_CPU_S / per_step_s))
    results = []
    for _ in range(repeats):
        with meter.measure() as span:
            steps(params, block)
        results.append(span.result)
    return Cost(statistics.median(r.seconds / block for r in results),
                statistics.median(r.energy_j / block for r in results)), params


def _calibrated_step() -> Any:
    """The local step whose cost is c2: that of the one algorithm that offers it (its planner reads
    the calibration file)."""
    from testbed.algorithms import registry

    offering = registry.offering("calibration_step")
    if len(offering) != 1:
        raise RuntimeError(f"one algorithm may offer the calibrated local step, not {[r.name for r in offering]}")
    return offering[0].calibration_step


def _round_cost(meter: Any, profile: Any, params: Any, broker_url: str | None,
                repeats: int) -> tuple[Cost, str, int, float]:
    """c1, the broker used, the message size in bytes and the median round-trip wall time."""
    from nodes.meters.clock import comm_cost
    from testbed.mqtt import wire
    from testbed.mqtt import topics
    from testbed.mqtt.client import MqttClient

    run = f"cal{uuid.uuid4().hex[:12]}"
    with _echo_peer(broker_url, run) as url:
        client = MqttClient.for_node(url, run, NODE, protocol=_protocol(broker_url)).connect()
        try:
            seconds, joules, walls = [], [], []
            for rnd in range(repeats + 1):  # round 0 warms up the connection and the codec
                start = time.perf_counter()
                with meter.measure() as span:
                    payload = wire.encode({"run": run, "round": rnd, "sender": NODE, "kind": "update"},
                                          {"params": params})
                    client.publish(topics.up(run, NODE), payload)
                    reply = _await_reply(client, rnd)
                wall_s = time.perf_counter() - start
                if rnd == 0:
                    continue
                if profile.emulated:
                    airtime_s, radio_j = comm_cost(len(payload), reply.message.size_bytes, profile)
                    seconds.append(span.result.seconds + airtime_s)
                    joules.append(span.result.energy_j + radio_j)
                else:  # the link is real: its time and energy are in the measurement
                    seconds.append(wall_s)
                    joules.append(span.result.energy_j)
                walls.append(wall_s)
        finally:
            client.close(timeout_s=1.0)
    return (Cost(statistics.median(seconds), statistics.median(joules)), broker_url or "embedded amqtt on loopback",
            len(payload), statistics.median(walls))


def _await_reply(client: Any, rnd: int) -> Any:
    """The echo peer's downlink message of round ``rnd`` (skipping status messages)."""
    from testbed.mqtt import topics

    deadline = time.monotonic() + REPLY_TIMEOUT_S
    while (left := deadline - time.monotonic()) > 0:
        inbound = client.receive(left)
        if inbound is not None and inbound.kind == topics.DOWN and inbound.message.round == rnd:
            return inbound
    raise UserError(f"no reply through broker {client.url} within {REPLY_TIMEOUT_S:g} s")


@contextlib.contextmanager
def _echo_peer(broker_url: str | None, run: str) -> Iterator[str]:
    """Run the echo peer (and the embedded broker if ``broker_url`` is None) in a child process;
    yield the broker URL."""
    ctx = multiprocessing.get_context("spawn")  # no fork of a process with MQTT threads
    conn, child_conn = ctx.Pipe()
    stop = ctx.Event()
    proc = ctx.Process(target=_echo_main, args=(broker_url, run, child_conn, stop), daemon=True)
    proc.start()
    try:
        if not conn.poll(60):
            raise UserError("the echo peer of the round trip did not start within 60 s")
        status, value = conn.recv()
        if status != "ok":
            raise UserError(value)
        yield value
    finally:
        stop.set()
        proc.join(10)
        if proc.is_alive():
            proc.terminate()
            proc.join()


def _echo_main(broker_url: str | None, run: str, conn: Any, stop: Any) -> None:
    """Child process: answer every uplink message with a downlink message of the same tensors."""
    from testbed.mqtt import wire
    from testbed.mqtt import topics
    from testbed.mqtt.client import MqttClient
    from testbed.mqtt.embedded_broker import EmbeddedBroker

    broker = EmbeddedBroker().start() if broker_url is None else None
    try:
        url = broker.url if broker else broker_url
        try:
            client = MqttClient.for_coordinator(url, run, protocol=_protocol(broker_url)).connect()
        except UserError as exc:
            conn.send(("error", str(exc)))
            return
        conn.send(("ok", url))
        try:
            while not stop.is_set():
                inbound = client.receive(0.1)
                if inbound is None or inbound.kind != topics.UP:
                    continue
                msg = inbound.message
                reply = wire.encode({"run": run, "round": msg.round, "sender": client.coordinator_id,
                                     "kind": "model"}, dict(msg.tensors))
                client.publish(topics.down(run, inbound.node), reply)
        finally:
            client.close(timeout_s=1.0)
    finally:
        if broker:
            broker.stop()


def _protocol(broker_url: str | None) -> str:
    # The embedded amqtt broker speaks 3.1.1 only; skipping the v5 probe keeps its log quiet.
    return "3.1.1" if broker_url is None else "auto"


def to_toml(cal: Calibration) -> str:
    """The calibration file: [calibration] profile, model_params, measured; [c1] and [c2] joules
    and seconds. Comments say how each was obtained."""
    how = "measured by " if cal.measured else "modelled by "
    lines = [
        "# testbed calibrate: c1 = one communication round (upload + download of the model),",
        "# c2 = one DP-PASGD local step (logistic model, batch 32); medians over "
        f"{cal.repeats} repeats.",
        f"# joules {how}{cal.meter}; round trip through {cal.broker}, {cal.message_bytes} bytes each way,",
        f"# {cal.round_trip_s * 1e3:.3g} ms wall time here.",
        "[calibration]",
        f"profile = {jsontext.dumps(cal.profile)}",
        f"model_params = {cal.model_params}",
        f"measured = {str(cal.measured).lower()}",
    ]
    for name, cost in (("c1", cal.c1), ("c2", cal.c2)):
        lines += [f"[{name}]", f"joules = {_float(cost.joules)}", f"seconds = {_float(cost.seconds)}"]
    return "\n".join(lines) + "\n"


def _float(x: float) -> str:
    """A TOML float with 6 significant digits (repr keeps the '.0' or exponent TOML needs)."""
    return repr(float(f"{x:.6g}"))


def format_table(cal: Calibration) -> str:
    """A short table of the calibration for the terminal."""
    kind = "measured" if cal.measured else "modelled"
    return "\n".join([
        f"profile      {cal.profile} ({cal.model_params} model parameters, {cal.repeats} repeats)",
        f"meter        {cal.meter} ({kind})",
        f"round trip   {cal.message_bytes} bytes each way through {cal.broker}, "
        f"{cal.round_trip_s * 1e3:.3g} ms here",
        f"{'':12} {'seconds':>12} {'joules':>12}",
        f"{'c1 round':12} {cal.c1.seconds:12.4g} {cal.c1.joules:12.4g}",
        f"{'c2 step':12} {cal.c2.seconds:12.4g} {cal.c2.joules:12.4g}",
    ])


def _calibrate(args: argparse.Namespace) -> int:
    cal = calibrate(args.profile, args.model_size, broker_url=args.broker, repeats=args.repeats,
                    meter_kind=args.meter)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(to_toml(cal))
    print(format_table(cal))
    print(f"wrote        {args.out}")
    return 0
