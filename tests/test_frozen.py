"""testbed.util.frozen builds what the frozen dataclass's own __init__ builds: equal, as frozen, for
the classes it is used on (a wire message, a received message's hand-over, an event)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from testbed.ledger.events import ComputeEvent, with_fields
from testbed.mqtt import wire
from testbed.mqtt.client import Inbound
from testbed.util.frozen import frozen


def _fields(instance) -> dict:
    return {f.name: getattr(instance, f.name) for f in dataclasses.fields(instance)}


def test_a_decoded_message_is_the_one_its_init_builds():
    tensors = {"w": np.arange(3.0)}
    msg = wire.decode(wire.encode({"run": "r", "round": 2, "sender": "5", "kind": "update", "meta": {"a": 1}}, tensors))
    built = wire.Message(**{name: value for name, value in _fields(msg).items()})
    assert _fields(msg) == {**_fields(built), "tensors": msg.tensors} and vars(msg).keys() == vars(built).keys()
    with pytest.raises(dataclasses.FrozenInstanceError):
        msg.round = 3


def test_an_inbound_of_every_field_equals_its_init_and_stays_frozen():
    built = Inbound.of("t", "up", "3", b"x", None, "3")
    assert built == Inbound("t", "up", "3", b"x", None, "3") and vars(built) == vars(Inbound("t", "up", "3", b"x", None, "3"))
    with pytest.raises(dataclasses.FrozenInstanceError):
        built.receiver = "4"


def test_an_event_with_a_field_changed_equals_dataclasses_replace():
    event = ComputeEvent(0, 3, local_steps=10)
    assert with_fields(event, node=4) == dataclasses.replace(event, node=4)
    assert frozen(ComputeEvent, vars(event)) == event and frozen(ComputeEvent, vars(event)) is not event
