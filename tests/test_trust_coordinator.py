"""The coordinator's trust boundary, searched by Hypothesis: one node's message of a whole MQTT run
(its ready, a setup upload, an update of the first, a middle or the last round, its ledger report at
the stop) is replaced by a mutant (any field, any type, any size; its tensors scaled, reshaped,
retyped, made non-finite; its bytes cut or flipped), sent beside the honest one in either order,
sent twice, sent 1 or 2 rounds late or after the last round, or lost. Whatever it is:

- nothing escapes the coordinator (the run ends completed: a forged refusal takes out that node only);
- the honest nodes' updates are all used (none of them straggles);
- invariant 1: no node's own ledger shows more than the summary says of it.

The run goes through the real coordinator and the real receiving path of its MQTT client (decode,
admit, replay window) with honest node agents in this process (tests/loopback_coordinator.py).
Over-the-air DWFL is held to the same by its MQTT tests (its channel emulator is a second client).
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import struct

import numpy as np
import pytest
from hypothesis import Phase, given, settings
from hypothesis import strategies as st

from ledger_invariant import under_counts
from loopback_coordinator import loopback
from test_algorithm_contract import _text
from testbed.assembly import assemble
from testbed.assembly.config import load_config_text, replace
from testbed.mqtt import wire
from testbed.orchestration.runner import load, run_experiment
from testbed.rounds import protocol

CASES = ["dp_pasgd", "fedavg", "acfl", "padpfl"]
NODES = list(range(5))  # tests/test_algorithm_contract.py's experiments have 5 nodes
_runs = itertools.count()

#: Numbers at and beyond every edge a field may have.
EDGES = st.sampled_from([0, -1, 1, -0.0, 2**31, 2**63, 2**70, -2**70, 1e-308, 1e308, -1e308, 0.5, True, False, None,
                         "", "x" * 300, [], {}])
JSON = st.recursive(EDGES | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=12),
                    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children,
                                                                                     max_size=4),
                    max_leaves=8)
DELIVERIES = ["mutant", "mutant+honest", "honest+mutant", "twice", "late1", "late2", "at_stop", "lost"]
TARGETS = ["prepare", "setup", "first", "middle", "last", "stop"]


def _config(name: str):
    config = load_config_text(_text(name))
    return replace(config, run={"mode": "mqtt"},
                   mqtt={"broker_url": "mqtt://127.0.0.1:1", "emulated": False, "round_timeout_s": 0.25,
                         "connect_timeout_s": 5.0, "setup_wait_s": 0.25})


@functools.cache
def _rounds(name: str) -> int:
    config = _config(name)
    data, model = load(config)
    return assemble.build_algorithm(config, model, data).rounds


def _mutant(data: st.DataObject, honest: bytes) -> bytes:
    """One generated change to the honest payload ``honest``."""
    msg = wire.decode(honest)
    header = {"run": msg.run, "round": msg.round, "sender": msg.sender, "kind": msg.kind,
              "meta": json.loads(json.dumps(msg.meta))}
    tensors = {k: np.array(v) for k, v in msg.tensors.items()}
    how = data.draw(st.sampled_from(["meta", "event", "round", "kind", "scale", "reshape", "retype", "nan",
                                     "drop_tensor", "cut", "flip"]), label="how")
    meta = header["meta"]
    if how == "meta":
        meta[data.draw(st.sampled_from(sorted(meta) + ["extra"]), label="key")] = data.draw(JSON, label="value")
    elif how == "event" and meta.get("events"):
        event = meta["events"][data.draw(st.integers(0, len(meta["events"]) - 1), label="event")]
        event[data.draw(st.sampled_from(sorted(event) + ["extra"]), label="field")] = data.draw(JSON, label="value")
    elif how == "round":
        header["round"] = max(0, msg.round + data.draw(st.sampled_from([-50, -8, -1, 1, 8, 2**20]), label="shift"))
    elif how == "kind":
        header["kind"] = data.draw(st.sampled_from([protocol.UPDATE, protocol.SETUP_UPDATE, protocol.REFUSED,
                                                    protocol.LEDGER, protocol.READY, protocol.ROUND, "other"]), label="kind")
    elif how in ("scale", "reshape", "retype", "nan", "drop_tensor") and tensors:
        name = data.draw(st.sampled_from(sorted(tensors)), label="tensor")
        if how == "scale":
            tensors[name] = tensors[name] * data.draw(st.sampled_from([1e300, -1e300, 1e6, -1.0, 0.0, 1e-300]),
                                                      label="factor")
        elif how == "reshape":
            tensors[name] = np.zeros(data.draw(st.sampled_from([(0,), (1,), (3, 3), (10**5,)]), label="shape"))
        elif how == "retype":
            tensors[name] = tensors[name].astype(data.draw(st.sampled_from(["float32", "int64", "complex128"]),
                                                           label="dtype"))
        elif how == "drop_tensor":
            del tensors[name]
        else:
            tensors[name] = np.where(np.arange(tensors[name].size).reshape(tensors[name].shape) == 0, 1.0,
                                     tensors[name])
    try:
        payload = bytearray(wire.encode(header, tensors))
    except (wire.WireError, TypeError, ValueError, OverflowError):  # the encoder refuses it: send the bytes cut
        return honest[: len(honest) // 2]
    if how == "nan" and tensors:
        payload[-8:] = struct.pack("<d", math.nan)  # the encoder itself refuses NaN: patched after it
    elif how == "cut":
        payload = payload[: data.draw(st.integers(0, 2**20), label="cut at") % len(payload)]
    elif how == "flip":
        # Positions modulo the length: a payload's length varies between runs (its measured seconds).
        at = data.draw(st.integers(0, 2**20), label="flip at") % len(payload)
        payload[at] ^= data.draw(st.integers(1, 255), label="bits")
    return bytes(payload)


def _is_target(target: str, msg: wire.Message, rounds: int) -> bool:
    if target == "prepare":
        return msg.kind == protocol.PREPARE
    if target == "setup":
        return msg.kind == protocol.SETUP
    if target == "stop":
        return msg.kind == protocol.STOP
    index = {"first": 0, "middle": rounds // 2, "last": rounds - 1}[target]
    return msg.kind == protocol.ROUND and msg.round == index


@pytest.mark.parametrize("name", CASES)
@settings(max_examples=25, phases=[Phase.explicit, Phase.reuse, Phase.generate])  # a whole run an example: no shrinking
@given(data=st.data())
def test_one_node_neither_crashes_the_coordinator_nor_goes_uncharged(name, data, monkeypatch, tmp_path):
    config, rounds = _config(name), _rounds(name)
    node = data.draw(st.sampled_from(NODES), label="node")
    target = data.draw(st.sampled_from(TARGETS), label="message")
    delivery = data.draw(st.sampled_from(DELIVERIES), label="delivery")

    def tamper(sender: int, msg: wire.Message, reply: bytes):
        if sender != node or not _is_target(target, msg, rounds):
            return [(reply, 0)]
        mutant = _mutant(data, reply) if "mutant" in delivery else None
        return {"mutant": [(mutant, 0)], "mutant+honest": [(mutant, 0), (reply, 0)],
                "honest+mutant": [(reply, 0), (mutant, 0)], "twice": [(reply, 0), (reply, 0)],
                "late1": [(reply, 1)], "late2": [(reply, 2)], "at_stop": [(reply, None)], "lost": []}[delivery]

    with loopback(monkeypatch, NODES, tamper) as nodes:
        result = run_experiment(config, out_dir=tmp_path / f"r{next(_runs)}", quiet=True)
    summary = result.summary
    assert summary["status"] == "completed", summary.get("failure")
    assert {r["node"] for r in summary["refusals"]} <= {node}  # a forged refusal is that node's own say
    assert under_counts(summary, [a.ledger(config.mqtt.run_id, nodes.session) for a in nodes.agents.values()]) == []
    assert [n for n in NODES if n != node and summary["nodes"][str(n)]["rounds_straggled"]] == []
